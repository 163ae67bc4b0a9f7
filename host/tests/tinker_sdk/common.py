"""Shared helpers of the compatibility scripts: each runs the official `tinker` SDK, unmodified,
against an `opentinker serve` that `host/tests/tinker_sdk.rs` started on loopback with
TINKER_BASE_URL and TINKER_API_KEY set (and OTHER_TINKER_API_KEY, a second tenant's key)."""

import json
import os
import subprocess
import warnings

import numpy as np
import tinker
from tinker import types

warnings.simplefilter("ignore", FutureWarning)

BASE_MODEL = "opentinker/tiny"


def service(key_variable="TINKER_API_KEY"):
    return tinker.ServiceClient(api_key=os.environ[key_variable])


def sft_datum(tokens):
    """A next-token datum over all of `tokens`, every target counted."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


def loss(output):
    return output.metrics["loss:sum"]


def cli_logprobs(text, adapter=None, model=None):
    """Token ids and logprobs of `text` as `opentinker model logprobs` computes them, with the
    tiny model unless `model` names another (a directory or a GGUF file)."""
    command = [
        os.environ["OPENTINKER_BIN"],
        "model",
        "logprobs",
        "--model",
        model or os.environ["OPENTINKER_TINY_MODEL"],
        "--text",
        text,
        "--json",
    ]
    if adapter:
        command += ["--adapter", adapter]
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return [t["token"] for t in out["tokens"]], [t["logprob"] for t in out["tokens"]]


def checkpoint_dir(path):
    """The folder of one of this tenant's `tinker://` checkpoints on the server."""
    model, kind, name = path.removeprefix("tinker://").split("/")
    return os.path.join(
        os.environ["OPENTINKER_DATA"], "checkpoints", os.environ["TENANT_NAME"], model, kind, name
    )


def close(a, b, tolerance, what):
    assert len(a) == len(b), f"{what}: {len(a)} values against {len(b)}"
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= tolerance, f"{what}: differ by {worst} (> {tolerance}): {a} vs {b}"
    print(f"{what}: agree within {worst:.2e}")


def refused(call, what):
    """Assert that `call` is refused as for an unknown object (the SDK raises its own errors)."""
    try:
        call()
    except Exception as error:
        text = str(error)
        assert "not found" in text or "404" in text, f"{what}: {text}"
        return
    raise AssertionError(f"{what}: answered")
