# One-shot CLI: golden greedy text, stdin prompts, usage errors and exit codes.
golden_text() { # golden file → the expected stdout of `-p PROMPT --temp 0 -n N`
    python3 - "$1" <<'PY'
import json, sys
raw = open(sys.argv[1], 'rb').read().decode('utf-8', 'surrogateescape')
d = json.loads(raw)
sys.stdout.buffer.write((d['prompt'] + d['text']).encode('utf-8', 'surrogateescape'))
PY
}

for c in p1 p2 p3 p4 p5; do
    g=$SHARED/golden/stories260K.$c.json
    n=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1],'rb').read().decode('utf-8','surrogateescape'))['steps']))" "$g")
    prompt=$(python3 -c "import json,sys; sys.stdout.write(json.loads(open(sys.argv[1],'rb').read().decode('utf-8','surrogateescape'))['prompt'])" "$g")
    golden_text "$g" >"$tmp/want"
    "$BIN" -m "$MODEL" -p "$prompt" -n "$n" --temp 0 >"$tmp/got" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && cmp -s "$tmp/want" "$tmp/got"; then ok "greedy $c matches llama.cpp's text ($n tokens)"
    else bad "greedy $c matches llama.cpp's text" "rc=$rc $(cmp "$tmp/want" "$tmp/got" 2>&1 | head -1) $(head -c 200 "$tmp/err")"; fi
done

# Thread count does not change greedy output.
"$BIN" -m "$MODEL" -p "Once upon a time" -n 64 --temp 0 -t 1 >"$tmp/t1" 2>/dev/null
"$BIN" -m "$MODEL" -p "Once upon a time" -n 64 --temp 0 -t 2 >"$tmp/t2" 2>/dev/null
if cmp -s "$tmp/t1" "$tmp/t2"; then ok "same greedy text with 1 and 2 threads"; else bad "same greedy text with 1 and 2 threads"; fi

# Prompt from stdin when no -p and stdin is not a terminal.
printf 'Once upon a time' | "$BIN" -m "$MODEL" -n 64 --temp 0 -t 1 >"$tmp/stdin" 2>/dev/null
if cmp -s "$tmp/t1" "$tmp/stdin"; then ok "prompt from stdin equals -p"; else bad "prompt from stdin equals -p"; fi

# The same seed gives the same sampled text; whatever the thread count.
"$BIN" -m "$MODEL" -p "Lily" -n 48 --seed 42 -t 1 >"$tmp/s1" 2>/dev/null
"$BIN" -m "$MODEL" -p "Lily" -n 48 --seed 42 -t 2 >"$tmp/s2" 2>/dev/null
"$BIN" -m "$MODEL" -p "Lily" -n 48 --seed 43 -t 1 >"$tmp/s3" 2>/dev/null
if cmp -s "$tmp/s1" "$tmp/s2" && [ -s "$tmp/s1" ]; then ok "seed 42 reproduces across thread counts"; else bad "seed 42 reproduces across thread counts"; fi
if ! cmp -s "$tmp/s1" "$tmp/s3"; then ok "seeds 42 and 43 differ"; else bad "seeds 42 and 43 differ"; fi

# --stats prints timings to stderr, not stdout.
"$BIN" -m "$MODEL" -p "Once upon a time" -n 16 --temp 0 --stats >"$tmp/o" 2>"$tmp/e"
if grep -q "TTFT" "$tmp/e" && grep -q "decode" "$tmp/e" && ! grep -q TTFT "$tmp/o"; then ok "--stats on stderr"; else bad "--stats on stderr" "$(cat "$tmp/e")"; fi

