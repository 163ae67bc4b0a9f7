"""Two tenants: neither sees the other's models, samplers or checkpoints, and another tenant's
ids are answered exactly as unknown ones. A bad key is refused before any work."""

import os

import httpx
from common import BASE_MODEL, refused, service, sft_datum
from tinker import types

alice, bob = service(), service("OTHER_TINKER_API_KEY")
training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4).result()
training.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
state = training.save_state(name="mine").result().path
weights = training.save_weights_for_sampler(name="mine").result().path
model_id = training.model_id


refused(lambda: bob.create_training_client_from_state(state).result(), "load alice's state")
refused(lambda: bob.create_sampling_client(model_path=weights).sample(
    types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=1)).result(),
    "sample alice's weights")

url = os.environ["TINKER_BASE_URL"] + "/api/v1"


def post(path, key, body):
    response = httpx.post(f"{url}/{path}", json=body, headers={"X-API-Key": key}, timeout=30)
    return response.status_code, response.json()


bob_key = os.environ["OTHER_TINKER_API_KEY"]
hers = post("get_info", bob_key, {"model_id": model_id})
unknown = post("get_info", bob_key, {"model_id": model_id.replace(":train:", ":train:9")})
assert hers[0] == unknown[0] == 404, (hers, unknown)
assert hers[1]["error"].replace(model_id, "X") == unknown[1]["error"].replace(
    model_id.replace(":train:", ":train:9"), "X"), (hers, unknown)
assert post("get_info", os.environ["TINKER_API_KEY"], {"model_id": model_id})[0] == 200

status, body = post("get_info", "tml-forged_key", {"model_id": model_id})
assert status == 401 and body["error"], (status, body)
status, body = httpx.post(f"{url}/get_info", json={"model_id": model_id}, timeout=30).status_code, None
assert status == 401
print("tenants: isolated")
