# shellcheck shell=bash
# Chat templates: kvchat's Jinja interpreter (kvchat template-render) against the reference,
# @huggingface/jinja from npm (installed by `make jinja-ref` into build/jinja-ref), and against
# Python's Jinja2 as Hugging Face transformers runs it (python3-jinja2 from Debian): every template
# in ../shared/templates and tests/templates, every conversation in tests/jinja/conv (with and
# without a system message, a reasoning turn, enable_thinking false, ...), and the small cases of
# tests/jinja/cases.txt, byte for byte.
jr_dir=${HF_JINJA_DIR:-build/jinja-ref}
if ! command -v node >/dev/null || [ ! -f "$jr_dir/node_modules/@huggingface/jinja/package.json" ]; then
    bad "jinja: @huggingface/jinja is not installed in $jr_dir (make jinja-ref)"
else
    jt="$tmp/jinja"
    mkdir -p "$jt/ctx" "$jt/out" "$jt/cases"
    : > "$jt/list"
    : > "$jt/ctxlist"
    now=1750000000
    # the contexts: each conversation, plus what a template needs that a chat does not pass
    for t in "$SHARED"/templates/*.jinja tests/templates/*.jinja; do
        tn=$(basename "$t" .jinja)
        extra='{}'
        case "$tn" in
        *tool_use*|*functionary*) extra='{"tools": []}' ;;
        *firefunction*) extra='{"tools": [], "functions": "", "datetime": "2025-06-15"}' ;;
        esac
        for c in tests/jinja/conv/*.json; do
            cn=$(basename "$c" .json)
            printf '%s\t%s\t%s\n' "$c" "$extra" "$jt/ctx/$tn.$cn.json" >> "$jt/ctxlist"
            printf '%s\t%s\t%s\n' "$t" "$jt/ctx/$tn.$cn.json" "$jt/out/$tn.$cn.hf" >> "$jt/list"
        done
    done
    node tests/jinja/hf_render.mjs contexts "$jt/ctxlist"
    # small cases: one template per "=== name" block, rendered with tests/jinja/conv/system.json
    awk -v d="$jt/cases" '/^=== /{f=d "/" $2 ".jinja"; printf "" > f; next} f{if (n[f]++) printf "\n" >> f; printf "%s", $0 >> f}' tests/jinja/cases.txt
    for t in "$jt"/cases/*.jinja; do
        printf '%s\t%s\t%s\n' "$t" tests/jinja/conv/system.json "$jt/out/case-$(basename "$t" .jinja).hf" >> "$jt/list"
    done
    TZ=UTC HF_JINJA_DIR="$jr_dir" node tests/jinja/hf_render.mjs "$now" "$jt/list" 2> "$jt/node.err" || bad "jinja: the reference renderer failed" "$(head -3 "$jt/node.err")"
    # the second reference, Python's Jinja2 as transformers runs it, for the real templates
    grep -v "/cases/" "$jt/list" | sed 's/\.hf$/.py/' > "$jt/pylist"
    python3 tests/jinja/py_render.py "$now" "$jt/pylist" 2> "$jt/py.err" || bad "jinja: Python's Jinja2 failed" "$(tail -2 "$jt/py.err")"
    same=0 differ=0 both_refuse=0 py_same=0 dev=0
    while IFS=$'\t' read -r t c o; do
        k="${o%.hf}.kv"
        "$BIN" template-render --now "$now" -t "$t" "$c" > "$k" 2> "$k.err" && rm -f "$k.err"
        name=$(basename "${o%.hf}")
        p="${o%.hf}.py"
        if [ -f "$p" ] || [ -f "$p.err" ]; then
            if { [ -f "$p.err" ] && [ -f "$k.err" ]; } || { [ -f "$p" ] && [ ! -f "$k.err" ] && cmp -s "$p" "$k"; }; then
                py_same=$((py_same + 1))
            else
                bad "jinja: $name renders differently from Python's Jinja2" "$( { [ -f "$p.err" ] && echo "python: $(cat "$p.err")"; [ -f "$k.err" ] && cat "$k.err"; cmp "$p" "$k" 2>&1; } | head -3 | tr '\n' ' ')"
            fi
        fi
        if grep -q "^$name	" tests/jinja/deviations.txt; then
            if [ -f "$o" ] && [ -f "$p" ] && ! cmp -s "$o" "$k" && cmp -s "$p" "$k"; then dev=$((dev + 1))
            else bad "jinja: $name is listed in deviations.txt but does not differ from @huggingface/jinja as Python does"; fi
        elif [ -f "$o.err" ] && [ -f "$k.err" ]; then
            both_refuse=$((both_refuse + 1))
        elif [ -f "$o" ] && [ ! -f "$k.err" ] && cmp -s "$o" "$k"; then
            same=$((same + 1))
        else
            differ=$((differ + 1))
            bad "jinja: $name renders differently from @huggingface/jinja" \
                "$( { [ -f "$o.err" ] && echo "reference: $(cat "$o.err")"; [ -f "$k.err" ] && echo "kvchat: $(cat "$k.err")"; cmp "$o" "$k" 2>&1; } | head -3 | tr '\n' ' ')"
        fi
    done < "$jt/list"
    [ "$differ" -eq 0 ] && [ "$same" -ge 150 ] && ok "jinja: $same renderings byte-identical to @huggingface/jinja ($both_refuse refused by both; $dev listed deviations, where it has a bug, render as Python does)"
    [ "$py_same" -ge 160 ] && ok "jinja: $py_same template renderings byte-identical to Python's Jinja2 (transformers' environment)"
    # a refusal both agree on is the template's own raise_exception, said with its line
    printf '%s' '{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "add_generation_prompt": true}' > "$jt/sys.json"
    msg=$("$BIN" template-render -t "$SHARED/templates/google-gemma-2-2b-it.jinja" "$jt/sys.json" 2>&1)
    [ $? -eq 1 ] && [[ $msg == *"chat template line 1: raise_exception: System role not supported"* ]] &&
        ok "jinja: a template's raise_exception is an error naming its line" || bad "jinja: raise_exception" "$msg"
    printf '{%% if x %%}never closed' > "$jt/broken.jinja"
    msg=$("$BIN" template-render -t "$jt/broken.jinja" "$jt/sys.json" 2>&1)
    [ $? -eq 1 ] && [[ $msg == *"chat template line 1: missing {% endif %}"* ]] &&
        ok "jinja: a syntax error names the line and what is missing" || bad "jinja: syntax error" "$msg"
    # message contents are marked (the chat tokenizes them without control tokens)
    spans=$("$BIN" template-render --spans -t tests/templates/Qwen-Qwen3-0.6B.jinja tests/jinja/conv/system.json)
    [ "$spans" = "[[19, 28], [75, 6], [114, 25], [167, 26]]" ] &&
        ok "jinja: --spans gives the message contents' bytes" || bad "jinja: --spans" "$spans"
fi

# The chat runs a template file with the interpreter (--chat-template FILE.jinja): the status bar
# says jinja, and the prompt the chat prefills is the rendered text's tokens with one BOS (the
# template writes {{ bos_token }}); a template that cannot run falls back with a notice.
if command -v tmux >/dev/null 2>&1; then
    jc="$tmp/jinja-chat"
    mkdir -p "$jc/state" "$jc/config" "$jc/data"
    JTM="tmux -L kvchat-jinja-$$"
    jt_n=0
    jt_start() { # jt_start ARGS...: kvchat in a fresh tmux session, on a socket of its own (a server
        # still exiting from kill-server can take the next session on the same socket down with it)
        $JTM kill-server >/dev/null 2>&1
        jt_n=$((jt_n + 1))
        JTM="tmux -L kvchat-jinja-$$-$jt_n"
        $JTM -f /dev/null new-session -d -s c -x 110 -y 30 \
            "$(printf '%q ' env LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$jc/state" XDG_CONFIG_HOME="$jc/config" \
                XDG_DATA_HOME="$jc/data" "$BIN" -m "$MODEL" -t 1 "$@") 2>'$jc/err'; sleep 600"
    }
    jt_wait() { # jt_wait REGEX [SECONDS]
        local end=$(($(date +%s) + ${2:-30}))
        while [ "$(date +%s)" -le "$end" ]; do
            $JTM capture-pane -p -t c > "$jc/screen" 2>/dev/null
            grep -qE -- "$1" "$jc/screen" && return 0
            sleep 0.1
        done
        return 1
    }
    printf '%s' '{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}' > "$jc/tiny.jinja"
    printf '%s' '{"messages": [{"role": "user", "content": "hello"}], "add_generation_prompt": true}' > "$jc/conv.json"
    want=$("$BIN" template-render -t "$jc/tiny.jinja" -m "$MODEL" "$jc/conv.json" |
        "$BIN" tokenize --ids --parse-special -m "$MODEL" | tr -d '[] ' | tr ',' '\n' | wc -l)
    want=$((want - 1)) # kvchat tokenize adds the BOS in front of the template's own: the chat keeps one
    jt_start -n 1 --temp 0 --chat-template "$jc/tiny.jinja"
    if jt_wait 'chat template jinja' 30 && grep -q '│ jinja │' "$jc/screen"; then
        $JTM send-keys -t c "hello" Enter
        if jt_wait 'reused 0 \+ new [0-9]+' 60 && grep -qE "reused 0 \+ new $want\b" "$jc/screen"; then
            ok "jinja: the chat prefills the rendered template's $want tokens (one BOS)"
        else
            bad "jinja: the chat prefills the rendered template's $want tokens" "$(grep -E 'KV ' "$jc/screen")"
        fi
    else
        bad "jinja: the chat runs a --chat-template FILE.jinja" "$(head -5 "$jc/screen"; cat "$jc/err")"
    fi
    printf '%s' '{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}{% if %}' > "$jc/broken.jinja"
    jt_start --chat-template "$jc/broken.jinja"
    if jt_wait "cannot run the model's chat template \(chat template line 1: expected an" 30 &&
        grep -q "using the built-in format 'chatml'" "$jc/screen" && grep -q '│ chatml │' "$jc/screen"; then
        ok "jinja: a template the interpreter cannot run falls back to its family with a one-line notice"
    else
        bad "jinja: fallback notice" "$(head -6 "$jc/screen"; cat "$jc/err")"
    fi
    $JTM kill-server >/dev/null 2>&1
fi
