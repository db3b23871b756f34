# t_kernels.sh: run-time kernel dispatch as a user sees it — --version names the level, KVCHAT_ISA
# forces one, a level the CPU lacks or an unknown name is refused with a warning, and every level
# this CPU runs gives the same greedy text.

v=$("$BIN" --version)
best=$(printf '%s\n' "$v" | sed -n 's/^kernels: \([a-z0-9]*\) .*/\1/p')
levels=$(printf '%s\n' "$v" | sed -n 's/^kernel levels this CPU can run: \(.*\) (KVCHAT_ISA.*/\1/p')
if [ -n "$best" ] && printf '%s\n' "$levels" | grep -qw portable; then
    ok "kernels: --version names the level in use ($best) and the levels this CPU runs ($levels)"
else
    bad "kernels: --version names the levels" "$v"
fi

v=$(KVCHAT_ISA=portable "$BIN" --version)
if printf '%s\n' "$v" | grep -q '^kernels: portable (portable C), forced by KVCHAT_ISA; best on this CPU: '"$best"; then
    ok "kernels: KVCHAT_ISA=portable forces the portable level"
else
    bad "kernels: KVCHAT_ISA=portable forces the portable level" "$v"
fi

out=$(KVCHAT_ISA=sse9 "$BIN" -m "$MODEL" -p "Once" -n 2 --temp 0 2>&1 >/dev/null)
if printf '%s\n' "$out" | grep -q "kvchat: KVCHAT_ISA=sse9 is not a kernel level (portable, avx2, avxvnni, avx512, neon, dotprod, i8mm); using $best"; then
    ok "kernels: an unknown KVCHAT_ISA is a warning naming the levels and the one used"
else
    bad "kernels: an unknown KVCHAT_ISA is a warning" "$out"
fi

case $(uname -m) in x86_64) other=i8mm ;; *) other=avx512 ;; esac
out=$(KVCHAT_ISA=$other "$BIN" -m "$MODEL" -p "Once" -n 2 --temp 0 2>&1 >/dev/null)
if printf '%s\n' "$out" | grep -q "kvchat: KVCHAT_ISA=$other: this CPU lacks it; using $best"; then
    ok "kernels: a level this CPU lacks ($other) is refused with a warning"
else
    bad "kernels: a level this CPU lacks is refused" "$out"
fi

ref=$("$BIN" -m "$MODEL" -p "Once upon a time" -n 48 --temp 0 2>/dev/null)
same=1
for l in $levels; do
    got=$(KVCHAT_ISA=$l "$BIN" -m "$MODEL" -p "Once upon a time" -n 48 --temp 0 2>/dev/null)
    [ "$got" = "$ref" ] || { same=0; bad "kernels: greedy text at $l equals $best's" "$got"; }
done
[ "$same" = 1 ] && [ -n "$ref" ] && ok "kernels: greedy stories260K text is the same at every level ($levels)"

# One binary for every x86-64 CPU: the same file, built on this machine (whatever it has), runs
# under qemu-x86_64 on emulated CPUs older than it — the x86-64 baseline (qemu64: SSE2, no AVX),
# x86-64-v2 (Nehalem), an AVX2 CPU without FMA or F16C, and x86-64-v3 (Haswell) — picks the level
# each has (an AVX instruction outside the kernels' own files would stop the first two with
# SIGILL) and writes the same greedy text. qemu-user comes with the aarch64 tests' packages.
if [ "$(uname -m)" = x86_64 ] && command -v qemu-x86_64 >/dev/null 2>&1; then
    for cv in qemu64:portable Nehalem:portable max,-fma:portable max,-f16c:portable Haswell:avx2; do
        cpu=${cv%%:*} want=${cv#*:}
        got_v=$(qemu-x86_64 -cpu "$cpu" "$BIN" --version 2>/dev/null | sed -n 's/^kernels: \([a-z0-9]*\) .*/\1/p')
        got=$(qemu-x86_64 -cpu "$cpu" "$BIN" -m "$MODEL" -p "Once upon a time" -n 48 --temp 0 2>"$tmp/qemu.err")
        rc=$?
        if [ "$got_v" = "$want" ] && [ $rc = 0 ] && [ "$got" = "$ref" ]; then
            ok "kernels: on an emulated $cpu CPU the same binary runs the $want level and writes the same greedy text"
        else
            bad "kernels: on an emulated $cpu CPU (want $want, got '$got_v', exit $rc)" "$got $(tail -c 300 "$tmp/qemu.err")"
        fi
    done
    out=$(KVCHAT_ISA=avx2 qemu-x86_64 -cpu qemu64 "$BIN" -m "$MODEL" -p "Once" -n 2 --temp 0 2>&1 >/dev/null)
    if printf '%s\n' "$out" | grep -q "kvchat: KVCHAT_ISA=avx2: this CPU lacks it; using portable"; then
        ok "kernels: KVCHAT_ISA=avx2 on an emulated x86-64 baseline CPU is refused with a warning, not SIGILL"
    else
        bad "kernels: KVCHAT_ISA=avx2 on an emulated baseline CPU" "$out"
    fi
else
    echo "skip - kernels: qemu-x86_64 runs (not an x86-64 host with qemu-user)"
fi
