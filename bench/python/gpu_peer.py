"""PyTorch on the same GPU and shapes as `kernels/examples/gpu_bench.rs` and
`host/examples/gpu_decode.rs`, and the ratios.

Reads the JSON lines those wrote, times the same work in PyTorch (f32 with TF32 off, so both sides
compute in f32; decode also in bf16, the usual serving type), and prints one table per kind with
ours, PyTorch's and the ratio:

- linear: `torch.nn.functional.linear` (cuBLAS);
- lora: the base projection plus PEFT's mixed-batch LoRA forward (`_mixed_batch_forward` in
  peft/tuners/lora/layer.py: for each adapter, gather its rows, `B(A(x)) * scale`, scatter back),
  the way PEFT serves a batch that mixes adapters;
- decode: `transformers` greedy `generate` of a random model of the same config (made on the GPU
  with `from_config`), one step's time as (time of N new tokens - time of 1) / (N - 1) as ours;
  in the same weight type as ours (f32 or bf16); with adapters, PEFT LoRA adapters (rank 16 on
  every projection) and `adapter_names` per row,
  on the 0.5B shape only (PEFT's mixed batch takes about half a second a step there, so the 7B
  shape would take minutes), or not at all with --no-peft;
- train: a PEFT LoRA training step (rank 16 on every projection) of a random `transformers`
  model of the same config in f32: forward, the summed cross-entropy of every token, backward,
  the gradient clipped to norm 1, `torch.optim.AdamW`, on the same 16 x 64 tokens as ours (PEFT
  trains one adapter at a time, so ours through 16 adapters is against our one).

    python3 bench/python/gpu_peer.py [--no-peft] RESULTS.jsonl...
"""

import json
import sys
import time

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


PEFT_SHAPES = ("qwen2.5-0.5b",)


def main(paths, peft=True):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if any(r["kind"] == "decode" for r in rows):
        decode(rows, peft)
    if any(r["kind"] == "train" for r in rows):
        train(rows)
    if not any(r["kind"] in ("linear", "lora") for r in rows):
        return
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


def generate_seconds(model, batch, prompt, vocab, new_tokens, adapter_names=None):
    ids = torch.stack([(torch.arange(prompt) * 7919 + i * 104729) % vocab for i in range(batch)]).cuda()
    extra = {"adapter_names": adapter_names} if adapter_names else {}
    torch.cuda.synchronize()
    started = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **extra)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def step_ms(model, batch, prompt, vocab, new_tokens, adapter_names=None):
    generate_seconds(model, batch, prompt, vocab, 4, adapter_names)
    full = generate_seconds(model, batch, prompt, vocab, new_tokens, adapter_names)
    prefill = generate_seconds(model, batch, prompt, vocab, 1, adapter_names)
    return (full - prefill) / (new_tokens - 1) * 1000.0


def decode(rows, peft):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    print(f"transformers {transformers.__version__}")
    print("\ndecode step: opentinker's CUDA forward vs transformers generate, the same weight type")
    print("| shape | weights | batch | adapters | ours ms | transformers ms | transformers / ours |")
    print("|---|---|---:|---:|---:|---:|---:|")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    decode_rows = [r for r in rows if r["kind"] == "decode"]
    for shape in dict.fromkeys(r["shape"] for r in decode_rows):
        for weights, dtype in dtypes.items():
            mine = [r for r in decode_rows if r["shape"] == shape and r["weights"] == weights
                    and (r["adapters"] == 0 or (peft and shape in PEFT_SHAPES))]
            if not mine:
                continue
            config = dict(mine[0]["config"])
            config.pop("architectures", None)
            hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
            vocab = hf_config.vocab_size
            with torch.device("cuda"):
                model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).eval()
            peft_model = None
            # The base rows first: wrapping the model for PEFT changes it in place.
            for r in sorted(mine, key=lambda r: r["adapters"]):
                n, adapters = r["batch"], r["adapters"]
                if adapters == 0:
                    ms = step_ms(model, n, r["prompt"], vocab, r["new_tokens"])
                else:
                    if peft_model is None:
                        from peft import LoraConfig, get_peft_model

                        lora = LoraConfig(r=r["rank"], lora_alpha=2 * r["rank"], init_lora_weights=False,
                                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"])
                        peft_model = get_peft_model(model, lora, adapter_name="a0")
                        for i in range(1, adapters):
                            peft_model.add_adapter(f"a{i}", lora)
                        peft_model.eval()
                    names = [f"a{i * adapters // n}" for i in range(n)]
                    ms = step_ms(peft_model, n, r["prompt"], vocab, r["new_tokens"], names)
                ours = r["step_ms"]
                print(f"| {shape} | {weights} | {n} | {adapters} | {ours:.2f} | {ms:.2f} | {ms / ours:.2f} |")
            del model, peft_model
            torch.cuda.empty_cache()


def train(rows):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    print("\nLoRA training step (f32, TF32 off): opentinker on CUDA vs PyTorch + PEFT")
    print("| shape | adapters | ours ms | PEFT ms | PEFT / ours | ours / ours with one adapter |")
    print("|---|---:|---:|---:|---:|---:|")
    train_rows = [r for r in rows if r["kind"] == "train"]
    for shape in dict.fromkeys(r["shape"] for r in train_rows):
        mine = [r for r in train_rows if r["shape"] == shape]
        first = mine[0]
        config = dict(first["config"])
        config.pop("architectures", None)
        hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
        vocab, rank = hf_config.vocab_size, first["rank"]
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        peft_model = get_peft_model(model, lora)
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        ids = torch.stack([(torch.arange(first["tokens"] + 1) * 7919 + s * 104729) % vocab
                           for s in range(first["sequences"])]).cuda()
        inputs, targets = ids[:, :-1], ids[:, 1:]

        def step():
            logits = peft_model(input_ids=inputs).logits
            logprobs = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1))
            (-logprobs.sum()).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        peft_ms = (time.perf_counter() - started) / 3 * 1000.0
        one = next(r["step_ms"] for r in mine if r["adapters"] == 1)
        for r in mine:
            ours = r["step_ms"]
            print(f"| {shape} | {r['adapters']} | {ours:.1f} | {peft_ms:.1f} | {peft_ms / ours:.2f} | {ours / one:.2f} |")
        del model, peft_model, optimizer, params
        torch.cuda.empty_cache()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main([a for a in arguments if a != "--no-peft"], peft="--no-peft" not in arguments)
