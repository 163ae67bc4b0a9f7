# Sourced by the service's benchmark scripts: the SDK's venv (the test script's, made if
# missing) and an `opentinker serve` (release unless OPENTINKER_BENCH_PROFILE=dev) on loopback
# with its own data folder, stopped and removed on exit. After `start_server`: $bin, $data,
# $port, $server.

source scripts/venv.sh
venv="${OPENTINKER_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-venv}"
make_venv "$venv" scripts/requirements-test.txt
# The build profile (OPENTINKER_BENCH_PROFILE, release unless told) and its output folder.
profile="${OPENTINKER_BENCH_PROFILE:-release}"
target="target/$([[ "$profile" == dev ]] && echo debug || echo "$profile")"
bin="$target/opentinker"

data="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    rm -rf "$data"
}
trap cleanup EXIT

# start_server DATA_DIR: serve DATA_DIR on a random loopback port; returns once it listens.
start_server() {
    port=$((20000 + RANDOM % 20000))
    "$bin" serve --data "$1" --addr "127.0.0.1:$port" ${SERVE_FLAGS:-} > "$data/serve.log" 2>&1 &
    server=$!
    until grep -q "serving on" "$data/serve.log"; do sleep 0.2; done
}

# The line the figures are printed under.
machine() {
    echo "$(date -u +%F) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
}
