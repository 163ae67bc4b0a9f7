"""The service under load, through the SDK. Phase 1: every tenant of LOAD_TENANT_KEYS runs a
sample + train loop (sample 4 completions with its latest weights, train on them, step) for
LOAD_SECONDS. Phase 2: a light tenant's `forward_backward` latency alone, then while three other
tenants flood the server with large `forward_backward` calls. Prints one JSON line of figures."""

import json
import multiprocessing
import os
import statistics
import threading
import time

import numpy as np
import tinker
from common import BASE_MODEL, sft_datum
from tinker import types

KEYS = os.environ["LOAD_TENANT_KEYS"].split(",")
SECONDS = float(os.environ.get("LOAD_SECONDS", "180"))


def training_client(key):
    return tinker.ServiceClient(api_key=key).create_lora_training_client(
        base_model=BASE_MODEL, rank=8
    ).result()


def sample_and_train(index, key, deadline, figures):
    training = training_client(key)
    prompt = types.ModelInput.from_ints(list(range(10 + index, 22 + index)))
    params = types.SamplingParams(max_tokens=12, temperature=1.0, stop=[])
    tokens = steps = failures = 0
    while time.time() < deadline:
        try:
            sampler = training.save_weights_and_get_sampling_client()
            result = sampler.sample(prompt, num_samples=4, sampling_params=params).result()
            data = [sft_datum(prompt.to_ints() + s.tokens) for s in result.sequences]
            output = training.forward_backward(data, "cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
            tokens += output.metrics["tokens:sum"]
            steps += 1
        except Exception as error:  # counted: the figure that must stay 0
            failures += 1
            print(f"tenant {index}: {error}", flush=True)
    figures[index] = {"tokens": tokens, "steps": steps, "failures": failures}


def latency(training, datum, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        training.forward_backward([datum], "cross_entropy").result()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def flood(key, stop, counts, index):
    """A heavy tenant sending large `forward_backward` calls (its own process: the light tenant's
    timings must not wait for this one's Python)."""
    training = training_client(key)
    big = [sft_datum([(7 * i + j) % 500 + 3 for j in range(129)]) for i in range(32)]
    while not stop.is_set():
        training.forward_backward(big, "cross_entropy").result()
        counts[index] += 1


def main():
    figures = {}
    deadline = time.time() + SECONDS
    threads = [
        threading.Thread(target=sample_and_train, args=(i, key, deadline, figures))
        for i, key in enumerate(KEYS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shares = [f["tokens"] for f in figures.values()]
    mean = np.mean(shares)

    light = training_client(KEYS[0])
    small = sft_datum(list(range(40, 73)))
    latency(light, small, 3)
    alone = latency(light, small, 20)
    spawn = multiprocessing.get_context("spawn")
    stop, counts = spawn.Event(), spawn.Array("i", 3)
    flooders = [
        spawn.Process(target=flood, args=(KEYS[1 + i], stop, counts, i)) for i in range(3)
    ]
    for process in flooders:
        process.start()
    time.sleep(5)
    loaded = latency(light, small, 20)
    stop.set()
    for process in flooders:
        process.join()

    print(
        json.dumps(
            {
                "seconds": SECONDS,
                "tenants": len(KEYS),
                "failures": sum(f["failures"] for f in figures.values()),
                "steps": [f["steps"] for f in figures.values()],
                "tokens": shares,
                "share_min": min(shares) / mean,
                "share_max": max(shares) / mean,
                "light_latency_alone_s": alone,
                "light_latency_flooded_s": loaded,
                "latency_ratio": loaded / alone,
                "flood_calls": list(counts),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
