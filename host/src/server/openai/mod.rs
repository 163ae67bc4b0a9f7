//! OpenAI-compatible sampling, under `/v1`: `models`, `completions` and `chat/completions` (with
//! `stream`, `n`, `max_tokens`, `temperature`, `top_p`, `stop`, `seed`, `logprobs` with up to
//! [`MAX_TOP_LOGPROBS`] alternatives per token (chat's `top_logprobs`)), so that
//! every chat tool and the official `openai` client can sample what a tenant trained. As vLLM
//! serves LoRA adapters by name, `model` is a base model's name, one of the tenant's
//! `tinker://` paths (`save_weights_for_sampler` or `save_state`), or a job of the tenant's
//! (`job-ID`: its final adapter; `job-ID/step-10/policy`: a folder of its checkpoints); another
//! tenant's path or job answers 404 as an unknown one does. Requests run on the same sampler and fair queue as the Tinker
//! API's; a chat is rendered with the base model's chat template. A field these routes do not
//! serve is refused by name, and every refusal comes in OpenAI's error shape, whose message
//! OpenAI's clients show.
//!
//! A streamed answer is sent as server-sent events in the OpenAI chunk format, a chunk as each
//! token is sampled (the sampler tells a `TokenSink`), its text decoded from the tokens so far
//! (a token that ends inside a UTF-8 character waits for the next).

mod samplers;

pub use samplers::Samplers;

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::futures::Place;
use super::handling::{Caller, direct, off_the_workers};
use super::{AppState, HttpError};
use crate::api::{
    ApiError, ApiErrorKind, JobId, ModelInput, Op, OpOutput, SampleRequest, SampleResponse,
    SampledSequence, SamplerSource, SamplingParams, Stop, StopReason, TenantId, check_num_samples,
};
use crate::sample::TokenSink;
use crate::service::{Checked, ServedBase};
use crate::text::ChatMessage;
use samplers::Resolved;

type Shared = Arc<AppState>;

/// The most alternatives per token `logprobs` answers, as OpenAI's chat endpoint allows.
const MAX_TOP_LOGPROBS: usize = 20;

/// The routes, nested under `/v1`.
pub fn router() -> Router<Shared> {
    Router::new()
        .route("/models", get(models))
        .route("/completions", post(completions))
        .route("/chat/completions", post(chat_completions))
        .layer(axum::middleware::map_response(openai_errors))
}

/// Give every error answer of these routes OpenAI's error shape,
/// `{"error": {"message", "type", "param", "code"}}`, which OpenAI's clients read the message
/// from (they show only the status of any other shape): the server's own refusals (key checks
/// included) and axum's (an oversized body). The error's kind stays on the answer for the
/// access log.
async fn openai_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let kind = response.extensions().get::<ApiErrorKind>().copied();
    let bytes = axum::body::to_bytes(response.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    let message = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(body)) => match body.get("error") {
            Some(Value::String(message)) => message.clone(),
            Some(other) => other.to_string(),
            None => Value::Object(body).to_string(),
        },
        _ => String::from_utf8_lossy(&bytes).trim().to_string(),
    };
    let message = match message.is_empty() {
        true => status.canonical_reason().unwrap_or("error").to_string(),
        false => message,
    };
    let kind_name = match kind {
        Some(ApiErrorKind::Unauthorized) => "authentication_error",
        Some(ApiErrorKind::NotFound | ApiErrorKind::Gone) => "not_found_error",
        Some(ApiErrorKind::TooManyRequests) => "rate_limit_error",
        Some(ApiErrorKind::QuotaExceeded) => "insufficient_quota",
        Some(ApiErrorKind::Unavailable | ApiErrorKind::Internal) => "server_error",
        _ if status.is_server_error() => "server_error",
        _ => "invalid_request_error",
    };
    let body = json!({
        "error": { "message": message, "type": kind_name, "param": null, "code": null }
    });
    let mut answer = (status, Json(body)).into_response();
    if let Some(kind) = kind {
        answer.extensions_mut().insert(kind);
    }
    answer
}

