"""save_state / load_state / create_training_client_from_state(_with_optimizer): the next
step's losses are those of the run that was saved."""

from common import BASE_MODEL, loss, service, sft_datum
from tinker import types

client = service()
data = [sft_datum(list(range(30, 70)))]
adam = types.AdamParams(learning_rate=1e-2)


def step(training):
    value = loss(training.forward_backward(data, "cross_entropy").result())
    training.optim_step(adam).result()
    return value


def next_two(training):
    """The loss now, and after one more step."""
    return step(training), loss(training.forward(data, "cross_entropy").result())


training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
for _ in range(2):
    step(training)
path = training.save_state(name="after-two").result().path
assert path.endswith("/weights/after-two"), path
reference = next_two(training)

resumed = client.create_training_client_from_state_with_optimizer(path).result()
assert next_two(resumed) == reference, (next_two, reference)

weights_only = client.create_training_client_from_state(path).result()
now, after = next_two(weights_only)
assert now == reference[0], (now, reference)
assert after != reference[1], "a fresh optimizer stepped like the saved one"

training.load_state_with_optimizer(path).result()
assert next_two(training) == reference
print("checkpoints: identical next-step losses", reference)
