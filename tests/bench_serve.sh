#!/bin/sh
# bench_serve: aggregate decode tokens/s and per-stream inter-token latency of `kvchat serve`
# (continuous batching) with 1, 2, 4 and 8 concurrent streams, next to llama.cpp's llama-server
# --parallel on the same model in the same run — a measurement, not a test.
# Usage: tests/bench_serve.sh [MODEL] (default: $BENCH_DIR/tinyllama-q4_0.gguf — `make bench` writes
# it with `kvchat gen-model` — when present, else stories260K). Environment: KVCHAT (./kvchat), SHARED
# (../shared), BENCH_TOKENS (64 per stream), BENCH_STREAMS ("1 2 4 8"), BENCH_THREADS (all CPUs),
# LLAMA_SERVER (default /tmp/kvchat-ref/llama.cpp/build/bin/llama-server; skipped when absent —
# ../shared/bench/build-llamacpp.sh builds it).
set -u
KVCHAT=${KVCHAT:-./kvchat}
SHARED=${SHARED:-../shared}
DIR=${BENCH_DIR:-/tmp/kvchat-models}
MODEL=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
[ -n "$MODEL" ] || { [ -f "$DIR/tinyllama-q4_0.gguf" ] && MODEL=$DIR/tinyllama-q4_0.gguf || MODEL=$SHARED/models/stories260K.gguf; }
T=${BENCH_TOKENS:-64}
STREAMS=${BENCH_STREAMS:-1 2 4 8}
TH=${BENCH_THREADS:-$(nproc)}
LS=${LLAMA_SERVER:-/tmp/kvchat-ref/llama.cpp/build/bin/llama-server}
maxn=0
for n in $STREAMS; do [ "$n" -gt "$maxn" ] && maxn=$n; done
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
# wait_ready LOG PATTERN: the port the server printed, once it is ready
wait_port() {
    for i in $(seq 1 1200); do
        if grep -q "$2" "$1" 2>/dev/null; then
            sed -n 's/.*127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$1" | head -n1
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# run NAME URL: the table for one server
run() {
    u=$2
    node "$here/bench_serve.mjs" "$u" 1 8 >/dev/null # warm-up
    printf '%-12s %7s %8s %14s %9s %9s %9s\n' server streams "wall s" "decode t/s" "ITL ms" "ITL p90" "TTFT ms"
    for N in $STREAMS; do
        set -- $(node "$here/bench_serve.mjs" "$u" "$N" "$T")
        printf '%-12s %7d %8s %14s %9s %9s %9s\n' "$NAME" "$1" "$2" "$3" "$4" "$5" "$6"
        echo "$NAME $1 $3" >>"$tmp/agg"
    done
}
echo "model: $MODEL, $T tokens per stream, $TH threads; the machine's other load counts too"
"$KVCHAT" serve -m "$MODEL" --port 0 --parallel "$maxn" -c 1024 -t "$TH" 2>"$tmp/kv.log" &
pid=$!
port=$(wait_port "$tmp/kv.log" ready) || { cat "$tmp/kv.log"; exit 1; }
NAME=kvchat run kvchat "http://127.0.0.1:$port/v1/completions"
kill "$pid"
wait "$pid" 2>/dev/null
pid=""
if [ -x "$LS" ]; then
    p=$((20000 + $$ % 20000))
    # llama-server divides -c among its slots: 1024 positions each, as kvchat's -c
    "$LS" -m "$MODEL" --host 127.0.0.1 --port "$p" -np "$maxn" -c $((1024 * maxn)) -t "$TH" -cb >"$tmp/ls.log" 2>&1 &
    pid=$!
    for i in $(seq 1 1200); do
        curl -s "http://127.0.0.1:$p/health" | grep -q '"ok"' && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    NAME=llama-server run llama-server "http://127.0.0.1:$p/v1/completions"
    kill "$pid"
    wait "$pid" 2>/dev/null
    pid=""
else
    echo "llama-server: not built ($LS; ../shared/bench/build-llamacpp.sh builds it)"
fi
# each server's aggregate against its own single stream
awk '{ if ($2 == 1) one[$1] = $3; agg[$1 " " $2] = $3; names[$1] = 1; ns[$2] = 1 }
     END { for (s in names) { line = s ": aggregate / one stream"; for (n in ns) if (one[s] > 0 && (s " " n) in agg)
             line = line sprintf("  %d: %.2fx", n, agg[s " " n] / one[s]); print line } }' "$tmp/agg"
