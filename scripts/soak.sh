#!/usr/bin/env bash
# The soak: eight tenants each run an SDK loop (sample, forward_backward, optim_step) and an
# OpenAI streaming loop through the official clients against a release `opentinker serve` for
# SECONDS (default 1800), each with two jobs submitted at the start: examples/tictactoe.toml on
# the built-in tiny model and the same job on a Qwen2.5-0.5B-shaped base the server serves (both
# with a full-parameter warm-up; the latter evaluates on 16 episodes so that its sampler's KV
# cache stays small), all admitted under `--memory-budget` (BUDGET, default 16GiB), each base's
# running samples held to 32,768 KV positions, answers kept RETENTION seconds (default 300, so
# that the database reaches its plateau within the soak; a server's default is an hour).
# Halfway through, the server is killed with SIGKILL and started again on the same port and
# data. Prints the clients' figures (calls answered, p50 / p99 per route, failures, each
# tenant's optimizer steps as answered and as the server counted them), the jobs' states, the
# server's peak resident memory against the budget and the database's size over time.
# Loopback only; the SDK's venv is the test script's (made here if missing).
#
#   scripts/soak.sh [SECONDS]        (SOAK_KEEP=DIR: the data folder is copied there at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-1800}"
budget="${BUDGET:-16GiB}"

cargo build --release --locked --quiet --bin opentinker
source scripts/service-common.sh

"$bin" model init-tiny "$data/half" --shape qwen2.5-0.5b --arch qwen2 --seed 0 >/dev/null
keys="" names=""
for i in 1 2 3 4 5 6 7 8; do
    keys="$keys,$("$bin" tenant create "soak-$i" --data "$data" 2>/dev/null)"
    names="$names,soak-$i"
done
keys="${keys#,}" names="${names#,}"
export SERVE_FLAGS="--model qwen-half=$data/half --memory-budget $budget --kv-positions 32768 \
    --answer-retention-secs ${RETENTION:-300}"
start_server "$data"
url="http://127.0.0.1:$port"

# Resident memory (kB) and the database's size (bytes, with its write-ahead log) every 5 s.
echo "$server" > "$data/server.pid"
( while true; do
      rss=$(awk '/VmRSS/ {print $2}' "/proc/$(cat "$data/server.pid")/status" 2>/dev/null || echo 0)
      db=$(cat "$data"/opentinker.sqlite3* 2>/dev/null | wc -c)
      echo "$SECONDS ${rss:-0} $db" >> "$data/samples"; sleep 5
  done ) 2>/dev/null &
sampler=$!

sed 's/^init_tiny = .*/base = "qwen-half"/' examples/tictactoe.toml > "$data/half.toml"
sed -i -e 's|"\.\./plugins/|"'"$PWD"'/plugins/|' -e 's/^episodes = .*/episodes = 16/' \
    -e 's/^groups_per_batch = .*/groups_per_batch = 4/' -e 's/^group_size = .*/group_size = 4/' "$data/half.toml"
jobs=()
for i in 1 2 3 4 5 6 7 8; do
    key=$(cut -d, -f"$i" <<< "$keys")
    for job in examples/tictactoe.toml "$data/half.toml"; do
        said=$(TINKER_BASE_URL="$url" TINKER_API_KEY="$key" "$bin" submit "$job" --detach 2>&1)
        jobs+=("$key $(grep -o 'job-[a-z0-9-]*' <<< "$said" | head -1)")
    done
done

machine
(cd host/tests/tinker_sdk && TINKER_BASE_URL="$url" TINKER_API_KEY="${keys%%,*}" \
    SOAK_TENANT_KEYS="$keys" SOAK_TENANT_NAMES="$names" SOAK_SECONDS="$seconds" \
    OPENTINKER_DATA="$data" "$venv/bin/python" soak.py > "$data/soak.out" 2>"$data/soak.err") &
clients=$!
sleep $((seconds / 2))
kill -9 "$server"; wait "$server" 2>/dev/null || true
"$bin" serve --data "$data" --addr "127.0.0.1:$port" $SERVE_FLAGS > "$data/serve.log" 2>&1 &
server=$!
echo "$server" > "$data/server.pid"
until grep -q "serving on" "$data/serve.log"; do sleep 0.2; done
echo "killed at $((seconds / 2)) s and restarted: $(head -1 "$data/serve.log")"
wait "$clients"
tail -1 "$data/soak.out"

for entry in "${jobs[@]}"; do
    read -r key id <<< "$entry"
    state=$(TINKER_BASE_URL="$url" TINKER_API_KEY="$key" "$bin" jobs list | awk -v id="$id" '$1 == id {print $2}')
    echo "$state"
    TINKER_BASE_URL="$url" TINKER_API_KEY="$key" "$bin" jobs cancel "$id" >/dev/null 2>&1 || true
done | sort | uniq -c | sed 's/^/jobs at the end: /'
kill "$sampler"
awk -v budget="$budget" -v s="$seconds" '
    {if ($2 > peak) peak = $2; t = $1 - first; if (NR == 1) {first = $1; t = 0}
     if (!warm && t >= s / 6) warm = $3; if (!half && t >= s / 2 - 5) half = $3; if ($3 > top) top = $3; last = $3}
    END {printf "server peak resident memory: %.1f GiB (budget %s)\n", peak / 1048576, budget;
         printf "database: %.1f MB at %d s, %.1f MB before the kill, %.1f MB at the end (largest %.1f MB)\n",
                warm / 1e6, s / 6, half / 1e6, last / 1e6, top / 1e6}' "$data/samples"
if [ -n "${SOAK_KEEP:-}" ]; then cp -r "$data" "$SOAK_KEEP"; fi
