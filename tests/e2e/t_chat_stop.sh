# Esc during a long prefill (issue 16 #1), in tmux like t_chat.sh (chat_lib.sh's helpers). Sourced by
# run.sh. A latency assertion: run.sh runs this file alone (the Makefile's E2E_ALONE), after the
# others — beside another file's prefill, every try's key-to-idle time also waits for that file's
# time slices (a clean clone's CI once read 114-191 ms there, 2 files at a time, load average 2.5).

command -v tmux >/dev/null 2>&1 || return 0 # t_chat.sh says tmux is missing
type chat_start >/dev/null 2>&1 || . "$here/chat_lib.sh"
DM=$tmp/stop
mkdir -p "$DM"

# ---- issue 16 #1: Esc during a long prefill stops it within 100 ms, with progress shown --------
# A TinyLlama-shaped Q4_0 model (the real width; 12 of its 22 layers: a stop waits for one work chunk
# of one matmul, whose cost is the full model's) prefills ~1500 tokens in a few seconds even on a
# fast, idle machine, so the progress is seen; -b 2048 makes the prompt one n_batch chunk, which the
# engine used to compute whole before looking at Esc.
# Key-to-idle: from `tmux send-keys Escape` to the first capture showing 'ready' (so it includes
# tmux's own latency: two tmux client processes). Three stops (the first prefill and two /regen that
# go on from the kept positions; up to five while none made it): the best must be <= 100 ms — one
# try can lose time slices to the other processes of a loaded machine (at a load average of 18 on 2
# cores single tries took 86-194 ms), several rarely all do; every one must stop within a second.
# stop_ms: press Esc, wait for idle, print the milliseconds (9999: not idle within 2 s).
stop_ms() {
    local t0 t1 end
    t0=$(date +%s%N)
    keys Escape
    end=$((t0 + 2000000000))
    while :; do
        cap >"$CH/screen"
        t1=$(date +%s%N)
        grep -qE '│ ready( │|$)' "$CH/screen" && { echo $(((t1 - t0) / 1000000)); return; }
        [ "$t1" -gt "$end" ] && { echo 9999; return; }
    done
}
# wait_prefilling: a prefill runs (busy, its progress on screen)
wait_prefilling() {
    local end=$(($(date +%s) + 30))
    while [ "$(date +%s)" -le "$end" ]; do
        cap >"$CH/screen"
        grep -qE 'prefill [0-9]+ / [0-9]+' "$CH/screen" && ! grep -qE '│ ready( │|$)' "$CH/screen" && return 0
        sleep 0.05
    done
    return 1
}
if "$BIN" gen-model --shape tinyllama --type q4_0 --layers 12 -o "$DM/tl2.gguf" >/dev/null 2>&1; then
    awk 'BEGIN { srand(3); split("the a little cat dog ran sat on mat happy sun tree big small red blue house went to see friend", w, " ");
                 for (i = 0; i < 900; i++) printf "%s ", w[int(rand() * 20) + 1] }' >"$DM/long.txt"
    chat_start 120 30 -- -m "$DM/tl2.gguf" -c 2048 -b 2048 -t 2 --db "$DM/pf.db"
    wait_idle 30
    $TMC load-buffer -b long "$DM/long.txt"
    $TMC paste-buffer -p -b long -t c
    sleep 0.3
    keys Enter
    if wait_for 'prefill [0-9]+ / [0-9]+' 20; then
        p1=$(grep -oE 'prefill [0-9]+ /' "$CH/screen" | grep -oE '[0-9]+')
        # the count moves (within 5 s: a loaded machine's first chunks take long)
        for _ in $(seq 1 25); do
            sleep 0.2
            cap >"$CH/screen"
            p2=$(grep -oE 'prefill [0-9]+ /' "$CH/screen" | grep -oE '[0-9]+' || echo 0)
            [ "${p2:-0}" -gt "$p1" ] && break
        done
        total=$(grep -oE 'prefill [0-9]+ / [0-9]+' "$CH/screen" | grep -oE '[0-9]+$')
        if [ -n "$p2" ] && [ "$p2" -gt "$p1" ] && [ "$p2" -lt "${total:-0}" ]; then
            ok "chat: a long prefill shows its progress (prefill $p1 → $p2 / $total)"
        else
            bad "chat: a long prefill shows its progress" "$p1 → $p2 / $total $(screen_dump)"
        fi
        ms1=$(stop_ms)
        # the first capture showing 'ready' may be of a redraw tmux had only partly taken in (the
        # header new, the lines below it old: a clean clone's CI once caught "stopping… prefill
        # 20 / 1415" under "ready"): the pane's [stopped] may show in the next ones
        for _ in $(seq 1 20); do
            [ "$(last_pane_line)" = " [stopped]" ] && break
            sleep 0.05
            cap >"$CH/screen"
        done
        if [ "$ms1" -lt 1000 ] && [ "$(last_pane_line)" = " [stopped]" ]; then
            ok "chat: Esc during a prefill stops it within a second (${ms1} ms, [stopped])"
        else
            bad "chat: Esc during a prefill stops it within a second" "${ms1} ms $(screen_dump)"
        fi
        kept=$(sed -nE 's/^KV .* ([0-9]+) \/ 2048 tokens.*/\1/p' "$CH/screen")
        # the positions computed before Esc stay in the KV cache: the same prompt again reuses them
        keys "/regen" Enter
        if wait_for 'reused [1-9][0-9]* \+ new' 20; then
            reused=$(grep -oE 'reused [0-9]+' "$CH/screen" | grep -oE '[0-9]+')
            if [ -n "$kept" ] && [ "$kept" -gt 0 ] && [ "$reused" -ge $((kept - 16)) ]; then
                ok "chat: the prefilled positions stay in the KV cache after Esc ($kept kept, $reused reused)"
            else
                bad "chat: the prefilled positions stay in the KV cache after Esc" "kept $kept reused $reused"
            fi
        else
            bad "chat: the prefilled positions stay in the KV cache after Esc" "$(screen_dump)"
        fi
        # more tries (up to 5) only while none was within 100 ms: each /regen goes on from the kept positions
        tries="$ms1" best=$ms1 slow=0
        [ "$ms1" -ge 1000 ] && slow=1
        for try in 2 3 4 5; do
            [ $try -gt 3 ] && [ "$best" -le 100 ] && break
            [ $try -gt 2 ] && keys "/regen" Enter
            m=9999
            if wait_prefilling; then sleep 0.3; m=$(stop_ms); fi
            tries="$tries, $m"
            [ "$m" -lt "$best" ] && best=$m
            [ "$m" -ge 1000 ] && slow=1
        done
        load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null)
        ncpu=$(nproc 2>/dev/null || echo 1)
        if [ "$best" -le 100 ] && [ $slow = 0 ]; then
            ok "chat: Esc stops a prefill within 100 ms key-to-idle (best of $tries ms; load average $load)"
        elif [ $slow = 0 ] && awk -v l="${load:-0}" -v n="$ncpu" 'BEGIN { exit !(l > 4 * n) }'; then
            # more than 4 runnable processes per core: every step (tmux's client, the chat's two
            # threads, tmux's capture) waits for a time slice; the 100 ms is not asserted then
            ok "chat: Esc stops a prefill within a second; 100 ms NOT asserted on an overloaded machine (load average $load on $ncpu cores; best of $tries ms)"
        else
            bad "chat: Esc stops a prefill within 100 ms key-to-idle (best of 3-5, each within 1 s)" "$tries ms (load average $load) $(screen_dump)"
        fi
        wait_idle 20
    else
        bad "chat: a long prefill shows its progress" "$(screen_dump; cat "$CH/err")"
    fi
    chat_stop
else
    bad "chat: gen-model writes a 12-layer TinyLlama-shaped model for the prefill test"
fi
