//! The Tinker data model, and the ops of the service with their outputs. Field names and
//! defaults are Tinker's, so the JSON forms match the SDK's where the wire uses JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::custom_loss::{CustomLossInput, LossGraph};
use super::ids::{CheckpointPath, LossId, ModelId, SamplerId, SequenceId, SessionId};

/// A model's input: chunks of tokens (Tinker's other chunk kinds, images, are not served).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelInput {
    pub chunks: Vec<Chunk>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Chunk {
    EncodedText { tokens: Vec<u32> },
}

impl ModelInput {
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        ModelInput {
            chunks: vec![Chunk::EncodedText { tokens }],
        }
    }

    /// Every chunk's tokens, in order.
    pub fn tokens(&self) -> Vec<u32> {
        let mut all = Vec::new();
        for Chunk::EncodedText { tokens } in &self.chunks {
            all.extend_from_slice(tokens);
        }
        all
    }

    /// How many tokens the chunks hold.
    pub fn len(&self) -> usize {
        self.chunks
            .iter()
            .map(|Chunk::EncodedText { tokens }| tokens.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dense tensor of one of the two dtypes the losses take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorData {
    pub values: TensorValues,
    pub shape: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorValues {
    Float32(Vec<f32>),
    Int64(Vec<i64>),
}

impl TensorData {
    /// A one-dimensional float tensor.
    pub fn f32(values: Vec<f32>) -> Self {
        TensorData {
            shape: vec![values.len()],
            values: TensorValues::Float32(values),
        }
    }

    /// A one-dimensional integer tensor.
    pub fn i64(values: Vec<i64>) -> Self {
        TensorData {
            shape: vec![values.len()],
            values: TensorValues::Int64(values),
        }
    }

    pub fn len(&self) -> usize {
        match &self.values {
            TensorValues::Float32(v) => v.len(),
            TensorValues::Int64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One training example, pre-shifted: `loss_fn_inputs["target_tokens"][i]` follows
/// `model_input[..=i]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Datum {
    pub model_input: ModelInput,
    pub loss_fn_inputs: BTreeMap<String, TensorData>,
    /// Where each target token came from: consecutive runs tiling `target_tokens` (the SDK's
    /// `loss_fn_input_spans`). `stable_reinforce` needs it; other losses ignore it.
    #[serde(default)]
    pub loss_fn_input_spans: Option<Vec<ProvenanceSpan>>,
}

impl Datum {
    /// A datum of `input_tokens` whose `target_tokens` follow them one for one; the other loss
    /// inputs come with [`Datum::with`].
    pub fn new(input_tokens: Vec<u32>, target_tokens: &[u32]) -> Self {
        let targets = target_tokens.iter().map(|&t| i64::from(t)).collect();
        Datum {
            model_input: ModelInput::from_tokens(input_tokens),
            loss_fn_inputs: BTreeMap::from([(
                LossInput::TargetTokens.name().to_string(),
                TensorData::i64(targets),
            )]),
            loss_fn_input_spans: None,
        }
    }

    /// The datum with the loss input `input` set to `values`, one per target token.
    pub fn with(mut self, input: LossInput, values: Vec<f32>) -> Self {
        self.loss_fn_inputs
            .insert(input.name().to_string(), TensorData::f32(values));
        self
    }

    /// The float values of the loss input `input`, if the datum has them.
    pub fn floats(&self, input: LossInput) -> Option<&[f32]> {
        match &self.loss_fn_inputs.get(input.name())?.values {
            TensorValues::Float32(values) => Some(values),
            TensorValues::Int64(_) => None,
        }
    }

    /// The same, to change in place.
    pub fn floats_mut(&mut self, input: LossInput) -> Option<&mut Vec<f32>> {
        match &mut self.loss_fn_inputs.get_mut(input.name())?.values {
            TensorValues::Float32(values) => Some(values),
            TensorValues::Int64(_) => None,
        }
    }

    /// The target tokens, if the datum has them as integers.
    pub fn target_tokens(&self) -> Option<&[i64]> {
        match &self
            .loss_fn_inputs
            .get(LossInput::TargetTokens.name())?
            .values
        {
            TensorValues::Int64(values) => Some(values),
            TensorValues::Float32(_) => None,
        }
    }
}

/// The loss inputs a datum carries by name that the engine reads itself (a custom loss may
/// declare more of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossInput {
    /// The token each position predicts (int64).
    TargetTokens,
    /// 1 where a target counts, 0 for context (an opentinker extension; absent: all count).
    Mask,
    /// Per target, the weight of its cross-entropy.
    Weights,
    /// Per target, the advantage the policy-gradient losses weight it by.
    Advantages,
    /// Per target, the sampler's logprob of it.
    Logprobs,
    /// Per target, 0 to leave it out of a sequence-level importance ratio (`gspo`).
    SequenceRatioMask,
}

impl LossInput {
    pub const ALL: [LossInput; 6] = [
        LossInput::TargetTokens,
        LossInput::Weights,
        LossInput::Advantages,
        LossInput::Logprobs,
        LossInput::SequenceRatioMask,
        LossInput::Mask,
    ];

    /// The input of this name, if it is one the engine reads.
    pub fn from_name(name: &str) -> Option<LossInput> {
        LossInput::ALL
            .into_iter()
            .find(|input| input.name() == name)
    }

    /// The name in `loss_fn_inputs`, Tinker's.
    pub fn name(self) -> &'static str {
        match self {
            LossInput::TargetTokens => "target_tokens",
            LossInput::Mask => "mask",
            LossInput::Weights => "weights",
            LossInput::Advantages => "advantages",
            LossInput::Logprobs => "logprobs",
            LossInput::SequenceRatioMask => "sequence_ratio_mask",
        }
    }
}

/// A run of a datum's tokens and the sampled sequence it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProvenanceSpan {
    pub source: SpanSource,
    pub sequence: SequenceId,
    /// The run's first position in the sequence's prompt or sampled tokens.
    pub offset: usize,
    pub length: usize,
}

/// Which tokens of the named sequence a [`ProvenanceSpan`] covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanSource {
    /// The sampling request's prompt.
    Prompt,
    /// The tokens that were sampled.
    Sampled,
}

/// A new adapter's shape. Tinker trains attention, MLP and unembedding by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub rank: usize,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default = "yes")]
    pub train_unembed: bool,
    #[serde(default = "yes")]
    pub train_mlp: bool,
    #[serde(default = "yes")]
    pub train_attn: bool,
    /// The LoRA scale's numerator; absent: Tinker's 32. (An opentinker extension.)
    #[serde(default)]
    pub alpha: Option<f64>,
    /// rsLoRA: scale by `alpha / sqrt(rank)` instead of `alpha / rank`. (An opentinker
    /// extension.)
    #[serde(default)]
    pub rslora: bool,
}

