#!/usr/bin/env bash
# The jobs service on the examples: tictactoe.toml and arithmetic.toml submitted by two tenants to
# one `opentinker serve` reach the figures of examples/README.md, in about the wall time of the two
# run together by `train` (the test prints both and the ratio). Minutes of training: not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-$(nproc)}"
cargo test --release -p opentinker --test jobs_service -- --ignored --nocapture two_tenants
