# The full-screen chat (issue 3), driven in tmux like a person would: send-keys, capture-pane.
# Each session runs on its own tmux socket (never the user's server); every wait polls the
# screen with a deadline instead of sleeping a fixed time, so a loaded machine only makes the
# tests slower. Sourced by run.sh (ok/bad, BIN, MODEL, tmp).

if ! command -v tmux >/dev/null 2>&1; then
    bad "chat: tmux is installed (make deps)"
    return 0
fi

# the session helpers (chat_start, wait_for, keys, cap …)
. "$here/chat_lib.sh"

# ---- 1. a reply streams: it grows between two captures; the stats line shows decode t/s ------
chat_start 100 30 -- -t 1 -c 8192
if wait_idle 30; then ok "chat: the screen opens (make run's path)"; else bad "chat: the screen opens" "$(screen_dump; cat "$CH/err")"; fi
keys "Once upon a time" Enter
if wait_for ' [0-9]+ tokens' 30; then
    n1=$(tokens_shown)
    cap | pane_text >"$CH/cap1"
    grown=0
    for _ in $(seq 1 100); do
        sleep 0.1
        n2=$(tokens_shown)
        cap | pane_text >"$CH/cap2"
        if [ "$n2" -gt "$n1" ] && ! cmp -s "$CH/cap1" "$CH/cap2"; then grown=1; break; fi
    done
    if [ $grown = 1 ]; then ok "chat: the reply grows between two captures ($n1 → $n2 tokens)"
    else bad "chat: the reply grows between two captures" "tokens $n1 → $n2"; fi
else
    bad "chat: a reply starts streaming" "$(screen_dump; cat "$CH/err")"
fi
if wait_for 'decode [0-9]+\.[0-9] t/s' 10 && grep -qE 'decode [1-9][0-9]*\.[0-9] t/s|decode 0\.[1-9] t/s' "$CH/screen" &&
    grep -q '● generating' "$CH/screen"; then
    ok "chat: the stats line shows decode tokens/s live: $(grep -oE 'decode [0-9.]+ t/s' "$CH/screen")"
else
    bad "chat: the stats line shows decode tokens/s live" "$(screen_dump)"
fi
grep -qE 'TTFT [0-9]+ ?ms' "$CH/screen" && grep -qE 'prefill [0-9]+ t/s' "$CH/screen" && grep -qE 'ITL [0-9.]+ ?ms' "$CH/screen" &&
    ok "chat: the stats line shows TTFT, prefill t/s and ITL" || bad "chat: the stats line shows TTFT, prefill t/s and ITL" "$(screen_dump)"
grep -qE '^KV .* [0-9]+ / 8192 tokens \([0-9]+%\) · [0-9.]+ (B|KiB|MiB) / 5\.00 MiB' "$CH/screen" &&
    ok "chat: the KV gauge shows tokens / n_ctx and the engine's MiB (5.00 MiB reserved for 8192 f16 positions)" ||
    bad "chat: the KV gauge shows tokens and MiB" "$(screen_dump)"

# ---- 2. the temperature slider moves during the reply, and the controller gets the value ------
keys Tab
keys Right
if wait_for 'temperature +0\.85' 10 && grep -q '● generating' "$CH/screen"; then
    ok "chat: the temperature slider shows 0.85 while the reply streams"
else
    bad "chat: the temperature slider changes during a reply" "$(screen_dump)"
fi
keys Escape   # stops the reply (Esc stops from any focus)
wait_idle 10 # (a key sent right after Esc would read as Alt-key)
keys "/show params" Enter
if wait_for 'temp 0\.85 ·' 10; then ok "chat: /show params reports the slider's temperature"
else bad "chat: /show params reports the slider's temperature" "$(screen_dump)"; fi

# ---- 3. Esc stops a reply mid-way: the partial reply stays, marked ------------------------------
keys "The little dog" Enter
if wait_for ' [1-9][0-9]* tokens' 30 && wait_for '● generating' 5; then
    keys Escape # at once: a reply of up to 8192 tokens can end within a second on a fast machine
    if wait_idle 10 && [ "$(last_pane_line)" = " [stopped]" ]; then
        a=$(tokens_shown)
        sleep 1
        b=$(tokens_shown)
        if [ "$a" = "$b" ] && [ "$a" -gt 0 ] && [ "$a" -lt 8000 ]; then ok "chat: Esc stops the reply mid-way ($a tokens, [stopped])"
        else bad "chat: Esc stops the reply mid-way" "tokens $a then $b"; fi
    else
        bad "chat: Esc stops the reply mid-way" "$(screen_dump)"
    fi
else
    bad "chat: a second reply starts" "$(screen_dump)"
fi
# the KV cache is kept between turns: the new message prefilled only its own few tokens
reuse=$(grep -oE 'reused [0-9]+ \+ new [0-9]+' "$CH/screen")
if [ -n "$reuse" ] && [ "$(echo "$reuse" | awk '{print $2}')" -gt 100 ] && [ "$(echo "$reuse" | awk '{print $5}')" -le 10 ]; then
    ok "chat: the next turn reuses the KV cache ($(grep -oE 'reused [0-9]+ \+ new [0-9]+' "$CH/screen"))"
