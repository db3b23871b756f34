# kvchat serve: the OpenAI-compatible server on loopback, with curl and the official `openai` npm client — greedy output equal to the one-shot's, streaming (SSE) and not, usage counts, stop strings, errors (bad JSON, wrong types, unknown route, huge body, API key), a client vanishing mid-stream, 200 idle connections; every server started here is killed at the end.
sv=$tmp/serve
mkdir -p "$sv"
SROOT=$(cd "$here/../.." && pwd)
SV_PIDS=""
# the server under test: `make e2e` passes kvchat built with AddressSanitizer + UBSan (leaks make its
# exit status nonzero, which the SIGTERM checks see); else the binary under test
SVBIN=${KVCHAT_SERVE_BIN:-$BIN}
npmdir=$SROOT/build/npm
# openai_lines OUTPUT: each "ok NAME" / "FAIL NAME: why" line of serve_openai.mjs as a test result
openai_lines() {
    local line
    while IFS= read -r line; do
        case $line in
        ok\ *) ok "serve: ${line#ok }" ;;
        FAIL\ *) bad "serve: ${line#FAIL }" ;;
        *) [ -n "$line" ] && bad "serve: openai client said" "$line" ;;
        esac
    done <<<"$1"
}
sv_old_trap=$(trap -p EXIT)
trap 'for p in $SV_PIDS; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

