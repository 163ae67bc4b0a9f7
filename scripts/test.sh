#!/usr/bin/env bash
# Run every test of opentinker from a fresh clone. Installs what the tests need first: the
# pinned toolchain (rust-toolchain.toml) with its wasm32-wasip2 target, which the tests use to
# build the plugin components of plugins/; Debian's Chromium, for the dashboard's browser test,
# and its docker-registry and skopeo, for the marketplace's tests; and
# a Python virtual environment outside the repository with the official `tinker` and `openai`
# clients and Playwright (scripts/requirements-test.txt), which drive `opentinker serve`; it is
# made once and reused; and, beside it, the JavaScript plugins' toolchain (componentize-js and
# esbuild, pinned by sdk/js/toolchain/package-lock.json), installed with npm. The suite is built
# with the `cuda`
# feature, which needs no CUDA toolkit: the GPU tests compile and, on a machine without a GPU,
# report themselves skipped (scripts/gpu-check.sh runs them on one). Then every benchmark's
# quick mode (scripts/bench.sh all --quick).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install                        # the toolchain of rust-toolchain.toml, its components and targets
rustup target add wasm32-wasip2

# Debian's packages the tests drive: Chromium, headless, for the dashboard's test (through
# Playwright, from the venv); the CNCF distribution registry (`docker-registry`), a real OCI
# registry for the marketplace's tests, and `skopeo`, a third-party OCI client that pulls what
# opentinker publishes.
missing=()
for want in chromium:chromium docker-registry:docker-registry skopeo:skopeo; do
    command -v "${want%%:*}" > /dev/null || missing+=("${want#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    as_root=""
    [[ $(id -u) -eq 0 ]] || as_root="sudo"
    $as_root apt-get install -y --no-install-recommends "${missing[@]}" \
        || { $as_root apt-get update && $as_root apt-get install -y --no-install-recommends "${missing[@]}"; }
fi

# The SDK's virtual environment, remade only when the requirements change.
source scripts/venv.sh
venv="${OPENTINKER_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-venv}"
make_venv "$venv" scripts/requirements-test.txt
export OPENTINKER_TEST_PYTHON="$venv/bin/python"
export OPENTINKER_COMPONENTIZE_PY="$venv/bin/componentize-py"

# The JavaScript toolchain, remade only when its lock file changes.
source scripts/js-toolchain.sh
js_toolchain="${OPENTINKER_JS_TOOLCHAIN:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-js-toolchain}"
make_js_toolchain "$js_toolchain"
export OPENTINKER_JS_TOOLCHAIN="$js_toolchain"

# The Python SDK's tests, then each Python plugin's own, each in its own process (a module marks
# one plugin class per kind).
PYTHONPATH=sdk/python/src "$venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/tests
for plugin in plugins/python/*/; do
    [[ -d "$plugin/tests" ]] || continue
    (cd "$plugin" && PYTHONPATH="$OLDPWD/sdk/python/src:." "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
done

# The JavaScript SDK's tests, then each JavaScript plugin's own, in Node's test runner (npm links
# the SDK, a `file:` dependency, without the registry).
node --test sdk/js/test/
for plugin in plugins/js/*/; do
    [[ -d "$plugin/test" ]] || continue
    (cd "$plugin" && npm install --no-audit --no-fund --no-package-lock --offline --loglevel=error && node --test test/)
done

# A one-shot CI build gains nothing from incremental compilation, whose caches are most of the
# disk a fresh clone's build takes (the CI disk is shared; a full one kills the linker with SIGBUS).
if [[ -n "${CI:-}" ]]; then
    export CARGO_INCREMENTAL=0
fi

# Tests run the engine inside their own processes, whose `main` is not the binary's: fix candle's
# thread count here as the binary does at start-up (host/src/compute_threads.rs), or every matrix
# product re-reads /proc/cpuinfo.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-$(nproc)}"

cargo fmt --all --check
cargo test --workspace --locked --features cuda "$@"

# Every benchmark in its quick mode (tiny shapes, one iteration, no peers), so that one that no
# longer builds or panics fails here rather than waiting for the next person who runs it. Not
# when the tests were narrowed by arguments.
if [[ $# -eq 0 ]]; then
    scripts/bench.sh all --quick
fi
