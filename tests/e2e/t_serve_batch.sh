# kvchat serve's continuous batching: concurrent greedy streams (openai npm client) equal each alone, n = 3 with a seed, a client vanishing mid-stream while the others go on, a slow reader not stalling the others, cached_tokens of a repeated system prompt, context shift past -c (and --no-context-shift); every server started here is stopped at the end.
sb=$tmp/serve_batch
mkdir -p "$sb"
SB_ROOT=$(cd "$here/../.." && pwd)
SB_BIN=${KVCHAT_SERVE_BIN:-$BIN}
SB_NPM=$SB_ROOT/build/npm
SB_PIDS=""
trap 'for p in $SB_PIDS ${SV_PIDS:-}; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
# sb_start NAME ARGS...: `kvchat serve --port 0 ARGS` logging to $sb/NAME.log; sets SB_URL, SB_PID
sb_start() {
    local name=$1 port="" i
    shift
    "$SB_BIN" serve --port 0 "$@" 2>"$sb/$name.log" &
    SB_PID=$!
    SB_PIDS="$SB_PIDS $SB_PID"
    SB_URL=""
    for i in $(seq 1 150); do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$sb/$name.log" 2>/dev/null)
        grep -q "ready" "$sb/$name.log" 2>/dev/null && [ -n "$port" ] && { SB_URL=http://127.0.0.1:$port; return 0; }
        kill -0 "$SB_PID" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
# sb_stop NAME: SIGTERM; exit 0 within 15 s (under ASan: no leak, no error)
sb_stop() {
    local i rc
    kill -TERM "$SB_PID"
    for i in $(seq 1 150); do kill -0 "$SB_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SB_PID" 2>/dev/null && { bad "serve batch ($1): SIGTERM stops the server within 15 s"; kill -KILL "$SB_PID"; }
    wait "$SB_PID"
    rc=$?
    [ "$rc" = 0 ] && ok "serve batch ($1): SIGTERM stops the server (exit 0)" ||
        bad "serve batch ($1): exit status after SIGTERM" "$rc: $(grep -A12 -m1 'ERROR\|runtime error' "$sb/$1.log")"
}
sb_js() { node -e 'let j; try { j = JSON.parse(process.argv[1]); } catch (e) { console.log("ERR"); process.exit(); }
                   console.log(String(eval(process.argv[2])))' "$1" "$2"; }
sb_post() { curl -s -m 120 -H 'Content-Type: application/json' -d "$2" "$SB_URL$1"; }

if ! command -v node >/dev/null || [ ! -f "$SB_NPM/node_modules/openai/package.json" ]; then
    bad "serve batch: node and the openai npm package (make serve-test-deps)"
elif sb_start batch -m "$MODEL" -t 2 --parallel 4; then
    while IFS= read -r line; do
        case $line in
        ok\ *) ok "serve batch: ${line#ok }" ;;
        FAIL\ *) bad "serve batch: ${line#FAIL }" ;;
        *) [ -n "$line" ] && bad "serve batch: openai client said" "$line" ;;
        esac
    done <<<"$(node "$here/serve_batch.mjs" "$SB_NPM/node_modules" "$SB_URL/v1" stories260K 2>&1)"
    sb_stop batch
else
    bad "serve batch: the server starts" "$(cat "$sb/batch.log")"
fi

# a model that never stops by itself: one of three streams vanishes, one reads slowly; the others finish
if sb_start vanish -m "$SHARED/models/llama-2-tiny-random.gguf" -c 1100 -t 2 --parallel 4; then
    req='{"prompt":"Hello","max_tokens":300,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
    alone=$(sb_post /v1/completions "${req/\"stream\":true/\"stream\":false}")
    curl -s -N -m 120 -H 'Content-Type: application/json' -d "$req" "$SB_URL/v1/completions" >"$sb/s1.out" &
    c1=$!
    curl -s -N -m 120 -H 'Content-Type: application/json' -d "$req" "$SB_URL/v1/completions" >"$sb/s2.out" &
    c2=$!
    curl -s -N -m 120 -H 'Content-Type: application/json' -d "$req" "$SB_URL/v1/completions" >"$sb/gone.out" &
    cg=$!
    for i in $(seq 1 200); do [ -s "$sb/gone.out" ] && break; sleep 0.05; done
    kill "$cg" 2>/dev/null
    wait "$cg" 2>/dev/null
    wait "$c1" "$c2"
    gone_n=$(grep -c '"text"' "$sb/gone.out")
    n1=$(grep -o '"completion_tokens":[0-9]*' "$sb/s1.out" | cut -d: -f2)
    n2=$(grep -o '"completion_tokens":[0-9]*' "$sb/s2.out" | cut -d: -f2)
    t_alone=$(sb_js "$alone" 'j.choices[0].text')
    t1=$(sed -n 's/^data: //p' "$sb/s1.out" | grep '"choices":\[{' | node -e '
        let t = ""; require("readline").createInterface({ input: process.stdin }).on("line", (l) => {
          const j = JSON.parse(l); for (const c of j.choices) t += c.text || ""; }).on("close", () => process.stdout.write(t));')
    sleep 0.3
    [ "$n1" = 300 ] && [ "$n2" = 300 ] && [ "$gone_n" -lt 300 ] && grep -q 'client gone, cancelled\|connection closed, cancelled' "$sb/vanish.log" &&
        ok "serve batch: a client vanishing mid-stream is cancelled, the two others finish (300 tokens each; it got $gone_n chunks)" ||
        bad "serve batch: a vanishing client among others" "n1=$n1 n2=$n2 gone=$gone_n; $(tail -n4 "$sb/vanish.log")"
    [ -n "$t_alone" ] && [ "$t1" = "$t_alone" ] && ok "serve batch: a stream batched with others equals the request alone (300 tokens)" ||
        bad "serve batch: batched stream text" "$(head -c 200 <<<"$t1") vs $(head -c 200 <<<"$t_alone")"

    # a reader taking 300 bytes a second does not hold the others up
    curl -s -N -m 60 --limit-rate 300 -H 'Content-Type: application/json' -d "${req/300/1000}" "$SB_URL/v1/completions" >/dev/null &
    cs=$!
    sleep 0.5
    t0=$(date +%s%N)
    r=$(sb_post /v1/completions '{"prompt":"Hi","max_tokens":100,"temperature":0}')
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "$(sb_js "$r" 'j.usage.completion_tokens')" = 100 ] && kill -0 "$cs" 2>/dev/null &&
        ok "serve batch: a slow reader does not stall another request (100 tokens in $ms ms while it reads)" ||
        bad "serve batch: a slow reader" "$r"
    kill "$cs" 2>/dev/null
    wait "$cs" 2>/dev/null
    sb_stop vanish
