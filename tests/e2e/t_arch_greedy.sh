# shellcheck shell=bash
# Greedy generation on each newer architecture against llama.cpp's: a small F16 gen-model file of the
# architecture (the sizes of tests/arch-ref), "abc" after BOS, 32 tokens at temperature 0 with a
# 512-token context on both sides (phi3 picks its LongRoPE factors by the context size, as llama.cpp
# does); kvchat's tokens (one-shot --json) must be llama.cpp's (node-llama-cpp: tests/e2e/greedy_ref.mjs;
# tests/arch_ref.sh installs it), every one. test_arch compares the logits teacher-forced; this is
# the free-running decode, where one wrong step changes every token after it.
nlc=$(sh tests/arch_ref.sh --install 2>/dev/null | tail -n 1)
if [ ! -d "$nlc/node_modules/node-llama-cpp" ]; then
    bad "arch greedy: node-llama-cpp (tests/arch_ref.sh --install) is missing"
else
    ag="$tmp/arch-greedy"
    mkdir -p "$ag"
    # architecture, shape, layers (gemma3: one global layer after five sliding; smollm3: a NoPE layer)
    cases="qwen3:qwen3-0.6b:2 smollm3:smollm3-3b:4 granite:granite-3-2b:2 olmo2:olmo2-1b:2 gemma2:gemma2-2b:2
gemma3:gemma3-1b:6 phi3:phi4-mini:2 mistral3:ministral3-3b:2 llama:tinyllama:2"
    files=()
    for c in $cases; do
        IFS=: read -r a s l <<< "$c"
        "$BIN" gen-model --shape "$s" --type f16 --layers "$l" --vocab 512 --ff 1024 --seed 7 --swa 32 \
            -o "$ag/$a.gguf" 2>"$ag/e" || bad "arch greedy: gen-model --shape $s" "$(cat "$ag/e")"
        files+=("$ag/$a.gguf")
    done
    if ! cp tests/e2e/greedy_ref.mjs "$nlc/" || ! (cd "$nlc" && node greedy_ref.mjs 32 "${files[@]}") >"$ag/ref" 2>"$ag/ref.err"; then
        bad "arch greedy: node-llama-cpp's greedy run failed" "$(head -3 "$ag/ref.err")"
    fi
    for c in $cases; do
        IFS=: read -r a s l <<< "$c"
        want=$(awk -F '\t' -v f="$ag/$a.gguf" '$1 == f {print $2}' "$ag/ref")
        got=$("$BIN" -m "$ag/$a.gguf" -p abc -n 32 --temp 0 -c 512 -t 2 --json 2>"$ag/$a.err" |
            python3 -c 'import sys, json; print(json.dumps([json.loads(l)["token"] for l in sys.stdin if l.startswith("{\"token\"")], separators=(",", ":")))')
        if [ -n "$want" ] && [ "$got" = "$want" ]; then
            ok "arch greedy: $a ($s) generates llama.cpp's 32 greedy tokens"
        else
            bad "arch greedy: $a ($s) generates llama.cpp's greedy tokens" "want ${want:-?}; got $got $(head -c 200 "$ag/$a.err")"
        fi
    done
fi
