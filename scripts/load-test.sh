#!/usr/bin/env bash
# The service's load test with docs/benchmarks.md's settings: eight tenants run sample + train loops
# through the official `tinker` SDK against a release `opentinker serve` for SECONDS (default
# 180), then a light tenant's `forward_backward` latency is measured alone and while three heavy
# tenants flood the server. Prints the script's figures and the server's resident memory.
# Loopback only; the SDK's venv is the test script's (made here if missing).
#
#   scripts/load-test.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-180}"

cargo build --release --locked --quiet --bin opentinker
source scripts/service-common.sh

keys=""
for i in 1 2 3 4 5 6 7 8; do
    keys="$keys,$("$bin" tenant create "tenant-$i" --data "$data" 2>/dev/null)"
done
start_server "$data"

# Resident memory once a second while the test runs.
( while kill -0 "$server" 2>/dev/null; do
      awk '/VmRSS/ {print $2}' "/proc/$server/status" >> "$data/rss"; sleep 1
  done ) 2>/dev/null &   # its last write may find the folder removed at exit

machine
(cd host/tests/tinker_sdk && TINKER_BASE_URL="http://127.0.0.1:$port" TINKER_API_KEY="${keys%%,*}" \
    LOAD_TENANT_KEYS="${keys#,}" LOAD_SECONDS="$seconds" "$venv/bin/python" run.py load.py 2>/dev/null | tail -1)
awk -v s="$seconds" 'NR == int(s / 3) {warm = $1} NR == s {end = $1} {if ($1 > peak) peak = $1}
    END {printf "resident memory: %d MB after the first third of the loops, %d MB at their end, peak %d MB\n", warm / 1024, end / 1024, peak / 1024}' "$data/rss"