/// The sampler of `model` for `tenant`: the one made before, or one made now (in the
/// tenant's session for these routes, itself made on first use).
async fn resolve(state: &Shared, tenant: &TenantId, model: &str) -> Result<Resolved, ApiError> {
    let samplers = &state.openai;
    // The tenant's session finished (idle too long): its samplers went with it.
    if let Some(session) = samplers.session(tenant)
        && state.service.heartbeat(tenant, &session).is_err()
    {
        samplers.forget_tenant(tenant);
    }
    if let Some(known) = samplers.get(tenant, model) {
        return Ok(known);
    }
    let session = match samplers.session(tenant) {
        Some(session) => session,
        None => match direct(state, tenant, Op::CreateSession).await? {
            OpOutput::Session(session) => {
                samplers.set_session(tenant, session.clone());
                session
            }
            other => return Err(unexpected(&other)),
        },
    };
    let sampler_seq = samplers.next_seq();
    let sampler = if model.starts_with("job-") {
        let (job, which) = model.split_once('/').unwrap_or((model, ""));
        let dir = state
            .jobs
            .adapter_folder(tenant, &JobId::parse(job)?, which)
            .await?;
        state
            .service
            .open_adapter_folder(tenant, &session, sampler_seq, dir, model)
            .await?
    } else {
        let source = match model.starts_with("tinker://") {
            true => SamplerSource::Checkpoint(model.parse()?),
            false => SamplerSource::Base(model.to_string()),
        };
        let op = Op::CreateSamplingSession {
            session,
            sampler_seq,
            source,
        };
        match direct(state, tenant, op).await? {
            OpOutput::Sampler(id) => id,
            other => return Err(unexpected(&other)),
        }
    };
    let info = match direct(
        state,
        tenant,
        Op::GetSampler {
            sampler: sampler.clone(),
        },
    )
    .await?
    {
        OpOutput::SamplerInfo(info) => info,
        other => return Err(unexpected(&other)),
    };
    let base = state
        .service
        .served_base(&info.base_model)
        .ok_or_else(|| ApiError::internal(format!("no base {}", info.base_model)))?;
    let resolved = Resolved { sampler, base };
    samplers.insert(tenant, model, resolved.clone());
    Ok(resolved)
}

fn unexpected(output: &OpOutput) -> ApiError {
    ApiError::internal(format!("unexpected op output {output:?}"))
}

/// The served bases, then the tenant's jobs that succeeded (each served by its final adapter).
async fn models(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<Value>, HttpError> {
    let jobs = state.jobs.list(&tenant).await?;
    let mut data: Vec<Value> = state
        .service
        .capabilities()
        .into_iter()
        .map(|m| {
            json!({
                "id": m.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "opentinker",
                "max_model_len": m.max_context_length,
            })
        })
        .collect();
    data.extend(
        jobs.iter()
            .filter(|job| job.state == crate::jobs::JobState::Succeeded)
            .map(|job| {
                json!({
                    "id": job.id,
                    "object": "model",
                    "created": job.updated_at,
                    "owned_by": tenant,
                })
            }),
    );
    Ok(Json(json!({ "object": "list", "data": data })))
}

/// `stop`: one string or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum StopText {
    One(String),
    Many(Vec<String>),
}

/// What both endpoints take besides their prompt. Any other field OpenAI defines (`tools`,
/// `response_format`, penalties, ...) is refused by name ([`parse_strict`]): a client that asks
/// for it would otherwise get an answer that silently lacks it.
#[derive(Deserialize)]
struct Common {
    model: String,
    max_tokens: Option<usize>,
    /// The chat endpoint's newer name for `max_tokens`.
    max_completion_tokens: Option<usize>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    n: Option<usize>,
    stop: Option<StopText>,
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
}

impl Common {
    fn params(&self, default_max_tokens: Option<usize>) -> Result<SamplingParams, ApiError> {
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(format!(
                "temperature {temperature} is not between 0 and 2"
            )));
        }
        Ok(SamplingParams {
            max_tokens: self
                .max_completion_tokens
                .or(self.max_tokens)
                .or(default_max_tokens),
            seed: self.seed,
            stop: match &self.stop {
                None => None,
                Some(StopText::One(text)) => Some(Stop::Strings(vec![text.clone()])),
                Some(StopText::Many(texts)) => Some(Stop::Strings(texts.clone())),
            },
            temperature,
            top_k: -1,
            top_p: self.top_p.unwrap_or(1.0),
        })
    }
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(flatten)]
    common: Common,
    prompt: PromptText,
    /// Return this many top logprobs per token (0: the sampled token's only); absent: none.
    logprobs: Option<usize>,
}

