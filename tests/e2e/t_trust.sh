# Issue 18 (trust): what a bad model file says in every mode, a fresh database opened by many
# processes at once, control bytes in every text output, big seeds. Sourced by run.sh (ok/bad,
# BIN, MODEL, SHARED, tmp).

TR=$tmp/trust
mkdir -p "$TR"

# tr_patch SRC DST OLD NEW: DST = SRC with the first OLD bytes (after the key NEAR) replaced by
# NEW (same length) — a model whose tokenizer.ggml.pre is unknown or missing.
tr_patch() {
    python3 - "$@" <<'PY'
import sys
src, dst, near, old, new = sys.argv[1:6]
d = bytearray(open(src, 'rb').read())
i = d.find(near.encode())
j = d.find(old.encode(), i)
assert i >= 0 and j >= 0 and len(old) == len(new)
d[j:j + len(old)] = new.encode()
open(dst, 'wb').write(d)
PY
}

# ---- #5: an unknown tokenizer.ggml.pre in one-shot, line and chat mode -------------------------
QW=$SHARED/models/syn-qwen2-f32.gguf
tr_patch "$QW" "$TR/badpre.gguf" tokenizer.ggml.pre gpt-2 gpt-X
tr_patch "$QW" "$TR/nopre.gguf" tokenizer.ggml.pre tokenizer.ggml.pre tokenizer.ggml.prX
out=$("$BIN" -m "$TR/badpre.gguf" -p hello -n 2 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "badpre.gguf: unknown pre-tokenizer 'gpt-X' (tokenizer.ggml.pre)" <<<"$out"; then
    ok "trust: one-shot refuses an unknown tokenizer.ggml.pre, naming the file, key and value (exit $rc)"
else bad "trust: one-shot refuses an unknown tokenizer.ggml.pre" "rc=$rc: $out"; fi
out=$(echo hello | "$BIN" -m "$TR/badpre.gguf" -n 2 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "unknown pre-tokenizer 'gpt-X'" <<<"$out"; then ok "trust: a prompt on standard input: the same refusal"
else bad "trust: a prompt on standard input: the same refusal" "rc=$rc: $out"; fi
out=$("$BIN" -m "$TR/nopre.gguf" -p hello -n 2 --temp 0 2>&1 >/dev/null); rc=$?
if [ $rc -eq 0 ] && grep -q "warning: .*nopre.gguf: no tokenizer.ggml.pre in the file; using the GPT-2" <<<"$out"; then
    ok "trust: one-shot warns about a missing tokenizer.ggml.pre (and runs)"
else bad "trust: one-shot warns about a missing pre" "rc=$rc: $out"; fi
if command -v tmux >/dev/null 2>&1; then
    TRT="tmux -L kvchat-trust-$$"
    printf '%s\n' "$(printf '%q ' env TERM=tmux-256color XDG_STATE_HOME="$TR/state" "$BIN" -m "$TR/badpre.gguf" --db "$TR/chat.db"); echo EXIT=\$?; sleep 60" >"$TR/chat.sh"
    $TRT -f /dev/null new-session -d -s t -x 120 -y 30 "bash '$TR/chat.sh'"
    seen=
    for _ in $(seq 1 100); do
        $TRT capture-pane -p -J -t t >"$TR/screen" 2>/dev/null
        grep -q "EXIT=" "$TR/screen" && { seen=1; break; }
        sleep 0.1
    done
    $TRT kill-server >/dev/null 2>&1
    if [ -n "$seen" ] && grep -q "unknown pre-tokenizer 'gpt-X' (tokenizer.ggml.pre)" "$TR/screen" && ! grep -q "EXIT=0" "$TR/screen"; then
        ok "trust: the chat (on a terminal) refuses an unknown pre with the message on screen"
    else bad "trust: the chat refuses an unknown pre" "$(cat "$TR/screen")"; fi
fi
