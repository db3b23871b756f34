# KV cache through the CLI: context shift with a tiny context, KV types, prompts longer than the context.

# -c 64: 300 tokens are generated through context shifts and the run ends.
timeout 60 "$BIN" -m "$MODEL" -p "Once upon a time" -n 300 --temp 0 -c 64 --stats -t 1 >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 0 ] && grep -q "decode 300 tokens" "$tmp/kv_e" && grep -q "context shifts: [1-9]" "$tmp/kv_e"; then
    ok "-c 64 generates 300 tokens through context shifts ($(grep -o 'context shifts: [0-9]*' "$tmp/kv_e"))"
else bad "-c 64 generates 300 tokens through context shifts" "rc=$rc $(tail -3 "$tmp/kv_e")"; fi

# Until end of text (-n -1) with shifting never runs away: at most a context's worth.
timeout 60 "$BIN" -m "$MODEL" -p "Once upon a time" --temp 0 -c 64 --stats -t 1 >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
n=$(grep -o 'decode [0-9]* tokens' "$tmp/kv_e" | grep -o '[0-9]*')
if [ $rc -eq 0 ] && [ -n "$n" ] && [ "$n" -le 64 ]; then ok "-n -1 -c 64 stops ($n tokens)"
else bad "-n -1 -c 64 stops" "rc=$rc $(tail -3 "$tmp/kv_e")"; fi

# Without shifting a full context ends the reply with a message.
timeout 60 "$BIN" -m "$MODEL" -p "Once upon a time" -n 300 --temp 0 -c 64 --no-context-shift -t 1 >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 0 ] && grep -q "context is full (64 tokens)" "$tmp/kv_e"; then ok "--no-context-shift stops at a full context"
else bad "--no-context-shift stops at a full context" "rc=$rc $(tail -2 "$tmp/kv_e")"; fi

# KV types: f32 reproduces llama.cpp's greedy text exactly (its reference used an f32 cache);
# q8_0 runs; an unknown type is a usage error.
type golden_text >/dev/null 2>&1 || golden_text() { # (defined in t_cli.sh)
    python3 -c "import json,sys; d=json.loads(open(sys.argv[1],'rb').read().decode('utf-8','surrogateescape')); sys.stdout.buffer.write((d['prompt']+d['text']).encode('utf-8','surrogateescape'))" "$1"
}
g=$SHARED/golden/stories260K.p2.json
n=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1],'rb').read().decode('utf-8','surrogateescape'))['steps']))" "$g")
prompt=$(python3 -c "import json,sys; sys.stdout.write(json.loads(open(sys.argv[1],'rb').read().decode('utf-8','surrogateescape'))['prompt'])" "$g")
golden_text "$g" >"$tmp/kv_want"
"$BIN" -m "$MODEL" -p "$prompt" -n "$n" --temp 0 --kv-type f32 >"$tmp/kv_got" 2>"$tmp/kv_e"
if cmp -s "$tmp/kv_want" "$tmp/kv_got"; then ok "--kv-type f32 matches llama.cpp's greedy text"
else bad "--kv-type f32 matches llama.cpp's greedy text" "$(head -c 200 "$tmp/kv_e")"; fi
"$BIN" -m "$MODEL" -p "$prompt" -n 32 --temp 0 --kv-type q8_0 >"$tmp/kv_got" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 0 ] && [ -s "$tmp/kv_got" ]; then ok "--kv-type q8_0 generates"
else bad "--kv-type q8_0 generates" "rc=$rc $(head -c 200 "$tmp/kv_e")"; fi
"$BIN" -m "$MODEL" -p x --kv-type q4_0 >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 2 ] && grep -q "q8_0" "$tmp/kv_e"; then ok "unknown --kv-type is a usage error"
else bad "unknown --kv-type is a usage error" "rc=$rc $(cat "$tmp/kv_e")"; fi

# A prompt longer than the context: a clear error, or a visible warning with --truncate-prompt.
long=$(for i in $(seq 1 20); do printf 'The dog ran to the park and played with a ball. '; done)
"$BIN" -m "$MODEL" -p "$long" -n 8 --temp 0 -c 64 >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 1 ] && grep -q "context holds 64" "$tmp/kv_e"; then ok "a prompt longer than -c is refused ($(head -1 "$tmp/kv_e" | cut -c1-90))"
else bad "a prompt longer than -c is refused" "rc=$rc $(cat "$tmp/kv_e")"; fi
"$BIN" -m "$MODEL" -p "$long" -n 8 --temp 0 -c 64 --truncate-prompt >"$tmp/kv_o" 2>"$tmp/kv_e"
rc=$?
if [ $rc -eq 0 ] && grep -q "warning: the prompt" "$tmp/kv_e"; then ok "--truncate-prompt cuts it with a warning"
else bad "--truncate-prompt cuts it with a warning" "rc=$rc $(cat "$tmp/kv_e")"; fi
