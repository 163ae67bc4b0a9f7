"""Hugging Face `transformers` peer of `cargo bench --bench sampling`: tokens per second of
`generate` on the CPU (greedy, KV cache, f32) for a model directory that `opentinker model
init-tiny` wrote, with the same prompt length, batch, new tokens and thread count.

    python bench/python/sampling.py --model DIR --batch 1 --prompt 16 --new 32 --threads 2
Prints one JSON line: {"batch", "tokens_per_s", "seconds"}.
"""

import argparse
import json
import time

import torch
import transformers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    tokens = (torch.arange(args.batch * args.prompt).reshape(args.batch, args.prompt) * 7919) % (vocab - 8) + 3
    mask = torch.ones_like(tokens)

    def run(new):
        with torch.inference_mode():
            model.generate(tokens, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)

    run(2)
    started = time.perf_counter()
    run(args.new)
    seconds = time.perf_counter() - started
    print(json.dumps({"batch": args.batch, "tokens_per_s": args.batch * args.new / seconds,
                      "seconds": seconds}))


if __name__ == "__main__":
    main()
