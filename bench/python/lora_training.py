"""PyTorch + PEFT peer of `cargo bench --bench lora_training`: tokens per second of a LoRA
forward_backward + optim_step (rank 16, alpha 32, all seven attention and MLP projections, f32,
cross-entropy, AdamW) with the same shapes, batch and thread count as the Rust side.

    python bench/python/lora_training.py --shape tiny      # 16 x 128 tokens
    python bench/python/lora_training.py --shape qwen2.5-0.5b   # 4 x 256 tokens
    python bench/python/lora_training.py --model DIR --batch 4 --length 256   # a real model
Prints one JSON line: {"shape", "tokens_per_s", "seconds_per_step", "peak_rss_bytes"} (the
process's peak resident set, model included).
"""

import argparse
import json
import resource
import time

import torch
import transformers
from peft import LoraConfig, get_peft_model

SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, batch=16, length=128),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         batch=4, length=256),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--model", help="a Hugging Face model directory instead of a shape")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--length", type=int)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = dict(SHAPES[args.shape])
    batch, length = shape.pop("batch"), shape.pop("length")
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        batch, length = args.batch or batch, args.length or length
    else:
        config = transformers.Qwen2Config(**shape, tie_word_embeddings=True,
                                          max_position_embeddings=4096)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    vocab = model.config.vocab_size
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                  betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    tokens = torch.randint(0, vocab, (batch, length + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1), reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = (time.perf_counter() - started) / args.steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"shape": args.model or args.shape, "tokens_per_s": batch * length / seconds,
                      "seconds_per_step": seconds, "peak_rss_bytes": peak}))


if __name__ == "__main__":
    main()