# sv_start NAME ARGS...: start `kvchat serve --port 0 ARGS` logging to $sv/NAME.log; sets SV_URL (empty on failure)
sv_start() {
    local name=$1 port="" i
    shift
    "$SVBIN" serve --port 0 "$@" 2>"$sv/$name.log" &
    SV_PID=$!
    SV_PIDS="$SV_PIDS $SV_PID"
    SV_URL=""
    for i in $(seq 1 100); do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$sv/$name.log" 2>/dev/null)
        grep -q "ready" "$sv/$name.log" 2>/dev/null && [ -n "$port" ] && { SV_URL=http://127.0.0.1:$port; return 0; }
        kill -0 "$SV_PID" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
# sv_stop NAME: SIGTERM; the server must exit 0 within 10 s (under ASan: no leak, no error)
sv_stop() {
    local i rc
    kill -TERM "$SV_PID"
    for i in $(seq 1 100); do kill -0 "$SV_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SV_PID" 2>/dev/null; then
        bad "serve ($1): SIGTERM stops the server within 10 s"
        kill -KILL "$SV_PID"
    fi
    wait "$SV_PID"
    rc=$?
    [ "$rc" = 0 ] && ok "serve ($1): SIGTERM stops the server (exit 0)" ||
        bad "serve ($1): exit status after SIGTERM" "$rc: $(grep -A12 -m1 'ERROR\|runtime error' "$sv/$1.log")"
}
# js JSON EXPR: EXPR evaluated with `j` the parsed JSON (prints the result; "ERR" for bad JSON)
js() { node -e 'let j; try { j = JSON.parse(process.argv[1]); } catch (e) { console.log("ERR"); process.exit(); }
                console.log(String(eval(process.argv[2])))' "$1" "$2"; }
# post PATH BODY [curl args]: prints the body, then the status on its own last line
post() { local p=$1 b=$2; shift 2; curl -s -m 60 -w '\n%{http_code}' -H 'Content-Type: application/json' "$@" -d "$b" "$SV_URL$p"; }
body() { sed '$d' <<<"$1"; }
status() { tail -n1 <<<"$1"; }

if ! command -v node >/dev/null || ! command -v curl >/dev/null; then
    bad "serve: node and curl are needed" "$(command -v node curl)"
elif ! sv_start main -m "$MODEL" -c 512 -t 1; then
    bad "serve: kvchat serve starts and says where it listens" "$(cat "$sv/main.log")"
else
    ok "serve: kvchat serve starts on a free loopback port ($SV_URL)"
    r=$(curl -s -w '\n%{http_code}' "$SV_URL/health")
    [ "$(status "$r")" = 200 ] && [ "$(js "$(body "$r")" j.status)" = ok ] && ok "serve: GET /health is 200 ok" ||
        bad "serve: GET /health is 200 ok" "$r"
    r=$(curl -s "$SV_URL/v1/models")
    [ "$(js "$r" 'j.object + " " + j.data.length + " " + j.data[0].id')" = "list 1 stories260K" ] &&
        ok "serve: GET /v1/models lists the model" || bad "serve: GET /v1/models lists the model" "$r"

    # greedy output equals the one-shot's for the same prompt
    oneshot=$("$BIN" -m "$MODEL" -p "Once upon a time" -n 20 --temp 0 2>/dev/null)
    expect=${oneshot#Once upon a time}
    r=$(post /v1/completions '{"model":"x","prompt":"Once upon a time","max_tokens":20,"temperature":0}')
    b=$(body "$r")
    [ "$(status "$r")" = 200 ] && [ "$(js "$b" 'j.choices[0].text')" = "$expect" ] &&
        ok "serve: /v1/completions at temperature 0 = kvchat -p … --temp 0" ||
        bad "serve: /v1/completions at temperature 0 = kvchat -p … --temp 0" "$b / expected '$expect'"
    ntok=$("$BIN" tokenize -m "$MODEL" "Once upon a time" | wc -l)
    u=$(js "$b" '[j.object, j.usage.prompt_tokens, j.usage.completion_tokens, j.usage.total_tokens,
                  j.usage.prompt_tokens_details.cached_tokens, j.choices[0].finish_reason].join(" ")')
    [ "$u" = "text_completion $ntok 20 $((ntok + 20)) 0 length" ] && ok "serve: completion usage ($u)" ||
        bad "serve: completion usage: prompt = kvchat tokenize's $ntok, completion 20, finish length" "$u"

    # streaming: SSE chunks whose texts join to the same text, a usage chunk with no choices, then [DONE]
    s=$(curl -s -N -m 60 "$SV_URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":20,"temperature":0,
        "stream":true,"stream_options":{"include_usage":true}}')
    joined=$(grep '^data: {' <<<"$s" | sed 's/^data: //' | node -e 'let t="";
        require("fs").readFileSync(0,"utf8").trim().split("\n").forEach(l => { const j = JSON.parse(l);
        if (j.choices.length) t += j.choices[0].text; }); process.stdout.write(t)')
    last=$(grep '^data: ' <<<"$s" | tail -n1)
    ucnk=$(grep '^data: {' <<<"$s" | tail -n1 | sed 's/^data: //')
    [ "$joined" = "$expect" ] && [ "$last" = "data: [DONE]" ] &&
        [ "$(js "$ucnk" 'j.choices.length + " " + j.usage.completion_tokens')" = "0 20" ] &&
        ok "serve: streamed completion: the same text, a usage chunk with choices [], data: [DONE]" ||
        bad "serve: streamed completion" "$s"

    # chat: completion mode (the model has no chat template) = the one-shot of the message text
    r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":20,"temperature":0}')
    b=$(body "$r")
    [ "$(js "$b" 'j.object + "|" + j.choices[0].message.role + "|" + j.choices[0].message.content')" = "chat.completion|assistant|$expect" ] &&
        ok "serve: /v1/chat/completions at temperature 0 = the one-shot output" ||
        bad "serve: /v1/chat/completions at temperature 0 = the one-shot output" "$b"
    s=$(curl -s -N -m 60 "$SV_URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Once upon a time"}],
        "max_tokens":20,"temperature":0,"stream":true}')
    chk=$(grep '^data: {' <<<"$s" | sed 's/^data: //' | node -e 'let t="", role="", fin="", obj=new Set();
        require("fs").readFileSync(0,"utf8").trim().split("\n").forEach(l => { const j = JSON.parse(l); obj.add(j.object);
        const c = j.choices[0]; if (c.delta.role) role = c.delta.role; if (c.delta.content) t += c.delta.content;
        if (c.finish_reason) fin = c.finish_reason; }); process.stdout.write([...obj].join(",") + "|" + role + "|" + fin + "|" + t)')
    [ "$chk" = "chat.completion.chunk|assistant|length|$expect" ] && grep -q '^data: \[DONE\]' <<<"$s" &&
        ! grep -q '"usage"' <<<"$s" && ok "serve: streamed chat: role delta, content deltas, finish chunk, [DONE], no usage unasked" ||
        bad "serve: streamed chat" "$chk / $s"

    # stop strings: a string, and a list; never part of the text
    r=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0,"stop":"Lily"}')
    [ "$(js "$(body "$r")" 'j.choices[0].text + "|" + j.choices[0].finish_reason')" = "${expect%%Lily*}|stop" ] &&
        ok "serve: stop string cuts the text before it (finish_reason stop)" || bad "serve: stop string" "$r"
    r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":20,"temperature":0,"stop":["zzz","girl"]}')
    [ "$(js "$(body "$r")" 'j.choices[0].message.content + "|" + j.choices[0].finish_reason')" = "${expect%%girl*}|stop" ] &&
        ok "serve: stop list" || bad "serve: stop list" "$r"

    # prefix caching across requests: a prompt of several KV blocks sent twice; the second reuses them
    long="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog."
    post /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4,\"temperature\":0}" >/dev/null
    r=$(post /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4,\"temperature\":0}")
    c=$(js "$(body "$r")" 'j.usage.prompt_tokens_details.cached_tokens + " " + j.usage.prompt_tokens')
    [ "${c%% *}" -ge 16 ] 2>/dev/null && ok "serve: the same prompt again reuses cached KV blocks (cached/prompt: $c)" ||
        bad "serve: prefix reuse across requests (cached_tokens >= 16)" "$c"

    # sampling fields are honoured: the same seed gives the same text, temperature > 0
    a=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":1.0,"top_k":0,"top_p":1,"min_p":0,"seed":42}')
    b2=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":1.0,"top_k":0,"top_p":1,"min_p":0,"seed":42,
        "presence_penalty":0,"frequency_penalty":0,"repeat_penalty":1}')
    [ "$(js "$(body "$a")" 'j.choices[0].text')" = "$(js "$(body "$b2")" 'j.choices[0].text')" ] && [ "$(status "$a")" = 200 ] &&
        ok "serve: a fixed seed reproduces the sampled text" || bad "serve: seed" "$a / $b2"

    # n choices from one prefill: greedy ones all equal the one-shot; sampled ones reproducible per seed;
    # streamed, each choice's chunks carry its index
    r=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0,"n":3}')
    [ "$(js "$(body "$r")" 'j.choices.map(c => c.index + c.text).join("|") + "|" + j.usage.completion_tokens')" = \
      "0$expect|1$expect|2$expect|60" ] && ok "serve: n = 3 greedy choices, each the one-shot text (usage: 60 tokens)" ||
        bad "serve: n = 3 greedy" "$r"
    nreq='{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"temperature":1,"top_k":0,"top_p":1,"min_p":0,"seed":7,"n":2'
    r1=$(body "$(post /v1/chat/completions "$nreq}")")
    r2=$(body "$(post /v1/chat/completions "$nreq}")")
    c1=$(js "$r1" 'j.choices.map(c => c.message.content).join("|")')
    s=$(curl -s -N -m 60 "$SV_URL/v1/chat/completions" -d "$nreq,\"stream\":true}")
    sj=$(grep '^data: {' <<<"$s" | sed 's/^data: //' | node -e 'const t = ["", ""], f = ["", ""];
        require("fs").readFileSync(0,"utf8").trim().split("\n").forEach(l => { const c = JSON.parse(l).choices[0];
        if (c.delta.content) t[c.index] += c.delta.content; if (c.finish_reason) f[c.index] = c.finish_reason; });
        process.stdout.write(t.join("|") + "|" + f.join(","))')
    [ "$c1" = "$(js "$r2" 'j.choices.map(c => c.message.content).join("|")')" ] && [ "${c1%%|*}" != "${c1#*|}" ] &&
        [ "$sj" = "$c1|length,length" ] &&
        ok "serve: n = 2 sampled choices differ, repeat with the seed, and stream with their indexes" ||
        bad "serve: n = 2 sampled" "$c1 / $sj"

    # logprobs: at temperature 0 each token is its own top alternative; the alternatives come sorted,
    # are log-probabilities (their mass at most 1), and chat and completions report the same numbers
    r=$(body "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":6,
        "temperature":0,"logprobs":true,"top_logprobs":3}')")
    lc=$(js "$r" 'const c = j.choices[0].logprobs.content; [c.length, c.every(t => t.top_logprobs.length === 3 &&
        t.top_logprobs[0].token === t.token && t.top_logprobs[0].logprob === t.logprob && t.logprob <= 0 &&
        t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob &&
        t.top_logprobs.reduce((a, x) => a + Math.exp(x.logprob), 0) <= 1.0001 &&
        Buffer.from(t.bytes).toString() === t.token), c.map(t => t.token).join("") === j.choices[0].message.content,
        c.map(t => t.logprob.toFixed(5)).join(",")].join(" ")')
    r=$(body "$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"logprobs":3}')")
    lt=$(js "$r" 'j.choices[0].logprobs.token_logprobs.map(x => x.toFixed(5)).join(",")')
    [ "${lc% *}" = "6 true true" ] && [ "${lc##* }" = "$lt" ] &&
        ok "serve: logprobs / top_logprobs (chat and completions agree: $lt)" || bad "serve: logprobs" "$lc / $lt"
    s=$(curl -s -N -m 60 "$SV_URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":6,
        "temperature":0,"logprobs":true,"stream":true}')
    ls=$(grep '^data: {' <<<"$s" | sed 's/^data: //' | node -e 'const a = [];
        require("fs").readFileSync(0,"utf8").trim().split("\n").forEach(l => { const c = JSON.parse(l).choices[0];
        if (c.logprobs) c.logprobs.content.forEach(t => a.push(t.logprob.toFixed(5))); }); process.stdout.write(a.join(","))')
    [ "$ls" = "$lt" ] && ok "serve: streamed chunks carry their tokens' logprobs" || bad "serve: streamed logprobs" "$ls vs $lt"

    # errors: OpenAI's shape, the right status, the field named in param
    err_case() { # NAME PATH BODY STATUS PARAM CODE
        local r
        r=$(post "$2" "$3")
        local got
        got="$(status "$r") $(js "$(body "$r")" '(j.error.param === null ? "null" : j.error.param) + " " + j.error.code + " " + typeof j.error.message + " " + typeof j.error.type')"
        [ "$got" = "$4 $5 $6 string string" ] && ok "serve: $1 → $4 (param $5, code $6)" || bad "serve: $1 → $4 $5 $6" "$got / $(body "$r")"
    }
    err_case "malformed JSON" /v1/chat/completions '{"messages": [' 400 null invalid_json
    err_case "a body that is not an object" /v1/completions '[1,2]' 400 null invalid_json
    err_case "temperature as a string" /v1/completions '{"prompt":"a","temperature":"hot"}' 400 temperature invalid_type
    err_case "messages not an array" /v1/chat/completions '{"messages":"hi"}' 400 messages invalid_type
    err_case "messages missing" /v1/chat/completions '{"model":"x"}' 400 messages missing_required_parameter
    err_case "a message's role unknown" /v1/chat/completions '{"messages":[{"role":"wizard","content":"hi"}]}' 400 'messages[0].role' invalid_value
    err_case "content a number" /v1/chat/completions '{"messages":[{"role":"user","content":5}]}' 400 'messages[0].content' invalid_type
    err_case "stop a number" /v1/completions '{"prompt":"a","stop":5}' 400 stop invalid_type
    err_case "top_p out of range" /v1/completions '{"prompt":"a","top_p":1.5}' 400 top_p invalid_value
    err_case "max_tokens a fraction" /v1/completions '{"prompt":"a","max_tokens":2.5}' 400 max_tokens invalid_type
    # fuzz_serve: an integer field beyond 2^63 was cast to long long (undefined behaviour)
    err_case "max_tokens 1e56" /v1/completions '{"prompt":"a","max_tokens":111111111111111111111111111111111111111111111111111111112}' 400 max_tokens invalid_value
    err_case "seed -1e300" /v1/completions '{"prompt":"a","seed":-1e300}' 400 seed invalid_value
    err_case "stream not a boolean" /v1/completions '{"prompt":"a","stream":"yes"}' 400 stream invalid_type
    err_case "top_logprobs without logprobs" /v1/chat/completions '{"messages":[{"role":"user","content":"a"}],"top_logprobs":2}' 400 top_logprobs invalid_value
    err_case "logprobs over 20" /v1/completions '{"prompt":"a","logprobs":21}' 400 logprobs invalid_value
    err_case "n = 17" /v1/completions '{"prompt":"a","n":17}' 400 n invalid_value
    err_case "prompt missing" /v1/completions '{"max_tokens":3}' 400 prompt missing_required_parameter
    longp=$(printf 'Lily ran. %.0s' $(seq 1 400))
    err_case "a prompt longer than the context" /v1/completions "{\"prompt\":\"$longp\"}" 400 prompt context_length_exceeded
    r=$(node -e 'process.stdout.write("[".repeat(5000) + "]".repeat(5000))' | curl -s -m 60 -w '\n%{http_code}' --data-binary @- "$SV_URL/v1/completions")
    [ "$(status "$r")" = 400 ] && [ "$(js "$(body "$r")" 'j.error.code')" = invalid_json ] &&
        ok "serve: JSON nested 5000 deep → 400 (cJSON's nesting limit), no crash" || bad "serve: deep JSON" "$r"
    r=$(printf '{"messages":[{"role":"user","content":"a\xff\xfe b\xc3"}],"max_tokens":3}' |
        curl -s -m 60 -w '\n%{http_code}' --data-binary @- "$SV_URL/v1/chat/completions")
    [ "$(status "$r")" = 200 ] && [ "$(js "$(body "$r")" 'j.usage.completion_tokens')" = 3 ] &&
        ok "serve: invalid UTF-8 in a message is tokenized as bytes, not a crash" || bad "serve: invalid UTF-8" "$r"
    r=$(post /v1/completions '{"prompt":"a","max_tokens":2,"user":"me","metadata":{"x":[1,{"y":null}]},"unknown_field":true}')
    [ "$(status "$r")" = 200 ] && ok "serve: unknown fields are ignored" || bad "serve: unknown fields" "$r"
    r=$(curl -s -w '\n%{http_code}' "$SV_URL/v1/nothing")
    [ "$(status "$r")" = 404 ] && [ "$(js "$(body "$r")" 'j.error.code')" = not_found ] && ok "serve: unknown route → 404" ||
        bad "serve: unknown route → 404" "$r"
    r=$(curl -s -w '\n%{http_code}' "$SV_URL/v1/completions")
    [ "$(status "$r")" = 405 ] && ok "serve: GET on a POST route → 405" || bad "serve: GET on a POST route → 405" "$r"
    head -c 3000000 /dev/zero | tr '\0' ' ' >"$sv/huge.json"
    r=$(curl -s -m 60 -w '\n%{http_code}' -H 'Content-Type: application/json' --data-binary @"$sv/huge.json" "$SV_URL/v1/completions")
    [ "$(status "$r")" = 413 ] && [ "$(js "$(body "$r")" 'j.error.code')" = request_too_large ] &&
        ok "serve: a 3 MB body → 413" || bad "serve: a 3 MB body → 413" "$(tail -c 300 <<<"$r")"
    r=$(head -c 3000000 /dev/zero | tr '\0' ' ' | curl -s -m 60 -w '\n%{http_code}' -H 'Transfer-Encoding: chunked' \
        --data-binary @- "$SV_URL/v1/completions")
    [ "$(status "$r")" = 413 ] && ok "serve: a 3 MB chunked body (no Content-Length) → 413" ||
        bad "serve: a 3 MB chunked body → 413" "$(tail -c 300 <<<"$r")"

    # 200 idle connections do not stop service
    fds=()
    for i in $(seq 1 200); do exec {fd}<>/dev/tcp/127.0.0.1/"${SV_URL##*:}" && fds+=("$fd"); done
    r=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0}')
    [ "${#fds[@]}" = 200 ] && [ "$(js "$(body "$r")" 'j.choices[0].text')" = "$expect" ] &&
        ok "serve: serves while 200 idle connections are open" || bad "serve: 200 idle connections" "${#fds[@]} open; $r"
    for fd in "${fds[@]}"; do exec {fd}>&-; done

    # the official openai npm client (installed from the npm registry into build/npm once)
    if [ ! -d "$npmdir/node_modules/openai" ]; then
        mkdir -p "$npmdir" && (cd "$npmdir" && npm install --no-audit --no-fund --silent openai@4 >"$sv/npm.log" 2>&1)
    fi
    if [ -d "$npmdir/node_modules/openai" ]; then
        openai_lines "$(node "$here/serve_openai.mjs" "$npmdir/node_modules" "$SV_URL/v1" unused stories260K "$expect" 2>&1)"
    else
        bad "serve: npm install openai" "$(cat "$sv/npm.log")"
    fi

    # SIGTERM stops it cleanly
    sv_stop main
