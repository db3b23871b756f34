# The chat for daily use (issue 16) and the chat's context shift (issue 18 #2, #6), in tmux like
# t_chat.sh (with chat_lib.sh's helpers: chat_start, wait_for, keys, cap …). Sourced by run.sh.

command -v tmux >/dev/null 2>&1 || return 0 # t_chat.sh says tmux is missing
# the session helpers (chat_start, wait_for, keys, cap …), when t_chat.sh did not define them
type chat_start >/dev/null 2>&1 || . "$here/chat_lib.sh"
DM=$tmp/daily
mkdir -p "$DM"

# ---- issue 18 #2: the system prompt survives a context shift in the chat -----------------------
# completion mode (stories260K has no template): the prompt is the system prompt, a blank line,
# then the conversation; -c 128 shifts inside the first reply. The conversation's tokens as saved
# (conversations.ctx_tokens, little-endian int32) must still start with BOS + the system prompt.
DSYS="You are a storyteller. You tell short happy stories about a little cat named Tom who likes to play in the sun with his friend the dog."
ctx_tokens() { # the saved context's first N tokens, one line, space-separated
    rm -f "$DM/ctx.bin"
    sqlite3 "$1" "SELECT writefile('$DM/ctx.bin', ctx_tokens) FROM conversations ORDER BY id DESC LIMIT 1" >/dev/null 2>&1
    [ -s "$DM/ctx.bin" ] && od -An -v -t d4 "$DM/ctx.bin" | tr -s ' \n' ' ' | sed 's/^ //' | cut -d' ' -f1-"$2"
}
want=$("$BIN" tokenize -m "$MODEL" --ids "$DSYS" | tr -d '[],' )
nw=$(echo "$want" | wc -w)
chat_start 100 30 -- -c 128 -t 1 --temp 0 --system "$DSYS" --db "$DM/shift.db"
if wait_idle 30; then
    keys "Once upon a time there was a cat" Enter
    wait_for '│ ready( │|$)' 60
    keys "The next day" Enter
    wait_for '│ ready( │|$)' 60
    got=$(ctx_tokens "$DM/shift.db" "$nw")
    shifted=$(sqlite3 "$DM/shift.db" "SELECT length(ctx_tokens) / 4 FROM conversations" 2>/dev/null)
    if [ -n "$got" ] && [ "$got" = "$(echo $want)" ] && [ "$(sqlite3 "$DM/shift.db" "SELECT count(*) FROM messages WHERE role = 'assistant' AND length(content) > 200")" -ge 1 ]; then
        ok "chat: after a context shift the context still starts with BOS + the system prompt ($nw tokens; context $shifted tokens)"
    else
        bad "chat: the system prompt survives a context shift" "want: $(echo $want | cut -c1-80)… got: $(echo "$got" | cut -c1-80)… $(screen_dump)"
    fi
    keys C-d
else
    bad "chat: the system prompt survives a context shift (the chat starts)" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# ---- issue 18 #6: -c 64 -n 300 shifts like one-shot mode; --keep beyond the context is said -----
chat_start 100 30 -- -c 64 -n 300 -t 1 --temp 0 --keep 1000 --db "$DM/n300.db"
if wait_idle 30; then
    grep -q -- '--keep 1000 is more than a context shift can keep' "$CH/screen" && grep -q 'it keeps the first 48' "$CH/screen" &&
        ok "chat: --keep 1000 -c 64 says it keeps 48" || bad "chat: --keep 1000 -c 64 says it keeps 48" "$(screen_dump)"
    keys "Once upon a time"
    wait_for '^> Once upon a time' 5 || { keys C-u "Once upon a time"; wait_for '^> Once upon a time' 5; }
    keys Enter
    wait_for ' [0-9]+ tokens' 30
    wait_for '│ ready( │|$)' 90
    n=$(tokens_shown)
    if [ "$n" = 300 ] && grep -q '\[max tokens\]' "$CH/screen" && ! grep -q 'context full' "$CH/screen"; then
        ok "chat: -c 64 -n 300 shifts the context and gives 300 tokens, as one-shot mode does"
    else
        bad "chat: -c 64 -n 300 gives 300 tokens" "$n tokens $(screen_dump)"
    fi
    keys C-d
else
    bad "chat: -c 64 -n 300 (the chat starts)" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# ---- issue 16 #2: Ctrl-C on a typed draft keeps it: Ctrl-Y brings it back -----------------------
