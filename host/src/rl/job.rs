//! The job file (TOML) of `opentinker train`: what model, which plugins, how to warm up and how
//! to train. Unknown keys are refused by name, and every choice among names (mode, estimator,
//! loss, shape, architecture) is a serde enum whose error lists the accepted ones; every check,
//! the loss's config included, runs when the file is read, before any model is loaded. See
//! `examples/README.md`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::advantage::Estimator;
use crate::api::{AdamParams, LoraConfig, LossName};
use crate::client::TinyModelSpec;
use crate::client::check_loss;
use crate::plugin::Limits;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub model: ModelSection,
    #[serde(default)]
    pub lora: LoraSection,
    /// The environment RL (and a demonstration warm-up) plays; an SFT job on a file needs none.
    #[serde(default)]
    pub environment: Option<PluginSection>,
    /// What the policy is shown and how its text becomes an action; absent: the built-in chat
    /// agent (the whole conversation, the completion as the action).
    #[serde(default)]
    pub agent: Option<AgentSection>,
    /// A reward plugin whose score of each finished episode adds to the players' returns.
    #[serde(default)]
    pub reward: Option<RewardSection>,
    #[serde(default)]
    pub sft: Option<SftSection>,
    /// Absent: the job is supervised fine-tuning only.
    #[serde(default)]
    pub rl: RlSection,
    #[serde(default)]
    pub eval: EvalSection,
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Multi-agent jobs: the policies and the players each controls. Absent: one trainable
    /// policy named `policy` plays every player.
    #[serde(default)]
    pub policies: Vec<PolicySection>,
    /// What each instance of the job's plugins may use (any field of `plugin::Limits`; the
    /// others keep their defaults), at most the host's maxima.
    #[serde(default)]
    pub limits: Limits,
    /// The training settings the file left out, as `section.key = value` with the values they
    /// take (see [`Job::settings`]).
    #[serde(skip)]
    pub defaults: Vec<String>,
}

/// A policy of a multi-agent job: a LoRA adapter (or, frozen, the base model as it was when RL
/// started) and the players it controls; its tokens train only its own adapter, with the
/// return of the player that sampled them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// Names its adapter, its checkpoint folder and its metrics.
    pub name: String,
    /// The players it controls (none: every player).
    #[serde(default)]
    pub players: Vec<usize>,
    #[serde(default = "default_true")]
    pub trainable: bool,
    /// The environment config its greedy evaluation plays, as player 0 (for a game, against
    /// the built-in opponent); absent: the job's environment, with every policy in its seat.
    #[serde(default)]
    pub eval_config: Option<toml::Value>,
}

impl PolicySection {
    /// The evaluation config as the JSON text the plugin receives.
    pub fn eval_config_json(&self) -> Option<String> {
        self.eval_config
            .as_ref()
            .map(|c| serde_json::to_string(c).unwrap_or_else(|_| "{}".into()))
    }

    /// Whether it controls `player`.
    pub fn controls(&self, player: usize) -> bool {
        self.players.is_empty() || self.players.contains(&player)
    }
}

/// A model directory, a tiny model generated into the run's folder, or (for a job submitted to
/// a server) a base model the server serves, by name.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub dir: Option<PathBuf>,
    pub init_tiny: Option<TinyModelSpec>,
    pub base: Option<String>,
}

/// The shape of every trainable policy's adapter (`[lora]`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    pub rank: usize,
    pub alpha: f64,
    /// rsLoRA: scale by `alpha / sqrt(rank)` instead of `alpha / rank`.
    pub rslora: bool,
    pub train_attention: bool,
    pub train_mlp: bool,
    pub train_unembed: bool,
    pub seed: u64,
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection {
            rank: 16,
            alpha: 32.0,
            rslora: false,
            train_attention: true,
            train_mlp: true,
            train_unembed: false,
            seed: 0,
        }
    }
}

impl LoraSection {
    /// The adapter config a training client is made with.
    pub fn config(&self) -> LoraConfig {
        LoraConfig {
            rank: self.rank,
            seed: Some(self.seed),
            train_unembed: self.train_unembed,
            train_mlp: self.train_mlp,
            train_attn: self.train_attention,
            alpha: Some(self.alpha),
            rslora: self.rslora,
        }
    }
}

/// A plugin, and its JSON config: a crate folder (built as needed), a `.wasm` file, a published
/// plugin (`namespace/name@RANGE`, installed as the job's lock file pins it) or the `sha256:`
/// digest of a plugin a server stores.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    pub plugin: PathBuf,
    #[serde(default)]
    pub config: Option<toml::Value>,
}

impl PluginSection {
    /// The config as the JSON text the plugin receives (`{}` when absent).
    pub fn config_json(&self) -> String {
        config_json(&self.config)
    }
}

/// A plugin config as the JSON text the plugin receives (`{}` when absent).
fn config_json(config: &Option<toml::Value>) -> String {
    match config {
        Some(value) => serde_json::to_string(value).unwrap_or_else(|_| "{}".into()),
        None => "{}".into(),
    }
}

/// An agent plugin and its config (a 0.1 agent takes none and ignores it).
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    pub plugin: PathBuf,
    #[serde(default)]
    pub config: Option<toml::Value>,
}

impl AgentSection {
    /// The config as the JSON text the agent receives (`{}` when absent).
    pub fn config_json(&self) -> String {
        config_json(&self.config)
    }
}

/// A reward plugin, the weight of its score, and whether its group scorer (when it has one)
/// replaces the scores of each group's episodes.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    pub plugin: PathBuf,
    /// Its config (a 0.1 reward takes none and ignores it).
    #[serde(default)]
    pub config: Option<toml::Value>,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub group: bool,
}

impl RewardSection {
    /// The config as the JSON text the reward receives (`{}` when absent).
    pub fn config_json(&self) -> String {
        config_json(&self.config)
    }
}

fn default_weight() -> f64 {
    1.0
}

/// An advantage estimator plugin (`rl.advantage`) and its config: it replaces `rl.estimator`.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvantageSection {
    pub plugin: PathBuf,
    #[serde(default)]
    pub config: Option<toml::Value>,
}

impl AdvantageSection {
    /// The config as the JSON text the estimator receives (`{}` when absent).
    pub fn config_json(&self) -> String {
        config_json(&self.config)
    }
}

