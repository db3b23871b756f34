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
