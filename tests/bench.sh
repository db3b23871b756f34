#!/bin/sh
# bench.sh: kvchat vs llama.cpp, side by side in the same run (`make bench`; not part of `make test`).
#
# The reference is llama.cpp's own llama-bench, built natively from the source the npm package
# node-llama-cpp ships (../shared/bench/build-llamacpp.sh; BENCH_LLAMA_BIN names another build,
# e.g. one configured for AVX2 only). Writes the TinyLlama-shaped synthetic models (kvchat
# gen-model) to $BENCH_DIR if missing, then for each model runs `kvchat bench` and llama-bench back
# to back, one repetition each, ROUNDS times over, and prints the medians, the ratios kvchat /
# llama.cpp (the median of the per-round ratios: each pair ran seconds apart, which cancels most of
# a shared machine's drift), kvchat's decode bandwidth and its fraction of the read bandwidth
# kvchat bench measured on this machine with the same threads. KVCHAT_ISA picks kvchat's kernels.
#
# Environment: KVCHAT (./kvchat), SHARED (../shared), BENCH_DIR (/tmp/kvchat-models),
# BENCH_THREADS (2), BENCH_PP ("128 512"), BENCH_TG (32), BENCH_ROUNDS (5), BENCH_TYPES
# ("q4_0 q8_0 q4_k_m q5_k_m q6_k f16"), BENCH_SHAPES ("tinyllama"; any gen-model shape, e.g. "qwen3-0.6b gemma3-1b ministral3-3b"),
# BENCH_DEPTHS ("2048 4096": tg at these depths, for BENCH_DEPTH_TYPES, default "q4_0"; set and empty: none),
# BENCH_STORIES (1: also stories260K on 1 thread, pp128 / tg256), BENCH_LLAMA (1: run llama.cpp),
# BENCH_LAYERS (the shapes' own layer count; N: gen-model --layers N, files named SHAPE-TYPE-NL.gguf —
# e.g. BENCH_SHAPES=qwen3-30b-a3b BENCH_LAYERS=8 for the MoE shape with its real experts),
# BENCH_LOAD (1: a `load` row per model: wall and CPU time and peak resident memory of
# `kvchat -m F -p Hello -n 1` against llama.cpp's llama-simple on the same file, from a warm page
# cache; BENCH_LLAMA_SIMPLE names it).
set -eu
KVCHAT=${KVCHAT:-./kvchat}
SHARED=${SHARED:-../shared}
DIR=${BENCH_DIR:-/tmp/kvchat-models}
TH=${BENCH_THREADS:-2}
PPS=${BENCH_PP:-"128 512"}
TG=${BENCH_TG:-32}
ROUNDS=${BENCH_ROUNDS:-5}
TYPES=${BENCH_TYPES:-"q4_0 q8_0 q4_k_m q5_k_m q6_k f16"}
SHAPES=${BENCH_SHAPES:-tinyllama}
DEPTHS=${BENCH_DEPTHS-"2048 4096"} # set and empty: no depth runs
DEPTH_TYPES=${BENCH_DEPTH_TYPES:-q4_0}
LLAMA=${BENCH_LLAMA:-1}
LAYERS=${BENCH_LAYERS:-}
mfile() { echo "$DIR/$1-$2${LAYERS:+-${LAYERS}L}.gguf"; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvchat-bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
comma() { echo "$*" | tr ' ' ','; }

if [ "$LLAMA" = 1 ]; then
  LB=${BENCH_LLAMA_BIN:-}
  if [ -z "$LB" ]; then
    echo "building llama.cpp's llama-bench natively (once; ../shared/bench/build-llamacpp.sh)" >&2
    LB="$(sh "$SHARED/bench/build-llamacpp.sh" llama-bench | tail -n 1)/llama-bench"
  fi
  [ -x "$LB" ] || { echo "bench.sh: no llama-bench at $LB" >&2; exit 1; }
  LS=${BENCH_LLAMA_SIMPLE:-$(dirname "$LB")/llama-simple}
  [ -x "$LS" ] || LS=${KVCHAT_REF_DIR:-/tmp/kvchat-ref}/llama.cpp/build/bin/llama-simple
  if [ "${BENCH_LOAD:-1}" = 1 ] && [ ! -x "$LS" ] && [ -z "${BENCH_LLAMA_BIN:-}${BENCH_LLAMA_SIMPLE:-}" ]; then
    LS="$(sh "$SHARED/bench/build-llamacpp.sh" llama-simple | tail -n 1)/llama-simple"
  fi
fi

mkdir -p "$DIR"
for s in $SHAPES; do
  for t in $TYPES; do
    f=$(mfile "$s" "$t")
    if [ ! -s "$f" ]; then
      echo "writing $f (random weights, $s shape)" >&2
      "$KVCHAT" gen-model --shape "$s" --type "$t" ${LAYERS:+--layers "$LAYERS"} -o "$f"
    fi
  done
done

# One round of kvchat: lines "test median gbps fraction gflops fma-fraction" ("tg32@d2048" for depths).
ours() { # model threads pp-list tg depth-list
  "$KVCHAT" bench -m "$1" -t "$2" -p "$3" -n "$4" -d "$5" -r 1 2>/dev/null |
    awk -F'|' '$7 ~ /(pp|tg)[0-9]/ {
      t = $7; gsub(/ /, "", t); sub(/@d0$/, "", t); m = $9; gsub(/ /, "", m); g = $10; gsub(/ /, "", g)
      f = $11; gsub(/[ %]/, "", f); c = $12; gsub(/ /, "", c); p = $13; gsub(/[ %]/, "", p)
      print t, m, (g == "" ? "-" : g), (f == "" ? "-" : f), (c == "" ? "-" : c), (p == "" ? "-" : p) }'
}
# One round of llama-bench: lines "test t/s".
theirs() { # model threads pp-list tg depth-list
  "$LB" -m "$1" -t "$2" -p "$3" -n "$4" -d "$5" -r 1 -o jsonl 2>/dev/null |
    awk '{
      p = $0; sub(/.*"n_prompt": */, "", p); sub(/[^0-9].*/, "", p)
      g = $0; sub(/.*"n_gen": */, "", g); sub(/[^0-9].*/, "", g)
      d = $0; sub(/.*"n_depth": */, "", d); sub(/[^0-9].*/, "", d)
      a = $0; sub(/.*"avg_ts": */, "", a); sub(/[^0-9.e+-].*/, "", a)
      t = (p > 0 ? "pp" p : "tg" g) (d > 0 ? "@d" d : ""); print t, a }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else printf "%.2f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Appends "test ours theirs gbps fraction gflops fma-fraction" per round to $TMP/$label.
