#!/usr/bin/env bash
# Speed side by side: edge-run's `bench` and llama.cpp's `llama-bench` on the same model, same
# threads, same prompt (pp) and generation (tg) lengths, run alternately for a few rounds so that
# both see the same machine conditions. Prints both engines' tokens/s and the ratio
# edge-run / llama.cpp (> 1: edge-run is faster).
#
#   scripts/bench-vs-llamacpp.sh [MODEL] [THREADS] [P] [N]
#   ROUNDS=3 REPS=5 scripts/bench-vs-llamacpp.sh models/SmolLM2-135M-Instruct.Q4_1.gguf 2 512 128
#
# Needs ../shared/peer/build-llama-cpp.sh (builds llama.cpp once, outside the repository),
# cargo and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-2}
P=${3:-512}
N=${4:-128}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-5}
. scripts/side-by-side.sh
need_model "$MODEL"
use_peer llama-bench
LLAMA_BENCH=$PEER_BIN/llama-bench
use_edge_run

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS: llama-bench" >&2
  LD_LIBRARY_PATH=$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$P" -n "$N" -r "$REPS" -o json \
    > "$OUT/llama-$round.json" 2> "$OUT/llama-$round.log" \
    || { cat "$OUT/llama-$round.log" >&2; exit 1; }
  echo "round $round/$ROUNDS: edge-run bench" >&2
  "$EDGE_RUN" bench "$MODEL" -t "$THREADS" -p "$P" -n "$N" -r "$REPS" --json > "$OUT/edge-$round.json"
done

python3 - "$OUT" "$ROUNDS" "$MODEL" "$THREADS" "$P" "$N" <<'PY'
import json, statistics, sys
out, rounds, model, threads, p, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
llama = {"pp": [], "tg": []}
edge = {"pp": [], "tg": [], "isa": None}
for r in range(1, rounds + 1):
    for t in json.load(open(f"{out}/llama-{r}.json")):
        # llama-bench: one object per test; pp tests have n_gen 0, tg tests n_prompt 0
        if t.get("n_prompt") == p and t.get("n_gen") == 0:
            llama["pp"].extend(t["samples_ts"])
        elif t.get("n_gen") == n and t.get("n_prompt") == 0:
            llama["tg"].extend(t["samples_ts"])
    e = json.load(open(f"{out}/edge-{r}.json"))
    edge["pp"].extend(e["pp_samples"])
    edge["tg"].extend(e["tg_samples"])
    edge["isa"] = e["isa"]

def ms(xs):
    if not xs:
        return float("nan"), float("nan")
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

print(f"model {model}, {threads} threads, {rounds} rounds; edge-run kernels {edge['isa']}")
print(f"| test | llama.cpp t/s | edge-run t/s | edge-run / llama.cpp |")
print(f"| --- | ---: | ---: | ---: |")
for key, size in (("pp", p), ("tg", n)):
    lm, ls = ms(llama[key])
    em, es = ms(edge[key])
    print(f"| {key}{size} | {lm:.2f} ± {ls:.2f} | {em:.2f} ± {es:.2f} | {em / lm:.3f} |")
PY
