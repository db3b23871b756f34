#!/bin/sh
# bench.sh: kvchat vs llama.cpp, side by side in the same run (`make bench`; not part of `make test`).
#
# Writes the TinyLlama-shaped synthetic models (kvchat gen-model) to $BENCH_DIR if missing, then
# for each model runs `kvchat bench` and ../shared/bench/llamacpp-bench.sh (llama.cpp from npm)
# back to back, one repetition each, ROUNDS times over, and prints the medians, the ratios
# kvchat / llama.cpp (the median of the per-round ratios: each pair ran seconds apart, which
# cancels most of a shared machine's drift) and the decode bandwidth.
#
# Environment: KVCHAT (./kvchat), SHARED (../shared), BENCH_DIR (/tmp/kvchat-models),
# BENCH_THREADS (2), BENCH_PP (128), BENCH_TG (32), BENCH_ROUNDS (5), BENCH_TYPES
# ("q4_0 q8_0 q4_k_m q5_k_m f16"), BENCH_STORIES (1: also stories260K, decode on 1 thread),
# BENCH_PEAK_GBS (60: the read bandwidth the fractions refer to), BENCH_LLAMA (1: run llama.cpp).
set -eu
KVCHAT=${KVCHAT:-./kvchat}
SHARED=${SHARED:-../shared}
DIR=${BENCH_DIR:-/tmp/kvchat-models}
TH=${BENCH_THREADS:-2}
PP=${BENCH_PP:-128}
TG=${BENCH_TG:-32}
ROUNDS=${BENCH_ROUNDS:-5}
TYPES=${BENCH_TYPES:-"q4_0 q8_0 q4_k_m q5_k_m f16"}
PEAK=${BENCH_PEAK_GBS:-60}
LLAMA=${BENCH_LLAMA:-1}
REF="$SHARED/bench/llamacpp-bench.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvchat-bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM

mkdir -p "$DIR"
for t in $TYPES; do
  f="$DIR/tinyllama-$t.gguf"
  if [ ! -s "$f" ]; then
    echo "writing $f (random weights, TinyLlama-1.1B shape)" >&2
    "$KVCHAT" gen-model --shape tinyllama --type "$t" -o "$f"
  fi
done

# one round of one engine: "pp tg gbps" on stdout (t/s, t/s, GB/s), empty fields on failure
ours() { # model threads pp tg
  "$KVCHAT" bench -m "$1" -t "$2" -p "$3" -n "$4" -r 1 2>/dev/null |
    awk -F'|' -v pp="pp$3" -v tg="tg$4" '
      $7 ~ pp { gsub(/ /, "", $9); p = $9 }
      $7 ~ tg { gsub(/ /, "", $9); g = $9; gsub(/ /, "", $10); b = $10 }
      END { print (p == "" ? "-" : p), (g == "" ? "-" : g), (b == "" ? "-" : b) }'
}
theirs() { # model threads pp tg
  sh "$REF" "$1" "$2" "$3" "$4" 1 2>/dev/null |
    awk -F'|' -v pp="pp$3" -v tg="tg$4" '
      $4 ~ pp { split($5, a, "±"); gsub(/ /, "", a[1]); p = a[1] }
      $4 ~ tg { split($5, a, "±"); gsub(/ /, "", a[1]); g = a[1] }
      END { print (p == "" ? "-" : p), (g == "" ? "-" : g) }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else printf "%.2f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

run_model() { # label model threads pp tg target_pp target_tg
  label=$1 m=$2 th=$3 pp=$4 tg=$5
  : > "$TMP/$label"
  r=1
  while [ "$r" -le "$ROUNDS" ]; do
    o=$(ours "$m" "$th" "$pp" "$tg")
    l="- -"
    [ "$LLAMA" = 1 ] && l=$(theirs "$m" "$th" "$pp" "$tg")
    echo "$o $l" >> "$TMP/$label"
    echo "  $label round $r: kvchat pp/tg $(echo "$o" | cut -d' ' -f1-2)  llama.cpp pp/tg $l" >&2
    r=$((r + 1))
  done
}

summary() { # label test-names target_pp target_tg
  label=$1 pp=$2 tg=$3 tpp=$4 ttg=$5
  f="$TMP/$label"
  kpp=$(awk '$1 != "-" { print $1 }' "$f" | median)
  ktg=$(awk '$2 != "-" { print $2 }' "$f" | median)
  kbw=$(awk '$3 != "-" { print $3 }' "$f" | median)
  lpp=$(awk '$4 != "-" { print $4 }' "$f" | median)
  ltg=$(awk '$5 != "-" { print $5 }' "$f" | median)
  rpp=$(awk '$1 != "-" && $4 != "-" && $4 > 0 { print $1 / $4 }' "$f" | median)
  rtg=$(awk '$2 != "-" && $5 != "-" && $5 > 0 { print $2 / $5 }' "$f" | median)
  frac=$(echo "$kbw $PEAK" | awk '$1 != "-" { printf "%.0f%%", 100 * $1 / $2; exit } { print "-" }')
  lfrac=$(echo "$ltg $ktg $kbw $PEAK" | awk '$1 != "-" && $2 != "-" && $3 != "-" && $2 > 0 { printf "%.0f%%", 100 * $1 * ($3 / $2) / $4; exit } { print "-" }')
  ok() { echo "$1 $2" | awk '$2 == "-" { print "-"; exit } $1 == "-" { print "?"; exit } { print ($1 >= $2 ? "yes" : "NO") }'; }
  tgt() { [ "$1" = "-" ] && echo "-" || echo ">= $1"; }
  printf '| %s | pp%s | %s | %s | %s | %s | %s | | |\n' "$label" "$pp" "$kpp" "$lpp" "$rpp" "$(tgt "$tpp")" "$(ok "$rpp" "$tpp")"
  printf '| %s | tg%s | %s | %s | %s | %s | %s | %s GB/s = %s | %s |\n' "$label" "$tg" "$ktg" "$ltg" "$rtg" "$(tgt "$ttg")" \
    "$(ok "$rtg" "$ttg")" "$kbw" "$frac" "$lfrac"
}

echo "kvchat bench vs llama.cpp ($REF), $ROUNDS rounds of one repetition each, back to back" >&2
for t in $TYPES; do run_model "tinyllama-$t" "$DIR/tinyllama-$t.gguf" "$TH" "$PP" "$TG"; done
STORIES="$(cd "$SHARED/models" 2>/dev/null && pwd)/stories260K.gguf"  # absolute: the reference script cd's
if [ "${BENCH_STORIES:-1}" = 1 ] && [ -s "$STORIES" ]; then
  run_model "stories260K-t1" "$STORIES" 1 "$PP" 256
fi

echo
echo "Medians of $ROUNDS rounds; ratio = median of the per-round kvchat/llama.cpp ratios; targets from issue 7."
echo "Decode bandwidth = weight bytes per token x t/s; % of ${PEAK} GB/s (kvchat, then llama.cpp at its t/s)."
echo
echo "| model | test | kvchat t/s | llama.cpp t/s | ratio | target | met | kvchat decode | llama.cpp |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
for t in $TYPES; do summary "tinyllama-$t" "$PP" "$TG" 1.0 1.2; done
if [ -s "$TMP/stories260K-t1" ]; then
  summary "stories260K-t1" "$PP" 256 - -
  ktg=$(awk '$2 != "-" { print $2 }' "$TMP/stories260K-t1" | median)
  echo
  echo "stories260K decode on 1 thread: $ktg t/s (target >= 10000: $(echo "$ktg" | awk '{ print ($1 >= 10000 ? "met" : "NOT met") }'))"
fi
