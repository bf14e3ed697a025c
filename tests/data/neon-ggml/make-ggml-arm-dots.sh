#!/usr/bin/env bash
# Makes cases.bin (make-cases.py) and ggml-arm.bin: ggml-cpu's own ARM NEON dot products of those
# cases, from llama.cpp's sources (the peer build's tree, version 0c1e570) compiled for aarch64 as
# llama.cpp's CMake compiles them (GCC, -std=gnu11 -O3; -march=armv8.2-a+dotprod+fp16, Orin's
# Cortex-A78AE: dotprod, no i8mm, no SVE) and run under qemu-aarch64. Needs
# gcc-aarch64-linux-gnu, qemu-user and python3 with numpy. Only ggml's sources are compiled;
# nothing of them is copied here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
G="${LLAMA_CPP:-/root/.cache/edge-peer/llama_cpp_python-0.3.36/vendor/llama.cpp}/ggml"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
flags=(-std=gnu11 -O3 -march=armv8.2-a+dotprod+fp16 -D_GNU_SOURCE -ffunction-sections -fdata-sections
  -I"$G/include" -I"$G/src" -I"$G/src/ggml-cpu")
for f in src/ggml-cpu/arch/arm/quants.c src/ggml-cpu/quants.c src/ggml-quants.c; do
  aarch64-linux-gnu-gcc "${flags[@]}" -c "$G/$f" -o "$tmp/$(echo "$f" | tr / _).o"
done
aarch64-linux-gnu-gcc "${flags[@]}" "$here/ggml-arm-dots.c" "$tmp"/*.o -lm -Wl,--gc-sections -o "$tmp/ggml-arm-dots"
python3 "$here/make-cases.py" "$here/cases.bin"
qemu-aarch64 -L /usr/aarch64-linux-gnu "$tmp/ggml-arm-dots" <"$here/cases.bin" >"$here/ggml-arm.bin"
aarch64-linux-gnu-gcc --version | head -1
echo "wrote $here/cases.bin and $here/ggml-arm.bin"
