#!/usr/bin/env bash
# Run every test of opentinker from a fresh clone. Installs what the tests need first: the
# pinned toolchain (rust-toolchain.toml) with its wasm32-wasip2 target, which the tests use to
# build the plugin components of plugins/. No Python is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup show active-toolchain >/dev/null          # installs the pinned toolchain if it is missing
rustup target add wasm32-wasip2 >/dev/null 2>&1 || rustup target add wasm32-wasip2

cargo fmt --all --check
cargo test --workspace --locked "$@"
