//! The op API's values as the engines take them, checked, and the engines' answers and errors as
//! the API gives them back; and the training ops of one work item on a base's loop
//! ([`run_forward_backward`], [`run_optim_step`]). The service and the in-process client share
//! these, so a datum, a LoRA config, a sample request or a step means the same whoever sends it.

use std::collections::BTreeMap;

use crate::api::{
    AdamParams, ApiError, ApiErrorKind, Datum, ForwardBackwardInput, ForwardBackwardOutput,
    LoraConfig, LossInput, ModelInput, OptimStepOutput, PromptAltTokens, SampleResponse,
    SampledSequence, SamplingParams, StopReason, TensorData, TensorValues,
};
use crate::model::ModelConfig;
use crate::sample;
use crate::train::{
    self, CompiledLoss, InputTensor, ItemOutput, Loss, StepReport, TrainError, TrainingEngine,
    WorkItem,
};

use super::{SamplerServiceError, TrainerService, TrainerServiceError};

/// The LoRA alpha of adapters whose config gives none (Tinker's).
const LORA_ALPHA: f64 = 32.0;
/// The largest adapter rank the service makes.
const MAX_LORA_RANK: usize = 256;
/// `max_tokens` of a sample request that gives none.
const DEFAULT_MAX_TOKENS: usize = 64;
/// The `loss_fn` of a call that runs a custom loss (its id in `loss_fn_config["loss_id"]`).
pub const CUSTOM_LOSS: &str = "custom";

/// The engine's adapter config of an API LoRA config, checked.
pub fn lora_config(lora: &LoraConfig) -> Result<crate::lora::LoraConfig, ApiError> {
    if lora.rank == 0 || lora.rank > MAX_LORA_RANK {
        return Err(ApiError::invalid(format!(
            "lora_config.rank must be 1 to {MAX_LORA_RANK}, not {}",
            lora.rank
        )));
    }
    if !(lora.train_attn || lora.train_mlp || lora.train_unembed) {
        return Err(ApiError::invalid(
            "lora_config trains nothing: set train_attn, train_mlp or train_unembed",
        ));
    }
    let alpha = lora.alpha.unwrap_or(LORA_ALPHA);
    if !alpha.is_finite() || alpha <= 0.0 {
        return Err(ApiError::invalid(format!(
            "lora_config.alpha must be a finite number above 0, not {alpha}"
        )));
    }
    Ok(crate::lora::LoraConfig {
        rank: lora.rank,
        alpha,
        rslora: lora.rslora,
        train_attention: lora.train_attn,
        train_mlp: lora.train_mlp,
        train_unembed: lora.train_unembed,
        seed: lora.seed.unwrap_or(0),
    })
}