else
    bad "chat: the next turn reuses the KV cache" "$(screen_dump)"
fi

# ---- 4. resize 100x30 → 50x15 → 30x8 → 100x30 during a reply ----------------------------------
keys "Then" Enter
wait_for '● generating' 20
$TMC resize-window -t c -x 50 -y 15
r1=0; wait_for '^KV ' 10 && ! grep -q 'EXIT=' "$CH/screen" && r1=1
$TMC resize-window -t c -x 30 -y 8
r2=0; wait_for 'terminal too small' 10 && r2=1
$TMC resize-window -t c -x 100 -y 30
r3=0; wait_for '^KV .*tokens' 10 && wait_for '^>' 5 && r3=1
if [ $r1 = 1 ] && [ $r2 = 1 ] && [ $r3 = 1 ] && ! grep -q 'EXIT=' "$CH/screen"; then
    ok "chat: resize 100x30 → 50x15 → 30x8 ('terminal too small') → 100x30 during a reply"
else
    bad "chat: resize during a reply" "50x15:$r1 30x8:$r2 100x30:$r3 $(screen_dump)"
fi
keys Escape
wait_idle 10

# ---- 5. /theme switches live; unknown commands are one-line errors; F1 help ---------------------
keys "/theme light" Enter
if wait_for 'theme light' 10 && cap -e | grep -q '48;5;231m'; then ok "chat: /theme light switches (status bar and colours)"
else bad "chat: /theme light switches" "$(screen_dump)"; fi
keys "/theme nosuchtheme" Enter
wait_for "no theme 'nosuchtheme'" 10 && ok "chat: /theme with an unknown name is an error naming the choices" ||
    bad "chat: /theme unknown" "$(screen_dump)"
keys "/bogus 1 2" Enter
if wait_for "unknown command '/bogus'" 10; then ok "chat: an unknown command is a one-line error"
else bad "chat: an unknown command is a one-line error" "$(screen_dump)"; fi
keys "/the"
keys Tab
wait_for '^> /theme *$' 10 && ok "chat: Tab completes a slash command" || bad "chat: Tab completes a slash command" "$(screen_dump)"
keys C-u
keys F1
if wait_for 'kvchat help' 10 && grep -q '/set NAME VALUE' "$CH/screen" && grep -q 'Alt-Enter' "$CH/screen"; then
    keys q
    if wait_gone 'kvchat help' 10; then ok "chat: F1 shows the help overlay, any key closes it"
    else bad "chat: the help overlay closes" "$(screen_dump)"; fi
else
    bad "chat: F1 shows help" "$(screen_dump)"
fi

# ---- 6. bracketed paste keeps newlines; control bytes are shown as pictures, never raw -------------
$TMC set-buffer -b p "$(printf 'line one\nred\033[31mX')"
$TMC paste-buffer -p -b p -t c
if wait_for '^  red␛\[31mX' 10 && grep -q '^> line one' "$CH/screen"; then
    ok "chat: a bracketed paste keeps its newline in the input"
else
    bad "chat: a bracketed paste keeps its newline" "$(screen_dump)"
fi
keys M-Enter
keys "alt"
wait_for '^  alt' 10 && ok "chat: Alt-Enter starts a new line in the message" || bad "chat: Alt-Enter new line" "$(screen_dump)"
keys Enter
if wait_for '^ red␛\[31mX' 10 && ! cap -e | grep -q "red$(printf '\033')\[31m"; then
    ok "chat: an ESC byte in a message is shown as ␛, never sent raw to the terminal"
else
    bad "chat: ESC bytes are shown safely" "$(screen_dump)"
fi
keys Escape
wait_idle 20

# ---- 7. Ctrl-D exits and the terminal is restored ----------------------------------------------
wait_idle 20
keys C-d
if wait_for 'EXIT=0' 15 && [ -s "$CH/stty.before" ] && cmp -s "$CH/stty.before" "$CH/stty.after"; then
    ok "chat: Ctrl-D exits (status 0) and the terminal settings are restored"
else
    bad "chat: Ctrl-D exits and restores the terminal" "$(screen_dump; cat "$CH/err")"
fi
grep -q 'Once upon a time' "$CH/state/kvchat/history" 2>/dev/null &&
    ok "chat: the input history is kept in \$XDG_STATE_HOME/kvchat/history" || bad "chat: input history persisted"

