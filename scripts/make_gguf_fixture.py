"""Make the committed reference fixture of the GGUF tests with Hugging Face `transformers`
loading the same GGUF file as opentinker (`from_pretrained(folder, gguf_file=name)`).

Writes host/tests/fixtures/gguf/<name>/ for each model file given:
- reference.safetensors: `ids` (int64), the vocabulary entries compared (every 97th id and each
  position's 16 likeliest), and for a few prompts `tokens.N` (int64) and `logits.N` (float32,
  [len, ids]) from the model in f32;
- texts.json: the token ids of a set of texts (`tokenizer(text).input_ids`), and the chat
  template's rendering of a few conversations with the ids of each rendering.

CI only reads the fixture. Regenerate it when transformers' behaviour is what changed, with the
cookbook venv (scripts/test.sh makes it), the `gguf` package (transformers dequantizes with it) and
`accelerate` (transformers wants it for a GGUF):

    scripts/models.sh    # links both files into models/
    ~/.cache/opentinker/cookbook-venv/bin/pip install gguf==0.19.0 accelerate
    ~/.cache/opentinker/cookbook-venv/bin/python scripts/make_gguf_fixture.py \
        smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf gemma3=models/gemma-3-270m-q4_k_m.gguf
"""

import json
import pathlib
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = pathlib.Path(__file__).resolve().parent.parent / "host" / "tests" / "fixtures" / "gguf"

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Q: What is 12 + 30?\nA: 42. Q: And 7 times 6?\nA:",
]

TEXTS = [
    "Hello world",
    "Hello world 12345, it's   ok\n\nyes",
    "  leading spaces and trailing ones   ",
    "tabs\tand\r\nwindows lines",
    "Ünïcödé, 日本語のテキスト, emoji 🙂👍 and math ∑∫√",
    "<|im_start|>user\nhi<|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "  two  spaces,\n\n\nthree   and\ttabs\t\t ",
    "I'm sure they'll say we'd DONE it, won't they? YOU'RE right.",
    "x = [1, 2, 3]; print(sum(x) ** 2)  # 36",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
    ],
]


def make(name: str, path: pathlib.Path) -> None:
    folder, file = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    model.eval()
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)

    logits, tokens = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            tokens.append(ids[0])
            logits.append(model(ids).logits[0].float())
    vocab = logits[0].shape[-1]
    compared = set(range(0, vocab, 97))
    for each in logits:
        compared.update(each.topk(16, dim=-1).indices.flatten().tolist())
    ids = torch.tensor(sorted(compared), dtype=torch.int64)
    tensors = {"ids": ids}
    for i, (t, l) in enumerate(zip(tokens, logits)):
        tensors[f"tokens.{i}"] = t.to(torch.int64).contiguous()
        tensors[f"logits.{i}"] = l[:, ids].contiguous()
    save_file(tensors, str(out / "reference.safetensors"))

    renders = []
    # A base model's file (Gemma 3 270M's) has no chat template.
    for conversation in CONVERSATIONS if tokenizer.chat_template else []:
        for add_generation_prompt in (False, True):
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            renders.append(
                {
                    "messages": conversation,
                    "add_generation_prompt": add_generation_prompt,
                    "text": text,
                    "ids": tokenizer(text, add_special_tokens=False).input_ids,
                }
            )
    texts = [{"text": text, "ids": tokenizer(text).input_ids} for text in TEXTS]
    record = {
        "file": file,
        "transformers": transformers.__version__,
        "texts": texts,
        "renders": renders,
    }
    (out / "texts.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"{name}: {len(PROMPTS)} prompts, {len(ids)} vocabulary entries compared -> {out}")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        name, _, path = argument.partition("=")
        make(name, pathlib.Path(path))