else
    bad "serve batch: the server starts (llama-2-tiny-random)" "$(cat "$sb/vanish.log")"
fi

# context shift: with -c 64 an 18-token prompt asking for 60 tokens runs past the context; two such
# requests decoding together each get all 60 (the sequence keeps 4 positions, drops half of the rest,
# goes on), the same text as alone; --no-context-shift ends one at the full context instead
cs_req='{"prompt":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen","max_tokens":60,"temperature":0}'
if sb_start shift -m "$SHARED/models/llama-2-tiny-random.gguf" -c 64 -t 2 --parallel 2; then
    a=$(sb_post /v1/completions "$cs_req")
    sb_post /v1/completions "$cs_req" >"$sb/cs1.out" &
    q1=$!
    b2=$(sb_post /v1/completions "${cs_req/fourteen/fifteen}")
    wait "$q1"
    b1=$(cat "$sb/cs1.out")
    pa=$(sb_js "$a" 'j.usage.prompt_tokens')
    u=$(sb_js "$a" 'j.usage.completion_tokens + " " + j.choices[0].finish_reason')
    u1=$(sb_js "$b1" 'j.usage.completion_tokens + " " + j.choices[0].finish_reason')
    u2=$(sb_js "$b2" 'j.usage.completion_tokens + " " + j.choices[0].finish_reason')
    [ "$pa" -gt 4 ] && [ $((pa + 60)) -gt 64 ] && [ "$u" = "60 length" ] && [ "$u1" = "60 length" ] && [ "$u2" = "60 length" ] &&
        [ "$(sb_js "$b1" 'j.choices[0].text')" = "$(sb_js "$a" 'j.choices[0].text')" ] &&
        ok "serve batch: context shift — a $pa-token prompt + 60 tokens past -c 64 gives all 60, batched = alone" ||
        bad "serve batch: context shift past -c 64" "prompt $pa; alone $u, batched $u1 / $u2: $(head -c 300 <<<"$b1")"
    sb_stop shift
else
    bad "serve batch: the server starts (-c 64)" "$(cat "$sb/shift.log")"
fi
if sb_start noshift -m "$SHARED/models/llama-2-tiny-random.gguf" -c 64 -t 2 --no-context-shift; then
    a=$(sb_post /v1/completions "$cs_req")
    pa=$(sb_js "$a" 'j.usage.prompt_tokens')
    u=$(sb_js "$a" 'j.usage.completion_tokens + " " + j.choices[0].finish_reason')
    [ "$u" = "$((64 - pa + 1)) length" ] && ok "serve batch: --no-context-shift ends the request at the full context ($u)" ||
        bad "serve batch: --no-context-shift" "prompt $pa: $u"
    sb_stop noshift
else
    bad "serve batch: the server starts (--no-context-shift)" "$(cat "$sb/noshift.log")"
fi

# a system prompt shared by requests is prefilled once: the next request reports it as cached_tokens
if sb_start cached -m "$MODEL" -t 2 --chat-template chatml; then
    sys="You are a helpful storyteller. You tell short, happy stories about animals, children and their friends in a small town by the sea, with simple words."
    m1=$(sb_post /v1/chat/completions "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"Tell me about a cat.\"}],\"max_tokens\":8,\"temperature\":0}")
    m2=$(sb_post /v1/chat/completions "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"A story of a dog, please.\"}],\"max_tokens\":8,\"temperature\":0}")
    c1=$(sb_js "$m1" 'j.usage.prompt_tokens_details.cached_tokens')
    c2=$(sb_js "$m2" 'j.usage.prompt_tokens_details.cached_tokens')
    p2=$(sb_js "$m2" 'j.usage.prompt_tokens')
    # the system part is whole 16-token blocks of the first prompt; the cache holds at least 32 of them
    [ "$c1" = 0 ] && [ "$c2" -ge 32 ] && [ "$c2" -lt "$p2" ] && [ $((c2 % 16)) = 0 ] &&
        ok "serve batch: a repeated system prompt is cached (cached_tokens 0, then $c2 of $p2)" ||
        bad "serve batch: cached_tokens of a repeated system prompt" "$c1 / $c2 of $p2: $m2"
    sb_stop cached
else
    bad "serve batch: the server starts (chatml)" "$(cat "$sb/cached.log")"
fi