/// The engine's datum of an API datum, checked against the model's vocabulary and context.
/// Under a custom loss, the `loss_fn_inputs` it declares are its (whatever their names), and
/// it may read others of any shape.
pub fn engine_datum(
    index: usize,
    datum: &Datum,
    config: &ModelConfig,
    context: usize,
    custom: Option<&CompiledLoss>,
) -> Result<train::Datum, ApiError> {
    let bad = |problem: String| ApiError::invalid(format!("datum {index}: {problem}"));
    let declared: Vec<&str> = custom
        .map(|c| c.inputs().iter().skip(1).map(|i| i.name.as_str()).collect())
        .unwrap_or_default();
    if let Some(key) = datum
        .loss_fn_inputs
        .keys()
        .find(|k| LossInput::from_name(k).is_none() && !declared.contains(&k.as_str()))
    {
        return Err(bad(format!(
            "unknown loss_fn_inputs key {key:?} (known: {}{})",
            LossInput::ALL.map(LossInput::name).join(", "),
            declared
                .iter()
                .map(|d| format!(", {d}"))
                .collect::<String>()
        )));
    }
    let mut inputs = BTreeMap::new();
    for name in &declared {
        let tensor = datum.loss_fn_inputs.get(*name).ok_or_else(|| {
            bad(format!(
                "loss_fn_inputs has no {name:?}, which the custom loss takes"
            ))
        })?;
        let values = match &tensor.values {
            TensorValues::Float32(values) => values.clone(),
            TensorValues::Int64(values) => values.iter().map(|&v| v as f32).collect(),
        };
        let cells: usize = tensor.shape.iter().product();
        if cells != values.len() {
            return Err(bad(format!(
                "loss_fn_inputs[{name:?}] has {} values for its shape {:?}",
                values.len(),
                tensor.shape
            )));
        }
        let input = InputTensor {
            shape: tensor.shape.clone(),
            values,
        };
        inputs.insert(name.to_string(), input);
    }
    let input_tokens = datum.model_input.tokens();
    let n = input_tokens.len();
    if n == 0 {
        return Err(bad("model_input is empty".into()));
    }
    if n > context {
        return Err(bad(format!(
            "model_input has {n} tokens; the model's context holds {context}"
        )));
    }
    let shaped = |key: &str| {
        let tensor = datum.loss_fn_inputs.get(key)?;
        if tensor.shape != [tensor.len()] || tensor.len() != n {
            return Some(Err(bad(format!(
                "loss_fn_inputs[{key:?}] has shape {:?}; it must be [{n}], one per model_input token",
                tensor.shape
            ))));
        }
        Some(Ok(&tensor.values))
    };
    let targets = match shaped(LossInput::TargetTokens.name()) {
        None => return Err(bad("loss_fn_inputs has no \"target_tokens\"".into())),
        Some(Err(error)) => return Err(error),
        Some(Ok(TensorValues::Int64(targets))) => targets,
        Some(Ok(TensorValues::Float32(_))) => {
            return Err(bad("loss_fn_inputs[\"target_tokens\"] must be int64".into()));
        }
    };
    let target_tokens = targets
        .iter()
        .map(|&t| u32::try_from(t).map_err(|_| bad(format!("target token {t} is negative"))))
        .collect::<Result<Vec<u32>, _>>()?;
    config
        .check_tokens(&target_tokens)
        .map_err(|e| bad(format!("target {e}")))?;
    config
        .check_tokens(&input_tokens)
        .map_err(|e| bad(format!("model_input {e}")))?;
    let floats = |key: &str| match shaped(key) {
        // A custom loss's own input, whatever its shape.
        _ if declared.contains(&key) => Ok(None),
        None => Ok(None),
        Some(Err(error)) => Err(error),
        Some(Ok(TensorValues::Float32(values))) => Ok(Some(values.clone())),
        Some(Ok(TensorValues::Int64(_))) => {
            Err(bad(format!("loss_fn_inputs[{key:?}] must be float32")))
        }
    };
    Ok(train::Datum {
        input_tokens,
        target_tokens,
        mask: floats(LossInput::Mask.name())?.unwrap_or_else(|| vec![1.0; n]),
        weights: floats(LossInput::Weights.name())?,
        advantages: floats(LossInput::Advantages.name())?,
        sampler_logprobs: floats(LossInput::Logprobs.name())?,
        ratio_mask: floats(LossInput::SequenceRatioMask.name())?,
        inputs,
    })
}

