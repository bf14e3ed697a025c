#!/usr/bin/env bash
# The benchmark matrix of issue 17: every file scripts/make-bench-models.sh writes, on every
# kernel set this CPU has (forced with EDGE_RUN_ISA: avx2, avx512, neon) and on the automatic
# choice (EDGE_RUN_ISA unset: kernels chosen by measurement), edge-run's `bench` and llama.cpp's
# `llama-bench` run alternately (same threads, same pp/tg sizes), plus `edge-run bench
# --bandwidth` once per file for the decode speed the memory bandwidth allows. Prints one
# markdown table: tokens/s of both engines, the ratios edge-run / llama.cpp (> 1: edge-run is
# faster) and edge-run's decode speed as a share of the bandwidth limit.
#
#   scripts/bench-matrix.sh [ROUNDS]
#   FILES="synth-qwen3-0.6b.Q4_K_M.gguf" ISAS="avx2 auto" ROUNDS=1 REPS=2 scripts/bench-matrix.sh
#   DEPTH=4096 PP=64 TG=32 ISAS=auto scripts/bench-matrix.sh   # speed at 4,096 tokens of context
#
# Sizes: pp128/tg32 for files over 300 MB, pp512/tg128 otherwise. Each cell takes ROUNDS rounds
# of (llama-bench, edge-run bench), each with REPS timed repetitions; the cells of one file
# alternate within a round, so all sets of a file see the same machine conditions.
# Environment:
#   ROUNDS   rounds per cell (default 3; the first argument overrides)
#   REPS     timed repetitions per run of either tool (default 5)
#   FILES    a subset of the matrix: paths, or names in models/ (space-separated)
#   ISAS     a subset of the sets: avx2 avx512 neon auto (default: those this CPU has, and auto)
#   THREADS  threads for both engines (default: the CPUs, nproc)
#   DEPTH    tokens of context before each test (both tools' -d; default 0): "pp64 @ d4096"
#   PP, TG   prompt and generation sizes for every file instead of the size rule above
#   EDGE_RUN an edge-run binary to use instead of building target/release/edge-run
#   RAW      a directory to keep every tool's JSON output in (default: a temporary one)
#   PEER_BIN llama.cpp's tools from another build than ../shared/peer's (see side-by-side.sh)
# Needs python3 (with gguf and numpy to make the files), cargo and the peer llama.cpp
# (../shared/peer/build-llama-cpp.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-${ROUNDS:-3}}
REPS=${REPS:-5}
THREADS=${THREADS:-$(nproc)}
MODEL_DIR="${EDGE_RUN_MODELS:-models}"
BIG_BYTES=300000000
DEPTH=${DEPTH:-0}
case "$DEPTH" in '' | *[!0-9]*) echo "error: DEPTH=$DEPTH must be a whole number" >&2; exit 2 ;; esac
for v in ROUNDS REPS THREADS ${PP:+PP} ${TG:+TG}; do
  case "${!v}" in
    '' | *[!0-9]* | 0) echo "error: $v=${!v} must be a positive integer" >&2; exit 2 ;;
  esac
done

# The kernel sets this CPU runs (the conditions edge-engine's kernels detect).
have_sets=()
case "$(uname -m)" in
  x86_64)
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
    if has avx2 fma f16c; then
      have_sets+=(avx2)
      has avx512f avx512bw avx512vl avx512_vnni && have_sets+=(avx512)
    fi
    ;;
  aarch64 | arm64) have_sets+=(neon) ;;
esac
read -r -a SETS <<< "${ISAS:-${have_sets[*]} auto}"
for s in "${SETS[@]}"; do
  [ "$s" = auto ] && continue
  [[ " ${have_sets[*]} " == *" $s "* ]] \
    || { echo "error: ISAS names '$s', which this CPU does not run (it has: ${have_sets[*]:-none} auto)" >&2; exit 2; }
done

if [ -n "${FILES:-}" ]; then
  read -r -a names <<< "$FILES"
  MATRIX=()
  for f in "${names[@]}"; do
    [ -f "$f" ] || f="$MODEL_DIR/$f"
    [ -f "$f" ] || { echo "error: FILES names $f: no such file (scripts/make-bench-models.sh writes the matrix)" >&2; exit 2; }
    MATRIX+=("$f")
  done
