//! The Tinker wire's paths (`/api/v1/...`), each mapped to one op of the service. Ops that take
//! long answer `{"request_id"}` at once and run as futures; the rest answer directly.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::futures::{Answer, Idempotency, Outcome};
use super::{AppState, HttpError, MAX_BODY_BYTES, category, wire};
use crate::api::{
    ApiError, ApiErrorKind, CheckpointPath, ModelId, ModelInput, Op, OpOutput, SampleRequest,
    SamplerId, SamplerSource, SessionId, TenantId,
};

type Shared = Arc<AppState>;
type Answered = Result<Response, HttpError>;

/// The whole HTTP surface.
pub fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/client/config", post(empty_object))
        .route("/client/dynamic_config", post(empty_object))
        .route("/create_session", post(create_session))
        .route("/session_heartbeat", post(heartbeat))
        .route("/telemetry", post(telemetry))
        .route("/sessions/{id}/finish", post(empty_object))
        .route("/get_server_capabilities", get(capabilities))
        .route("/create_model", post(create_model))
        .route("/get_info", post(get_info))
        .route("/forward_backward", post(forward_backward))
        .route("/optim_step", post(optim_step))
        .route("/save_weights", post(save_weights))
        .route("/save_weights_for_sampler", post(save_weights_for_sampler))
        .route("/load_weights", post(load_weights))
        .route("/create_sampling_session", post(create_sampling_session))
        .route("/samplers/{id}", get(get_sampler))
        .route("/asample", post(sample))
        .route("/retrieve_future", post(retrieve_future));
    Router::new()
        .nest("/api/v1", api)
        .fallback(|| async { HttpError(ApiError::new(ApiErrorKind::NotFound, "no such endpoint")) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The tenant making a request, from its `X-API-Key` (or `Authorization: Bearer`) header.
pub struct Caller(pub TenantId);

impl FromRequestParts<Shared> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, HttpError> {
        let headers = &parts.headers;
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .or_else(|| {
                headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
            })
            .ok_or_else(|| ApiError::new(ApiErrorKind::Unauthorized, "no API key (X-API-Key)"))?;
        Ok(Caller(state.authenticate(key).await?))
    }
}

/// A JSON body, or a 400 naming what is wrong with it.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("request body: {e}")))
}

async fn empty_object(_: Caller) -> Json<Value> {
    Json(json!({}))
}

