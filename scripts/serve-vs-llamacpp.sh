#!/usr/bin/env bash
# Serving side by side: `edge-run serve --slots 4` and llama.cpp's `llama-server -np 4` on the
# same model, threads and per-slot context, started and loaded by `scripts/serve-bench.py` in
# turn for a few rounds (so both see the same machine conditions). Prints, per concurrency, each
# server's aggregate decode tok/s (mean over the rounds), the ratio edge-run / llama.cpp, and
# each server's speed-up over its own 1-stream figure.
#
#   scripts/serve-vs-llamacpp.sh [MODEL] [THREADS]
#   ROUNDS=3 REQUESTS=3 TOKENS=64 CTX=1024 scripts/serve-vs-llamacpp.sh models/SmolLM2-135M-Instruct.Q4_1.gguf 2
#
# Needs ../shared/peer/build-llama-cpp.sh (builds llama.cpp once, outside the repository),
# cargo, curl and python3. Bounded: ROUNDS x 2 servers x (1+2+4) x REQUESTS requests.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-2}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-3}
TOKENS=${TOKENS:-64}
CTX=${CTX:-1024}
SLOTS=4
PORT=${PORT:-8377}
. scripts/side-by-side.sh
need_model "$MODEL"
use_peer llama-server
LLAMA_SERVER=$PEER_BIN/llama-server
use_edge_run

OUT=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$OUT"; }
trap cleanup EXIT

# run NAME COMMAND...: starts a server on $PORT, waits for /health to answer 200, loads it, stops it.
run() {
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 &
  PID=$!
  local up=
  for _ in $(seq 120); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then up=1; break; fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$up" ]; then
    echo "error: $name did not come up; its log:" >&2
    tail -20 "$OUT/$name.log" >&2
    exit 1
  fi
  python3 scripts/serve-bench.py "http://127.0.0.1:$PORT" --concurrency 1 2 4 \
    --requests "$REQUESTS" --tokens "$TOKENS" | tee -a "$OUT/$name.txt" >&2
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=
}

for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS: llama-server -np $SLOTS" >&2
  run llama env LD_LIBRARY_PATH="$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$LLAMA_SERVER" -m "$MODEL" -np "$SLOTS" -c $((CTX * SLOTS)) -t "$THREADS" --port "$PORT"
  echo "round $r/$ROUNDS: edge-run serve --slots $SLOTS" >&2
  run edge "$EDGE_RUN" serve "$MODEL" --slots "$SLOTS" -c "$CTX" -t "$THREADS" --port "$PORT"
done

# Lines: "concurrency C: ... aggregate decode X tok/s ..." -> mean X per C.
mean() {
  awk -v c="$2" '$1 == "concurrency" && $2 == c":" {
      for (i = 1; i <= NF; i++) if ($i == "decode") { s += $(i + 1); n++ } }
    END { if (n) printf "%.1f", s / n; else printf "nan" }' "$OUT/$1.txt"
}
echo "model $MODEL, $THREADS threads, $SLOTS slots of ctx $CTX, $ROUNDS rounds x $REQUESTS requests x $TOKENS tokens per client"
echo "| streams | llama-server tok/s | edge-run tok/s | edge-run / llama.cpp | llama-server vs 1 stream | edge-run vs 1 stream |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
L1=$(mean llama 1)
E1=$(mean edge 1)
for c in 1 2 4; do
  L=$(mean llama "$c")
  E=$(mean edge "$c")
  awk -v c="$c" -v l="$L" -v e="$E" -v l1="$L1" -v e1="$E1" 'BEGIN {
    printf "| %d | %.1f | %.1f | %.2fx | %.2fx | %.2fx |\n", c, l, e, e / l, l / l1, e / e1 }'
done
