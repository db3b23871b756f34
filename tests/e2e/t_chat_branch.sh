# /edit (and Up on an empty input) and /branch in the full-screen chat (issue 4), driven in tmux
# like a person would, with the session helpers of chat_lib.sh.

if ! command -v tmux >/dev/null 2>&1; then
    bad "branch: tmux is installed (make deps)"
    return 0
fi
# the session helpers (chat_start, wait_for, keys, cap …), when t_chat.sh did not define them
type chat_start >/dev/null 2>&1 || . "$here/chat_lib.sh"

BDB=$tmp/branch.db
# The reply the CLI gives to PROMPT (temp 0, 12 tokens): what a fresh run computes.
fresh_reply() { "$BIN" -m "$MODEL" -t 1 --temp 0 -n 12 -p "$1" 2>/dev/null | tail -c +$((${#1} + 1)) | head -c 24; }
# The pane's text joined into one line (wrapped lines glued with a space).
pane_joined() { cap | pane_text | tr '\n' ' ' | tr -s ' '; }

chat_start 100 30 -- -t 1 --temp 0 -n 12 --db "$BDB"
wait_idle 30
keys "Once upon a time" Enter
wait_for '^ Once upon a time' 20 && wait_idle 20
keys "Tom had a dog" Enter
wait_for '^ Tom had a dog' 20 && wait_idle 20

# ---- Up on an empty input puts the last message in the input; Esc leaves it unchanged ----------
keys Up
if wait_for '^edit> Tom had a dog' 10; then ok "branch: Up on an empty input edits the last message (edit> …)"
else bad "branch: Up on an empty input edits the last message" "$(screen_dump)"; fi
keys Escape
if wait_for '^> *$' 10 && wait_for 'edit cancelled' 5; then ok "branch: Esc cancels the edit"
else bad "branch: Esc cancels the edit" "$(screen_dump)"; fi
keys Up
wait_for '^edit> Tom had a dog' 10
keys Up
if wait_for '^edit> Once upon a time' 10 && keys Down && wait_for '^edit> Tom had a dog' 10 && keys Down &&
    wait_for '^> *$' 10; then
    ok "branch: Up / Down step through your messages while editing; Down past the last ends the edit"
else
    bad "branch: Up / Down step through your messages" "$(screen_dump)"
fi

# ---- the edited message is answered from the shared prefix, on a new branch ---------------------
keys Up
wait_for '^edit> ' 10
keys C-u "Tom had a cat" Enter
if wait_for 'you · branch 2/2' 20 && wait_idle 20 && pane_joined | grep -q 'you · branch 2/2 Tom had a cat' &&
    ! cap | pane_text | grep -q 'Tom had a dog'; then
    ok "branch: the edit replaces the message on screen, labelled branch 2/2"
else
    bad "branch: the edited message shows as branch 2/2" "$(screen_dump)"
fi
reuse=$(grep -oE 'reused [0-9]+ \+ new [0-9]+' "$CH/screen")
if [ -n "$reuse" ] && [ "$(echo "$reuse" | awk '{print $2}')" -ge 16 ] && [ "$(echo "$reuse" | awk '{print $5}')" -le 8 ]; then
    ok "branch: the edit prefills only the edited message ($reuse)"
else
    bad "branch: the edit reuses the prefix before the edited message" "$reuse"
fi

# ---- /branch list, /branch 1 shows the original, /branch next comes back ---------------------------
keys "/branch list" Enter
if wait_for 'message 3 \(you\): branch 2 of 2' 10; then ok "branch: /branch list names the branch point"
else bad "branch: /branch list" "$(screen_dump)"; fi
keys "/branch 1" Enter
if wait_for 'branch 1/2' 10 && pane_joined | grep -q 'you · branch 1/2 Tom had a dog' && ! cap | pane_text | grep -q 'Tom had a cat'; then
    ok "branch: /branch 1 shows the original message and its reply"
else
    bad "branch: /branch 1 shows the original" "$(screen_dump)"
fi
keys "/branch next" Enter
if wait_for 'Tom had a cat' 10 && pane_joined | grep -q 'branch 2/2 Tom had a cat'; then ok "branch: /branch next goes back to the edit"
else bad "branch: /branch next" "$(screen_dump)"; fi

# ---- /branch: an alternative reply, both kept; it reuses the whole prompt ----------------------------
keys "/set temp 1.5" Enter "/set seed 7" Enter "/branch" Enter
if wait_for 'stories260K · branch 2/2' 20 && wait_idle 20 && pane_joined | grep -q 'stories260K · branch 2/2'; then
    ok "branch: /branch adds an alternative reply (branch 2/2)"
else
    bad "branch: /branch adds an alternative reply" "$(screen_dump)"
fi
reuse=$(grep -oE 'reused [0-9]+ \+ new [0-9]+' "$CH/screen")
if [ "$(echo "$reuse" | awk '{print $5}')" = 1 ]; then ok "branch: the alternative reply prefills nothing but its last prompt token ($reuse)"
else bad "branch: the alternative reply reuses the prompt" "$reuse"; fi
keys "/branch 3" Enter
if wait_for "'3' is not one of the 2 branches" 10; then ok "branch: /branch with a branch that does not exist says so"
else bad "branch: /branch 3 of 2" "$(screen_dump)"; fi

keys C-d
wait_for 'EXIT=0' 10

# ---- the branches are stored: resume shows the labels, the list counts them -------------------------
chat_start 100 30 -- -t 1 --temp 0 -n 12 --db "$BDB" --resume last
if wait_idle 30 && keys "/branch list" Enter && wait_for 'message 3 \(you\): branch 2 of 2' 10 &&
    wait_for 'message 4 \(reply\): branch 2 of 2' 5; then
    ok "branch: a resumed chat keeps its branches (/branch list)"
else
    bad "branch: a resumed chat keeps its branches" "$(screen_dump; cat "$CH/err")"
fi
keys "/branch 3:1" Enter
if wait_for 'branch 1/2' 10 && pane_joined | grep -q 'Tom had a dog'; then ok "branch: a resumed chat switches to a stored branch"
else bad "branch: a resumed chat switches to a stored branch" "$(screen_dump)"; fi
keys C-d
wait_for 'EXIT=0' 10
leaves=$("$BIN" list --json --db "$BDB" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["branches"])' 2>&1)
if [ "$leaves" = 3 ]; then ok "branch: kvchat list counts the conversation's 3 branches"
else bad "branch: kvchat list counts the branches" "$leaves"; fi
# ---- an edit of the first message, greedy, equals a fresh run of it -----------------------------
chat_start 100 30 -- -t 1 --temp 0 -n 12 --db "$tmp/branch2.db"
wait_idle 30
keys "Once upon a time" Enter
wait_for '^ Once upon a time' 20 && wait_idle 20
keys "/edit Lily had a red ball" Enter
if wait_for 'you · branch 2/2' 20 && wait_idle 20; then
    want=$(fresh_reply "Lily had a red ball" | tr '\n' ' ' | tr -s ' ' | sed 's/ *$//')
    if [ -n "$want" ] && pane_joined | grep -qF -- "Lily had a red ball stories260K $want"; then
        ok "branch: a greedy reply to an edited message equals a fresh run ('$want…')"
    else
        bad "branch: a greedy reply to an edited message equals a fresh run" "want '$want'; $(pane_joined | tail -c 300)"
    fi
else
    bad "branch: /edit TEXT answers the edited message" "$(screen_dump)"
fi
# an earlier message: the conversation branches there, what followed it leaves the screen
keys "She ran to the park." Enter
wait_for '^ She ran to the park' 20 && wait_idle 20
keys Up
wait_for '^edit> She ran' 10
keys Up
if wait_for '^edit> Lily had a red ball' 10; then
    keys C-u "Sam had a kite" Enter
    if wait_for 'you · branch 3/3' 20 && wait_idle 20 && pane_joined | grep -q 'you · branch 3/3 Sam had a kite' &&
        ! cap | pane_text | grep -q 'She ran to the park'; then
        ok "branch: editing an earlier message branches the conversation there (branch 3/3)"
    else
        bad "branch: editing an earlier message" "$(screen_dump)"
    fi
else
    bad "branch: Up reaches an earlier message" "$(screen_dump)"
fi
chat_stop