impl CompletionRequest {
    /// Whether logprobs are asked for, and how many alternatives per token.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            Some(top) => Ok(Some(check_logprobs(&self.common, "logprobs", top)?)),
            None => Ok(None),
        }
    }
}

/// `top` alternatives per token (asked for by `field`), or a refusal that names what is not
/// served: more than [`MAX_TOP_LOGPROBS`], or logprobs of a stream (whose chunks carry text
/// only).
fn check_logprobs(common: &Common, field: &str, top: usize) -> Result<usize, ApiError> {
    if common.stream {
        return Err(ApiError::invalid("`logprobs` is not served with `stream`"));
    }
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(format!(
            "`{field}` is {top}; at most {MAX_TOP_LOGPROBS} alternatives per token are served"
        )));
    }
    Ok(top)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptText {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    common: Common,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    logprobs: bool,
    /// Alternatives per token with `logprobs`.
    top_logprobs: Option<usize>,
}

impl ChatRequest {
    /// Whether logprobs are asked for, and how many alternatives per token.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ApiError::invalid(
                "`top_logprobs` needs `logprobs` set to true",
            )),
            (true, top) => Ok(Some(check_logprobs(
                &self.common,
                "top_logprobs",
                top.unwrap_or(0),
            )?)),
        }
    }
}

/// The fields of [`Common`], and `user` (an end user's id for the operator's records: it changes
/// nothing in the answer, so it is accepted and not kept).
const COMMON_FIELDS: [&str; 10] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "user",
];

/// A JSON body of an endpoint whose own fields are `own` besides [`COMMON_FIELDS`], or a 400
/// naming what is wrong with it: a field the endpoint does not serve is named (one sent as
/// `null` is taken as absent).
fn parse_strict<T: serde::de::DeserializeOwned>(body: &Bytes, own: &[&str]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("request body: {e}")))?;
    if let Value::Object(fields) = &value {
        let served = |name: &str| COMMON_FIELDS.contains(&name) || own.contains(&name);
        if let Some((name, _)) = fields
            .iter()
            .find(|(name, value)| !value.is_null() && !served(name))
        {
            let mut all: Vec<&str> = COMMON_FIELDS.iter().chain(own).copied().collect();
            all.sort_unstable();
            return Err(ApiError::invalid(format!(
                "`{name}` is not served by this server (served: {})",
                all.join(", ")
            )));
        }
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("request body: {e}")))
}

/// A request's prompt as the tokens of a base.
type Prompt = Arc<dyn Fn(&ServedBase) -> Result<Vec<u32>, ApiError> + Send + Sync>;

/// What one request samples: its model, tokenized prompt, number of choices, parameters and
/// alternatives per token.
struct Sampling<'a> {
    model: &'a str,
    /// Tokenizes (and renders) the prompt for a base: run off the async workers.
    prompt: Prompt,
    n: usize,
    params: SamplingParams,
    top_logprobs: usize,
}

/// The sample request of `sampling` (its prompt tokenized for the base of its model) for
/// `tenant`: its base and the prompt's length too.
async fn prepare(
    state: &Shared,
    tenant: &TenantId,
    sampling: &Sampling<'_>,
) -> Result<(Arc<ServedBase>, usize, SampleRequest), ApiError> {
    let Sampling {
        model,
        ref prompt,
        n,
        ref params,
        top_logprobs,
    } = *sampling;
    check_num_samples("n", n)?;
    let resolved = resolve(state, tenant, model).await?;
    let (prompt, base) = (Arc::clone(prompt), Arc::clone(&resolved.base));
    let tokens = off_the_workers(move || prompt(&base)).await?;
    let prompt_tokens = tokens.len();
    let request = SampleRequest {
        sampler: resolved.sampler.clone(),
        prompt: ModelInput::from_tokens(tokens),
        num_samples: n,
        params: params.clone(),
        prompt_logprobs: false,
        topk_prompt_logprobs: 0,
        topk_sample_logprobs: top_logprobs,
        prompt_logprobs_last_n: None,
        target_prompt_logprobs: None,
        prompt_alt_tokens_k: 0,
        record_as: None,
    };
    Ok((resolved.base, prompt_tokens, request))
}

