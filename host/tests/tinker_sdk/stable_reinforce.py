"""The `stable_reinforce` loss as the cookbook's async RL uses it: samples recorded with
record_stability_info, datums that name their sequences (Datum.with_provenance), training one
step off-policy. The server takes the sampler's logprobs from its records, not from the datum;
the reward rises; data without provenance or naming an unknown sequence is refused by name."""

import numpy as np
from common import BASE_MODEL, service
from tinker import types

TARGET = set(range(100, 164))
PROMPT = [5, 6, 7, 8, 9, 10]
GROUP, STEPS, LENGTH = 16, 14, 6

client = service()
training = client.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()


def datum(sequence, advantage, logprobs=None):
    """rl_loop's datum: the prompt then the sample, every target named by its sequence."""
    tokens = PROMPT + sequence.tokens
    context = len(PROMPT) - 1
    copied = sequence.logprobs if logprobs is None else logprobs
    plain = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array([0] * context + sequence.tokens, dtype=np.int64),
            "logprobs": np.array([0.0] * context + list(copied), dtype=np.float32),
            "advantages": np.array([0.0] * context + [advantage] * LENGTH, dtype=np.float32),
        },
    )
    return plain.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence.sequence_id, length=len(PROMPT)),
            types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=LENGTH - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(
                sequence_id=sequence.sequence_id, offset=1, length=len(PROMPT) - 1
            ),
            types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=LENGTH),
        ],
    )


def sample(sampler, seed):
    return sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=GROUP,
        sampling_params=types.SamplingParams(max_tokens=LENGTH, seed=seed, temperature=1.0, stop=[]),
    ).result()


def refused(call, words):
    try:
        call()
    except Exception as error:  # the SDK raises its own error types
        text = str(error)
        assert all(word in text for word in words), text
        return
    raise AssertionError(f"not refused: {words}")


rewards = []
stale = None
for step in range(STEPS):
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True)
    fresh = sample(sampler, step)
    # Train on the samples of the step before: one step off-policy, as async RL trains.
    result, stale = stale or fresh, fresh
    assert all(s.sequence_id for s in result.sequences), result.sequences[0]
    group = [np.mean([t in TARGET for t in s.tokens]) for s in result.sequences]
    rewards.append(float(np.mean([np.mean([t in TARGET for t in s.tokens]) for s in fresh.sequences])))
    advantages = np.array(group) - np.mean(group)
    data = [datum(s, a) for s, a in zip(result.sequences, advantages)]
    if step == 1:
        # The datum's own logprobs are not read: garbage there gives the same loss.
        garbage = [datum(s, a, [-7.0] * LENGTH) for s, a in zip(result.sequences, advantages)]
        assert (
            training.forward(data, "stable_reinforce").result().metrics
            == training.forward(garbage, "stable_reinforce").result().metrics
        )
    output = training.forward_backward(
        data, "stable_reinforce", loss_fn_config={"kl_coeff": 0.01}
    ).result()
    assert np.isfinite(output.metrics["loss:sum"]), output.metrics
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
print("rewards", [round(r, 3) for r in rewards])
start, end = np.mean(rewards[:3]), np.mean(rewards[-3:])
assert end > start + 0.2, f"the reward did not rise: {start:.3f} -> {end:.3f}"

sequence = stale.sequences[0]
bare = types.Datum(
    model_input=types.ModelInput.from_ints(PROMPT + sequence.tokens[:-1]),
    loss_fn_inputs={
        "target_tokens": np.array(PROMPT[1:] + sequence.tokens, dtype=np.int64),
        "logprobs": np.zeros(len(PROMPT) + LENGTH - 1, dtype=np.float32),
        "advantages": np.ones(len(PROMPT) + LENGTH - 1, dtype=np.float32),
    },
)
refused(lambda: training.forward([bare], "stable_reinforce").result(), ["provenance"])
forged = types.SampledSequence(stop_reason="length", sequence_id="nobody#0/0", _tokens_list=sequence.tokens,
                               _logprobs_list=sequence.logprobs)
refused(lambda: training.forward([datum(forged, 1.0)], "stable_reinforce").result(),
        ["sequence nobody#0/0"])
refused(
    lambda: training.forward([datum(sequence, 1.0)], "stable_reinforce", {"kl_coef": 0.1}).result(),
    ["kl_coef", "kl_coeff"],
)
print("stable_reinforce: recorded logprobs, off-policy steps, refusals by name")