run_model() { # label model threads pp-list tg depth-list
  label=$1 m=$2 th=$3 pp=$4 tg=$5 dl=$6
  r=1
  while [ "$r" -le "$ROUNDS" ]; do
    ours "$m" "$th" "$pp" "$tg" "$dl" > "$TMP/o"
    : > "$TMP/l"
    [ "$LLAMA" = 1 ] && theirs "$m" "$th" "$pp" "$tg" "$dl" > "$TMP/l"
    awk 'FILENAME == ARGV[1] { l[$1] = $2; next } { print $1, $2, ($1 in l ? l[$1] : "-"), $3, $4, $5, $6 }' "$TMP/l" "$TMP/o" \
      > "$TMP/r"
    cat "$TMP/r" >> "$TMP/$label"
    echo "  $label round $r: $(awk '{ printf "%s %s/%s  ", $1, $2, $3 }' "$TMP/r")" >&2
    r=$((r + 1))
  done
}

# Load to first token, one round: "load kvchat_ms llama_ms kvchat_cpu_ms llama_cpu_ms kvchat_rss_mib
# llama_rss_mib" appended to $TMP/$label.load (CPU = user + sys and the peak RSS: "-" without GNU time).
timed() { # command... → "wall_ms cpu_ms rss_mib"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%e %U %S %M' -o "$TMP/time" "$@" >/dev/null 2>&1 || true
    awk '{ printf "%.0f %.0f %.0f\n", $1 * 1000, ($2 + $3) * 1000, $4 / 1024 }' "$TMP/time"
  else
    t0=$(date +%s%N); "$@" >/dev/null 2>&1 || true; t1=$(date +%s%N)
    echo "$(( (t1 - t0) / 1000000 )) - -"
  fi
}
load_round() { # label model
  o=$(timed "$KVCHAT" -m "$2" -t "$TH" -p Hello -n 1)
  l="- - -"
  [ "$LLAMA" = 1 ] && [ -x "${LS:-}" ] && l=$(timed "$LS" -m "$2" -n 1 Hello)
  echo "$o $l" | awk '{ print "load", $1, $4, $2, $5, $3, $6 }' >> "$TMP/$1.load"
}
load_summary() { # label
  f="$TMP/$1.load"
  [ -s "$f" ] || return 0
  k=$(awk '{ print $2 }' "$f" | median); l=$(awk '$3 != "-" { print $3 }' "$f" | median)
  r=$(awk '$3 != "-" && $2 > 0 { print $3 / $2 }' "$f" | median)
  kc=$(awk '$4 != "-" { print $4 }' "$f" | median); lc=$(awk '$5 != "-" { print $5 }' "$f" | median)
  met=$(echo "$r" | awk '$1 == "-" { print "?"; exit } { print ($1 >= 1.0 ? "yes" : "NO") }')
  printf '| %s | load ms (-p Hello -n 1) | %s | %s | %s | >= 1.0 | %s | CPU ms %s vs %s |\n' "$1" "$k" "$l" "$r" "$met" "$kc" "$lc"
  # peak resident memory of the same runs; ratio llama.cpp / kvchat (>= 1: no more memory)
  km=$(awk '$6 != "" && $6 != "-" { print $6 }' "$f" | median); lm=$(awk '$7 != "" && $7 != "-" { print $7 }' "$f" | median)
  rm_=$(awk '$6 != "" && $6 != "-" && $7 != "-" && $6 > 0 { print $7 / $6 }' "$f" | median)
  mm=$(echo "$rm_" | awk '$1 == "-" { print "?"; exit } { print ($1 >= 1.0 ? "yes" : "NO") }')
  [ "$km" = "-" ] || printf '| %s | peak RSS MiB (same runs) | %s | %s | %s | >= 1.0 | %s | |\n' "$1" "$km" "$lm" "$rm_" "$mm"
}