/// The built-in loss a `forward` / `forward_backward` call names. `custom` is the caller's to
/// resolve (the service keeps the losses of `create_custom_loss`).
pub fn builtin_loss(input: &ForwardBackwardInput) -> Result<Loss, ApiError> {
    if input.loss_fn == CUSTOM_LOSS {
        return Err(ApiError::invalid(
            "loss \"custom\" runs a loss made by create_custom_loss, which only `opentinker serve` keeps",
        ));
    }
    Loss::from_config(&input.loss_fn, &input.loss_fn_config)
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// The engine's work item for `adapter` of a `forward` / `forward_backward` call under `loss`,
/// every datum checked.
pub fn work_item(
    adapter: &str,
    input: &ForwardBackwardInput,
    loss: Loss,
    config: &ModelConfig,
    context: usize,
) -> Result<WorkItem, ApiError> {
    if input.data.is_empty() {
        return Err(ApiError::invalid(
            "forward_backward needs at least one datum",
        ));
    }
    if !(input.temperature.is_finite() && input.temperature > 0.0) {
        return Err(ApiError::invalid(format!(
            "temperature (loss_fn_config[\"temperature\"]) is {}: it must be a finite number above 0",
            input.temperature
        )));
    }
    let custom = match &loss {
        Loss::Custom(custom) => Some(&**custom),
        _ => None,
    };
    let datums = input
        .data
        .iter()
        .enumerate()
        .map(|(i, d)| engine_datum(i, d, config, context, custom))
        .collect::<Result<Vec<_>, _>>()?;
    // Refused before the call is accepted: a datum the custom loss does not fit.
    if let Some(custom) = custom {
        for (i, datum) in datums.iter().enumerate() {
            custom
                .check_datum(datum.target_tokens.len(), &datum.inputs)
                .map_err(|e| ApiError::invalid(format!("datum {i}: the custom loss: {e}")))?;
        }
    }
    // Every check the engine would make is made above, in the API's words.
    Ok(WorkItem::checked(adapter, datums, loss).at_temperature(input.temperature))
}

/// The answer to a `forward` / `forward_backward` of loss `loss_fn` from the engine's output.
/// The engine adds every metric over the datums; a `:mean` one (a custom loss's) is divided
/// here by their count.
pub fn forward_output(loss_fn: String, mut output: ItemOutput) -> ForwardBackwardOutput {
    let datums = output.logprobs.len().max(1) as f64;
    for (name, value) in output.metrics.iter_mut() {
        if name.ends_with(":mean") {
            *value /= datums;
        }
    }
    ForwardBackwardOutput {
        loss_fn_output_type: loss_fn,
        loss_fn_outputs: output
            .logprobs
            .into_iter()
            .map(|l| BTreeMap::from([("logprobs".to_string(), TensorData::f32(l))]))
            .collect(),
        metrics: output.metrics,
    }
}

/// Refuse AdamW settings that cannot train.
pub fn check_adam(params: &AdamParams) -> Result<(), ApiError> {
    for (name, value) in [
        ("learning_rate", params.learning_rate),
        ("beta1", params.beta1),
        ("beta2", params.beta2),
        ("eps", params.eps),
        ("weight_decay", params.weight_decay),
        ("grad_clip_norm", params.grad_clip_norm),
    ] {
        if !value.is_finite() || value < 0.0 {
            return Err(ApiError::invalid(format!(
                "adam_params.{name} must be a finite number >= 0, not {value}"
            )));
        }
    }
    if params.beta1 >= 1.0 || params.beta2 >= 1.0 {
        return Err(ApiError::invalid(
            "adam_params.beta1 and beta2 must be below 1",
        ));
    }
    Ok(())
}

/// The answer to an `optim_step` from the engine's report, with Tinker's metric keys.
pub fn optim_output(report: StepReport) -> OptimStepOutput {
    let metrics = match report {
        StepReport::Updated {
            step,
            grad_norm,
            update_norm,
            weight_norm,
        } => BTreeMap::from([
            ("grad_norm:mean".to_string(), grad_norm),
            ("update_norm:mean".to_string(), update_norm),
            ("weight_norm:mean".to_string(), weight_norm),
            ("step:max".to_string(), step as f64),
            ("skipped_non_finite:sum".to_string(), 0.0),
        ]),
        StepReport::SkippedNonFinite => {
            BTreeMap::from([("skipped_non_finite:sum".to_string(), 1.0)])
        }
    };
    OptimStepOutput { metrics }
}

/// The engine's request (on the base model; the caller names the adapter) of `num_samples`
/// samples of `prompt`, with what it asks of the prompt and the top-k of each sampled token,
/// checked once against a model of `config` with `context` positions.
pub fn engine_request(
    prompt: &ModelInput,
    num_samples: usize,
    params: &SamplingParams,
    prompt_asks: sample::PromptAsks,
    topk_sample_logprobs: usize,
    config: &ModelConfig,
    context: usize,
) -> Result<sample::SampleRequest, ApiError> {
    crate::api::check_num_samples("num_samples", num_samples)?;
    let top_k = match params.top_k {
        -1 => None,
        k if k >= 1 => Some(k as usize),
        k => {
            return Err(ApiError::invalid(format!(
                "top_k must be -1 (every token) or at least 1, not {k}"
            )));
        }
    };
    let stop = params.stop.clone().map(|stop| match stop {
        crate::api::Stop::String(s) => sample::Stop::Strings(vec![s]),
        crate::api::Stop::Strings(s) => sample::Stop::Strings(s),
        crate::api::Stop::Tokens(t) => sample::Stop::Tokens(t),
    });
    let prompt = prompt.tokens();
    let room = context.saturating_sub(prompt.len()).max(1);
    let engine_params = sample::SamplingParams {
        // No sample runs past the context: a larger `max_tokens` asks for no more than this,
        // and nothing downstream (the KV reservation, the fair queue's cost) sizes from more.
        max_tokens: params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room),
        temperature: params.temperature,
        top_k,
        top_p: params.top_p,
        seed: params.seed,
        stop,
        num_samples,
    };
    let mut request = sample::SampleRequest::new(prompt, engine_params);
    request.prompt_asks = prompt_asks;
    request.topk_sample_logprobs = topk_sample_logprobs;
    request
        .check(config, context)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(request)
}

