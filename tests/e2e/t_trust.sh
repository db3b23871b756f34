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
# up to 60 rounds in 18 s, and at least 20 however long a loaded machine takes (within 120 s)
lost=0 rounds=0 t_end=$(($(date +%s) + 18)) t_cap=$(($(date +%s) + 120))
: >"$TR/race.err"
while [ $rounds -lt 60 ] && { [ "$(date +%s)" -lt $t_end ] || [ $rounds -lt 20 ]; } && [ "$(date +%s)" -lt $t_cap ]; do
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

# ---- #9: control characters neutralised the same way in every text output; exports keep NUL ---
# one-shot: the echoed prompt goes through the same function as the reply
"$BIN" -m "$MODEL" -p $'Once\e[2J\r\xc2\x9b upon' -n 4 --temp 0 >"$TR/plain.out" 2>/dev/null
if ! LC_ALL=C grep -qP '[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' "$TR/plain.out" &&
    grep -q $'Once\xe2\x90\x9b\[2J\xe2\x90\x8d\xef\xbf\xbd upon' "$TR/plain.out"; then
    ok "trust: one-shot output shows ESC, CR and U+009B as ␛ ␍ U+FFFD, never raw"
else bad "trust: one-shot output neutralises controls" "$(od -c "$TR/plain.out" | head -5)"; fi
# a stored reply with escape sequences, C1, CR and a NUL byte in the middle
sed -e 's/"content":"hello"/"content":"hel\\u0000lo\\u001b[2J\\u009bx\\ry\\r\\nz"/' "$TR/c.json" >"$TR/ctl.json"
rm -f "$TR/ctl.db"*
"$BIN" import "$TR/ctl.json" --db "$TR/ctl.db" >/dev/null
"$BIN" export last --db "$TR/ctl.db" >"$TR/ctl.md"
"$BIN" export last --format json --db "$TR/ctl.db" >"$TR/ctl1.json"
rm -f "$TR/ctl2.db"*
"$BIN" import "$TR/ctl1.json" --db "$TR/ctl2.db" >/dev/null
"$BIN" export last --format json --db "$TR/ctl2.db" >"$TR/ctl2.json"
if ! LC_ALL=C grep -qP '[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]' "$TR/ctl.md" &&
    grep -q $'hel\xe2\x90\x80lo\xe2\x90\x9b\[2J\xef\xbf\xbdx\xe2\x90\x8dy$' "$TR/ctl.md" && grep -qx 'z' "$TR/ctl.md"; then
    ok "trust: Markdown export neutralises ESC / C1 / CR like one-shot, and a NUL does not cut the reply"
else bad "trust: Markdown export neutralises controls" "$(od -c "$TR/ctl.md" | tail -6)"; fi
if grep -qF '"hel\u0000lo\u001b[2J\u009bx\ry\r\nz"' "$TR/ctl1.json" && cmp -s "$TR/ctl1.json" "$TR/ctl2.json" &&
    [ "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT length(CAST(content AS BLOB)) FROM messages WHERE role = '"'assistant'"'").fetchone()[0])' "$TR/ctl2.db")" = 18 ]; then
    ok "trust: JSON export escapes every control (\\u0000, \\u009b) and import → export keeps all 18 bytes"
else bad "trust: JSON export keeps every byte" "$(grep content "$TR/ctl1.json") / $(diff "$TR/ctl1.json" "$TR/ctl2.json" | head -3)"; fi
# the chat screen: the same conversation resumed
if command -v tmux >/dev/null 2>&1; then
    TRT="tmux -L kvchat-trust9-$$"
    printf '%s\n' "$(printf '%q ' env TERM=tmux-256color LANG=C.UTF-8 XDG_STATE_HOME="$TR/state" "$BIN" -m "$MODEL" --db "$TR/ctl.db" --resume last); sleep 60" >"$TR/chat2.sh"
    $TRT -f /dev/null new-session -d -s t -x 100 -y 30 "bash '$TR/chat2.sh'"
    seen=
    for _ in $(seq 1 100); do
        $TRT capture-pane -p -t t >"$TR/screen2" 2>/dev/null
        grep -q $'lo\xe2\x90\x9b\[2J' "$TR/screen2" && { seen=1; break; }
        sleep 0.1
    done
    $TRT kill-server >/dev/null 2>&1
    if [ -n "$seen" ] && grep -q $'hel\xe2\x90\x80lo\xe2\x90\x9b\[2J\xef\xbf\xbdx\xe2\x90\x8dy' "$TR/screen2" && grep -q '^ hi ' "$TR/screen2"; then
        ok "trust: the chat screen shows the same reply as the exports (␀ ␛ U+FFFD ␍), the screen intact"
    else bad "trust: the chat screen neutralises controls" "$(cat "$TR/screen2")"; fi
