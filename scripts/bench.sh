#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md with its peers, in one command:
#
#   scripts/bench.sh [plugins|training|sampling|service|rollouts|soak|real-rl|all] [--quick]
#
# Makes (or reuses) the peers' virtual environment outside the repository from
# bench/python/requirements.txt (PyTorch, transformers, PEFT, FastAPI, uvicorn; the service
# benchmark uses the test script's venv with the `tinker` SDK), runs the chosen benchmarks with
# docs/benchmarks.md's thread settings (2 threads), prints their tables under the date, the machine's CPU
# and its load, and writes each as JSON into target/bench-results/. A ratio against a peer is not
# reported when the machine was busy at the start (1-minute load above BENCH_MAX_LOAD, default a
# quarter of the cores): the benchmarks say so instead.
#
# soak (not part of `all`): the long versions of the suite's load and soak tests, which the suite
# runs short: eight tenants' SDK loops for 180 s instead of 40, and a thousand memory-limit hits
# instead of 250; it prints their figures (the tests' own assertions still hold).
#
# real-rl (not part of `all`: about half an hour): LoRA RL on a real model, SmolLM2-135M-Instruct
# (scripts/models.sh installs it), on the word problems of examples/real/word-problems.toml, with
# `opentinker train` and with its peer, TRL's GRPOTrainer + PEFT on the same GGUF file
# (bench/python/trl_grpo.py), the same problems and settings, one after the other; it prints
# seconds per step, sampling and training tokens per second, and the held-out greedy success
# before and after. REAL_RL_STEPS (default 20) sets the steps.
#
# --quick (the test script runs `all --quick`): tiny shapes, one iteration, no peers and no
# venv; it checks that every benchmark builds and runs, and its figures mean nothing. It builds
# in the dev profile, whose dependencies the test build has already compiled (optimised), so the
# test script does not pay for a second, release build of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

which="all"
quick=false
for arg in "$@"; do
    case "$arg" in
        plugins | training | sampling | service | rollouts | soak | real-rl | all) which="$arg" ;;
        --quick) quick=true ;;
        *) echo "unknown argument $arg: see the head of $0" >&2; exit 2 ;;
    esac
done

results=target/bench-results
mkdir -p "$results"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || echo unknown)"
cores="$(nproc)"
load="$(cut -d' ' -f1 /proc/loadavg)"
max_load="${BENCH_MAX_LOAD:-$(python3 -c "print($cores / 4)")}"
date="$(date -u +%Y-%m-%d)"
export RAYON_NUM_THREADS=2
if python3 -c "import sys; sys.exit(0 if float('$load') > float('$max_load') else 1)"; then
    export OPENTINKER_BENCH_BUSY="the machine was busy at the start (load $load on $cores cores, above $max_load)"
    echo "NOTE: $OPENTINKER_BENCH_BUSY; ratios are not reported" >&2
else
    unset OPENTINKER_BENCH_BUSY
fi

if $quick; then
    export OPENTINKER_BENCH_QUICK=1
    export OPENTINKER_BENCH_PROFILE=dev
    # The test build's features, so that the quick run reuses its build of the host crate.
    export OPENTINKER_BENCH_FEATURES=cuda
else
    export OPENTINKER_BENCH_PROFILE=release
    export OPENTINKER_BENCH_FEATURES=""
    unset OPENTINKER_BENCH_QUICK
    # The peers' virtual environment, remade only when the requirements change (the rollout
    # and soak benchmarks have no Python peer).
    if [[ "$which" != rollouts && "$which" != soak ]]; then
        source scripts/venv.sh
        venv="${OPENTINKER_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/bench-venv}"
        make_venv "$venv" bench/python/requirements.txt
        export PYTHON="$venv/bin/python"
    fi
fi

cargo_bench=(cargo bench --locked -q --profile "$OPENTINKER_BENCH_PROFILE" --features "$OPENTINKER_BENCH_FEATURES")

echo "$date, $cpu, $cores cores, load $load$($quick && echo ', quick: figures mean nothing')"

