//! The Tinker wire's paths (`/api/v1/...`), each mapped to one op of the service. Ops that take
//! long answer `{"request_id"}` at once and run as futures; the rest answer directly.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::futures::{Finished, Idempotency, Submission};
use super::handling::{Caller, direct, off_the_workers, parse, pass_refused_turn, record};
use super::journal::{AcceptedRequest, Answer, Outcome};
use super::{AppState, HttpError, category, plugins, wire};
use crate::api::{
    ApiError, CheckpointPath, DecodeBudget, LossId, ModelId, ModelInput, Op, OpOutput,
    SampleRequest, SamplerId, SamplerSource, SaveOptions, SequenceId, SessionId, TenantId,
    check_num_samples, check_user_metadata,
};
use crate::service::{Checked, Hold};
use crate::wire::{encode_forward_backward_output, encode_sample_response};

type Shared = Arc<AppState>;
type Answered = Result<Response, HttpError>;

/// The Tinker SDK's own routes (under `/api/v1`): the session and info routes, and one route
/// per op that runs as a future ([`FutureRoute`]).
pub fn router() -> Router<Shared> {
    let api = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/client/config", post(client_config))
        .route("/client/dynamic_config", post(empty_object))
        .route("/create_session", post(create_session))
        .route("/session_heartbeat", post(heartbeat))
        .route("/telemetry", post(telemetry))
        .route("/sessions/{id}/finish", post(finish_session))
        .route("/get_server_capabilities", get(capabilities))
        .route("/get_info", post(get_info))
        .route("/create_sampling_session", post(create_sampling_session))
        .route("/samplers/{id}", get(get_sampler))
        .route("/retrieve_future", post(retrieve_future));
    FutureRoute::ALL.into_iter().fold(api, |api, route| {
        let handler =
            move |state: State<Shared>, caller: Caller, headers: HeaderMap, body: Bytes| {
                submit(route, state, caller, headers, body)
            };
        api.route(&format!("/{}", route.name()), post(handler))
    })
}

async fn empty_object(_: Caller) -> Json<Value> {
    Json(json!({}))
}

/// The SDK's feature flags: server-side custom losses (`create_custom_loss` uploads the traced
/// graph, and `forward_backward_custom` runs it here in one call); the rest as the SDK's
/// defaults.
async fn client_config(_: Caller) -> Json<Value> {
    Json(json!({ "custom_loss_server_side": true }))
}

/// A session's heartbeat keeps it from being finished for idleness; a finished session answers
/// 410, which stops the SDK's heartbeat loop.
async fn heartbeat(State(state): State<Shared>, Caller(tenant): Caller, body: Bytes) -> Answered {
    let heartbeat: wire::SessionHeartbeat = parse(&body)?;
    let session = SessionId::new(&heartbeat.session_id)?;
    state.service.heartbeat(&tenant, &session)?;
    Ok(Json(json!({"type": "session_heartbeat"})).into_response())
}

/// The SDK's `ServiceClient.close`: the session's models and samplers are freed (recorded, so
/// a restart does not bring them back); its checkpoints stay.
async fn finish_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Answered {
    let session = SessionId::new(&id)?;
    let changes = state.service.finish_session(&tenant, &session)?;
    record(&state, changes).await?;
    Ok(Json(json!({})).into_response())
}

async fn telemetry(_: Caller) -> Json<Value> {
    Json(json!({"status": "accepted"}))
}

async fn capabilities(State(state): State<Shared>, _: Caller) -> Json<Value> {
    Json(json!({ "supported_models": state.service.capabilities() }))
}

async fn create_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Answered {
    let _: wire::CreateSession = parse(&body)?;
    match direct(&state, &tenant, Op::CreateSession).await? {
        OpOutput::Session(id) => {
            Ok(Json(json!({"type": "create_session", "session_id": id})).into_response())
        }
        other => Err(unexpected(&other)),
    }
}

fn unexpected(output: &OpOutput) -> HttpError {
    HttpError(ApiError::internal(format!(
        "unexpected op output {output:?}"
    )))
}

