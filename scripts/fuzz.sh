#!/usr/bin/env bash
# Runs each coverage-guided fuzz target in fuzz/ briefly (default 30 s each; first argument:
# seconds per target), from the seed corpus in fuzz/corpus/TARGET. A crash or a timeout fails the
# script; libFuzzer saves the input under fuzz/artifacts/ (turn it into a regression test).
#
# Built with plain cargo + libfuzzer-sys and the same sanitizer-coverage flags cargo-fuzz passes
# (no sanitizer), so that CI needs neither cargo-fuzz nor a nightly toolchain. Developers with
# cargo-fuzz can also run e.g. `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run gguf -s none`.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
targets=(gguf tokenizer chat_template model_metadata)
triple="$(rustc -vV | sed -n 's/^host: //p')"
target_dir="${FUZZ_TARGET_DIR:-$PWD/target/fuzz}"
# --target keeps these flags off build scripts and proc-macros.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
t0=$(date +%s)
cargo build --release --manifest-path fuzz/Cargo.toml --target "$triple" --target-dir "$target_dir" --bins
echo "fuzz: built in $(( $(date +%s) - t0 )) s"
mkdir -p fuzz/artifacts
for t in "${targets[@]}"; do
    work="$(mktemp -d)"
    echo "fuzz: $t for $secs s"
    # New inputs go to the scratch dir; the committed seeds stay as they are.
    status=0
    "$target_dir/$triple/release/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="fuzz/artifacts/$t-" -print_final_stats=1 "$work" "fuzz/corpus/$t" \
        >"$work.log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$work.log"
    else
        grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$work.log" || true
    fi
    rm -rf "$work" "$work.log"
    if [ "$status" -ne 0 ]; then
        echo "fuzz: $t FAILED (exit $status); the input is in fuzz/artifacts/" >&2
        exit 1
    fi
done
echo "fuzz: ${#targets[@]} targets, no crash ($(( $(date +%s) - t0 )) s in all)"
