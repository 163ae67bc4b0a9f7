"""A light tenant beside another tenant's heavy jobs, through the SDK: the light tenant's one-datum
`forward_backward` latency alone, then while the heavy tenant's JOBS_COUNT jobs (JOBS_FILE, each
a full-parameter warm-up then RL, submitted with `opentinker submit`) run on the same base.
Prints one JSON line of figures. Environment: TINKER_BASE_URL, LIGHT_KEY, HEAVY_KEY, JOBS_FILE,
JOBS_COUNT (4), OPENTINKER (the binary)."""

import json
import os
import statistics
import subprocess
import time

import tinker
from common import BASE_MODEL, sft_datum

COUNT = int(os.environ.get("JOBS_COUNT", "4"))
CALLS = 40


def latencies(training, datum, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        training.forward_backward([datum], "cross_entropy").result()
        times.append(time.perf_counter() - start)
    return times


def figures(times):
    ordered = sorted(times)
    return {
        "median_s": statistics.median(ordered),
        "p90_s": ordered[int(0.9 * (len(ordered) - 1))],
    }


def opentinker(*args):
    environment = dict(os.environ, TINKER_API_KEY=os.environ["HEAVY_KEY"])
    return subprocess.run(
        [os.environ["OPENTINKER"], *args],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )


def latest_line(job):
    """The job's last metrics line: (phase, step), or None before its first."""
    lines = opentinker("jobs", "logs", job).stdout.strip().splitlines()
    if not lines:
        return None
    line = json.loads(lines[-1])
    return (line["phase"], line["step"])


def main():
    light = tinker.ServiceClient(api_key=os.environ["LIGHT_KEY"]).create_lora_training_client(
        base_model=BASE_MODEL, rank=8
    ).result()
    small = sft_datum(list(range(40, 73)))
    latencies(light, small, 3)
    alone = latencies(light, small, CALLS)

    jobs = []
    for _ in range(COUNT):
        output = opentinker("submit", os.environ["JOBS_FILE"], "--detach")
        words = (output.stdout + output.stderr).split()
        jobs.append(next(w for w in words if w.startswith("job-")))
    # Every job past its set-up and training (a first metrics line each), then measured.
    deadline = time.time() + 600
    while any(latest_line(job) is None for job in jobs):
        if time.time() > deadline:
            raise SystemExit("the jobs did not start training within 10 minutes")
        time.sleep(1)
    during = latencies(light, small, CALLS)
    phases = [latest_line(job) for job in jobs]
    for job in jobs:
        opentinker("jobs", "cancel", job)

    print(
        json.dumps(
            {
                "jobs": COUNT,
                "alone": figures(alone),
                "beside_jobs": figures(during),
                "median_ratio": statistics.median(during) / statistics.median(alone),
                "jobs_at_measurement_end": phases,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