/// Sample `sampling` for `tenant` (a sampler evicted since it was resolved is made again,
/// once).
async fn sample(
    state: &Shared,
    tenant: &TenantId,
    sampling: &Sampling<'_>,
) -> Result<(Arc<ServedBase>, usize, SampleResponse), ApiError> {
    let model = sampling.model;
    for attempt in 0..2 {
        let (base, prompt_tokens, request) = prepare(state, tenant, sampling).await?;
        match state
            .service
            .execute(tenant, Op::Sample(request), None, Checked::default())
            .await
            .outcome
        {
            Ok(OpOutput::Sample(response)) => return Ok((base, prompt_tokens, response)),
            Ok(other) => return Err(unexpected(&other)),
            Err(error) if error.kind == ApiErrorKind::NotFound && attempt == 0 => {
                state.openai.forget(tenant, model);
            }
            Err(error) => return Err(error),
        }
    }
    Err(ApiError::internal("the sampler vanished twice"))
}

fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
    }
}

/// The text of sampled tokens as the client sees it: without special tokens (the end of turn
/// that stopped a chat answer), so each token's text (a special token's is empty) joins into
/// the completion's.
fn decode(base: &ServedBase, tokens: &[u32]) -> Result<String, ApiError> {
    base.tokenizer
        .decode_text(tokens)
        .map_err(|e| ApiError::internal(format!("decoding the completion: {e}")))
}

/// A fresh id with `prefix`, and the time in seconds.
fn id_and_time(prefix: &str) -> Result<(String, u64), ApiError> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok((format!("{prefix}-{}", hex::encode(bytes)), created))
}

fn usage(prompt_tokens: usize, response: &SampleResponse) -> Value {
    let completion: usize = response.sequences.iter().map(|s| s.tokens.len()).sum();
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    })
}

/// Each token's text, one by one.
fn token_texts(base: &ServedBase, tokens: &[u32]) -> Result<Vec<String>, ApiError> {
    tokens.iter().map(|&t| decode(base, &[t])).collect()
}

/// Per sampled token, its alternatives as `(text, logprob)`, most likely first (none when
/// none were asked for).
fn alternatives(
    base: &ServedBase,
    sequence: &SampledSequence,
) -> Result<Vec<Vec<(String, f32)>>, ApiError> {
    let Some(rows) = &sequence.topk_logprobs else {
        return Ok(vec![Vec::new(); sequence.tokens.len()]);
    };
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|&(token, logprob)| Ok((decode(base, &[token])?, logprob)))
                .collect()
        })
        .collect()
}

/// What the streaming task hands the event stream.
enum Streamed {
    Token { sample: usize, token: u32 },
    Done(Box<Result<SampleResponse, ApiError>>),
}

/// How one endpoint words a chunk: the choice, the new text, and the finish reason once known.
type ChunkOf = Box<dyn Fn(usize, &str, Option<&str>) -> Value + Send>;