fi

# the API key, from the environment (KVCHAT_API_KEY): every route but /health; the openai client's
# errors; and a client vanishing mid-stream on a model that does not stop by itself
if KVCHAT_API_KEY=sekrit sv_start keyed -m "$SHARED/models/llama-2-tiny-random.gguf" -c 1100 -t 1 --parallel 2; then
    r=$(curl -s -w '\n%{http_code}' "$SV_URL/v1/models")
    [ "$(status "$r")" = 401 ] && [ "$(js "$(body "$r")" 'j.error.code')" = invalid_api_key ] &&
        ok "serve: no API key → 401" || bad "serve: no API key → 401" "$r"
    r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}' -H 'Authorization: Bearer wrong')
    [ "$(status "$r")" = 401 ] && ok "serve: a wrong API key → 401" || bad "serve: a wrong API key → 401" "$r"
    r=$(curl -s -w '\n%{http_code}' -H 'Authorization: Bearer sekrit' "$SV_URL/v1/models")
    [ "$(status "$r")" = 200 ] && ok "serve: the right API key (from KVCHAT_API_KEY) → 200" || bad "serve: the right key → 200" "$r"
    r=$(curl -s -w '\n%{http_code}' "$SV_URL/health")
    [ "$(status "$r")" = 200 ] && ok "serve: /health needs no key" || bad "serve: /health needs no key" "$r"
    [ -d "$npmdir/node_modules/openai" ] &&
        openai_lines "$(node "$here/serve_openai.mjs" "$npmdir/node_modules" "$SV_URL/v1" sekrit llama-2-tiny-random auth 2>&1)"

    # a client that goes away after the first chunks: its generation is cancelled, the server serves on
    curl -s -N -m 60 -H 'Authorization: Bearer sekrit' "$SV_URL/v1/chat/completions" \
        -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":1000,"temperature":0,"n":4,"stream":true}' | head -c 600 >/dev/null
    for i in $(seq 1 50); do grep -q "cancelled" "$sv/keyed.log" && break; sleep 0.1; done
    line=$(grep "chat stream" "$sv/keyed.log" | tail -n1)
    n=$(sed -n 's/.*completion \([0-9]*\) tokens.*/\1/p' <<<"$line")
    [[ "$line" == *cancelled* ]] && [ "${n:-4000}" -lt 4000 ] &&
        ok "serve: a client vanishing mid-stream cancels its generation ($n of 4 × 1000 tokens)" ||
        bad "serve: a client vanishing mid-stream cancels its generation" "$line"
    # the same for a client waiting for a non-streamed reply (curl gives up after 0.5 s)
    curl -s -m 0.5 -H 'Authorization: Bearer sekrit' "$SV_URL/v1/completions" \
        -d '{"prompt":"Hello","max_tokens":1000,"temperature":0,"n":16}' >/dev/null
    for i in $(seq 1 50); do grep -q "^kvchat serve: completion: client gone" "$sv/keyed.log" && break; sleep 0.1; done
    line=$(grep "^kvchat serve: completion: client gone" "$sv/keyed.log" | tail -n1)
    n=$(sed -n 's/.*completion \([0-9]*\) tokens.*/\1/p' <<<"$line")
    [ -n "$line" ] && [ "${n:-16000}" -lt 16000 ] && ok "serve: a client giving up on a non-streamed reply cancels it ($n of 16 × 1000 tokens)" ||
        bad "serve: a vanished non-streaming client" "$(tail -n3 "$sv/keyed.log")"
    r=$(post /v1/completions '{"prompt":"Hello","max_tokens":5,"temperature":0}' -H 'Authorization: Bearer sekrit')
    [ "$(status "$r")" = 200 ] && [ "$(js "$(body "$r")" 'j.usage.completion_tokens')" = 5 ] &&
        ok "serve: the next request after a vanished client is served" || bad "serve: serving after a vanished client" "$r"

    # requests in flight beyond --parallel (2 here) get 503; one admitted beside a running one decodes with it
    # (continuous batching) and gets the same greedy text as alone — 200 tokens, so it is still in flight
    # when the other two arrive
    A=(-H 'Authorization: Bearer sekrit')
    curl -s -N -m 60 "${A[@]}" "$SV_URL/v1/completions" -d '{"prompt":"Hello","max_tokens":1000,"temperature":0,"stream":true}' \
        >"$sv/long.txt" &
    lpid=$!
    for i in $(seq 1 100); do grep -q '^data: {' "$sv/long.txt" 2>/dev/null && break; sleep 0.05; done
    qp=()
    for q in 1 2 3; do
        post /v1/completions '{"prompt":"One day","max_tokens":200,"temperature":0}' "${A[@]}" >"$sv/queued$q.txt" &
        qp+=($!)
    done
    # once two have been refused, the stream's client goes away (cancelling it), so the third runs
    for i in $(seq 1 100); do [ "$(cat "$sv"/queued*.txt 2>/dev/null | grep -c server_busy)" -ge 2 ] && break; sleep 0.05; done
    nlong=$(grep -c '^data: {' "$sv/long.txt")
    kill "$lpid" 2>/dev/null
    wait "$lpid" 2>/dev/null
    wait "${qp[@]}"
    solo=$(post /v1/completions '{"prompt":"One day","max_tokens":200,"temperature":0}' "${A[@]}")
    n503=0 n200=0 qtext=""
    for q in 1 2 3; do
        r=$(cat "$sv/queued$q.txt")
        case "$(status "$r")" in
        503) [ "$(js "$(body "$r")" 'j.error.code')" = server_busy ] && n503=$((n503 + 1)) ;;
        200) n200=$((n200 + 1)); qtext=$(js "$(body "$r")" 'j.choices[0].text') ;;
        esac
    done
    [ "$n503" = 2 ] && [ "$n200" = 1 ] && ok "serve: beyond --parallel 2 in flight → 503 server_busy (2 of 3 sent during a stream)" ||
        bad "serve: beyond --parallel → 503" "$n503 × 503, $n200 × 200: $(cat "$sv"/queued*.txt)"
    [ "$n200" = 1 ] && [ "$qtext" = "$(js "$(body "$solo")" 'j.choices[0].text')" ] &&
        ok "serve: the request admitted beside the running one is served, with the text it gets alone" ||
        bad "serve: a queued request" "$qtext / $solo"
    [ "$nlong" -gt 0 ] && ! grep -q '"error"' "$sv/long.txt" &&
        ok "serve: the running stream went on meanwhile" || bad "serve: the running stream" "$(tail -c 300 "$sv/long.txt")"
    sv_stop keyed