/// Supervised fine-tuning: the warm-up of an RL job, or a job of its own (a job without an
/// environment, or with `rl.steps = 0`).
#[derive(Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SftSection {
    /// Not among the settings a run writes: a path of the machine that runs it.
    #[serde(skip_serializing)]
    pub source: SftSource,
    pub steps: usize,
    /// Episodes or conversations per step.
    #[serde(default = "default_sft_batch")]
    pub batch: usize,
    #[serde(default = "default_sft_lr")]
    pub learning_rate: f64,
    /// How the learning rate changes over the steps.
    #[serde(default = "default_sft_schedule")]
    pub schedule: LrSchedule,
    /// Adam's second-moment decay. A warm-up's gradients are noisy (a few dozen episodes a
    /// step, demonstrations of modest quality): at 0.95 (RL's, the Tinker SDK's default) the
    /// step sizes follow that noise, and on one tiny model grid-walk never left its plateau
    /// (greedy success 0.125 after 300 steps), where 0.999 reached 1.0 (examples/LEARNING.md).
    #[serde(default = "default_sft_beta2")]
    pub beta2: f64,
    /// Train every weight of the model (true), or the LoRA adapter that RL trains next (false).
    #[serde(default = "default_true")]
    pub full_parameters: bool,
    /// The held-out set, whose loss per token is the evaluation: with a JSONL source, the last
    /// this many conversations; with demonstrations, this many episodes of seeds of their own
    /// (default under a plateau stop: [`PLATEAU_HELD_OUT`]).
    #[serde(default)]
    pub held_out: usize,
    /// Evaluate the held-out loss every this many steps (and before and after); 0: before and
    /// after only (under a plateau stop: every [`PLATEAU_EVAL_EVERY`]).
    #[serde(default)]
    pub eval_every: usize,
    /// When the warm-up ends; absent: after its steps.
    #[serde(default)]
    pub stop: Option<StopRule>,
    /// Under a plateau stop: evaluations in a row without a lower held-out loss (by
    /// [`PLATEAU_MIN_GAIN`]) before the warm-up ends.
    #[serde(default = "default_patience")]
    pub patience: usize,
    /// Not written in the file but implied by its leaving out `[sft]` and `[rl]` (see
    /// [`SftSection::implied`]): skipped, with a warning, where the environment has no
    /// demonstrations.
    #[serde(skip)]
    pub implied: bool,
}

/// When a warm-up ends (`sft.stop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopRule {
    /// After all of its `steps`.
    Steps,
    /// Once the held-out loss per token has stopped falling (`patience` evaluations in a row
    /// without a gain of [`PLATEAU_MIN_GAIN`]), or after `steps`. A warm-up on demonstrations
    /// teaches the form of an action and the rules; once their loss is flat it only copies the
    /// demonstrations' choices harder, which is RL's part to improve on.
    Plateau,
}

/// Under a plateau stop, the held-out loss per token has fallen when it is lower than the best
/// before by this fraction of it, or by [`PLATEAU_MIN_GAIN_NATS`] where that is more.
pub const PLATEAU_MIN_GAIN: f64 = 0.01;
/// See [`PLATEAU_MIN_GAIN`]: near zero, a fraction of the loss is noise.
pub const PLATEAU_MIN_GAIN_NATS: f64 = 1e-3;
/// The held-out demonstration episodes of a plateau stop when `sft.held_out` is not given.
pub const PLATEAU_HELD_OUT: usize = 16;
/// The steps between a plateau stop's evaluations when `sft.eval_every` is not given.
pub const PLATEAU_EVAL_EVERY: usize = 10;

fn default_patience() -> usize {
    3
}

/// The steps of the warm-up that a job naming only its model and plugins gets (with the
/// section's other defaults: 32 demonstration episodes a step at 1e-3, every weight trained).
/// Three environments that are not the examples, and the examples, learn from it and RL's
/// defaults (examples/LEARNING.md).
pub const DEFAULT_WARMUP_STEPS: usize = 300;

impl SftSection {
    /// The warm-up of a job whose file leaves out both `[sft]` and `[rl]`: a user who writes
    /// only the model and the plugins gets the whole recipe, a warm-up on the environment's
    /// demonstrations (where it has them) and then RL, each with its defaults. A file that
    /// writes `[rl]` and no `[sft]` starts RL from the base, as it says.
    pub fn implied() -> Self {
        SftSection {
            source: SftSource::Demonstrations,
            steps: DEFAULT_WARMUP_STEPS,
            batch: default_sft_batch(),
            learning_rate: default_sft_lr(),
            schedule: default_sft_schedule(),
            beta2: default_sft_beta2(),
            full_parameters: true,
            held_out: 0,
            eval_every: 0,
            stop: None,
            patience: default_patience(),
            implied: true,
        }
    }

    /// The rule that ends this warm-up (`stop`; absent, its steps). A plateau stop is not the
    /// default: on `arithmetic.toml` the loss of 16 held-out episodes is noisy enough that it
    /// stopped the warm-up at step 110 of 300 with the greedy accuracy at 0.23 where 300 steps
    /// reach 0.97, and with 64 episodes and a patience of 5 it never stops tic-tac-toe's
    /// (examples/LEARNING.md).
    pub fn stop_rule(&self) -> StopRule {
        self.stop.unwrap_or(StopRule::Steps)
    }

    /// The size of the held-out set: `held_out`, or a plateau stop's default on
    /// demonstrations.
    pub fn held_out_size(&self) -> usize {
        match (self.held_out, self.stop_rule(), &self.source) {
            (0, StopRule::Plateau, SftSource::Demonstrations) => PLATEAU_HELD_OUT,
            (given, _, _) => given,
        }
    }

    /// The steps between evaluations of the held-out loss (0: before and after only).
    pub fn eval_interval(&self) -> usize {
        match (self.eval_every, self.stop_rule()) {
            (0, StopRule::Plateau) => PLATEAU_EVAL_EVERY,
            (given, _) => given,
        }
    }

    /// Adam's settings at warm-up step `step`: the schedule's rate, `beta2`, the gradient
    /// clipped to norm 1 (as RL's).
    pub fn adam(&self, step: usize) -> AdamParams {
        AdamParams {
            learning_rate: self.schedule.rate(self.learning_rate, step, self.steps),
            beta2: self.beta2,
            grad_clip_norm: 1.0,
            ..AdamParams::default()
        }
    }

    /// The chat JSONL file, when the source is one.
    pub fn jsonl(&self) -> Option<&Path> {
        match &self.source {
            SftSource::Demonstrations => None,
            SftSource::File(path) => Some(path),
        }
    }
}

