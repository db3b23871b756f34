# kvchat serve's continuous batching: concurrent greedy streams (openai npm client) equal each alone, n = 3 with a seed, a client vanishing mid-stream while the others go on, a slow reader not stalling the others, cached_tokens of a repeated system prompt, finished requests' sequences kept as prefixes (a repeated short prompt, a shared prefix, a continued reply; evicted when a small -c needs their blocks), context shift past -c (and --no-context-shift); every server started here is stopped at the end.
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
    m3=$(sb_post /v1/chat/completions "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"A story of a dog, please.\"}],\"max_tokens\":8,\"temperature\":0}")
    c1=$(sb_js "$m1" 'j.usage.prompt_tokens_details.cached_tokens')
    c2=$(sb_js "$m2" 'j.usage.prompt_tokens_details.cached_tokens')
    c3=$(sb_js "$m3" 'j.usage.prompt_tokens_details.cached_tokens')
    p2=$(sb_js "$m2" 'j.usage.prompt_tokens')
    # the second prompt shares the system part (over 32 tokens) and the user turn's opening with the
    # first one's kept sequence; sent again, all of it but its last token is cached
    [ "$c1" = 0 ] && [ "$c2" -ge 32 ] && [ "$c2" -lt "$p2" ] && [ "$c3" = $((p2 - 1)) ] &&
        [ "$(sb_js "$m3" 'j.choices[0].message.content')" = "$(sb_js "$m2" 'j.choices[0].message.content')" ] &&
        ok "serve batch: a repeated system prompt is cached (cached_tokens 0, then $c2 of $p2; the same messages again $c3)" ||
        bad "serve batch: cached_tokens of a repeated system prompt" "$c1 / $c2 / $c3 of $p2: $m2"
    sb_stop cached
else
    bad "serve batch: the server starts (chatml)" "$(cat "$sb/cached.log")"
fi

# kept sequences: a finished request's KV stays whole (not only its full 16-token blocks), so a
# prompt sent again reuses all but its last token, and one sharing a prefix with an earlier prompt
# (or continuing its reply) reuses exactly that common prefix — with the greedy text, the
# log-probabilities and n choices a fresh server gives
# sb_ids TEXT: the prompt's token ids as /v1/completions tokenizes it (BOS per the model)
sb_ids() { "$BIN" tokenize -m "$MODEL" --ids "$1"; }
# sb_lp_eq A B: the token log-probabilities of two responses agree to 1e-4 (a prompt token computed
# alone or among other rows of a batch sums in another order: ~1e-6 apart)
sb_lp_eq() { node -e 'const a = JSON.parse(process.argv[1]).choices[0].logprobs.token_logprobs,
    b = JSON.parse(process.argv[2]).choices[0].logprobs.token_logprobs;
    process.exit(a.length > 0 && a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-4) ? 0 : 1)' "$1" "$2"; }
# sb_fresh NAME BODY: the response, in $sb/NAME.out, of a server started for this one request (nothing cached)
sb_fresh() {
    : >"$sb/$1.out"
    if sb_start "$1" -m "$MODEL" -c 256 -t 2; then
        sb_post /v1/completions "$2" >"$sb/$1.out"
        sb_stop "$1"
    else
        bad "serve batch: the server starts ($1)" "$(cat "$sb/$1.log")"
    fi
}
p1="Once upon a time, there was a little dog named"
p2="Once upon a time, there was a little girl named"
# kreq PROMPT [JSON]: a greedy 20-token completion request with logprobs (plus JSON's fields)
kreq() { node -e 'console.log(JSON.stringify(Object.assign({prompt: process.argv[1], max_tokens: 20, temperature: 0, logprobs: 2},
                  JSON.parse(process.argv[2] || "{}"))))' "$1" "${2:-}"; }
