#!/usr/bin/env bash
# The GPU checks of the CUDA backend: the kernels' GPU tests against the CPU kernels (under
# compute-sanitizer's memcheck too, where it is installed) and the engines on CUDA against the
# same engines on the CPU (host/tests/cuda_forward.rs: the sampler's forward, the draws, the
# sampling and training engines, a served base), the official tinker SDK's flows against
# `serve --device cuda` (host/tests/tinker_sdk.rs), then the kernel, decode and LoRA training
# figures and PyTorch's / transformers' / PEFT's on the same GPU with the ratios. At most eight
# minutes on an H200 (each part has its own timeout).
#
#   scripts/gpu-check.sh --build   # where cargo is: builds the tests, the benchmarks, the binary and
#                                  # the SDK's wheels into target/gpu-check/, packed as
#                                  # target/gpu-check.tar.xz (carry that; about 40 MB)
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
        --example gpu_rl_step --bin opentinker
    cp target/release/examples/gpu_bench target/release/examples/gpu_decode \
        target/release/examples/gpu_train target/release/examples/gpu_rl_step target/release/opentinker "$dir/"
    test_binary() {
        cargo test --release --locked -p "$1" --features cuda --test "$2" --no-run \
            --message-format=json | grep "\"kind\":\[\"test\"\],[^}]*\"name\":\"$2\"" \
            | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d '"' -f 4
    }
    cp "$(test_binary opentinker-kernels cuda)" "$dir/cuda-tests"
    cp "$(test_binary opentinker cuda_forward)" "$dir/cuda-forward-tests"
    cp "$(test_binary opentinker tinker_sdk)" "$dir/tinker-sdk-tests"
    strip "$dir"/gpu_bench "$dir"/gpu_decode "$dir"/gpu_train "$dir"/gpu_rl_step "$dir"/cuda-tests \
        "$dir"/cuda-forward-tests "$dir"/tinker-sdk-tests "$dir"/opentinker
    # The official SDK (the version scripts/requirements-test.txt pins) as wheels for the GPU
    # machine's Python 3.12, less what its image already has (numpy, httpx, transformers, ...),
    # which keeps them small enough to carry there.
    rm -rf "$dir/wheels"
    "${OPENTINKER_TEST_PYTHON:-python3}" -m pip download -q --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir/wheels" \
        "$(grep '^tinker==' scripts/requirements-test.txt)"
    in_image=(annotated_doc anyio certifi click filelock fsspec h11 hf_xet httpcore httpx huggingface_hub
        idna markdown_it_py mdurl numpy packaging protobuf pygments pyyaml regex rich safetensors
        shellingham tokenizers tqdm transformers typer typing_extensions)
    for wheel in "$dir"/wheels/*.whl; do
        name="$(basename "$wheel" | sed 's/-[0-9].*//' | tr 'A-Z' 'a-z')"
        for have in "${in_image[@]}"; do
            [[ "$name" == "$have" ]] && { rm "$wheel"; break; }
        done
    done
    ls -l "$dir" "$dir/wheels"
    # One archive to carry (the binaries compress to a third; all of it is about 40 MB, under
    # the device's 64 MiB with the sources).
    tar -C target -cf - gpu-check | xz -6 -T0 >"$dir.tar.xz"
    ls -l "$dir.tar.xz"
    exit 0
fi

if [[ ! -d "$dir" && -f "$dir.tar.xz" ]]; then
    tar -C target -xJf "$dir.tar.xz"
fi

peer_options=()
quick=false
case "${1:-}" in
    --no-peft) peer_options=(--no-peft) ;;
    --quick) quick=true ;;
    "") ;;
    *) echo "unknown option ${1}: see the head of $0" >&2; exit 2 ;;
esac
for binary in gpu_bench gpu_decode gpu_train gpu_rl_step cuda-tests cuda-forward-tests tinker-sdk-tests \
    opentinker; do
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
echo "== the tinker SDK's flows against serve --device cuda"
site="$(mktemp -d)"
if python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dir"/wheels/*.whl; then
    if ! PYTHONPATH="$site" OPENTINKER_TEST_PYTHON="$(command -v python3)" \
        OPENTINKER_TEST_BINARY="$PWD/$dir/opentinker" OPENTINKER_TEST_SOURCES="$PWD/host" \
        timeout 300 "$dir/tinker-sdk-tests" --exact the_sdk_flows_run_against_a_base_served_on_cuda \
        --nocapture 2>&1 | tee "$out/sdk.log"; then
        failed+=("the SDK's flows on CUDA")
    fi
    cat "$out/sdk.log" >>"$out/tests.log"
else
    failed+=("installing the SDK's wheels")
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