fn yes() -> bool {
    true
}

/// AdamW settings of one `optim_step`, with Tinker's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamParams {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the gradient to this global L2 norm; 0: no clipping.
    pub grad_clip_norm: f64,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            learning_rate: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-12,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

/// When a sample stops before `max_tokens`: absent, at the model's end-of-sequence ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    String(String),
    Strings(Vec<String>),
    /// Stop at one of these ids; empty: never stop early, not even at end-of-sequence.
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub max_tokens: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub temperature: f64,
    /// -1 keeps every token.
    pub top_k: i64,
    pub top_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: None,
            seed: None,
            stop: None,
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SampleRequest {
    pub sampler: SamplerId,
    pub prompt: ModelInput,
    pub num_samples: usize,
    pub params: SamplingParams,
    /// The logprob of every prompt token given the ones before it.
    pub prompt_logprobs: bool,
    /// The `k` most likely tokens at every prompt position; 0: none.
    pub topk_prompt_logprobs: usize,
    /// The `k` most likely tokens at every sampled position; 0: none.
    pub topk_sample_logprobs: usize,
    /// Score only the last `n` prompt tokens (prompt logprobs and their top-k); `None`: all.
    pub prompt_logprobs_last_n: Option<usize>,
    /// Token ids whose logprobs to answer at each prompt position after the first: an int64
    /// tensor `[len(prompt) - 1, K]`, `-1` where a cell asks nothing.
    pub target_prompt_logprobs: Option<TensorData>,
    /// Draws from the model's next-token distribution at each prompt position after the
    /// first, at the request's temperature; 0: none.
    pub prompt_alt_tokens_k: usize,
    /// One id per sample: each sequence's tokens and logprobs are kept under it for
    /// `stable_reinforce` (`record_stability_info`). None: nothing is kept.
    pub record_as: Option<Vec<SequenceId>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    /// A stop token or string (or end-of-sequence) was sampled.
    Stop,
    /// `max_tokens`, or the end of the context.
    Length,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampledSequence {
    pub stop_reason: StopReason,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Per token, the most likely tokens at its position (`topk_sample_logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topk_logprobs: Option<Vec<TopLogprobs>>,
}

/// The most likely `(token, logprob)` pairs at one position.
pub type TopLogprobs = Vec<(u32, f32)>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleResponse {
    pub sequences: Vec<SampledSequence>,
    /// Per prompt token; `None` for the first (nothing precedes it).
    pub prompt_logprobs: Option<Vec<Option<f32>>>,
    /// Per prompt token, the top `(token, logprob)` pairs; `None` for the first.
    pub topk_prompt_logprobs: Option<Vec<Option<TopLogprobs>>>,
    /// The logprobs of the request's `target_prompt_logprobs`: a float32 tensor of its shape,
    /// 0 where a cell asked nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_prompt_logprobs: Option<TensorData>,
    /// The draws the request's `prompt_alt_tokens_k` asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_alt_tokens: Option<PromptAltTokens>,
    pub prompt_cache_hit_tokens: usize,
}

/// `k` draws at each prompt position after the first, each with the model's logprob of it:
/// two tensors `[len(prompt) - 1, k]` (int64 ids, float32 logprobs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptAltTokens {
    pub tokens: TensorData,
    pub logprobs: TensorData,
}

/// The built-in losses by the name a `forward_backward`'s `loss_fn` and a job's `rl.loss` give
/// them: the one list of them (the engine's `train::Loss` is made from one and its settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossName {
    CrossEntropy,
    ImportanceSampling,
    Ppo,
    Cispo,
    Dro,
    StableReinforce,
    Gspo,
}

impl LossName {
    pub const ALL: [LossName; 7] = [
        LossName::CrossEntropy,
        LossName::ImportanceSampling,
        LossName::Ppo,
        LossName::Cispo,
        LossName::Dro,
        LossName::StableReinforce,
        LossName::Gspo,
    ];

    /// The name `forward_backward` takes.
    pub fn name(self) -> &'static str {
        match self {
            LossName::CrossEntropy => "cross_entropy",
            LossName::ImportanceSampling => "importance_sampling",
            LossName::Ppo => "ppo",
            LossName::Cispo => "cispo",
            LossName::Dro => "dro",
            LossName::StableReinforce => "stable_reinforce",
            LossName::Gspo => "gspo",
        }
    }

    /// The loss of `name`, `None` for a name that is not a built-in loss.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|loss| loss.name() == name)
    }

    /// The names, for messages that list them.
    pub fn names() -> String {
        Self::ALL.map(LossName::name).join(", ")
    }

    /// The `loss_fn_config` keys the loss reads.
    pub fn config_keys(self) -> &'static [&'static str] {
        match self {
            LossName::CrossEntropy | LossName::ImportanceSampling => &[],
            LossName::Ppo | LossName::Cispo | LossName::Gspo => {
                &["clip_low_threshold", "clip_high_threshold"]
            }
            LossName::Dro => &["beta"],
            LossName::StableReinforce => &["clip_high_threshold", "kl_coeff"],
        }
    }
}

/// The datums of one `forward` / `forward_backward` call and the loss to take over them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForwardBackwardInput {
    pub data: Vec<Datum>,
    /// A [`LossName`], `custom` (with `custom_loss`) or an objective plugin's name.
    pub loss_fn: String,
    #[serde(default)]
    pub loss_fn_config: BTreeMap<String, f64>,
    /// The loss a `custom` call runs (`create_custom_loss`'s id; Tinker's
    /// `loss_fn_config["loss_id"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_loss: Option<LossId>,
    /// The learner's logprobs are of `logits / temperature`: an RL call trains the
    /// distribution its samples were drawn from (TRL and verl divide the logits likewise).
    /// 1 unless set; on the Tinker wire, `loss_fn_config["temperature"]`.
    #[serde(
        default = "unit_temperature",
        skip_serializing_if = "is_unit_temperature"
    )]
    pub temperature: f64,
}

/// The model's own distribution: what a datum trains on unless its call names a temperature.
pub const UNIT_TEMPERATURE: f64 = 1.0;

fn unit_temperature() -> f64 {
    UNIT_TEMPERATURE
}

fn is_unit_temperature(temperature: &f64) -> bool {
    *temperature == UNIT_TEMPERATURE
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForwardBackwardOutput {
    pub loss_fn_output_type: String,
    /// Per datum, named outputs: `logprobs` (float32, one per target token).
    pub loss_fn_outputs: Vec<BTreeMap<String, TensorData>>,
    /// Tinker's `name:reduction` keys, e.g. `loss:sum`.
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimStepOutput {
    pub metrics: BTreeMap<String, f64>,
}

/// A trained model, as `get_info` describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub model_id: ModelId,
    pub base_model: String,
    pub arch: String,
    pub lora_rank: usize,
}

/// A saved checkpoint of one of the tenant's models, as the training-run routes list it.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointInfo {
    pub path: CheckpointPath,
    /// When it was saved, in Unix seconds.
    pub saved_at: i64,
    /// Its files' bytes.
    pub size_bytes: u64,
    /// When it expires, in Unix seconds (`ttl_seconds` when saved); none: kept until deleted.
    pub expires_at: Option<i64>,
    /// What the client attached when it saved it.
    pub user_metadata: UserMetadata,
}

/// A sampling session, as `GET samplers/{id}` describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplerInfo {
    pub sampler_id: SamplerId,
    pub base_model: String,
    pub model_path: Option<String>,
}

