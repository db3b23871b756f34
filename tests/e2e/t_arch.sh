# The newer architectures end to end: small gen-model files of each load, `kvchat models` shows their
# architecture, greedy text is the same with 1 and 2 threads, and a full context is a clear stop
# where context shift cannot re-rotate the cache. (Their logits against llama.cpp: test_arch.c.)
ar=$tmp/arch
mkdir -p "$ar/data/kvchat/models"
arrun() { env -u KVCHAT_MODEL XDG_DATA_HOME="$ar/data" "$BIN" "$@"; }
arch_of() { case $1 in qwen3-0.6b) echo qwen3;; smollm3-3b) echo smollm3;; granite-3-2b) echo granite;;
    olmo2-1b) echo olmo2;; gemma2-2b) echo gemma2;; gemma3-1b|gemma3-4b) echo gemma3;; phi4-mini) echo phi3;; ministral3-3b) echo mistral3;; internlm2.5-1.8b) echo internlm2;; esac; }
shapes="qwen3-0.6b smollm3-3b granite-3-2b olmo2-1b gemma2-2b gemma3-1b gemma3-4b phi4-mini ministral3-3b internlm2.5-1.8b"
gen_ok=1
for s in $shapes; do
    layers=2; case $s in gemma3-*) layers=6;; esac; [ "$s" = smollm3-3b ] && layers=4
    "$BIN" gen-model --shape "$s" --type q8_0 --layers $layers --vocab 512 --ff 256 --swa 8 --seed 2 \
        -o "$ar/data/kvchat/models/$s.gguf" 2>"$ar/e" || { gen_ok=0; bad "gen-model --shape $s" "$(cat "$ar/e")"; }
done
[ $gen_ok = 1 ] && ok "gen-model writes every new architecture's shape"
arrun models >"$ar/m" 2>&1
for s in $shapes; do
    a=$(arch_of "$s")
    if grep -Eq "^$s +[0-9.]+ MiB +[0-9.]+M +$a +Q8_0 " "$ar/m"; then ok "kvchat models shows $s as $a"
    else bad "kvchat models shows $s as $a" "$(cat "$ar/m")"; fi
    arrun -m "$s" -p "abc" -n 24 --temp 0 -t 1 >"$ar/t1" 2>"$ar/e1"; rc1=$?
    arrun -m "$s" -p "abc" -n 24 --temp 0 -t 2 >"$ar/t2" 2>"$ar/e2"; rc2=$?
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(wc -c <"$ar/t1")" -gt 3 ] && cmp -s "$ar/t1" "$ar/t2"; then
        ok "$a generates, same greedy text with 1 and 2 threads"
    else bad "$a generates, same greedy text with 1 and 2 threads" "rc=$rc1/$rc2 $(head -c 300 "$ar/e1")"; fi
done
# context shift: refused with a message for gemma3 (a second RoPE base) and smollm3 (NoPE layers),
# done for qwen3 (one rotation for all layers)
for s in gemma3-1b smollm3-3b; do
    arrun -m "$s" -p "abc" -n 100 -c 32 --temp 0 >/dev/null 2>"$ar/e"; rc=$?
    if [ $rc -ne 0 ] && grep -q "context shift is not supported for $(arch_of "$s")" "$ar/e"; then
        ok "$(arch_of "$s"): full context stops with a clear message (no shift)"
    else bad "$(arch_of "$s"): full context stops with a clear message" "rc=$rc $(cat "$ar/e")"; fi
done
arrun -m qwen3-0.6b -p "abc" -n 100 -c 32 --temp 0 --json >"$ar/o" 2>"$ar/e"; rc=$?
if [ $rc -eq 0 ] && tail -1 "$ar/o" | grep -q '"finish": "length".*"n_generated": 100,'; then
    ok "qwen3: context shift continues past a full context (100 tokens in 32)"
else bad "qwen3: context shift continues past a full context" "rc=$rc $(cat "$ar/e")"; fi
# mistral3: one rotation for all layers (YaRN's factors in the re-rotation too), so it shifts
arrun -m ministral3-3b -p "abc" -n 100 -c 32 --temp 0 --json >"$ar/o" 2>"$ar/e"; rc=$?
if [ $rc -eq 0 ] && tail -1 "$ar/o" | grep -q '"finish": "length".*"n_generated": 100,'; then
    ok "mistral3: context shift continues past a full context (100 tokens in 32)"
else bad "mistral3: context shift continues past a full context" "rc=$rc $(cat "$ar/e")"; fi
