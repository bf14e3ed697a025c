#!/usr/bin/env bash
# The static checks CI runs after the tests: formatting, clippy with warnings as errors on every
# build the project has (x86-64, x86-64 with the CUDA backend, aarch64), and the layering rules
# (scripts/check-layers.py: no import circles between source files, no source file over 800
# lines outside the kernels, no command-line, logger or signal crate under a library crate), and
# scripts/check-kernel-inline.py (every SIMD helper of the kernels `#[inline]`), and rustdoc with
# warnings as errors (no broken or private intra-doc links), also with the CUDA backend.
# Needs what scripts/test.sh and scripts/test-aarch64.sh install (nvcc from PyPI, the aarch64
# Rust target); installs them itself if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
NVCC="$(./scripts/install-nvcc.sh)"
export NVCC
cargo clippy --workspace --all-targets --features cuda -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q --features cuda
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi
# Lints only (no linking): the cross linker is not needed here.
cargo clippy --workspace --all-targets --target aarch64-unknown-linux-gnu -- -D warnings
python3 scripts/check-layers.py
python3 scripts/check-kernel-inline.py