fi

# ---- #10: one-shot mode reports the seed it used; a big seed is a seed -------------------------
"$BIN" -m "$MODEL" -p "Once upon" -n 24 --json >"$TR/s1.json" 2>/dev/null
seed=$(tail -1 "$TR/s1.json" | python3 -c 'import json, sys; print(json.load(sys.stdin)["seed"])' 2>/dev/null)
"$BIN" -m "$MODEL" -p "Once upon" -n 24 --json --seed "${seed:-0}" >"$TR/s2.json" 2>/dev/null
txt() { python3 -c 'import json, sys; print("".join(json.loads(l).get("text", "") for l in open(sys.argv[1])))' "$1"; }
if [ -n "$seed" ] && [ "$(txt "$TR/s1.json")" = "$(txt "$TR/s2.json")" ] && [ -n "$(txt "$TR/s1.json")" ] &&
    tail -1 "$TR/s2.json" | grep -q "\"seed\": \"$seed\""; then
    ok "trust: --json's done object gives the random seed used (\"seed\": \"$seed\"), and --seed with it repeats the reply"
else bad "trust: --json reports the seed" "seed '$seed': $(tail -1 "$TR/s1.json")"; fi
out=$("$BIN" -m "$MODEL" -p "Once upon" -n 8 --stats 2>&1 >/dev/null)
big=$("$BIN" -m "$MODEL" -p "Once upon" -n 8 --stats --seed 18364758544493064720 2>&1 >/dev/null)
"$BIN" -m "$MODEL" -p x -n 1 --seed 18446744073709551615 >/dev/null 2>"$TR/seed.err"; rc=$?
if grep -qE '\| seed [0-9]+$' <<<"$out" && grep -q '| seed 18364758544493064720$' <<<"$big" && [ $rc -eq 2 ] &&
    grep -q 'out of range' "$TR/seed.err"; then
    ok "trust: --stats ends with the seed (a random one, and 18364758544493064720 as given); 2^64-1 is refused"
else bad "trust: --stats reports the seed" "$out / $big / rc=$rc $(cat "$TR/seed.err")"; fi

# ---- #8: kvchat check finds a parent loop and out-of-vocabulary context tokens; the chat recovers
if command -v tmux >/dev/null 2>&1; then
    TRS="tmux -L kvchat-trust8-$$" tr_n=0
    tr_start() { # DB ARGS...: a chat on DB in window w (100x30)
        local db=$1
        shift
        printf '%s\n' "$(printf '%q ' env -u NO_COLOR LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$TR/state" "$BIN" --db "$db" -t 1 -n 16 "$@") 2>'$TR/w.err'; echo EXIT=\$?; sleep 60" >"$TR/w.sh"
        # a new server (socket) each time: a server still exiting from kill-server would take
        # a new session on the same socket down with it
        $TRS kill-server >/dev/null 2>&1
        tr_n=$((tr_n + 1))
        TRS="tmux -L kvchat-trust8-$$-$tr_n"
        $TRS -f /dev/null new-session -d -s w -x 100 -y 30 "bash '$TR/w.sh'"
    }
    tr_wait() { # REGEX [SECONDS]: the screen (lines joined) matches; left in $TR/wscreen
        local end=$(($(date +%s) + ${2:-30}))
        while [ "$(date +%s)" -le "$end" ]; do
            $TRS capture-pane -p -t w >"$TR/wscreen" 2>/dev/null
            sed -E 's/ *│.*$//' "$TR/wscreen" | tr '\n' ' ' | tr -s ' ' | grep -qE -- "$1" && return 0
            grep -qE -- "$1" "$TR/wscreen" && return 0
            sleep 0.1
        done
        return 1
    }
    tr_say() { $TRS send-keys -t w -l "$1"; $TRS send-keys -t w Enter; sleep 0.3; tr_wait '│ ready( │|$)' 60; }
    tr_sql() { python3 -c 'import sqlite3, sys; d = sqlite3.connect(sys.argv[1]); r = d.execute(sys.argv[2]).fetchall(); d.commit(); print(r[0][0] if r and r[0] else "")' "$@"; }
    tr_finish() { # DB: the finish of the newest reply
        tr_sql "$1" "SELECT finish FROM generations ORDER BY message_id DESC LIMIT 1"
    }
    D8=$TR/ctx.db
    rm -f "$D8"*
    tr_start "$D8" -m "$MODEL" --temp 0
    tr_wait '│ ready( │|$)' 30
    tr_say "Once upon a time"
    $TRS send-keys -t w C-d
    tr_wait '^EXIT=' 10
    python3 -c 'import sqlite3, sys; s = sqlite3.connect(sys.argv[1]); d = sqlite3.connect(sys.argv[2]); s.backup(d)' "$D8" "$TR/loop.db"
    clean=$("$BIN" check --db "$D8" 2>&1)
    # a context token id past the 512-token vocabulary (little-endian int32 #2 = 600)
    python3 -c 'import sqlite3, struct, sys
