"""A loss the engine does not have: importance-weighted policy gradient plus a KL penalty that
keeps the policy near a reference policy on the tokens it chose. Per counted token `t` (mask 1),
with `lp` the policy's logprob, `q` the sampler's and `r` the reference's (the datum's input
`ref_logprobs`, computed by the caller with the reference model):

    loss_t = -A_t * exp(lp - q) + beta * (exp(r - lp) - (r - lp) - 1)

The penalty is Schulman's `k3` estimator of KL(policy || reference) on the sampled token:
non-negative, zero where the two agree. Its derivative by `lp` is `-A_t * exp(lp - q)` plus
`beta * (1 - exp(r - lp))`, returned as the gradient; the engine back-propagates it.

Config (JSON): `{"beta": 0.1}`. A datum without `advantages` is scored by the penalty alone.
"""

import math
from dataclasses import dataclass

import opentinker
from opentinker import DatumLoss, Metric, ObjectiveDatum, PluginError


@dataclass
class Config:
    beta: float = 0.1


@opentinker.plugin
class KlPenalty(opentinker.Objective):
    config_schema = opentinker.config_schema_of(Config)

    @classmethod
    def loss(cls, config: str, datum: ObjectiveDatum) -> DatumLoss:
        beta = opentinker.parse_config(config, Config).beta
        if beta < 0:
            raise PluginError("kl-penalty config: `beta` must not be negative")
        n = len(datum.logprobs)
        mask = datum.require("mask")
        reference = datum.require("ref_logprobs")
        advantages = datum.input("advantages") or [0.0] * n
        sampler = datum.input("logprobs") or datum.logprobs
        if {len(mask), len(reference), len(advantages), len(sampler)} != {n}:
            raise PluginError(f"every input must have {n} values, one per target token")
        value, kl, counted = 0.0, 0.0, 0.0
        gradient = [0.0] * n
        for t, lp in enumerate(datum.logprobs):
            if mask[t] == 0:
                continue
            ratio = math.exp(lp - sampler[t])
            to_reference = reference[t] - lp
            k3 = math.exp(to_reference) - to_reference - 1.0
            value += mask[t] * (-advantages[t] * ratio + beta * k3)
            gradient[t] = mask[t] * (-advantages[t] * ratio + beta * (1.0 - math.exp(to_reference)))
            kl += mask[t] * k3
            counted += mask[t]
        metrics = [Metric("kl_to_reference:mean", kl / counted if counted else 0.0)]
        return DatumLoss(value, gradient, metrics)
