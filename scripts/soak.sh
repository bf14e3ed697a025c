#!/usr/bin/env bash
# Soak test: 20,000 tokens (or $1) generated with context shifting through a context of 128 on
# SmolLM2-135M, 2 threads; fails if VmRSS grows by 1 MiB or more after the warm-up or if the
# steady state allocates. About 4 minutes on 2 cores (~90 tok/s); see tests/tests/soak.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-model.sh >/dev/null
EDGE_RUN_SOAK_TOKENS="${1:-20000}" cargo test --release -p edge-tests --test soak -- --ignored --nocapture --test-threads=1
