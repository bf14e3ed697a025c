#!/usr/bin/env bash
# Memory side by side: peak RSS (the kernel's high-water mark, GNU time's %M) of a 64-token
# greedy generation with edge-run and with llama.cpp's llama-completion, same model, same
# context (2048), ubatch (512), threads and prompt, run alternately. Also prints what
# `edge-run plan` promises for the same settings. The ratio edge-run / llama.cpp is the
# memory issue's goal (<= 0.7).
#
#   scripts/mem-vs-llamacpp.sh [MODEL] [THREADS]
#   ROUNDS=3 CTX=2048 UBATCH=512 N=64 scripts/mem-vs-llamacpp.sh
#
# Needs ../shared/peer/build-llama-cpp.sh (builds llama.cpp once, outside the repository),
# GNU time (/usr/bin/time), cargo and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-2}
ROUNDS=${ROUNDS:-3}
CTX=${CTX:-2048}
UBATCH=${UBATCH:-512}
N=${N:-64}
PROMPT=${PROMPT:-"Write a short story about a robot that learns to paint."}
. scripts/side-by-side.sh
need_model "$MODEL"
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time (GNU time) not found: apt-get install time" >&2; exit 1; }

use_peer llama-completion
LLAMA=$PEER_BIN/llama-completion
use_edge_run

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  LD_LIBRARY_PATH=$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} /usr/bin/time -f "%M" -o "$OUT/llama-$round" \
    "$LLAMA" -m "$MODEL" -p "$PROMPT" -n "$N" -c "$CTX" -b "$UBATCH" -ub "$UBATCH" -t "$THREADS" \
    --temp 0 -no-cnv --no-warmup -v > "$OUT/llama-$round.log" 2>&1 \
    || { cat "$OUT/llama-$round.log" >&2; exit 1; }
  /usr/bin/time -f "%M" -o "$OUT/edge-$round" \
    "$EDGE_RUN" "$MODEL" -p "$PROMPT" -n "$N" --ctx "$CTX" --ubatch "$UBATCH" -t "$THREADS" \
    --temp 0 > "$OUT/edge-$round.log" 2>&1 \
    || { cat "$OUT/edge-$round.log" >&2; exit 1; }
done
"$EDGE_RUN" plan "$MODEL" --ctx "$CTX" --ubatch "$UBATCH" --json > "$OUT/plan.json"
grep -m1 "compute buffer size" "$OUT/llama-1.log" | sed "s/.*CPU/llama.cpp: CPU/" || true

python3 - "$OUT" "$ROUNDS" "$MODEL" "$THREADS" "$CTX" "$UBATCH" "$N" <<'PY'
import json, sys
out, rounds, model, threads, ctx, ubatch, n = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
kib = lambda f: int(open(f).read().split()[-1])
llama = [kib(f"{out}/llama-{r}") / 1024 for r in range(1, rounds + 1)]
edge = [kib(f"{out}/edge-{r}") / 1024 for r in range(1, rounds + 1)]
plan = json.load(open(f"{out}/plan.json"))
mib = lambda b: b / 1048576
print(f"model {model}, ctx {ctx}, ubatch {ubatch}, {threads} threads, {n} tokens, {rounds} rounds")
print(f"edge-run plan: weights {mib(plan['weights_bytes']):.1f} MiB (mapped), kv {mib(plan['kv_bytes']):.1f}, "
      f"arena {mib(plan['arena_bytes']):.1f} (bound {mib(plan['arena_lower_bound_bytes']):.1f}), "
      f"scratch {mib(plan['scratch_bytes']):.2f}, total {mib(plan['total_bytes']):.1f} MiB")
print("| engine | peak RSS MiB (each round) | max |")
print("| --- | --- | ---: |")
print(f"| llama.cpp | {', '.join(f'{x:.1f}' for x in llama)} | {max(llama):.1f} |")
print(f"| edge-run | {', '.join(f'{x:.1f}' for x in edge)} | {max(edge):.1f} |")
print(f"edge-run / llama.cpp peak RSS: {max(edge) / max(llama):.3f}")
PY
