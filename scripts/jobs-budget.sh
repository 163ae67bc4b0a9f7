#!/usr/bin/env bash
# One tenant's four heavy jobs under the memory budget, on a Qwen2.5-0.5B-shaped base: a release
# `opentinker serve` serves the base (random weights, generated here) under `--memory-budget`
# (BUDGET, default 20GiB: room for one job's copy of the base at a time, about 13.5 GiB by the
# jobs' estimate beside the 3.6 GiB the served bases are counted at); a heavy tenant submits
# 4 jobs of examples/tictactoe.toml on it, shortened to its full-parameter warm-up of 3 steps and
# 8 evaluation episodes (no RL steps: the random base samples token ids past its 512-token
# tokenizer, which every episode's render refuses); a light tenant's SDK loop runs on the tiny
# model throughout.
# Once the first job has finished, the server is killed with SIGKILL and started again on the
# same port and data. Prints how the jobs ran (each one's state over time), the light tenant's
# figures, and the server's peak resident memory against the budget.
#
#   scripts/jobs-budget.sh
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${BUDGET:-20GiB}"

cargo build --release --locked --quiet --bin opentinker
source scripts/service-common.sh

"$bin" model init-tiny "$data/half" --shape qwen2.5-0.5b --arch qwen2 --seed 0 >/dev/null
light="$("$bin" tenant create light --data "$data" 2>/dev/null)"
heavy="$("$bin" tenant create heavy --data "$data" 2>/dev/null)"
export SERVE_FLAGS="--model qwen-half=$data/half --memory-budget $budget --kv-positions 32768"
start_server "$data"
url="http://127.0.0.1:$port"
echo "$server" > "$data/server.pid"
( while true; do
      awk '/VmRSS/ {print $2}' "/proc/$(cat "$data/server.pid")/status" 2>/dev/null >> "$data/rss"
      sleep 1
  done ) &
sampler=$!

sed -e 's/^init_tiny = .*/base = "qwen-half"/' -e 's|"\.\./plugins/|"'"$PWD"'/plugins/|' \
    -e '/^\[sft\]/,/^\[/ s/^steps = .*/steps = 3/' -e '/^\[rl\]/,/^\[/ s/^steps = .*/steps = 0/' \
    -e 's/^episodes = .*/episodes = 8/' -e 's/^groups_per_batch = .*/groups_per_batch = 4/' \
    -e 's/^group_size = .*/group_size = 4/' -e 's/^every = .*/every = 2/' \
    examples/tictactoe.toml > "$data/heavy.toml"
machine
(cd host/tests/tinker_sdk && TINKER_BASE_URL="$url" TINKER_API_KEY="$light" \
    LIGHT_STOP="$data/stop" "$venv/bin/python" light_loop.py > "$data/light.out" 2>&1) &
light_loop=$!
jobs=()
for i in 1 2 3 4; do
    said=$(TINKER_BASE_URL="$url" TINKER_API_KEY="$heavy" "$bin" submit "$data/heavy.toml" --detach 2>&1)
    jobs+=("$(grep -o 'job-[a-z0-9-]*' <<< "$said" | head -1)")
done
list() { TINKER_BASE_URL="$url" TINKER_API_KEY="$heavy" "$bin" jobs list 2>>"$data/list.err"; }
start=$SECONDS killed=""
while true; do
    listed=$(list || true)
    states=$(awk '{print $2}' <<< "$listed" | sort | uniq -c | xargs)
    echo "$((SECONDS - start)) s: $states"
    if [ -z "$killed" ] && grep -q succeeded <<< "$listed"; then
        kill -9 "$server"; wait "$server" 2>/dev/null || true
        "$bin" serve --data "$data" --addr "127.0.0.1:$port" $SERVE_FLAGS > "$data/serve.log" 2>&1 &
        server=$!
        echo "$server" > "$data/server.pid"
        until grep -q "serving on" "$data/serve.log"; do sleep 0.2; done
        killed=yes
        echo "killed after the first job and restarted: $(head -1 "$data/serve.log")"
    fi
    if [ -n "$listed" ] && ! grep -qE "queued|running" <<< "$listed"; then break; fi
    sleep 20
done
for id in "${jobs[@]}"; do
    TINKER_BASE_URL="$url" TINKER_API_KEY="$heavy" "$bin" jobs status "$id" 2>&1 |
        grep -E '"(state|error)"' | xargs echo "$id:"
done
touch "$data/stop"
wait "$light_loop"
echo "light tenant: $(tail -1 "$data/light.out")"
kill "$sampler"
awk -v budget="$budget" '{if ($1 > peak) peak = $1}
    END {printf "server peak resident memory: %.1f GiB (budget %s)\n", peak / 1048576, budget}' "$data/rss"
