"""`forward` of a training client and `compute_logprobs` of a sampling client equal what
`opentinker model logprobs` computes for the same tokens, on the base model and after training."""

import numpy as np
from common import BASE_MODEL, checkpoint_dir, cli_logprobs, close, service, sft_datum
from tinker import types

TEXT = "the cat sat on the mat and then it ran away"
tokens, expected = cli_logprobs(TEXT)
client = service()
training = client.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()


def forward_logprobs():
    datum = sft_datum(tokens)
    output = training.forward([datum], "cross_entropy").result()
    return [None] + output.loss_fn_outputs[0]["logprobs"].tolist()


def without_first(values):
    assert values[0] is None, values[:2]
    return values[1:]


# A fresh adapter's B is zero: the base model's numbers.
close(without_first(forward_logprobs()), without_first(expected), 1e-4, "forward, untrained")
base_sampler = client.create_sampling_client(base_model=BASE_MODEL)
computed = base_sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
close(without_first(computed), without_first(expected), 1e-4, "compute_logprobs, base")

for _ in range(3):
    training.forward_backward([sft_datum(list(range(20, 60)))], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
path = training.save_weights_for_sampler(name="trained").result().path
_, trained = cli_logprobs(TEXT, adapter=checkpoint_dir(path))
assert max(abs(a - b) for a, b in zip(trained[1:], expected[1:])) > 1e-3, "training changed nothing"
close(without_first(forward_logprobs()), without_first(trained), 1e-4, "forward, trained")
sampler = client.create_sampling_client(model_path=path)
computed = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
close(without_first(computed), without_first(trained), 1e-4, "compute_logprobs, trained")
