# shellcheck shell=bash
# The chat on each newer architecture with its model's own chat template: a small gen-model file of
# the architecture carries the template (tokenizer.chat_template) and its control tokens; the chat
# (in tmux) opens it, runs the template with kvchat's Jinja interpreter, and the prompt tokens it
# feeds the model — the conversation's tokens the store keeps after the reply — must begin with the
# reference's: the template rendered by @huggingface/jinja (`make jinja-ref`), its leading BOS text
# dropped, tokenized by llama.cpp (node-llama-cpp, special tokens parsed; tests/arch_ref.sh
# installs it) after the model's BOS, as llama.cpp's chat does; and "reused 0 + new N" must count
# exactly them (gpt-oss: its harmony template, the system header with today's date). Granite: its 3.0
# template; OLMo 2: OLMo-2-1124-13B-Instruct's (Tülu 3) template, whose <|user|> / <|assistant|>
# markers are plain text in OLMo 2's tokenizer (not added tokens), so none is made a control token
# here and they go through the ordinary tokenizer on both sides.
# Mistral models whose GGUF files say `llama` (Mistral 7B, Mistral Nemo, Mistral Small 2409/2501):
# a llama-shaped file with Mistral Nemo's template ([INST] ... [/INST], its tool tokens as controls).
jr_dir=${HF_JINJA_DIR:-build/jinja-ref}
nlc=$(sh tests/arch_ref.sh --install 2>/dev/null | tail -n 1)
if ! command -v tmux >/dev/null 2>&1 || ! command -v sqlite3 >/dev/null 2>&1; then
    bad "arch chat: tmux and sqlite3 are needed"
elif [ ! -f "$jr_dir/node_modules/@huggingface/jinja/package.json" ] || [ ! -d "$nlc/node_modules/node-llama-cpp" ]; then
    bad "arch chat: @huggingface/jinja (make jinja-ref) or node-llama-cpp (tests/arch_ref.sh --install) is missing"
else
    ac="$tmp/arch-chat"
    mkdir -p "$ac"
    now=$(date +%s)
    printf '%s' '{"messages": [{"role": "user", "content": "hello"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"}' > "$ac/ctx.json"
    # shape, template, control tokens (the ones the template writes that the real tokenizer has as
    # added tokens)
    cat > "$ac/cases" <<'CASES'
