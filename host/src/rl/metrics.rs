//! What a run reports: the lines of `metrics.jsonl`, evaluations, the final summary, and the
//! per-batch statistics they are made of.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::failure::{EpisodeFailure, FailureKind};
use super::rollout::EpisodeOutcome;

/// What a step trained: the warm-up or RL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Sft,
    #[default]
    Rl,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Sft => "sft",
            Phase::Rl => "rl",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// One line of `metrics.jsonl` (read back by clients that follow a job on a server).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    pub step: usize,
    pub phase: Phase,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub episode_steps: f64,
    pub tokens: usize,
    pub loss: f64,
    pub groups_trained: usize,
    /// How many versions behind the trained policy the batch's oldest group was sampled (0 in
    /// sync mode; in async mode up to `rl.max_policy_lag`).
    pub policy_lag: usize,
    /// Async mode: groups found stale (older than `rl.max_policy_lag`) since the last step, and
    /// resampled or dropped.
    pub stale_groups: usize,
    /// The mean negative logprob of the sampled tokens trained on (an estimate of the policy's
    /// entropy on its own samples).
    pub entropy: f64,
    /// The fraction of groups (per trained seat) whose returns all tie: they teach nothing.
    pub tied_groups: f64,
    /// The mean absolute advantage of the trained seats' turns.
    pub advantage_abs_mean: f64,
    /// The step's update norm relative to the adapter's weights (the largest among the
    /// policies trained), when one trained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_ratio: Option<f64>,
    /// The largest absolute difference between the trainer's logprob of a sampled token trained
    /// on (before the update) and the sampler's: in sync mode, the numerical mismatch of the
    /// sampling and training paths (in f32, 1e-5 on the tiny model, up to 3e-4 on
    /// SmolLM2-135M's 30 layers); both are of the distribution sampled from
    /// (`logits / temperature`, the trainer's taken at the job's temperature). Async mode adds
    /// the policy's drift since sampling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler_logprob_diff_max: Option<f64>,
    /// The mean of those differences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler_logprob_diff_mean: Option<f64>,
    /// On a step with an evaluation: the fraction of its episodes in which the greedy policy
    /// acted exactly as at the evaluation before (1: the updates changed no greedy choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greedy_agreement: Option<f64>,
    /// The mean of log π(t) - log π_ref(t) over the sampled tokens trained on, π_ref being the
    /// policy as RL started (or the job's reference): every step with a KL penalty, else on the
    /// steps that evaluate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl: Option<f64>,
    pub errors: BTreeMap<FailureKind, usize>,
    /// The first failure's text of each error kind of the step, when it had one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub error_messages: BTreeMap<FailureKind, String>,
    pub env_metrics: BTreeMap<String, f64>,
    /// The evaluation of the (first trainable) policy, when one ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<Evaluation>,
    /// Multi-agent jobs: the mean return of each policy's players.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub policy_rewards: BTreeMap<String, f64>,
    /// Multi-agent jobs: each trainable policy's evaluation, when one ran.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub policy_evals: BTreeMap<String, Evaluation>,
    /// On the first RL step's line: each trainable policy's evaluation before any RL update.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub initial_evals: BTreeMap<String, Evaluation>,
    /// On a warm-up's last line, when a plateau stop ended it before its steps: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_stop: Option<String>,
    /// RL steps: the wall time of playing the step's episodes (in async mode, of waiting for
    /// the batch) and the tokens the policies sampled in them: the sampler's throughput.
    pub sample_seconds: f64,
    pub sampled_tokens: usize,
    /// RL steps: the wall time of the training step (forward, backward and optimizer) and the
    /// tokens of the sequences it trained on, prompts included: the trainer's throughput.
    pub train_seconds: f64,
    pub train_tokens: usize,
    /// The step's whole wall time, evaluation and checkpoint included.
    pub seconds: f64,
}

/// What a warm-up did: the held-out evaluations before and after (when it has a held-out set),
/// and the steps it ran.
#[derive(Clone, Default)]
pub(super) struct Warmup {
    pub(super) evals: Option<(Evaluation, Evaluation)>,
    pub(super) steps: usize,
}

/// Greedy evaluation on fixed seeds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Evaluation {
    pub episodes: usize,
    pub reward_mean: f64,
    /// The fraction of episodes with a positive return (accuracy, solve rate, win rate).
    pub success_rate: f64,
    /// Environment steps per episode (turns, in a single-player game).
    pub episode_steps: f64,
    /// The environment's metrics, averaged per episode.
    pub metrics: BTreeMap<String, f64>,
    /// Failed episodes by error kind (they count as returns of the failure reward).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub errors: BTreeMap<FailureKind, usize>,
    /// SFT: the loss per token of the held-out conversations (`episodes` of them).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub loss: Option<f64>,
    /// A digest of the scored player's actions in each episode, to compare two evaluations.
    #[serde(skip)]
    pub actions: Vec<u64>,
}

/// What `train --json` prints.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub steps: usize,
    /// A job that warms a LoRA adapter up before RL: the policy's evaluation before the
    /// warm-up (`initial_eval` is RL's first, after it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrained_eval: Option<Evaluation>,
    pub initial_eval: Evaluation,
    pub final_eval: Evaluation,
    pub checkpoint: PathBuf,
    pub out: PathBuf,
    /// Multi-agent jobs: each trainable policy's first and last evaluation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, PolicyEvaluations>,
    /// When the evaluation did not improve: why, as far as the run's figures tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<String>,
}

/// A policy's first and last evaluation.
#[derive(Debug, Serialize)]
pub struct PolicyEvaluations {
    pub initial_eval: Evaluation,
    pub final_eval: Evaluation,
}

pub(super) fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

pub(super) fn std(values: &[f64]) -> f64 {
    let m = mean(values.iter().copied());
    mean(values.iter().map(|v| (v - m).powi(2))).sqrt()
}

pub(super) fn errors(outcomes: &[EpisodeOutcome]) -> BTreeMap<FailureKind, usize> {
    errors_of(&outcomes.iter().collect::<Vec<_>>())
}

/// The environment's metrics, averaged per episode.
pub(super) fn metrics_of(outcomes: &[&EpisodeOutcome]) -> BTreeMap<String, f64> {
    let mut metrics = BTreeMap::new();
    for outcome in outcomes {
        for (name, value) in &outcome.metrics {
            *metrics.entry(name.clone()).or_insert(0.0) += value / outcomes.len() as f64;
        }
    }
    metrics
}

/// The first failure's text of each error kind among `outcomes` (with its episode's seed).
pub(super) fn error_messages_of(outcomes: &[&EpisodeOutcome]) -> BTreeMap<FailureKind, String> {
    let mut messages = BTreeMap::new();
    for outcome in outcomes {
        if let Some(EpisodeFailure {
            kind,
            message: Some(message),
        }) = &outcome.failure
        {
            messages
                .entry(*kind)
                .or_insert_with(|| format!("seed {}: {message}", outcome.seed));
        }
    }
    messages
}

pub(super) fn errors_of(outcomes: &[&EpisodeOutcome]) -> BTreeMap<FailureKind, usize> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        if let Some(failure) = &outcome.failure {
            *counts.entry(failure.kind).or_insert(0) += 1;
        }
    }
    counts
}