# Run one benchmark: its output is printed and kept, then written as JSON with the machine's
# details into target/bench-results/NAME.json.
run() {
    local name="$1"
    shift
    echo
    echo "== $name: $*"
    local output status=0
    output="$("$@")" || status=$?
    echo "$output"
    # A failed benchmark fails the run, after what it printed (which says how far it got).
    if ((status != 0)); then
        echo "$name failed (exit $status)" >&2
        return "$status"
    fi
    OUTPUT="$output" python3 - "$results/$name.json" "$name" "$*" "$date" "$cpu" "$cores" "$load" \
        "$quick" <<'PY'
import json, os, sys
path, name, command, date, cpu, cores, load, quick = sys.argv[1:]
record = {
    "benchmark": name, "command": command, "date": date, "cpu": cpu, "cores": int(cores),
    "load_at_start": float(load), "quick": quick == "true",
    "busy": os.environ.get("OPENTINKER_BENCH_BUSY"),
    "output": os.environ["OUTPUT"].splitlines(),
}
with open(path, "w") as f:
    json.dump(record, f, indent=1)
PY
}

# The plugin benchmark's table from criterion's estimates (criterion prints its own lines too).
plugin_table() {
    python3 - target/criterion/tictactoe <<'PY'
import json, os, sys
root = sys.argv[1]
def mean_us(name):
    path = os.path.join(root, name, "new", "estimates.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))["mean"]["point_estimate"] / 1000
rows = [("step call on a live episode (Wasm plugin)", "wasm_plugin_step"),
        ("fresh episode: store + instantiate + construct + observe", "wasm_plugin_fresh_episode"),
        ("one step over HTTP, Rust hyper server", "rust_hyper_step"),
        ("one step over HTTP, Python FastAPI + uvicorn", "python_fastapi_step")]
print("| what | time |")
print("|---|---|")
times = {}
for label, name in rows:
    times[name] = mean_us(name)
    if times[name] is not None:
        print(f"| {label} | {times[name]:.1f} us |")
wasm, fastapi = times["wasm_plugin_step"], times["python_fastapi_step"]
busy = os.environ.get("OPENTINKER_BENCH_BUSY")
if wasm and fastapi:
    ratio = f"ratio not reported: {busy}" if busy else f"{fastapi / wasm:.0f}x (goal >= 100x)"
    print(f"| FastAPI step / Wasm step | {ratio} |")
PY
}

if [[ "$which" == plugins || "$which" == all ]]; then
    run plugins "${cargo_bench[@]}" -p opentinker --bench plugin_calls
    run plugins_table plugin_table
    run plugin_languages "${cargo_bench[@]}" -p opentinker --bench plugin_languages
fi
# The benchmarks page's shapes: the tiny one, and the Qwen2.5-0.5B one (each of its benchmarks writes a
# 2 GB model to a temporary folder first); the quick run takes the tiny one only.
if [[ "$which" == training || "$which" == all ]]; then
    run lora_training "${cargo_bench[@]}" -p opentinker --bench lora_training
    run objective_cost "${cargo_bench[@]}" -p opentinker --bench objective_cost
    # A base kept in blocks: the 0.5B and 7B shapes' memory, the LoRA step against f32's.
    run base_formats "${cargo_bench[@]}" -p opentinker --bench base_formats
    if ! $quick; then
        run lora_training_0.5b "${cargo_bench[@]}" -p opentinker --bench lora_training -- qwen2.5-0.5b
        run lora_vs_full "${cargo_bench[@]}" -p opentinker --bench lora_vs_full -- qwen2.5-0.5b
        run objective_cost_0.5b "${cargo_bench[@]}" -p opentinker --bench objective_cost -- qwen2.5-0.5b
    else
        run lora_vs_full "${cargo_bench[@]}" -p opentinker --bench lora_vs_full -- tiny
    fi
fi
if [[ "$which" == sampling || "$which" == all ]]; then
    run sampling "${cargo_bench[@]}" -p opentinker --bench sampling
    if ! $quick; then
        run sampling_0.5b "${cargo_bench[@]}" -p opentinker --bench sampling -- qwen2.5-0.5b
    fi
    run kernels "${cargo_bench[@]}" -p opentinker-kernels --bench kernels
fi
if [[ "$which" == service || "$which" == all ]]; then
    steps=30
    $quick && steps=2
    run service scripts/bench-service.sh "$steps"
fi
if [[ "$which" == rollouts || "$which" == all ]]; then
    # The rollout queue's server: the test venv's nats-server (scripts/test.sh makes the venv).
    export OPENTINKER_NATS_SERVER="${OPENTINKER_NATS_SERVER:-${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-venv/bin/nats-server}"
    run rollouts "${cargo_bench[@]}" -p opentinker --bench rollouts
fi
# real-rl: the word-problems job with REAL_RL_STEPS steps and one evaluation at the end, trained
# by opentinker then by TRL; the peer first checks that its generator made opentinker's problems.
real_rl() {
    local steps="${REAL_RL_STEPS:-20}" work
    work="$(mktemp -d)"
    scripts/models.sh > /dev/null
    cargo build --release --locked --quiet --bin opentinker
    sed -E -e 's|"\.\./\.\./|"'"$PWD"'/|' -e "s/^steps = [0-9]+$/steps = $steps/" -e 's/^every = [0-9]+$/every = 0/' \
        examples/real/word-problems.toml > "$work/job.toml"
    grep -q "^steps = $steps$" "$work/job.toml" && grep -q '^every = 0$' "$work/job.toml" || {
        echo "examples/real/word-problems.toml no longer has the lines real-rl rewrites" >&2
        return 1
    }
    local start=$SECONDS
    target/release/opentinker train "$work/job.toml" --out "$work/run" --json \
        > "$work/opentinker.json" 2> "$work/opentinker.log" || {
        tail -3 "$work/opentinker.log" >&2
        return 1
    }
    echo "opentinker: $((SECONDS - start)) s" >&2
    "$PYTHON" bench/python/trl_grpo.py --check-rollouts "$work/run/rollouts" >&2 || return 1
    start=$SECONDS
    "$PYTHON" bench/python/trl_grpo.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --steps "$steps" --threads "$RAYON_NUM_THREADS" > "$work/trl.out" 2> "$work/trl.log" || {
        tail -3 "$work/trl.log" >&2
        return 1
    }
    echo "TRL: $((SECONDS - start)) s" >&2
    tail -1 "$work/trl.out" > "$work/trl.json"
    python3 - "$work" "$steps" <<'PY' || return 1
import json, os, sys
work, steps = sys.argv[1], int(sys.argv[2])
lines = [json.loads(l) for l in open(os.path.join(work, "run", "metrics.jsonl"))]
ours = [l for l in lines if l["phase"] == "rl"]
summary = json.loads(open(os.path.join(work, "opentinker.json")).read().splitlines()[-1])
peer = json.load(open(os.path.join(work, "trl.json")))
def figures(steps, before, after):
    total = lambda key: sum(s[key] for s in steps)
    return {
        "seconds per step (sampling + training)":
            (total("sample_seconds") + total("train_seconds")) / len(steps),
        "sampling, tokens/s": total("sampled_tokens") / total("sample_seconds"),
        "training, tokens/s (prompts included)": total("train_tokens") / total("train_seconds"),
        "greedy success, held out, before": before,
        f"greedy success, held out, after {len(steps)} steps": after,
    }
a = figures(ours, summary["initial_eval"]["success_rate"], summary["final_eval"]["success_rate"])
b = figures(peer["steps"], peer["initial_success"], peer["final_success"])
busy = os.environ.get("OPENTINKER_BENCH_BUSY")
print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to f32), word problems difficulty 1, "
      f"{steps} steps of 4 prompts x 8 completions, 48 tokens, LoRA rank 16; peer: {peer['peer']}")
