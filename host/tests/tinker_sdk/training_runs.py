"""The RestClient's training-run and checkpoint calls, as the cookbook makes them: a run's
user_metadata (where the cookbook keeps its renderer name) comes back from
get_training_run_by_tinker_path, its checkpoints are listed with their expiry, one is deleted
(its files gone, its path refused afterwards), another tenant's is refused as unknown. After
`ServiceClient.close` (which frees the session's models), the run and its checkpoints stay: a new
session lists them, trains from one and samples another."""

import os
import pathlib

import tinker

from common import BASE_MODEL, refused, service, sft_datum

alice, bob = service(), service("OTHER_TINKER_API_KEY")
metadata = {"renderer_name": "role_colon", "purpose": "test"}
training = alice.create_lora_training_client(
    base_model=BASE_MODEL, rank=4, user_metadata=metadata
).result()
training.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
kept = training.save_state(name="kept").result().path
rolling = training.save_state(
    name="rolling", ttl_seconds=7200, user_metadata={"step": "1"}
).result().path
sampler = training.save_weights_for_sampler(name="for-sampling").result().path

rest = alice.create_rest_client()
run = rest.get_training_run_by_tinker_path(rolling).result()
assert run.training_run_id == training.model_id, run
assert run.user_metadata == metadata, run.user_metadata
assert run.base_model == BASE_MODEL and run.is_lora and run.lora_rank == 4, run
assert run.model_owner == os.environ["TENANT_NAME"], run
assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == rolling, run
assert run.last_sampler_checkpoint.tinker_path == sampler, run

runs = rest.list_training_runs().result()
assert [r.training_run_id for r in runs.training_runs] == [training.model_id], runs
assert runs.cursor.total_count == 1, runs.cursor

listed = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result().checkpoints}
assert set(listed) == {kept, rolling, sampler}, listed
assert listed[kept].expires_at is None and listed[kept].checkpoint_type == "training"
assert listed[sampler].checkpoint_type == "sampler", listed[sampler]
assert listed[rolling].user_metadata == {"step": "1"}, listed[rolling]
expiry = (listed[rolling].expires_at - listed[rolling].time).total_seconds()
assert 7190 <= expiry <= 7210, listed[rolling]
assert all(c.size_bytes > 0 for c in listed.values()), listed
assert {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints} == set(listed)

# The rolling checkpoint's expiry is lifted, then it is deleted as the cookbook deletes it.
rest.set_checkpoint_ttl_from_tinker_path(rolling, None).result()
listed = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result().checkpoints}
assert listed[rolling].expires_at is None, listed[rolling]


bob_rest = bob.create_rest_client()
refused(lambda: bob_rest.delete_checkpoint_from_tinker_path(kept).result(), "bob deletes")
refused(lambda: bob_rest.get_training_run(training.model_id).result(), "bob reads the run")
assert bob_rest.list_training_runs().result().training_runs == []

folder = pathlib.Path(os.environ["OPENTINKER_DATA"], "checkpoints", os.environ["TENANT_NAME"],
                      training.model_id, "weights", "rolling")
assert folder.is_dir(), folder
rest.delete_checkpoint_from_tinker_path(rolling).result()
assert not folder.exists(), "the deleted checkpoint's files are still there"
refused(lambda: alice.create_training_client_from_state(rolling).result(), "load a deleted one")
refused(lambda: rest.delete_checkpoint_from_tinker_path(rolling).result(), "delete it twice")
remaining = {c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints}
assert remaining == {kept, sampler}, remaining
alice.create_training_client_from_state(kept).result()

# Closed, the session's models are freed; its run and checkpoints stay for a new session.
alice.close("success").result()
again = service()
again_rest = again.create_rest_client()
assert [r.training_run_id for r in again_rest.list_training_runs().result().training_runs][0] == \
    training.model_id
remaining = {c.tinker_path for c in again_rest.list_checkpoints(training.model_id).result().checkpoints}
assert remaining == {kept, sampler}, remaining
resumed = again.create_training_client_from_state(kept).result()
resumed.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
sampling = again.create_sampling_client(model_path=sampler)
prompt = tinker.types.ModelInput.from_ints(list(range(10, 20)))
params = tinker.types.SamplingParams(max_tokens=2)
assert len(sampling.sample(prompt, 1, params).result().sequences) == 1
print("training runs: listed, expiring and deleted as the SDK expects; kept past close")
