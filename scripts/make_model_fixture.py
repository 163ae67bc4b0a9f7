"""Make the committed reference fixture of the model tests with Hugging Face `transformers`.

Writes host/tests/fixtures/transformers/:
- llama/, qwen2/, qwen3/, gemma3/: tiny random models (`save_pretrained`, safetensors, f32) with a small
  byte-level BPE tokenizer, and `reference.safetensors` holding, for a few token sequences,
  `tokens.N` (int64) and `logits.N` (float32, [len, vocab]) computed by transformers;
- qwen2-peft-lora/: a LoRA adapter written by `peft` (rank 4, alpha 8, attention and MLP
  projections, random A and B) for qwen2/, with `reference.safetensors` holding the adapted
  model's logits;
- chat_renders.json: `apply_chat_template` renders (text and token ids) of a few conversations under
  ChatML-, Llama-3- and Qwen3-style templates.

CI only reads the fixture. Regenerate it (rarely: when transformers' behaviour is what changed):

    python3 -m venv ~/.cache/opentinker/pyenv
    ~/.cache/opentinker/pyenv/bin/pip install torch transformers peft safetensors
    ~/.cache/opentinker/pyenv/bin/python scripts/make_model_fixture.py
"""

import json
import pathlib
import sys

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

OUT = pathlib.Path(__file__).resolve().parent.parent / "host" / "tests" / "fixtures" / "transformers"

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>",
]

CORPUS = [
    "You are a helpful assistant.",
    "What is 12 + 30? The answer is 42.",
    "We play tic-tac-toe. Cells are numbered 1-9. Reply with the number of a free cell.",
    "I am thinking of a number from 1 to 100. Higher. Lower. Your guess?",
    "the quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun.",
    "Let me think step by step. First, add the numbers. Then check the result.",
] * 4

CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role']"
    " + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

QWEN3 = (
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content.strip() + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 12 + 30?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Your move?"},
        {"role": "assistant", "content": "<think>\nthe centre\n</think>\n\n5"},
        {"role": "user", "content": "  Higher. Your guess?  "},
    ],
]

FAMILIES = {
    "llama": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                  tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                  tie_word_embeddings=True, rope_theta=1000000.0, head_dim=24),
    # A window of 8 that the 40-token sequence passes in its local layer.
    "gemma3": dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], tie_word_embeddings=True,
        head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    ),
}


def make_tokenizer():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, min_frequency=1, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def make_model(name, family, tokenizer):
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3, "gemma3": 4}[name])
    config = transformers.AutoConfig.for_model(
        family["model_type"],
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=3, eos_token_id=2,
        torch_dtype="float32",
        **{k: v for k, v in family.items() if k not in ("model_type",)},
    )
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.05 * torch.randn_like(param))
    directory = OUT / name
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>")
    fast.chat_template = CHATML
    fast.save_pretrained(directory)
    generator = torch.Generator().manual_seed(7)
    vocab = tokenizer.get_vocab_size()
    sequences = [
        [5],
        torch.randint(0, vocab, (7,), generator=generator).tolist(),
        torch.randint(0, vocab, (40,), generator=generator).tolist(),
    ]
    reference = {}
    with torch.no_grad():
        for i, tokens in enumerate(sequences):
            ids = torch.tensor([tokens])
            reference[f"tokens.{i}"] = ids[0].to(torch.int64)
            reference[f"logits.{i}"] = model(ids).logits[0].to(torch.float32).contiguous()
    save_file(reference, str(directory / "reference.safetensors"))


def make_renders(tokenizer):
    renders = []
    specials = {"ChatML": (CHATML, None), "Llama-3": (LLAMA3, "<|begin_of_text|>"),
                "Qwen3": (QWEN3, None)}
    for style, (template, bos) in specials.items():
        fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos,
                                       eos_token="<|im_end|>")
        fast.chat_template = template
        for conversation in CONVERSATIONS:
            for add_generation_prompt in (False, True):
                text = fast.apply_chat_template(conversation, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)
                ids = fast(text, add_special_tokens=False)["input_ids"]
                renders.append(dict(style=style, template=template, bos_token=bos or "",
                                    eos_token="<|im_end|>", messages=conversation,
                                    add_generation_prompt=add_generation_prompt, text=text,
                                    tokens=ids))
    (OUT / "chat_renders.json").write_text(json.dumps(renders, indent=1, ensure_ascii=False))
    tokenizer.save(str(OUT / "tokenizer.json"))


def make_peft_adapter():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    base = AutoModelForCausalLM.from_pretrained(OUT / "qwen2", dtype=torch.float32).eval()
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"])
    model = get_peft_model(base, config).eval()
    directory = OUT / "qwen2-peft-lora"
    model.save_pretrained(directory)
    adapter_config = json.loads((directory / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = "../qwen2"
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    (directory / "README.md").unlink(missing_ok=True)
    tokens = torch.tensor([[5, 17, 42, 9, 100, 250, 3]])
    with torch.no_grad():
        logits = model(tokens).logits[0].contiguous()
    save_file({"tokens.0": tokens[0].to(torch.int64), "logits.0": logits},
              str(directory / "reference.safetensors"))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    for name, family in FAMILIES.items():
        make_model(name, family, tokenizer)
    make_renders(tokenizer)
    make_peft_adapter()
    (OUT / "VERSIONS").write_text(
        f"transformers {transformers.__version__}\ntorch {torch.__version__}\n"
        f"peft {__import__('peft').__version__}\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    # `make_model_fixture.py gemma3` remakes that family alone.
    if len(sys.argv) > 1:
        for name in sys.argv[1:]:
            make_model(name, FAMILIES[name], make_tokenizer())
    else:
        main()
