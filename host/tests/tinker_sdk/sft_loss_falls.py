"""An SFT loop through the SDK: the cross-entropy loss falls."""

from common import BASE_MODEL, loss, service, sft_datum
from tinker import types

training = service().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
info = training.get_info()
assert info.model_data.model_name == BASE_MODEL and info.lora_rank == 8, info
data = [sft_datum(list(range(5 + i, 40 + i))) for i in range(4)]
losses = []
for step in range(10):
    # Two calls per step: their gradients accumulate before the optimizer step.
    first = training.forward_backward(data[:2], "cross_entropy")
    second = training.forward_backward(data[2:], "cross_entropy")
    update = training.optim_step(types.AdamParams(learning_rate=5e-3))
    losses.append(loss(first.result()) + loss(second.result()))
    metrics = update.result().metrics
    assert metrics["step:max"] == step + 1, metrics
print("losses", [round(x, 2) for x in losses])
assert losses[-1] < 0.6 * losses[0], losses
