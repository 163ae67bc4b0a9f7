#!/usr/bin/env bash
# The plugin-call benchmark with its Python peer: installs FastAPI + uvicorn into a virtual
# environment outside the repository, then runs `cargo bench --bench plugin_calls` with it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${OPENTINKER_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/bench-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet -r bench/python/requirements.txt
PYTHON="$venv/bin/python" cargo bench -p opentinker --bench plugin_calls "$@"