kfield='j.choices[0].text + "|" + j.usage.prompt_tokens + "|" + j.usage.prompt_tokens_details.cached_tokens'
if sb_start kept -m "$MODEL" -c 256 -t 2; then
    n1=$(node -p "JSON.parse(process.argv[1]).length" "$(sb_ids "$p1")")
    r1=$(sb_post /v1/completions "$(kreq "$p1")")
    r2=$(sb_post /v1/completions "$(kreq "$p1")")
    t1=$(sb_js "$r1" 'j.choices[0].text')
    [ -n "$t1" ] && [ "$(sb_js "$r1" "$kfield")" = "$t1|$n1|0" ] && [ "$(sb_js "$r2" "$kfield")" = "$t1|$n1|$((n1 - 1))" ] &&
        sb_lp_eq "$r1" "$r2" &&
        ok "serve batch: a $n1-token prompt sent again reuses $((n1 - 1)) tokens (all but the last), same greedy text, logprobs within 1e-4" ||
        bad "serve batch: a repeated short prompt" "n_prompt $n1: $r1 / $r2"
    r3=$(sb_post /v1/completions "$(kreq "$p1" '{"n":3}')")
    [ "$(sb_js "$r3" 'j.choices.map(c => c.text).join("|") + "|" + j.usage.prompt_tokens_details.cached_tokens')" = "$t1|$t1|$t1|$((n1 - 1))" ] &&
        ok "serve batch: n = 3 on the kept prefix: the one prefill reuses $((n1 - 1)) tokens, each choice the greedy text" ||
        bad "serve batch: n = 3 on a kept prefix" "$r3"
    # a prompt that shares its first tokens with the kept ones (their common prefix is no whole block)
    common=$(node -e 'const a = JSON.parse(process.argv[1]), b = JSON.parse(process.argv[2]); let i = 0;
        while (i < a.length && i < b.length - 1 && a[i] === b[i]) i++; console.log(i)' "$(sb_ids "$p1")" "$(sb_ids "$p2")")
    n2=$(node -p "JSON.parse(process.argv[1]).length" "$(sb_ids "$p2")")
    r4=$(sb_post /v1/completions "$(kreq "$p2")")
    # a prompt continuing the first reply: the reply's tokens are reused too
    p3="$p1$t1 Then"
    r5=$(sb_post /v1/completions "$(kreq "$p3")")
    sb_stop kept
    sb_fresh kept_fresh2 "$(kreq "$p2")"
    sb_fresh kept_fresh3 "$(kreq "$p3")"
    f4=$(cat "$sb/kept_fresh2.out")
    f5=$(cat "$sb/kept_fresh3.out")
    [ "$common" -gt 1 ] && [ $((common % 16)) != 0 ] && [ "$(sb_js "$r4" "$kfield")" = "$(sb_js "$f4" 'j.choices[0].text')|$n2|$common" ] &&
        [ "$(sb_js "$f4" 'j.usage.prompt_tokens_details.cached_tokens')" = 0 ] && sb_lp_eq "$r4" "$f4" &&
        ok "serve batch: a prompt sharing $common tokens with a kept one reuses exactly them, same greedy text and logprobs (1e-4) as a fresh server" ||
        bad "serve batch: a shared prefix of $common tokens" "$r4 / fresh: $f4"
    c5=$(sb_js "$r5" 'j.usage.prompt_tokens_details.cached_tokens')
    n5=$(sb_js "$r5" 'j.usage.prompt_tokens')
    [ "$c5" -gt "$n1" ] 2>/dev/null && [ "$c5" -lt "$n5" ] && sb_lp_eq "$r5" "$f5" &&
        [ "$(sb_js "$r5" 'j.choices[0].text')" = "$(sb_js "$f5" 'j.choices[0].text')" ] && [ -n "$(sb_js "$f5" 'j.choices[0].text')" ] &&
        ok "serve batch: a prompt continuing a reply reuses the reply's tokens too ($c5 of $n5 cached), same greedy text as a fresh server" ||
        bad "serve batch: a continued reply" "$r5 / fresh: $f5"
else
    bad "serve batch: the server starts (kept sequences)" "$(cat "$sb/kept.log")"
fi

# with -c 64 and --parallel 2 the cache holds 12 blocks: two requests of 10-18 prompt tokens and
# 40 more (4 blocks each) decoding together take 8, so the two kept sequences must give theirs
# back — every request still gets its whole reply (the greedy text of the one-shot), none ends
# early for want of blocks
if sb_start evict -m "$MODEL" -c 64 -t 2 --parallel 2; then
    evp=("Tom had a big red ball" "Sara and her mom went to the shop" "The little bird sat on a branch"
         "Ben was sad because his toy broke" "Lily found a shiny stone" "One day a big bear came out"
         "Max the cat liked to sleep" "Anna wanted to bake a cake" "Two friends went to the beach"
         "A small fish swam in the sea")
    i=0
    while [ $i -lt ${#evp[@]} ]; do
        evpids=()
        for k in 0 1; do
            sb_post /v1/completions "{\"prompt\":\"${evp[$((i + k))]}\",\"max_tokens\":40,\"temperature\":0}" >"$sb/ev$((i + k)).out" &
            evpids+=($!)
        done
        wait "${evpids[@]}"
        i=$((i + 2))
    done
    evbad=""
    for i in "${!evp[@]}"; do
        r=$(cat "$sb/ev$i.out")
        one=$("$BIN" -m "$MODEL" -c 64 -p "${evp[$i]}" -n 40 --temp 0 2>/dev/null)
        got=$(sb_js "$r" 'j.choices[0].finish_reason + " " + j.usage.completion_tokens + "|" + j.choices[0].text')
        [ "$got" = "length 40|${one#"${evp[$i]}"}" ] || evbad="$evbad [$i] $got / one-shot: $one"
    done
    [ -z "$evbad" ] && ok "serve batch: ${#evp[@]} requests in pairs on -c 64 --parallel 2: kept sequences make room, every reply whole and = the one-shot" ||
        bad "serve batch: kept sequences evicted for active work" "$evbad $(tail -n3 "$sb/evict.log")"
    sb_stop evict
else
    bad "serve batch: the server starts (-c 64 --parallel 2)" "$(cat "$sb/evict.log")"
fi
