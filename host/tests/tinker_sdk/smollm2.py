"""A real pretrained model through the official SDK: SmolLM2-135M-Instruct, served from the GGUF
file of its PyPI package (`serve --model smollm2=FILE`). Greedy sampling finishes a fact as the
model knows it, the `openai` client chats with it through its own chat template, and a LoRA
trained on another answer moves the greedy answer there."""

import os

import openai

from common import cli_logprobs, loss, service
from tinker import types

import numpy as np

MODEL = "smollm2"
GGUF = os.environ["OPENTINKER_SMOLLM2_GGUF"]

prompt, _ = cli_logprobs("The capital of France is", model=GGUF)
paris, _ = cli_logprobs("The capital of France is Paris.", model=GGUF)
lyon, _ = cli_logprobs("The capital of France is Lyon.", model=GGUF)
assert paris[: len(prompt)] == prompt and lyon[: len(prompt)] == prompt, (prompt, paris, lyon)
answer = len(prompt)

client = service()
greedy = types.SamplingParams(max_tokens=3, temperature=0.0)
base = client.create_sampling_client(base_model=MODEL)
said = base.sample(types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=greedy)
said = said.result().sequences[0].tokens
print("base model says", said)
assert said[0] == paris[answer], (said, paris[answer:])

# The OpenAI route renders the conversation with the file's ChatML template: the instruct model
# answers the question.
chat = openai.OpenAI(base_url=os.environ["TINKER_BASE_URL"] + "/v1", api_key=os.environ["TINKER_API_KEY"])
reply = chat.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24,
    temperature=0.0,
)
content = reply.choices[0].message.content
print("chat says", repr(content))
assert "Paris" in content, reply
# Stopped by the end of turn, which the answer's text leaves out (as OpenAI and vLLM do).
assert reply.choices[0].finish_reason == "stop", reply
assert "<|im_end|>" not in content and content == content.strip(), reply

# Train on the other answer only: the prompt's tokens carry no weight.
datum = types.Datum(
    model_input=types.ModelInput.from_ints(lyon[:-1]),
    loss_fn_inputs={
        "target_tokens": np.array(lyon[1:], dtype=np.int64),
        "weights": np.array([0.0] * (answer - 1) + [1.0] * (len(lyon) - answer), dtype=np.float32),
    },
)
training = client.create_lora_training_client(base_model=MODEL, rank=8)
losses = []
for step in range(8):
    out = training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=2e-3)).result()
    losses.append(loss(out))
print("losses", [round(x, 3) for x in losses])
assert losses[-1] < 0.25 * losses[0], losses

tuned = training.save_weights_and_get_sampling_client(name="lyon")
said = tuned.sample(types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=greedy)
said = said.result().sequences[0].tokens
print("the adapter says", said)
assert said[0] == lyon[answer], (said, lyon[answer:])
