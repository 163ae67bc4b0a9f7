"""A training loop that a test runs while it kills and restarts the server: it must finish with
no change to the script. Prints a line once its training client exists, then the path of its final
adapter and its losses."""

import json

from common import BASE_MODEL, loss, service, sft_datum
from tinker import types

STEPS = 30
training = service().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
# The test kills the server only from here on: before this line, a kill meets no session.
print(json.dumps({"started": True}), flush=True)
data = [sft_datum(list(range(5 + 3 * i, 45 + 3 * i))) for i in range(3)]
losses = []
for step in range(STEPS):
    forward = training.forward_backward(data, "cross_entropy")
    update = training.optim_step(types.AdamParams(learning_rate=5e-3))
    losses.append(loss(forward.result()))
    update.result()
final = training.save_weights_for_sampler(name="final").result().path
print(json.dumps({"final": final, "losses": losses}))
