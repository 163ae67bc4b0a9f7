"""The soak's clients: every tenant of SOAK_TENANT_KEYS (named SOAK_TENANT_NAMES) runs an SDK loop
(sample with its latest weights, forward_backward, optim_step) and an OpenAI streaming loop for
SOAK_SECONDS, while the harness (`scripts/soak.sh`, or the suite's short soak) submits jobs and
kills the server with SIGKILL and starts it again in the middle. At the end each tenant saves
its training state: the optimizer's step count in the checkpoint (read from OPENTINKER_DATA) must
equal the `optim_step`s the loop was answered, so no answer was lost and no op applied twice.
Prints a line `{"started": true}` once every loop runs, then one JSON line of figures."""

import json
import os
import pathlib
import statistics
import threading
import time

import openai
import tinker
from common import BASE_MODEL, sft_datum
from tinker import types

KEYS = os.environ["SOAK_TENANT_KEYS"].split(",")
NAMES = os.environ["SOAK_TENANT_NAMES"].split(",")
SECONDS = float(os.environ.get("SOAK_SECONDS", "1800"))
URL = os.environ["TINKER_BASE_URL"]


class Figures:
    """Per route: each answered call's latency; calls that failed, by route."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies = {}
        self.failures = {}
        self.messages = []

    def timed(self, route, call):
        start = time.perf_counter()
        result = call()
        with self.lock:
            self.latencies.setdefault(route, []).append(time.perf_counter() - start)
        return result

    def failed(self, route, error):
        with self.lock:
            self.failures[route] = self.failures.get(route, 0) + 1
            self.messages.append(f"{route}: {error}"[:300])

    def summary(self):
        routes = {}
        for route, times in sorted(self.latencies.items()):
            ordered = sorted(times)
            routes[route] = {
                "calls": len(ordered),
                "p50_ms": round(1000 * statistics.median(ordered), 1),
                "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1),
            }
        return routes


def sdk_loop(index, deadline, figures, started, results):
    key, name = KEYS[index], NAMES[index]
    training = tinker.ServiceClient(api_key=key).create_lora_training_client(
        base_model=BASE_MODEL, rank=8
    ).result()
    started.release()
    prompt = types.ModelInput.from_ints(list(range(10 + index, 22 + index)))
    params = types.SamplingParams(max_tokens=12, temperature=1.0, stop=[])
    steps = 0
    while time.time() < deadline:
        route = "save_weights_and_get_sampling_client"
        try:
            sampler = figures.timed(route, training.save_weights_and_get_sampling_client)
            route = "sample"
            result = figures.timed(
                route, lambda: sampler.sample(prompt, num_samples=4, sampling_params=params).result()
            )
            data = [sft_datum(prompt.to_ints() + s.tokens) for s in result.sequences]
            route = "forward_backward"
            figures.timed(route, lambda: training.forward_backward(data, "cross_entropy").result())
            route = "optim_step"
            figures.timed(
                route, lambda: training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
            )
            steps += 1
        except Exception as error:  # counted: the figure that must stay 0
            figures.failed(route, error)
            # An optim_step whose answer was lost may or may not have run: the count is void.
            if route == "optim_step":
                steps = None
                break
    path = training.save_state(name="soak-end").result().path
    model, _, checkpoint = path.removeprefix("tinker://").partition("/")
    state = pathlib.Path(
        os.environ["OPENTINKER_DATA"], "checkpoints", name, model, checkpoint, "trainer_state.json"
    )
    results[index] = {"steps": steps, "server_steps": json.loads(state.read_text())["step"]}


def openai_loop(index, deadline, figures):
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEYS[index], max_retries=20)
    while time.time() < deadline:
        try:
            stream = figures.timed(
                "openai_stream_start",
                lambda: iter(
                    client.chat.completions.create(
                        model=BASE_MODEL,
                        messages=[{"role": "user", "content": f"Count to {index + 3}."}],
                        max_tokens=8,
                        stream=True,
                    )
                ),
            )
            figures.timed("openai_stream_rest", lambda: sum(1 for _ in stream))
        except Exception as error:
            # A stream the kill cut cannot be resumed (the route keeps no journal).
            figures.failed("openai_stream", error)
            time.sleep(0.5)


def main():
    figures = Figures()
    started = threading.Semaphore(0)
    results = {}
    deadline = time.time() + SECONDS
    loops = [
        threading.Thread(target=sdk_loop, args=(i, deadline, figures, started, results))
        for i in range(len(KEYS))
    ] + [
        threading.Thread(target=openai_loop, args=(i, deadline, figures))
        for i in range(len(KEYS))
    ]
    for loop in loops:
        loop.start()
    for _ in KEYS:
        started.acquire()
    print(json.dumps({"started": True}), flush=True)
    for loop in loops:
        loop.join()
    served = sum(len(times) for times in figures.latencies.values())
    print(
        json.dumps(
            {
                "seconds": SECONDS,
                "tenants": len(KEYS),
                "calls_answered": served,
                "sdk_failures": sum(n for r, n in figures.failures.items() if r != "openai_stream"),
                "openai_streams_cut": figures.failures.get("openai_stream", 0),
                "steps": [results.get(i, {}).get("steps") for i in range(len(KEYS))],
                "server_steps": [results.get(i, {}).get("server_steps") for i in range(len(KEYS))],
                "routes": figures.summary(),
                "failure_messages": figures.messages[:10],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
