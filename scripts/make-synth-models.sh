#!/usr/bin/env bash
# Writes the random-weight 1.1B Llama (TinyLlama-1.1B's shape, SmolLM2's tokenizer) that the speed
# goals of issue 4 are measured on, larger than the CPU caches: models/synth-1b.Q4_0.gguf and
# models/synth-1b.Q4_K_M.gguf (git-ignored; about 0.6 GB each). Uses ../shared/peer's
# make-synthetic-model.py (python3 with gguf + numpy) and the peer's llama-quantize.
#
#   scripts/make-synth-models.sh [TYPE...]      # default: Q4_0 Q4_K_M
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_0 Q4_K_M)
DONOR="$(./scripts/fetch-model.sh)"
PEER_BIN="$(../shared/peer/build-llama-cpp.sh)"
F16="$MODEL_DIR/synth-1b.F16.gguf"
for t in "${TYPES[@]}"; do
  OUT="$MODEL_DIR/synth-1b.$t.gguf"
  [ -f "$OUT" ] && { echo "$OUT"; continue; }
  if [ ! -f "$F16" ]; then
    python3 ../shared/peer/make-synthetic-model.py --donor "$DONOR" --out "$F16.part" >&2
    mv "$F16.part" "$F16"
  fi
  LD_LIBRARY_PATH="$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$PEER_BIN/llama-quantize" "$F16" "$OUT.part" "$t" 2 >/dev/null 2>&1 \
    || { echo "error: llama-quantize $t failed" >&2; exit 1; }
  mv "$OUT.part" "$OUT"
  echo "$OUT"
done
rm -f "$F16"
