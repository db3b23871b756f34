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

# ---- mixtures of experts: qwen3moe, qwen2moe, olmoe -----------------------------------------------
moe_shapes="qwen3-30b-a3b qwen1.5-moe-a2.7b olmoe-1b-7b"
moe_arch() { case $1 in qwen3-30b-a3b) echo qwen3moe;; qwen1.5-moe-a2.7b) echo qwen2moe;; olmoe-1b-7b) echo olmoe;; esac; }
for s in $moe_shapes; do
    "$BIN" gen-model --shape "$s" --type q8_0 --layers 2 --vocab 512 --ff 128 --experts 16 --experts-used 4 \
        --ff-exp 64 --ff-shexp 96 --seed 2 -o "$ar/data/kvchat/models/$s.gguf" 2>"$ar/e" ||
        bad "gen-model --shape $s" "$(cat "$ar/e")"
done
arrun models >"$ar/m" 2>&1
arrun models --json >"$ar/mj" 2>&1
for s in $moe_shapes; do
    a=$(moe_arch "$s")
    # total/active: 12 of the 16 experts' three 2048 x 64 matrices per layer are not used per token
    # (olmoe's experts are --ff 128 wide)
    fx=64; [ "$a" = olmoe ] && fx=128
    tot=$(sed -n "/\"name\": \"$s\"/s/.*\"n_params\": \([0-9]*\).*/\1/p" "$ar/mj")
    act=$(sed -n "/\"name\": \"$s\"/s/.*\"n_params_active\": \([0-9]*\).*/\1/p" "$ar/mj")
    if grep -Eq "^$s +[0-9.]+ MiB +[0-9.]+M/[0-9.]+M +$a +Q8_0 " "$ar/m" && [ -n "$tot" ] &&
        [ "$((tot - act))" -eq $((2 * 3 * 12 * 2048 * fx)) ]; then
        ok "kvchat models shows $s as $a with total/active parameters"
    else bad "kvchat models shows $s as $a with total/active parameters" "$(cat "$ar/m") $tot $act"; fi
    arrun -m "$s" -p "abc" -n 24 --temp 0 -t 1 >"$ar/t1" 2>"$ar/e1"; rc1=$?
    arrun -m "$s" -p "abc" -n 24 --temp 0 -t 2 >"$ar/t2" 2>"$ar/e2"; rc2=$?
    KVCHAT_MOE_MAPPED=1 arrun -m "$s" -p "abc" -n 24 --temp 0 -t 2 >"$ar/t3" 2>"$ar/e3"; rc3=$?
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ "$(wc -c <"$ar/t1")" -gt 3 ] && cmp -s "$ar/t1" "$ar/t2" &&
        cmp -s "$ar/t1" "$ar/t3"; then
        ok "$a generates, same greedy text with 1 and 2 threads and with the experts mapped"
    else bad "$a generates, same greedy text with 1 and 2 threads and mapped" "rc=$rc1/$rc2/$rc3 $(head -c 300 "$ar/e1")"; fi
done

# the real Qwen3-30B-A3B experts (128 of 768, 8 per token), one layer, Q4_0: with the experts left in
# the mapping a few tokens touch a fraction of them (resident memory far below the file); packed,
# all of them; bench's decode bytes count 8 of 128 experts
"$BIN" gen-model --shape qwen3-30b-a3b --type q4_0 --layers 1 --vocab 512 -o "$ar/big.gguf" 2>"$ar/e" ||
    bad "gen-model qwen3-30b-a3b real experts" "$(cat "$ar/e")"
