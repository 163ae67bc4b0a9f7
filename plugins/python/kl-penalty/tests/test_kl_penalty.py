"""The loss's value and gradient, run natively by pytest (no component needed)."""

import json
import math

import pytest

import app
from opentinker import ObjectiveDatum, PluginError, Tensor


def datum(logprobs, reference, advantages=None, sampler=None, mask=None):
    n = len(logprobs)
    inputs = [
        Tensor("mask", [n], mask or [1.0] * n),
        Tensor("ref_logprobs", [n], reference),
    ]
    if advantages is not None:
        inputs.append(Tensor("advantages", [n], advantages))
    if sampler is not None:
        inputs.append(Tensor("logprobs", [n], sampler))
    return ObjectiveDatum(logprobs, inputs)


def test_the_penalty_is_zero_where_the_policy_agrees_with_the_reference():
    loss = app.KlPenalty.loss("{}", datum([-1.0, -2.0], [-1.0, -2.0]))
    assert loss.value == 0.0 and loss.gradient == [0.0, 0.0]


def test_the_gradient_is_the_derivative_of_the_value():
    base = dict(reference=[-1.5, -0.2, -3.0], advantages=[0.5, -1.0, 2.0], sampler=[-1.2, -0.4, -2.5])
    logprobs = [-1.0, -0.3, -2.0]
    config = json.dumps({"beta": 0.3})
    loss = app.KlPenalty.loss(config, datum(logprobs, **base))
    for t in range(3):
        h = 1e-6
        up = list(logprobs)
        up[t] += h
        down = list(logprobs)
        down[t] -= h
        numeric = (
            app.KlPenalty.loss(config, datum(up, **base)).value
            - app.KlPenalty.loss(config, datum(down, **base)).value
        ) / (2 * h)
        assert math.isclose(loss.gradient[t], numeric, rel_tol=1e-5, abs_tol=1e-8), t


def test_masked_tokens_carry_no_loss_and_no_gradient():
    loss = app.KlPenalty.loss("{}", datum([-1.0, -2.0], [-3.0, -0.5], mask=[0.0, 1.0]))
    assert loss.gradient[0] == 0.0 and loss.gradient[1] != 0.0


def test_a_missing_reference_or_a_bad_config_is_the_plugins_error():
    with pytest.raises(PluginError, match="ref_logprobs"):
        app.KlPenalty.loss("{}", ObjectiveDatum([-1.0], [Tensor("mask", [1], [1.0])]))
    with pytest.raises(PluginError, match="beta"):
        app.KlPenalty.loss('{"beta": -1}', datum([-1.0], [-1.0]))
    with pytest.raises(PluginError, match="gamma"):
        app.KlPenalty.loss('{"gamma": 1}', datum([-1.0], [-1.0]))
