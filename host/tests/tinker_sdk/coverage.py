"""Every public method of the SDK's four clients (ServiceClient, TrainingClient, SamplingClient,
RestClient) called against the server, and the serving guide's coverage table kept true.

The table (between the serving guide's `sdk-coverage` markers) has one row per method: `served` (the
server answers it), `client` (the SDK does it alone, with no request of its own) or `refused`
(the call fails with an error that names the method and why: the server's `not_offered`
answer, or the SDK's own refusal). A method's `_async` twin is called too and must come out the
same. The test fails for a method of the SDK that the table does not list (a newer SDK's), for a
row that names no method of the SDK, and for a call whose outcome is not its row's.

Run with the cookbook's venv (it has torch, which the SDK's custom losses trace with) from a
folder where the tiny model's public name `opentinker/tiny` is a local directory, so that
`get_tokenizer()` finds it as it would find a Hugging Face id in the hub's cache."""

import asyncio
import datetime
import inspect
import json
import os
import pathlib
import re
import sys
import urllib.error
import urllib.request

import numpy as np
import tinker
from tinker import types
from tinker.lib.api_future_impl import QueueState

from common import BASE_MODEL, service, sft_datum

CLIENTS = [tinker.ServiceClient, tinker.TrainingClient, tinker.SamplingClient, tinker.RestClient]
SERVING = pathlib.Path(__file__).resolve().parents[3] / "docs" / "serving.md"


def table():
    """The serving guide's rows: `Client.method` -> (outcome, note)."""
    text = SERVING.read_text()
    start, end = text.index("<!-- sdk-coverage:start -->"), text.index("<!-- sdk-coverage:end -->")
    rows = {}
    for line in text[start:end].splitlines():
        found = re.match(r"\| `(\w+)\.(\w+)` \| (served|client|refused) \| (.*) \|$", line)
        if found:
            client, method, outcome, note = found.groups()
            rows[f"{client}.{method}"] = (outcome, note.strip())
    assert rows, "the serving guide's coverage table has no rows"
    return rows


def public_methods():
    """`Client.method` of every public method of the four clients, `_async` twins folded."""
    names = set()
    for client in CLIENTS:
        for name, member in inspect.getmembers(client):
            if name.startswith("_") or not callable(member):
                continue
            names.add(f"{client.__name__}.{name.removesuffix('_async')}")
    return names


