"""A light tenant's SDK loop (one-datum `forward_backward` and `optim_step`, a pause between
steps) that runs until the file LIGHT_STOP exists, through server restarts (the SDK retries).
Prints one JSON line: steps answered, calls that failed, and the median and 99th percentile of
`forward_backward`'s latency. Environment: TINKER_BASE_URL, TINKER_API_KEY, LIGHT_STOP."""

import json
import os
import statistics
import time

from common import BASE_MODEL, service, sft_datum
from tinker import types

training = service().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
datum = sft_datum(list(range(40, 73)))
times, failures, messages = [], 0, []
while not os.path.exists(os.environ["LIGHT_STOP"]):
    try:
        start = time.perf_counter()
        training.forward_backward([datum], "cross_entropy").result()
        times.append(time.perf_counter() - start)
        training.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    except Exception as error:  # counted: must stay 0
        failures += 1
        messages.append(str(error)[:200])
    time.sleep(0.5)
ordered = sorted(times)
print(
    json.dumps(
        {
            "steps": len(times),
            "failures": failures,
            "forward_backward_p50_ms": round(1000 * statistics.median(ordered), 1),
            "forward_backward_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1),
            "failure_messages": messages[:5],
        }
    ),
    flush=True,
)
