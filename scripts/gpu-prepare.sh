#!/usr/bin/env bash
# Prepares a GPU run on a machine without a Rust toolchain (run HERE, where cargo is): builds
# `edge-run` and the CUDA test executables with `--features cuda`, and lays out in .gpu/:
#
#   .gpu/bin/                edge-run, the engine's unit tests (kernel tests: filter cuda::),
#                            the cuda_reference end-to-end tests, synth_model (random 1.1B Q4_0 writer)
#   .gpu/shared/             the reference files the tests read (layout of ../shared, plus
#                            reference/smollm2-q4_k_m from tests/reference)
#   .gpu/stash1/model.part1  SmolLM2-135M-Instruct.Q4_1.gguf: its first 56 MiB,
#   .gpu/stash3/model.part2  the next 14 MiB,
#   .gpu/model.part3         the rest
#   .gpu/stash2/q4km.part1   the first 56 MiB of SmolLM2-135M-Instruct.Q4_K_M.gguf (the one
#   .gpu/stash3/q4km.part2   k-quant model of the GPU run; made by scripts/make-quant-models.sh)
#                            and the rest
#
# Then scripts/gpu-run.sh runs there. Each transfer carries at most 64 MiB, so the models go in
# four calls: calls 1-3 carry .gpu/stash1, .gpu/stash2, .gpu/stash3 (each stashed outside the
# work tree by `gpu-run.sh stash`), call 4 the rest. Sizes are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC="$(./scripts/install-nvcc.sh)"
export NVCC
./scripts/fetch-model.sh >/dev/null
TARGET="${CARGO_TARGET_DIR:-target}"
export CARGO_TARGET_DIR="$TARGET"
cargo build --release --features cuda -p edge-run --bin edge-run
cargo build --release --features cuda -p edge-engine --example synth_model
cargo test --release --features cuda --no-run --message-format=json \
    -p edge-engine --lib -p edge-tests --test cuda_reference > "$TARGET/gpu-tests.json"
rm -rf .gpu
mkdir -p .gpu/bin .gpu/shared/reference/smollm2 .gpu/stash1 .gpu/stash2 .gpu/stash3
# The test executables: the engine's lib tests and the cuda_reference integration test.
python3 - "$TARGET/gpu-tests.json" <<'PY'
import json, shutil, sys
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m["profile"].get("test"):
        continue
    t = m["target"]
    name = {"edge_engine": "engine-unit-tests", "cuda_reference": "cuda-reference-tests"}.get(t["name"])
    if name:
        shutil.copy(m["executable"], ".gpu/bin/" + name)
        found[name] = m["executable"]
for want in ["engine-unit-tests", "cuda-reference-tests"]:
    if want not in found:
        sys.exit(f"gpu-prepare: no test executable for {want}")
print("\n".join(f"{k} <- {v}" for k, v in found.items()))
PY
cp "$TARGET/release/edge-run" .gpu/bin/
cp "$TARGET/release/examples/synth_model" .gpu/bin/
strip .gpu/bin/*
SHARED="${EDGE_RUN_SHARED:-../shared}"
cp "$SHARED"/reference/smollm2/greedy.jsonl "$SHARED"/reference/smollm2/logits-top10.jsonl .gpu/shared/reference/smollm2/
cp -r tests/reference/smollm2-q4_k_m tests/reference/smollm2-q4_1 .gpu/shared/reference/
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
# Three parts, so that every call stays well under 64 MiB: 56 MiB alone in call 1, 14 MiB beside
# Q4_K_M's 45 MiB second part in call 3, the last 24 MiB beside the 23 MiB of binaries in call 4.
FIRST=$((56 * 1048576))
SECOND=$((14 * 1048576))
head -c "$FIRST" "$MODEL" > .gpu/stash1/model.part1
# (dd, not tail | head: head closing the pipe early would fail the script under pipefail)
dd if="$MODEL" of=.gpu/stash3/model.part2 bs=1048576 skip=$((FIRST / 1048576)) count=$((SECOND / 1048576)) status=none
tail -c +"$((FIRST + SECOND + 1))" "$MODEL" > .gpu/model.part3
sha256sum "$MODEL" | cut -d' ' -f1 > .gpu/model.sha256
# The k-quant model: Q4_K_M (Q4_K + Q6_K + Q5_0 + Q8_0 tensors), 101 MiB, in two calls of its own.
KMODEL="${EDGE_RUN_MODELS:-models}/SmolLM2-135M-Instruct.Q4_K_M.gguf"
[ -f "$KMODEL" ] || ./scripts/make-quant-models.sh Q4_K_M >&2
head -c "$FIRST" "$KMODEL" > .gpu/stash2/q4km.part1
tail -c +"$((FIRST + 1))" "$KMODEL" > .gpu/stash3/q4km.part2
sha256sum "$KMODEL" | cut -d' ' -f1 > .gpu/q4km.sha256
du -sh .gpu/bin .gpu/shared .gpu/stash1 .gpu/stash2 .gpu/stash3 .gpu/model.part3
for i in 1 2 3; do
    echo "call $i: $(du -cb .gpu/stash$i | tail -1 | cut -f1) bytes (limit 67108864); carries: .gpu/stash$i  (command: bash scripts/gpu-run.sh stash)"
done
echo "call 4: $(du -cb .gpu/bin .gpu/shared .gpu/model.part3 .gpu/model.sha256 .gpu/q4km.sha256 | tail -1 | cut -f1) bytes (limit 67108864); carries: .gpu/bin .gpu/shared .gpu/model.part3 .gpu/model.sha256 .gpu/q4km.sha256  (command: bash scripts/gpu-run.sh)"