def neg_ll(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


def another_loss():
    """A loss of a name not used before in the session (the SDK refuses to make one twice)."""
    another_loss.made = getattr(another_loss, "made", 0) + 1

    name = f"neg_ll_{another_loss.made}"

    def loss(logprobs, weights):
        value = -(logprobs * weights).sum() * 1.0
        return value, {f"custom/{name}:sum": value}

    loss.__name__ = loss.__qualname__ = name
    return loss


class World:
    """The objects the calls need, made through the SDK."""

    def __init__(self):
        self.service = service()
        self.training = self.service.create_lora_training_client(base_model=BASE_MODEL, rank=4)
        self.data = [sft_datum(list(range(10, 30)))]
        self.training.forward_backward(self.data, "cross_entropy").result()
        self.state = self.training.save_state("coverage-state").result().path
        self.weights = self.training.save_weights_for_sampler("coverage-weights").result().path
        self.sampler = self.training.create_sampling_client(self.weights)
        self.export = self.training.save_weights_external("coverage-export").result().path
        self.rest = self.service.create_rest_client()
        self.session_id = self.service.holder.get_session_id()
        self.prompt = types.ModelInput.from_ints([5, 6, 7, 8])
        self.loss = self.service.create_custom_loss(
            neg_ll, input_ranks={"logprobs": 1, "weights": 1}
        ).result()
        self.saved = 0

    def name(self, stem):
        """A fresh checkpoint name (each call of a saving method makes one)."""
        self.saved += 1
        return f"{stem}-{self.saved}"

    def deletable(self):
        return self.training.save_state(self.name("doomed")).result().path


def calls(w):
    """Each method's call: `Client.method` -> (function of the method, to call it with)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    sampling = types.SamplingParams(max_tokens=4, temperature=1.0, seed=1)
    adam = types.AdamParams(learning_rate=1e-4)
    closing = service()
    closing.create_sampling_client(base_model=BASE_MODEL)
    return {
        "ServiceClient.close": (closing, lambda m: m("success")),
        # The SDK copies into a project, so a client of one (projects are not offered here).
        "ServiceClient.copy_weights": (tinker.ServiceClient(project_id="p"), lambda m: m(w.state)),
        "ServiceClient.create_custom_loss": (
            w.service,
            lambda m: m(another_loss(), input_ranks={"logprobs": 1, "weights": 1}),
        ),
        "ServiceClient.create_lora_training_client": (
            w.service,
            lambda m: m(base_model=BASE_MODEL, rank=2),
        ),
        "ServiceClient.create_rest_client": (w.service, lambda m: m()),
        "ServiceClient.create_sampling_client": (w.service, lambda m: m(base_model=BASE_MODEL)),
        "ServiceClient.create_training_client_from_state": (w.service, lambda m: m(w.state)),
        "ServiceClient.create_training_client_from_state_with_optimizer": (
            w.service,
            lambda m: m(w.state),
        ),
        "ServiceClient.get_console_url": (w.service, lambda m: m()),
        "ServiceClient.get_server_capabilities": (w.service, lambda m: m()),
        "ServiceClient.get_telemetry": (w.service, lambda m: m()),
        "TrainingClient.create_sampling_client": (w.training, lambda m: m(w.weights)),
        "TrainingClient.forward": (w.training, lambda m: m(w.data, "cross_entropy")),
        "TrainingClient.forward_backward": (w.training, lambda m: m(w.data, "cross_entropy")),
        "TrainingClient.forward_backward_custom": (w.training, lambda m: m(w.data, w.loss)),
        "TrainingClient.get_console_url": (w.training, lambda m: m()),
        "TrainingClient.get_info": (w.training, lambda m: m()),
        "TrainingClient.get_telemetry": (w.training, lambda m: m()),
        "TrainingClient.get_tokenizer": (w.training, lambda m: m()),
        "TrainingClient.load_state": (w.training, lambda m: m(w.state)),
        "TrainingClient.load_state_with_optimizer": (w.training, lambda m: m(w.state)),
        "TrainingClient.optim_step": (w.training, lambda m: m(adam)),
        "TrainingClient.save_state": (w.training, lambda m: m(w.name("state"))),
        "TrainingClient.save_weights_and_get_sampling_client": (
            w.training,
            lambda m: m(w.name("weights")),
        ),
        "TrainingClient.save_weights_external": (w.training, lambda m: m(w.name("external"))),
        "TrainingClient.save_weights_for_sampler": (w.training, lambda m: m(w.name("weights"))),
        "SamplingClient.compute_logprobs": (w.sampler, lambda m: m(w.prompt)),
        "SamplingClient.create": (
            tinker.SamplingClient,
            lambda m: m(w.sampler.holder, model_path=w.weights),
        ),
        "SamplingClient.from_sampler_handle": (
            tinker.SamplingClient,
            lambda m: m(w.sampler.get_sampler_handle(), api_key=os.environ["TINKER_API_KEY"]),
        ),
        "SamplingClient.get_base_model": (w.sampler, lambda m: m()),
        "SamplingClient.get_sampler_handle": (w.sampler, lambda m: m()),
        "SamplingClient.get_telemetry": (w.sampler, lambda m: m()),
        "SamplingClient.get_tokenizer": (w.sampler, lambda m: m()),
        "SamplingClient.on_queue_state_change": (
            w.sampler,
            lambda m: m(QueueState.ACTIVE, None),
        ),
        "SamplingClient.sample": (w.sampler, lambda m: m(w.prompt, 1, sampling)),
        "RestClient.assign_session_project": (w.rest, lambda m: m(w.session_id, "project")),
        "RestClient.copy_weights": (w.rest, lambda m: m(w.state, destination_project_id="p")),
        "RestClient.delete_checkpoint": (
            w.rest,
            lambda m: m(w.training.model_id, w.deletable().split("/", 3)[3]),
        ),
        "RestClient.delete_checkpoint_from_tinker_path": (w.rest, lambda m: m(w.deletable())),
        "RestClient.export_session_trace": (w.rest, lambda m: m(w.session_id)),
        "RestClient.get_audit_log": (w.rest, lambda m: m()),
        "RestClient.get_billing_usage": (
            w.rest,
            lambda m: m(now - datetime.timedelta(days=1), now),
        ),
        "RestClient.get_current_checkpoint_storage_usage": (w.rest, lambda m: m()),
        "RestClient.get_external_weights_urls": (
            w.rest,
            lambda m: m(w.export),
        ),
        "RestClient.get_sampler": (
            w.rest,
            lambda m: m(w.rest.get_session(w.session_id).result().sampler_ids[0]),
        ),
        "RestClient.get_server_capabilities": (w.rest, lambda m: m()),
        "RestClient.get_session": (w.rest, lambda m: m(w.session_id)),
        "RestClient.get_telemetry": (w.rest, lambda m: m()),
        "RestClient.get_training_run": (w.rest, lambda m: m(w.training.model_id)),
        "RestClient.get_training_run_by_tinker_path": (w.rest, lambda m: m(w.state)),
        "RestClient.get_weights_info_by_tinker_path": (w.rest, lambda m: m(w.state)),
        "RestClient.list_checkpoints": (w.rest, lambda m: m(w.training.model_id)),
        "RestClient.list_sessions": (w.rest, lambda m: m()),
        "RestClient.list_training_runs": (w.rest, lambda m: m()),
        "RestClient.list_user_checkpoints": (w.rest, lambda m: m()),
        "RestClient.publish_checkpoint_from_tinker_path": (w.rest, lambda m: m(w.state)),
        "RestClient.search_sessions": (
            w.rest,
            lambda m: m(types.SessionSearchRequest(session_id=w.session_id)),
        ),
        "RestClient.set_checkpoint_ttl_from_tinker_path": (w.rest, lambda m: m(w.state, 7200)),
        "RestClient.unpublish_checkpoint_from_tinker_path": (w.rest, lambda m: m(w.state)),
        "RestClient.whoami": (w.rest, lambda m: m()),
    }


def settle(value):
    """The value of a call: futures waited for, coroutines run to their end."""
    if inspect.isawaitable(value) and not hasattr(value, "result"):

        async def wait():
            inner = await value
            return await inner if inspect.isawaitable(inner) else inner

        return asyncio.run(wait())
    if hasattr(value, "result") and callable(value.result):
        return settle(value.result())
    return value


def outcome(owner, name, call):
    """`served`/`client` as one (the call returned) or the text of its error."""
    try:
        settle(call(getattr(owner, name)))
        return "answered", None
    except Exception as error:  # the SDK's errors, whatever their class
        return "failed", f"{type(error).__name__}: {error}"


def check_answers(w):
    """What the session and weights routes answer, and that a refused call of a training client
    (numbered in its model's order like any other) does not hold up the calls after it."""
    # An export's signed URLs open its files to anyone holding them, and nothing else does.
    urls = w.rest.get_external_weights_urls(w.export).result().urls
    assert set(urls) == {"adapter_config.json", "adapter_model.safetensors"}, urls
    config = urllib.request.urlopen(urls["adapter_config.json"]).read()
    assert json.loads(config)["r"] == 4, config
    forged = urls["adapter_config.json"].replace("adapter_config.json", "adapter_model.safetensors")
    try:
        urllib.request.urlopen(forged)
        raise AssertionError("a URL signed for another file was honoured")
    except urllib.error.HTTPError as error:
        assert error.code == 404, error
    try:
        w.service.create_training_client_from_state(w.export).result()
        raise AssertionError("an export was loaded into a model")
    except tinker.BadRequestError as error:
        assert "export for download" in str(error), error
    info = w.rest.get_weights_info_by_tinker_path(w.state).result()
    assert info.base_model == BASE_MODEL and info.is_lora and info.lora_rank == 4, info
    session = w.rest.get_session(w.session_id).result()
    assert w.training.model_id in session.training_run_ids, session
    assert session.sampler_ids, session
    assert w.session_id in w.rest.list_sessions().result().sessions
    usage = w.rest.get_current_checkpoint_storage_usage().result().data
    listed = w.rest.list_user_checkpoints().result().checkpoints
    assert usage[0].checkpoint_count == len(listed), (usage, listed)
    assert usage[0].size_bytes == sum(c.size_bytes for c in listed), usage
    other = service("OTHER_TINKER_API_KEY").create_rest_client()
    for call in (
        lambda: other.get_session(w.session_id).result(),
        lambda: other.get_weights_info_by_tinker_path(w.state).result(),
        lambda: other.get_external_weights_urls(w.export).result(),
    ):
        try:
            call()
            raise AssertionError("another tenant's session or checkpoint was answered")
        except tinker.NotFoundError:
            pass
    assert w.session_id not in other.list_sessions().result().sessions
    try:
        w.training.forward_backward([sft_datum([1, 2, 10**6])], "cross_entropy").result()
        raise AssertionError("a datum outside the vocabulary was answered")
    except tinker.BadRequestError as error:
        print(f"refused as it should be: {error}")
    # Without the refused calls' turns passed, this would wait for them forever.
    assert w.training.forward_backward(w.data, "cross_entropy").result(timeout=60).metrics


def main():
    rows = table()
    methods = public_methods()
    missing, extra = sorted(methods - rows.keys()), sorted(rows.keys() - methods)
    assert not missing, f"SDK methods missing from the serving guide's table: {missing}"
    assert not extra, f"the serving guide's table names no SDK method: {extra}"
    world = World()
    every = calls(world)
    assert every.keys() == methods, f"calls and methods differ: {sorted(every.keys() ^ methods)}"
    wrong = []
    for key in sorted(every, key=lambda k: k == "ServiceClient.close"):
        client, method = key.split(".")
        expected, _ = rows[key]
        owner, call = every[key]
        names = [method] + ([f"{method}_async"] if hasattr(owner, f"{method}_async") else [])
        for name in names:
            result, error = outcome(owner, name, call)
            if expected == "refused":
                named = error is not None and method in error
                ok = result == "failed" and named
            else:
                ok = result == "answered"
            said = f" ({error})" if error else ""
            print(f"{client}.{name}: {expected} -> {'ok' if ok else 'WRONG'}{said}")
            if not ok:
                got = error or "answered"
                wrong.append(f"{client}.{name}: the table says {expected}, the call: {got}")
    assert not wrong, "\n".join(wrong)
    check_answers(world)
    print(f"{len(every)} methods as the serving guide's table says")


if __name__ == "__main__":
    sys.exit(main())
