# The conversation store (issue 5), through the real binary: autosave, --resume continuing exactly,
# the F3 sessions view, /show cache, list/export/import/rm/check, kill -9 during a reply and during
# a KV blob write, two kvchat processes on one database, and the error cases (a newer, foreign,
# unwritable or damaged database). Sourced by run.sh (ok/bad, BIN, MODEL, tmp). Each chat runs in
# a window of its own tmux server (socket kvchat-store-PID); every wait polls with a deadline.

ST=$tmp/store
mkdir -p "$ST/state"
STM="tmux -L kvchat-store-$$"

st_sql() { # DB SQL: rows as a|b|c
    python3 -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for row in c.execute(sys.argv[2]).fetchall(): print("|".join(str(x) for x in row))' "$1" "$2"
}
st_sql_write() { # DB SQL…: run statements and commit
    python3 -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()' "$1" "$2"
}
st_copy() { # SRC DST: a consistent copy of a database (WAL included)
    rm -f "$2"
    python3 -c 'import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close()' "$1" "$2"
}
st_json() { # FILE PYTHON-EXPR on d: print the value
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

if ! command -v tmux >/dev/null 2>&1; then
    bad "store: tmux is installed (make deps)"
    return 0
fi

st_stop() { $STM kill-server >/dev/null 2>&1; sleep 0.1; }
# st_start NAME [ENV=VAL ...] -- ARGS: a window NAME running kvchat ARGS (100x30); its pid in $ST/NAME.pid
st_start() {
    local name=$1 envs=()
    shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    local cmd
    cmd=$(printf '%q ' env -u NO_COLOR LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$ST/state" "${envs[@]}" "$BIN" "$@")
    rm -f "$ST/$name.pid"
    echo "echo \$\$ > '$ST/$name.pid'; exec $cmd 2>'$ST/$name.err'" >"$ST/$name.sh"
    if $STM has-session -t st 2>/dev/null; then
        $STM new-window -d -t st -n "$name" "bash '$ST/$name.sh'; echo EXIT=\$?; sleep 600"
    else
        $STM -f /dev/null new-session -d -s st -n "$name" -x 100 -y 30 "bash '$ST/$name.sh'; echo EXIT=\$?; sleep 600"
    fi
    local end=$(($(date +%s) + 10))
    while [ ! -s "$ST/$name.pid" ] && [ "$(date +%s)" -le "$end" ]; do sleep 0.05; done
}
st_cap() { $STM capture-pane -p -t "st:$1" 2>/dev/null; }
st_keys() { local n=$1; shift; $STM send-keys -t "st:$n" "$@"; }
# The screen's text with the sliders panel cut off and wrapped lines joined (one space between).
st_joined() { sed -E 's/ *│.*$//' "$ST/screen" | tr '\n' ' ' | tr -s ' '; }
st_wait() { # NAME REGEX [SECONDS]: the screen, or its joined text, matches (left in $ST/screen)
    local n=$1 re=$2 t=${3:-30} end
    end=$(($(date +%s) + t))
    while [ "$(date +%s)" -le "$end" ]; do
        st_cap "$n" >"$ST/screen"
        grep -qE -- "$re" "$ST/screen" && return 0
        st_joined | grep -qE -- "$re" && return 0
        sleep 0.1
    done
    return 1
}
st_idle() { st_wait "$1" '│ ready( │|$)' "${2:-30}"; }
st_quit() { # ends the chat (Ctrl-D); a chat that does not end is a failure, and is killed
    st_keys "$1" C-d
    st_wait "$1" '^EXIT=' 10 && return 0
    bad "store: chat $1 ends on Ctrl-D" "$(st_dump)"
    kill -9 "$(cat "$ST/$1.pid")" 2>/dev/null
    return 1
}
st_dump() { sed 's/^/       | /' "$ST/screen" | head -34; }
st_say() { # NAME TEXT: send a message and wait for the reply to end
    st_keys "$1" -l "$2"
    st_keys "$1" Enter
    sleep 0.3
    st_idle "$1" 60
}
M="$MODEL"

# ---- nothing is written by one-shot runs or by listing an absent database --------------------
"$BIN" -m "$M" -p "Once" -n 4 --db "$ST/none.db" >/dev/null 2>&1
out=$("$BIN" list --db "$ST/none.db" 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ "$out" = "no saved conversations yet" ] && [ ! -e "$ST/none.db" ]; then
    ok "store: one-shot runs and kvchat list leave no database behind"
else bad "store: one-shot runs and kvchat list leave no database behind" "rc=$rc $out"; fi

# ---- a chat is saved as it goes; the uninterrupted reference ------------------------------------
A="$ST/a.db"
st_start a -- -m "$M" -t 1 --temp 0 -n 24 --db "$A"
st_idle a 30
st_say a "Once upon a time"
st_say a "The end"
"$BIN" list --json --db "$A" >"$ST/list.json" 2>"$ST/err"
if [ "$(st_json "$ST/list.json" 'len(d)')" = 1 ] && [ "$(st_json "$ST/list.json" 'd[0]["messages"]')" = 4 ] &&
    [ "$(st_json "$ST/list.json" 'd[0]["title"]')" = "Once upon a time" ]; then
    ok "store: every message and reply of a chat is saved as it goes (kvchat list)"
else bad "store: every message and reply of a chat is saved as it goes" "$(cat "$ST/list.json" "$ST/err")"; fi

# ---- /show cache ---------------------------------------------------------------------------------
st_keys a "/show cache" Enter
if st_wait a 'KV prefix store: [0-9.]+ MiB of 1024 MiB' 10 && grep -q "lookups hit" "$ST/screen"; then
    ok "store: /show cache reports the store's size, budget and hit rate"
else bad "store: /show cache reports the store's size, budget and hit rate" "$(st_dump)"; fi

# ---- resume: quit after the first reply, --resume (no -m), /set temp 0 → the same second reply --
C="$ST/c.db"
st_start c -- -m "$M" -t 1 --temp 0 -n 24 --db "$C"
st_idle c 30
st_say c "Once upon a time"
st_quit c
st_start c2 -- --resume --db "$C" -t 1 -n 24
if st_wait c2 'restored the KV cache of [0-9]+ tokens' 20; then ok "store: --resume (without -m) restores the chat's KV cache from the store"
else bad "store: --resume (without -m) restores the chat's KV cache from the store" "$(st_dump; cat "$ST/c2.err")"; fi
st_idle c2 20
st_keys c2 "/set temp 0" Enter
st_say c2 "The end"
reused=$(st_cap c2 | sed -nE 's/.*reused ([0-9]+) \+ new ([0-9]+).*/\1 \2/p' | tail -1)
st_quit c2
"$BIN" export 1 --format json --db "$A" >"$ST/a.json"
"$BIN" export last --format json --db "$C" >"$ST/c.json"
want=$(st_json "$ST/a.json" 'd["messages"][3]["content"]')
got=$(st_json "$ST/c.json" 'd["messages"][3]["content"]')
if [ -n "$want" ] && [ "$want" = "$got" ]; then ok "store: a resumed chat with /set temp 0 continues exactly as the uninterrupted one"
else bad "store: a resumed chat continues exactly as the uninterrupted one" "want [$want] got [$got]"; fi
if [ -n "$reused" ] && [ "${reused% *}" -ge 20 ] && [ "${reused#* }" -le 8 ]; then
    ok "store: after --resume the next reply prefills only the new message (reused ${reused% *}, new ${reused#* })"
else bad "store: after --resume the next reply prefills only the new message" "reused/new: [$reused]"; fi

# ---- the sessions view (F3): list, search, rename, open, delete --------------------------------
st_keys a "/clear" Enter
st_idle a 10
st_say a "Dragons fly over the hills"
st_keys a F3
if st_wait a 'conversations \(2\)' 10 && grep -q "Dragons fly over the hills" "$ST/screen" && grep -q "Once upon a time" "$ST/screen"; then
    ok "store: F3 lists the saved conversations with title, model, date, messages, branches"
else bad "store: F3 lists the saved conversations" "$(st_dump)"; fi
st_keys a "/" && st_keys a -l "drag"
if st_wait a 'conversations \(1\)' 10 && grep -q "Dragons fly" "$ST/screen" && ! grep -q "Once upon a time  *│" "$ST/screen"; then
    ok "store: typing in the sessions view searches the messages (FTS5)"
else bad "store: typing in the sessions view searches the messages" "$(st_dump)"; fi
st_keys a Enter       # back to the list, filter kept
st_keys a r C-u && st_keys a -l "Renamed dragon chat" && st_keys a Enter
st_wait a 'Renamed dragon chat' 10
"$BIN" list --db "$A" >"$ST/list.txt" 2>&1
if grep -q "Renamed dragon chat" "$ST/list.txt"; then ok "store: r renames a conversation in the sessions view"
else bad "store: r renames a conversation in the sessions view" "$(cat "$ST/list.txt"; st_dump)"; fi
st_keys a Escape      # clear the search
st_wait a 'conversations \(2\)' 10
st_keys a End Enter   # the oldest: the first chat
if st_wait a 'Conversation 1: Once upon a time' 10 && grep -q "The end" "$ST/screen"; then
    ok "store: Enter in the sessions view opens a saved conversation"
else bad "store: Enter in the sessions view opens a saved conversation" "$(st_dump)"; fi
st_idle a 10
st_keys a F3
st_wait a 'conversations \(2\)' 10
st_keys a Home d
st_wait a 'delete conversation' 5
st_keys a y
if st_wait a 'deleted conversation' 10 && [ "$("$BIN" list --ids --db "$A" | wc -l)" = 1 ]; then
    ok "store: d, y in the sessions view deletes a conversation"
else bad "store: d, y in the sessions view deletes a conversation" "$(st_dump)"; fi
st_keys a Escape
st_quit a

# ---- export / import / rm -------------------------------------------------------------------------
"$BIN" export 1 --format json --db "$A" >"$ST/e1.json"
id=$("$BIN" import "$ST/e1.json" --db "$ST/imp.db")
"$BIN" export "$id" --format json --db "$ST/imp.db" >"$ST/e2.json"
id2=$("$BIN" import "$ST/e2.json" --db "$A")
"$BIN" export "$id2" --format json --db "$A" >"$ST/e3.json"
if [ -n "$id" ] && cmp -s "$ST/e1.json" "$ST/e2.json" && cmp -s "$ST/e1.json" "$ST/e3.json"; then
    ok "store: kvchat import reads a JSON export back byte-exactly (export → import → export)"
else bad "store: kvchat import reads a JSON export back byte-exactly" "$(diff "$ST/e1.json" "$ST/e2.json" | head -5)"; fi
"$BIN" export 1 --db "$A" >"$ST/e1.md"
if grep -q '^## You' "$ST/e1.md" && grep -q '^## Assistant' "$ST/e1.md" && grep -q '^# Once upon a time' "$ST/e1.md"; then
    ok "store: kvchat export --format md writes the conversation as Markdown"
else bad "store: kvchat export --format md" "$(head -5 "$ST/e1.md")"; fi
"$BIN" rm "$id2" --db "$A" >/dev/null
rc1=$?
"$BIN" rm 999 --db "$A" >/dev/null 2>"$ST/err"
rc2=$?
echo '{"format": "something else"}' >"$ST/bad.json"
"$BIN" import "$ST/bad.json" --db "$A" >/dev/null 2>"$ST/err2"
rc3=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 1 ] && grep -q "no conversation 999" "$ST/err" && [ $rc3 -eq 1 ] &&
    grep -q "not a kvchat export" "$ST/err2" && ! "$BIN" list --ids --db "$A" | grep -qx "$id2"; then
    ok "store: kvchat rm deletes; unknown IDs and foreign JSON get clear errors"
else bad "store: kvchat rm / import errors" "rc $rc1 $rc2 $rc3 $(cat "$ST/err" "$ST/err2")"; fi
# numbers no int or index holds (found by tests/fuzz/fuzz_import: the cast was undefined behaviour)
python3 - "$ST/e1.json" "$ST/huge" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for i, (where, key, v) in enumerate([("params", "repeat_last_n", 7e47), ("msg", "n_tokens", -1e300), ("top", "head", 1e20),
                                     ("msg", "parent", 1e300)]):
    e = json.loads(json.dumps(d))
    if where == "params": e["params"] = e["params"] or {}; e["params"][key] = v
    elif where == "msg": e["messages"][-1][key] = v
    else: e[key] = v
    open("%s%d.json" % (sys.argv[2], i), "w").write(json.dumps(e))
PY
nbad=0
for f in "$ST"/huge*.json; do
    "$BIN" import "$f" --db "$ST/huge.db" >/dev/null 2>"$ST/err3"; r=$?
    { [ $r -eq 1 ] && grep -q "not a valid kvchat export" "$ST/err3"; } || { nbad=$((nbad + 1)); echo "$f: rc $r $(cat "$ST/err3")"; }
done >"$ST/huge.out"
if [ $nbad -eq 0 ] && [ "$(ls "$ST"/huge*.json | wc -l)" -eq 4 ]; then
    ok "store: kvchat import refuses counts and indices out of range (7e47, -1e300, head 1e20, parent 1e300)"
else bad "store: kvchat import of out-of-range numbers" "$(cat "$ST/huge.out")"; fi

# ---- a database of the previous schema (1): reading commands migrate it when it is writable --------
V1="$ST/v1.db"
rm -f "$V1"
"$BIN" import "$ST/e1.json" --db "$V1" >/dev/null
st_sql_write "$V1" "DROP INDEX kv_prefixes_base; ALTER TABLE kv_prefixes DROP COLUMN base_id; ALTER TABLE messages DROP COLUMN model_id; PRAGMA user_version = 1;"
if [ "$(st_sql "$V1" 'PRAGMA user_version')" = 1 ] && "$BIN" list --db "$V1" >"$ST/v1.out" 2>&1 &&
    grep -q 'Once upon a time' "$ST/v1.out" && [ "$(st_sql "$V1" 'PRAGMA user_version')" = 4 ] &&
    [ "$(st_sql "$V1" "SELECT count(*) FROM pragma_table_info('kv_prefixes') WHERE name = 'base_id'")" = 1 ]; then
    ok "store: kvchat list on a schema-1 database migrates it to the current schema (4) and lists it"
else
    bad "store: kvchat list on a schema-1 database" "$(cat "$ST/v1.out")"
fi

# ---- kill -9 during a reply: the user message is there, the database is intact -----------------
K="$ST/k.db"
okk=1
for i in 1 2 3 4; do
    st_start k$i -- -m "$M" -t 1 --temp 1 -n -1 -c 4096 --db "$K"
    st_idle k$i 20
    st_keys k$i -l "Kill me number $i"
    st_keys k$i Enter
    sleep "0.$((RANDOM % 3 + 1))$((RANDOM % 10))"
    kill -9 "$(cat "$ST/k$i.pid")" 2>/dev/null
    if ! "$BIN" check --db "$K" >"$ST/check" 2>&1; then okk=0; cat "$ST/check"; fi
    n=$(st_sql "$K" "SELECT count(*) FROM messages WHERE role = 'user' AND content LIKE 'Kill me number %'")
    [ "$n" = "$i" ] || { okk=0; echo "       round $i: $n user messages"; }
done
if [ $okk = 1 ]; then ok "store: kill -9 during replies (4 random moments): integrity_check ok, every sent message there"
else bad "store: kill -9 during replies"; fi

# ---- kill -9 during a KV blob write: never a half-written prefix ----------------------------------
W="$ST/w.db"
okw=1
half=0
st_start w0 -- -m "$M" -t 1 --temp 0 -n 200 --db "$W"
st_idle w0 20
st_say w0 "Once upon a time"
st_quit w0
for i in 1 2 3; do
    st_start w$i KVCHAT_TEST_KV_WRITE_DELAY_MS=8 -- --resume --db "$W" -t 1 --temp 1 -n 200
    st_idle w$i 20
    st_keys w$i -l "and then $i"
    st_keys w$i Enter
    # when the reply's KV snapshot is being written (a row in state 0), at a random moment of it
    python3 -c 'import sqlite3, sys, time
end = time.time() + 30
while time.time() < end:
    try:
        c = sqlite3.connect(sys.argv[1], timeout=5)
        if c.execute("SELECT count(*) FROM kv_prefixes WHERE state = 0").fetchone()[0]: break
        c.close()
    except sqlite3.Error: pass
    time.sleep(0.005)' "$W"
    sleep "0.0$((RANDOM % 6))"
    kill -9 "$(cat "$ST/w$i.pid")" 2>/dev/null
    [ "$(st_sql "$W" "SELECT count(*) FROM kv_prefixes WHERE state = 0")" != 0 ] && half=$((half + 1))
    if ! "$BIN" check --db "$W" >"$ST/check" 2>&1; then okw=0; cat "$ST/check"; fi
done
st_start w9 -- --resume --db "$W" -t 1 -n 20
st_wait w9 'restored the KV cache|no KV cache stored' 20 || okw=0
st_idle w9 20
st_say w9 "The end"
st_quit w9
left=$(st_sql "$W" "SELECT count(*) FROM kv_prefixes WHERE state = 0")
if [ $okw = 1 ] && [ "$half" -ge 1 ] && [ "$left" = 0 ] && "$BIN" check --db "$W" >/dev/null 2>&1; then
    ok "store: kill -9 during KV blob writes ($half of 3 cut mid-write): never used, cleaned up, database intact"
else bad "store: kill -9 during KV blob writes" "left $left half-written; $(st_dump)"; fi

# ---- two kvchat processes writing the same database at once -------------------------------------
T="$ST/two.db"
st_start t1 -- -m "$M" -t 1 --temp 0 -n 16 --db "$T"
st_start t2 -- -m "$M" -t 1 --temp 0 -n 16 --db "$T"
st_idle t1 20
st_idle t2 20
for i in 1 2 3; do
    st_keys t1 -l "first chat $i" && st_keys t1 Enter
    st_keys t2 -l "second chat $i" && st_keys t2 Enter
    st_idle t1 20
    st_idle t2 20
done
bad_screen=$( (st_cap t1; st_cap t2) | grep -iE "locked|not saved" | head -2)
st_quit t1
st_quit t2
(for i in $(seq 1 10); do "$BIN" import "$ST/e1.json" --db "$T" >/dev/null 2>>"$ST/imp1.err"; done) &
(for i in $(seq 1 10); do "$BIN" import "$ST/e1.json" --db "$T" >/dev/null 2>>"$ST/imp2.err"; done) &
wait
counts=$(st_sql "$T" "SELECT count(*) FROM messages GROUP BY conversation_id ORDER BY conversation_id LIMIT 2" | tr '\n' ' ')
n_conv=$(st_sql "$T" "SELECT count(*) FROM conversations")
if [ -z "$bad_screen" ] && [ "$counts" = "6 6 " ] && [ "$n_conv" = 22 ] && [ ! -s "$ST/imp1.err" ] && [ ! -s "$ST/imp2.err" ]; then
    ok "store: two chats and two import loops on one database at once: nothing locked, nothing lost"
else bad "store: two processes on one database" "screen [$bad_screen] counts [$counts] conversations $n_conv $(cat "$ST/imp1.err" "$ST/imp2.err" | head -3)"; fi

# ---- a database from a newer kvchat is left untouched -----------------------------------------------
N="$ST/newer.db"
st_copy "$A" "$N"
st_sql_write "$N" "PRAGMA journal_mode = DELETE; PRAGMA user_version = 99;"
sum1=$(md5sum <"$N")
out=$("$BIN" list --db "$N" 2>&1)
rc=$?
st_start n1 -- -m "$M" -t 1 -n 8 --db "$N"
st_wait n1 'conversations are not saved: .*newer kvchat' 20
scr=$?
st_idle n1 10
st_say n1 "Still chatting"
replied=$(st_cap n1 | grep -c "Still chatting")
st_quit n1
sum2=$(md5sum <"$N")
if [ $rc -eq 4 ] && echo "$out" | grep -q "newer kvchat (schema version 99" && [ $scr -eq 0 ] && [ "$replied" -ge 1 ] && [ "$sum1" = "$sum2" ]; then
    ok "store: a newer database gets a clear error, is left untouched, and the chat still works"
else bad "store: a newer database" "rc=$rc $out scr=$scr"; fi

# ---- not a kvchat database; an unwritable directory ------------------------------------------------
st_sql_write "$ST/recipes.db" "CREATE TABLE recipes(name TEXT);"
printf 'just text\n%.0s' $(seq 1 100) >"$ST/text.db"
o1=$("$BIN" list --db "$ST/recipes.db" 2>&1)
r1=$?
o2=$("$BIN" list --db "$ST/text.db" 2>&1)
r2=$?
if [ $r1 -eq 4 ] && echo "$o1" | grep -q "not a kvchat database (it holds recipes" && [ $r2 -eq 4 ] && echo "$o2" | grep -q "not a kvchat database"; then
    ok "store: a database that is not kvchat's gets a clear error"
else bad "store: a database that is not kvchat's" "$o1 / $o2"; fi
mkdir -p "$ST/ro" "$ST/rostate" && chmod 555 "$ST/ro" && chmod 777 "$ST/rostate" && chmod 755 "$ST" "$tmp"
if command -v setpriv >/dev/null 2>&1; then
    RO=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    o3=$("${RO[@]}" "$BIN" import "$ST/e1.json" --db "$ST/ro/kvchat.db" 2>&1)
    r3=$?
    $STM new-window -d -t st -n ro "$(printf '%q ' "${RO[@]}" env LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$ST/rostate" "$BIN" -m "$M" -t 1 -n 8 --db "$ST/ro/kvchat.db")"
    st_wait ro 'conversations are not saved: .*cannot write in the directory' 20
    scr=$?
    st_idle ro 10
    st_say ro "Read only"
    replied=$(st_cap ro | grep -c "^ stories260K")
    if [ $r3 -eq 4 ] && echo "$o3" | grep -q "cannot write in the directory" && [ $scr -eq 0 ] && [ "$replied" -ge 1 ]; then
        ok "store: an unwritable directory gets a clear message and the chat still works"
    else bad "store: an unwritable directory" "r3=$r3 $o3 scr=$scr $(st_dump)"; fi
    st_keys ro C-d
