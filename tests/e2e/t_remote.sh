# The chat on a remote backend (issue 14): `kvchat --remote URL` against `kvchat serve` on loopback
# (greedy text equal to the local engine's, max_tokens and usage, Esc mid-stream, the conversation
# saved and resumed), against a misbehaving node server (malformed SSE, 401, 500, a stall, a cut
# stream, connection refused: clear errors, no crash, the typed message kept; what the client sent),
# and against llama.cpp's llama-server when ../shared/bench/build-llamacpp.sh has built it.
# tmux drives the real chat on its own socket. Sourced by run.sh (ok/bad, BIN, MODEL, tmp).

RT=$tmp/remote
mkdir -p "$RT"
RT_TMC="tmux -L kvchat-remote-$$"
RT_PIDS=""
rt_old_trap=$(trap -p EXIT)
trap 'for p in $RT_PIDS; do kill "$p" 2>/dev/null; done; $RT_TMC kill-server >/dev/null 2>&1; rm -rf "$tmp"' EXIT
RT_DB=$RT/chat.db

r_cap() { $RT_TMC capture-pane -p -t r 2>/dev/null; }
r_keys() { $RT_TMC send-keys -t r "$@"; }
# r_wait REGEX [SECONDS]: 0 once the screen matches (left in $RT/screen)
r_wait() {
    local re=$1 t=${2:-30} end
    end=$(($(date +%s) + t))
    while [ "$(date +%s)" -le "$end" ]; do
        r_cap >"$RT/screen"
        grep -qE -- "$re" "$RT/screen" && return 0
        sleep 0.1
    done
    return 1
}
r_idle() { r_wait '│ ready( │|$)' "${1:-30}"; }
r_dump() { sed 's/^/       | /' "$RT/screen" | head -40; }
# r_start ARGS...: the chat `kvchat ARGS` in a fresh 120x32 tmux session "r"
r_start() {
    $RT_TMC kill-server >/dev/null 2>&1
    sleep 0.2
    {
        printf 'exec %s 2>%q\n' "$(printf '%q ' env -u NO_COLOR -u KVCHAT_REMOTE_API_KEY LANG=C.UTF-8 TERM=tmux-256color \
            XDG_STATE_HOME="$RT/state" XDG_CONFIG_HOME="$RT/config" "$BIN" --db "$RT_DB" "$@")" "$RT/err"
    } >"$RT/run.sh"
    $RT_TMC -f /dev/null new-session -d -s r -x 120 -y 32 "bash '$RT/run.sh'; echo EXIT=\$?; sleep 600"
}

if ! command -v tmux >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
    bad "remote: tmux, node and curl are installed (make deps, serve-test-deps)"
else