/// The routes whose requests run as futures: recorded when accepted, answered with a request
/// id, and run again after a restart if they had not finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutureRoute {
    CreateModel,
    ForwardBackward,
    OptimStep,
    SaveWeights,
    SaveWeightsForSampler,
    SaveWeightsExternal,
    LoadWeights,
    Sample,
    CreateCustomLoss,
}

impl FutureRoute {
    pub const ALL: [FutureRoute; 9] = [
        FutureRoute::CreateModel,
        FutureRoute::ForwardBackward,
        FutureRoute::OptimStep,
        FutureRoute::SaveWeights,
        FutureRoute::SaveWeightsForSampler,
        FutureRoute::SaveWeightsExternal,
        FutureRoute::LoadWeights,
        FutureRoute::Sample,
        FutureRoute::CreateCustomLoss,
    ];

    /// The path under `/api/v1/`, and the route's name in the journal.
    pub fn name(self) -> &'static str {
        match self {
            FutureRoute::CreateModel => "create_model",
            FutureRoute::ForwardBackward => "forward_backward",
            FutureRoute::OptimStep => "optim_step",
            FutureRoute::SaveWeights => "save_weights",
            FutureRoute::SaveWeightsForSampler => "save_weights_for_sampler",
            FutureRoute::SaveWeightsExternal => "save_weights_external",
            FutureRoute::LoadWeights => "load_weights",
            FutureRoute::Sample => "asample",
            FutureRoute::CreateCustomLoss => "create_custom_loss",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// A request of a future route, read into its op.
pub struct Accepted {
    pub op: Op,
    pub seq: Option<u64>,
    /// What makes a repeat of it: a training client's `(model_id, seq_id)`, a sampler's
    /// `(sampler, seq_id)`, a new model's id, or else the client's `X-Idempotency-Key`.
    pub key: Option<String>,
    /// Top-level body fields in which a client's retry may differ from its first try (see
    /// [`Idempotency::ignoring`]).
    pub varying: &'static [&'static str],
    /// Fields of the submit answer besides the request id.
    pub extra: Value,
}

fn seq_key(
    scope: &impl std::fmt::Display,
    seq: Option<u64>,
    header: Option<&str>,
) -> Option<String> {
    match seq {
        Some(seq) => Some(format!("{scope}#{seq}")),
        None => header.map(|k| format!("header:{k}")),
    }
}

/// A checkpoint name the client gave, or one made from the op's place in the model's order.
fn checkpoint_name(path: Option<String>, seq: Option<u64>) -> String {
    path.unwrap_or_else(|| format!("seq-{}", seq.unwrap_or(0)))
}

impl Accepted {
    /// A call on a training model, keyed by its place in the model's order.
    fn on_model(model: &ModelId, seq: Option<u64>, header_key: Option<&str>, op: Op) -> Self {
        Accepted {
            varying: &[],
            key: seq_key(model, seq, header_key),
            extra: json!({ "model_id": model }),
            seq,
            op,
        }
    }

