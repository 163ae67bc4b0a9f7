//! What every episode of a job shares (its plugins, the model's renderer), and the steps built on
//! it: playing batches of episodes and greedy evaluation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::diagnosis::action_digests;
use super::job::{Job, RlLoss};
use super::metrics::{Evaluation, StepMetrics, Warmup, errors, mean, metrics_of};
use super::render::Renderer;
use super::rollout::{Actor, EpisodeOutcome, Rollout};
use super::rollouts::Queue;
use super::run_folder::{Cursor, MetricsLog, RunFolder};
use crate::api::SamplingParams;
use crate::client::{ModelText, ServiceClient};
use crate::plugin::{Limits, Plugin, PluginHost, PluginKind};

/// A base model served once for every job that trains on it (after the warm-up): one
/// service whose sampler batches all their adapters and whose training loop fuses their steps.
pub(super) struct SharedBase {
    pub(super) info: Arc<ModelInfo>,
    pub(super) service: Arc<dyn ServiceClient>,
    /// The queue whose workers play the jobs' groups; `None`: this process plays them.
    pub(super) queue: Option<Queue>,
}

/// One job of a `train` command: its name (the job file's stem), the file, and output folder.
pub struct JobRun {
    pub name: String,
    pub file: PathBuf,
    pub job: Arc<Job>,
    pub out: PathBuf,
}

/// Where a job starts training: its run folder, its metrics log (holding the lines kept so
/// far) and the checkpoint it continues from.
pub(super) struct JobStart {
    pub(super) index: usize,
    pub(super) run: JobRun,
    pub(super) folder: RunFolder,
    pub(super) log: MetricsLog,
    pub(super) checkpoint: Option<(PathBuf, Cursor)>,
    /// What the full-parameter warm-up that made the base did, when one did in this run.
    pub(super) warmup: Option<Warmup>,
    pub(super) plugins: JobPlugins,
}

/// Evaluation seeds start here; training seeds stay below.
const EVAL_SEEDS: u64 = 1 << 40;

/// What a base model offers every job on it besides its weights.
pub(super) struct ModelInfo {
    pub(super) renderer: Renderer,
    pub(super) context: usize,
}

impl ModelInfo {
    /// A base model that renders with `text` and holds `context` tokens.
    pub(super) fn of(text: ModelText, context: usize) -> anyhow::Result<Self> {
        let template = text
            .chat_template
            .context("the model has no chat template")?;
        Ok(ModelInfo {
            renderer: Renderer::new(template, text.tokenizer)?,
            context,
        })
    }
}

/// What every episode of a job shares.
pub(super) struct JobContext {
    /// `None` for an SFT job on a file.
    pub(super) environment: Option<Plugin>,
    pub(super) agent: Option<Plugin>,
    pub(super) reward: Option<Plugin>,
    pub(super) config: String,
    /// The agent's and the reward's configs (JSON; `{}` when the job gives none).
    pub(super) agent_config: String,
    pub(super) reward_config: String,
    /// The advantage estimator plugin and its config, in place of `rl.estimator`.
    pub(super) advantage: Option<(Plugin, String)>,
    /// The objective plugin that is the RL loss, in place of a built-in one.
    pub(super) loss: Option<Plugin>,
    pub(super) limits: Limits,
    pub(super) model: Arc<ModelInfo>,
}

/// A job's plugins, loaded and checked to be of the kind their section names.
#[derive(Clone)]
pub(super) struct JobPlugins {
    environment: Option<Plugin>,
    agent: Option<Plugin>,
    reward: Option<Plugin>,
    advantage: Option<Plugin>,
    loss: Option<Plugin>,
}