chat_start 100 30 -- -t 1 -c 8192 --db "$DM/draft.db"
if wait_idle 30; then
    keys "my precious draft"
    wait_for '^> my precious draft' 10
    keys C-c
    if wait_for 'Ctrl-Y puts it back' 10 && grep -qE '^> *$' "$CH/screen"; then
        keys C-y
        if wait_for '^> my precious draft' 10; then ok "chat: Ctrl-C clears a draft, says so, and Ctrl-Y brings it back"
        else bad "chat: Ctrl-Y brings a cleared draft back" "$(screen_dump)"; fi
    else
        bad "chat: Ctrl-C on a draft says how to get it back" "$(screen_dump)"
    fi
    keys C-u
    # ---- issue 16 #3: Esc and a command in one burst (a slow SSH link): Esc, then the command -----
    keys "Once upon a time" Enter
    if wait_for '● generating' 20; then
        $TMC send-keys -t c Escape "/set max_tokens 150" Enter
        wait_idle 20
        keys "/show params" Enter
        if wait_for 'max tokens +150' 10 && ! grep -qE 'set max_tokens 150' "$CH/screen"; then
            ok "chat: Esc followed at once by /set max_tokens 150 stops the reply and runs the command"
        else
            bad "chat: Esc + /set in one burst" "$(screen_dump)"
        fi
    else
        bad "chat: Esc + /set in one burst (a reply starts)" "$(screen_dump)"
    fi
    keys C-d
else
    bad "chat: the draft test starts" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# ---- issue 16 #7: an unlimited reply that reaches a context's worth of tokens is not "context full"
chat_start 100 30 -- -t 1 -c 256 --db "$DM/cap.db"
if wait_idle 30; then
    keys "Once upon a time" Enter
    wait_for '│ ready( │|$)' 60
    if wait_for "a context's worth" 5 && ! grep -q 'context full' "$CH/screen"; then
        ok "chat: a reply of a context's worth (256 tokens, after shifts) says so, not 'context full'"
    else
        bad "chat: a context's worth is not 'context full'" "$(screen_dump)"
    fi
    keys C-d
fi
chat_stop

# ---- issue 16 #7: numbers that do not mislead -------------------------------------------------------
chat_start 100 30 -- -t 1 -c 8192 -n 40 --temp 0 --db "$DM/num.db"
if wait_idle 30; then
    bw0=$(grep -E '^KV ' "$CH/screen" | grep -o '[█▏▎▍▌▋▊▉░]' | wc -l)
    keys "/set repeat_penalty 1.05" Enter
    keys "Once upon a time" Enter
    wait_for ' 40 tokens' 30
    wait_idle 20
    bw1=$(grep -E '^KV ' "$CH/screen" | grep -o '[█▏▎▍▌▋▊▉░]' | wc -l)
    # units that fit: a few hundred tokens of this model take KiB, never "0.00 MiB"
    if grep -qE '^KV .* · [0-9.]+ KiB / 5\.00 MiB' "$CH/screen" && ! grep -q ' 0\.00 MiB /' "$CH/screen"; then
        ok "chat: the gauge gives a small cache in KiB, not 0.00 MiB ($(grep -oE '[0-9.]+ KiB / 5\.00 MiB' "$CH/screen"))"
    else bad "chat: the gauge's units fit" "$(screen_dump)"; fi
    if [ "$bw0" -gt 10 ] && [ "$bw0" = "$bw1" ]; then ok "chat: the gauge's bar keeps its width as its label grows ($bw0 cells)"
    else bad "chat: the gauge's bar keeps its width" "$bw0 → $bw1 cells"; fi
    # /regen: the whole prompt is cached, one token is fed; no rate over it
    keys "/regen" Enter
    if wait_for 'prefill cached \([0-9]+\)' 30 && wait_idle 20 && ! grep -qE 'prefill [0-9]+ t/s' "$CH/screen"; then
        ok "chat: a prefill served from the cache says 'cached', not a rate over one token"
    else bad "chat: a cached prefill says cached" "$(screen_dump)"; fi
    keys "/show cache" Enter
    if wait_for 'write-ahead log' 10; then ok "chat: /show cache counts the database's write-ahead log"
    else bad "chat: /show cache counts the WAL" "$(screen_dump)"; fi
    keys C-d
    wait_for 'EXIT=' 15
    "$BIN" export last --db "$DM/num.db" --format json >"$DM/num.json" 2>&1
    if grep -qE '"repeat_penalty":[[:space:]]*1\.05(,|$)' "$DM/num.json" && ! grep -q '1.0499999' "$DM/num.json"; then
        ok "export: a float parameter is written as typed (repeat_penalty 1.05)"
    else bad "export: float parameters without float noise" "$(grep -o '"repeat_penalty":[^,]*' "$DM/num.json")"; fi
