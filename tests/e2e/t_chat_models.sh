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