    /// A call that creates the model `model`: a repeat of it is the same model.
    fn creating(model: &ModelId, op: Op) -> Self {
        Accepted {
            varying: &[],
            key: Some(format!("create {model}")),
            extra: json!({ "model_id": model }),
            seq: None,
            op,
        }
    }
}

/// Read a request of `route` into its op (also when it is run again after a restart).
pub fn accept(
    route: FutureRoute,
    body: &[u8],
    header_key: Option<&str>,
) -> Result<Accepted, ApiError> {
    Ok(match route {
        FutureRoute::CreateModel => {
            let request: wire::CreateModel = parse(body)?;
            let session = SessionId::new(&request.session_id)?;
            let lora = request.lora_config.ok_or_else(|| {
                ApiError::invalid("lora_config is required: this server trains LoRA adapters")
            })?;
            let model = ModelId {
                session: session.clone(),
                seq: request.model_seq_id,
            };
            let op = Op::CreateModel {
                session,
                model_seq: request.model_seq_id,
                base_model: request.base_model,
                lora,
                user_metadata: check_user_metadata(request.user_metadata)?,
            };
            Accepted::creating(&model, op)
        }
        FutureRoute::ForwardBackward => {
            let request = wire::forward_backward(body)?;
            let op = Op::ForwardBackward {
                model: request.model_id.clone(),
                input: request.input,
                forward_only: request.forward_only,
            };
            Accepted::on_model(&request.model_id, request.seq_id, header_key, op)
        }
        FutureRoute::OptimStep => {
            let request: wire::OptimStep = parse(body)?;
            let op = Op::OptimStep {
                model: request.model_id.clone(),
                params: request.adam_params,
            };
            Accepted::on_model(&request.model_id, request.seq_id, header_key, op)
        }
        FutureRoute::SaveWeights => {
            let request: wire::SaveWeights = parse(body)?;
            let op = Op::SaveState {
                name: checkpoint_name(request.path, request.seq_id),
                model: request.model_id.clone(),
                options: SaveOptions {
                    ttl_seconds: request.ttl_seconds,
                    user_metadata: check_user_metadata(request.user_metadata)?,
                },
            };
            Accepted::on_model(&request.model_id, request.seq_id, header_key, op)
        }
        FutureRoute::SaveWeightsExternal => {
            let request: wire::SaveWeightsExternal = parse(body)?;
            let op = Op::SaveWeightsExternal {
                name: request.path,
                model: request.model_id.clone(),
                options: SaveOptions {
                    ttl_seconds: request.ttl_seconds,
                    user_metadata: Default::default(),
                },
                recipients: request.age_encryption_recipients.unwrap_or_default(),
            };
            Accepted::on_model(&request.model_id, request.seq_id, header_key, op)
        }
        FutureRoute::SaveWeightsForSampler => accept_save_for_sampler(parse(body)?, header_key)?,
        FutureRoute::LoadWeights => accept_load_weights(parse(body)?, header_key)?,
        FutureRoute::CreateCustomLoss => {
            let request: wire::CreateCustomLoss = parse(body)?;
            let session = SessionId::new(&request.session_id)?;
            let id = LossId {
                session: session.clone(),
                seq: request.custom_loss_seq_id,
            };
            Accepted {
                varying: &[],
                // The loss's id is its session's numbering: a repeat is the same loss.
                key: Some(format!("create {id}")),
                extra: json!({}),
                seq: None,
                op: Op::CreateCustomLoss {
                    session,
                    loss_seq: request.custom_loss_seq_id,
                    name: request.name,
                    inputs: request.inputs,
                    graph: request.graph,
                },
            }
        }
        FutureRoute::Sample => accept_sample(body, header_key)?,
    })
}

/// `save_weights_for_sampler`: a named checkpoint, or (with a sampler number and no path) a
/// snapshot that a sampling session reads.
fn accept_save_for_sampler(
    request: wire::SaveWeightsForSampler,
    header_key: Option<&str>,
) -> Result<Accepted, ApiError> {
    let model = request.model_id.clone();
    let op = match (request.path, request.sampling_session_seq_id) {
        (Some(name), _) => Op::SaveWeightsForSampler {
            model,
            name,
            options: SaveOptions {
                ttl_seconds: request.ttl_seconds,
                user_metadata: check_user_metadata(request.user_metadata)?,
            },
        },
        (None, Some(sampler_seq)) => Op::SnapshotForSampler { model, sampler_seq },
        (None, None) => {
            return Err(ApiError::invalid(
                "save_weights_for_sampler needs `path` or `sampling_session_seq_id`",
            ));
        }
    };
    Ok(Accepted {
        // The SDK draws a new sampler number on each try of the same seq_id.
        varying: &["sampling_session_seq_id"],
        ..Accepted::on_model(&request.model_id, request.seq_id, header_key, op)
    })
}

/// `load_weights`: into a model that exists, or (with a session and a model number) into a new
/// one.
fn accept_load_weights(
    request: wire::LoadWeights,
    header_key: Option<&str>,
) -> Result<Accepted, ApiError> {
    let path: CheckpointPath = request.path.parse()?;
    match (request.model_id, request.session_id, request.model_seq_id) {
        (Some(model), None, _) => {
            let op = Op::LoadState {
                model: model.clone(),
                path,
                with_optimizer: request.optimizer,
            };
            Ok(Accepted::on_model(&model, request.seq_id, header_key, op))
        }
        (None, Some(session), Some(model_seq)) => {
            let session = SessionId::new(&session)?;
            let model = ModelId {
                session: session.clone(),
                seq: model_seq,
            };
            let op = Op::CreateModelFromState {
                session,
                model_seq,
                path,
                with_optimizer: request.optimizer,
                user_metadata: check_user_metadata(request.user_metadata)?,
            };
            Ok(Accepted::creating(&model, op))
        }
        _ => Err(ApiError::invalid(
            "load_weights needs `model_id`, or `session_id` with `model_seq_id`",
        )),
    }
}

/// `asample`, on a sampling session.
fn accept_sample(body: &[u8], header_key: Option<&str>) -> Result<Accepted, ApiError> {
    let request: wire::Sample = parse(body)?;
    let mut budget = DecodeBudget::for_body(body.len());
    let Some(id) = &request.sampling_session_id else {
        return Err(ApiError::invalid(
            "asample needs a `sampling_session_id` (create one with create_sampling_session)",
        ));
    };
    let sampler = SamplerId::parse(id)?;
    check_num_samples("num_samples", request.num_samples)?;
    // Named by the request's place in its sampler's order, so that a repeat of it (and
    // its run after a restart) names the same sequences.
    let sequence_ids = request.seq_id.map(|seq| {
        (0..request.num_samples)
            .map(|i| SequenceId::of_sample(&sampler, seq, i))
            .collect::<Vec<_>>()
    });
    // A sparse tensor's unlisted cells ask nothing, as a dense one's `-1` cells.
    let target_prompt_logprobs = request
        .target_prompt_logprobs
        .map(|t| t.dense_i64("target_prompt_logprobs", -1, &mut budget))
        .transpose()?;
    let record_as = match (request.record_stability_info, &sequence_ids) {
        (Some(true), None) => {
            return Err(ApiError::invalid(
                "asample: `record_stability_info` needs the request's `seq_id`, which names its sequences",
            ));
        }
        (Some(true), Some(ids)) => Some(ids.clone()),
        _ => None,
    };
    Ok(Accepted {
        varying: &[],
        key: seq_key(&sampler, request.seq_id, header_key),
        extra: json!({
            "num_samples": request.num_samples,
            "sample_sequence_ids": sequence_ids,
        }),
        seq: None,
        op: Op::Sample(SampleRequest {
            sampler,
            prompt: ModelInput {
                chunks: request.prompt.chunks,
            },
            num_samples: request.num_samples,
            params: request.sampling_params,
            prompt_logprobs: request.prompt_logprobs.unwrap_or(false),
            topk_prompt_logprobs: request.topk_prompt_logprobs,
            topk_sample_logprobs: request.topk_sample_logprobs,
            prompt_logprobs_last_n: request.prompt_logprobs_last_n,
            target_prompt_logprobs,
            prompt_alt_tokens_k: request.prompt_alt_tokens_k,
            record_as,
        }),
    })
}

/// The answer of a finished op of `route`, as the SDK reads it.
fn answer(route: FutureRoute, output: OpOutput) -> Outcome {
    let json = |value: Value| Ok(Answer::Json(value));
    match (route, output) {
        (FutureRoute::CreateModel, OpOutput::Model(id)) => {
            json(json!({"type": "create_model", "model_id": id}))
        }
        (FutureRoute::ForwardBackward, OpOutput::ForwardBackward(output)) => {
            Ok(Answer::Proto(encode_forward_backward_output(&output)))
        }
        (FutureRoute::OptimStep, OpOutput::OptimStep(output)) => {
            json(json!({"metrics": output.metrics}))
        }
        (FutureRoute::SaveWeights, OpOutput::Checkpoint(path)) => {
            json(json!({"type": "save_weights", "path": path}))
        }
        (FutureRoute::SaveWeightsExternal, OpOutput::Checkpoint(path)) => {
            json(json!({"type": "save_weights_external", "path": path}))
        }
        (FutureRoute::SaveWeightsForSampler, OpOutput::Checkpoint(path)) => {
            json(json!({"type": "save_weights_for_sampler", "path": path}))
        }
        (FutureRoute::SaveWeightsForSampler, OpOutput::Sampler(id)) => {
            json(json!({"type": "save_weights_for_sampler", "sampling_session_id": id}))
        }
        (FutureRoute::LoadWeights, OpOutput::Checkpoint(path)) => {
            json(json!({"type": "load_weights", "path": path}))
        }
        (FutureRoute::LoadWeights, OpOutput::Model(id)) => {
            json(json!({"type": "load_weights", "model_id": id}))
        }
        (FutureRoute::Sample, OpOutput::Sample(response)) => {
            Ok(Answer::Proto(encode_sample_response(&response)))
        }
        (FutureRoute::CreateCustomLoss, OpOutput::CustomLoss(id)) => {
            json(json!({"type": "create_custom_loss", "loss_id": id}))
        }
        (route, other) => Err(ApiError::internal(format!(
            "{} answered {other:?}",
            route.name()
        ))),
    }
}

/// The work of an accepted request (with what its check built): run the op, make its answer,
/// keep the model's turn until the journal has it.
pub fn work(
    state: &Shared,
    tenant: &TenantId,
    route: FutureRoute,
    op: Op,
    seq: Option<u64>,
    checked: Checked,
) -> impl std::future::Future<Output = Finished> + Send + 'static {
    let (state, tenant) = (Arc::clone(state), tenant.clone());
    async move {
        // A journalled call runs again after a restart, before any call has loaded its plugin
        // (its config was checked when it was accepted).
        if let Err(error) = plugins::load_objective(&state, &tenant, &op).await {
            // The refused call's turn of its model passes, so that the calls after it run.
            let passed = match (op.model(), seq) {
                (Some(model), Some(seq)) => state.service.pass_turn(&tenant, model, seq).await.ok(),
                _ => None,
            };
            let (changes, hold) = passed.unwrap_or_else(|| (Vec::new(), Hold::none()));
            return Finished {
                outcome: Err(error),
                changes,
                hold,
            };
        }
        let executed = state.service.execute(&tenant, op, seq, checked).await;
        Finished {
            outcome: executed.outcome.and_then(|output| answer(route, output)),
            changes: executed.changes,
            hold: executed.hold,
        }
    }
}