impl JobPlugins {
    /// Read each component the job names, compile it, and check it implements its section's
    /// kind and that the section's config fits the schema the plugin declares: what a job can
    /// have wrong in its plugins is found before any model is generated or loaded. The driver runs components only: building a plugin from its source is the CLI's
    /// (`Job::plugin_paths_mut`). `name` names the job in errors.
    pub(super) async fn load(host: &PluginHost, job: &Job, name: &str) -> anyhow::Result<Self> {
        let load = async |section: &str,
                          wasm: &Path,
                          kind: PluginKind,
                          config: String|
               -> anyhow::Result<Plugin> {
            anyhow::ensure!(
                !wasm.is_dir(),
                "job `{name}`: [{section}] plugin {} is a source folder: build it into a \
                 component first (`opentinker plugin build`; `train`, `play` and `replay` do)",
                wasm.display()
            );
            let plugin = host
                .load_file(wasm)
                .await
                .with_context(|| format!("job `{name}`: [{section}] plugin {}", wasm.display()))?;
            let kinds = &plugin.description().kinds;
            anyhow::ensure!(
                kinds.contains(&kind),
                "job `{name}`: [{section}] plugin {} is not {} plugin (it implements: {})",
                wasm.display(),
                kind.with_article(),
                kinds
                    .iter()
                    .map(|k| format!("{k:?}").to_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            plugin
                .check_config(&config, &job.limits)
                .await
                .with_context(|| format!("job `{name}`: [{section}] config {config}"))?;
            Ok(plugin)
        };
        let environment = match &job.environment {
            Some(section) => {
                let config = section.config_json();
                Some(
                    load(
                        "environment",
                        &section.plugin,
                        PluginKind::Environment,
                        config,
                    )
                    .await?,
                )
            }
            None => None,
        };
        if let Some(environment) = &environment {
            for policy in job.policies() {
                if let Some(config) = policy.eval_config_json() {
                    environment
                        .check_config(&config, &job.limits)
                        .await
                        .with_context(|| {
                            format!(
                                "job `{name}`: policies.{} eval_config {config}",
                                policy.name
                            )
                        })?;
                }
            }
        }
        let agent = match &job.agent {
            Some(section) => {
                let config = section.config_json();
                Some(load("agent", &section.plugin, PluginKind::Agent, config).await?)
            }
            None => None,
        };
        let reward = match &job.reward {
            Some(section) => {
                let config = section.config_json();
                Some(load("reward", &section.plugin, PluginKind::Reward, config).await?)
            }
            None => None,
        };
        let advantage = match &job.rl.advantage {
            Some(section) => {
                let config = section.config_json();
                Some(
                    load(
                        "rl.advantage",
                        &section.plugin,
                        PluginKind::Advantage,
                        config,
                    )
                    .await?,
                )
            }
            None => None,
        };
        let loss = match &job.rl.loss {
            RlLoss::Plugin(section) => {
                let config = serde_json::to_string(&job.rl.loss_config)?;
                Some(load("rl.loss", &section.plugin, PluginKind::Objective, config).await?)
            }
            RlLoss::Builtin(_) => None,
        };
        Ok(JobPlugins {
            environment,
            agent,
            reward,
            advantage,
            loss,
        })
    }
}

impl JobContext {
    pub(super) fn environment(&self) -> anyhow::Result<&Plugin> {
        self.environment
            .as_ref()
            .context("the job has no [environment] to play")
    }

    /// The context of `job` with its (checked) plugins on a base model.
    pub(super) fn new(plugins: JobPlugins, job: &Job, model: Arc<ModelInfo>) -> Self {
        JobContext {
            environment: plugins.environment,
            agent: plugins.agent,
            reward: plugins.reward,
            config: job
                .environment
                .as_ref()
                .map(|e| e.config_json())
                .unwrap_or_default(),
            agent_config: job
                .agent
                .as_ref()
                .map_or_else(|| "{}".into(), |a| a.config_json()),
            reward_config: job
                .reward
                .as_ref()
                .map_or_else(|| "{}".into(), |r| r.config_json()),
            advantage: plugins
                .advantage
                .zip(job.rl.advantage.as_ref().map(|a| a.config_json())),
            loss: plugins.loss,
            limits: job.limits.clone(),
            model,
        }
    }
}

/// Told every metrics line, with the name of the job it belongs to.
pub type Progress = Arc<dyn Fn(&str, &StepMetrics) + Send + Sync>;

/// Where metric lines go: the log files (a shared warm-up writes into every job's) and the
/// progress display.
pub(super) struct Reporter {
    pub(super) name: String,
    pub(super) logs: Vec<MetricsLog>,
    pub(super) progress: Progress,
}

impl Reporter {
    pub(super) fn line(&mut self, line: &StepMetrics) -> anyhow::Result<()> {
        (self.progress)(&self.name, line);
        self.logs.iter_mut().try_for_each(|log| log.append(line))
    }

    pub(super) fn lines(&self) -> usize {
        self.logs.first().map_or(0, MetricsLog::lines)
    }
}

pub(super) fn sampling_params(job: &Job) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(job.rl.max_tokens),
        temperature: job.rl.temperature,
        top_p: job.rl.top_p,
        stop: None,
        ..SamplingParams::default()
    }
}

