"""Weights out, as a Tinker user takes them home: the tinker-cookbook's `weights.download`,
unmodified, fetches a trained adapter from an `opentinker serve` on loopback (a training
checkpoint, which it exports with `save_weights_external` encrypted to an age key it makes, then
downloads through the signed URLs and decrypts; and a plain export); its `build_hf_model` merges
the adapter into the base model; `transformers` loads the merged model, whose logprobs of a text
are the server's for the trained adapter (within 1e-4).

Usage: weights_out.py WORK_DIR
Environment: TINKER_BASE_URL, TINKER_API_KEY, OPENTINKER_MODEL_DIR."""

import os
import sys
from pathlib import Path

import numpy as np
import tinker
import torch
from tinker import types
from tinker_cookbook import weights
from transformers import AutoModelForCausalLM

MODEL = os.environ["OPENTINKER_MODEL_DIR"]
work = Path(sys.argv[1])
service = tinker.ServiceClient()
# Attention and MLP only: the tiny model ties its unembedding to its embedding, which the
# cookbook's merge would fold an unembedding adapter into.
training = service.create_lora_training_client(
    base_model=MODEL, rank=4, train_unembed=False
).result()
tokens = list(range(20, 60))
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={
        "target_tokens": np.array(tokens[1:], dtype=np.int64),
        "weights": np.ones(len(tokens) - 1, dtype=np.float32),
    },
)
for _ in range(3):
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
state = training.save_state("trained").result().path
plain = training.save_weights_external("plain").result().path

# A training checkpoint: exported encrypted to the cookbook's own key, downloaded, decrypted,
# the export deleted. And a plain export, downloaded as it is.
from_state = weights.download(tinker_path=state, output_dir=str(work / "from-state"))
from_export = weights.download(tinker_path=plain, output_dir=str(work / "from-export"))
for adapter in (from_state, from_export):
    files = sorted(p.name for p in Path(adapter).iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors"], files
assert (Path(from_state) / "adapter_model.safetensors").read_bytes() == (
    Path(from_export) / "adapter_model.safetensors"
).read_bytes(), "the decrypted export differs from the plain one"
rest = service.create_rest_client()
exports = [
    c.tinker_path
    for c in rest.list_checkpoints(training.model_id).result().checkpoints
    if c.checkpoint_type == "external"
]
assert exports == [plain], f"the cookbook's temporary export was not deleted: {exports}"

merged = work / "merged"
weights.build_hf_model(
    base_model=MODEL, adapter_path=from_state, output_path=str(merged), dtype="float32"
)
model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
with torch.no_grad():
    logits = model(torch.tensor([tokens])).logits[0, :-1]
theirs = torch.log_softmax(logits, dim=-1)[range(len(tokens) - 1), tokens[1:]].tolist()
sampler = training.save_weights_and_get_sampling_client(name="compare").result()
ours = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[1:]
worst = max(abs(a - b) for a, b in zip(ours, theirs))
assert worst < 1e-4, f"the merged model's logprobs differ from the server's by {worst}"
print(f"weights out: downloaded, decrypted, merged; logprobs agree within {worst:.1e}")