/// Run again, under their recorded ids, the requests that were accepted and had not finished
/// when the server stopped.
pub fn resume(state: &Shared, pending: Vec<AcceptedRequest>) {
    for request in pending {
        let accepted = FutureRoute::from_name(&request.route)
            .ok_or_else(|| ApiError::internal(format!("unknown route {:?}", request.route)))
            .and_then(|route| Ok((route, accept(route, &request.body, None)?)));
        match accepted {
            Ok((route, accepted)) => {
                let (op, seq) = (accepted.op, accepted.seq);
                let work = work(state, &request.tenant, route, op, seq, Checked::default());
                state.futures.resubmit(&request, work);
            }
            Err(error) => state.futures.resubmit(&request, async move {
                Finished {
                    outcome: Err(error),
                    changes: Vec::new(),
                    hold: Hold::none(),
                }
            }),
        }
    }
}

async fn submit(
    route: FutureRoute,
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    if headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity")
    {
        return Err(ApiError::invalid(
            "compressed bodies are not accepted (the server's client config does not ask for them)",
        )
        .into());
    }
    let header_key = headers
        .get("x-idempotency-key")
        .and_then(|v| v.to_str().ok());
    let header_key = header_key.map(str::to_string);
    let read = body.clone();
    // Decoding and hashing a body of up to 64 MiB: off the async workers.
    let (accepted, idempotency) = off_the_workers(move || {
        let accepted = accept(route, &read, header_key.as_deref())?;
        let idempotency =
            (accepted.key.clone()).map(|key| Idempotency::ignoring(key, &read, accepted.varying));
        Ok((accepted, idempotency))
    })
    .await?;
    // Refused without passing its turn: passing it would wait for the turns before it.
    if let (Some(model), Some(seq)) = (accepted.op.model(), accepted.seq) {
        state.service.check_seq(&tenant, model, seq)?;
    }
    let prepared = plugins::prepare_objective(&state, &tenant, &accepted.op).await;
    let checked = match prepared.and_then(|()| state.service.validate(&tenant, &accepted.op)) {
        Ok(checked) => checked,
        Err(error) => {
            if let (Some(model), Some(seq)) = (accepted.op.model(), accepted.seq) {
                pass_refused_turn(&state, &tenant, model.clone(), seq);
            }
            return Err(error.into());
        }
    };
    let mut op = accepted.op;
    checked.drop_datums_of(&mut op);
    let submission = Submission {
        tenant: tenant.clone(),
        idempotency,
        route: route.name().to_string(),
        body: Vec::from(body),
    };
    let work = work(&state, &tenant, route, op, accepted.seq, checked);
    let id = state.futures.submit(submission, work).await?;
    let mut extra = accepted.extra;
    if route == FutureRoute::Sample {
        let n = extra["num_samples"].as_u64().unwrap_or(1);
        let ids = match extra["sample_sequence_ids"].take() {
            Value::Null => json!((0..n).map(|i| format!("{id}/{i}")).collect::<Vec<_>>()),
            ids => ids,
        };
        extra = json!({ "sample_sequence_ids": ids });
    }
    let mut answer = json!({ "request_id": id });
    if let (Some(answer), Value::Object(extra)) = (answer.as_object_mut(), extra) {
        answer.extend(extra);
    }
    Ok(Json(answer).into_response())
}

