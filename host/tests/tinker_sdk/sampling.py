"""Sampling through the SDK: seeds reproduce, stop tokens and strings end a sample, prompt
logprobs come back with `None` first, top-k prompt and sample logprobs are ordered, the prompt
options (`prompt_logprobs_last_n`, `target_prompt_logprobs`, `prompt_alt_tokens_k`) agree with
the prompt logprobs, and `get_info` names the tokenizer by the model's public name, not a path
of the server."""

import os

import numpy as np
from common import BASE_MODEL, service
from tinker import types
from transformers import AutoTokenizer

client = service()
sampler = client.create_sampling_client(base_model=BASE_MODEL)
prompt = types.ModelInput.from_ints([11, 12, 13, 14, 15])


def sample(seed, stop=None, max_tokens=12, n=1):
    params = types.SamplingParams(max_tokens=max_tokens, seed=seed, temperature=1.0, stop=stop)
    return sampler.sample(prompt, num_samples=n, sampling_params=params).result()


first, again, other = sample(1, stop=[]), sample(1, stop=[]), sample(2, stop=[])
assert first.sequences[0].tokens == again.sequences[0].tokens, "the same seed sampled differently"
assert first.sequences[0].tokens != other.sequences[0].tokens, "two seeds sampled the same"
assert len(first.sequences[0].tokens) == 12 and first.sequences[0].stop_reason == "length"
assert len(first.sequences[0].logprobs) == 12

# Stop at a token the seeded run samples third: the same seed stops there.
tokens = first.sequences[0].tokens
stop_token = tokens[2]
stopped = sample(1, stop=[stop_token]).sequences[0]
end = tokens.index(stop_token) + 1
assert stopped.tokens == tokens[:end] and stopped.stop_reason == "stop", (stopped, tokens)

# The tokenizer is named as the model is served (a client loads it by that name, as a Hugging
# Face id or a folder of its own); this client has the model's folder.
training = client.create_lora_training_client(base_model=BASE_MODEL, rank=2).result()
tokenizer_id = training.get_info().model_data.tokenizer_id
assert tokenizer_id == BASE_MODEL, tokenizer_id

# Stop strings.
tokenizer = AutoTokenizer.from_pretrained(os.environ["OPENTINKER_TINY_MODEL"])
text = tokenizer.decode(tokens)
stop_text = tokenizer.decode(tokens[3:5]).strip() or tokenizer.decode(tokens[3:5])
stopped = sample(1, stop=[stop_text]).sequences[0]
assert stop_text in tokenizer.decode(stopped.tokens), (stop_text, tokenizer.decode(stopped.tokens))
assert stopped.stop_reason == "stop" and len(stopped.tokens) <= 5, (stopped, text)

# Several samples of one request differ; prompt logprobs have None first.
many = sample(3, n=4, stop=[])
assert len({tuple(s.tokens) for s in many.sequences}) > 1
with_prompt = sampler.sample(
    prompt,
    num_samples=1,
    sampling_params=types.SamplingParams(max_tokens=1, seed=0),
    include_prompt_logprobs=True,
    topk_prompt_logprobs=3,
).result()
assert with_prompt.prompt_logprobs[0] is None and len(with_prompt.prompt_logprobs) == 5
assert all(lp < 0 for lp in with_prompt.prompt_logprobs[1:])
top = with_prompt.topk_prompt_logprobs
assert top[0] is None and all(len(row) == 3 for row in top[1:]), top
assert all(row[0][1] >= row[1][1] >= row[2][1] for row in top[1:])

# Top-k logprobs of the sampled tokens: each token's own logprob is among its position's
# alternatives when it is likely enough, and the alternatives are ordered.
greedy = sampler.sample(
    prompt,
    num_samples=1,
    sampling_params=types.SamplingParams(max_tokens=6, seed=0, temperature=0.0, stop=[]),
    topk_sample_logprobs=4,
).result().sequences[0]
assert len(greedy.topk_logprobs) == len(greedy.tokens) == 6, greedy
for token, logprob, row in zip(greedy.tokens, greedy.logprobs, greedy.topk_logprobs):
    assert len(row) == 4 and all(row[i][1] >= row[i + 1][1] for i in range(3)), row
    assert row[0] == (token, logprob), (row, token, logprob)

# The prompt options of the cookbook's scoring and distillation, answered from the same prefill:
# the last n prompt logprobs, named tokens' logprobs (dense with -1 cells asking nothing, or
# sparse CSR), and alternative draws at each prompt position.
def prompt_sample(**options):
    params = types.SamplingParams(max_tokens=1, seed=5, temperature=options.pop("temperature", 1.0))
    return sampler.sample(prompt, num_samples=1, sampling_params=params, **options).result()


full = with_prompt.prompt_logprobs
last = prompt_sample(include_prompt_logprobs=True, prompt_logprobs_last_n=2).prompt_logprobs
assert last[:3] == [None, None, None] and last[3:] == full[3:], (last, full)

ids = prompt.to_ints()
dense = np.array([[ids[i + 1], -1] for i in range(len(ids) - 1)], dtype=np.int64)
targets = prompt_sample(target_prompt_logprobs=types.TensorData.from_numpy(dense))
scored = targets.target_prompt_logprobs.to_numpy()
assert scored.shape == (4, 2), scored
assert np.allclose(scored[:, 0], full[1:], atol=1e-6) and (scored[:, 1] == 0).all(), scored
sparse = types.TensorData(
    data=[ids[i + 1] for i in range(4)],
    dtype="int64",
    shape=[4, 2],
    sparse_crow_indices=[0, 1, 2, 3, 4],
    sparse_col_indices=[0, 0, 0, 0],
)
from_sparse = prompt_sample(target_prompt_logprobs=sparse).target_prompt_logprobs
assert np.array_equal(from_sparse.to_numpy(), scored), from_sparse

alt = prompt_sample(prompt_alt_tokens_k=3).prompt_alt_tokens
drawn, drawn_logprobs = alt.tokens.to_numpy(), alt.logprobs.to_numpy()
assert drawn.shape == drawn_logprobs.shape == (4, 3), drawn
again = prompt_sample(prompt_alt_tokens_k=3).prompt_alt_tokens
assert np.array_equal(again.tokens.to_numpy(), drawn), "the same seed drew differently"
# Each draw's logprob is the model's: scored again as a target, it is the same.
rescored = prompt_sample(target_prompt_logprobs=types.TensorData.from_numpy(drawn.astype(np.int64)))
assert np.allclose(rescored.target_prompt_logprobs.to_numpy(), drawn_logprobs, atol=1e-6)
greedy_alt = prompt_sample(prompt_alt_tokens_k=2, temperature=0.0).prompt_alt_tokens
greedy_alt = greedy_alt.tokens.to_numpy()
assert [row[0] for row in greedy_alt] == [row[0][0] for row in top[1:]], (greedy_alt, top)
print("sampling: seeds, stop tokens, stop strings, prompt and sample top-k logprobs,")
print("  last-n prompt logprobs, target prompt logprobs and alternative prompt tokens ok")
