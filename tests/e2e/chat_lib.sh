# chat_lib: the tmux session helpers of the full-screen chat's e2e files (t_chat*.sh source it):
# chat_start / chat_stop, cap, keys, wait_for, wait_gone, wait_idle, the screen's parts. Each
# session runs on its own tmux socket (never the user's server, one per run.sh process: the files
# can run side by side, E2E_JOBS), in $tmp/chat. Needs run.sh's ok/bad, BIN, MODEL, tmp.

TMC="tmux -L kvchat-test-$$"
CH=$tmp/chat
mkdir -p "$CH/state" "$CH/config/kvchat/themes"

chat_stop() { $TMC kill-server >/dev/null 2>&1; sleep 0.2; }

# chat_start W H [ENV=VAL ...] -- [kvchat args...]: a fresh session "c" running kvchat in bash;
# bash records the terminal settings before and after, and kvchat's exit status.
chat_start() {
    local w=$1 h=$2 envs=() args=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    args=("$@")
    chat_stop
    rm -f "$CH/stty.before" "$CH/stty.after" "$CH/pid" "$CH/err"
    {
        echo "stty -g > '$CH/stty.before'"
        printf 'bash -c %q' "echo \$\$ > '$CH/pid'; exec $(printf '%q ' env -u NO_COLOR LANG=C.UTF-8 TERM=tmux-256color XDG_STATE_HOME="$CH/state" XDG_CONFIG_HOME="$CH/config" "${envs[@]}" "$BIN" -m "$MODEL" "${args[@]}") 2>'$CH/err'"
        echo
        echo "echo \"EXIT=\$?\""
        echo "stty -g > '$CH/stty.after'"
        echo "sleep 600"
    } >"$CH/run.sh"
    $TMC -f /dev/null new-session -d -s c -x "$w" -y "$h" "bash '$CH/run.sh'"
}

cap() { $TMC capture-pane -p -t c "$@" 2>/dev/null; }
keys() { $TMC send-keys -t c "$@"; }

# wait_for REGEX [SECONDS]: 0 once the screen matches (the screen is left in $CH/screen).
wait_for() {
    local re=$1 t=${2:-30} end
    end=$(($(date +%s) + t))
    while [ "$(date +%s)" -le "$end" ]; do
        cap >"$CH/screen"
        grep -qE -- "$re" "$CH/screen" && return 0
        sleep 0.1
    done
    return 1
}
# wait_gone REGEX [SECONDS]: 0 once the screen no longer matches.
wait_gone() {
    local re=$1 t=${2:-30} end
    end=$(($(date +%s) + t))
    while [ "$(date +%s)" -le "$end" ]; do
        cap >"$CH/screen"
        grep -qE -- "$re" "$CH/screen" || return 0
        sleep 0.1
    done
    return 1
}
# The status bar says no request runs.
wait_idle() { wait_for '│ ready( │|$)' "${1:-30}"; }
# The "N tokens" of the stats line (0 if none).
tokens_shown() { cap | sed -nE 's/.* ([0-9]+) tok(ens)?( ·.*|$)/\1/p' | tail -1 | grep -E '^[0-9]+$' || echo 0; }
screen_dump() { sed 's/^/       | /' "$CH/screen" | head -40; }

cut_panel() { sed -E 's/ *│.*$//'; }
# The chat pane's text alone (no status bar, panel, gauge, stats or input).
pane_text() { cut_panel | sed -n '2,$p' | sed '/^─/,$d'; }
# The last non-empty line of the chat pane (above the border row), left of the panel.
last_pane_line() { pane_text <"$CH/screen" | grep -v '^ *$' | tail -1; }