async fn heartbeat(_: Caller) -> Json<Value> {
    Json(json!({"type": "session_heartbeat"}))
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
    match state
        .service
        .execute(&tenant, Op::CreateSession, None)
        .await?
    {
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

/// Run `op` as a future of `tenant` whose answer `answer` makes from the op's output.
fn submit(
    state: &Shared,
    tenant: &TenantId,
    op: Op,
    seq: Option<u64>,
    idempotency: Option<Idempotency>,
    answer: impl FnOnce(OpOutput) -> Outcome + Send + 'static,
) -> Result<String, ApiError> {
    let (worker, owner) = (Arc::clone(state), tenant.clone());
    state.futures.submit(tenant, idempotency, async move {
        worker
            .service
            .execute(&owner, op, seq)
            .await
            .and_then(answer)
    })
}

fn future_answer(request_id: String, extra: Value) -> Response {
    let mut body = json!({ "request_id": request_id });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    Json(body).into_response()
}

/// The idempotency key of op `name` at `seq` of `scope` (a model or sampler): a training
/// client's `(model_id, seq_id)`.
fn seq_key(scope: &str, seq: Option<u64>, body: &[u8], headers: &HeaderMap) -> Option<Idempotency> {
    match seq {
        Some(seq) => Some(Idempotency::new(format!("{scope}#{seq}"), body)),
        None => headers
            .get("x-idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| Idempotency::new(format!("header:{k}"), body)),
    }
}

async fn create_model(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Answered {
    let request: wire::CreateModel = parse(&body)?;
    let session = SessionId::new(&request.session_id)?;
    let lora = request.lora_config.ok_or_else(|| {
        ApiError::invalid("lora_config is required: this server trains LoRA adapters")
    })?;
    let model = ModelId {
        session: session.clone(),
        seq: request.model_seq_id,
    };
    let key = Idempotency::new(format!("create {model}"), &body);
    let op = Op::CreateModel {
        session,
        model_seq: request.model_seq_id,
        base_model: request.base_model,
        lora,
    };
    let id = submit(
        &state,
        &tenant,
        op,
        None,
        Some(key),
        |output| match output {
            OpOutput::Model(id) => Ok(Answer::Json(
                json!({"type": "create_model", "model_id": id}),
            )),
            other => Err(ApiError::internal(format!("unexpected {other:?}"))),
        },
    )?;
    Ok(future_answer(id, json!({ "model_id": model })))
}

async fn get_info(State(state): State<Shared>, Caller(tenant): Caller, body: Bytes) -> Answered {
    let request: wire::GetInfo = parse(&body)?;
    let op = Op::GetInfo {
        model: request.model_id,
    };
    match state.service.execute(&tenant, op, None).await? {
        OpOutput::Info(info) => Ok(Json(json!({
            "type": "get_info",
            "model_id": info.model_id,
            "model_data": {
                "arch": info.arch,
                "model_name": info.base_model,
                "tokenizer_id": info.tokenizer_dir,
            },
            "is_lora": true,
            "lora_rank": info.lora_rank,
            "model_name": info.base_model,
        }))
        .into_response()),
        other => Err(unexpected(&other)),
    }
}

async fn forward_backward(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    if headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity")
    {
        return Err(ApiError::invalid("forward_backward: compressed bodies are not accepted (the server does not ask for them)").into());
    }
    let request = wire::forward_backward(&body)?;
    let key = seq_key(
        &request.model_id.to_string(),
        request.seq_id,
        &body,
        &headers,
    );
    let op = Op::ForwardBackward {
        model: request.model_id.clone(),
        input: request.input,
        forward_only: request.forward_only,
    };
    let id = submit(
        &state,
        &tenant,
        op,
        request.seq_id,
        key,
        |output| match output {
            OpOutput::ForwardBackward(output) => {
                Ok(Answer::Proto(wire::forward_backward_output(&output)))
            }
            other => Err(ApiError::internal(format!("unexpected {other:?}"))),
        },
    )?;
    Ok(future_answer(id, json!({ "model_id": request.model_id })))
}

async fn optim_step(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    let request: wire::OptimStep = parse(&body)?;
    let key = seq_key(
        &request.model_id.to_string(),
        request.seq_id,
        &body,
        &headers,
    );
    let op = Op::OptimStep {
        model: request.model_id.clone(),
        params: request.adam_params,
    };
    let id = submit(
        &state,
        &tenant,
        op,
        request.seq_id,
        key,
        |output| match output {
            OpOutput::OptimStep(output) => Ok(Answer::Json(json!({"metrics": output.metrics}))),
            other => Err(ApiError::internal(format!("unexpected {other:?}"))),
        },
    )?;
    Ok(future_answer(id, json!({ "model_id": request.model_id })))
}

/// A checkpoint name the client gave, or one made from the op's place in the model's order.
fn checkpoint_name(path: Option<String>, seq: Option<u64>) -> String {
    path.unwrap_or_else(|| format!("seq-{}", seq.unwrap_or(0)))
}

async fn save_weights(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    let request: wire::SaveWeights = parse(&body)?;
    let key = seq_key(
        &request.model_id.to_string(),
        request.seq_id,
        &body,
        &headers,
    );
    let op = Op::SaveState {
        model: request.model_id.clone(),
        name: checkpoint_name(request.path, request.seq_id),
    };
    let id = submit(
        &state,
        &tenant,
        op,
        request.seq_id,
        key,
        |output| match output {
            OpOutput::Checkpoint(path) => {
                Ok(Answer::Json(json!({"type": "save_weights", "path": path})))
            }
            other => Err(ApiError::internal(format!("unexpected {other:?}"))),
        },
    )?;
    Ok(future_answer(id, json!({ "model_id": request.model_id })))
}

async fn save_weights_for_sampler(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    let request: wire::SaveWeightsForSampler = parse(&body)?;
    let key = seq_key(
        &request.model_id.to_string(),
        request.seq_id,
        &body,
        &headers,
    );
    let model = request.model_id.clone();
    let op = match (request.path, request.sampling_session_seq_id) {
        (Some(name), _) => Op::SaveWeightsForSampler { model, name },
        (None, Some(sampler_seq)) => Op::SnapshotForSampler { model, sampler_seq },
        (None, None) => {
            return Err(ApiError::invalid(
                "save_weights_for_sampler needs `path` or `sampling_session_seq_id`",
            )
            .into());
        }
    };
    let id = submit(
        &state,
        &tenant,
        op,
        request.seq_id,
        key,
        |output| match output {
            OpOutput::Checkpoint(path) => Ok(Answer::Json(
                json!({"type": "save_weights_for_sampler", "path": path}),
            )),
            OpOutput::Sampler(id) => Ok(Answer::Json(
                json!({"type": "save_weights_for_sampler", "sampling_session_id": id}),
            )),
            other => Err(ApiError::internal(format!("unexpected {other:?}"))),
        },
    )?;
    Ok(future_answer(id, json!({ "model_id": request.model_id })))
}

async fn load_weights(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    let request: wire::LoadWeights = parse(&body)?;
    let path: CheckpointPath = request.path.parse()?;
    let (op, model, key) = match (request.model_id, request.session_id, request.model_seq_id) {
        (Some(model), None, _) => {
            let key = seq_key(&model.to_string(), request.seq_id, &body, &headers);
            let op = Op::LoadState {
                model: model.clone(),
                path,
                with_optimizer: request.optimizer,
            };
            (op, model, key)
        }
        (None, Some(session), Some(model_seq)) => {
            let session = SessionId::new(&session)?;
            let model = ModelId {
                session: session.clone(),
                seq: model_seq,
            };
            let key = Some(Idempotency::new(format!("create {model}"), &body));
            let op = Op::CreateModelFromState {
                session,
                model_seq,
                path,
                with_optimizer: request.optimizer,
            };
            (op, model, key)
        }
        _ => {
            return Err(ApiError::invalid(
                "load_weights needs `model_id`, or `session_id` with `model_seq_id`",
            )
            .into());
        }
    };
    let seq = match &op {
        Op::LoadState { .. } => request.seq_id,
        _ => None,
    };
    let id = submit(&state, &tenant, op, seq, key, |output| match output {
        OpOutput::Checkpoint(path) => {
            Ok(Answer::Json(json!({"type": "load_weights", "path": path})))
        }
        OpOutput::Model(id) => Ok(Answer::Json(
            json!({"type": "load_weights", "model_id": id}),
        )),
        other => Err(ApiError::internal(format!("unexpected {other:?}"))),
    })?;
    Ok(future_answer(id, json!({ "model_id": model })))
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
    match state.service.execute(&tenant, op, None).await? {
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
    match state.service.execute(&tenant, op, None).await? {
        OpOutput::SamplerInfo(info) => Ok(Json(json!(info)).into_response()),
        other => Err(unexpected(&other)),
    }
}

async fn sample(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Answered {
    let request: wire::Sample = parse(&body)?;
    let unsupported = [
        ("topk_sample_logprobs", request.topk_sample_logprobs > 0),
        ("prompt_alt_tokens_k", request.prompt_alt_tokens_k > 0),
        (
            "target_prompt_logprobs",
            request.target_prompt_logprobs.is_some(),
        ),
        (
            "prompt_logprobs_last_n",
            request.prompt_logprobs_last_n.is_some(),
        ),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, asked)| *asked) {
        return Err(ApiError::invalid(format!("asample: `{name}` is not served")).into());
    }
    let sampler = match (
        &request.sampling_session_id,
        &request.base_model,
        &request.model_path,
    ) {
        (Some(id), _, _) => SamplerId::parse(id)?,
        _ => {
            return Err(ApiError::invalid(
                "asample needs a `sampling_session_id` (create one with create_sampling_session)",
            )
            .into());
        }
    };
    let key = seq_key(sampler.as_str(), request.seq_id, &body, &headers);
    let num_samples = request.num_samples;
    let op = Op::Sample(SampleRequest {
        sampler,
        prompt: ModelInput {
            chunks: request.prompt.chunks,
        },
        num_samples,
        params: request.sampling_params,
        prompt_logprobs: request.prompt_logprobs.unwrap_or(false),
        topk_prompt_logprobs: request.topk_prompt_logprobs,
    });
    let id = submit(&state, &tenant, op, None, key, |output| match output {
        OpOutput::Sample(response) => Ok(Answer::Proto(wire::sample_response(&response))),
        other => Err(ApiError::internal(format!("unexpected {other:?}"))),
    })?;
    let sequence_ids: Vec<String> = (0..num_samples).map(|i| format!("{id}:{i}")).collect();
    Ok(future_answer(
        id,
        json!({ "sample_sequence_ids": sequence_ids }),
    ))
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
            "error": error.message,
            "category": category(error.kind),
            "kind": error.kind,
        }))
        .into_response(),
    })
}
