#!/usr/bin/env bash
# Installs nvcc (CUDA 13.0, the toolkit matching driver 580) from PyPI into a private prefix, for
# `cargo build --features cuda` on machines without a CUDA toolkit. Idempotent: does nothing when
# that nvcc is already there. Prints the nvcc path on stdout (everything else goes to stderr).
#
#   EDGE_RUN_CUDA_PREFIX  install prefix (default: ~/.cache/edge-run/cuda-13.0); engine/core/build.rs
#                         looks there (and at NVCC, PATH, pip's site-packages) for nvcc.
#
# The wheels: nvcc itself, its C runtime headers (crt), CCCL (cuda_fp16.h's dependencies), the
# runtime headers, and NVVM (cicc, the device front end) — all pinned to the same 13.0 release so
# that PTX and cubins are accepted by a 13.0 driver.
set -euo pipefail
PREFIX="${EDGE_RUN_CUDA_PREFIX:-${HOME:-/tmp}/.cache/edge-run/cuda-13.0}"
NVCC="$PREFIX/nvidia/cu13/bin/nvcc"
if [ -x "$NVCC" ] && "$NVCC" --version 2>/dev/null | grep -q "release 13.0"; then
    echo "$NVCC"
    exit 0
fi
echo "installing nvcc 13.0 from PyPI into $PREFIX" >&2
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$PREFIX" \
    nvidia-cuda-nvcc==13.0.88 \
    nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 \
    nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-runtime==13.0.96 >&2
"$NVCC" --version >&2
echo "$NVCC"
