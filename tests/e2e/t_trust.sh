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

# ---- #7: eight processes opening a fresh database at once lose nothing ------------------------
# (before: 1 round in 20 lost an import with "not a kvchat database (schema version 1 but no
# kvchat id)" or "… and no kvchat schema version": the header was read in pieces and each
# migration committed on its own)
cat >"$TR/c.json" <<'JS'
{"format":"kvchat-conversation","version":1,"title":"race","created_at":"2026-01-01T00:00:00.000Z","updated_at":"2026-01-01T00:00:00.000Z","model":null,"system_prompt":null,"params":null,"head":1,"messages":[{"parent":null,"role":"user","content":"hi","n_tokens":1,"created_at":"2026-01-01T00:00:00.000Z","partial":false,"generation":null},{"parent":0,"role":"assistant","content":"hello","n_tokens":1,"created_at":"2026-01-01T00:00:00.000Z","partial":false,"generation":null}]}
JS
lost=0 rounds=0 t_end=$(($(date +%s) + 18))
: >"$TR/race.err"
while [ $rounds -lt 60 ] && [ "$(date +%s)" -lt $t_end ]; do
    rounds=$((rounds + 1))
    rm -f "$TR/race.db" "$TR/race.db-wal" "$TR/race.db-shm"
    for _ in 1 2 3 4 5 6 7 8; do "$BIN" import "$TR/c.json" --db "$TR/race.db" >/dev/null 2>>"$TR/race.err" & done
    wait
    n=$("$BIN" list --ids --db "$TR/race.db" 2>>"$TR/race.err" | wc -l)
    [ "$n" = 8 ] || lost=$((lost + 1))
done
if [ $lost -eq 0 ] && [ ! -s "$TR/race.err" ] && [ $rounds -ge 20 ]; then
    ok "trust: 8 parallel kvchat import into a new database, $rounds rounds: all 8 conversations every time"
else bad "trust: 8 parallel imports into a new database" "$lost of $rounds rounds lost some: $(sort "$TR/race.err" | uniq -c | head -3)"; fi