/// A base model the service serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaseModelInfo {
    pub model_name: String,
    pub max_context_length: usize,
}

/// What a sampling session samples from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SamplerSource {
    /// The base model with no adapter.
    Base(String),
    /// Adapter weights saved by `save_weights_for_sampler` or `save_state`.
    Checkpoint(CheckpointPath),
}

/// What a save of a checkpoint keeps beside its weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SaveOptions {
    /// Seconds the checkpoint is kept; none: until deleted.
    pub ttl_seconds: Option<u64>,
    /// What the client attached to the checkpoint.
    pub user_metadata: UserMetadata,
}

/// What a client attached to a training run (`user_metadata` of `create_model`): the cookbook
/// keeps a run's renderer name there.
pub type UserMetadata = BTreeMap<String, String>;

/// One op of the service. Ops that name a model run in the order of their `seq` for that model.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    CreateSession,
    CreateModel {
        session: SessionId,
        model_seq: u64,
        base_model: String,
        lora: LoraConfig,
        user_metadata: UserMetadata,
    },
    /// A new model whose adapter (and optimizer state, when `with_optimizer`) is a checkpoint's.
    CreateModelFromState {
        session: SessionId,
        model_seq: u64,
        path: CheckpointPath,
        with_optimizer: bool,
        user_metadata: UserMetadata,
    },
    GetInfo {
        model: ModelId,
    },
    ForwardBackward {
        model: ModelId,
        input: ForwardBackwardInput,
        /// `forward`: no gradients.
        forward_only: bool,
    },
    OptimStep {
        model: ModelId,
        params: AdamParams,
    },
    /// Save the adapter and its optimizer state (`save_state`).
    SaveState {
        model: ModelId,
        name: String,
        options: SaveOptions,
    },
    /// Replace the model's adapter (and optimizer state) with a checkpoint's.
    LoadState {
        model: ModelId,
        path: CheckpointPath,
        with_optimizer: bool,
    },
    /// Save the adapter for sampling under a name.
    SaveWeightsForSampler {
        model: ModelId,
        name: String,
        options: SaveOptions,
    },
    /// Export the adapter for download (`save_weights_external`), each file encrypted to the
    /// age `recipients` if any are given.
    SaveWeightsExternal {
        model: ModelId,
        name: String,
        options: SaveOptions,
        recipients: Vec<String>,
    },
    /// A sampling session on the adapter as it is now (no file written).
    SnapshotForSampler {
        model: ModelId,
        sampler_seq: u64,
    },
    CreateSamplingSession {
        session: SessionId,
        sampler_seq: u64,
        source: SamplerSource,
    },
    GetSampler {
        sampler: SamplerId,
    },
    Sample(SampleRequest),
    /// Keep a custom loss of the session, checked against the operations the engine allows,
    /// for `forward_backward` calls of `loss_fn = "custom"` to name.
    CreateCustomLoss {
        session: SessionId,
        loss_seq: u64,
        name: String,
        inputs: Vec<CustomLossInput>,
        graph: LossGraph,
    },
}

impl Op {
    /// The model whose order the op takes its place in, if any.
    pub fn model(&self) -> Option<&ModelId> {
        match self {
            Op::GetInfo { model }
            | Op::ForwardBackward { model, .. }
            | Op::OptimStep { model, .. }
            | Op::SaveState { model, .. }
            | Op::LoadState { model, .. }
            | Op::SaveWeightsForSampler { model, .. }
            | Op::SaveWeightsExternal { model, .. }
            | Op::SnapshotForSampler { model, .. } => Some(model),
            _ => None,
        }
    }
}

/// What an op answers.
#[derive(Clone, Debug, PartialEq)]
pub enum OpOutput {
    Session(SessionId),
    Model(ModelId),
    Info(ModelInfo),
    ForwardBackward(ForwardBackwardOutput),
    OptimStep(OptimStepOutput),
    Checkpoint(CheckpointPath),
    Sampler(SamplerId),
    SamplerInfo(SamplerInfo),
    Sample(SampleResponse),
    CustomLoss(LossId),
}
