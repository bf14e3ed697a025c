#!/usr/bin/env bash
# Decode speed on a shared machine: edge-run's `bench` and llama.cpp's `llama-bench` (tg only),
# each alone, with one thread more than the CPUs, two processes of the same engine at once, and
# beside a CPU-bound neighbour (a busy loop on one core), run alternately so both engines see
# the same machine. Prints tokens/s per case and the share of each engine's own "alone" figure.
#
#   scripts/bench-contention.sh [MODEL] [N]
#   EDGE_RUN_OTHER=/path/to/older/edge-run scripts/bench-contention.sh   # adds a third engine
#
# Needs ../shared/peer/build-llama-cpp.sh (builds llama.cpp once, outside the repository),
# cargo and python3. A quiet machine: anything else running is part of the measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
N=${2:-64}
REPS=${REPS:-3}
. scripts/side-by-side.sh
need_model "$MODEL"
use_peer llama-bench
LLAMA_BENCH=$PEER_BIN/llama-bench
use_edge_run
CPUS=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
OUT=$(mktemp -d)
NEIGHBOUR=""
cleanup() { [ -n "$NEIGHBOUR" ] && kill "$NEIGHBOUR" 2>/dev/null; rm -rf "$OUT"; }
trap cleanup EXIT

# tg tokens/s of one run: engine name, threads ("" = the engine's default), output file.
one() {
  local engine=$1 threads=$2 out=$3 targs=()
  case $engine in
    llama.cpp)
      [ -n "$threads" ] && targs=(-t "$threads")
      LD_LIBRARY_PATH=$PEER_BIN "$LLAMA_BENCH" -m "$MODEL" "${targs[@]}" -p 0 -n "$N" -r "$REPS" -o json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])' > "$out" ;;
    *)
      local bin=$EDGE_RUN; [ "$engine" = edge-run-other ] && bin=$EDGE_RUN_OTHER
      [ -n "$threads" ] && targs=(-t "$threads")
      "$bin" bench "$MODEL" "${targs[@]}" -p 1 -n "$N" -r "$REPS" --json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["tg"])' > "$out" ;;
  esac
}

ENGINES=(edge-run llama.cpp)
[ -n "${EDGE_RUN_OTHER:-}" ] && ENGINES+=(edge-run-other)
for e in "${ENGINES[@]}"; do
  echo "$e: alone, -t $CPUS" >&2;       one "$e" "$CPUS" "$OUT/$e.alone"
  echo "$e: -t $((CPUS + 1))" >&2;      one "$e" $((CPUS + 1)) "$OUT/$e.over"
  echo "$e: two processes" >&2
  one "$e" "$CPUS" "$OUT/$e.two1" & p1=$!; one "$e" "$CPUS" "$OUT/$e.two2" & p2=$!; wait $p1 $p2
  sh -c 'while :; do :; done' & NEIGHBOUR=$!
  echo "$e: beside a busy loop, -t $CPUS" >&2; one "$e" "$CPUS" "$OUT/$e.busy"
  echo "$e: beside a busy loop, default threads" >&2; one "$e" "" "$OUT/$e.busydef"
  kill "$NEIGHBOUR"; wait "$NEIGHBOUR" 2>/dev/null || true; NEIGHBOUR=""
done

python3 - "$OUT" "$CPUS" "$MODEL" "${ENGINES[@]}" <<'PY'
import sys
out, cpus, model, engines = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def r(e, k):
    return float(open(f"{out}/{e}.{k}").read())
cases = [("alone, -t %d" % cpus, ["alone"]), ("-t %d" % (cpus + 1), ["over"]),
         ("two processes at once (each)", ["two1", "two2"]),
         ("beside a busy loop, -t %d" % cpus, ["busy"]), ("beside a busy loop, default -t", ["busydef"])]
print(f"model {model}, {cpus} CPUs, decode (tg) tokens/s; in brackets: share of the engine's own 'alone'")
print("| case | " + " | ".join(engines) + " |")
print("| --- |" + " ---: |" * len(engines))
for name, keys in cases:
    cells = []
    for e in engines:
        a = r(e, "alone")
        vals = [r(e, k) for k in keys]
        cells.append(" / ".join(f"{v:.1f} ({v / a:.2f}x)" for v in vals))
    print(f"| {name} | " + " | ".join(cells) + " |")
PY
