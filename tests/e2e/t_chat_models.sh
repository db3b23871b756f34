# The chat's model and conversation commands (issue 16 "Models", issue 13 reasoning): /export,
# /system, personas, /model, F3 snippets, reasoning folded — in tmux with t_chat.sh's helpers
# (chat_start, wait_for, keys, cap …). Sourced by run.sh.

[ -n "${TMC:-}" ] || return 0
MM=$tmp/models_cmds
mkdir -p "$MM"

# ---- /export [md|json] [FILE] writes what `kvchat export` writes; /system sets the system prompt --
chat_start 100 30 -- -t 1 --temp 0 -n 20 --db "$MM/exp.db"
if wait_idle 30; then
    keys "Once upon a time" Enter
    wait_for '\[max tokens\]' 30
    wait_idle 30
    keys "/export md $MM/x.md" Enter
    wait_for 'exported conversation' 10
    keys "/export json $MM/x.json" Enter
    wait_for 'exported conversation [0-9]+ \(json' 10
    keys "/export" Enter
    wait_for 'exported conversation [0-9]+ \(md, [0-9]+ bytes\) to kvchat-[0-9]+\.md' 10
    "$BIN" export last --db "$MM/exp.db" --format md >"$MM/cli.md" 2>/dev/null
    "$BIN" export last --db "$MM/exp.db" --format json >"$MM/cli.json" 2>/dev/null
    id=$(sqlite3 "$MM/exp.db" "SELECT max(id) FROM conversations")
    if [ -s "$MM/x.md" ] && cmp -s "$MM/x.md" "$MM/cli.md" && cmp -s "$MM/x.json" "$MM/cli.json" &&
        grep -q '## Assistant' "$MM/x.md" && [ -f "kvchat-$id.md" ] && cmp -s "kvchat-$id.md" "$MM/cli.md"; then
        ok "chat: /export md|json FILE (and /export alone: ./kvchat-$id.md) write what kvchat export writes"
    else
        bad "chat: /export writes what kvchat export writes" "$(diff "$MM/x.md" "$MM/cli.md" | head -5) $(screen_dump)"
    fi
    rm -f "kvchat-$id.md"
    keys "/system You are a storyteller." Enter
    if wait_for 'system prompt: You are a storyteller\.' 10 &&
        [ "$(sqlite3 "$MM/exp.db" "SELECT system_prompt FROM conversations WHERE id = $id")" = "You are a storyteller." ]; then
        ok "chat: /system TEXT sets the conversation's system prompt (shown, stored)"
    else
        bad "chat: /system TEXT sets the system prompt" "$(screen_dump)"
    fi
    # the next reply is prefilled from the re-rendered prompt, which starts with the system prompt
    keys "The cat" Enter
    wait_for '\[max tokens\]' 30
    wait_idle 30
    want=$("$BIN" tokenize -m "$MODEL" --ids "You are a storyteller." | tr -d '[],')
    nw=$(echo $want | wc -w)
    rm -f "$MM/ctx.bin"
    sqlite3 "$MM/exp.db" "SELECT writefile('$MM/ctx.bin', ctx_tokens) FROM conversations WHERE id = $id" >/dev/null
    got=$(od -An -v -t d4 "$MM/ctx.bin" | tr -s ' \n' ' ' | sed 's/^ //' | cut -d' ' -f1-"$nw")
    if [ -n "$got" ] && [ "$got" = "$(echo $want)" ]; then
        ok "chat: after /system the next prompt starts with the new system prompt ($nw tokens)"
    else
        bad "chat: after /system the next prompt starts with it" "want $want got $got"
    fi
    keys "/system" Enter
    wait_for 'system prompt: You are a storyteller\. \(/system TEXT' 10 && ok "chat: /system alone shows it" || bad "chat: /system alone shows it" "$(screen_dump)"
    keys "/system -" Enter
    wait_for 'system prompt cleared' 10 && [ -z "$(sqlite3 "$MM/exp.db" "SELECT system_prompt FROM conversations WHERE id = $id")" ] &&
        ok "chat: /system - clears it" || bad "chat: /system - clears it" "$(screen_dump)"
    keys C-d
else
    bad "chat: /export (the chat starts)" "$(screen_dump; cat "$CH/err")"
fi
chat_stop

