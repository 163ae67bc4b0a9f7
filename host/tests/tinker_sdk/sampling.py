"""Sampling through the SDK: seeds reproduce, stop tokens and strings end a sample, prompt
logprobs come back with `None` first, top-k prompt logprobs are ordered."""

from common import BASE_MODEL, service
from tinker import types

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

# Stop strings, with the tokenizer the SDK loads from the server's model folder.
tokenizer = client.create_lora_training_client(base_model=BASE_MODEL, rank=2).result().get_tokenizer()
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
print("sampling: seeds, stop tokens, stop strings, prompt logprobs ok")
