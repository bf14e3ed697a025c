#!/usr/bin/env bash
# Cross-compiles the workspace for aarch64 (Jetson Orin's CPU) and runs the unit tests of every
# crate (kernels, GGUF reader, tokenizers, planner, targets) under qemu-aarch64. Installs the
# cross toolchain and qemu with apt-get if they are missing (Debian; needs root).
# Not yet part of .ci/run (about 2 minutes on 2 cores); issue "CPU speed" adds it there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
rustup target add aarch64-unknown-linux-gnu >/dev/null
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target aarch64-unknown-linux-gnu \
  -p edge-arena -p edge-engine -p edge-tokenizers -p edge-targets --lib "$@"
