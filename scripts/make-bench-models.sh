#!/usr/bin/env bash
# Writes the benchmark matrix of issue 17 (realistic files for scripts/bench-matrix.sh) and
# prints their paths, one a line, in matrix order:
#   - SmolLM2-135M-Instruct requantized from Q4_1 to Q4_K_M, Q5_K_M, Q6_K, Q8_0 and IQ4_XS
#     (scripts/make-quant-models.sh: the same files, sha256-pinned, as the quant tests use);
#   - the random-weight 1.1B Llama in Q4_0 and Q4_K_M (scripts/make-synth-models.sh);
#   - random-weight models with current small models' shapes, written as F16 by
#     scripts/make-bench-model.py and quantized to Q4_K_M by llama.cpp's llama-quantize:
#     synth-gemma3-270m.Q4_K_M.gguf (Gemma-3-270M's shape, 262,144-token vocabulary) and
#     synth-qwen3-0.6b.Q4_K_M.gguf (Qwen3-0.6B's shape, 151,936-token vocabulary).
#
#   scripts/make-bench-models.sh
#
# Into models/ (git-ignored; EDGE_RUN_MODELS overrides). Idempotent: a file already there is
# kept; each is written to NAME.part and renamed when complete. Needs python3 with gguf and
# numpy (pip install gguf numpy) and the peer llama.cpp (../shared/peer/build-llama-cpp.sh).
# Making everything from scratch took 10 minutes on a busy 2-core machine; the files take 2.6 GB,
# plus up to 2.3 GB of F16 intermediates (deleted when done).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
mkdir -p "$MODEL_DIR"
python3 -c 'import gguf, numpy' 2>/dev/null \
  || { echo "error: python3 needs the gguf and numpy packages: pip install gguf numpy" >&2; exit 1; }

./scripts/make-quant-models.sh Q4_K_M Q5_K_M Q6_K Q8_0 IQ4_XS
./scripts/make-synth-models.sh Q4_0 Q4_K_M

DONOR="$(./scripts/fetch-model.sh)"
PEER_BIN="$(../shared/peer/build-llama-cpp.sh)"
THREADS="$(nproc)"
for spec in gemma3:synth-gemma3-270m qwen3:synth-qwen3-0.6b; do
  arch="${spec%%:*}"
  name="${spec#*:}"
  out="$MODEL_DIR/$name.Q4_K_M.gguf"
  if [ ! -f "$out" ]; then
    f16="$MODEL_DIR/$name.F16.gguf"
    if [ ! -f "$f16" ]; then
      python3 scripts/make-bench-model.py --arch "$arch" --donor "$DONOR" --out "$f16.part" >&2 \
        || { echo "error: writing the $arch F16 model failed" >&2; rm -f "$f16.part"; exit 1; }
      mv "$f16.part" "$f16"
    fi
    LD_LIBRARY_PATH="$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$PEER_BIN/llama-quantize" "$f16" "$out.part" Q4_K_M "$THREADS" >"$out.log" 2>&1 \
      || { cat "$out.log" >&2; echo "error: llama-quantize Q4_K_M of $f16 failed" >&2; rm -f "$out.part"; exit 1; }
    mv "$out.part" "$out"
    rm -f "$f16" "$out.log"
  fi
  echo "$out"
done