print("| | opentinker | TRL + PEFT | opentinker's speed |")
print("|---|---|---|---|")
for key in a:
    ratio = ""
    if "success" not in key:
        better = b[key] / a[key] if key.startswith("seconds") else a[key] / b[key]
        ratio = f"ratio not reported: {busy}" if busy else f"{better:.2f}x"
    fmt = (lambda v: f"{v:.2f}") if "success" in key or "seconds" in key else (lambda v: f"{v:.0f}")
    print(f"| {key} | {fmt(a[key])} | {fmt(b[key])} | {ratio} |")
PY
    echo "runs and logs: $work" >&2
}
if [[ "$which" == real-rl ]]; then
    run real_rl real_rl
fi
if [[ "$which" == soak ]]; then
    # The test venv, with the tinker SDK (scripts/test.sh makes it).
    export OPENTINKER_TEST_PYTHON="${XDG_CACHE_HOME:-$HOME/.cache}/opentinker/test-venv/bin/python"
    # soak_test VAR=VALUE TEST PATTERN: run TEST with the long setting, print its figure lines.
    soak_test() {
        env "$1" cargo nextest run --locked --features cuda --workspace --no-capture \
            --status-level none --final-status-level none -E "test(=$2)" 2>&1 | grep -E "$3"
    }
    run soak_load soak_test OPENTINKER_LOAD_SECONDS=180 \
        eight_tenants_share_the_server_fairly_under_load 'share|resident memory'
    run soak_memory soak_test OPENTINKER_SOAK_EPISODES=1000 \
        memory_comes_back_after_many_memory_limit_hits 'resident after'
fi