async fn get_info(State(state): State<Shared>, Caller(tenant): Caller, body: Bytes) -> Answered {
    let request: wire::GetInfo = parse(&body)?;
    let op = Op::GetInfo {
        model: request.model_id,
    };
    match direct(&state, &tenant, op).await? {
        OpOutput::Info(info) => Ok(Json(json!({
            "type": "get_info",
            "model_id": info.model_id,
            "model_data": {
                "arch": info.arch,
                "model_name": info.base_model,
                // The public name the model is served under (a client loads its tokenizer by
                // it, as a Hugging Face id or a folder of its own), never a path of this server.
                "tokenizer_id": info.base_model,
            },
            "is_lora": true,
            "lora_rank": info.lora_rank,
            "model_name": info.base_model,
        }))
        .into_response()),
        other => Err(unexpected(&other)),
    }
}

async fn create_sampling_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Answered {
    let request: wire::CreateSamplingSession = parse(&body)?;
    let source = match (request.model_path, request.base_model) {
        (Some(path), _) => SamplerSource::Checkpoint(path.parse()?),
        (None, Some(base)) => SamplerSource::Base(base),
        (None, None) => {
            return Err(ApiError::invalid(
                "create_sampling_session needs `model_path` or `base_model`",
            )
            .into());
        }
    };
    let op = Op::CreateSamplingSession {
        session: SessionId::new(&request.session_id)?,
        sampler_seq: request.sampling_session_seq_id,
        source,
    };
    match direct(&state, &tenant, op).await? {
        OpOutput::Sampler(id) => Ok(Json(json!({
            "type": "create_sampling_session",
            "sampling_session_id": id,
        }))
        .into_response()),
        other => Err(unexpected(&other)),
    }
}

async fn get_sampler(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Answered {
    let op = Op::GetSampler {
        sampler: SamplerId::parse(&id)?,
    };
    match direct(&state, &tenant, op).await? {
        OpOutput::SamplerInfo(info) => Ok(Json(json!(info)).into_response()),
        other => Err(unexpected(&other)),
    }
}

async fn retrieve_future(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Answered {
    let request: wire::RetrieveFuture = parse(&body)?;
    let outcome = state
        .futures
        .retrieve(&tenant, &request.request_id, state.poll_wait)
        .await?;
    let Some(outcome) = outcome else {
        return Ok(Json(wire::try_again(&request.request_id)).into_response());
    };
    Ok(match &*outcome {
        Ok(Answer::Json(value)) => Json(value.clone()).into_response(),
        Ok(Answer::Proto(bytes)) => (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            bytes.clone(),
        )
            .into_response(),
        Err(error) => Json(json!({
            "error": super::error::public_message(error),
            "category": category(error.kind),
            "kind": error.kind,
        }))
        .into_response(),
    })
}
