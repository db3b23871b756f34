#!/bin/sh
# bench_serve: aggregate decode tokens/s of `kvchat serve` with 1, 2, 4 and 8 concurrent streams —
# a measurement, not a test. Requests run one at a time (no continuous batching yet), so the
# aggregate stays near the single-stream figure and each stream's wall time grows with N; batching
# would raise the aggregate (decode is bandwidth-bound: one weight pass could serve every stream).
# Usage: tests/bench_serve.sh [MODEL] (default: $BENCH_DIR/tinyllama-q4_0.gguf when present, else
# stories260K). Environment: KVCHAT (./kvchat), SHARED (../shared), BENCH_TOKENS (64 per stream),
# BENCH_STREAMS ("1 2 4 8"), BENCH_THREADS (all CPUs).
set -u
KVCHAT=${KVCHAT:-./kvchat}
SHARED=${SHARED:-../shared}
DIR=${BENCH_DIR:-/tmp/kvchat-models}
MODEL=${1:-}
[ -n "$MODEL" ] || { [ -f "$DIR/tinyllama-q4_0.gguf" ] && MODEL=$DIR/tinyllama-q4_0.gguf || MODEL=$SHARED/models/stories260K.gguf; }
T=${BENCH_TOKENS:-64}
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
set -- serve -m "$MODEL" --port 0 --parallel 64 -c 1024
[ -n "${BENCH_THREADS:-}" ] && set -- "$@" -t "$BENCH_THREADS"
"$KVCHAT" "$@" 2>"$tmp/log" &
pid=$!
port=""
for i in $(seq 1 600); do
    grep -q ready "$tmp/log" 2>/dev/null && port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/log") && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ -n "$port" ] || { cat "$tmp/log"; exit 1; }
url=http://127.0.0.1:$port/v1/completions
now() { date +%s.%N; }
# one stream: prints its completion tokens and its wall time
stream() {
    s=$(now)
    n=$(curl -s -N "$url" -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":$T,\"temperature\":0,
        \"stream\":true,\"stream_options\":{\"include_usage\":true}}" |
        sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p')
    echo "${n:-0} $(echo "$(now) - $s" | bc)"
}
stream warmup >/dev/null
echo "model: $MODEL, $T tokens per stream (kvchat serve: one request at a time)"
printf '%8s %12s %14s %16s\n' streams "wall s" "aggregate t/s" "per-stream t/s"
for N in ${BENCH_STREAMS:-1 2 4 8}; do
    s=$(now)
    kids=""
    for k in $(seq 1 "$N"); do
        stream "$k" >"$tmp/s$k" &
        kids="$kids $!"
    done
    for k in $kids; do wait "$k"; done
    wall=$(echo "$(now) - $s" | bc)
    tot=$(cat "$tmp"/s* | awk '{t += $1} END {print t}')
    per=$(cat "$tmp"/s* | awk '{r += $1 / $2} END {printf "%.1f", r / NR}')
    printf '%8d %12.2f %14.1f %16s\n' "$N" "$wall" "$(echo "$tot / $wall" | bc -l)" "$per"
    rm -f "$tmp"/s*
done
