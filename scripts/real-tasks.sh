#!/usr/bin/env bash
# The real-model tasks' learning runs: each job of examples/real/ (or the ones named) trained with
# a release `opentinker train` once per RL seed (SEEDS, default "0 1 2"; `[rl] seed`, which picks
# the problems, the samples and the evaluation's opponents; the model is the same pretrained
# one), one run at a time. Prints one row per run (per policy, in a job with several): the
# held-out greedy success of the model as it came, after the job's warm-up (where it has one),
# after RL, the gain over the untrained model, the environment's metrics untrained and after RL
# (the calculator's calls per episode, say), and the run's wall time. The runs' folders
# and logs stay in WORK (default: a new temporary folder, named at the end); a run over LIMIT
# seconds (default 1800) is stopped and reported. BIN runs a given copy of the `opentinker` binary
# instead of building this checkout's (to go on measuring one build while the source changes); the
# copy keeps the name `opentinker`, since it compiles plugins in a worker of the program of that
# name beside it.
#
#   scripts/models.sh                              # the model file, once
#   scripts/real-tasks.sh                          # every task, seeds 0 1 2 (about 2 hours on 2 cores)
#   SEEDS=0 scripts/real-tasks.sh word-problems calculator
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${SEEDS:-0 1 2}"
limit="${LIMIT:-1800}"

scripts/models.sh > /dev/null
if [ -n "${BIN:-}" ]; then
    bin="$(realpath "$BIN")"
else
    cargo build --release --locked --quiet --bin opentinker
    bin="$PWD/target/release/opentinker"
fi
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"

if [ "$#" -gt 0 ]; then
    names=("$@")
else
    names=()
    for file in examples/real/*.toml; do names+=("$(basename "$file" .toml)"); done
fi

echo "| task | seed | policy | untrained | after warm-up | after RL | gain | metrics untrained -> after RL | wall |"
echo "|---|---|---|---|---|---|---|---|---|"
for name in "${names[@]}"; do
    source="examples/real/$name.toml"
    grep -q '^\[rl\]$' "$source" || { echo "$source has no [rl] section" >&2; exit 1; }
    for seed in $seeds; do
        job="$work/$name-$seed.toml"
        sed -e 's|"\.\./\.\./|"'"$PWD"'/|' -e "s/^\[rl\]$/[rl]\nseed = $seed/" "$source" > "$job"
        start=$(date +%s)
        if timeout "$limit" "$bin" train "$job" --out "$work/$name-$seed" --json \
            > "$work/$name-$seed.json" 2> "$work/$name-$seed.log"; then
            python3 - "$work/$name-$seed.json" "$name" "$seed" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
path, name, seed, wall = sys.argv[1:]
summary = json.loads(open(path).read().splitlines()[-1])
policies = summary.get("policies") or {"": summary}
for policy, evals in policies.items():
    # A job with a warm-up evaluates the model as it came before it (`untrained_eval`); RL's
    # first evaluation (`initial_eval`) is then the warmed-up policy's.
    warmed = evals["initial_eval"]
    untrained = evals.get("untrained_eval") or summary.get("untrained_eval") or warmed
    after = evals["final_eval"]
    warm_up = f"{warmed['success_rate']:.3f}" if untrained is not warmed else "-"
    metrics = ", ".join(
        f"{key} {untrained['metrics'][key]:.2f} -> {after['metrics'].get(key, 0):.2f}"
        for key in sorted(untrained["metrics"])
    )
    gain = after["success_rate"] - untrained["success_rate"]
    print(f"| {name} | {seed} | {policy or '-'} | {untrained['success_rate']:.3f} | {warm_up} | "
          f"{after['success_rate']:.3f} | {gain:+.3f} | {metrics or '-'} | {wall} s |")
PY
        else
            echo "| $name | $seed | | failed or over ${limit} s: $(tail -1 "$work/$name-$seed.log") | | | | | |"
        fi
    done
done
echo "runs and logs: $work"