fi

# ---- a damaged message row is named, nothing is lost ---------------------------------------------
D="$ST/d.db"
st_copy "$C" "$D"
mid=$(st_sql "$D" "SELECT min(id) FROM messages WHERE role = 'assistant'")
st_sql_write "$D" "UPDATE messages SET content = X'00FF41' WHERE id = $mid;"
out=$("$BIN" check --db "$D" 2>&1)
rc=$?
st_start d1 -- --resume --db "$D" -t 1 -n 12
st_wait d1 "message $mid \\(conversation 1\\): content is a blob" 20
scr=$?
st_idle d1 10
shown=$(grep -c "\[unreadable\]" "$ST/screen")
st_say d1 "After the damage"
replied=$(st_cap d1 | grep -c "After the damage")
st_quit d1
n_msgs=$(st_sql "$D" "SELECT count(*) FROM messages")
if [ $rc -eq 4 ] && echo "$out" | grep -q "message $mid (conversation 1): content is a blob" && [ $scr -eq 0 ] &&
    [ "$shown" -ge 1 ] && [ "$replied" -ge 1 ] && [ "$n_msgs" = 6 ]; then
    ok "store: a damaged message row is named (kvchat check and the chat), nothing is lost, the chat goes on"
else bad "store: a damaged message row" "rc=$rc scr=$scr shown=$shown replied=$replied msgs=$n_msgs; $out"; fi

# ---- a damaged KV blob is named, dropped, and the chat prefills instead --------------------------
E="$ST/e.db"
st_copy "$C" "$E"
st_sql_write "$E" "UPDATE kv_chunks SET data = CAST(substr(data, 1, 300) || X'5A5A' || substr(data, 303) AS BLOB);"
out=$("$BIN" check --db "$E" 2>&1)
rc=$?
st_start e1 -- --resume --db "$E" -t 1 -n 12
st_wait e1 'KV prefix [0-9]+: checksum .* not used, dropped' 20
scr=$?
st_idle e1 10
st_say e1 "After the damage"
replied=$(st_cap e1 | grep -c "After the damage")
st_quit e1
if [ $rc -eq 4 ] && echo "$out" | grep -q "KV prefix [0-9]*: checksum" && [ $scr -eq 0 ] && [ "$replied" -ge 1 ] &&
    "$BIN" check --db "$E" >/dev/null 2>&1; then
    ok "store: a damaged KV blob is named, never used, dropped; the chat prefills instead"
else bad "store: a damaged KV blob" "rc=$rc scr=$scr replied=$replied; $out $(st_dump)"; fi

st_stop