fi
chat_stop
# /set refuses what the table refuses (help and sliders say temp 0-2)
chat_start 100 30 -- -t 1 --db "$DM/range.db"
if wait_idle 30; then
    keys "/set temp 5" Enter
    if wait_for "/set temp: '5' is not a number from 0 to 2" 10; then ok "chat: /set temp 5 is refused with the range (0 to 2)"
    else bad "chat: /set temp 5 is refused" "$(screen_dump)"; fi
    keys C-d
fi
chat_stop

# ---- issue 16 #8: one range table; bench --json escapes the file name; tokenize -m NAME -----------
o1=$("$BIN" -m "$MODEL" --repeat-last-n -1 -n 4 --temp 0 -p "Once" 2>&1); r1=$?
printf 'repeat_last_n = -1\n' >"$DM/cfg.ini"
o2=$("$BIN" -m "$MODEL" --temp 5 -p x 2>&1); r2=$?
if [ $r1 = 0 ] && [ $r2 = 2 ] && echo "$o2" | grep -q "not a number from 0 to 2"; then
    ok "cli: --repeat-last-n -1 is accepted as in config.ini; --temp 5 is refused with the table's range"
else bad "cli: ranges from one table" "rc $r1 '$o1' / rc $r2 '$o2'"; fi
cp "$MODEL" "$DM/we\"ird.gguf"
"$BIN" bench -m "$DM/we\"ird.gguf" -p 8 -n 4 -r 1 -t 1 --json >"$DM/bench.json" 2>/dev/null
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d[0]["file"] == "we\"ird.gguf"' "$DM/bench.json" 2>/dev/null; then
    ok "bench --json: a file name with a quote is escaped (valid JSON)"
else bad "bench --json escapes the file name" "$(head -c 300 "$DM/bench.json")"; fi
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d[0]; assert r["read_gbps"] > 0 and r["fma_peak_gflops"] > 0 and r["gflops"] > 0 and 0 <= r["load_s"] < 60 and 0 < r["fma_peak_fraction"] < 5' "$DM/bench.json" 2>/dev/null; then
    ok "bench --json: the read bandwidth, the FMA peak, prefill GFLOP/s and the load time are measured"
else bad "bench --json: read bandwidth, FMA peak, GFLOP/s, load time" "$(head -c 600 "$DM/bench.json")"; fi
# decode runs are paired with a read pass each (a 512 MiB buffer), which the peak RSS must not count
"$BIN" bench -m "$MODEL" -p 0 -n 8 -r 3 -t 1 --json >"$DM/bench2.json" 2>/dev/null
if python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; assert r["test"] == "tg8" and r["read_gbps_paired"] > 0 and r["decode_bw_fraction"] > 0 and 0 < r["peak_rss_mib"] < 128, r' "$DM/bench2.json" 2>/dev/null; then
    ok "bench --json: decode's bandwidth fraction is paired with a read pass per run; the pass's buffer is not in the peak RSS"
else bad "bench: paired read passes, peak RSS" "$(head -c 600 "$DM/bench2.json")"; fi
mkdir -p "$XDG_DATA_HOME/kvchat/models"
cp "$MODEL" "$XDG_DATA_HOME/kvchat/models/tiny-stories.gguf"
if [ "$("$BIN" tokenize -m tiny-stories --ids "Once upon a time" 2>&1)" = "[1, 403, 407, 261, 378]" ]; then
    ok "tokenize -m NAME looks in the models directory"
else bad "tokenize -m NAME looks in the models directory" "$("$BIN" tokenize -m tiny-stories --ids "Once upon a time" 2>&1)"; fi
rm -f "$XDG_DATA_HOME/kvchat/models/tiny-stories.gguf"