KVCHAT_MOE_MAPPED=1 "$BIN" bench -m "$ar/big.gguf" -p 1 -n 1 -r 1 -t 2 >"$ar/b1" 2>&1
"$BIN" bench -m "$ar/big.gguf" -p 1 -n 1 -r 1 -t 2 >"$ar/b2" 2>&1
rss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB = file \([0-9.]*\) MiB.*/\1 \2/p' "$1"; }
set -- $(rss "$ar/b1") ; r1=${1:-0} f1=${2:-1}
set -- $(rss "$ar/b2") ; r2=${1:-0}
wpt=$(sed -n 's/.*decode reads \([0-9.]*\) MiB of weights per token.*/\1/p' "$ar/b1")
if awk -v r="$r1" -v f="$f1" 'BEGIN { exit !(r > 0 && r < f / 2) }' &&
    awk -v r="$r2" -v f="$f1" 'BEGIN { exit !(r > f * 0.9) }'; then
    ok "MoE experts left mapped: peak RSS $r1 MiB of a $f1 MiB file (packed: $r2 MiB)"
else bad "MoE experts left mapped: peak RSS below half the file" "$(tail -3 "$ar/b1") / $(tail -3 "$ar/b2")"; fi
# per token: attention (10 MiB) + router (1) + 8 of the 128 experts (20 MiB at Q4_0) + the output, not 330 MiB
if awk -v w="$wpt" 'BEGIN { exit !(w > 20 && w < 40) }'; then ok "bench counts the selected experts' bytes ($wpt MiB per token)"
else bad "bench counts the selected experts' bytes" "$(tail -3 "$ar/b1")"; fi

# the chat with a MoE model: the status bar shows total and active parameters; /show experts draws
# the last reply's per-layer histogram; a dense model says it has none (tmux, own socket)
if command -v tmux >/dev/null 2>&1; then
    MT="tmux -L kvchat-moe-$$"
    mcap() { $MT capture-pane -p -t m 2>/dev/null; }
    mwait() { # REGEX [SECONDS]
        local end=$(($(date +%s) + ${2:-60}))
        while [ "$(date +%s)" -le "$end" ]; do mcap >"$ar/screen"; grep -qE -- "$1" "$ar/screen" && return 0; sleep 0.2; done
        return 1
    }
    mstart() { # model — each on its own tmux socket: a server still exiting takes the next session down
        $MT kill-server >/dev/null 2>&1
        MT="tmux -L kvchat-moe-$$-$1"
        $MT -f /dev/null new-session -d -s m -x 160 -y 45 \
            "env LANG=C.UTF-8 TERM=tmux-256color XDG_DATA_HOME='$ar/data' XDG_STATE_HOME='$ar/state' XDG_CONFIG_HOME='$ar/cfg' '$BIN' -m '$1' --db '$ar/c.db' -t 2 --temp 0 -n 12; sleep 30"
    }
    mstart qwen3-30b-a3b
    if mwait 'qwen3moe Q8_0 │ 53M, 43M active' 30; then ok "chat status bar: qwen3moe with total and active parameters"
    else bad "chat status bar shows total and active parameters" "$(head -3 "$ar/screen")"; fi
    $MT send-keys -t m "/show experts" Enter
    mwait 'no reply yet' 20 && ok "/show experts before any reply: says so" || bad "/show experts before a reply" "$(tail -8 "$ar/screen")"
    $MT send-keys -t m "once upon" Enter
    mwait '│ ready' 60 >/dev/null
    sleep 0.5
    $MT send-keys -t m "/show experts" Enter
    if mwait 'L1 +[^ ].*[0-9]+/16 used · top e[0-9]+ [0-9]+%' 20 && grep -Eq 'L0 .*/16 used' "$ar/screen" &&
        grep -q 'selections per layer over 16 experts' "$ar/screen"; then
        ok "/show experts: a histogram line per layer after a reply"
    else bad "/show experts: a histogram line per layer" "$(tail -12 "$ar/screen")"; fi
    mstart qwen3-0.6b
    mwait '│ ready' 30 >/dev/null
    $MT send-keys -t m "/show experts" Enter
    if mwait 'qwen3 is not a mixture-of-experts model' 20; then ok "/show experts on a dense model: says it is not MoE"
    else bad "/show experts on a dense model" "$(tail -6 "$ar/screen")"; fi
    $MT kill-server >/dev/null 2>&1
fi
