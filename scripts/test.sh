#!/usr/bin/env bash
# The test command of the README (and of CI): fetches the real model if needed, then runs every
# test of the workspace in release mode (the end-to-end tests run SmolLM2 token by token).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-model.sh >/dev/null
cargo test --release --workspace "$@"
