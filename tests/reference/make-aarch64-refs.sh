#!/usr/bin/env bash
# llama.cpp's outputs for SmolLM2 on an ARM CPU (tests/reference/smollm2-aarch64/), for the NEON
# end-to-end test (tests/tests/neon_reference.rs): llama.cpp's own aarch64 build, whose
# arithmetic the NEON kernels reproduce, instead of the x86-64 reference, which an ARM build
# differs from at near-ties.
#
#   tests/reference/make-aarch64-refs.sh
#
# Cross-compiles llama.cpp from the peer's source (../shared/peer/build-llama-cpp.sh downloads
# it) with GCC 12 for armv8.2-a+dotprod (Jetson Orin's Cortex-A78AE), static, one thread, no
# OpenMP; links tests/reference/aarch64-ref.c against it; runs it under qemu-aarch64 (default
# CPU `max`, which has the dot-product instructions) over the prompts of
# ../shared/reference/smollm2/: teacher-forced top-10 logits one token per eval, and greedy
# 32-token continuations (prompt as one batch, then one token per eval). Needs
# gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, qemu-user (apt-get) and about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC="$(cd "$(../shared/peer/build-llama-cpp.sh)/../.." && pwd)"   # vendor/llama.cpp
BUILD="$SRC/build-aarch64"
if [ ! -f "$BUILD/src/libllama.a" ]; then
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux \
    -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc \
    -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DGGML_NATIVE=OFF \
    -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$BUILD" -j"$(nproc)" --target llama >&2
fi
EXE="$(mktemp -d)/aarch64-ref"
aarch64-linux-gnu-g++ -O2 -static -I"$SRC/include" -I"$SRC/ggml/include" tests/reference/aarch64-ref.c \
  "$BUILD/src/libllama.a" "$BUILD/ggml/src/libggml.a" "$BUILD/ggml/src/libggml-cpu.a" \
  "$BUILD/ggml/src/libggml-base.a" -lpthread -lm -o "$EXE"
MODEL="$(./scripts/fetch-model.sh)"
OUT=tests/reference/smollm2-aarch64
mkdir -p "$OUT"
REF=../shared/reference/smollm2
python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(" ".join(map(str, json.loads(l)["prompt_ids"])))' "$REF/logits-top10.jsonl" \
  | qemu-aarch64 "$EXE" "$MODEL" logits > "$OUT/logits-top10.raw"
python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(" ".join(map(str, json.loads(l)["prompt_ids"])))' "$REF/greedy.jsonl" \
  | qemu-aarch64 "$EXE" "$MODEL" greedy 32 > "$OUT/greedy.raw"
# The prompts' texts, from the x86-64 reference the ids came from.
python3 - "$REF" "$OUT" <<'PY'
import json, os, sys
ref, out = sys.argv[1:]
for name in ["logits-top10", "greedy"]:
    texts = [json.loads(l) for l in open(os.path.join(ref, name + ".jsonl")) if l.strip()]
    rows = [json.loads(l) for l in open(os.path.join(out, name + ".raw")) if l.strip()]
    assert len(rows) == len(texts)
    with open(os.path.join(out, name + ".jsonl"), "w") as f:
        for t, r in zip(texts, rows):
            assert r["prompt_ids"] == t["prompt_ids"]
            f.write(json.dumps({"prompt": t["prompt"], **r}, ensure_ascii=False) + "\n")
    os.remove(os.path.join(out, name + ".raw"))
PY
echo "$OUT"
