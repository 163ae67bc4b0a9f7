#!/usr/bin/env bash
# The GPU checks of the CUDA backend: the kernels' GPU tests against the CPU kernels (under
# compute-sanitizer's memcheck too, where it is installed) and the engines on CUDA against the
# same engines on the CPU (host/tests/cuda_forward.rs: the sampler's forward, the sampling and
# training engines, a served base), then the kernel, decode and LoRA training figures and
# PyTorch's / transformers' / PEFT's on the same GPU with the ratios. At most eight minutes on an
# H200 (each part has its own timeout).
#
#   scripts/gpu-check.sh --build   # where cargo is: builds the tests and the benchmark into target/gpu-check/
#   scripts/gpu-check.sh           # on the GPU machine (no Rust toolchain needed): runs them
#   scripts/gpu-check.sh --no-peft # the same without PEFT's mixed-adapter decode (about 2 minutes less)
#   scripts/gpu-check.sh --quick   # the GPU tests and our figures only (no memcheck, no peers)
#
# Logs and figures go to $OUT when it is set, else to target/gpu-check/results/. Fails when a GPU
# test fails or skips itself (a GPU machine must run every one); the figures are still taken
# after a failed test, since a device's time is scarce.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check

if [[ "${1:-}" == "--build" ]]; then
    mkdir -p "$dir"
    cargo build --release --locked -p opentinker-kernels --features cuda --example gpu_bench
    cargo build --release --locked -p opentinker --features cuda --example gpu_decode --example gpu_train \
        --example gpu_rl_step
    cp target/release/examples/gpu_bench target/release/examples/gpu_decode \
        target/release/examples/gpu_train target/release/examples/gpu_rl_step "$dir/"
    test_binary() {
        cargo test --release --locked -p "$1" --features cuda --test "$2" --no-run \
            --message-format=json | grep "\"kind\":\[\"test\"\],[^}]*\"name\":\"$2\"" \
            | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d '"' -f 4
    }
    cp "$(test_binary opentinker-kernels cuda)" "$dir/cuda-tests"
    cp "$(test_binary opentinker cuda_forward)" "$dir/cuda-forward-tests"
    strip "$dir"/gpu_bench "$dir"/gpu_decode "$dir"/gpu_train "$dir"/gpu_rl_step "$dir"/cuda-tests \
        "$dir"/cuda-forward-tests
    ls -l "$dir"
    exit 0
fi

peer_options=()
quick=false
case "${1:-}" in
    --no-peft) peer_options=(--no-peft) ;;
    --quick) quick=true ;;
    "") ;;
    *) echo "unknown option ${1}: see the head of $0" >&2; exit 2 ;;
esac
for binary in gpu_bench gpu_decode gpu_train gpu_rl_step cuda-tests cuda-forward-tests; do
    [[ -x "$dir/$binary" ]] || { echo "$dir/$binary is missing: run scripts/gpu-check.sh --build first" >&2; exit 1; }
done
out="${OUT:-$dir/results}"
mkdir -p "$out"

# The driver's library and NVRTC (the toolkit's, or the nvidia-cuda-nvrtc wheel PyTorch brings).
libs=()
for d in /usr/local/cuda/lib64 /usr/local/nvidia/lib64 \
    $(python3 -c 'import glob, os, site
print(" ".join(sorted({os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libnvrtc.so*", recursive=True)})))' 2>/dev/null || true); do
    [[ -d "$d" ]] && libs+=("$d")
done
LD_LIBRARY_PATH="$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
echo "library path: $LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
date -u +"date: %Y-%m-%d %H:%M UTC"

failed=()
echo "== GPU tests"
if ! { timeout 240 "$dir/cuda-tests" --test-threads 1 && timeout 240 "$dir/cuda-forward-tests" --test-threads 1; } 2>&1 | tee "$out/tests.log"; then
    failed+=("GPU tests")
fi
if grep -q ': skipped:' "$out/tests.log"; then
    failed+=("a GPU test skipped itself on the GPU machine")
fi
if ! $quick && command -v compute-sanitizer >/dev/null; then
    echo "== GPU tests under compute-sanitizer (memcheck)"
    if timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/cuda-tests" --test-threads 1 \
        >"$out/memcheck.log" 2>&1; then
        echo "memcheck: clean"
    else
        tail -n 40 "$out/memcheck.log"
        failed+=("memcheck")
    fi
fi

echo "== kernel figures"
"$dir/gpu_bench" "$out/gpu_bench.jsonl" | tee "$out/gpu_bench.md" || failed+=("gpu_bench")
echo "== decode figures"
timeout 200 "$dir/gpu_decode" "$out/gpu_decode.jsonl" | tee "$out/gpu_decode.md" || failed+=("gpu_decode")
echo "== LoRA training figures"
timeout 150 "$dir/gpu_train" "$out/gpu_train.jsonl" | tee "$out/gpu_train.md" || failed+=("gpu_train")
echo "== RL step figures (sample a group, train on it, publish)"
timeout 120 "$dir/gpu_rl_step" "$out/gpu_rl_step.jsonl" | tee "$out/gpu_rl_step.md" || failed+=("gpu_rl_step")
if ! $quick; then
    echo "== PyTorch and transformers on the same shapes"
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/python/gpu_peer.py "${peer_options[@]}" "$out/gpu_bench.jsonl" \
        "$out/gpu_decode.jsonl" | tee "$out/gpu_peer.md" || failed+=("the peers")
    echo "== PyTorch + PEFT training on the same shapes"
    if [[ -s "$out/gpu_train.jsonl" ]]; then
        PYTHONUNBUFFERED=1 timeout 150 python3 bench/python/gpu_peer.py "$out/gpu_train.jsonl" \
            | tee "$out/gpu_peer_train.md" || failed+=("the training peer")
    fi
fi
if ((${#failed[@]})); then
    printf 'FAIL: %s\n' "${failed[@]}" >&2
    exit 1
fi
