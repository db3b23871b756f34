#!/bin/sh
# aarch64.sh: runs the cross-compiled kernel / ops / golden tests under qemu-aarch64 at every aarch64 kernel level, and checks that the CPU detection refuses levels an emulated CPU lacks.
# Usage: tests/aarch64.sh BUILD_DIR TEST... (called by `make test-aarch64`; KVCHAT_SHARED, A64_JOBS,
# A64_TIMEOUT: seconds per run, default 1200, after which a run is stopped and fails)
#
# Each test binary runs once per level (KVCHAT_ISA=portable, neon, dotprod, i8mm) on qemu's
# `-cpu max`, which implements dotprod and i8mm, A64_JOBS runs at a time. A level the binary
# cannot select makes tu_run_every_isa fail, so a pass means the level really ran.
# test_quant and test_ops run whole at every level. test_golden (1.5-7 minutes a level under
# emulation) runs whole at dotprod, the level most ARM machines pick; at neon and i8mm its
# quantized-model cases (the float kernels are the same code at the three NEON levels; the
# integer dot products differ), at portable the stories260K prompts (the portable C is tested
# whole by `make unit`). A64_GOLDEN=all runs every case at every level.
# The programs run on the multiarch libc6:arm64 (/lib/ld-linux-aarch64.so.1), not with
# QEMU_LD_PREFIX=/usr/aarch64-linux-gnu: that prefix has the cross toolchain's ld.so, while the
# arm64 libraries' libc.so.6 comes from /lib/aarch64-linux-gnu, and the mismatched pair hangs in
# the first pthread_create. OPENBLAS_NUM_THREADS=1: the tests' matmuls run on the engine's own
# thread pool; OpenBLAS's idle workers would only spin on the shared cores.
set -u
dir=$1
shift
unset QEMU_LD_PREFIX
export OPENBLAS_NUM_THREADS=1
export KVCHAT_SHARED="${KVCHAT_SHARED:-../shared}"
levels="portable neon dotprod i8mm"
logs="$dir/logs"
rm -rf "$logs"
mkdir -p "$logs"
start=$(date +%s)

# the cmocka name pattern of the cases a test runs at a level (-: all)
only() {
    [ "$1" = test_golden ] && [ "${A64_GOLDEN:-}" != all ] || { echo -; return 0; }
    case $2 in
    portable) echo 'golden/stories260K.p*' ;;
    neon | i8mm) echo '*q?_*' ;; # q8_0, q4_0, q4_k_m, q5_k_m, q6_k
    *) echo - ;;
    esac
}

# the longest run first (test_golden @dotprod), so the other runs fill the second job slot
for t in "$@"; do for l in dotprod portable neon i8mm; do echo "$t $l $(only "$t" "$l")"; done; done |
    xargs -P "${A64_JOBS:-2}" -L 1 sh -c '
        s=$(date +%s)
        o=$3; [ "$o" = - ] && o=
        KVCHAT_ISA=$2 KVCHAT_TEST_ONLY=$o timeout "'"${A64_TIMEOUT:-1200}"'" qemu-aarch64 -cpu max "'"$dir"'/tests/$1" \
            >"'"$logs"'/$1.$2.log" 2>&1
        echo "$? $(( $(date +%s) - s ))" >"'"$logs"'/$1.$2.rc"' sh

pass=0 fail=0 runs_bad=0
for t in "$@"; do
    for l in $levels; do
        log="$logs/$t.$l.log"
        read -r rc secs <"$logs/$t.$l.rc"
        # cmocka's closing lines of every group in the log: "[  PASSED  ] N test(s)." / "[  FAILED  ] N test(s), ..."
        p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
        f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
        pass=$((pass + p))
        fail=$((fail + f))
        if [ "$rc" = 0 ] && [ "$p" -gt 0 ]; then
            o=$(only "$t" "$l")
            [ "$o" = - ] && o=
            echo "aarch64: $t @$l: $p passed, $f failed (${secs}s)${o:+, cases $o}"
        else
            runs_bad=$((runs_bad + 1))
            [ "$f" -gt 0 ] || fail=$((fail + 1))
            hang=
            [ "$rc" = 124 ] && hang=": did not finish in ${A64_TIMEOUT:-1200} s, a hang?"
            echo "aarch64: FAILED $t @$l (exit $rc, ${secs}s$hang); its log:"
            sed 's/^/    /' "$log" | tail -40
        fi
    done
done

# detection: an emulated CPU without dotprod (Cortex-A72) / without i8mm (Cortex-A76) must not
# run those levels (getauxval AT_HWCAP ASIMDDP / AT_HWCAP2 I8MM)
first=$1
for c in "cortex-a72 dotprod" "cortex-a76 i8mm"; do
    set -- $c
    out=$(KVCHAT_ISA=$2 qemu-aarch64 -cpu "$1" "$dir/tests/$first" 2>&1)
    if [ $? -ne 0 ] && printf '%s\n' "$out" | grep -q "KVCHAT_ISA=$2 is not a level this CPU runs"; then
        pass=$((pass + 1))
        echo "aarch64: -cpu $1 has no $2 level (detection)"
    else
        fail=$((fail + 1))
        runs_bad=$((runs_bad + 1))
        echo "aarch64: FAILED: -cpu $1 ran KVCHAT_ISA=$2:"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    fi
done

echo "aarch64: $(( $(date +%s) - start ))s under qemu-aarch64, levels: $levels"
echo "aarch64: $pass passed, $fail failed"
[ "$runs_bad" -eq 0 ] && [ "$fail" -eq 0 ]