/// The answer to a sample request from the engine's output.
pub fn sample_response(output: sample::SampleOutput) -> SampleResponse {
    SampleResponse {
        sequences: output
            .samples
            .into_iter()
            .map(|s| SampledSequence {
                stop_reason: match s.stop_reason {
                    sample::StopReason::Stop => StopReason::Stop,
                    sample::StopReason::Length => StopReason::Length,
                },
                tokens: s.tokens,
                logprobs: s.logprobs,
                topk_logprobs: s.top_logprobs,
            })
            .collect(),
        prompt_logprobs: output.prompt.logprobs,
        topk_prompt_logprobs: output.prompt.top,
        target_prompt_logprobs: output.prompt.targets.map(|targets| TensorData {
            shape: vec![targets.logprobs.len() / targets.k.max(1), targets.k],
            values: TensorValues::Float32(targets.logprobs),
        }),
        prompt_alt_tokens: output.prompt.alt.map(|alt| {
            let shape = vec![alt.tokens.len() / alt.k.max(1), alt.k];
            PromptAltTokens {
                tokens: TensorData {
                    shape: shape.clone(),
                    values: TensorValues::Int64(alt.tokens.iter().map(|&t| i64::from(t)).collect()),
                },
                logprobs: TensorData {
                    shape,
                    values: TensorValues::Float32(alt.logprobs),
                },
            }
        }),
        prompt_cache_hit_tokens: output.cached_prompt_tokens,
    }
}

/// The engine's targets of a request's `target_prompt_logprobs`: a 2-D int64 tensor of token
/// ids, `-1` where a cell asks nothing (its shape against the prompt is the engine's to check).
pub fn prompt_targets(tensor: &TensorData) -> Result<sample::PromptTargets, ApiError> {
    let bad = |why: &str| ApiError::invalid(format!("target_prompt_logprobs: {why}"));
    let TensorValues::Int64(ids) = &tensor.values else {
        return Err(bad("must be an int64 tensor of token ids"));
    };
    let &[rows, k] = tensor.shape.as_slice() else {
        return Err(bad("must be 2-D, [len(prompt) - 1, K]"));
    };
    if rows * k != ids.len() {
        return Err(bad(&format!(
            "its shape [{rows}, {k}] does not hold its {} values",
            ids.len()
        )));
    }
    let cells = ids
        .iter()
        .map(|&id| match id {
            -1 => Ok(None),
            id => u32::try_from(id)
                .map(Some)
                .map_err(|_| bad(&format!("{id} is no token id (-1 asks nothing)"))),
        })
        .collect::<Result<_, _>>()?;
    Ok(sample::PromptTargets { k, cells })
}