qwen3-0.6b	tests/templates/Qwen-Qwen3-0.6B.jinja	<|im_start|>,<|im_end|>,<think>,</think>
smollm3-3b	tests/templates/HuggingFaceTB-SmolLM3-3B.jinja	<|im_start|>,<|im_end|>,<think>,</think>
gemma2-2b	SHARED/templates/google-gemma-2-2b-it.jinja	<start_of_turn>,<end_of_turn>
gemma3-1b	tests/templates/google-gemma-3-4b-it.jinja	<start_of_turn>,<end_of_turn>
phi4-mini	tests/templates/microsoft-Phi-4-mini-instruct.jinja	<|system|>,<|user|>,<|assistant|>,<|end|>
ministral3-3b	tests/templates/mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja	[SYSTEM_PROMPT],[/SYSTEM_PROMPT],[INST],[/INST]
gpt-oss-20b	tests/templates/openai-gpt-oss-120b.jinja	<|start|>,<|end|>,<|message|>,<|channel|>,<|return|>,<|constrain|>,<|call|>
granite-3-2b	tests/templates/ibm-granite-granite-3.0-8b-instruct.jinja	<|start_of_role|>,<|end_of_role|>,<|end_of_text|>
olmo2-1b	tests/templates/allenai-OLMo-2-1124-13B-Instruct.jinja	
tinyllama	SHARED/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja	[INST],[/INST],[AVAILABLE_TOOLS],[/AVAILABLE_TOOLS],[TOOL_CALLS],[TOOL_RESULTS],[/TOOL_RESULTS]
CASES
    : > "$ac/render.list"
    : > "$ac/tok.list"
    while IFS=$'\t' read -r s t sp; do
        t=${t/SHARED/$SHARED}
        layers=2; case $s in gemma3-*) layers=6;; smollm3-*) layers=4;; esac
        moe=; case $s in gpt-oss-*) moe="--experts 4 --ff-exp 128";; esac # the harmony template, 4 small experts
        # shellcheck disable=SC2086
        "$BIN" gen-model --shape "$s" --type q8_0 --layers $layers --vocab 600 --ff 256 --swa 8 --seed 3 $moe \
            --chat-template "$t" --special "$sp" -o "$ac/$s.gguf" 2>"$ac/$s.gen.err" ||
            bad "arch chat: gen-model --shape $s --chat-template" "$(cat "$ac/$s.gen.err")"
        printf '%s\t%s\t%s\n' "$t" "$ac/ctx.json" "$ac/$s.hf" >> "$ac/render.list"
        printf '%s\t%s\t%s\n' "$ac/$s.gguf" "$ac/$s.prompt" "$ac/$s.ref" >> "$ac/tok.list"
    done < "$ac/cases"
    TZ=UTC HF_JINJA_DIR="$jr_dir" node tests/jinja/hf_render.mjs "$now" "$ac/render.list" 2>"$ac/hf.err" ||
        bad "arch chat: the reference renderer failed" "$(head -3 "$ac/hf.err")"
    # llama.cpp's chat drops a BOS the template writes and adds the model's own
    while IFS=$'\t' read -r s t sp; do
        [ -f "$ac/$s.hf" ] && python3 -c 'import sys; t = open(sys.argv[1], encoding="utf-8").read(); open(sys.argv[2], "w", encoding="utf-8").write(t[3:] if t.startswith("<s>") else t)' "$ac/$s.hf" "$ac/$s.prompt"
    done < "$ac/cases"
    cp tests/e2e/chat_tokens_ref.mjs "$nlc/" && (cd "$nlc" && node chat_tokens_ref.mjs "$ac/tok.list") 2>"$ac/nlc.err" ||
        bad "arch chat: node-llama-cpp's tokenizer failed" "$(head -3 "$ac/nlc.err")"
    ATM="tmux -L kvchat-archchat-$$"
    while IFS=$'\t' read -r s t sp; do
        [ -f "$ac/$s.ref" ] || { bad "arch chat: $s: no reference tokens"; continue; }
        want=$(python3 -c 'import json, sys; print(" ".join(map(str, [1] + json.load(open(sys.argv[1])))))' "$ac/$s.ref")
        nwant=$(echo "$want" | wc -w)
        $ATM kill-server >/dev/null 2>&1
        ATM="tmux -L kvchat-archchat-$$-$s"
        $ATM -f /dev/null new-session -d -s c -x 200 -y 30 \
            "$(printf '%q ' env LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$ac/state" XDG_CONFIG_HOME="$ac/config" \
                "$BIN" -m "$ac/$s.gguf" -t 1 -n 3 --temp 0 --db "$ac/$s.db") 2>'$ac/$s.err'; : > '$ac/$s.exited'; sleep 600"
        got_screen=0
        for _ in $(seq 1 300); do
            $ATM capture-pane -p -t c > "$ac/screen" 2>/dev/null
            grep -q 'chat template jinja' "$ac/screen" && { got_screen=1; break; }
            sleep 0.1
        done
        if [ $got_screen = 0 ]; then
            bad "arch chat: $s opens with its Jinja template" "$(head -5 "$ac/screen"; cat "$ac/$s.err")"
            continue
        fi
        $ATM send-keys -t c "hello" Enter
        new=
        for _ in $(seq 1 600); do
            $ATM capture-pane -p -t c > "$ac/screen" 2>/dev/null
            new=$(grep -oE 'reused 0 \+ new [0-9]+' "$ac/screen" | grep -oE '[0-9]+$' | head -1)
            [ -n "$new" ] && grep -qE '(tok/s|t/s)' "$ac/screen" && ! grep -qE '⠋|prefill [0-9]+ / [0-9]' "$ac/screen" && break
            sleep 0.1
        done
        sleep 1
        $ATM send-keys -t c C-d
        # the pane's shell marks kvchat's exit (its store closed); `pgrep -f "--db …"` also matched
        # the tmux server's own command line, so every case waited the whole 10 s
        for _ in $(seq 1 100); do
            [ -e "$ac/$s.exited" ] && break
            sleep 0.1
        done
        got=$(sqlite3 "$ac/$s.db" "SELECT hex(ctx_tokens) FROM conversations ORDER BY id DESC LIMIT 1" 2>/dev/null |
            python3 -c 'import sys, struct; b = bytes.fromhex(sys.stdin.read().strip()); print(" ".join(str(x) for x in struct.unpack("<%di" % (len(b) // 4), b)))')
        a=$(awk -v b="$s" '$2 == b {print $1}' <<< "qwen3 qwen3-0.6b
smollm3 smollm3-3b
gemma2 gemma2-2b
gemma3 gemma3-1b
phi3 phi4-mini
mistral3 ministral3-3b
gpt-oss gpt-oss-20b
granite granite-3-2b
olmo2 olmo2-1b
llama-mistral tinyllama")
        if [ "$new" = "$nwant" ] && [ "${got#"$want"}" != "$got" ]; then
            ok "arch chat: $a with its template ($(basename "$t" .jinja)): the chat feeds the model llama.cpp's $nwant prompt tokens of the reference rendering"
        else
            bad "arch chat: $a's chat prompt tokens equal the reference's" "new ${new:-?} (want $nwant); want [$want]; got [$got]"
        fi
    done < "$ac/cases"
    $ATM kill-server >/dev/null 2>&1
fi