pub(super) fn rollout<'a>(
    cx: &'a JobContext,
    job: &Job,
    config: &'a str,
    params: SamplingParams,
) -> anyhow::Result<Rollout<'a>> {
    Ok(Rollout {
        environment: cx.environment()?,
        config,
        agent: cx.agent.as_ref(),
        agent_config: &cx.agent_config,
        reward: cx
            .reward
            .as_ref()
            .zip(job.reward.as_ref().map(|r| r.weight)),
        reward_config: &cx.reward_config,
        limits: &cx.limits,
        renderer: &cx.model.renderer,
        params,
        max_turns: job.rl.max_turns,
        context: cx.model.context,
        failure_reward: job.rl.failure_reward,
    })
}

/// Play one episode per seed of the environment under `config`, each with a task generated from
/// its seed; player p acts as `actors[p]`.
pub(super) async fn play_batch(
    cx: &JobContext,
    job: &Job,
    config: &str,
    seeds: &[u64],
    actors: &[Actor],
    params: Option<SamplingParams>,
) -> anyhow::Result<Vec<EpisodeOutcome>> {
    let rollout = rollout(
        cx,
        job,
        config,
        params.unwrap_or_else(|| sampling_params(job)),
    )?;
    // A seed whose task cannot be generated is a failed episode, not a failed evaluation.
    let mut tasks = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        tasks.push(
            cx.environment()?
                .generate_task(config, seed, &cx.limits)
                .await,
        );
    }
    let rollout = &rollout;
    Ok(
        futures::future::join_all(seeds.iter().zip(&tasks).map(|(&seed, task)| async move {
            match task {
                Ok(task) => rollout.play(task, seed, actors).await,
                Err(error) => EpisodeOutcome::failed_to_start(seed, error),
            }
        }))
        .await,
    )
}

/// The seeds of an evaluation of `episodes` episodes.
pub(super) fn eval_seeds(episodes: usize) -> Vec<u64> {
    (0..episodes as u64).map(|i| EVAL_SEEDS + i).collect()
}

/// The job's sampling parameters at temperature 0: how evaluations play.
pub(super) fn greedy_params(job: &Job) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..sampling_params(job)
    }
}

/// Greedy play on the evaluation seeds of the environment under `config`, scored by the return
/// of `player` (success: a positive return).
pub(super) async fn evaluate(
    cx: &JobContext,
    job: &Job,
    config: &str,
    actors: &[Actor],
    player: usize,
) -> anyhow::Result<Evaluation> {
    let seeds = eval_seeds(job.eval.episodes);
    let outcomes = play_batch(cx, job, config, &seeds, actors, Some(greedy_params(job))).await?;
    Ok(summarize(&outcomes, player))
}

/// An evaluation's figures of played episodes, scored by the return of `player`.
pub(super) fn summarize(outcomes: &[EpisodeOutcome], player: usize) -> Evaluation {
    let metrics = metrics_of(&outcomes.iter().collect::<Vec<_>>());
    let returns: Vec<f64> = outcomes
        .iter()
        .map(|o| o.returns().get(player).copied().unwrap_or(0.0))
        .collect();
    Evaluation {
        episodes: outcomes.len(),
        reward_mean: mean(returns.iter().copied()),
        success_rate: mean(returns.iter().map(|r| f64::from(u8::from(*r > 0.0)))),
        episode_steps: mean(outcomes.iter().map(|o| o.steps as f64)),
        metrics,
        errors: errors(outcomes),
        loss: None,
        actions: action_digests(outcomes, player),
    }
}