/// What a warm-up trains on (`sft.source`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "String")]
pub enum SftSource {
    /// `"demonstrations"`: play the environment with its demonstration actions.
    Demonstrations,
    /// Any other text: a chat JSONL file (relative to the job file; see `rl::sft`).
    File(PathBuf),
}

impl From<String> for SftSource {
    fn from(text: String) -> Self {
        match text.as_str() {
            "demonstrations" => SftSource::Demonstrations,
            _ => SftSource::File(PathBuf::from(text)),
        }
    }
}

fn default_sft_batch() -> usize {
    32
}

/// At 3e-3 a warm-up on demonstrations stays noisy where 1e-3 learns their most common choice
/// (sort-digits: 0.67 of tasks sorted greedily against 0.08; tic-tac-toe's plateau; see
/// examples/LEARNING.md).
fn default_sft_lr() -> f64 {
    1e-3
}

fn default_sft_beta2() -> f64 {
    0.999
}

fn default_sft_schedule() -> LrSchedule {
    LrSchedule::Constant
}

/// How a phase's learning rate changes over its steps (`sft.schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// The same rate at every step.
    Constant,
    /// From the full rate at the first step down towards zero after the last, in equal steps
    /// (the tinker-cookbook's default): fast early, settled at the end.
    Linear,
}

impl LrSchedule {
    /// The rate of step `step` (from 0) of `steps`, for a full rate `rate`.
    pub fn rate(self, rate: f64, step: usize, steps: usize) -> f64 {
        match self {
            LrSchedule::Constant => rate,
            LrSchedule::Linear => rate * (1.0 - step as f64 / steps.max(1) as f64),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RlSection {
    /// RL steps; not given: [`DEFAULT_RL_STEPS`] for a job with an environment, none (an SFT
    /// job) without one.
    #[serde(default)]
    pub steps: usize,
    #[serde(default = "default_groups")]
    pub groups_per_batch: usize,
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    #[serde(default = "default_rl_lr")]
    pub learning_rate: f64,
    #[serde(default)]
    pub loss: RlLoss,
    #[serde(default)]
    pub loss_config: std::collections::BTreeMap<String, f64>,
    /// The sampling temperature, and the trainer's: the policy trained is the tempered one
    /// sampled from (`logits / temperature`), so on-policy importance ratios are 1. At 0
    /// (greedy) the trainer takes the model's own distribution.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Sample from the smallest set of most likely tokens whose mass reaches this (1: all).
    /// A tiny or freshly warmed-up model puts enough mass on its tail that samples at
    /// temperature 1 are mostly misspellings, which then are all the groups teach.
    #[serde(default = "default_top_p")]
    pub top_p: f64,
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default)]
    pub estimator: Estimator,
    /// An advantage estimator plugin, in place of `estimator`. Not among the settings a run
    /// writes: a path of the machine that runs it.
    #[serde(default, skip_serializing)]
    pub advantage: Option<AdvantageSection>,
    #[serde(default = "default_gamma")]
    pub gamma: f64,
    #[serde(default = "default_true")]
    pub skip_equal_groups: bool,
    #[serde(default)]
    pub failure_reward: f64,
    /// The job stops when more than this fraction of its episodes failed over its last three
    /// RL steps, or every episode of one step did; 1 never stops it.
    #[serde(default = "default_max_failure_rate")]
    pub max_failure_rate: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub mode: Mode,
    /// Async mode: a group sampled with a policy more than this many versions behind the step
    /// that would train on it is stale. The stream also keeps this many batches (at least one)
    /// in play ahead of training. Sync mode ignores it.
    #[serde(default = "default_max_policy_lag")]
    pub max_policy_lag: usize,
    /// Async mode: what becomes of a stale group. Sync mode ignores it.
    #[serde(default)]
    pub stale: StaleGroups,
    /// The weight of the KL penalty folded into the advantages (0: none).
    #[serde(default)]
    pub kl_coef: f64,
    /// The KL reference: a PEFT adapter folder (one subfolder per policy in a multi-agent job);
    /// absent: each policy as it was when RL started. Not among the settings a run writes: a
    /// path of the machine that runs it.
    #[serde(default, skip_serializing)]
    pub kl_reference: Option<PathBuf>,
}

/// The RL steps of a job with an environment whose file does not give `rl.steps`. On the
/// environments the defaults were chosen on, RL's gain is nearly all there by step 40 (take-away:
/// +0.34 by step 20, +0.36 by 40, +0.375 by 60), and 40 keeps the slowest defaults-only job
/// (grid-walk, multi-turn) within five minutes on two cores (examples/LEARNING.md). The examples
/// write their own (tic-tac-toe's RL needs its 60).
pub const DEFAULT_RL_STEPS: usize = 40;

fn default_max_failure_rate() -> f64 {
    0.5
}

/// How sampling and training interleave (`rl.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Sample a batch, train on it, publish the new policy, repeat.
    #[default]
    Sync,
    /// Groups play on while a step trains, so a batch is sampled by policies up to
    /// `max_policy_lag` versions old, which the importance-sampling losses correct for.
    Async,
}

/// The RL loss (`rl.loss`): a built-in one by name, or an objective plugin
/// (`{ plugin = "..." }`); its settings are `rl.loss_config` either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RlLoss {
    Builtin(LossName),
    Plugin(LossPlugin),
}

impl Default for RlLoss {
    fn default() -> Self {
        RlLoss::Builtin(LossName::ImportanceSampling)
    }
}

/// An objective plugin as the RL loss.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossPlugin {
    pub plugin: PathBuf,
}

impl<'de> Deserialize<'de> for RlLoss {
    /// A name (refused with the names accepted) or a table naming a plugin.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = toml::Value::deserialize(deserializer)?;
        match value {
            toml::Value::Table(_) => LossPlugin::deserialize(value)
                .map(RlLoss::Plugin)
                .map_err(D::Error::custom),
            other => LossName::deserialize(other)
                .map(RlLoss::Builtin)
                .map_err(D::Error::custom),
        }
    }
}

impl Serialize for RlLoss {
    /// A built-in loss by its name; a plugin as `{ plugin = "objective plugin" }` (not its path:
    /// a path of the machine that ran it).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RlLoss::Builtin(name) => name.serialize(serializer),
            RlLoss::Plugin(_) => std::collections::BTreeMap::from([("plugin", "objective plugin")])
                .serialize(serializer),
        }
    }
}

fn default_max_policy_lag() -> usize {
    1
}