# ---- issue 16 #5: config.ini warnings are shown in the chat, not on stderr after it --------------
mkdir -p "$CH/config/kvchat"
printf '[sampling]\ntemp = lots\n' >"$CH/config/kvchat/config.ini"
chat_start 100 30 -- -t 1 --db "$DM/cfgw.db"
if wait_idle 30 && grep -q 'config warning: ' "$CH/screen" && grep -q "config.ini:2: temp: 'lots'" "$CH/screen"; then
    keys C-d
    wait_for 'EXIT=' 15
    if ! grep -q "lots" "$CH/err"; then ok "chat: a config.ini warning is shown in the chat (and not on stderr after it)"
    else bad "chat: config warnings not on stderr after the chat" "$(cat "$CH/err")"; fi
else
    bad "chat: a config.ini warning is shown in the chat" "$(screen_dump; cat "$CH/err")"
fi
chat_stop
rm -f "$CH/config/kvchat/config.ini"

# ---- issue 16 #6: each reply keeps the name of the model that wrote it; names say more -----------
MB=$SHARED/models/llama-2-tiny-random.gguf
chat_start 110 30 -- -t 1 -n 12 --db "$DM/names.db"
if wait_idle 30; then
    keys "Once upon a time" Enter
    wait_for ' 12 tokens' 30
    wait_idle 20
    if grep -q '^ stories260K *│' "$CH/screen" && grep -q 'kvchat │ stories260K' "$CH/screen"; then
        ok "chat: a model whose general.name is only its architecture ('llama') is named by its file (stories260K)"
    else bad "chat: the model is named by its file when general.name says less" "$(screen_dump)"; fi
    keys C-d
    wait_for 'EXIT=' 15
    chat_start 110 30 -- -m "$MB" -t 1 -n 12 --resume last --db "$DM/names.db"
    if wait_idle 30 && grep -q '^ stories260K *│' "$CH/screen" && grep -q 'kvchat │ LLaMA v2' "$CH/screen"; then
        keys "Then" Enter
        wait_for ' 12 tokens' 30
        wait_idle 20
        if grep -q '^ stories260K *│' "$CH/screen" && grep -q '^ LLaMA v2 *│' "$CH/screen"; then
            ok "chat: resumed with another model, the old reply keeps its model's name and the new one has the new name"
        else bad "chat: each reply keeps its model's name (after a new reply)" "$(screen_dump)"; fi
    else
        bad "chat: each reply keeps its model's name" "$(screen_dump; cat "$CH/err")"
    fi
    keys C-d
fi
chat_stop

# ---- issue 16 #4: TERM=dumb (the line-by-line session) has the slash commands and saves -----------
# wait_prompt [SECONDS]: line mode is back at its prompt: the screen's last non-blank line is ">"
# (capture-pane drops the prompt's trailing space, so a pattern '^> $' never matches: each wait sat
# out its whole timeout, 140 s of this file)
wait_prompt() {
    local t=${1:-20} end
    end=$(($(date +%s) + t))
    while [ "$(date +%s)" -le "$end" ]; do
        cap >"$CH/screen"
        [ "$(grep -v '^ *$' "$CH/screen" | tail -1)" = ">" ] && return 0
        sleep 0.1
    done
    return 1
}
chat_start 100 30 TERM=dumb -- -t 1 -n 16 --db "$DM/dumb.db"
if wait_for 'Ctrl-C stops a reply' 20; then
    keys "/set temp 0" Enter
    r_set=0; wait_for '^temp = 0\.00' 10 && r_set=1
    keys "/help" Enter
    r_help=0; wait_for '^/quit +quit' 10 && r_help=1
    keys "/set temp 7" Enter
    r_bad=0; wait_for "/set temp: '7' is not a number from 0 to 2" 10 && r_bad=1
    keys "Once upon a time" Enter
    sleep 0.5; wait_prompt 20
    keys "/quit" Enter
    r_quit=0; wait_for 'EXIT=0' 15 && r_quit=1
    n_conv=$("$BIN" list --db "$DM/dumb.db" --ids 2>/dev/null | wc -l)
    n_msg=$(sqlite3 "$DM/dumb.db" "SELECT count(*) FROM messages" 2>/dev/null)
    if [ $r_set = 1 ] && [ $r_help = 1 ] && [ $r_bad = 1 ] && [ $r_quit = 1 ] && [ "$(sqlite3 "$DM/dumb.db" "SELECT count(*) FROM messages WHERE content LIKE '%set temp%'")" = 0 ] &&
        [ "$n_conv" = 1 ] && [ "${n_msg:-0}" -ge 2 ]; then
        ok "line mode (TERM=dumb): /set, /help and /quit work, a bad value is refused, and the session is saved"
    else
        bad "line mode (TERM=dumb): slash commands and saving" "set $r_set help $r_help bad $r_bad quit $r_quit convs $n_conv msgs $n_msg $(screen_dump)"
    fi