else
    bad "serve: kvchat serve with KVCHAT_API_KEY starts" "$(cat "$sv/keyed.log")"
fi

# --api-key on the command line, and usage errors
if sv_start cli -m "$MODEL" -c 256 -t 1 --api-key k1 --chat-template chatml; then
    r=$(curl -s -w '\n%{http_code}' -H 'Authorization: Bearer k1' "$SV_URL/v1/models")
    r2=$(curl -s -w '\n%{http_code}' "$SV_URL/v1/models")
    [ "$(status "$r")" = 200 ] && [ "$(status "$r2")" = 401 ] && ok "serve: --api-key KEY" || bad "serve: --api-key KEY" "$r / $r2"
    r=$(post /v1/chat/completions '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":3}' \
        -H 'Authorization: Bearer k1')
    [ "$(status "$r")" = 200 ] && [ "$(js "$(body "$r")" 'j.usage.completion_tokens')" = 3 ] &&
        ok "serve: chat through a chat template (--chat-template chatml)" || bad "serve: chat with chatml" "$r"
    sv_stop cli
else
    bad "serve: kvchat serve --api-key starts" "$(cat "$sv/cli.log")"
fi
# while the model loads: /health and every other route answer 503 model_loading (the "model" is a FIFO,
# so loading blocks in open(2) until the test writes to it; then the load fails and serve exits 3)
mkfifo "$sv/loading.gguf"
"$SVBIN" serve -m "$sv/loading.gguf" --port 0 2>"$sv/loading.log" &
lp=$!
SV_PIDS="$SV_PIDS $lp"
for i in $(seq 1 100); do grep -q listening "$sv/loading.log" 2>/dev/null && break; sleep 0.05; done
SV_URL=http://127.0.0.1:$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$sv/loading.log")
r=$(curl -s -w '\n%{http_code}' "$SV_URL/health")
r2=$(post /v1/completions '{"prompt":"a"}')
[ "$(status "$r")" = 503 ] && [ "$(js "$(body "$r")" 'j.error.code')" = model_loading ] && [ "$(status "$r2")" = 503 ] &&
    ok "serve: while the model loads, /health and the API are 503 model_loading" || bad "serve: 503 while loading" "$r / $r2"
head -c 100 /dev/zero >"$sv/loading.gguf"
wait "$lp"
rc=$?
[ "$rc" = 3 ] && ok "serve: a model that fails to load ends serve with exit 3" || bad "serve: a failed load exits 3" "$rc $(cat "$sv/loading.log")"

"$BIN" serve -m "$MODEL" --port 99999 >/dev/null 2>&1
[ $? = 2 ] && ok "serve: a bad --port is a usage error (exit 2)" || bad "serve: a bad --port is a usage error (exit 2)"
"$BIN" serve -m "$sv/none.gguf" --port 0 >/dev/null 2>"$sv/nomodel.log"
[ $? = 3 ] && ok "serve: a missing model exits 3" || bad "serve: a missing model exits 3" "$(cat "$sv/nomodel.log")"
"$BIN" serve --help | grep -q -- '--api-key' && ok "serve: --help lists the options" || bad "serve: --help"

eval "${sv_old_trap:-trap - EXIT}"
