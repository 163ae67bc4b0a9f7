"""An RL loop through the SDK: the reward of sampled completions rises. The loss is
`importance_sampling`, or `RL_LOSS` (`gspo`: its datums name their sampled tokens in
`sequence_ratio_mask`, as the cookbook's rl_loop recipe does). The task: write tokens from a
target set; the reward is the fraction of sampled tokens in it."""

import os

import numpy as np
from common import BASE_MODEL, service
from tinker import types

TARGET = set(range(100, 164))
PROMPT = [5, 6, 7, 8, 9, 10]
GROUP, STEPS, LENGTH = 16, 14, 6
LOSS = os.environ.get("RL_LOSS", "importance_sampling")

training = service().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
rewards = []
for step in range(STEPS):
    sampler = training.save_weights_and_get_sampling_client(name=f"step-{step}")
    result = sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=GROUP,
        sampling_params=types.SamplingParams(max_tokens=LENGTH, seed=step, temperature=1.0, stop=[]),
    ).result()
    group = [np.mean([t in TARGET for t in s.tokens]) for s in result.sequences]
    rewards.append(float(np.mean(group)))
    advantages = np.array(group) - np.mean(group)
    data = []
    for sequence, advantage in zip(result.sequences, advantages):
        tokens = PROMPT + sequence.tokens
        n = len(tokens) - 1
        context = len(PROMPT) - 1
        inputs = {
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "logprobs": np.array([0.0] * context + sequence.logprobs, dtype=np.float32),
            "advantages": np.array([0.0] * context + [advantage] * (n - context), dtype=np.float32),
        }
        if LOSS == "gspo":
            inputs["sequence_ratio_mask"] = np.array(
                [0.0] * context + [1.0] * (n - context), dtype=np.float32
            )
        data.append(
            types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
        )
    training.forward_backward(data, LOSS).result()
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
print(LOSS, "rewards", [round(r, 3) for r in rewards])
start, end = np.mean(rewards[:3]), np.mean(rewards[-3:])
assert end > start + 0.2, f"the reward did not rise: {start:.3f} -> {end:.3f}"
