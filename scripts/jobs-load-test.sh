#!/usr/bin/env bash
# A light tenant beside another tenant's heavy jobs: the light tenant's one-datum
# `forward_backward` latency through the official `tinker` SDK alone, then while the heavy
# tenant's 4 jobs of JOB (default examples/tictactoe.toml: a full-parameter warm-up, then RL)
# run on the same served base of a release `opentinker serve`. Prints the figures and the
# server's peak resident memory. Loopback only; the SDK's venv is the test script's.
#
#   scripts/jobs-load-test.sh [JOB]
set -euo pipefail
cd "$(dirname "$0")/.."
job="$(realpath "${1:-examples/tictactoe.toml}")"

cargo build --release --locked --quiet --bin opentinker
source scripts/service-common.sh

light="$("$bin" tenant create light --data "$data" 2>/dev/null)"
heavy="$("$bin" tenant create heavy --data "$data" 2>/dev/null)"
start_server "$data"

( while kill -0 "$server" 2>/dev/null; do
      awk '/VmRSS/ {print $2}' "/proc/$server/status" >> "$data/rss"; sleep 1
  done ) 2>/dev/null &   # its last write may find the folder removed at exit

machine
(cd host/tests/tinker_sdk && TINKER_BASE_URL="http://127.0.0.1:$port" LIGHT_KEY="$light" \
    HEAVY_KEY="$heavy" JOBS_FILE="$job" OPENTINKER="$(realpath "../../../$bin")" \
    "$venv/bin/python" run.py jobs_latency.py 2>/dev/null | tail -1)
awk '{if ($1 > peak) peak = $1} END {printf "server peak resident memory: %d MB\n", peak / 1024}' "$data/rss"
