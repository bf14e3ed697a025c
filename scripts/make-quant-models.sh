#!/usr/bin/env bash
# Requantizes SmolLM2-135M-Instruct (Q4_1, fetched by fetch-model.sh) into other ggml quant
# types with llama.cpp's llama-quantize (--allow-requantize), for the quant-type end-to-end tests
# (tests/tests/quant_reference.rs) and their references (tests/reference/smollm2-*/).
#
#   scripts/make-quant-models.sh [TYPE...]     # default: every type the tests use
#
# Writes models/SmolLM2-135M-Instruct.<TYPE>.gguf (git-ignored). Needs llama-quantize: from
# $LLAMA_QUANTIZE, or the peer built by ../shared/peer/build-llama-cpp.sh. Requantizing from Q4_1
# loses accuracy, which does not matter here: llama.cpp's references run the same file.
# Idempotent: existing files are kept (llama-quantize is deterministic for these types). Every
# file, new or kept, must have the sha256 pinned in tests/reference/quant-models.sha256 (the
# references were made from exactly those files; the tests check it too): a mismatch is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
SRC="$(./scripts/fetch-model.sh)"
TYPES=("$@")
if [ ${#TYPES[@]} -eq 0 ]; then
  TYPES=(Q4_K_M Q5_K_M Q3_K_M Q2_K Q2_K-pure Q6_K Q5_0 Q5_1 Q8_0 IQ4_NL IQ4_XS)
fi
Q="${LLAMA_QUANTIZE:-}"
if [ -z "$Q" ]; then
  for d in "$HOME"/.cache/edge-peer/llama_cpp_python-*/vendor/llama.cpp/build/bin; do
    [ -x "$d/llama-quantize" ] && Q="$d/llama-quantize"
  done
fi
if [ -z "$Q" ] || [ ! -x "$Q" ]; then
  echo "error: llama-quantize not found; build the peer (../shared/peer/build-llama-cpp.sh) or set LLAMA_QUANTIZE" >&2
  exit 1
fi
export LD_LIBRARY_PATH="$(dirname "$Q")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for t in "${TYPES[@]}"; do
  out="$MODEL_DIR/SmolLM2-135M-Instruct.$t.gguf"
  if [ ! -f "$out" ]; then
    # TYPE-pure: every tensor that can be TYPE is (llama-quantize --pure, no k-quant mixture):
    # the only way to get Q2_K tensors into SmolLM2, whose 576-wide rows are not whole Q2_K
    # blocks (only ffn_down's 1536-wide rows are).
    pure=()
    [ "${t%-pure}" != "$t" ] && pure=(--pure)
    "$Q" --allow-requantize "${pure[@]}" "$SRC" "$out.part" "${t%-pure}" 1 >/dev/null 2>&1 || { echo "error: llama-quantize $t failed" >&2; rm -f "$out.part"; exit 1; }
    mv "$out.part" "$out"
  fi
  name="$(basename "$out")"
  want="$(awk -v n="$name" '$2 == n { print $1 }' tests/reference/quant-models.sha256)"
  got="$(sha256sum "$out" | cut -d' ' -f1)"
  if [ -z "$want" ]; then
    echo "error: $name has no sha256 in tests/reference/quant-models.sha256 (its reference is unpinned)" >&2
    exit 1
  fi
  if [ "$got" != "$want" ]; then
    echo "error: $out has sha256 $got, not the $want its llama.cpp reference was made from; delete it and run this script again (with llama.cpp 0c1e570, ../shared/peer/build-llama-cpp.sh)" >&2
    exit 1
  fi
  echo "$out"
done
