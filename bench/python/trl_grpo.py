"""The peer of `scripts/bench.sh real-rl`: Hugging Face TRL's GRPOTrainer with a PEFT LoRA
training SmolLM2-135M-Instruct (the same GGUF file, loaded by `transformers`) on the word
problems of `plugins/word-problems`, as opentinker's `examples/real/word-problems.toml` does.

The same task: the plugin's generator and reward written again in Python (its seeded generator
bit for bit, so both see the same questions: `--check-rollouts` compares them with the problems
an opentinker run recorded), the same seeds (RL step s, group g: seed s * groups + g; held-out
evaluation: seeds from 2^40), prompts per step, completions per prompt, max tokens,
temperature, LoRA rank, alpha and targets, learning rate, Adam's beta2 and gradient clip, no KL
term, group-mean advantages (`scale_rewards="none"`, opentinker's default estimator), a constant
learning rate, on the CPU with the given threads. TRL's own defaults otherwise (its `dapo` loss
normalisation; opentinker sums the loss over tokens, which Adam makes nearly scale-free).

Prints (last, after the Trainer's own log lines) one JSON line: the held-out greedy success before and after, and per step the wall
time, the sampling phase (generation and rewards: `_generate_and_score_completions`) and the
training phase (the rest of the step), with their tokens.

    python bench/python/trl_grpo.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --steps 20
"""

import argparse
import json
import os
import pathlib
import re
import tempfile
import time

MASK64 = (1 << 64) - 1
EVAL_SEEDS = 1 << 40
FORMAT = "End your reply with the answer as a number."
NAMES = ["Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Emma", "Ravi", "Zoe"]
ITEMS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "shells", "cards",
         "eggs", "coins"]


class SeededRng:
    """The plugin SDK's SplitMix64 generator (`opentinker_sdk::SeededRng`), bit for bit."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def range(self, low: int, high: int) -> int:
        if high <= low:
            return low
        return low + self.next_u64() % (high - low + 1)

    def chance(self, p: float) -> bool:
        return self.next_u64() / float(MASK64) < p

    def index(self, n: int) -> int:
        return self.next_u64() % max(n, 1)


def add(name, items, story, a, b):
    if story == 0:
        q = f"{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?"
    else:
        q = (f"There are {a} {items} in a basket. {name} puts in {b} more. How many {items} are "
             f"in the basket now?")
    return q, a + b


def subtract(name, items, story, a, b):
    if story == 0:
        q = (f"{name} has {a} {items} and gives {b} to a friend. How many {items} does {name} "
             f"have left?")
    else:
        q = (f"There are {a} {items} on a table. {name} takes {b} of them away. How many {items} "
             f"are left on the table?")
    return q, a - b


def multiply(name, items, story, a, b):
    if story == 0:
        q = (f"{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} "
             f"buy in all?")
    else:
        q = f"There are {a} rows of {items} with {b} {items} in each row. How many {items} are there?"
    return q, a * b


def divide(name, items, story, friends, each):
    total = friends * each
    if story == 0:
        q = (f"{name} shares {total} {items} equally among {friends} friends. How many {items} "
             f"does each friend get?")
    else:
        q = (f"{name} puts {total} {items} into {friends} bags, the same number in each bag. How "
             f"many {items} are in each bag?")
    return q, each


def generate(difficulty: int, seed: int) -> tuple[str, int]:
    """The plugin's problem of `difficulty` for `seed`: (question, answer)."""
    rng = SeededRng(seed)
    name = NAMES[rng.index(len(NAMES))]
    items = ITEMS[rng.index(len(ITEMS))]
    story = rng.index(2)
    if difficulty == 1:
        if rng.chance(0.5):
            a = rng.range(1, 10)
            return add(name, items, story, a, rng.range(1, 10))
        a = rng.range(2, 10)
        return subtract(name, items, story, a, rng.range(1, a - 1))
    if difficulty == 2:
        kind = rng.index(4)
        if kind == 0:
            a = rng.range(2, 20)
            return add(name, items, story, a, rng.range(2, 20))
        if kind == 1:
            a = rng.range(3, 20)
            return subtract(name, items, story, a, rng.range(1, a - 1))
        a = rng.range(2, 10)
        b = rng.range(2, 10)
        return (multiply if kind == 2 else divide)(name, items, story, a, b)
    if rng.chance(0.5):
        a = rng.range(5, 50)
        b = rng.range(2, 50)
        c = rng.range(1, min(a + b - 1, 50))
        return (f"{name} has {a} {items}, buys {b} more, then gives {c} away. How many {items} "
                f"does {name} have now?", a + b - c)
    a = rng.range(2, 9)
    b = rng.range(2, 9)
    c = rng.range(1, 50)
    return (f"{name} has {a} boxes with {b} {items} in each box and {c} more {items} outside "
            f"the boxes. How many {items} does {name} have in all?", a * b + c)