else
    bad "line mode (TERM=dumb) starts" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# every slash command of the full screen in line mode (its one table): /help lists the same set, each
# runs here or says why it does not apply; /system, /read, /regen, /undo, /edit, /model, /export and
# /clear change what is saved as the full screen's would
printf 'a short note\n' >"$DM/note.txt"
chat_start 160 50 TERM=dumb -- -t 1 -n 6 --temp 0 --db "$DM/dumb2.db"
if wait_for 'Ctrl-C stops a reply' 20; then
    keys "/help" Enter
    wait_for '^\(empty line\)' 10
    missing=""
    for cmd in /help /set /show /sessions /clear /regen /undo /edit /branch /theme /system /export /persona /model /read /copy /best /beams /quit; do
        grep -qE "^$cmd( |$)" "$CH/screen" || missing="$missing $cmd"
    done
    n_na=$(grep -c '(not in line mode: ' "$CH/screen")
    if [ -z "$missing" ] && [ "$n_na" = 6 ]; then
        ok "line mode: /help lists the full screen's 19 commands, 6 of them with why they do not apply"
    else bad "line mode: /help lists the full screen's commands" "missing:$missing; $n_na not applicable $(screen_dump)"; fi
    keys C-l
    keys "/system Be kind." Enter
    keys "/read $DM/note.txt" Enter
    r_read=0; wait_for 'attached note.txt \(12 bytes, [0-9]+ tokens\)' 10 && r_read=1
    keys "Once upon a time" Enter
    sleep 0.5; wait_prompt 20
    keys "/regen" Enter
    sleep 0.5; wait_prompt 20
    keys "/undo" Enter
    r_undo=0; wait_for 'dropped the last exchange' 10 && r_undo=1
    keys "Lily went out" Enter
    sleep 0.5; wait_prompt 20
    keys "/edit Tom went out" Enter
    sleep 0.5; wait_prompt 20
    keys "/model ../shared/models/llama-2-tiny-random.gguf" Enter
    r_model=0; wait_for 'model: stories260K → .*tokenized again' 30 && r_model=1
    keys "" Enter
    sleep 0.5; wait_prompt 20
    keys "/export json $DM/dumb2.json" Enter
    r_exp=0; wait_for 'exported conversation 1 \(json' 10 && r_exp=1
    for cmd in /sessions /branch /theme /copy; do keys "$cmd" Enter; done
    wait_for '^/copy: not in line mode' 10
    n_refused=$(grep -cE '^/(sessions|branch|theme|copy): not in line mode: ' "$CH/screen")
    keys "/clear" Enter "After" Enter
    sleep 0.5; wait_prompt 20
    keys "/quit" Enter
    wait_for 'EXIT=0' 15
    q() { sqlite3 "$DM/dumb2.db" "$1" 2>/dev/null; }
    # conversation 1: the user message with the file before it, two replies to it (/regen), then
    # "Lily went out" and "Tom went out" beside it at the root (/undo, /edit), the last with a
    # continuation by the second model; conversation 2 after /clear
    first=$(q "SELECT content FROM messages WHERE conversation_id = 1 ORDER BY id LIMIT 1")
    n_regen=$(q "SELECT count(*) FROM messages WHERE conversation_id = 1 AND role = 'assistant' AND parent_id = (SELECT min(id) FROM messages)")
    n_roots=$(q "SELECT count(*) FROM messages WHERE conversation_id = 1 AND parent_id IS NULL")
    n_models=$(q "SELECT count(DISTINCT model_id) FROM messages WHERE conversation_id = 1 AND role = 'assistant'")
    n_convs=$(q "SELECT count(*) FROM conversations")
    sys=$(grep -o '"system":[^,]*' "$DM/dumb2.json" | head -1)
    if [ $r_read = 1 ] && [ "$(printf '%s' "$first" | head -1)" = "File note.txt:" ] && [ "$n_regen" = 2 ] && [ $r_undo = 1 ] &&
        [ "$n_roots" = 3 ] && [ $r_model = 1 ] && [ "$n_models" = 2 ] && [ $r_exp = 1 ] && [ -s "$DM/dumb2.json" ] &&
        [ "$n_refused" = 4 ] && [ "$n_convs" = 2 ] && grep -q 'Be kind.' "$DM/dumb2.json"; then
        ok "line mode: /system, /read, /regen, /undo, /edit, /model, /export and /clear work and are saved; /sessions, /branch, /theme, /copy say why not"
    else
        bad "line mode: the full screen's commands" "read $r_read first '$first' regen $n_regen undo $r_undo roots $n_roots model $r_model models $n_models export $r_exp refused $n_refused convs $n_convs sys $sys $(screen_dump)"
    fi
