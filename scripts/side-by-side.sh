# shellcheck shell=bash
# Sourced (not run) by the scripts that measure edge-run beside llama.cpp, from the repository
# root: the model check, llama.cpp's tools and the release edge-run binary, written once.

# need_model FILE: exits 1 with the fix named if FILE is missing.
need_model() {
  [ -f "$1" ] || { echo "error: $1: no such file (scripts/fetch-model.sh downloads the default model)" >&2; exit 1; }
}

# use_peer TOOL...: builds llama.cpp once per machine (../shared/peer/build-llama-cpp.sh), sets
# PEER_BIN to its tools and exits 1 if one of the TOOLs is not among them. A PEER_BIN already
# set names another build of it (the shared build turns on AVX-VNNI wherever AVX-512 is
# present, and its tools die of an illegal instruction on a CPU without it: AMD Zen 4).
use_peer() {
  PEER_BIN=${PEER_BIN:-$(../shared/peer/build-llama-cpp.sh)}
  local tool
  for tool in "$@"; do
    [ -x "$PEER_BIN/$tool" ] || { echo "error: $PEER_BIN/$tool not found after building the peer" >&2; exit 1; }
  done
}

# use_edge_run: builds edge-run (release) and sets EDGE_RUN to it.
use_edge_run() {
  cargo build --release -q -p edge-run --bin edge-run >&2
  EDGE_RUN=${CARGO_TARGET_DIR:-target}/release/edge-run
}
