#!/usr/bin/env bash
# Issue 41's bar for the defaults: every defaults-only job of `examples/defaults/` (the model and
# the plugins, nothing under [sft], [rl] or [lora]) trained with a release `opentinker train`, once
# per seed of its tiny model (SEEDS, default "0 1 2"; the seed makes a different model, and so a
# different warm-up and RL), one job at a time. For each environment it first measures the
# untrained model (the same file with one RL step of 2 episodes and no warm-up: its evaluation
# before RL). Prints one row per run: the greedy success of the untrained model, after the
# warm-up, after RL, and the run's wall time. The runs' folders and logs stay in WORK (default:
# a new temporary folder, named at the end).
#
#   scripts/learning-defaults.sh                 # every environment, seeds 0 1 2
#   SEEDS=0 scripts/learning-defaults.sh take-away grid-walk
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${SEEDS:-0 1 2}"
limit="${LIMIT:-900}"

cargo build --release --locked --quiet --bin opentinker
bin="$PWD/target/release/opentinker"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"

if [ "$#" -gt 0 ]; then
    names=("$@")
else
    names=()
    for file in examples/defaults/*.toml; do names+=("$(basename "$file" .toml)"); done
fi

success() { # the `success_rate` of summary field $2 in the JSON line of file $1
    python3 -c 'import json, sys; s = json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("%.3f" % s[sys.argv[2]]["success_rate"])' "$1" "$2"
}

echo "| environment | seed | untrained | after the warm-up | after RL | wall |"
echo "|---|---|---|---|---|---|"
for name in "${names[@]}"; do
    source="examples/defaults/$name.toml"
    sed 's|"\.\./\.\./plugins/|"'"$PWD"'/plugins/|' "$source" > "$work/$name.toml"
    { cat "$work/$name.toml"; printf '[rl]\nsteps = 1\ngroups_per_batch = 1\ngroup_size = 2\n'; } \
        > "$work/$name-base.toml"
    "$bin" train "$work/$name-base.toml" --out "$work/$name-base" --json \
        > "$work/$name-base.json" 2> "$work/$name-base.log"
    untrained="$(success "$work/$name-base.json" initial_eval)"
    for seed in $seeds; do
        sed "s/seed = 0 }/seed = $seed }/" "$work/$name.toml" > "$work/$name-$seed.toml"
        start=$(date +%s)
        if timeout "$limit" "$bin" train "$work/$name-$seed.toml" --out "$work/$name-$seed" \
            --json > "$work/$name-$seed.json" 2> "$work/$name-$seed.log"; then
            wall=$(( $(date +%s) - start ))
            echo "| $name | $seed | $untrained | $(success "$work/$name-$seed.json" initial_eval) |" \
                "$(success "$work/$name-$seed.json" final_eval) | ${wall} s |"
        else
            echo "| $name | $seed | $untrained | failed or over ${limit} s: $(tail -1 "$work/$name-$seed.log") | | |"
        fi
    done
done
echo "runs and logs: $work"