/// What becomes of a group sampled more than `max_policy_lag` versions behind (async mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StaleGroups {
    /// Its task is played again with the current policy.
    #[default]
    Resample,
    /// It is dropped, and a new task is played instead.
    Drop,
}

fn default_groups() -> usize {
    8
}
fn default_group_size() -> usize {
    8
}
fn default_rl_lr() -> f64 {
    1e-3
}
fn default_temperature() -> f64 {
    1.0
}
fn default_top_p() -> f64 {
    1.0
}
fn default_max_turns() -> usize {
    16
}
/// A turn's reply: long enough for the actions of the examples and the new environments (a move,
/// a number, a short expression), short enough that a policy which has not yet learnt to stop
/// costs little (at 32, multi-turn RL steps took 4-17 s; examples/LEARNING.md).
fn default_max_tokens() -> usize {
    8
}
fn default_gamma() -> f64 {
    1.0
}
fn default_true() -> bool {
    true
}

impl Default for RlSection {
    fn default() -> Self {
        RlSection {
            steps: 0,
            groups_per_batch: default_groups(),
            group_size: default_group_size(),
            learning_rate: default_rl_lr(),
            loss: RlLoss::default(),
            loss_config: Default::default(),
            temperature: default_temperature(),
            top_p: default_top_p(),
            max_turns: default_max_turns(),
            max_tokens: default_max_tokens(),
            estimator: Estimator::default(),
            advantage: None,
            gamma: default_gamma(),
            skip_equal_groups: true,
            failure_reward: 0.0,
            max_failure_rate: default_max_failure_rate(),
            seed: 0,
            kl_coef: 0.0,
            kl_reference: None,
            mode: Mode::default(),
            max_policy_lag: default_max_policy_lag(),
            stale: StaleGroups::default(),
        }
    }
}

impl RlSection {
    /// Whether the job runs in async mode.
    pub fn asynchronous(&self) -> bool {
        self.mode == Mode::Async
    }
}

/// Whether a job's plugin is named by the digest of a plugin stored on a server
/// (`sha256:HEX`) rather than by a path.
pub fn is_digest(plugin: &Path) -> bool {
    plugin.to_str().is_some_and(|p| p.starts_with("sha256:"))
}

/// Whether a job's plugin is named as a published package (`namespace/name@RANGE`), which the
/// CLI installs from a registry, rather than by a path.
pub fn is_package(plugin: &Path) -> bool {
    plugin
        .to_str()
        .is_some_and(crate::market::PackageRef::looks_like)
}

/// Why a job file was refused.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, a value of the wrong type or an unknown name (the message
    /// says which key, and the accepted names).
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// Read, but its settings do not hold together.
    #[error("{}: {problem}", path.display())]
    Invalid { path: PathBuf, problem: JobProblem },
}

/// What is wrong with a job's settings.
#[derive(Debug, thiserror::Error)]
pub enum JobProblem {
    /// A plugin limit above the host's maximum.
    #[error("limits: {0}")]
    Limits(#[from] crate::plugin::LimitError),
    /// A loss config that no `forward_backward` would take.
    #[error("rl.loss_config: {0}")]
    Loss(#[from] crate::api::ApiError),
    /// Settings that contradict each other or are out of range.
    #[error("{0}")]
    Settings(String),
}

/// Greedy evaluation on seeds disjoint from training's.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Evaluate every this many RL steps (and before and after training); 0: only before and
    /// after.
    pub every: usize,
    pub episodes: usize,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            every: 0,
            episodes: 64,
        }
    }
}

/// How often the run saves what `--resume` continues from.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Save `checkpoints/step-N/` every this many RL steps; 0: only the final adapter.
    pub every: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection { every: 10 }
    }
}

