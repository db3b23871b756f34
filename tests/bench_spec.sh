#!/bin/sh
# bench_spec: speculative decoding's speed, not a test — plain decoding vs --lookup (and a draft
# model) on a prompt that asks the model to repeat a passage, and on one where drafts are mostly
# rejected; decode tokens/s (the median of RUNS runs), acceptance, speed-up (the ratio of the
# medians). On a shared machine the figures are rough: compare the two columns of one run, not
# runs with each other.
# Env: KVCHAT (./kvchat), SHARED (../shared), TINY (a TinyLlama-shaped GGUF; made with
# `kvchat gen-model --shape tinyllama --type q4_0` when missing), N (tokens of the TinyLlama
# rows, 96), N_SMALL (of the stories260K rows, 400: its steps take well under a millisecond), RUNS (5),
# RUNS_SMALL (of the stories260K rows, 6 x RUNS: a run takes a fraction of a second and one
# preemption by another process changes its decode t/s by tens of percent),
# THREADS (1: on a loaded machine a second thread's wake-ups swamp a small model's step).
set -u
KVCHAT=${KVCHAT:-./kvchat}
SHARED=${SHARED:-../shared}
N=${N:-96}
N_SMALL=${N_SMALL:-400}
RUNS=${RUNS:-5}
RUNS_SMALL=${RUNS_SMALL:-$((6 * RUNS))}
THREADS=${THREADS:-1}
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
TINY=${TINY:-/tmp/kvchat-models/tinyllama-q4_0.gguf}
if [ ! -f "$TINY" ]; then
    echo "making $TINY (kvchat gen-model --shape tinyllama --type q4_0)" >&2
    mkdir -p "$(dirname "$TINY")" && "$KVCHAT" gen-model --shape tinyllama --type q4_0 -o "$TINY" >&2 || exit 1
fi
# a 2-layer TinyLlama-shaped draft of the same vocabulary (random weights: its drafts are rejected)
TINY_DRAFT=$TMPD/tinyllama-2l-q4_0.gguf
"$KVCHAT" gen-model --shape tinyllama --type q4_0 --layers 2 --seed 7 -o "$TINY_DRAFT" >/dev/null 2>&1

PASSAGE="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. Her friend Tom came and said, \"Can I play with the ball too?\" Lily smiled and said, \"Yes, let us play together.\" They played all day and had a lot of fun."
REPEAT="$PASSAGE

$PASSAGE

Once upon a time, there was a little girl named Lily."
FRESH="Once upon a time"
# stories260K is too small to copy a passage it is given; a passage of its own (its greedy
# story), repeated, is one it goes on repeating
STORY=$("$KVCHAT" -m "$SHARED/models/stories260K.gguf" -p "Once upon a time" -n 200 --temp 0 -t 1 2>/dev/null)
REPEAT_SMALL="$STORY

$STORY

Once upon a time"

# one run: decode t/s, drafted, accepted (from the --json done object)
run() {
    model=$1; prompt=$2; shift 2
    n=$N
    case $model in *stories260K*) n=$N_SMALL ;; esac
    # into a file, not a pipe: a reader woken by every token's line shares the CPU with the decode
    # it measures (stories260K's 400 lines in ~40 ms)
    "$KVCHAT" -m "$model" -p "$prompt" -n "$n" --temp 0 -t "$THREADS" --json "$@" >"$TMPD/out" 2>/dev/null
    tail -n 1 "$TMPD/out" |
        python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d.get("decode_tps",0), d.get("n_drafted",0), d.get("n_accepted",0))'
}
# the median of the runs (the middle one; the mean of the two middle ones)
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

row() { # label model prompt [spec options]
    label=$1; model=$2; prompt=$3; shift 3
    : >"$TMPD/p"; : >"$TMPD/s"
    runs=$RUNS
    case $model in *stories260K*) runs=$RUNS_SMALL ;; esac
    i=0
    while [ $i -lt "$runs" ]; do # alternate plain and speculative so load changes hit both
        run "$model" "$prompt" >>"$TMPD/p"
        run "$model" "$prompt" "$@" >>"$TMPD/s"
        i=$((i + 1))
    done
    p=$(cut -d' ' -f1 "$TMPD/p" | median)
    s=$(cut -d' ' -f1 "$TMPD/s" | median)
    d=$(tail -n 1 "$TMPD/s" | cut -d' ' -f2)
    a=$(tail -n 1 "$TMPD/s" | cut -d' ' -f3)
    printf '| %s | %s | %.1f | %.1f | %s / %s (%s) | %s |\n' "$label" "$*" "$p" "$s" "$a" "$d" \
        "$(awk -v a="$a" -v d="$d" 'BEGIN { if (d > 0) printf "%.0f%%", 100 * a / d; else print "-" }')" \
        "$(awk -v p="$p" -v s="$s" 'BEGIN { if (p > 0) printf "%.2fx", s / p; else print "-" }')"
}

echo "speculative decoding, greedy, $N_SMALL (stories260K) / $N (TinyLlama) tokens, $THREADS thread(s), medians of $RUNS_SMALL / $RUNS runs"
echo "(a shared, noisy machine: rough figures; each row alternates plain and speculative runs)"
echo
echo "| case | options | plain t/s | speculative t/s | accepted / drafted | speed-up |"
echo "|---|---|---|---|---|---|"
row "stories260K, repeat its own story" "$SHARED/models/stories260K.gguf" "$REPEAT_SMALL" --lookup
row "stories260K, a new story" "$SHARED/models/stories260K.gguf" "$FRESH" --lookup
row "stories260K, a random-weight draft (rejected)" "$SHARED/models/stories260K.gguf" "$FRESH" \
    --draft "$SHARED/models/syn-llama-q4_0.gguf" --draft-min-p 0
row "TinyLlama-shaped Q4_0, repeat a passage" "$TINY" "$REPEAT" --lookup
row "TinyLlama-shaped Q4_0, repeat, 2-layer draft" "$TINY" "$REPEAT" --draft "$TINY_DRAFT" --draft-max 4 --draft-min-p 0
row "TinyLlama-shaped Q4_0, repeat, 2-layer draft, default --draft-min-p (it declines)" "$TINY" "$REPEAT" --draft "$TINY_DRAFT" --draft-max 4
