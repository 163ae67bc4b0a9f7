"""`forward_backward_custom` with a Python callable, as the SDK runs it: a `forward` for the
logprobs, the loss and its gradient computed in this process with torch, then a
`forward_backward` whose cross-entropy weights are the negated gradient. Checked by what a step
does: a callable loss and a built-in loss of the same gradient, each on a fresh adapter of the
same seed, must leave the two adapters' logprobs equal after one Adam step.

1. The negative log-likelihood as a callable against the built-in `cross_entropy`.
2. A loss the engine does not have, `sum(w * lp^2)` (gradient `2 w lp`), against
   `cross_entropy` with weights `-2 w lp` from the logprobs `forward` gave before the step.
3. The same losses made with `create_custom_loss`: the server's client config asks for
   server-side losses, so the SDK uploads each traced graph and `forward_backward_custom` sends
   only its id. The negative log-likelihood steps as `cross_entropy` does, `sum(w * lp^2)` as
   its callable does (the same loss client-side and server-side), their metrics combine as
   their names say, and a graph with an operation off the server's list is refused naming it.

Run with the cookbook's venv: the SDK's custom losses need torch."""

import numpy as np
import torch
from tinker import types

from common import BASE_MODEL, service, sft_datum

TOKENS = [list(range(10, 30)), list(range(40, 52))]
ADAM = types.AdamParams(learning_rate=1e-2)


def fresh(client):
    return client.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=3)


def logprobs_after_step(trainer, data, run):
    """`run(trainer)` (a forward_backward of some kind), one Adam step, then the data's logprobs."""
    output = run(trainer)
    trainer.optim_step(ADAM).result()
    after = trainer.forward(data, "cross_entropy").result()
    return output, [np.asarray(out["logprobs"].data) for out in after.loss_fn_outputs]


def same(a, b, what):
    for x, y in zip(a, b, strict=True):
        worst = float(np.max(np.abs(x - y)))
        assert worst <= 1e-6, f"{what}: logprobs differ by {worst}"


def neg_ll(data, logprobs_list):
    loss = sum(
        -(torch.tensor(datum.loss_fn_inputs["weights"].data) * lp).sum()
        for datum, lp in zip(data, logprobs_list, strict=True)
    )
    return loss, {"neg_ll": float(loss.detach())}


def squared(data, logprobs_list):
    loss = sum(
        (torch.tensor(datum.loss_fn_inputs["weights"].data) * lp * lp).sum()
        for datum, lp in zip(data, logprobs_list, strict=True)
    )
    return loss, {}


def neg_ll_graph(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss, "custom/mean_lp:mean": logprobs.mean().detach()}


def squared_graph(logprobs, weights):
    return (weights * logprobs * logprobs).sum(), {}


def erf_graph(logprobs, weights):
    return torch.erf(logprobs * weights).sum(), {}


def server_side(client, data, builtin, builtin_output, squared_steps):
    """Part 3: the losses of parts 1 and 2 as graphs the server runs."""
    ranks = {"logprobs": 1, "weights": 1}
    handle = client.create_custom_loss(neg_ll_graph, input_ranks=ranks).result()
    assert handle.loss_id is not None, "the SDK did not upload the loss (client config?)"
    output, stepped = logprobs_after_step(
        fresh(client), data, lambda t: t.forward_backward_custom(data, handle).result()
    )
    same(stepped, builtin, "the negative log-likelihood as a server-side graph")
    expected = builtin_output.metrics["loss:sum"]
    for key in ("loss:sum", "custom/neg_ll:sum"):
        got = output.metrics[key]
        assert abs(got - expected) <= 1e-4 * (1 + abs(expected)), (key, output.metrics)
    means = [float(np.mean(out["logprobs"].data)) for out in output.loss_fn_outputs]
    got = output.metrics["custom/mean_lp:mean"]
    assert abs(got - float(np.mean(means))) <= 1e-4, (got, means)

    squared_handle = client.create_custom_loss(squared_graph, input_ranks=ranks).result()
    _, stepped = logprobs_after_step(
        fresh(client), data, lambda t: t.forward_backward_custom(data, squared_handle).result()
    )
    same(stepped, squared_steps, "sum(w lp^2) server-side against the same loss client-side")

    try:
        client.create_custom_loss(erf_graph, input_ranks=ranks).result()
    except Exception as error:
        message = str(error)
        assert "torch.erf" in message and "not an operation" in message, message
    else:
        raise AssertionError("a graph calling torch.erf was accepted")


def main():
    client = service()
    data = [sft_datum(tokens) for tokens in TOKENS]

    custom_output, custom = logprobs_after_step(
        fresh(client), data, lambda t: t.forward_backward_custom(data, neg_ll).result()
    )
    builtin_output, builtin = logprobs_after_step(
        fresh(client), data, lambda t: t.forward_backward(data, "cross_entropy").result()
    )
    same(custom, builtin, "the negative log-likelihood as a callable against cross_entropy")
    assert abs(custom_output.metrics["neg_ll"] - builtin_output.metrics["loss:sum"]) <= 1e-4 * (
        1 + abs(builtin_output.metrics["loss:sum"])
    ), (custom_output.metrics, builtin_output.metrics)

    # A loss the engine does not have: its gradient, 2 w lp, as cross-entropy weights.
    trainer = fresh(client)
    before = trainer.forward(data, "cross_entropy").result()
    weighted = []
    for datum, out in zip(data, before.loss_fn_outputs, strict=True):
        lp = np.asarray(out["logprobs"].data, dtype=np.float32)
        w = np.asarray(datum.loss_fn_inputs["weights"].data, dtype=np.float32)
        weighted.append(
            types.Datum(
                model_input=datum.model_input,
                loss_fn_inputs={
                    "target_tokens": datum.loss_fn_inputs["target_tokens"],
                    "weights": (-2.0 * w * lp).astype(np.float32),
                },
            )
        )
    _, expected = logprobs_after_step(
        trainer, data, lambda t: t.forward_backward(weighted, "cross_entropy").result()
    )
    _, custom = logprobs_after_step(
        fresh(client), data, lambda t: t.forward_backward_custom(data, squared).result()
    )
    same(custom, expected, "sum(w lp^2) as a callable against its gradient as weights")
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(custom, builtin, strict=True))
    assert moved > 1e-4, "the two losses should train the adapter differently"

    server_side(client, data, builtin, builtin_output, custom)
    print("custom losses: callables and server-side graphs step as their gradients say")


if __name__ == "__main__":
    main()