def last_number(text: str):
    """The SDK's `text::last_number`: the last number, thousands commas and a decimal part
    allowed (a trailing full stop is not a decimal point)."""
    found = None
    for match in re.finditer(r"\d+(?:,(?=\d)\d*)*(?:\.\d+)?", text):
        digits = match.group().replace(",", "")
        value = float(digits)
        found = -value if match.start() > 0 and text[match.start() - 1] == "-" else value
    return found


def prompt(question: str) -> list[dict]:
    return [{"role": "user", "content": f"{question} {FORMAT}"}]


def check_rollouts(folder: pathlib.Path, difficulty: int) -> int:
    """Compare the problems an opentinker run recorded with this generator's: the count."""
    checked = 0
    for path in sorted(folder.glob("step-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            task = json.loads(record["task"])
            question, answer = generate(difficulty, record["seed"] // 1000)
            if (task["question"], task["answer"]) != (question, answer):
                raise SystemExit(f"{path}: seed {record['seed']}: opentinker's problem "
                                 f"{task['question']!r} = {task['answer']}, ours {question!r} = {answer}")
            checked += 1
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="the model's GGUF file (required to train)")
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-rollouts", type=pathlib.Path,
                        help="an opentinker run's rollouts/ folder: check its problems are ours")
    args = parser.parse_args()

    if args.check_rollouts:
        checked = check_rollouts(args.check_rollouts, args.difficulty)
        print(json.dumps({"checked_problems": checked}))
        return
    if not args.gguf:
        parser.error("--gguf is required to train")

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gguf = pathlib.Path(args.gguf).resolve()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    load_seconds = time.perf_counter() - started
    # transformers dequantizes a GGUF to f32 on load but keeps its quantizer's mark, which the
    # Trainer refuses to train under; the weights are plain f32 tensors, as opentinker's are.
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.__dict__.pop("quantization_config", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def evaluate(model) -> float:
        """Greedy success on the held-out seeds, in batches of 16 (left-padded)."""
        model.eval()
        tokenizer.padding_side = "left"
        correct = 0
        tasks = [generate(args.difficulty, EVAL_SEEDS + i) for i in range(args.eval_episodes)]
        for start in range(0, len(tasks), 16):
            batch = tasks[start:start + 16]
            texts = [tokenizer.apply_chat_template(prompt(q), tokenize=False,
                                                   add_generation_prompt=True) for q, _ in batch]
            encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                output = model.generate(**encoded, do_sample=False, max_new_tokens=args.max_tokens,
                                        pad_token_id=tokenizer.pad_token_id)
            replies = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:],
                                             skip_special_tokens=True)
            correct += sum(last_number(r) == a for r, (_, a) in zip(replies, batch))
        return correct / len(tasks)

    eval_started = time.perf_counter()
    initial = evaluate(model)
    eval_seconds = time.perf_counter() - eval_started

    rows = [generate(args.difficulty, args.seed * 1_000_003 + i)
            for i in range(args.steps * args.groups)]
    dataset = Dataset.from_list([{"prompt": prompt(q), "answer": a} for q, a in rows])

    def reward(completions, answer, **_):
        return [1.0 if last_number(c[0]["content"]) == a else 0.0
                for c, a in zip(completions, answer)]

    steps: list[dict] = []

    class Timed(GRPOTrainer):
        """Times the sampling phase of each step and counts its tokens."""

        def _generate_and_score_completions(self, inputs):
            begun = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            completion = int(output["completion_mask"].sum())
            steps.append({"sample_seconds": time.perf_counter() - begun,
                          "sampled_tokens": completion,
                          "train_tokens": completion + int(output["prompt_mask"].sum())})
            return output

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.begun = time.perf_counter()

        def on_step_end(self, *_, **__):
            step = steps[-1]
            step["seconds"] = time.perf_counter() - self.begun
            step["train_seconds"] = step["seconds"] - step["sample_seconds"]

    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"], task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, seed=args.seed, report_to=[],
            save_strategy="no", logging_steps=1, disable_tqdm=True,
            max_steps=args.steps, per_device_train_batch_size=args.groups * args.group_size,
            gradient_accumulation_steps=1, num_generations=args.group_size,
            shuffle_dataset=False, max_completion_length=args.max_tokens,
            temperature=args.temperature, learning_rate=args.learning_rate,
            lr_scheduler_type="constant", warmup_steps=0, adam_beta2=0.95, weight_decay=0.0,
            max_grad_norm=1.0, beta=0.0, scale_rewards="none",
            # TRL turns it on by default; it trades speed for memory this model does not need.
            gradient_checkpointing=False,
        )
        trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                        processing_class=tokenizer, peft_config=lora, callbacks=[StepClock()])
        trained_started = time.perf_counter()
        trainer.train()
        train_wall = time.perf_counter() - trained_started
        final = evaluate(trainer.model)

    print(json.dumps({
        "peer": f"trl {__import__('trl').__version__} GRPOTrainer + peft "
                f"{__import__('peft').__version__}, torch {torch.__version__}",
        "threads": args.threads, "load_seconds": load_seconds, "eval_seconds": eval_seconds,
        "initial_success": initial, "final_success": final, "train_wall_seconds": train_wall,
        "steps": steps,
    }))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