# ---- 8. /set temp 0 gives the reply of `kvchat -p M --temp 0` (completion mode) -------------------
chat_start 100 30 -- -t 1 -n 24
wait_idle 30
keys "/set temp 0" Enter
wait_for 'temp = 0' 10
keys "Once upon a time" Enter
if wait_for '\[max tokens\]' 30; then
    # the reply: the lines between the model's label and the marker, left of the panel
    reply=$(cut_panel <"$CH/screen" | awk '/^ you$/{u=1} u&&!e&&/^ *$/{b=NR} /\[max tokens\]/{e=NR} {l[NR]=$0} END{for(i=b+2;i<e;i++) printf "%s ", l[i]}' |
        tr -s ' ' | sed 's/^ //; s/ $//')
    want=$("$BIN" -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 -t 1 2>/dev/null | tr '\n' ' ' | tr -s ' ')
    want=${want#Once upon a time}
    want=$(echo "$want" | sed 's/^ //; s/ $//')
    if [ -n "$reply" ] && [ "$reply" = "$want" ]; then ok "chat: /set temp 0 gives the reply of -p ... --temp 0 ($(echo "$reply" | cut -c1-40)…)"
    else bad "chat: /set temp 0 reply equals the one-shot" "chat: '$reply' one-shot: '$want'"; fi
else
    bad "chat: /set temp 0 reply" "$(screen_dump)"
fi

# ---- 9. Ctrl-C twice quits on an empty input ------------------------------------------------------
keys C-c
if wait_for 'Ctrl-C again' 10; then
    keys C-c
    if wait_for 'EXIT=0' 10 && cmp -s "$CH/stty.before" "$CH/stty.after"; then ok "chat: Ctrl-C twice on an empty input quits"
    else bad "chat: the second Ctrl-C quits" "$(screen_dump)"; fi
else
    bad "chat: Ctrl-C on an empty input asks again" "$(screen_dump)"
fi

# ---- 10. SIGTERM mid-reply restores the terminal ----------------------------------------------------
chat_start 80 24 -- -t 1 -c 8192
wait_idle 30
keys "Once upon a time" Enter
wait_for '● generating' 20
kill -TERM "$(cat "$CH/pid")" 2>/dev/null
if wait_for 'EXIT=143' 15 && cmp -s "$CH/stty.before" "$CH/stty.after" && ! grep -q 'KV ' "$CH/screen"; then
    ok "chat: SIGTERM during a reply exits 143 with the terminal restored"
else
    bad "chat: SIGTERM restores the terminal" "$(screen_dump)"
fi

# ---- 10b. a fatal signal (SIGSEGV) still restores the terminal -------------------------------------
chat_start 80 24 -- -t 1
wait_idle 30
kill -SEGV "$(cat "$CH/pid")" 2>/dev/null
if wait_for 'EXIT=139' 15 && cmp -s "$CH/stty.before" "$CH/stty.after" && ! grep -q 'KV ' "$CH/screen"; then
    ok "chat: SIGSEGV leaves the screen and restores the terminal before dying"
else
    bad "chat: SIGSEGV restores the terminal" "$(screen_dump)"
fi

# ---- 11. themes: a bad line warns with file and line; NO_COLOR; an unknown --theme ------------------
printf '[colors]\nuser = bold green\nassistant = purplish\n' >"$CH/config/kvchat/themes/broken.theme"
chat_start 100 30 -- -t 1 --theme broken
if wait_for 'broken\.theme:3:' 30 && grep -q 'purplish' "$CH/screen"; then ok "chat: a bad theme line is a warning naming the file and line"
else bad "chat: a bad theme line warns with file and line" "$(screen_dump; cat "$CH/err")"; fi
chat_start 120 30 NO_COLOR=1 -- -t 1 --theme solarized-dark
if wait_idle 30 && grep -q '(mono)' "$CH/screen" && ! cap -e | grep -qE $'\033\\[[0-9;]*(3[0-7]|38;5;[0-9]+|4[0-7]|48;5;[0-9]+|9[0-7])m'; then
    ok "chat: NO_COLOR turns every colour off"
else
    bad "chat: NO_COLOR turns colours off" "$(cap -e | head -3 | cat -v)"
fi
chat_start 100 30 -- -t 1 --theme nosuchtheme
if wait_for 'EXIT=2' 20 && grep -q "no theme 'nosuchtheme'" "$CH/err"; then ok "chat: --theme with an unknown name exits 2 ($(head -c 80 "$CH/err"))"
else bad "chat: unknown --theme" "$(screen_dump; cat "$CH/err")"; fi

# ---- 12. --system: the system prompt of a new chat; with -p it is a usage error --------------------
chat_start 100 30 -- -t 1 --db "$tmp/system.db" --system "You tell short stories."
if wait_idle 30 && grep -q 'system prompt: You tell short stories\.' "$CH/screen" && keys "/show params" Enter &&
    wait_for 'mode: completion · system prompt: You tell short stories\.' 10; then
    ok "chat: --system sets the system prompt of a new chat (shown, and in /show params)"
else
    bad "chat: --system sets the system prompt" "$(screen_dump; cat "$CH/err")"
fi
"$BIN" -m "$MODEL" --system "x" -p "Once" >/dev/null 2>"$CH/syserr"
rc=$?
if [ $rc = 2 ] && grep -q -- "--system is the chat's system prompt" "$CH/syserr"; then ok "--system with -p is a usage error (exit 2)"
else bad "--system with -p is a usage error" "rc=$rc $(cat "$CH/syserr")"; fi

chat_stop