impl Job {
    /// Read and check a job file; relative paths in it are relative to the file's folder.
    pub fn load(path: &Path) -> Result<Self, JobError> {
        let text = std::fs::read_to_string(path).map_err(|source| JobError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut job = Self::parse(&text, path)?;
        job.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        Ok(job)
    }

    /// Parse and check the text of a job file; `origin` names it in errors. Paths in it are
    /// kept as written.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, JobError> {
        let parse_error = |e: toml::de::Error| JobError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        };
        let mut job: Job = toml::from_str(text).map_err(parse_error)?;
        let given: toml::Table = toml::from_str(text).map_err(parse_error)?;
        let rl_steps_given = given
            .get("rl")
            .and_then(toml::Value::as_table)
            .is_some_and(|rl| rl.contains_key("steps"));
        if !rl_steps_given && job.environment.is_some() {
            job.rl.steps = DEFAULT_RL_STEPS;
        }
        let defaults_only = !given.contains_key("sft") && !given.contains_key("rl");
        if defaults_only && job.environment.is_some() && job.policies.is_empty() {
            job.sft = Some(SftSection::implied());
        }
        job.check().map_err(|problem| JobError::Invalid {
            path: origin.to_path_buf(),
            problem,
        })?;
        job.defaults = job.settings_not_in(&given);
        Ok(job)
    }

    /// The training settings the job runs with, every default filled in: `[lora]`, `[sft]`
    /// (without its source), `[rl]` (without its KL reference), `[eval]` and `[checkpoint]`.
    /// A run writes them to its folder (`settings.toml`).
    pub fn settings(&self) -> toml::Table {
        let mut settings = toml::Table::new();
        let mut add = |name: &str, section: Result<toml::Value, toml::ser::Error>| {
            // Every section is plain data that TOML holds; a failure would be our bug.
            if let Ok(value) = section {
                settings.insert(name.to_string(), value);
            }
        };
        add("lora", toml::Value::try_from(&self.lora));
        if let Some(sft) = &self.sft {
            // With the values the warm-up's rule resolves its unset keys to.
            let mut section = toml::Value::try_from(sft);
            if let Ok(toml::Value::Table(table)) = &mut section {
                let rule = toml::Value::try_from(sft.stop_rule());
                if let Ok(rule) = rule {
                    table.insert("stop".into(), rule);
                }
                let held_out = i64::try_from(sft.held_out_size()).unwrap_or(i64::MAX);
                table.insert("held_out".into(), held_out.into());
                let every = i64::try_from(sft.eval_interval()).unwrap_or(i64::MAX);
                table.insert("eval_every".into(), every.into());
            }
            add("sft", section);
        }
        let mut rl = toml::Value::try_from(&self.rl);
        // An estimator plugin replaces `estimator` (and its `gamma`): the run used neither.
        if let (Ok(toml::Value::Table(table)), Some(_)) = (&mut rl, &self.rl.advantage) {
            table.remove("estimator");
            table.remove("gamma");
            table.insert(
                "advantage".into(),
                toml::toml! { plugin = "advantage estimator plugin" }.into(),
            );
        }
        add("rl", rl);
        add("eval", toml::Value::try_from(&self.eval));
        add("checkpoint", toml::Value::try_from(&self.checkpoint));
        settings
    }

    /// The settings (`section.key = value`) that the file `given` leaves out.
    fn settings_not_in(&self, given: &toml::Table) -> Vec<String> {
        let mut defaults = Vec::new();
        for (section, values) in self.settings() {
            let Some(values) = values.as_table() else {
                continue;
            };
            let written = given.get(&section).and_then(toml::Value::as_table);
            for (key, value) in values {
                if written.is_none_or(|w| !w.contains_key(key)) {
                    defaults.push(format!("{section}.{key} = {value}"));
                }
            }
        }
        defaults
    }

    /// Make the job's relative paths relative to `base` (its file's folder).
    fn resolve_paths(&mut self, base: &Path) {
        let job = self;
        let resolve = |p: &PathBuf| {
            if p.is_relative() && !is_digest(p) && !is_package(p) {
                base.join(p)
            } else {
                p.clone()
            }
        };
        if let Some(environment) = &mut job.environment {
            environment.plugin = resolve(&environment.plugin);
        }
        if let Some(sft) = &mut job.sft
            && let SftSource::File(file) = &mut sft.source
        {
            *file = resolve(file);
        }
        if let Some(agent) = &mut job.agent {
            agent.plugin = resolve(&agent.plugin);
        }
        if let Some(reward) = &mut job.reward {
            reward.plugin = resolve(&reward.plugin);
        }
        if let Some(advantage) = &mut job.rl.advantage {
            advantage.plugin = resolve(&advantage.plugin);
        }
        if let RlLoss::Plugin(loss) = &mut job.rl.loss {
            loss.plugin = resolve(&loss.plugin);
        }
        if let Some(reference) = &job.rl.kl_reference {
            job.rl.kl_reference = Some(resolve(reference));
        }
        if let Some(dir) = &job.model.dir {
            job.model.dir = Some(resolve(dir));
        }
    }

    /// The plugin paths the job names, by section (`environment`, `agent`, `reward`,
    /// `rl.advantage`, `rl.loss`), for the CLI to build source folders into components before the driver
    /// sees the job.
    pub fn plugin_paths_mut(&mut self) -> Vec<(&'static str, &mut PathBuf)> {
        let mut paths = Vec::new();
        if let Some(section) = &mut self.environment {
            paths.push(("environment", &mut section.plugin));
        }
        if let Some(section) = &mut self.agent {
            paths.push(("agent", &mut section.plugin));
        }
        if let Some(section) = &mut self.reward {
            paths.push(("reward", &mut section.plugin));
        }
        if let Some(section) = &mut self.rl.advantage {
            paths.push(("rl.advantage", &mut section.plugin));
        }
        if let RlLoss::Plugin(loss) = &mut self.rl.loss {
            paths.push(("rl.loss", &mut loss.plugin));
        }
        paths
    }

    /// The job's policies: those it names, or one trainable `policy` for every player.
    pub fn policies(&self) -> Vec<PolicySection> {
        if !self.policies.is_empty() {
            return self.policies.clone();
        }
        vec![PolicySection {
            name: "policy".into(),
            players: Vec::new(),
            trainable: true,
            eval_config: None,
        }]
    }

    /// Whether `other` trains on the same base model as this job: the same model and, when a
    /// full-parameter warm-up changes it, the same warm-up on the same environment and agent.
    pub fn same_base(&self, other: &Job) -> bool {
        fn full(job: &Job) -> Option<&SftSection> {
            job.sft.as_ref().filter(|w| w.full_parameters)
        }
        self.model == other.model
            && full(self) == full(other)
            && (full(self).is_none()
                || (self.environment == other.environment && self.agent == other.agent))
    }

    fn check(&self) -> Result<(), JobProblem> {
        self.limits.check_within(&Limits::default_maxima())?;
        if self.rl.steps > 0
            && let RlLoss::Builtin(loss) = &self.rl.loss
        {
            if *loss == LossName::StableReinforce {
                return Err(JobProblem::Settings(
                    "rl.loss: stable_reinforce takes its sampler logprobs from sequences recorded \
                     when sampling, which a job's rollouts do not record; use another loss"
                        .into(),
                ));
            }
            check_loss(loss.name(), &self.rl.loss_config)?;
        }
        self.check_settings().map_err(JobProblem::Settings)
    }

    fn check_settings(&self) -> Result<(), String> {
        let model = &self.model;
        let given = [
            model.dir.is_some(),
            model.init_tiny.is_some(),
            model.base.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err("model: give one of `dir`, `init_tiny` or `base`".into());
        }
        if self.rl.group_size == 0 || self.rl.groups_per_batch == 0 {
            return Err("rl: `group_size` and `groups_per_batch` must be at least 1".into());
        }
        self.check_sizes()?;
        if !(self.rl.max_failure_rate > 0.0 && self.rl.max_failure_rate <= 1.0) {
            return Err(format!(
                "rl.max_failure_rate: {} is not a fraction above 0 and at most 1",
                self.rl.max_failure_rate
            ));
        }
        let demonstrations = self.sft.as_ref().is_some_and(|s| s.jsonl().is_none());
        if self.environment.is_none() && (self.rl.steps > 0 || demonstrations) {
            return Err("environment: RL and demonstrations need an `[environment]`".into());
        }
        if !(self.rl.temperature >= 0.0 && self.rl.temperature.is_finite()) {
            return Err(format!(
                "rl.temperature: {} is not a finite number >= 0",
                self.rl.temperature
            ));
        }
        if !(self.rl.top_p > 0.0 && self.rl.top_p <= 1.0) {
            return Err(format!(
                "rl.top_p: {} is not a fraction above 0 and at most 1",
                self.rl.top_p
            ));
        }
        if !(self.rl.kl_coef >= 0.0 && self.rl.kl_coef.is_finite()) {
            return Err(format!(
                "rl.kl_coef: {} is not a finite number >= 0",
                self.rl.kl_coef
            ));
        }
        if self.rl.steps == 0 && self.sft.is_none() {
            return Err("the job trains nothing: give `[rl]` steps or an `[sft]` section".into());
        }
        self.check_policies()?;
        if let Some(sft) = &self.sft
            && !(0.0..1.0).contains(&sft.beta2)
        {
            return Err(format!(
                "sft.beta2: {} is not a decay at least 0 and below 1",
                sft.beta2
            ));
        }
        if let Some(sft) = &self.sft
            && sft.stop_rule() == StopRule::Plateau
        {
            if sft.held_out_size() == 0 {
                return Err(
                    "sft.stop = \"plateau\" watches the held-out loss: give `sft.held_out` \
                     conversations to hold out"
                        .into(),
                );
            }
            if sft.patience == 0 {
                return Err("sft.patience: a plateau stop waits at least 1 evaluation".into());
            }
        }
        Ok(())
    }
}