else
    bad "line mode (TERM=dumb) starts (2)" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# ---- issue 16 #7: /set while a reply streams says so in the status bar, not in the transcript -----
chat_start 100 30 -- -t 1 -c 8192 --db "$DM/say.db"
if wait_idle 30; then
    keys "Once upon a time" Enter
    if wait_for '● generating' 20; then
        keys "/set temp 0.5" Enter
        r_flash=0; wait_for 'temp = 0\.50 \(from the next token\)' 5 && r_flash=1
        keys Escape
        wait_idle 20
        if [ $r_flash = 1 ] && ! pane_text <"$CH/screen" | grep -q 'temp = 0\.50'; then
            ok "chat: /set during a reply confirms in the status bar, not between the message and its reply"
        else bad "chat: /set during a reply stays out of the transcript" "flash $r_flash $(screen_dump)"; fi
    else bad "chat: /set during a reply (a reply starts)" "$(screen_dump)"; fi
    keys C-d
fi
chat_stop

# ---- issue 16 feature: /copy puts the last reply on the clipboard with OSC 52 (tmux receives it) ---
chat_start 100 30 -- -t 1 -n 20 --temp 0 --db "$DM/copy.db"
$TMC set -s set-clipboard on
$TMC set-buffer -b sentinel "nothing yet"
if wait_idle 30; then
    keys "/copy" Enter
    r_none=0; wait_for '/copy: there is no reply to copy yet' 10 && r_none=1
    keys "Once upon a time" Enter
    wait_for ' 20 tokens' 30
    wait_idle 20
    keys "/copy" Enter
    r_flash=0; wait_for 'copied the last reply \([0-9]+ bytes\)' 10 && r_flash=1
    want=$(sqlite3 "$DM/copy.db" "SELECT content FROM messages WHERE role = 'assistant' ORDER BY id DESC LIMIT 1")
    got=$($TMC show-buffer 2>/dev/null)
    if [ $r_none = 1 ] && [ $r_flash = 1 ] && [ -n "$want" ] && [ "$got" = "$want" ]; then
        ok "chat: /copy sends the last reply as OSC 52; tmux's buffer holds it exactly (${#want} bytes)"
    else bad "chat: /copy via OSC 52" "none $r_none flash $r_flash want '$want' got '$got'"; fi
    keys "/copy 1" Enter
    if wait_for '/copy 1: the replies have no code blocks' 10; then ok "chat: /copy N without code blocks says so"
    else bad "chat: /copy N without code blocks says so" "$(screen_dump)"; fi
    keys C-d
fi
chat_stop
chat_start 100 30 TERM=linux -- -t 1 -n 8 --db "$DM/copy2.db"
if wait_idle 30; then
    keys "Hi" Enter
    wait_for ' 8 tokens' 30
    wait_idle 20
    keys "/copy" Enter
    if wait_for 'TERM=linux\) has no clipboard escape' 10; then ok "chat: /copy on a terminal without OSC 52 (TERM=linux) says so"
    else bad "chat: /copy on TERM=linux says so" "$(screen_dump)"; fi
    keys C-d
fi
chat_stop

