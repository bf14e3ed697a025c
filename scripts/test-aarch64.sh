#!/usr/bin/env bash
# Cross-compiles the workspace for aarch64 (Jetson Orin's CPU) and runs the unit tests of every
# library crate (the NEON kernels against the scalar references, GGUF reader, tokenizers,
# planner, targets) under qemu-aarch64, whose default CPU (`max`) has the dot-product
# instructions, so both NEON variants run; then SmolLM2 end to end on the NEON kernels against
# llama.cpp's reference (tests/tests/neon_reference.rs: teacher-forced top-1 and the start of
# greedy generation). Installs the cross toolchain and qemu with apt-get if they are missing
# (Debian/Ubuntu; as root, or with sudo) and the Rust target with rustup. Part of `.ci/run`.
# Extra arguments go to `cargo test` (e.g. `-- cpu::` for the kernel tests only).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo test --release --target aarch64-unknown-linux-gnu \
  -p edge-arena -p edge-gguf -p edge-kernels -p edge-engine -p edge-tokenizers -p edge-targets \
  --lib "$@"
./scripts/fetch-model.sh >/dev/null
cargo test --release --target aarch64-unknown-linux-gnu -p edge-tests --test neon_reference \
  -- --nocapture