d = sqlite3.connect(sys.argv[1]); b = bytearray(d.execute("SELECT ctx_tokens FROM conversations").fetchone()[0])
b[4:8] = struct.pack("<i", 600); d.execute("UPDATE conversations SET ctx_tokens = ?", (bytes(b),)); d.commit()' "$D8"
    out=$("$BIN" check --db "$D8" 2>&1); rc=$?
    if [ "$clean" = "$D8: ok" ] && [ $rc -eq 4 ] &&
        grep -q "conversation 1: its saved context holds 1 token id outside the model's vocabulary of 512 (token 1 is 600)" <<<"$out"; then
        ok "trust: kvchat check finds a saved context holding a token id outside the model's vocabulary"
    else bad "trust: kvchat check finds out-of-vocabulary context tokens" "clean: $clean / rc=$rc: $out"; fi
    tr_start "$D8" -m "$MODEL" --resume last
    noted=0
    tr_wait "outside the model's vocabulary of 512 .*rebuilt from the messages" 40 && noted=1
    cp "$TR/wscreen" "$TR/wscreen.note"
    tr_wait '│ ready( │|$)' 30
    tr_say "The end"
    tr_say "Again"
    fin=$(tr_finish "$D8")
    $TRS send-keys -t w C-d
    tr_wait '^EXIT=' 10
    if [ $noted = 1 ] && [ "$fin" != error ] && [ -n "$fin" ] && [ "$(tr_sql "$D8" "SELECT count(*) FROM messages")" = 6 ] &&
        ! grep -qiE "out of range|error" "$TR/wscreen"; then
        ok "trust: the chat resumes a conversation whose saved context is damaged (says so, rebuilds it; two replies, finish $fin)"
    else bad "trust: the chat recovers from out-of-vocabulary context tokens" "noted=$noted fin=$fin $(cat "$TR/wscreen.note" "$TR/wscreen" "$TR/w.err")"; fi
    # a loop of parents: the first message's parent becomes the reply
    tr_sql "$TR/loop.db" "UPDATE messages SET parent_id = 2 WHERE id = 1" >/dev/null
    out=$("$BIN" check --db "$TR/loop.db" 2>&1); rc=$?
    if [ $rc -eq 4 ] && grep -q "conversation 1: the parents of messages 1 → 2 → 1 form a loop" <<<"$out"; then
        ok "trust: kvchat check finds a loop of parents, naming its messages"
    else bad "trust: kvchat check finds a parent loop" "rc=$rc: $out"; fi
    tr_start "$TR/loop.db" -m "$MODEL" --resume last
    noted=0
    tr_wait "the parents of message 1 form a loop or break" 40 && noted=1
    cp "$TR/wscreen" "$TR/wscreen.note"
    tr_wait '│ ready( │|$)' 30
    tr_say "The end"
    fin=$(tr_finish "$TR/loop.db")
    $TRS send-keys -t w C-d
    tr_wait '^EXIT=' 10
    if [ $noted = 1 ] && grep -q '^EXIT=0' "$TR/wscreen" && [ "$fin" != error ] && [ -n "$fin" ] &&
        [ "$(tr_sql "$TR/loop.db" "SELECT count(*) FROM messages")" = 4 ]; then
        ok "trust: the chat opens a conversation with a parent loop (says so) and goes on (finish $fin)"
    else bad "trust: the chat recovers from a parent loop" "noted=$noted fin=$fin $(cat "$TR/wscreen.note" "$TR/wscreen" "$TR/w.err")"; fi
    $TRS kill-server >/dev/null 2>&1
fi
