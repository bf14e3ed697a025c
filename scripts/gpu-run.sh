#!/usr/bin/env bash
# Runs the GPU checks on a machine with an NVIDIA GPU and no Rust toolchain, from what
# scripts/gpu-prepare.sh put in .gpu/ (run from the repository root). Logs everything to
# $OUT/gpu.log (default ./gpu-out/gpu.log) and ends with a summary of each step's exit status.
#
#   bash scripts/gpu-run.sh stash   calls 1-3: keep .gpu/stash*/ (model parts) outside the work tree
#   bash scripts/gpu-run.sh         call 4: assemble the models, then every check below
#
# Checks: nvidia-smi; the kernel tests (every kernel against the CPU kernels) with the cubin and
# with the PTX fallback; the end-to-end tests against llama.cpp's reference on --device cuda
# (Q4_1 with f16 and q8_0 caches, and Q4_K_M for the k-quant kernels); generation on each
# weight path, on Q4_K_M, with device sampling and with a q8_0 cache;
# edge-run bench --device cuda on SmolLM2 Q4_1 (pp512, tg128, -r 3, with and without CUDA
# graphs), on Q4_K_M, and on a random 1.1B Q4_0 model written here. Expected 4-5 minutes; every
# step has its own time limit, so a hang costs that step only.
set -uo pipefail
cd "$(dirname "$0")/.."
STASH=/tmp/edge-run-gpu
mkdir -p "$STASH"
if [ "${1:-}" = "stash" ]; then
    cp .gpu/stash*/* "$STASH/" && ls -la "$STASH"
    exit $?
fi
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
: > "$LOG"
log() { echo "$*" | tee -a "$LOG"; }
SUMMARY=()
# step NAME TIMEOUT_S CMD...: runs CMD with a time limit, output to the log, records the status.
step() {
    local name="$1" limit="$2"
    shift 2
    log ""
    log "=== $name: $* ($(date -u +%H:%M:%S))"
    local t0=$SECONDS
    timeout "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    log "=== $name: exit $rc in $((SECONDS - t0)) s"
    SUMMARY+=("$name: exit $rc ($((SECONDS - t0)) s)")
}

# The driver library: cudarc loads libcuda.so at run time.
# The first match wins: the driver's own library. CUDA's forward-compatibility libcuda
# (/usr/local/cuda/compat) fails with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH against an older kernel
# driver, so it is never put on the path.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/lib64; do
    if ls "$d"/libcuda.so* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        log "libcuda found in $d"
        break
    fi
done

# first PATH THAT EXISTS: a stashed part (calls 1-3), or the same file still in .gpu/.
part() {
    for p in "$@"; do
        if [ -f "$p" ]; then
            echo "$p"
            return
        fi
    done
    echo "$1"
}
# The Q4_1 model: parts 1 and 2 from the stash (calls 1 and 3), part 3 from this call.
MODEL="$STASH/SmolLM2-135M-Instruct.Q4_1.gguf"
P1="$(part "$STASH/model.part1" .gpu/stash1/model.part1)"
P2="$(part "$STASH/model.part2" .gpu/stash3/model.part2)"
if [ -f "$P1" ] && [ -f "$P2" ] && [ -f .gpu/model.part3 ]; then
    cat "$P1" "$P2" .gpu/model.part3 > "$MODEL"
fi
if [ -f .gpu/model.sha256 ] && [ "$(sha256sum "$MODEL" 2>/dev/null | cut -d' ' -f1)" != "$(cat .gpu/model.sha256)" ]; then
    log "model: checksum mismatch or missing parts ($P1, $P2, .gpu/model.part3?): the end-to-end steps will fail"
else
    log "model: $MODEL ($(stat -c %s "$MODEL") bytes, checksum ok)"
fi
# The Q4_K_M model: both parts from the stash (calls 2 and 3). The cuda_reference test finds it
# through EDGE_RUN_MODELS (and skips, saying so, if it is missing).
KMODEL="$STASH/SmolLM2-135M-Instruct.Q4_K_M.gguf"
K1="$(part "$STASH/q4km.part1" .gpu/stash2/q4km.part1)"
K2="$(part "$STASH/q4km.part2" .gpu/stash3/q4km.part2)"
if [ -f "$K1" ] && [ -f "$K2" ]; then
    cat "$K1" "$K2" > "$KMODEL"
fi
if [ -f .gpu/q4km.sha256 ] && [ "$(sha256sum "$KMODEL" 2>/dev/null | cut -d' ' -f1)" != "$(cat .gpu/q4km.sha256)" ]; then
    log "Q4_K_M model: checksum mismatch or missing parts ($K1, $K2?): its steps will fail or skip"
    rm -f "$KMODEL"
else
    log "Q4_K_M model: $KMODEL ($(stat -c %s "$KMODEL") bytes, checksum ok)"
fi
export EDGE_RUN_MODEL="$MODEL"
export EDGE_RUN_MODELS="$STASH"
export EDGE_RUN_SHARED="$PWD/.gpu/shared"
export EDGE_RUN_QUANT_REFS="$PWD/.gpu/shared/reference"
BIN="$PWD/.gpu/bin"
chmod +x "$BIN"/* 2>/dev/null

step nvidia-smi 30 nvidia-smi
# The GPU tests are #[ignore]d (a machine without a GPU counts them as ignored): run them here.
step kernel-tests 90 "$BIN/engine-unit-tests" backend::cuda device:: --include-ignored --nocapture
step kernel-tests-ptx 90 env EDGE_RUN_CUDA_MODULE=ptx "$BIN/engine-unit-tests" backend::cuda::exec::tests:: --include-ignored --nocapture
step cuda-reference 240 "$BIN/cuda-reference-tests" --include-ignored --nocapture --test-threads=1
# Greedy generation: every weight path and the eager (no CUDA graph) decode must print the same
# text (same kernels on the same bytes); the CPU's may differ at near-ties.
gen() {
    local name="$1"
    shift
    step "generate-$name" 45 sh -c '"$@" > "$0" && cat "$0"' "$OUT/gen-$name.txt" \
        "$BIN/edge-run" "$MODEL" -p "The capital of France is" -n 32 --temp 0 "$@"
}
export RUST_LOG=info
gen upload --device cuda
EDGE_RUN_CUDA_GRAPHS=0 gen nographs --device cuda
EDGE_RUN_CUDA_WEIGHTS=register gen register --device cuda
EDGE_RUN_CUDA_WEIGHTS=managed gen managed --device cuda
gen cpu --device cpu
step generate-q4_k_m 45 "$BIN/edge-run" "$KMODEL" -p "The capital of France is" -n 32 --temp 0 --device cuda
# Sampling on the device (temperature, top-k, top-p, min-p: only the token id comes back) and
# the q8_0 KV cache, through the binary.
step generate-sampled 45 "$BIN/edge-run" "$MODEL" -p "Once upon a time" -n 48 --temp 0.8 --seed 7 --device cuda
step generate-kv-q8_0 45 "$BIN/edge-run" "$MODEL" -p "The capital of France is" -n 32 --temp 0 --kv-type q8_0 --device cuda
# Constrained output on the device (issue 20): the grammar's mask is uploaded and the masked
# logits are sampled there (one token id comes back per step); each answer must parse as JSON.
SCHEMA='{"type": "object", "properties": {"action": {"enum": ["move", "turn", "stop"]}, "distance": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["action", "distance"]}'
step constrained-greedy 45 sh -c '"$@" > "$0" && cat "$0"' "$OUT/constrained-greedy.txt" \
    "$BIN/edge-run" "$MODEL" --chat -p "Move forward 2 meters" -n 64 --temp 0 -j "$SCHEMA" --device cuda
step constrained-sampled 45 sh -c '"$@" > "$0" && cat "$0"' "$OUT/constrained-sampled.txt" \
    "$BIN/edge-run" "$MODEL" --chat -p "Turn left" -n 64 --temp 0.8 --seed 7 -j "$SCHEMA" --device cuda
for s in greedy sampled; do
    step "constrained-$s-parses" 10 python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read()))' \
        "$OUT/constrained-$s.txt"
done
unset RUST_LOG
for v in nographs register managed cpu; do
    if cmp -s "$OUT/gen-upload.txt" "$OUT/gen-$v.txt"; then same=same; else same=DIFFERENT; fi
    log "generated text, upload vs $v: $same"
    SUMMARY+=("generated text upload vs $v: $same")
done
step plan-cuda 20 "$BIN/edge-run" plan "$MODEL" --device cuda
step bench-smollm2 120 "$BIN/edge-run" bench "$MODEL" -p 512 -n 128 -r 3 --device cuda
step bench-smollm2-nographs 90 env EDGE_RUN_CUDA_GRAPHS=0 "$BIN/edge-run" bench "$MODEL" -p 512 -n 128 -r 2 --device cuda
step bench-smollm2-cpu 60 "$BIN/edge-run" bench "$MODEL" -p 128 -n 32 -r 1 --device cpu
step bench-q4_k_m 90 "$BIN/edge-run" bench "$KMODEL" -p 512 -n 128 -r 2 --device cuda
SYNTH="$STASH/synth-1b-q4_0.gguf"
step synth-model 60 "$BIN/synth_model" "$MODEL" "$SYNTH"
step bench-synth-1b 150 "$BIN/edge-run" bench "$SYNTH" -p 512 -n 128 -r 3 --device cuda
rm -f "$SYNTH"

log ""
log "=== summary"
for s in "${SUMMARY[@]}"; do log "$s"; done
grep -E "test result|teacher-forced|cuda greedy|decode vs prefill|skipped|\| .*(pp|tg)[0-9]+ " "$LOG" | tee "$OUT/summary.txt"