/// The most episodes one RL batch may play (`group_size x groups_per_batch`).
const MAX_EPISODES_PER_BATCH: usize = 1 << 16;
/// The most positions one episode may reserve (`(256 + max_tokens) x max_turns`).
const MAX_POSITIONS_PER_EPISODE: usize = 1 << 24;

impl Job {
    /// Refuse settings whose products size the job's memory and KV (admission, the sampler's
    /// budget) past what any machine holds, before anything multiplies them.
    fn check_sizes(&self) -> Result<(), String> {
        let rl = &self.rl;
        let episodes = rl
            .group_size
            .checked_mul(rl.groups_per_batch)
            .filter(|&n| n <= MAX_EPISODES_PER_BATCH);
        if episodes.is_none() {
            return Err(format!(
                "rl: group_size x groups_per_batch = {} x {} is more than \
                 {MAX_EPISODES_PER_BATCH} episodes a batch",
                rl.group_size, rl.groups_per_batch
            ));
        }
        let positions = rl
            .max_tokens
            .checked_add(256)
            .and_then(|n| n.checked_mul(rl.max_turns.max(1)))
            .filter(|&n| n <= MAX_POSITIONS_PER_EPISODE);
        if positions.is_none() {
            return Err(format!(
                "rl: (256 + max_tokens) x max_turns = (256 + {}) x {} is more than \
                 {MAX_POSITIONS_PER_EPISODE} positions an episode",
                rl.max_tokens, rl.max_turns
            ));
        }
        if self.eval.episodes > MAX_EPISODES_PER_BATCH {
            return Err(format!(
                "eval.episodes: {} is more than {MAX_EPISODES_PER_BATCH}",
                self.eval.episodes
            ));
        }
        Ok(())
    }

