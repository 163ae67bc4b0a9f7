"""Check that a model directory made by `opentinker model init-tiny` loads in Hugging Face
`transformers` and that both compute the same tokens and logprobs.

    cargo build -p opentinker && target/debug/opentinker model init-tiny /tmp/tiny --arch qwen3
    ~/.cache/opentinker/pyenv/bin/python scripts/check_tiny_in_transformers.py /tmp/tiny
"""

import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
text = "What is 12 + 30?"
ids = tok(text)["input_ids"]
with torch.no_grad():
    lp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
ref = [lp[i, ids[i+1]].item() for i in range(len(ids)-1)]
ours = json.loads(subprocess.check_output([os.environ.get("OPENTINKER", "target/debug/opentinker"), "model", "logprobs", "--model", d, "--text", text, "--json"]))["tokens"]
assert [t["token"] for t in ours] == ids, (ids, ours)
diff = max(abs(a - b["logprob"]) for a, b in zip(ref, ours[1:]))
print(d, "tokens match; max logprob diff", diff)
print(tok.apply_chat_template([{"role":"user","content":"hi"}], tokenize=False, add_generation_prompt=True))