pub fn train_error(error: TrainError) -> ApiError {
    match error {
        TrainError::BadDatum { .. }
        | TrainError::CustomLoss { .. }
        | TrainError::Objective { .. } => ApiError::invalid(error.to_string()),
        TrainError::Checkpoint(train::checkpoint::CheckpointError::Invalid { .. }) => {
            ApiError::invalid(error.to_string())
        }
        TrainError::DeviceBudget { .. } => {
            ApiError::new(ApiErrorKind::QuotaExceeded, error.to_string())
        }
        _ => ApiError::internal(error.to_string()),
    }
}

pub fn trainer_error(error: TrainerServiceError) -> ApiError {
    match error {
        TrainerServiceError::Stopped => ApiError::internal(error.to_string()),
        TrainerServiceError::Train(error) => train_error(error),
    }
}

pub fn sampler_error(error: SamplerServiceError) -> ApiError {
    match &error {
        _ if error.is_refusal() => ApiError::invalid(error.to_string()),
        SamplerServiceError::Stopped => ApiError::new(ApiErrorKind::Unavailable, error.to_string()),
        _ => ApiError::internal(error.to_string()),
    }
}

/// A `forward` (`forward_only`) or a `forward_backward` of `item` for `tenant` on `trainer`, fused
/// with the other calls of its cycle, answered as the API's output for `loss_fn`. After a
/// `forward_backward`, `then` (if any) runs on the engine in the same cycle (so that what it
/// reads is this call's result); its answer is `None` after a `forward`, without a `then`, or
/// when the call failed.
pub async fn run_forward_backward<T: Send + 'static>(
    trainer: &TrainerService,
    tenant: &str,
    item: WorkItem,
    loss_fn: String,
    forward_only: bool,
    then: Option<impl FnOnce(&mut TrainingEngine) -> T + Send + 'static>,
) -> Result<(ForwardBackwardOutput, Option<T>), ApiError> {
    let (mut outputs, after) = match then {
        _ if forward_only => {
            let outputs = trainer
                .with(move |e| e.forward(&[item]))
                .await
                .map_err(trainer_error)?
                .map_err(train_error)?;
            (outputs, None)
        }
        Some(then) => trainer
            .forward_backward_then(tenant, vec![item], then)
            .await
            .map_err(trainer_error)?,
        None => {
            let outputs = trainer
                .forward_backward_for(tenant, vec![item])
                .await
                .map_err(trainer_error)?;
            (outputs, None)
        }
    };
    let output = outputs
        .pop()
        .ok_or_else(|| ApiError::internal("the engine returned no output"))?;
    Ok((forward_output(loss_fn, output), after))
}

/// An `optim_step` of `adapter` on `trainer` (its settings checked first), then `then` on the
/// engine in the same exclusive call, answered with Tinker's metrics.
pub async fn run_optim_step<T: Send + 'static>(
    trainer: &TrainerService,
    adapter: &str,
    params: AdamParams,
    then: impl FnOnce(&mut TrainingEngine, &str) -> Result<T, ApiError> + Send + 'static,
) -> Result<(OptimStepOutput, T), ApiError> {
    check_adam(&params)?;
    let adapter = adapter.to_string();
    let (report, after) = trainer
        .with(move |e| {
            let report = e.optim_step(&adapter, &params).map_err(train_error)?;
            Ok::<_, ApiError>((report, then(e, &adapter)?))
        })
        .await
        .map_err(trainer_error)??;
    Ok((optim_output(report), after))
}