/// Sample `request` for `tenant`, answering server-sent events: a chunk of new text per token
/// (as `chunk` words it), a last chunk per choice with its finish reason, then `[DONE]`.
fn stream(
    state: Shared,
    tenant: TenantId,
    place: Place,
    base: Arc<ServedBase>,
    request: SampleRequest,
    chunk: ChunkOf,
) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    let tokens = {
        let sender = sender.clone();
        TokenSink::new(move |sample, token, _| {
            // The answer's reader may have gone: the sample still finishes.
            let _ = sender.send(Streamed::Token { sample, token });
        })
    };
    tokio::spawn(async move {
        let sampled = state.service.sample_streaming(&tenant, request, tokens);
        tokio::select! {
            result = sampled => {
                let _ = sender.send(Streamed::Done(Box::new(result)));
            }
            // The client has gone: dropping the sample cancels it in the sampler, which frees
            // its slots and KV.
            () = sender.closed() => {}
        }
        drop(place);
    });
    struct Reading {
        receiver: tokio::sync::mpsc::UnboundedReceiver<Streamed>,
        base: Arc<ServedBase>,
        chunk: ChunkOf,
        /// Per choice: its tokens so far, and how much of their text was sent.
        choices: Vec<(Vec<u32>, usize)>,
        ended: bool,
    }
    let reading = Reading {
        receiver,
        base,
        chunk,
        choices: Vec::new(),
        ended: false,
    };
    let events = futures::stream::unfold(reading, |mut r| async move {
        if r.ended {
            return None;
        }
        let mut out = Vec::new();
        match r.receiver.recv().await {
            Some(Streamed::Token { sample, token }) => {
                if r.choices.len() <= sample {
                    r.choices.resize_with(sample + 1, Default::default);
                }
                let (tokens, sent) = &mut r.choices[sample];
                tokens.push(token);
                if let Ok(text) = r.base.tokenizer.decode_text(tokens)
                    && !text.ends_with('\u{FFFD}')
                    && text.len() > *sent
                    && text.is_char_boundary(*sent)
                {
                    out.push((r.chunk)(sample, &text[*sent..], None));
                    *sent = text.len();
                }
            }
            Some(Streamed::Done(done)) => match *done {
                Ok(response) => {
                    for (index, sequence) in response.sequences.iter().enumerate() {
                        let rest = match (decode(&r.base, &sequence.tokens), r.choices.get(index)) {
                            (Ok(text), Some((_, sent))) if text.is_char_boundary(*sent) => {
                                text[*sent..].to_string()
                            }
                            (Ok(text), None) => text,
                            _ => String::new(),
                        };
                        out.push((r.chunk)(
                            index,
                            &rest,
                            Some(finish_reason(sequence.stop_reason)),
                        ));
                    }
                    r.ended = true;
                }
                Err(error) => {
                    out.push(
                        json!({ "error": { "message": error.message, "type": "server_error" } }),
                    );
                    r.ended = true;
                }
            },
            None => r.ended = true,
        }
        let mut events: Vec<Event> = out
            .into_iter()
            .map(|v| Event::default().data(v.to_string()))
            .collect();
        if r.ended {
            events.push(Event::default().data("[DONE]"));
        }
        Some((
            futures::stream::iter(events.into_iter().map(Ok::<_, std::convert::Infallible>)),
            r,
        ))
    });
    Sse::new(futures::StreamExt::flatten(events)).into_response()
}

async fn completions(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Result<Response, HttpError> {
    let request: CompletionRequest =
        off_the_workers(move || parse_strict(&body, &["prompt", "logprobs"])).await?;
    let logprobs = request.logprobs()?;
    // Counted against the tenant's queue as its Tinker requests are, until it is answered.
    let place = state.futures.admit(&tenant)?;
    let CompletionRequest { common, prompt, .. } = request;
    let text = match prompt {
        PromptText::One(text) => text,
        PromptText::Many(mut texts) if texts.len() == 1 => texts.remove(0),
        PromptText::Many(_) => {
            return Err(ApiError::invalid("prompt: one prompt per request is served").into());
        }
    };
    let text_len = text.len();
    let encode: Prompt = Arc::new(move |base: &ServedBase| {
        base.tokenizer
            .encode(&text)
            .map_err(|e| ApiError::invalid(format!("prompt: {e}")))
    });
    let common = &common;
    let sampling = Sampling {
        model: &common.model,
        prompt: encode,
        n: common.n.unwrap_or(1),
        params: common.params(Some(16))?,
        top_logprobs: logprobs.unwrap_or(0),
    };
    let (id, created) = id_and_time("cmpl")?;
    if common.stream {
        let (base, _, sample_request) = prepare(&state, &tenant, &sampling).await?;
        let model = common.model.clone();
        let chunk: ChunkOf = Box::new(move |index, text, finish| {
            json!({
                "id": id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{ "index": index, "text": text, "logprobs": Value::Null, "finish_reason": finish }],
            })
        });
        return Ok(stream(state, tenant, place, base, sample_request, chunk));
    }
    let (base, prompt_tokens, response) = sample(&state, &tenant, &sampling).await?;
    drop(place);
    let mut choices = Vec::new();
    for (index, sequence) in response.sequences.iter().enumerate() {
        let logprobs = match logprobs {
            None => Value::Null,
            Some(top) => {
                let texts = token_texts(&base, &sequence.tokens)?;
                // The legacy shape: per token, an object of alternative texts to logprobs.
                let top_logprobs = match top {
                    0 => Value::Null,
                    _ => alternatives(&base, sequence)?
                        .into_iter()
                        .map(|row| {
                            // Two tokens of one text: the more likely (first) one's logprob.
                            let mut texts = serde_json::Map::new();
                            for (text, logprob) in row {
                                texts.entry(text).or_insert(json!(logprob));
                            }
                            Value::Object(texts)
                        })
                        .collect(),
                };
                let offsets: Vec<usize> = texts
                    .iter()
                    .scan(text_len, |at, t| {
                        let start = *at;
                        *at += t.len();
                        Some(start)
                    })
                    .collect();
                json!({
                    "tokens": texts,
                    "token_logprobs": sequence.logprobs,
                    "top_logprobs": top_logprobs,
                    "text_offset": offsets,
                })
            }
        };
        choices.push(json!({
            "index": index,
            "text": decode(&base, &sequence.tokens)?,
            "logprobs": logprobs,
            "finish_reason": finish_reason(sequence.stop_reason),
        }));
    }
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": common.model,
        "choices": choices,
        "usage": usage(prompt_tokens, &response),
    }))
    .into_response())
}