summary() { # label target_pp target_tg target_depth
  label=$1 tpp=$2 ttg=$3 tdp=$4 f="$TMP/$label"
  for t in $(awk '{ print $1 }' "$f" | awk '!s[$0]++'); do
    k=$(awk -v t="$t" '$1 == t && $2 != "-" { print $2 }' "$f" | median)
    l=$(awk -v t="$t" '$1 == t && $3 != "-" { print $3 }' "$f" | median)
    r=$(awk -v t="$t" '$1 == t && $2 != "-" && $3 != "-" && $3 > 0 { print $2 / $3 }' "$f" | median)
    g=$(awk -v t="$t" '$1 == t && $4 != "-" { print $4 }' "$f" | median)
    fr=$(awk -v t="$t" '$1 == t && $5 != "-" { print $5 }' "$f" | median)
    gf=$(awk -v t="$t" '$1 == t && $6 != "" && $6 != "-" { print $6 }' "$f" | median)
    pf=$(awk -v t="$t" '$1 == t && $7 != "" && $7 != "-" { print $7 }' "$f" | median)
    case $t in pp*) tg=$tpp ;; *@d*) tg=$tdp ;; *) tg=$ttg ;; esac
    met=$(echo "$r $tg" | awk '$2 == "-" { print "-"; exit } $1 == "-" { print "?"; exit } { print ($1 >= $2 ? "yes" : "NO") }')
    case $t in pp*) bw="$gf GFLOP/s = $(echo "$pf" | awk '$1 == "-" { print "-"; exit } { printf "%.0f%%", $1 }') of FMA peak" ;; *) bw="$g GB/s = $(echo "$fr" | awk '$1 == "-" { print "-"; exit } { printf "%.0f%%", $1 }')" ;; esac
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$t" "$k" "$l" "$r" \
      "$( [ "$tg" = "-" ] && echo - || echo ">= $tg")" "$met" "$bw"
  done
}

isa=$("$KVCHAT" --version | sed -n 's/^kernels: \([a-z0-9]*\).*/\1/p')
echo "kvchat bench ($isa kernels) vs llama.cpp's llama-bench (${LB:-not run}), $ROUNDS rounds of one repetition, back to back" >&2
for s in $SHAPES; do
  for t in $TYPES; do
    run_model "$s-$t" "$(mfile "$s" "$t")" "$TH" "$(comma $PPS)" "$TG" 0
    if [ "${BENCH_LOAD:-1}" = 1 ]; then
      r=1; while [ "$r" -le "$ROUNDS" ]; do load_round "$s-$t" "$(mfile "$s" "$t")"; r=$((r + 1)); done
      echo "  $s-$t load: $(awk '{ printf "%s/%s ms  ", $2, $3 }' "$TMP/$s-$t.load")" >&2
    fi
    if [ -n "$DEPTHS" ]; then
      case " $DEPTH_TYPES " in *" $t "*) run_model "$s-$t" "$(mfile "$s" "$t")" "$TH" 0 "$TG" "$(comma $DEPTHS)" ;; esac
    fi
  done
done
STORIES="$(cd "$SHARED/models" 2>/dev/null && pwd)/stories260K.gguf"
if [ "${BENCH_STORIES:-1}" = 1 ] && [ -s "$STORIES" ]; then
  run_model "stories260K-t1" "$STORIES" 1 128 256 0
fi

echo
echo "kvchat kernels: $isa. Medians of $ROUNDS rounds; ratio = median of the per-round kvchat / llama.cpp ratios;"
echo "targets from the portable-speed issue. Decode bandwidth = weight bytes per token x t/s, and its share of the"
echo "read bandwidth kvchat bench measured here with the same threads; prefill GFLOP/s = the forward pass's"
echo "floating-point operations per token x t/s, and its share of the FP32 FMA peak kvchat bench measured likewise."
echo "load = wall time of the one-shot \`kvchat -m F -p Hello -n 1\` vs llama-simple (warm page cache); its ratio is"
echo "llama.cpp ms / kvchat ms (>= 1 = no slower), beside the CPU time (user + sys) of each; peak RSS = the same runs'"
echo "largest resident set (GNU time's %M), its ratio llama.cpp / kvchat (>= 1 = no more memory)."
echo
echo "| model | test | kvchat t/s | llama.cpp t/s | ratio | target | met | kvchat decode BW / prefill FLOP/s |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"
for s in $SHAPES; do for t in $TYPES; do lbl="$s-$t"; summary "$lbl" 1.25 1.25 1.0; load_summary "$lbl"; done; done
[ -s "$TMP/stories260K-t1" ] && summary "stories260K-t1" 1.25 3 -
exit 0
