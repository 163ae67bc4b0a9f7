"""Check that an adapter saved by opentinker loads in PEFT and gives our logprobs.

    cargo run --example lora_sft -- MODEL_DIR /tmp/adapter "What is 12 + 30? 42" 20
    ~/.cache/opentinker/pyenv/bin/python scripts/check_adapter_in_peft.py MODEL_DIR /tmp/adapter
"""

import json
import os
import subprocess
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, adapter_dir = sys.argv[1], sys.argv[2]
text = sys.argv[3] if len(sys.argv) > 3 else "What is 12 + 30? 42"
tokenizer = AutoTokenizer.from_pretrained(model_dir)
base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
model = PeftModel.from_pretrained(base, adapter_dir).eval()
ids = tokenizer(text)["input_ids"]
with torch.no_grad():
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
theirs = [logprobs[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
binary = os.environ.get("OPENTINKER", "target/debug/opentinker")
ours = json.loads(subprocess.check_output(
    [binary, "model", "logprobs", "--model", model_dir, "--adapter", adapter_dir, "--text", text,
     "--json"]))["tokens"]
assert [t["token"] for t in ours] == ids, (ids, ours)
difference = max(abs(a - b["logprob"]) for a, b in zip(theirs, ours[1:]))
print(f"PEFT loads the adapter; max logprob difference {difference:.2e}")
assert difference < 1e-4