# ---- /model NAME: the conversation goes on with another model ------------------------------------
# stories260K (completion mode, SentencePiece) → a 2-layer model carrying Qwen3's chat template
# (gen-model --chat-template) from the models directory, by Tab completion; the conversation is
# prefilled again with the new template and vocabulary; each reply keeps its model's name, also
# after --resume (messages.model_id, schema 4).
MDIR="$XDG_DATA_HOME/kvchat/models"
mkdir -p "$MDIR"
if "$BIN" gen-model --shape tiny --type q8_0 --chat-template tests/templates/Qwen-Qwen3-0.6B.jinja -o "$MDIR/qwen3-tmpl.gguf" >/dev/null 2>&1; then
    chat_start 140 32 -- -t 1 --temp 0 -n 8 --db "$MM/model.db"
    if wait_idle 30; then
        keys "Once upon a time" Enter
        wait_for '\[max tokens\]' 30
        wait_idle 30
        keys "/model qwen3-t" Tab
        if wait_for '^> /model qwen3-tmpl' 5; then ok "chat: Tab completes /model NAME from the models directory"
        else bad "chat: Tab completes /model NAME from the models directory" "$(screen_dump)"; fi
        keys C-u "/model qwen3-tmpl" Enter
        if wait_for 'the conversation is now [0-9]+ tokens of synthetic tiny-shaped' 60 && wait_for '│ ready' 10 &&
            grep -q 'model: stories260K → synthetic tiny-shaped Q8_0 (random weights) (llama,' "$CH/screen" &&
            grep -qE '│ synthetic tiny-shaped Q8_0 \(random weights\) │ llama Q8_0 │.*│ jinja' "$CH/screen"; then
            n=$(grep -oE 'the conversation is now [0-9]+ tokens' "$CH/screen" | grep -oE '[0-9]+')
            kv=$(sed -nE 's/^KV .* ([0-9]+) \/ [0-9]+ tokens.*/\1/p' "$CH/screen")
            # the prompt as the new model's template renders it, tokenized by its vocabulary
            user=$(sqlite3 "$MM/model.db" "SELECT content FROM messages WHERE role = 'user' ORDER BY id LIMIT 1")
            reply=$(sqlite3 "$MM/model.db" "SELECT content FROM messages WHERE role = 'assistant' ORDER BY id LIMIT 1")
            python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": sys.argv[1]}, {"role": "assistant", "content": sys.argv[2]}], "add_generation_prompt": True}))' "$user" "$reply" >"$MM/conv.json"
            want=$("$BIN" template-render -m "$MDIR/qwen3-tmpl.gguf" "$MM/conv.json" | "$BIN" tokenize --ids --parse-special -m "$MDIR/qwen3-tmpl.gguf" | tr -d '[] ' | tr ',' '\n' | grep -c .)
            if [ "$n" -ge $((want - 1)) ] && [ "$n" -le "$want" ] && [ "${kv:-0}" -ge "$n" ]; then
                ok "chat: /model re-tokenizes the conversation with the new template ($n tokens, rendered: $want; gauge $kv)"
            else
                bad "chat: /model re-tokenizes the conversation" "n $n want $want kv $kv $(screen_dump)"
            fi
        else
            bad "chat: /model switches the model mid-chat" "$(screen_dump; cat "$CH/err")"
        fi
        keys "Tell me more" Enter
        wait_for '\[max tokens\]|│ ready' 30
        wait_idle 30
        cap >"$CH/screen"
        if grep -qE '^ ?stories260K  ' "$CH/screen" && grep -qE '^ ?synthetic tiny-shaped Q8_0 \(random weights\)  ' "$CH/screen"; then
            ok "chat: after /model the old reply is labelled stories260K, the new one with the new model's name"
        else
            bad "chat: each reply keeps the name of its model" "$(screen_dump)"
        fi
        m=$(sqlite3 "$MM/model.db" "SELECT group_concat(md.path, ',') FROM messages m LEFT JOIN models md ON md.id = m.model_id WHERE m.role = 'assistant' ORDER BY m.id")
        case "$m" in *stories260K.gguf,*qwen3-tmpl.gguf) ok "chat: the store names each reply's model (messages.model_id)" ;;
            *) bad "chat: the store names each reply's model" "$m" ;; esac
        keys "/model nosuchmodel" Enter
        wait_for "/model: .*nosuchmodel" 10 && grep -qE '│ synthetic tiny-shaped.*│ jinja' "$CH/screen" &&
            ok "chat: /model of a model that does not exist says so and keeps the current one" ||
            bad "chat: /model nosuchmodel" "$(screen_dump)"
        keys C-d
        if wait_for 'EXIT=0' 20 && ! grep -qE 'Sanitizer|runtime error' "$CH/err"; then
            ok "chat: after /model the chat quits cleanly (exit 0, nothing from the sanitizers under ASan)"
        else
            bad "chat: after /model the chat quits cleanly" "$(screen_dump; head -20 "$CH/err")"
        fi
    else
        bad "chat: /model (the chat starts)" "$(screen_dump; cat "$CH/err")"
    fi
    chat_stop
    # --resume shows both names; the conversation now names the model it went on with
    [ "$(sqlite3 "$MM/model.db" "SELECT md.path FROM conversations c JOIN models md ON md.id = c.model_id")" = "$MDIR/qwen3-tmpl.gguf" ] &&
        ok "chat: the conversation goes on with the model /model chose (conversations.model_id)" ||
        bad "chat: the conversation goes on with the model /model chose" "$(sqlite3 "$MM/model.db" "SELECT * FROM models")"
    MODEL_SAVED=$MODEL
    MODEL="$MDIR/qwen3-tmpl.gguf"
    chat_start 110 32 -- --resume last --db "$MM/model.db"
    MODEL=$MODEL_SAVED
    if wait_idle 30 && grep -qE '^ ?stories260K  ' "$CH/screen" && grep -qE '^ ?synthetic tiny-shaped Q8_0 \(random weights\)  ' "$CH/screen" &&
        ! grep -q 'this chat was with' "$CH/screen"; then
        ok "chat: after --resume each reply still names the model that wrote it"
    else
        bad "chat: after --resume each reply names its model" "$(screen_dump; cat "$CH/err")"
    fi
    chat_stop
else
    bad "chat: gen-model --chat-template writes a model for the /model test"
fi