# ---- kvchat serve on loopback, a free port ----------------------------------------------------------
"$BIN" serve -m "$MODEL" --port 0 2>"$RT/serve.log" &
RT_SV=$!
RT_PIDS="$RT_PIDS $RT_SV"
RT_URL=""
for i in $(seq 1 100); do
    p=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$RT/serve.log")
    grep -q ready "$RT/serve.log" && [ -n "$p" ] && { RT_URL=http://127.0.0.1:$p; break; }
    sleep 0.1
done
[ -n "$RT_URL" ] && ok "remote: kvchat serve is up on loopback ($RT_URL)" || bad "remote: kvchat serve starts" "$(cat "$RT/serve.log")"

# one-shot: the server's greedy continuation is the local engine's (the server saw temperature 0 and max_tokens 24)
local_text=$("$BIN" -m "$MODEL" -p "Once upon a time" --temp 0 -n 24 2>/dev/null)
remote_text=$("$BIN" --remote "$RT_URL" -p "Once upon a time" --temp 0 -n 24 --stats 2>"$RT/p.err")
[ -n "$remote_text" ] && [ "Once upon a time$remote_text" = "$local_text" ] &&
    ok "remote: -p --remote streams the text the local engine gives (greedy, 24 tokens)" ||
    bad "remote: -p --remote equals the local greedy text" "local '$local_text' remote '$remote_text'"
grep -qE "prompt [0-9]+ tokens \([0-9]+ cached\) \| TTFT .* completion 24 tokens.*finish: length" "$RT/p.err" &&
    ok "remote: --stats shows the server's usage (completion 24 tokens, finish length)" ||
    bad "remote: --stats shows usage" "$(cat "$RT/p.err")"
# the URL may end in /v1 (vLLM's and ollama's documented form)
t=$("$BIN" --remote "$RT_URL/v1/" -p "Once upon a time" --temp 0 -n 24 2>&1)
[ "$t" = "$remote_text" ] && ok "remote: a URL ending in /v1/ reaches the same endpoint" || bad "remote: URL/v1/" "$t"

# ---- the chat in tmux ----------------------------------------------------------------------------------
greedy=$(printf '%s' "$remote_text" | sed 's/^[ ,]*//' | cut -c1-30)
r_start --remote "$RT_URL" --temp 0 -n 24
if r_idle 20; then
    grep -q "remote $RT_URL" "$RT/screen" && grep -q "KV remote" "$RT/screen" &&
        ok "remote: the status bar names the server, the KV gauge says remote" ||
        { bad "remote: status bar / gauge say remote"; r_dump; }
    r_keys "Once upon a time" Enter
    if r_wait "24 tokens" 30 && r_idle 10; then
        grep -qF "$greedy" "$RT/screen" && ok "remote: the chat streams the server's greedy reply" ||
            { bad "remote: the chat's reply is the greedy text ('$greedy')"; r_dump; }
        grep -qE "KV remote · prompt [0-9]+ tokens \([0-9]+ cached\) · completion 24 · as the server reports" "$RT/screen" &&
            ok "remote: the KV gauge shows the server's usage (prompt, cached, completion 24)" ||
            { bad "remote: gauge shows usage"; r_dump; }
        grep -qE "TTFT [0-9]+ ms · .*24 tokens · length" "$RT/screen" && ok "remote: the stats line shows TTFT, 24 tokens, finish length" ||
            { bad "remote: stats line"; r_dump; }
    else bad "remote: a reply arrives in the chat"; r_dump; fi
    # max_tokens from the chat reaches the request
    r_keys "/set max_tokens 5" Enter
    r_keys "The dog" Enter
    if r_wait "\[max tokens\]" 20 && r_idle 10 && grep -q "completion 5 ·" "$RT/screen"; then
        ok "remote: /set max_tokens 5 gives a 5-token reply ([max tokens], completion 5)"
    else bad "remote: max_tokens 5 reaches the server"; r_dump; fi
    r_keys "/show cache" Enter
    r_wait "local-only" 5 && ok "remote: /show cache says it is local-only" || { bad "remote: /show cache local-only"; r_dump; }
    # Esc mid-stream: no limit, then stop it while it streams
    r_keys "/set max_tokens -1" Enter
    r_keys "Tell me a long story" Enter
    if r_wait "generating" 20; then
        sleep 0.3
        r_keys Escape
        t0=$(date +%s%N)
        if r_wait "\[stopped\]" 5 && r_idle 5; then
            ms=$((($(date +%s%N) - t0) / 1000000))
            [ "$ms" -lt 3000 ] && ok "remote: Esc stops a streaming reply at once (${ms} ms, [stopped])" ||
                bad "remote: Esc stops within 3 s" "${ms} ms"
        else bad "remote: Esc mid-stream gives [stopped]"; r_dump; fi
    else bad "remote: a long reply streams (generating)"; r_dump; fi
    r_keys C-d
    r_wait "EXIT=0" 10 && ok "remote: the chat quits cleanly (exit 0)" || { bad "remote: exit 0"; r_dump; cat "$RT/err"; }
else bad "remote: the chat opens on --remote"; r_dump; cat "$RT/err"; fi

# saved: kvchat list shows it (the server's model as the model), and it resumes on the server
lst=$("$BIN" list --db "$RT_DB" 2>&1)
echo "$lst" | grep -qE "^ +1 .* 6 +1 +stories260K +Once upon a time" && ok "remote: the conversation is saved (kvchat list: model stories260K)" ||
    bad "remote: kvchat list shows the remote conversation" "$lst"
exp=$("$BIN" export last --db "$RT_DB" --format json 2>&1)
echo "$exp" | grep -qF "$greedy" && ok "remote: the saved reply is the streamed text (export)" || bad "remote: export has the reply" "$exp"
r_start --remote "$RT_URL" --temp 0 --resume last
# the pane shows the conversation's end: its last reply, the one Esc stopped (how long it got
# depends on the machine's speed, so the "Conversation 1" notice and the first reply may be
# scrolled off above it)
if r_wait "\[stopped\]" 15 && r_idle 10; then
    grep -q "remote http" "$RT/screen" && ok "remote: --resume last reopens it on the server (its last reply, [stopped], shown)" ||
        { bad "remote: resume shows the conversation on the server"; r_dump; }
    r_keys "/set max_tokens 8" Enter # a short reply: its "branch 2/2" stays on screen
    r_keys "/regen" Enter
    r_wait "Tell me a long story" 5 && r_idle 30
    # /regen after resume: a new branch from the server
    r_wait "branch 2/2" 30 && ok "remote: /regen on a resumed chat asks the server again (branch 2/2)" || { bad "remote: /regen branch"; r_dump; }
    r_keys C-d
else bad "remote: --resume last opens"; r_dump; cat "$RT/err"; fi
kill "$RT_SV" 2>/dev/null
wait "$RT_SV" 2>/dev/null

# ---- a misbehaving server ----------------------------------------------------------------------------------
: >"$RT/bodies"
node "$here/remote_fake_server.mjs" "$RT/bodies" >"$RT/fake.log" 2>&1 &
RT_FK=$!
RT_PIDS="$RT_PIDS $RT_FK"
FK=""
for i in $(seq 1 100); do
    p=$(sed -n 's/^listening \([0-9]*\)$/\1/p' "$RT/fake.log")
    [ -n "$p" ] && { FK=http://127.0.0.1:$p; break; }
    sleep 0.1
done
[ -n "$FK" ] || bad "remote: the fake server starts" "$(cat "$RT/fake.log")"
# rp NAME PATTERN ARGS...: `kvchat -p hi ARGS` fails (exit 1) with PATTERN on stderr
rp() {
    local name=$1 pat=$2 out rc
    shift 2
    out=$(timeout 20 "$BIN" -p hi "$@" 2>&1)
    rc=$?
    [ "$rc" = 1 ] && echo "$out" | grep -qE -- "$pat" && ok "remote: $name gives a clear error (exit 1)" ||
        bad "remote: $name: exit 1 and /$pat/" "rc $rc: $out"
}
rp "malformed SSE" "$FK/malformed/v1/chat/completions: a malformed event stream: an event's data is not JSON" --remote "$FK/malformed"
rp "HTTP 401" "$FK/auth/v1/chat/completions: HTTP 401: Invalid API Key \(authentication_error\) — check the API key" --remote "$FK/auth"
rp "a wrong API key" "HTTP 401" --remote "$FK/auth" --api-key wrong
t=$(KVCHAT_REMOTE_API_KEY=sesame "$BIN" --remote "$FK/auth" -p hi 2>&1)
[ "$t" = "authorized" ] && ok "remote: KVCHAT_REMOTE_API_KEY is sent as Bearer" || bad "remote: the API key from the environment" "$t"
t=$("$BIN" --remote "$FK/auth" --api-key sesame -p hi 2>&1)
[ "$t" = "authorized" ] && ok "remote: --api-key is sent as Bearer" || bad "remote: --api-key" "$t"
rp "HTTP 500" "HTTP 500: the model crashed \(server_error\) — the server failed" --remote "$FK/boom"
rp "HTTP 404" "HTTP 404: unknown mode 'nothere' \(invalid_request_error\) — check the URL" --remote "$FK/nothere"
rp "a stalled server" "$FK/stall/v1/chat/completions: the server sent nothing for 1 s in the middle of the reply" --remote "$FK/stall" --remote-timeout 1
rp "a stream cut short" "$FK/cut/v1/chat/completions: the server closed the connection before the reply ended \(1 piece received" --remote "$FK/cut"
rp "a server that does not stream" "$FK/json/v1/chat/completions: the server answered with Content-Type application/json, not an event stream" --remote "$FK/json"
rp "connection refused" "http://127.0.0.1:9/v1/chat/completions: .*(Couldn't connect|refused).*is the server running there" --remote http://127.0.0.1:9
out=$("$BIN" --remote ftp://x -p hi 2>&1); rc=$?
[ "$rc" = 2 ] && echo "$out" | grep -q "an http:// or https:// URL" &&
    ok "remote: a URL that is not http(s) is a usage error (exit 2)" || bad "remote: ftp:// URL" "rc $rc: $out"

# what the client sent: the chat's settings, as sliders and /set leave them
: >"$RT/bodies"
r_start --remote "$FK/ok" --temp 0.7 --top-k 0 --seed 42 --stop "THE END" --system "be brief" -n 64
if r_idle 20; then
    # the temperature slider, moved with the keys: Tab focuses the panel (on temperature), Right adds a step, Enter returns
    r_keys Tab
    r_keys Right
    r_wait 'temperature +0\.75' 5 || { bad "remote: the temperature slider moves to 0.75"; r_dump; }
    r_keys Enter
    r_keys "Hi there" Enter
    if r_wait "Hello from the fake server\." 10 && r_idle 10; then
        ok "remote: the chat streams the fake server's reply"
        b=$(head -1 "$RT/bodies")
        v=$(node -e 'const j = JSON.parse(process.argv[1]); console.log([j.model, j.temperature, j.top_k, j.seed, j.max_tokens,
              j.stop.join("|"), j.stream, j.stream_options.include_usage, j.messages.map(m => m.role + ":" + m.content).join("|"),
              j.min_p, j.top_p].join(" "))' "$b" 2>&1)
        [ "$v" = "fake-model 0.75  42 64 THE END true true system:be brief|user:Hi there 0.05 0.95" ] &&
            ok "remote: the request carries the chat's settings (temperature from the slider 0.75, seed, max_tokens, stop, system, no top_k when off)" ||
            bad "remote: the request body" "$v — $b"
        grep -qE "KV remote · prompt 17 tokens \(11 cached\) · completion 6 · as the server reports" "$RT/screen" &&
            ok "remote: the gauge shows the usage the server sent (17, 11 cached, 6)" || { bad "remote: fake usage in the gauge"; r_dump; }
    else bad "remote: the fake server's reply"; r_dump; fi
    # errors in the chat: the message names the URL and the problem, the typed message stays, the chat goes on
    r_keys "/quit" Enter
else bad "remote: the chat opens on the fake server"; r_dump; fi
r_start --remote "$FK/malformed" --remote-timeout 2
if r_idle 20; then
    r_keys "my precious message" Enter
    if r_wait "malformed event stream" 10 && r_idle 5; then
        grep -qF "$FK/malformed/v1/chat/completions" "$RT/screen" && grep -q "my precious message" "$RT/screen" &&
            ok "remote: a malformed stream is an error in the chat naming the URL; the message typed stays" ||
            { bad "remote: malformed in the chat"; r_dump; }
        grep -q "\[error\]" "$RT/screen" && ok "remote: the partial reply is marked [error]" || { bad "remote: [error] note"; r_dump; }
    else bad "remote: the chat shows the malformed-stream error"; r_dump; fi
    r_keys C-d
    r_wait "EXIT=0" 10 && ok "remote: the chat survives a bad server (exit 0)" || { bad "remote: exit 0 after errors"; r_dump; cat "$RT/err"; }
else bad "remote: the chat opens on the malformed server"; r_dump; fi
# a server down at start: the chat still opens, says so, and keeps the message
r_start --remote http://127.0.0.1:9
if r_idle 20; then
    grep -q "127.0.0.1:9/v1/models" "$RT/screen" && ok "remote: a server down at start is said in the chat (GET /v1/models)" ||
        { bad "remote: the probe's error at start"; r_dump; }
    r_keys "still here" Enter
    r_wait "is the server running there" 10 && grep -q "still here" "$RT/screen" &&
        ok "remote: connection refused in the chat; the typed message stays" || { bad "remote: refused in the chat"; r_dump; }
    r_keys C-d
else bad "remote: the chat opens with the server down"; r_dump; fi
# Esc on a slow stream closes the connection (the server sees it go)
r_start --remote "$FK/slow"
if r_idle 20; then
    r_keys "go slowly" Enter
    r_wait "word3" 10
    r_keys Escape
    if r_wait "\[stopped\]" 3; then
        for i in $(seq 1 30); do grep -q "CLOSED slow" "$RT/bodies" && break; sleep 0.1; done
        grep -q "CLOSED slow" "$RT/bodies" && ok "remote: Esc aborts the transfer (the server sees the connection close)" ||
            bad "remote: Esc closes the connection" "$(cat "$RT/bodies")"
    else bad "remote: Esc on a slow stream"; r_dump; fi
    r_keys C-d
else bad "remote: the chat opens on the slow server"; r_dump; fi
kill "$RT_FK" 2>/dev/null

# ---- kvchat serve --store: finished requests become conversations ---------------------------------------------
SDB=$RT/served.db
SVB=${KVCHAT_SERVE_BIN:-$BIN} # under make e2e: the ASan + UBSan build (a leak fails the exit status)
"$SVB" serve -m "$MODEL" --port 0 --store "$SDB" 2>"$RT/store.log" &
RT_ST=$!
RT_PIDS="$RT_PIDS $RT_ST"
SU=""
for i in $(seq 1 150); do
    p=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$RT/store.log")
    grep -q ready "$RT/store.log" && [ -n "$p" ] && { SU=http://127.0.0.1:$p; break; }
    sleep 0.1
done
if [ -n "$SU" ]; then
    r1=$(curl -s -m 60 "$SU/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages": [{"role": "system",
        "content": "You tell stories."}, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Once upon a time"}], "max_tokens": 12, "temperature": 0}')
    c1=$(node -e 'console.log(JSON.parse(process.argv[1]).choices[0].message.content)' "$r1" 2>/dev/null)
    curl -sN -m 60 "$SU/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "A streamed request"}], "max_tokens": 6, "stream": true}' >"$RT/st.sse"
    "$BIN" --remote "$SU" -p "Sent by the remote chat" -n 4 >/dev/null 2>&1
    kill -TERM "$RT_ST"
    wait "$RT_ST"
    rc=$?
    [ "$rc" = 0 ] && ok "serve --store: the server stops cleanly (exit 0$([ -n "${KVCHAT_SERVE_BIN:-}" ] && echo ", no leak under ASan"))" ||
        bad "serve --store: exit status" "$rc: $(tail -5 "$RT/store.log")"
    lst=$("$BIN" list --db "$SDB" 2>&1)
    echo "$lst" | grep -qE "^ +1 .* 4 +1 .*Hello$" && echo "$lst" | grep -qE "^ +2 .* 2 +1 .*A streamed request$" &&
        echo "$lst" | grep -qE "^ +3 .* 2 +1 .*Sent by the remote chat$" &&
        ok "serve --store: each finished request is a conversation in kvchat list (history kept, streamed too)" ||
        bad "serve --store: kvchat list" "$lst"
    exp=$("$BIN" export 1 --db "$SDB" --format json 2>&1)
    sys=$(node -e 'const j = JSON.parse(process.argv[1]); console.log(j.system || j.system_prompt || "")' "$exp" 2>/dev/null)
    last=$(node -e 'const j = JSON.parse(process.argv[1]); const m = j.messages; console.log(m[m.length - 1].content)' "$exp" 2>/dev/null)
    [ -n "$c1" ] && [ "$last" = "$c1" ] && [ "$sys" = "You tell stories." ] &&
        ok "serve --store: the stored reply is the one sent, with the request's system prompt" ||
        bad "serve --store: export of the stored request" "reply '$c1' stored '$last' system '$sys' — $exp"
    # the chat's F3 lists them
    r_start -m "$MODEL" --db "$SDB"
    if r_idle 20; then
        r_keys F3
        r_wait "A streamed request" 5 && grep -q "Sent by the remote chat" "$RT/screen" &&
            ok "serve --store: the chat's F3 sessions view shows the served conversations" || { bad "serve --store: F3"; r_dump; }
        r_keys Escape
        r_keys C-d
    else bad "serve --store: the chat opens on the database"; r_dump; fi
    out=$("$BIN" serve --help)
    echo "$out" | grep -q -- "--store\[=DB\]" && ok "serve --store: documented in serve --help" || bad "serve --store in --help"
else bad "serve --store: the server starts" "$(cat "$RT/store.log")"; fi

# ---- llama.cpp's own llama-server, where it has been built ------------------------------------------------------
LS_BIN=${KVCHAT_LLAMA_SERVER:-/tmp/kvchat-ref/llama.cpp/build/bin/llama-server}
if [ -x "$LS_BIN" ]; then
    port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
    "$LS_BIN" -m "$MODEL" --host 127.0.0.1 --port "$port" -c 512 -t 1 >"$RT/llama-server.log" 2>&1 &
    RT_LS=$!
    RT_PIDS="$RT_PIDS $RT_LS"
    for i in $(seq 1 150); do curl -s "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"ok"' && break; sleep 0.2; done
    t=$("$BIN" --remote "http://127.0.0.1:$port" -p "Once upon a time" --temp 0 -n 16 --stats 2>"$RT/ls.err")
    [ -n "$t" ] && grep -qE "completion 16 tokens" "$RT/ls.err" &&
        ok "remote: llama-server streams a reply with usage (16 completion tokens)" || bad "remote: llama-server one-shot" "$t / $(cat "$RT/ls.err")"
    r_start --remote "http://127.0.0.1:$port" --temp 0 -n 16
    if r_idle 20; then
        r_keys "Once upon a time" Enter
        r_wait "completion 16 · as the server reports" 30 && r_idle 10 &&
            ok "remote: the chat on llama-server shows its reply and usage" || { bad "remote: chat on llama-server"; r_dump; }
        r_keys C-d
    else bad "remote: the chat opens on llama-server"; r_dump; fi
    kill "$RT_LS" 2>/dev/null
else
    echo "skip - remote: llama-server not built ($LS_BIN; ../shared/bench/build-llamacpp.sh builds it)"
fi

$RT_TMC kill-server >/dev/null 2>&1
fi
eval "${rt_old_trap:-trap - EXIT}"