else
  mapfile -t MATRIX < <(./scripts/make-bench-models.sh)
  [ ${#MATRIX[@]} -gt 0 ] || { echo "error: scripts/make-bench-models.sh wrote no files" >&2; exit 1; }
fi

PEER_BIN=${PEER_BIN:-$(../shared/peer/build-llama-cpp.sh)}
LLAMA_BENCH=$PEER_BIN/llama-bench
[ -x "$LLAMA_BENCH" ] || { echo "error: $LLAMA_BENCH not found after building the peer" >&2; exit 1; }
if [ -z "${EDGE_RUN:-}" ]; then
  cargo build --release -q -p edge-run --bin edge-run >&2
  EDGE_RUN=${CARGO_TARGET_DIR:-target}/release/edge-run
fi
[ -x "$EDGE_RUN" ] || { echo "error: EDGE_RUN=$EDGE_RUN is not an executable" >&2; exit 2; }

if [ -n "${RAW:-}" ]; then
  OUT=$RAW
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
fi

# One tool run; on failure its log goes to stderr and an .err file marks the cell.
run_llama() { # DIR ROUND MODEL P N
  LD_LIBRARY_PATH=$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    "$LLAMA_BENCH" -m "$3" -t "$THREADS" -p "$4" -n "$5" -d "$DEPTH" -r "$REPS" -o json \
    > "$1/llama-$2.json" 2> "$1/llama-$2.log" \
    || { echo "error: llama-bench failed on $3:" >&2; tail -5 "$1/llama-$2.log" >&2; cp "$1/llama-$2.log" "$1/llama.err"; }
}
run_edge() { # DIR ROUND MODEL P N SET
  local isa=()
  [ "$6" = auto ] || isa=(EDGE_RUN_ISA="$6")
  env -u EDGE_RUN_ISA "${isa[@]}" "$EDGE_RUN" bench "$3" -t "$THREADS" -p "$4" -n "$5" -d "$DEPTH" -r "$REPS" --json \
    > "$1/edge-$2.json" 2> "$1/edge-$2.log" \
    || { echo "error: edge-run bench failed on $3 ($6):" >&2; tail -5 "$1/edge-$2.log" >&2; cp "$1/edge-$2.log" "$1/edge.err"; }
}

t0=$SECONDS
for i in "${!MATRIX[@]}"; do
  model=${MATRIX[$i]}
  size=$(stat -c %s "$model")
  if [ "$size" -gt "$BIG_BYTES" ]; then P=128; N=32; else P=512; N=128; fi
  P=${PP:-$P}; N=${TG:-$N}
  dir=$OUT/$i
  mkdir -p "$dir"
  printf '%s\n%s\n%s\n%s\n' "$model" "$size" "$P" "$N" > "$dir/info"
  echo "[$((SECONDS - t0))s] $(basename "$model"): bandwidth limit" >&2
  env -u EDGE_RUN_ISA "$EDGE_RUN" bench "$model" -t "$THREADS" -p 8 -n 4 -r 1 --bandwidth --json \
    > "$dir/bandwidth.json" 2> "$dir/bandwidth.log" \
    || { echo "error: edge-run bench --bandwidth failed on $model:" >&2; tail -5 "$dir/bandwidth.log" >&2; }
  for round in $(seq 1 "$ROUNDS"); do
    for s in "${SETS[@]}"; do
      mkdir -p "$dir/$s"
      [ -e "$dir/$s/llama.err" ] || [ -e "$dir/$s/edge.err" ] && continue
      echo "[$((SECONDS - t0))s] $(basename "$model") pp$P/tg$N, $s, round $round/$ROUNDS: llama-bench, edge-run bench" >&2
      run_llama "$dir/$s" "$round" "$model" "$P" "$N"
      run_edge "$dir/$s" "$round" "$model" "$P" "$N" "$s"
    done
  done
done
echo "[$((SECONDS - t0))s] done" >&2

python3 - "$OUT" "${#MATRIX[@]}" "$ROUNDS" "$REPS" "$THREADS" "$DEPTH" "${SETS[@]}" <<'PY'
import json, os, statistics, sys

out, n_files, rounds, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
depth = int(sys.argv[6])
sets = sys.argv[7:]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mean_sd(xs):
    if not xs:
        return None
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def cell(ms):
    return "error" if ms is None else f"{ms[0]:.1f} ± {ms[1]:.1f}"


def ratio(e, l):
    return "–" if e is None or l is None or l[0] == 0 else f"{e[0] / l[0]:.2f}x"


failed = False
print(f"{threads} threads, {rounds} rounds of {reps} repetitions per cell; tokens/s (mean ± sd); "
      "ratio = edge-run / llama.cpp; share = edge-run tg / the bandwidth limit of `bench --bandwidth`")
print()
print("| file | set | pp llama.cpp | pp edge-run | ratio | tg llama.cpp | tg edge-run | ratio | tg share of bandwidth limit |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for i in range(n_files):
    d = f"{out}/{i}"
    model, size, p, n = open(f"{d}/info").read().split("\n")[:4]
    size, p, n = int(size), int(p), int(n)
    bw = load(f"{d}/bandwidth.json") or {}
    limit = bw.get("tg_limit")
    at = f" @ d{depth}" if depth else ""
    name = f"{os.path.basename(model)} ({size / 1e6:.0f} MB, pp{p}/tg{n}{at})"
    for s in sets:
        llama = {"pp": [], "tg": []}
        edge = {"pp": [], "tg": []}
        isa = None
        for r in range(1, rounds + 1):
            for t in load(f"{d}/{s}/llama-{r}.json") or []:
                # llama-bench: one object per test; pp tests have n_gen 0, tg tests n_prompt 0
                if t.get("n_depth", 0) != depth:
                    continue
                if t.get("n_prompt") == p and t.get("n_gen") == 0:
                    llama["pp"].extend(t["samples_ts"])
                elif t.get("n_gen") == n and t.get("n_prompt") == 0:
                    llama["tg"].extend(t["samples_ts"])
            e = load(f"{d}/{s}/edge-{r}.json")
            if e:
                edge["pp"].extend(e["pp_samples"])
                edge["tg"].extend(e["tg_samples"])
                isa = e.get("isa")
        lp, ep, lt, et = mean_sd(llama["pp"]), mean_sd(edge["pp"]), mean_sd(llama["tg"]), mean_sd(edge["tg"])
        failed |= None in (lp, ep, lt, et)
        label = s
        if s == "auto" and isa:
            label = f"auto ({isa})"
        elif isa and not isa.startswith(s):
            # EDGE_RUN_ISA names a set this build lacks: edge-run falls back; say so.
            label = f"{s} (ran {isa})"
            failed = True
        share = "–" if et is None or not limit else f"{et[0] / limit:.0%} of {limit:.1f}"
        print(f"| {name} | {label} | {cell(lp)} | {cell(ep)} | {ratio(ep, lp)} | {cell(lt)} | {cell(et)} | {ratio(et, lt)} | {share} |")
sys.exit(1 if failed else 0)
PY
