"""SDK side of the service overhead benchmark (`scripts/bench-service.sh`): one
`forward_backward` + `optim_step` of the tiny model per step, the batch of
`host/examples/service_overhead.rs`. Prints the median milliseconds per step."""

import json
import os
import statistics
import time

import numpy as np
from common import BASE_MODEL, service
from tinker import types


def batch():
    data = []
    for i in range(8):
        tokens = [(7 * i + 3 * j) % 500 + 3 for j in range(129)]
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:128]),
                loss_fn_inputs={
                    "target_tokens": np.array(tokens[1:], dtype=np.int64),
                    "weights": np.ones(128, dtype=np.float32),
                },
            )
        )
    return data


steps = int(os.environ.get("STEPS", "20"))
training = service().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
data = batch()


def step():
    forward = training.forward_backward(data, "cross_entropy")
    update = training.optim_step(types.AdamParams())
    forward.result()
    update.result()


for _ in range(3):
    step()
# The median step: one noisy moment of a shared machine does not move it.
times = []
for _ in range(steps):
    started = time.perf_counter()
    step()
    times.append((time.perf_counter() - started) * 1000)
print(json.dumps({"sdk_ms_per_step": statistics.median(times)}))