# ---- issue 16 feature: /read FILE attaches a text file to the next message ---------------------
printf 'The cat is named Whiskers.\nShe likes fish.\n' >"$DM/notes.txt"
printf 'ab\000cd' >"$DM/bin.dat"
head -c 3000000 /dev/zero | tr '\0' 'a' >"$DM/big.txt"
chat_start 100 30 -- -t 1 -n 8 --db "$DM/read.db"
if wait_idle 30; then
    keys "/read $DM/bin.dat" Enter
    r_bin=0; wait_for 'bin.dat: a binary file \(a NUL byte' 10 && r_bin=1
    keys "/read $DM/big.txt" Enter
    r_big=0; wait_for 'big.txt: larger than 1 MiB' 10 && r_big=1
    keys "/read $DM/notes.txt" Enter
    r_ok=0; wait_for 'attached notes.txt \(42 bytes, [0-9]+ tokens\)' 10 && r_ok=1
    keys "What is the cat called?" Enter
    wait_for ' 8 tokens' 30
    wait_idle 20
    stored=$(sqlite3 "$DM/read.db" "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT 1")
    want=$(printf 'File notes.txt:\n\nThe cat is named Whiskers.\nShe likes fish.\n\nWhat is the cat called?')
    if [ $r_bin = 1 ] && [ $r_big = 1 ] && [ $r_ok = 1 ] && [ "$stored" = "$want" ]; then
        ok "chat: /read attaches a text file (size in tokens) to the next message; binary and too-large files are refused"
    else bad "chat: /read FILE" "bin $r_bin big $r_big ok $r_ok stored '$stored' $(screen_dump)"; fi
    keys C-d
fi
chat_stop

# ---- issue 16 feature: Ctrl-X Ctrl-E edits the input in $EDITOR ---------------------------------
cat >"$DM/editor.sh" <<'EOS'
#!/bin/sh
# a scripted editor: appends to what the input held, records that it ran
printf '%s, edited in the editor\n' "$(cat "$1")" >"$1.new" && mv "$1.new" "$1"
echo ran >>"${0%/*}/editor.ran"
EOS
chmod +x "$DM/editor.sh"
rm -f "$DM/editor.ran"
chat_start 100 30 EDITOR="$DM/editor.sh" VISUAL= -- -t 1 -n 8 --db "$DM/ed.db"
if wait_idle 30; then
    keys "a draft"
    wait_for '^> a draft' 10
    keys C-x C-e
    if wait_for '^> a draft, edited in the editor' 15 && [ -s "$DM/editor.ran" ]; then
        keys Enter
        if wait_for '^ a draft, edited in the editor' 15; then ok "chat: Ctrl-X Ctrl-E edits the input in \$EDITOR and takes the result back"
        else bad "chat: the edited input is sent" "$(screen_dump)"; fi
    else bad "chat: Ctrl-X Ctrl-E runs \$EDITOR on the input" "$(screen_dump)"; fi
    keys C-d
fi
chat_stop

# ---- issue 16 feature: replies rendered as Markdown (md4c); /copy N copies code block N exactly ----
# The reply is injected: a conversation exported as JSON, its reply replaced by Markdown, imported
# and resumed.
chat_start 100 40 -- -t 1 -n 4 --db "$DM/md.db"
if wait_idle 30; then
    keys "Show me" Enter
    wait_for ' 4 tokens' 30
    wait_idle 20
    keys C-d
    wait_for 'EXIT=' 15
fi
"$BIN" export last --db "$DM/md.db" --format json >"$DM/md.json" 2>/dev/null
python3 - "$DM/md.json" <<'EOP'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
md = "# Greeting\n\nSome **bold** and *soft* words with `x = 1` inline.\n\n- first item\n- second item\n\n> a quote\n\n```python\nprint(\"hi\")  # exact\n    indented\n```\n\nSee [the docs](https://example.org)."
def walk(o):
    if isinstance(o, dict):
        if o.get("role") == "assistant" and "content" in o: o["content"] = md
        for v in o.values(): walk(v)
    elif isinstance(o, list):
        for v in o: walk(v)
