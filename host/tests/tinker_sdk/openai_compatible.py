"""The official `openai` client samples `opentinker serve`'s OpenAI-compatible routes: a base
model and an adapter trained through the Tinker SDK, by name, as completions, chat completions
and a stream; the greedy text equals `opentinker sample --temperature 0` for the same prompt, and
another tenant's adapter is unknown."""

import json
import os
import subprocess

import openai
from common import BASE_MODEL, checkpoint_dir, service, sft_datum
from tinker import types

PROMPT = "the cat sat on the"
MAX_TOKENS = 12


def refused_by_name(says, **request):
    """Assert that a chat completion of `request` is refused with a 400 whose message has `says`."""
    try:
        client.chat.completions.create(messages=messages, **request)
    except openai.BadRequestError as error:
        assert says in str(error), error
        return
    raise AssertionError(f"{request} was served (or silently ignored)")


def cli_sample(adapter, chat):
    """The greedy completion of PROMPT as `opentinker sample` makes it."""
    command = [
        os.environ["OPENTINKER_BIN"],
        "sample",
        "--model",
        os.environ["OPENTINKER_TINY_MODEL"],
        "--adapter",
        adapter,
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(MAX_TOKENS),
        "--temperature",
        "0",
        "--json",
    ] + (["--chat"] if chat else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["samples"][0]["text"]


# An adapter trained a little, saved for sampling.
training = service().create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
for _ in range(4):
    training.forward_backward([sft_datum(list(range(30, 70)))], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
path = training.save_weights_for_sampler(name="for-openai").result().path
adapter = checkpoint_dir(path)

base_url = os.environ["TINKER_BASE_URL"] + "/v1"
client = openai.OpenAI(base_url=base_url, api_key=os.environ["TINKER_API_KEY"])

models = [m.id for m in client.models.list().data]
assert BASE_MODEL in models, models

completion = client.completions.create(
    model=path, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=0
)
choice = completion.choices[0]
expected = cli_sample(adapter, chat=False)
assert choice.text == expected, (choice.text, expected)
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
tokens = choice.logprobs.tokens
assert "".join(tokens) == choice.text, (tokens, choice.text)
assert all(lp <= 0 for lp in choice.logprobs.token_logprobs), choice.logprobs.token_logprobs
assert completion.usage.completion_tokens == len(tokens)
print(f"completion: {choice.text!r} (as `opentinker sample`)")
base = client.completions.create(model=BASE_MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
assert base.choices[0].text != choice.text, "the adapter's name sampled the base model"

messages = [{"role": "user", "content": PROMPT}]
chat = client.chat.completions.create(
    model=path, messages=messages, max_tokens=MAX_TOKENS, temperature=0
)
expected_chat = cli_sample(adapter, chat=True)
assert chat.choices[0].message.content == expected_chat, (chat.choices[0], expected_chat)
assert chat.choices[0].message.role == "assistant"
print(f"chat: {expected_chat!r} (as `opentinker sample --chat`)")

# Logprobs with their most likely alternatives: the greedy token is the first of them.
with_top = client.chat.completions.create(
    model=path, messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=3
)
entries = with_top.choices[0].logprobs.content
assert "".join(e.token for e in entries) == expected_chat, entries
for e in entries:
    assert len(e.top_logprobs) == 3, e
    assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob), e
    assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e
legacy = client.completions.create(
    model=path, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=2
)
rows = legacy.choices[0].logprobs.top_logprobs
assert len(rows) == len(legacy.choices[0].logprobs.tokens) and all(len(r) <= 2 for r in rows), rows
assert all(max(r.values()) == lp for r, lp in zip(rows, legacy.choices[0].logprobs.token_logprobs)), rows
refused_by_name("`top_logprobs`", model=path, max_tokens=2, logprobs=True, top_logprobs=21)
refused_by_name("`logprobs`", model=path, max_tokens=2, logprobs=True, stream=True)
refused_by_name("`top_logprobs`", model=path, max_tokens=2, top_logprobs=2)
print("logprobs: alternatives per token, and refusals beyond what is served")

stream = client.chat.completions.create(
    model=path, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
)
text, reasons, pieces = "", [], 0
for chunk in stream:
    for c in chunk.choices:
        text += c.delta.content or ""
        pieces += bool(c.delta.content)
        if c.finish_reason:
            reasons.append(c.finish_reason)
assert text == expected_chat, (text, expected_chat)
assert reasons == [chat.choices[0].finish_reason], reasons
# A chunk as tokens are sampled, not the whole text at the end.
assert pieces > 1, f"the stream came in {pieces} piece(s)"
streamed = client.completions.create(
    model=path, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
)
assert "".join(c.choices[0].text for c in streamed) == expected
print(f"stream: the same text in {pieces} pieces, and its finish reason")

# Several samples with a seed: reproducible.
sampled = [
    client.chat.completions.create(
        model=BASE_MODEL, messages=messages, max_tokens=8, temperature=1.0, n=2, seed=7
    )
    for _ in range(2)
]
texts = [[c.message.content for c in s.choices] for s in sampled]
assert len(texts[0]) == 2 and texts[0] == texts[1], texts
print(f"n=2 with a seed: {texts[0]}")

# A field the server does not serve is refused by name, never silently ignored.
refusals = {
    "tools": dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    "presence_penalty": dict(presence_penalty=0.5),
    "response_format": dict(response_format={"type": "json_object"}),
}
for name, extra in refusals.items():
    refused_by_name(f"`{name}` is not served", model=BASE_MODEL, max_tokens=4, **extra)
client.chat.completions.create(model=BASE_MODEL, messages=messages, max_tokens=4, user="u-1")
print("unserved fields: refused by name")

# Another tenant's adapter is unknown, exactly as a path nobody saved.
other = openai.OpenAI(base_url=base_url, api_key=os.environ["OTHER_TINKER_API_KEY"])
for model in (path, path.replace("for-openai", "never-saved")):
    try:
        other.completions.create(model=model, prompt=PROMPT, max_tokens=4)
    except openai.NotFoundError:
        continue
    raise AssertionError(f"{model} was served to another tenant")
print("another tenant: 404")
