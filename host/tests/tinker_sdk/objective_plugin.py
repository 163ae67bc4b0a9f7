"""An objective plugin as a loss of the Tinker wire: the tenant uploads the component
(`POST /api/v1/plugins`, an opentinker extension) and names it by digest as `forward_backward`'s
`loss_fn`, its `loss_fn_config` the plugin's config. The server runs it in the engine's pass.

1. `plugins/ppo-loss` (PPO's clipped surrogate written as a plugin) against the built-in `ppo`
   on the same batch, each on a fresh adapter of the same seed: the same loss and, after one Adam
   step, the same logprobs within 1e-6; its clip thresholds taken from `loss_fn_config`.
2. A config key the plugin's schema does not know is refused naming it, before any work.
3. Another tenant naming this tenant's digest is answered as for an unknown plugin.
4. `plugins/adversarial/objective` answering NaN or a gradient of the wrong length: the call
   fails naming the objective, and the adapter is as if the call had never been made (a good
   step after it lands where the same step lands on a fresh adapter)."""

import os

import httpx
import numpy as np
from tinker import types

from common import BASE_MODEL, refused, service, sft_datum

TOKENS = [list(range(10, 30)), list(range(40, 52))]
ADAM = types.AdamParams(learning_rate=1e-2)


def upload(path, key_variable="TINKER_API_KEY"):
    """Upload the component at `path`; its digest, as `loss_fn` names it."""
    with open(path, "rb") as file:
        answer = httpx.post(
            os.environ["TINKER_BASE_URL"].rstrip("/") + "/api/v1/plugins",
            content=file.read(),
            headers={"X-API-Key": os.environ[key_variable]},
            timeout=120,
        )
    assert answer.status_code == 200, answer.text
    stored = answer.json()
    assert "objective" in stored["kinds"], stored
    return stored["digest"]


def fresh(client):
    return client.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=3)


def logprobs(trainer, data):
    out = trainer.forward(data, "cross_entropy").result()
    return [np.asarray(o["logprobs"].data) for o in out.loss_fn_outputs]


def same(a, b, what, tolerance=1e-6):
    for x, y in zip(a, b, strict=True):
        worst = float(np.max(np.abs(x - y)))
        assert worst <= tolerance, f"{what}: logprobs differ by {worst}"
    print(f"{what}: agree within {tolerance}")


def ppo_data(client, data):
    """PPO datums over `data`: sampler logprobs off the policy's by up to 0.4, so that some
    tokens' ratios leave the clip range, and advantages of both signs."""
    rng = np.random.default_rng(7)
    policy = logprobs(fresh(client), data)
    ppo = []
    for datum, lp in zip(data, policy, strict=True):
        n = len(lp)
        ppo.append(
            types.Datum(
                model_input=datum.model_input,
                loss_fn_inputs={
                    "target_tokens": datum.loss_fn_inputs["target_tokens"],
                    "logprobs": (lp + rng.uniform(-0.4, 0.4, n)).astype(np.float32),
                    "advantages": rng.uniform(-1.0, 1.0, n).astype(np.float32),
                },
            )
        )
    return ppo


def step(trainer, data, run):
    """`run(trainer)`, one Adam step, then `data`'s logprobs."""
    output = run(trainer)
    trainer.optim_step(ADAM).result()
    return output, logprobs(trainer, data)


def main():
    # Each session finished when its checks are done (the SDK's heartbeats and pollers stopped
    # before the interpreter exits under them).
    with service() as client, service("OTHER_TINKER_API_KEY") as other:
        checks(client, other)


def checks(client, other):
    data = [sft_datum(tokens) for tokens in TOKENS]
    ppo = ppo_data(client, data)
    digest = upload(os.environ["PPO_LOSS_PLUGIN"])

    stepped = []
    for config in ({}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}):
        builtin_output, builtin = step(
            fresh(client), data, lambda t: t.forward_backward(ppo, "ppo", config).result()
        )
        plugin_output, plugin = step(
            fresh(client), data, lambda t: t.forward_backward(ppo, digest, config).result()
        )
        same(plugin, builtin, f"the PPO plugin against the built-in ppo under {config}")
        expected, got = builtin_output.metrics["loss:sum"], plugin_output.metrics["loss:sum"]
        assert abs(got - expected) <= 1e-4 * (1 + abs(expected)), (got, expected)
        stepped.append(plugin)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(*stepped, strict=True))
    assert moved > 1e-5, "the clip thresholds of loss_fn_config should change the step"

    try:
        fresh(client).forward_backward(ppo, digest, {"clip_lo": 0.9}).result()
    except Exception as error:
        assert "clip_lo" in str(error), str(error)
    else:
        raise AssertionError("a config key the plugin's schema lacks was accepted")

    refused(
        lambda: fresh(other).forward_backward(ppo, digest).result(),
        "another tenant's objective plugin",
    )

    adversarial = upload(os.environ["ADVERSARIAL_OBJECTIVE_PLUGIN"])
    good = lambda t: t.forward_backward(data, "cross_entropy").result()
    _, expected = step(fresh(client), data, good)
    for case in ("nan", "short"):
        trainer = fresh(client)
        try:
            trainer.forward_backward(data, adversarial, {case: 1.0}).result()
        except Exception as error:
            assert adversarial in str(error), f"{case}: {error}"
        else:
            raise AssertionError(f"an objective answering {case!r} was accepted")
        _, stepped = step(trainer, data, good)
        same(stepped, expected, f"a good step after the objective's {case!r} answer")
    print("objective plugins: run as losses of the wire, checked, and kept to their tenant")


if __name__ == "__main__":
    main()
