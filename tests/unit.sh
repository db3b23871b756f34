#!/usr/bin/env bash
# unit.sh: runs the cmocka unit test binaries JOBS at a time (make unit), each one's output in its own log printed whole, in order.
# Usage: tests/unit.sh LOG_DIR TEST... (env UNIT_JOBS, default 2; UNIT_ALONE, names that run alone;
# UNIT_TIMEOUT, seconds per binary, default 900)
#
# The binaries run in the order given (make unit lists the longest first, so the short ones fill
# the other slot at the end); a log is printed as soon as it and every one before it are done, so
# the output reads as a serial run's. Each ends with "== NAME: W s (user U s, sys S s)": bash's
# `time` of the binary (user + sys are its CPU seconds, wall is longer when it waited for a core).
# The tests named in UNIT_ALONE (timing-sensitive: they slice work by the clock or kill a writer
# at chosen moments) run after the others, one at a time, with nothing beside them. The last line
# is "unit: N passed, N failed" (the one before it: wall and CPU seconds of all); the exit status
# is 1 when one failed.
set -u
logs=$1
shift
jobs=${UNIT_JOBS:-2}
limit=${UNIT_TIMEOUT:-900} # seconds per binary (the longest, test_arch under ASan, takes ~100): a hang fails, not CI
alone=" ${UNIT_ALONE:-} "
mkdir -p "$logs"
start=$(date +%s)

pooled=() serial=()
for t in "$@"; do
    case $alone in *" $(basename "$t") "*) serial+=("$t") ;; *) pooled+=("$t") ;; esac
done
order=("${pooled[@]}" "${serial[@]}")

# run1 TEST: the binary with its output in LOG_DIR/NAME.log, its times and exit status beside it
run1() {
    local n
    n=$(basename "$1")
    rm -f "$logs/$n.rc" "$logs/$n.time"
    local TIMEFORMAT='%R %U %S'
    { time timeout "$limit" "$1" >"$logs/$n.log" 2>&1; echo $? >"$logs/$n.rc"; } 2>"$logs/$n.time"
}

pass=0 fail=0 printed=0 cpu=0
# print every finished log whose predecessors are printed
flush() {
    local t n rc wall user sys
    while [ $printed -lt ${#order[@]} ]; do
        t=${order[$printed]}
        n=$(basename "$t")
        [ -s "$logs/$n.rc" ] || return 0
        read -r rc <"$logs/$n.rc"
        read -r wall user sys <"$logs/$n.time"
        echo "== $t"
        cat "$logs/$n.log"
        if [ "$rc" = 0 ]; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1))
            if [ "$rc" = 124 ]; then echo "FAILED: $t did not finish in $limit s (a hang?): stopped"
            else echo "FAILED: $t (exit $rc)"; fi
        fi
        echo "== $t: $wall s (user $user s, sys $sys s)"
        cpu=$(awk -v c="$cpu" -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", c + u + s }')
        printed=$((printed + 1))
    done
}

for t in "${pooled[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n
        flush
    done
    run1 "$t" &
done
wait
flush
for t in "${serial[@]}"; do
    run1 "$t"
    flush
done

echo "unit: $(($(date +%s) - start)) s wall, $cpu s CPU (user + sys), $jobs at a time"
echo "unit: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$printed" -eq $# ]