# Usage errors: exit 2 with a one-line reason.
expect_exit() { # code description args...
    local want=$1 what=$2; shift 2
    "$BIN" "$@" >"$tmp/o" 2>"$tmp/e" </dev/null
    local rc=$?
    if [ $rc -eq "$want" ] && [ -s "$tmp/e" ]; then ok "$what (exit $rc: $(head -1 "$tmp/e"))"
    else bad "$what" "exit $rc, want $want; stderr: $(head -2 "$tmp/e")"; fi
}
expect_exit 2 "unknown option" -m "$MODEL" --bogus
expect_exit 2 "bad number" -m "$MODEL" -p x -n abc
expect_exit 2 "out-of-range top-p" -m "$MODEL" -p x --top-p 1.5
expect_exit 2 "missing value" -m "$MODEL" -p
expect_exit 2 "no model" -p x
expect_exit 3 "missing model file" -m "$tmp/nope.gguf" -p x
expect_exit 3 "GGUF v1 file" -m "$SHARED/models/legacy/tinyllamas-stories-260k-f32.ggufv1.gguf" -p x
grep -q "GGUF version 1 is not supported" "$tmp/e" && ok "v1 message" || bad "v1 message" "$(cat "$tmp/e")"
head -c 100000 "$MODEL" >"$tmp/trunc.gguf"
expect_exit 3 "truncated model" -m "$tmp/trunc.gguf" -p x
grep -q "trunc.gguf" "$tmp/e" && ok "truncated model error names the file" || bad "truncated model error names the file"

# A prompt longer than the context is a clear error, not a crash.
long=$(python3 -c "print('the cat sat on the mat. ' * 60)")
"$BIN" -m "$MODEL" -c 64 -p "$long" -n 4 --temp 0 >"$tmp/o" 2>"$tmp/e"
rc=$?
if [ $rc -eq 1 ] && grep -q "context" "$tmp/e"; then ok "prompt longer than the context: $(head -1 "$tmp/e")"; else bad "prompt longer than the context" "rc=$rc $(cat "$tmp/e")"; fi

# A full context ends generation with a message (when it does not shift: see t_kv.sh).
"$BIN" -m "$MODEL" -c 32 -p "Once upon a time" --temp 0 --no-context-shift >"$tmp/o" 2>"$tmp/e"
rc=$?
if [ $rc -eq 0 ] && grep -q "context is full" "$tmp/e"; then ok "generation stops at a full context"; else bad "generation stops at a full context" "rc=$rc $(cat "$tmp/e")"; fi

# --help and --version.
"$BIN" --help | grep -q -- "--top-p" && ok "--help lists options" || bad "--help lists options"
"$BIN" --version | grep -q "^kvchat " && ok "--version" || bad "--version"

# --stop: output ends right before the stop string, which never appears (even when it spans tokens).
"$BIN" -m "$MODEL" -p "Once upon a time" -n 100 --temp 0 --stop "named Lily" >"$tmp/o" 2>"$tmp/e"
if [ "$(cat "$tmp/o")" = "Once upon a time, there was a little girl " ]; then ok "--stop ends before a multi-token stop string"
else bad "--stop ends before a multi-token stop string" "$(cat "$tmp/o")"; fi

# kvchat tokenize: ids and pieces, user text never becomes control tokens unless asked.
out=$("$BIN" tokenize -m "$MODEL" --ids "Once upon a time")
[ "$out" = "[1, 403, 407, 261, 378]" ] && ok "tokenize --ids matches llama.cpp's prompt tokens" || bad "tokenize --ids" "$out"
out=$("$BIN" tokenize -m "$SHARED/models/vocab/ggml-vocab-gpt-2.gguf" --ids "Hello world<|endoftext|>")
[ "$out" = "[15496, 995, 27, 91, 437, 1659, 5239, 91, 29]" ] && ok "tokenize: typed <|endoftext|> stays text" || bad "tokenize: typed <|endoftext|> stays text" "$out"
out=$("$BIN" tokenize -m "$SHARED/models/vocab/ggml-vocab-gpt-2.gguf" --ids --parse-special "Hello world<|endoftext|>")
[ "$out" = "[15496, 995, 50256]" ] && ok "tokenize --parse-special gives the control token" || bad "tokenize --parse-special" "$out"
"$BIN" tokenize -m "$MODEL" "Once upon" | grep -q "^   403  ' Once'$" && ok "tokenize prints id and piece" || bad "tokenize prints id and piece"
