#!/usr/bin/env bash
# The service's overhead: one `forward_backward` + `optim_step` of the tiny model (8 datums of
# 128 tokens) through the official `tinker` SDK against a release `opentinker serve` (HTTP,
# futures, the journal's fsynced records), and the same ops in process through `service::Service`
# (host/examples/service_overhead.rs), measured one after the other in one run; prints both and
# the ratio. The SDK's venv is the test script's (made here if missing). Under
# OPENTINKER_BENCH_PROFILE=dev (the test script's quick run) both are the dev build.
#
#   scripts/bench-service.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-30}"

source scripts/service-common.sh
cargo build --profile "$profile" --features "${OPENTINKER_BENCH_FEATURES:-}" --locked --quiet \
    --bin opentinker --example service_overhead

key="$("$bin" tenant create bench --data "$data/server" 2>/dev/null)"
start_server "$data/server"

echo "$(machine), $steps steps"
sdk="$(cd host/tests/tinker_sdk && TINKER_BASE_URL="http://127.0.0.1:$port" TINKER_API_KEY="$key" \
    STEPS="$steps" "$venv/bin/python" run.py overhead.py 2>/dev/null | tail -1)"
kill "$server"; server=""
local="$("$target/examples/service_overhead" "$data/local" "$steps")"
python3 - "$sdk" "$local" <<'PY'
import json, os, sys
sdk, local = (json.loads(a) for a in sys.argv[1:])
s, l = sdk["sdk_ms_per_step"], local["in_process_ms_per_step"]
busy = os.environ.get("OPENTINKER_BENCH_BUSY")
ratio = f"ratio not reported: {busy}" if busy else f"ratio {s / l:.2f}x (goal <= 1.2x)"
print(f"through the SDK: {s:.1f} ms/step; in process: {l:.1f} ms/step; {ratio}")
PY