    fn check_policies(&self) -> Result<(), String> {
        if self.policies.is_empty() {
            return Ok(());
        }
        let mut seen_players = std::collections::BTreeSet::new();
        let mut seen_names = std::collections::BTreeSet::new();
        for policy in &self.policies {
            let name = &policy.name;
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid {
                return Err(format!(
                    "policies: name {name:?} must be letters, digits, '-' or '_'"
                ));
            }
            if !seen_names.insert(name.clone()) {
                return Err(format!("policies: {name:?} is named twice"));
            }
            if policy.players.is_empty() && self.policies.len() > 1 {
                return Err(format!("policies.{name}: name the `players` it controls"));
            }
            for player in &policy.players {
                if !seen_players.insert(*player) {
                    return Err(format!(
                        "policies.{name}: player {player} has another policy already"
                    ));
                }
            }
        }
        if !self.policies.iter().any(|p| p.trainable) {
            return Err("policies: none is trainable".into());
        }
        if self.policies.len() > 1 && self.sft.as_ref().is_some_and(|s| !s.full_parameters) {
            return Err(
                "sft.full_parameters: a job of several policies warms up the shared base".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Job, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, text).unwrap();
        Job::load(&path).map_err(|e| e.to_string())
    }

    const MINIMAL: &str = r#"
        [model]
        init_tiny = { seed = 1 }
        [environment]
        plugin = "plugins/arithmetic"
        config = { max_operand = 9 }
        [rl]
        steps = 3
    "#;

    #[test]
    fn settings_whose_products_would_wrap_are_refused_by_name() {
        let huge = i64::MAX;
        for (settings, named) in [
            (
                format!("group_size = {huge}\ngroups_per_batch = {huge}"),
                "group_size x groups_per_batch",
            ),
            (
                "group_size = 65536\ngroups_per_batch = 2".to_string(),
                "65536 x 2",
            ),
            (
                format!("max_tokens = {huge}"),
                "(256 + max_tokens) x max_turns",
            ),
            (
                "max_tokens = 4294967296\nmax_turns = 4294967296".to_string(),
                "(256 + 4294967296) x 4294967296",
            ),
        ] {
            let text = MINIMAL.replace("steps = 3", &format!("steps = 3\n{settings}"));
            let error = parse(&text).unwrap_err();
            assert!(error.contains(named), "{settings}: {error}");
        }
    }

    #[test]
    fn a_minimal_job_gets_defaults_and_its_config_as_json() {
        let job = parse(MINIMAL).unwrap();
        assert_eq!(job.rl.group_size, 8);
        assert_eq!(job.lora.rank, 16);
        let environment = job.environment.unwrap();
        assert_eq!(environment.config_json(), r#"{"max_operand":9}"#);
        assert!(environment.plugin.ends_with("plugins/arithmetic"));
    }

    #[test]
    fn a_misspelt_key_is_refused_by_name() {
        let err =
            parse(&MINIMAL.replace("steps = 3", "steps = 3\nlerning_rate = 0.1")).unwrap_err();
        assert!(err.contains("lerning_rate"), "{err}");
        let err = parse(&MINIMAL.replace("seed = 1", "seed = 1, shape = \"huge\"")).unwrap_err();
        assert!(
            err.contains("huge") && err.contains("qwen2.5-0.5b"),
            "{err}"
        );
        let err =
            parse(&MINIMAL.replace("steps = 3", "steps = 3\nestimator = \"ppo\"")).unwrap_err();
        assert!(
            err.contains("ppo") && err.contains("group_mean_std"),
            "{err}"
        );
        let err = parse(&MINIMAL.replace("steps = 3", "steps = 3\nmode = \"later\"")).unwrap_err();
        assert!(err.contains("later") && err.contains("async"), "{err}");
        let err =
            parse(&MINIMAL.replace("steps = 3", "steps = 3\nloss = \"reinforce\"")).unwrap_err();
        assert!(
            err.contains("reinforce") && err.contains("importance_sampling"),
            "{err}"
        );
    }

    #[test]
    fn plugin_limits_may_be_set_up_to_the_hosts_maxima() {
        let job = |limits: &str| parse(&format!("{MINIMAL}\n[limits]\n{limits}\n"));
        let read = job("max_turns = 5").unwrap();
        assert_eq!(read.limits.max_turns, 5);
        assert_eq!(read.limits.fuel, Limits::default().fuel);
        let err = job("fuel = 1_000_000_000_000_000").unwrap_err();
        assert!(err.contains("limits") && err.contains("fuel"), "{err}");
        let err = job("feul = 1").unwrap_err();
        assert!(err.contains("feul"), "{err}");
    }

    #[test]
    fn an_estimator_plugin_replaces_the_estimator_in_the_settings_a_run_writes() {
        let job = parse(&MINIMAL.replace(
            "steps = 3",
            "steps = 3\nadvantage = { plugin = \"rank.wasm\" }",
        ))
        .unwrap();
        let settings = job.settings();
        let rl = settings["rl"].as_table().unwrap();
        assert!(
            !rl.contains_key("estimator") && !rl.contains_key("gamma"),
            "{rl:?}"
        );
        assert!(rl.contains_key("advantage"), "{rl:?}");
        assert!(
            !job.defaults.iter().any(|d| d.starts_with("rl.estimator")),
            "{:?}",
            job.defaults
        );
    }

    #[test]
    fn a_loss_is_a_built_in_name_or_an_objective_plugin_and_a_wrong_one_is_named() {
        let job =
            |loss: &str| parse(&MINIMAL.replace("steps = 3", &format!("steps = 3\nloss = {loss}")));
        // Read as the other plugins are: relative to the job file.
        let read = job(r#"{ plugin = "ppo.wasm" }"#).unwrap();
        let RlLoss::Plugin(LossPlugin { plugin }) = &read.rl.loss else {
            panic!("{:?}", read.rl.loss);
        };
        assert!(
            plugin.is_absolute() && plugin.ends_with("ppo.wasm"),
            "{plugin:?}"
        );
        let err = job(r#""ppoo""#).unwrap_err();
        assert!(
            err.contains("ppoo") && err.contains("importance_sampling"),
            "{err}"
        );
        let err = job(r#"{ plugn = "ppo.wasm" }"#).unwrap_err();
        assert!(err.contains("plugn"), "{err}");
    }

    #[test]
    fn a_loss_config_is_checked_when_the_job_is_read() {
        let job = |config: &str| {
            parse(&MINIMAL.replace(
                "steps = 3",
                &format!("steps = 3\nloss = \"ppo\"\nloss_config = {{ {config} }}"),
            ))
        };
        let read = job("clip_low_threshold = 0.7").unwrap();
        assert_eq!(read.rl.loss, RlLoss::Builtin(LossName::Ppo));
        let err = job("clip_low_threshold = 0.7, clip_hihg_threshold = 1.3").unwrap_err();
        assert!(
            err.contains("rl.loss_config") && err.contains("clip_hihg_threshold"),
            "{err}"
        );
    }

    #[test]
    fn every_built_in_loss_but_stable_reinforce_is_a_job_s_loss() {
        let job = |loss: &str| {
            parse(&MINIMAL.replace("steps = 3", &format!("steps = 3\nloss = \"{loss}\"")))
        };
        for loss in LossName::ALL {
            match loss {
                // Dro needs its beta; the others run on their defaults.
                LossName::Dro => assert!(job(loss.name()).unwrap_err().contains("beta")),
                LossName::StableReinforce => {
                    let err = job(loss.name()).unwrap_err();
                    assert!(
                        err.contains("stable_reinforce") && err.contains("record"),
                        "{err}"
                    );
                }
                _ => assert_eq!(job(loss.name()).unwrap().rl.loss, RlLoss::Builtin(loss)),
            }
        }
    }

    #[test]
    fn sampling_settings_are_checked_when_the_job_is_read() {
        let job = |line: &str| parse(&MINIMAL.replace("steps = 3", &format!("steps = 3\n{line}")));
        assert_eq!(job("top_p = 0.9").unwrap().rl.top_p, 0.9);
        assert_eq!(parse(MINIMAL).unwrap().rl.top_p, 1.0);
        for (line, says) in [
            ("top_p = 0.0", "rl.top_p: 0"),
            ("top_p = 1.5", "rl.top_p: 1.5"),
            ("temperature = -1.0", "rl.temperature: -1"),
        ] {
            let err = job(line).unwrap_err();
            assert!(err.contains(says), "{line}: {err}");
        }
    }

    #[test]
    fn policies_are_checked_by_name() {
        let two = |x: &str, o: &str| {
            format!(
                "{MINIMAL}\n[[policies]]\nname = \"x\"\nplayers = [{x}]\n\
                 [[policies]]\nname = \"o\"\nplayers = [{o}]\ntrainable = false\n"
            )
        };
        let job = parse(&two("0", "1")).unwrap();
        let policies = job.policies();
        assert_eq!(policies.len(), 2);
        assert!(policies[0].controls(0) && !policies[0].controls(1));
        assert!(!policies[1].trainable);
        let err = parse(&two("0", "0")).unwrap_err();
        assert!(
            err.contains("policies.o") && err.contains("player 0"),
            "{err}"
        );
        let err = parse(&two("0", "").replace("players = []\n", "")).unwrap_err();
        assert!(
            err.contains("policies.o") && err.contains("players"),
            "{err}"
        );
        assert_eq!(parse(MINIMAL).unwrap().policies()[0].name, "policy");
    }

    #[test]
    fn an_sft_job_needs_no_environment_but_rl_does() {
        let sft = r#"
            [model]
            init_tiny = { seed = 1 }
            [sft]
            source = "data/chat.jsonl"
            steps = 4
            held_out = 2
        "#;
        let job = parse(sft).unwrap();
        assert_eq!(job.rl.steps, 0);
        let source = job.sft.unwrap();
        assert!(source.jsonl().unwrap().ends_with("data/chat.jsonl"));
        assert!(source.jsonl().unwrap().is_absolute());
        let err = parse(&format!("{sft}\n[rl]\nsteps = 2")).unwrap_err();
        assert!(err.contains("[environment]"), "{err}");
        let err = parse(&sft.replace("data/chat.jsonl", "demonstrations")).unwrap_err();
        assert!(err.contains("[environment]"), "{err}");
        let nothing = "[model]\ninit_tiny = { seed = 1 }\n";
        assert!(parse(nothing).unwrap_err().contains("trains nothing"));
    }

    #[test]
    fn a_warm_up_runs_its_steps_unless_told_to_stop_at_a_plateau() {
        let job = |sft: &str| format!("{MINIMAL}\n[sft]\n{sft}\n");
        let read = |sft: &str| parse(&job(sft)).map(|j| j.sft.unwrap());
        let steps = read("source = \"demonstrations\"\nsteps = 50").unwrap();
        assert_eq!(
            (
                steps.stop_rule(),
                steps.held_out_size(),
                steps.eval_interval()
            ),
            (StopRule::Steps, 0, 0)
        );
        let plateau = "source = \"demonstrations\"\nsteps = 50\nstop = \"plateau\"";
        let demos = read(plateau).unwrap();
        assert_eq!(demos.stop_rule(), StopRule::Plateau);
        assert_eq!(
            (demos.held_out_size(), demos.eval_interval(), demos.patience),
            (PLATEAU_HELD_OUT, PLATEAU_EVAL_EVERY, 3)
        );
        let given = read(&format!("{plateau}\nheld_out = 4\neval_every = 2")).unwrap();
        assert_eq!((given.held_out_size(), given.eval_interval()), (4, 2));
        // A plateau on a file needs conversations held out.
        let file = read("source = \"chat.jsonl\"\nsteps = 5").unwrap();
        assert_eq!(file.stop_rule(), StopRule::Steps);
        let err = read("source = \"chat.jsonl\"\nsteps = 5\nstop = \"plateau\"").unwrap_err();
        assert!(err.contains("sft.held_out"), "{err}");
        let err = read(&format!("{plateau}\npatience = 0")).unwrap_err();
        assert!(err.contains("sft.patience"), "{err}");
        let err = read("source = \"demonstrations\"\nsteps = 5\nstop = \"early\"").unwrap_err();
        assert!(err.contains("plateau") && err.contains("steps"), "{err}");
    }

    #[test]
    fn a_warm_up_steps_adam_with_its_own_beta2() {
        let read = |sft: &str| parse(&format!("{MINIMAL}\n[sft]\n{sft}\n")).map(|j| j.sft.unwrap());
        let default = read("source = \"demonstrations\"\nsteps = 10").unwrap();
        let adam = default.adam(3);
        assert_eq!((adam.beta2, adam.learning_rate), (0.999, 1e-3));
        assert_eq!(adam.grad_clip_norm, 1.0);
        let given = read("source = \"demonstrations\"\nsteps = 10\nbeta2 = 0.95").unwrap();
        assert_eq!(given.adam(0).beta2, 0.95);
        for bad in ["1.0", "-0.1"] {
            let err = read(&format!(
                "source = \"demonstrations\"\nsteps = 10\nbeta2 = {bad}"
            ))
            .unwrap_err();
            assert!(err.contains("sft.beta2"), "{err}");
        }
    }

    #[test]
    fn a_job_of_a_model_and_an_environment_trains_rl_with_defaults_it_names() {
        let bare = "[model]\ninit_tiny = { seed = 1 }\n[environment]\nplugin = \"p\"\n";
        let job = parse(bare).unwrap();
        assert_eq!(job.rl.steps, DEFAULT_RL_STEPS);
        assert!(
            job.defaults
                .contains(&format!("rl.steps = {DEFAULT_RL_STEPS}")),
            "{:?}",
            job.defaults
        );
        assert!(
            job.defaults.contains(&"lora.rank = 16".to_string()),
            "{:?}",
            job.defaults
        );
        assert!(
            job.defaults
                .contains(&"rl.loss = \"importance_sampling\"".to_string())
        );
        // Naming only the model and the plugins implies the warm-up on demonstrations too.
        let warmup = job.sft.as_ref().expect("no implied warm-up");
        assert!(warmup.implied && warmup.source == SftSource::Demonstrations);
        assert_eq!(warmup.steps, DEFAULT_WARMUP_STEPS);
        assert!(
            job.defaults
                .contains(&format!("sft.steps = {DEFAULT_WARMUP_STEPS}")),
            "{:?}",
            job.defaults
        );
        // What the file gives is not a default; `rl.steps = 0` is an SFT job.
        let given = parse(&format!("{bare}[rl]\nsteps = 5\ngroup_size = 4\n")).unwrap();
        assert_eq!(given.rl.steps, 5);
        assert!(
            given.sft.is_none(),
            "a file that writes [rl] chose no warm-up"
        );
        assert!(
            given
                .defaults
                .iter()
                .all(|d| !d.starts_with("rl.steps") && !d.starts_with("rl.group_size"))
        );
        assert!(
            given
                .defaults
                .contains(&"rl.groups_per_batch = 8".to_string())
        );
        let sft = "[sft]\nsource = \"demonstrations\"\nsteps = 5\n[rl]\nsteps = 0\n";
        assert_eq!(parse(&format!("{bare}{sft}")).unwrap().rl.steps, 0);
        // The settings a run writes: every section, no path of the machine.
        let settings = parse(&format!("{bare}{sft}")).unwrap().settings();
        let sections: Vec<&str> = settings.keys().map(String::as_str).collect();
        assert_eq!(sections, ["checkpoint", "eval", "lora", "rl", "sft"]);
        assert!(!settings["sft"].as_table().unwrap().contains_key("source"));
        assert_eq!(settings["sft"]["stop"].as_str(), Some("steps"));
        assert!(
            !settings["rl"]
                .as_table()
                .unwrap()
                .contains_key("kl_reference")
        );
    }

    #[test]
    fn a_warm_up_rate_is_constant_unless_it_falls_linearly_to_zero() {
        let sft = "[model]\ninit_tiny = { seed = 1 }\n[sft]\nsource = \"chat.jsonl\"\nsteps = 4\n";
        let read = parse(sft).unwrap().sft.unwrap();
        assert_eq!(read.schedule, LrSchedule::Constant);
        assert_eq!(read.schedule.rate(1.0, 3, 4), 1.0);
        let linear = parse(&format!("{sft}schedule = \"linear\"\n")).unwrap();
        let linear = linear.sft.unwrap().schedule;
        let rates: Vec<f64> = (0..4).map(|s| linear.rate(1.0, s, 4)).collect();
        assert_eq!(rates, [1.0, 0.75, 0.5, 0.25]);
        let err = parse(&format!("{sft}schedule = \"cosine\"\n")).unwrap_err();
        assert!(err.contains("cosine") && err.contains("linear"), "{err}");
    }
}
