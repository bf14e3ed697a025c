#!/usr/bin/env bash
# The test command of the README (and of CI): fetches the real model if needed, then runs every
# test of the workspace in release mode (the end-to-end tests run SmolLM2 token by token).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-model.sh >/dev/null
# The quant-type end-to-end tests need SmolLM2 requantized by llama.cpp's llama-quantize; without
# it (no peer build, as on CI) those tests print "skipped: ..." and pass.
./scripts/make-quant-models.sh >/dev/null 2>&1 || echo "note: llama-quantize not found; quant_reference tests will be skipped" >&2
cargo test --release --workspace "$@"