async fn chat_completions(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Result<Response, HttpError> {
    let request: ChatRequest =
        off_the_workers(move || parse_strict(&body, &["messages", "logprobs", "top_logprobs"]))
            .await?;
    let logprobs = request.logprobs()?;
    let place = state.futures.admit(&tenant)?;
    let ChatRequest {
        common, messages, ..
    } = request;
    let render: Prompt = Arc::new(move |base: &ServedBase| {
        let template = base
            .chat_template
            .as_ref()
            .ok_or_else(|| ApiError::invalid(format!("{} has no chat template", base.name)))?;
        let text = template
            .render(&messages, true)
            .map_err(|e| ApiError::invalid(format!("messages: {e}")))?;
        base.tokenizer
            .encode_without_special_tokens(&text)
            .map_err(|e| ApiError::invalid(format!("messages: {e}")))
    });
    let common = &common;
    let sampling = Sampling {
        model: &common.model,
        prompt: render,
        n: common.n.unwrap_or(1),
        params: common.params(None)?,
        top_logprobs: logprobs.unwrap_or(0),
    };
    let (id, created) = id_and_time("chatcmpl")?;
    if common.stream {
        let (base, _, sample_request) = prepare(&state, &tenant, &sampling).await?;
        let model = common.model.clone();
        // The first chunk of each choice carries the role, as OpenAI's do.
        let started = Mutex::new(std::collections::HashSet::new());
        let chunk: ChunkOf = Box::new(move |index, text, finish| {
            let first = started
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(index);
            let delta = match (first, text.is_empty() && finish.is_some()) {
                (true, _) => json!({ "role": "assistant", "content": text }),
                (false, true) => json!({}),
                (false, false) => json!({ "content": text }),
            };
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{ "index": index, "delta": delta, "logprobs": Value::Null, "finish_reason": finish }],
            })
        });
        return Ok(stream(state, tenant, place, base, sample_request, chunk));
    }
    let (base, prompt_tokens, response) = sample(&state, &tenant, &sampling).await?;
    drop(place);
    let mut choices = Vec::new();
    for (index, sequence) in response.sequences.iter().enumerate() {
        let content = decode(&base, &sequence.tokens)?;
        let logprobs = match logprobs {
            None => Value::Null,
            Some(_) => {
                let texts = token_texts(&base, &sequence.tokens)?;
                let entry = |token: &str, logprob: f32| json!({ "token": token, "logprob": logprob, "bytes": token.as_bytes() });
                let content: Vec<Value> = texts
                    .iter()
                    .zip(&sequence.logprobs)
                    .zip(alternatives(&base, sequence)?)
                    .map(|((token, &logprob), top)| {
                        let mut value = entry(token, logprob);
                        value["top_logprobs"] = top.iter().map(|(t, l)| entry(t, *l)).collect();
                        value
                    })
                    .collect();
                json!({ "content": content })
            }
        };
        choices.push(json!({
            "index": index,
            "message": { "role": "assistant", "content": content },
            "logprobs": logprobs,
            "finish_reason": finish_reason(sequence.stop_reason),
        }));
    }
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": common.model,
        "choices": choices,
        "usage": usage(prompt_tokens, &response),
    }))
    .into_response())
}
