#!/usr/bin/env bash
# Run every test of opentinker from a fresh clone. Installs what the tests need first: the
# pinned toolchain (rust-toolchain.toml) with its wasm32-wasip2 target, which the tests use to
# build the plugin components of plugins/. No Python is needed. The suite is built with the `cuda`
# feature, which needs no CUDA toolkit: the GPU tests compile and, on a machine without a GPU,
# report themselves skipped (scripts/gpu-check.sh runs them on one).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install                        # the toolchain of rust-toolchain.toml, its components and targets
rustup target add wasm32-wasip2

cargo fmt --all --check
cargo test --workspace --locked --features cuda "$@"
