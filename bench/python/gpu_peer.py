"""PyTorch on the same GPU and shapes as `kernels/examples/gpu_bench.rs`, and the ratios.

Reads the JSON lines gpu_bench wrote, times the same work in PyTorch (f32, TF32 off, so both sides
compute in f32), and prints one table per kind with ours, PyTorch's and the ratio:

- linear: `torch.nn.functional.linear` (cuBLAS);
- lora: the base projection plus PEFT's mixed-batch LoRA forward (`_mixed_batch_forward` in
  peft/tuners/lora/layer.py: for each adapter, gather its rows, `B(A(x)) * scale`, scatter back),
  the way PEFT serves a batch that mixes adapters.

    python3 bench/python/gpu_peer.py RESULTS.jsonl
"""

import json
import sys

import torch

LAUNCHES, RUNS = 50, 5


def time_us(f):
    for _ in range(3):
        f()
    best = float("inf")
    for _ in range(RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(LAUNCHES):
            f()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0 / LAUNCHES)
    return best


def main(path):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("\nprojection (f32): opentinker vs torch F.linear (cuBLAS)")
    print("| shape | in -> out | rows | ours us | torch us | torch / ours |")
    print("|---|---|---:|---:|---:|---:|")
    for r in (r for r in rows if r["kind"] == "linear"):
        w = torch.randn(r["out"], r["inp"], device=device)
        x = torch.randn(r["rows"], r["inp"], device=device)
        us = time_us(lambda: torch.nn.functional.linear(x, w))
        print(f"| {r['shape']} | {r['inp']} -> {r['out']} | {r['rows']} | {r['us']:.1f} | {us:.1f} | {us / r['us']:.2f} |")
    print("\nprojection + mixed-adapter LoRA (rank 16): opentinker (fused) vs PEFT's mixed-batch forward")
    print("| shape | in -> out | rows | adapters | ours us | torch+PEFT-style us | theirs / ours |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in (r for r in rows if r["kind"] == "lora"):
        n, rank, adapters = r["rows"], r["rank"], r["adapters"]
        w = torch.randn(r["out"], r["inp"], device=device)
        a = [torch.randn(rank, r["inp"], device=device) for _ in range(adapters)]
        b = [torch.randn(r["out"], rank, device=device) for _ in range(adapters)]
        x = torch.randn(n, r["inp"], device=device)
        per = n // adapters
        # PEFT's _mixed_batch_forward: rows grouped by adapter name, gathered and scattered.
        index = [torch.arange(i * per, (i + 1) * per, device=device) for i in range(adapters)]

        def step():
            y = torch.nn.functional.linear(x, w)
            for i in range(adapters):
                sub = x[index[i]]
                y[index[i]] += torch.nn.functional.linear(torch.nn.functional.linear(sub, a[i]), b[i]) * 2.0
            return y

        us = time_us(step)
        print(f"| {r['shape']} | {r['inp']} -> {r['out']} | {n} | {adapters} | {r['fused_us']:.1f} | {us:.1f} | {us / r['fused_us']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
