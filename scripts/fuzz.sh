#!/usr/bin/env bash
# Fuzz what opentinker reads from others (the targets of fuzz/, cargo fuzz on the nightly
# toolchain), each target for SECONDS (default 60), two at a time:
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Each target starts from its seeds in fuzz/corpus/TARGET (kept in the repository) and what
# earlier runs found (target/fuzz/corpus/TARGET, kept between runs as cargo's build is). A run
# that finds a crash, a panic or a leak past its memory limit fails and names the input that
# did it (under target/fuzz/artifacts/TARGET/); `cargo +nightly fuzz run TARGET FILE` replays
# it. scripts/test.sh runs this after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^opentinker-fuzz$')
fi

# The nightly toolchain cargo fuzz needs, and cargo fuzz itself: each a no-op when present.
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz --version 0.13.2 --locked

# No sanitizer: the targets are safe Rust, so what fuzzing finds is a panic, a hang or memory
# past the limit, which libFuzzer catches without one. The dev profile: it builds in far less
# time than a release one, and its overflow checks make a wrapping sum a finding too.
fuzz=(cargo +nightly fuzz)
build_args=(--dev --sanitizer none --target-dir target/fuzz)
"${fuzz[@]}" build "${build_args[@]}"

run_one() {
    local target="$1" found="target/fuzz/corpus/$1"
    mkdir -p "$found" "target/fuzz/artifacts/$target"
    # -rss_limit_mb: a request that makes the process hold 2 GiB is a finding, not a pass.
    "${fuzz[@]}" run "${build_args[@]}" "$target" "$found" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="target/fuzz/artifacts/$target/" \
        > "target/fuzz/$target.log" 2>&1
}

failed=()
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    pids=()
    for target in "${targets[@]:i:2}"; do
        run_one "$target" &
        pids+=("$!:$target")
    done
    for entry in "${pids[@]}"; do
        target="${entry#*:}"
        if wait "${entry%%:*}"; then
            runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "target/fuzz/$target.log" | tail -1)"
            echo "  $target: ${runs:-?} inputs in ${seconds} s, nothing found"
        else
            echo "  $target: FOUND something (target/fuzz/$target.log):"
            tail -30 "target/fuzz/$target.log" | sed 's/^/    /'
            failed+=("$target")
        fi
    done
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzzing found inputs that fail: ${failed[*]}" >&2
    exit 1
fi
