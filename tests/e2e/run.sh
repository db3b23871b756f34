#!/usr/bin/env bash
# End-to-end tests: drive the real kvchat binary the way a user does and check its output.
# Env: KVCHAT_BIN (./kvchat), KVCHAT_SHARED (../shared), E2E (a glob of the files to run, e.g.
# `make e2e E2E=serve*` runs t_serve*.sh; default every file), E2E_JOBS (files run side by side,
# default 1). Prints "N passed, N failed".
#
# With E2E_JOBS > 1 each file runs in its own run.sh process (its own temp dir, XDG dirs, tmux
# sockets — named after the process — and servers on --port 0), E2E_JOBS at a time, the longest
# first (E2E_FIRST), the ones in E2E_ALONE after them one at a time; each file's output goes to a
# log that is printed whole, in the files' order, once it and every one before it are done, so the
# output reads as a serial run's.
set -u
BIN=${KVCHAT_BIN:-./kvchat}
SHARED=${KVCHAT_SHARED:-../shared}
MODEL=$SHARED/models/stories260K.gguf
here=$(cd "$(dirname "$0")" && pwd)
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the tests never read or write the user's own config file, models, conversations or history
export XDG_CONFIG_HOME="$tmp/xdg/config" XDG_DATA_HOME="$tmp/xdg/data" XDG_STATE_HOME="$tmp/xdg/state"
unset KVCHAT_MODEL KVCHAT_DB

ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() { fail=$((fail + 1)); echo "FAIL - $1"; [ $# -gt 1 ] && echo "       $2"; }

if [ -n "${E2E_ONE:-}" ]; then
    files=("$E2E_ONE")
else
    files=("$here"/t_${E2E:-*}.sh)
fi
jobs=${E2E_JOBS:-1}
start=$(date +%s)

if [ -z "${E2E_ONE:-}" ] && [ "$jobs" -gt 1 ] && [ ${#files[@]} -gt 1 ]; then
    # the longest files first, so the short ones fill the other slots at the end
    order=()
    for f in ${E2E_FIRST:-}; do for t in "${files[@]}"; do [ "$(basename "$t" .sh)" = "$f" ] && order+=("$t"); done; done
    for t in "${files[@]}"; do case " ${E2E_FIRST:-} " in *" $(basename "$t" .sh) "*) ;; *) order+=("$t") ;; esac; done
    # E2E_ALONE (timing-sensitive: kill -9 at chosen moments of a write) last, one at a time
    pooled=() serial=()
    for t in "${order[@]}"; do
        case " ${E2E_ALONE:-} " in *" $(basename "$t" .sh) "*) serial+=("$t") ;; *) pooled+=("$t") ;; esac
    done
    order=("${pooled[@]}" "${serial[@]}")
    logs=$tmp/logs
    mkdir -p "$logs"
    printed=0
    flush() {
        local n p f
        while [ $printed -lt ${#order[@]} ]; do
            n=$(basename "${order[$printed]}" .sh)
            [ -e "$logs/$n.done" ] || return 0
            grep -v '^e2e: [0-9]* passed, [0-9]* failed$' "$logs/$n.log"
            read -r p f < <(sed -n 's/^e2e: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$logs/$n.log" | tail -1)
            if [ -n "${p:-}" ]; then
                pass=$((pass + p)) fail=$((fail + f))
            else
                bad "$n.sh did not finish (see its output above)"
            fi
            printed=$((printed + 1))
        done
    }
    for t in "${pooled[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
            wait -n
            flush
        done
        n=$(basename "$t" .sh)
        { E2E_ONE=$t bash "$0" >"$logs/$n.log" 2>&1; touch "$logs/$n.done"; } &
    done
    wait
    flush
    for t in "${serial[@]}"; do
        n=$(basename "$t" .sh)
        E2E_ONE=$t bash "$0" >"$logs/$n.log" 2>&1
        touch "$logs/$n.done"
        flush
    done
    echo "e2e: $(($(date +%s) - start)) s, $jobs files at a time"
    echo "e2e: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit
fi

for t in "${files[@]}"; do
    [ -e "$t" ] || { bad "no e2e file matches t_${E2E:-*}.sh"; continue; }
    e2e_file=$(basename "$t") e2e_file_t0=$(date +%s) # the files use t, s … themselves
    # shellcheck source=/dev/null
    . "$t"
    echo "# $e2e_file: $(($(date +%s) - e2e_file_t0)) s"
done

[ $((pass + fail)) -gt 0 ] || bad "no check ran for E2E='${E2E:-*}'"
echo "e2e: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