walk(d)
json.dump(d, open(p, "w"))
EOP
"$BIN" import "$DM/md.json" --db "$DM/md.db" >/dev/null 2>&1
chat_start 100 40 -- -t 1 -n 4 --resume last --db "$DM/md.db"
$TMC set -s set-clipboard on
if wait_idle 30 && wait_for '┌─ code 1 · python' 10; then
    cap -e >"$DM/md.esc"
    pane=$(pane_text <"$CH/screen")
    r=""
    echo "$pane" | grep -q '^ Greeting *$' || r="$r heading"
    echo "$pane" | grep -q '# Greeting' && r="$r heading-marker"
    echo "$pane" | grep -q 'Some bold and soft words with x = 1 inline\.' || r="$r emphasis"
    echo "$pane" | grep -q '^ • first item' || r="$r list"
    grep -q '^ │ a quote' "$CH/screen" || r="$r quote"
    echo "$pane" | grep -q '^ print("hi")  # exact' || r="$r code"
    echo "$pane" | grep -q '^     indented' || r="$r code-indent"
    echo "$pane" | grep -q 'See the docs <https://example.org>\.' || r="$r link"
    grep -q "$(printf '\033')\[1m[^ ]*bold" "$DM/md.esc" || r="$r bold-attr"
    if [ -z "$r" ]; then ok "chat: a reply is rendered as Markdown: heading, emphasis, inline code, list, quote, link, a labelled code block"
    else bad "chat: Markdown rendering" "missing:$r $(screen_dump)"; fi
    keys "/copy 1" Enter
    wait_for 'copied code block 1 of 1' 10
    got=$($TMC show-buffer 2>/dev/null)
    if [ "$got" = "$(printf 'print("hi")  # exact\n    indented')" ]; then ok "chat: /copy 1 copies the code block exactly"
    else bad "chat: /copy 1 copies the code block exactly" "got '$got'"; fi
    keys "/set markdown off" Enter
    if wait_for '\*\*bold\*\*' 10 && wait_for '```python' 5; then ok "chat: /set markdown off shows the reply's text as it is"
    else bad "chat: /set markdown off" "$(screen_dump)"; fi
    keys C-d
else
    bad "chat: Markdown rendering (the injected reply is shown)" "$(screen_dump; cat "$CH/err")"
fi
chat_stop
chat_start 100 40 -- -t 1 -n 4 --resume last --no-markdown --db "$DM/md.db"
if wait_idle 30 && wait_for '\*\*bold\*\*' 10 && ! grep -q '┌─ code' "$CH/screen"; then ok "chat: --no-markdown shows replies as plain text"
else bad "chat: --no-markdown" "$(screen_dump)"; fi
chat_stop

# ---- issue 16 #7: the max-tokens slider is logarithmic with ∞ at its right end --------------------
chat_start 100 30 -- -t 1 -c 2048 --db "$DM/slider.db"
if wait_idle 30; then
    keys Tab
    for _ in 1 2 3 4 5; do keys Down; done
    keys End
    r_inf=0; wait_for '› max tokens +∞' 10 && r_inf=1
    keys Left
    r_max=0; wait_for '› max tokens +8192' 10 && r_max=1
    keys Left
    r_log=0; wait_for '› max tokens +66[0-9][0-9]' 10 && r_log=1
    keys Home
    r_min=0; wait_for '› max tokens +16' 10 && r_min=1
    keys Right
    r_step=0; wait_for '› max tokens +20' 10 && r_step=1
    if [ $r_inf$r_max$r_log$r_min$r_step = 11111 ]; then
        ok "chat: the max-tokens slider is logarithmic (16, 20 … 6600, 8192) with ∞ at its right end"
    else bad "chat: the max-tokens slider is logarithmic with ∞ at the right" "∞ $r_inf 8192 $r_max log $r_log 16 $r_min 20 $r_step $(screen_dump)"; fi
    keys Escape
    keys C-d
fi
chat_stop

# ---- issue 16: an early error of the full-screen chat frees what it holds (ASan's leak check) --
# --resume of a conversation that does not exist fails after the chat chose its template (here a
# Jinja one: the interpreter's prompt state), copied --system and --stop: kvchat under ASan
# (KVCHAT_SERVE_BIN, `make e2e` builds it) must exit 4 with the error and no leak report.
if [ -x "${KVCHAT_SERVE_BIN:-}" ]; then
    shared_abs=$(cd "$SHARED" && pwd)
    BIN_SAVED=$BIN
    BIN=$KVCHAT_SERVE_BIN
    chat_start 100 20 ASAN_OPTIONS=detect_leaks=1 -- --chat-template "$shared_abs/templates/Qwen-Qwen2.5-7B-Instruct.jinja" \
        --system "be brief" --stop "###" --resume 999 --db "$DM/early.db"
    BIN=$BIN_SAVED
    if wait_for 'EXIT=' 60 && grep -q 'EXIT=4' "$CH/screen" && grep -q 'no conversation 999' "$CH/err" &&
        ! grep -qE 'LeakSanitizer|AddressSanitizer|runtime error' "$CH/err"; then
        ok "chat: an early error (--resume of a missing conversation) exits 4 and leaks nothing under ASan"
    else
        bad "chat: an early error exits 4 and leaks nothing under ASan" "$(grep -E 'EXIT=' "$CH/screen") $(grep -E 'SUMMARY|leak of|resume' "$CH/err" | head -5)"
    fi
    chat_stop
fi
