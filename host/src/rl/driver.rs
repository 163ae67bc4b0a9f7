//! The job driver of `opentinker train`, sync mode: sample a batch of groups with the current
//! policy version, score them, turn them into datums with group advantages, train one step,
//! publish the next version. Optional warm-up on the environment's demonstrations first; greedy
//! evaluation on seeds disjoint from training's before, every N steps, and after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::advantage::{Estimator, GroupReturns, advantages};
use super::datum::{rl_datum, sft_datum};
use super::job::{Job, WarmupSection};
use super::render::Renderer;
use super::rollout::{Actor, EpisodeOutcome, Rollout, RolloutRecord};
use super::run_folder::{Cursor, MetricsLog, RunFolder};
use super::transcript::TokenSequence;
use crate::lora::{AdapterRegistry, PolicyVersion};
use crate::model::tiny::init_tiny;
use crate::model::{Model, Transformer};
use crate::plugin::{HostConfig, Limits, Plugin, PluginHost};
use crate::sample::{EngineConfig, PolicyRef, SamplingEngine, SamplingParams};
use crate::sched::SamplerService;
use crate::train::{AdamParams, Datum, FULL_PARAMETERS, Loss, TrainingEngine, WorkItem};

/// The adapter a single-policy job trains.
const POLICY: &str = "policy";
/// Evaluation seeds start here; training seeds stay below.
const EVAL_SEEDS: u64 = 1 << 40;

/// One line of `metrics.jsonl`.
#[derive(Debug, Default, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    pub phase: &'static str,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub episode_steps: f64,
    pub tokens: usize,
    pub loss: f64,
    pub groups_trained: usize,
    pub errors: BTreeMap<String, usize>,
    pub env_metrics: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<Evaluation>,
    pub seconds: f64,
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
}

/// What `train --json` prints.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub steps: usize,
    pub initial_eval: Evaluation,
    pub final_eval: Evaluation,
    pub checkpoint: PathBuf,
    pub out: PathBuf,
}

/// What every episode of the job shares.
struct JobContext {
    environment: Plugin,
    agent: Option<Plugin>,
    config: String,
    limits: Limits,
    renderer: Renderer,
    sampler: Option<SamplerService>,
    context: usize,
}

/// Where metric lines go: the log file and the caller's progress display.
struct Reporter<'a> {
    log: MetricsLog,
    progress: &'a dyn Fn(&StepMetrics),
}

impl Reporter<'_> {
    fn line(&mut self, line: &StepMetrics) -> anyhow::Result<()> {
        (self.progress)(line);
        self.log.append(line)
    }
}

/// Run `job` with its outputs in `out`, continuing from the last checkpoint there when
/// `resume`; `progress` is told each metrics line.
pub async fn run(
    job: &Job,
    out: &Path,
    resume: bool,
    progress: &dyn Fn(&StepMetrics),
) -> anyhow::Result<Summary> {
    anyhow::ensure!(
        !resume || out.is_dir(),
        "--resume {}: no such run folder",
        out.display()
    );
    let folder = RunFolder::create(out)?;
    let model_dir = model_dir(job, out)?;
    let Model {
        config,
        transformer,
        tokenizer,
        chat_template,
        ..
    } = Model::load(&model_dir)?;
    let template = chat_template.context("the model has no chat template")?;
    let renderer = Renderer::new(template, Arc::new(tokenizer))?;
    let context = transformer.context_length();
    let host = PluginHost::new(HostConfig::default())?;
    let load = async |path: &Path| -> anyhow::Result<Plugin> {
        let wasm = crate::plugin::build::component_path(path)?;
        Ok(host.load_file(&wasm).await?)
    };
    let environment = load(&job.environment.plugin).await?;
    let agent = match &job.agent {
        Some(section) => Some(load(&section.plugin).await?),
        None => None,
    };
    let mut cx = JobContext {
        environment,
        agent,
        config: job.environment.config_json(),
        limits: Limits::default(),
        renderer,
        sampler: None,
        context,
    };

    // A full-parameter warm-up trains the model itself, which then becomes the shared base
    // (saved as `base/`, so a resumed run does not warm up again).
    let full_warmup = job.warmup.as_ref().filter(|w| w.full_parameters);
    let saved_base = if resume && full_warmup.is_some() {
        folder.saved_base()?
    } else {
        None
    };
    let checkpoint = match resume {
        true => folder
            .latest_checkpoint()?
            .filter(|_| full_warmup.is_none() || saved_base.is_some()),
        false => None,
    };
    let covered = checkpoint.as_ref().map(|(_, c)| c.metric_lines);
    let (transformer, base_dir, log) = match (full_warmup, saved_base) {
        (Some(_), Some(base_lines)) => {
            let base_dir = folder.base_dir();
            let model = Transformer::load(config.clone(), &base_dir)?;
            (
                model,
                base_dir,
                folder.metrics(covered.unwrap_or(base_lines))?,
            )
        }
        (Some(warmup), None) => {
            let mut reporter = Reporter {
                log: folder.metrics(0)?,
                progress,
            };
            let mut warm = TrainingEngine::full_parameters(transformer, DType::F32)?;
            run_warmup(&cx, job, warmup, &mut warm, FULL_PARAMETERS, &mut reporter).await?;
            let model = warm.model_snapshot()?;
            folder.save_base(&model, &model_dir, reporter.log.lines())?;
            (model, folder.base_dir(), reporter.log)
        }
        (None, _) => (
            transformer,
            model_dir,
            folder.metrics(covered.unwrap_or(0))?,
        ),
    };
    let mut reporter = Reporter { log, progress };
    let base_name = base_dir.display().to_string();
    let registry = AdapterRegistry::new(Arc::new(transformer));
    let mut trainer = TrainingEngine::new(Arc::clone(registry.base()), DType::F32);
    match &checkpoint {
        Some((dir, _)) => trainer.load_adapter(POLICY, &dir.join(POLICY), true)?,
        None => {
            trainer.add_adapter(POLICY, job.lora.clone())?;
            if let Some(warmup) = job.warmup.as_ref().filter(|w| !w.full_parameters) {
                run_warmup(&cx, job, warmup, &mut trainer, POLICY, &mut reporter).await?;
            }
        }
    }
    let concurrency = job.rl.group_size * job.rl.groups_per_batch.max(1);
    let per_episode = (256 + job.rl.max_tokens) * job.rl.max_turns.max(1);
    let engine = SamplingEngine::new(
        Arc::clone(&registry),
        Some(Arc::clone(cx.renderer.tokenizer())),
        config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions: concurrency.max(job.eval.episodes) * per_episode.min(context),
            prefix_cache_positions: 0,
        },
    );
    let (sampler, _thread) = SamplerService::start(engine);
    cx.sampler = Some(sampler);
    let loss = Loss::from_config(&job.rl.loss, &job.rl.loss_config)?;
    let estimator = job.rl.estimator().map_err(anyhow::Error::msg)?;
    let publish = |trainer: &TrainingEngine| -> anyhow::Result<Arc<PolicyVersion>> {
        let adapter = trainer.adapter(POLICY).context("the policy adapter")?;
        Ok(registry.publish(POLICY, adapter)?)
    };
    let mut version = publish(&trainer)?;

    let (start, initial_eval, mut last_eval) = match checkpoint {
        Some((_, cursor)) => (cursor.steps, cursor.initial_eval, cursor.last_eval),
        None => {
            let eval = evaluate(&cx, job, &version).await?;
            (0, eval.clone(), eval)
        }
    };
    for step in start..job.rl.steps {
        let started = Instant::now();
        let played = play_step(&cx, job, step, &version).await?;
        let (datums, records, groups_trained) = datums_of(&played, job, estimator);
        let (loss_value, tokens) = train_step(
            &mut trainer,
            POLICY,
            datums,
            loss.clone(),
            job.rl.learning_rate,
        )?;
        version = publish(&trainer)?;
        folder.write_rollouts(step, &records)?;
        let last = step + 1 == job.rl.steps;
        let eval = if last || (job.eval.every > 0 && (step + 1) % job.eval.every == 0) {
            last_eval = evaluate(&cx, job, &version).await?;
            Some(last_eval.clone())
        } else {
            None
        };
        let all: Vec<&EpisodeOutcome> = played.iter().map(|(_, _, o)| o).collect();
        let rewards: Vec<f64> = all
            .iter()
            .map(|o| o.returns().first().copied().unwrap_or(0.0))
            .collect();
        reporter.line(&StepMetrics {
            step,
            phase: "rl",
            reward_mean: mean(rewards.iter().copied()),
            reward_std: std(&rewards),
            episode_steps: mean(all.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            groups_trained,
            errors: errors_of(&all),
            env_metrics: metrics_of(&all),
            eval,
            seconds: started.elapsed().as_secs_f64(),
        })?;
        let every = job.checkpoint.every;
        if last || (every > 0 && (step + 1) % every == 0) {
            let cursor = Cursor {
                steps: step + 1,
                metric_lines: reporter.log.lines(),
                initial_eval: initial_eval.clone(),
                last_eval: last_eval.clone(),
            };
            folder.save_checkpoint(&cursor, |temp| {
                Ok(trainer.save_adapter(POLICY, &temp.join(POLICY), &base_name, true)?)
            })?;
        }
    }
    let checkpoint = folder.checkpoint_dir("final");
    trainer.save_adapter(POLICY, &checkpoint, &base_name, true)?;
    Ok(Summary {
        steps: job.rl.steps,
        initial_eval,
        final_eval: last_eval,
        checkpoint,
        out: out.to_path_buf(),
    })
}

/// The job's model directory; a tiny model is generated into the run's folder once.
fn model_dir(job: &Job, out: &Path) -> anyhow::Result<PathBuf> {
    match (&job.model.dir, &job.model.init_tiny) {
        (Some(dir), _) => Ok(dir.clone()),
        (None, Some(tiny)) => {
            let dir = out.join("model");
            if !dir.join("config.json").is_file() {
                init_tiny(
                    &dir,
                    tiny.shape().map_err(anyhow::Error::msg)?,
                    tiny.arch().map_err(anyhow::Error::msg)?,
                    tiny.seed,
                )?;
            }
            Ok(dir)
        }
        (None, None) => anyhow::bail!("the job names no model"),
    }
}

/// Play RL step `step`'s groups with `version`: group g plays one task (seeded by the job's seed,
/// the step and g) `group_size` times. Returns (group, index in group, outcome) in that order.
async fn play_step(
    cx: &JobContext,
    job: &Job,
    step: usize,
    version: &PolicyVersion,
) -> anyhow::Result<Vec<(usize, usize, EpisodeOutcome)>> {
    let policy = Actor::Policy(Some(PolicyRef {
        name: version.name.clone(),
        version: Some(version.version),
    }));
    let (groups, size) = (job.rl.groups_per_batch, job.rl.group_size);
    let task_seeds: Vec<u64> = (0..groups as u64)
        .map(|g| job.rl.seed.wrapping_mul(1_000_003) + (step * groups) as u64 + g)
        .collect();
    let mut tasks = Vec::with_capacity(groups);
    for &seed in &task_seeds {
        tasks.push(
            cx.environment
                .generate_task(&cx.config, seed, &cx.limits)
                .await?,
        );
    }
    let rollout = rollout(cx, job, sampling_params(job));
    let actors = [policy];
    let episodes = tasks.iter().enumerate().flat_map(|(g, task)| {
        let seed = task_seeds[g];
        (0..size).map(move |i| (g, i, task, seed * 1000 + i as u64))
    });
    Ok(
        futures::future::join_all(episodes.map(|(g, i, task, seed)| {
            let (rollout, actors) = (&rollout, &actors);
            async move { (g, i, rollout.play(task, seed, actors).await) }
        }))
        .await,
    )
}

/// Group advantages and the datums of the played episodes (in group and index order), with the
/// records of the rollout file, and the number of groups that were not skipped.
fn datums_of(
    played: &[(usize, usize, EpisodeOutcome)],
    job: &Job,
    estimator: Estimator,
) -> (Vec<Datum>, Vec<RolloutRecord>, usize) {
    let mut datums = Vec::new();
    let mut records = Vec::new();
    let mut groups_trained = 0;
    for g in 0..job.rl.groups_per_batch {
        let group: Vec<&(usize, usize, EpisodeOutcome)> =
            played.iter().filter(|(i, _, _)| *i == g).collect();
        let returns = GroupReturns {
            turn_rewards: group
                .iter()
                .map(|(_, _, o)| o.turn_rewards.first().cloned().unwrap_or_default())
                .collect(),
        };
        let advantage = advantages(&returns, estimator, job.rl.skip_equal_groups);
        groups_trained += usize::from(advantage.is_some());
        for (n, (group, index, outcome)) in group.iter().enumerate() {
            let per_turn: &[f64] = advantage.as_ref().map_or(&[], |a| &a[n]);
            let turn_advantage = |turn: usize| per_turn.get(turn).copied().unwrap_or(0.0) as f32;
            let sequences: Vec<TokenSequence> = match outcome.transcripts.first() {
                Some(Some(transcript)) => transcript.clone().into_sequences(),
                _ => Vec::new(),
            };
            if advantage.is_some() {
                for sequence in &sequences {
                    datums.extend(rl_datum(sequence, turn_advantage));
                }
            }
            records.push(RolloutRecord::new(
                *group,
                *index,
                outcome,
                &[(0, sequences)],
                turn_advantage,
            ));
        }
    }
    (datums, records, groups_trained)
}

fn sampling_params(job: &Job) -> SamplingParams {
    SamplingParams {
        max_tokens: job.rl.max_tokens,
        temperature: job.rl.temperature,
        stop: None,
        ..SamplingParams::default()
    }
}

fn rollout<'a>(cx: &'a JobContext, job: &Job, params: SamplingParams) -> Rollout<'a> {
    Rollout {
        environment: &cx.environment,
        config: &cx.config,
        agent: cx.agent.as_ref(),
        limits: &cx.limits,
        renderer: &cx.renderer,
        sampler: cx.sampler.as_ref(),
        params,
        max_turns: job.rl.max_turns,
        context: cx.context,
        failure_reward: job.rl.failure_reward,
    }
}

/// Play one episode per seed, each with a task the environment generates from its seed.
async fn play_batch(
    cx: &JobContext,
    job: &Job,
    seeds: &[u64],
    actor: &Actor,
    params: Option<SamplingParams>,
) -> anyhow::Result<Vec<EpisodeOutcome>> {
    let rollout = rollout(cx, job, params.unwrap_or_else(|| sampling_params(job)));
    let mut tasks = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        tasks.push(
            cx.environment
                .generate_task(&cx.config, seed, &cx.limits)
                .await?,
        );
    }
    let actors = [actor.clone()];
    Ok(futures::future::join_all(
        seeds
            .iter()
            .zip(&tasks)
            .map(|(&seed, task)| rollout.play(task, seed, &actors)),
    )
    .await)
}

async fn evaluate(
    cx: &JobContext,
    job: &Job,
    version: &Arc<PolicyVersion>,
) -> anyhow::Result<Evaluation> {
    let seeds: Vec<u64> = (0..job.eval.episodes as u64)
        .map(|i| EVAL_SEEDS + i)
        .collect();
    let greedy = SamplingParams {
        temperature: 0.0,
        ..sampling_params(job)
    };
    let actor = Actor::Policy(Some(PolicyRef {
        name: version.name.clone(),
        version: Some(version.version),
    }));
    let outcomes = play_batch(cx, job, &seeds, &actor, Some(greedy)).await?;
    let metrics = metrics_of(&outcomes.iter().collect::<Vec<_>>());
    Ok(Evaluation {
        episodes: outcomes.len(),
        reward_mean: mean(
            outcomes
                .iter()
                .map(|o| o.returns().first().copied().unwrap_or(0.0)),
        ),
        success_rate: mean(outcomes.iter().map(|o| {
            let won = o.returns().first().is_some_and(|r| *r > 0.0);
            f64::from(u8::from(won))
        })),
        episode_steps: mean(outcomes.iter().map(|o| o.steps as f64)),
        metrics,
    })
}

/// One forward_backward + optim_step on `datums`; returns the loss per counted token and the
/// counted tokens.
fn train_step(
    trainer: &mut TrainingEngine,
    id: &str,
    datums: Vec<Datum>,
    loss: Loss,
    learning_rate: f64,
) -> anyhow::Result<(f64, usize)> {
    if datums.is_empty() {
        return Ok((0.0, 0));
    }
    let outputs = trainer.forward_backward(&[WorkItem {
        adapter: id.into(),
        datums,
        loss,
    }])?;
    let tokens = outputs
        .iter()
        .map(|o| o.metrics.get("tokens:sum").copied().unwrap_or(0.0))
        .sum::<f64>();
    let total: f64 = outputs.iter().map(|o| o.loss).sum();
    // The losses are sums over tokens; the step normalises by the tokens that count.
    let params = AdamParams {
        learning_rate,
        grad_clip_norm: 1.0,
        ..AdamParams::default()
    };
    trainer.optim_step(id, &params)?;
    Ok((total / tokens.max(1.0), tokens as usize))
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

fn std(values: &[f64]) -> f64 {
    let m = mean(values.iter().copied());
    mean(values.iter().map(|v| (v - m).powi(2))).sqrt()
}

fn errors(outcomes: &[EpisodeOutcome]) -> BTreeMap<String, usize> {
    errors_of(&outcomes.iter().collect::<Vec<_>>())
}

/// The environment's metrics, averaged per episode.
fn metrics_of(outcomes: &[&EpisodeOutcome]) -> BTreeMap<String, f64> {
    let mut metrics = BTreeMap::new();
    for outcome in outcomes {
        for (name, value) in &outcome.metrics {
            *metrics.entry(name.clone()).or_insert(0.0) += value / outcomes.len() as f64;
        }
    }
    metrics
}

fn errors_of(outcomes: &[&EpisodeOutcome]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        if let Some(kind) = &outcome.error {
            *counts.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// Supervised steps on the environment's demonstrations, training `id` of `trainer`.
async fn run_warmup(
    cx: &JobContext,
    job: &Job,
    warmup: &WarmupSection,
    trainer: &mut TrainingEngine,
    id: &str,
    reporter: &mut Reporter<'_>,
) -> anyhow::Result<()> {
    for step in 0..warmup.steps {
        let started = Instant::now();
        let seeds: Vec<u64> = (0..warmup.batch as u64)
            .map(|i| (1 << 32) + (step * warmup.batch) as u64 + i)
            .collect();
        let outcomes = play_batch(cx, job, &seeds, &Actor::Demonstration, None).await?;
        let datums: Vec<Datum> = outcomes
            .iter()
            .filter(|o| o.error.is_none())
            .flat_map(|o| {
                o.transcripts
                    .iter()
                    .flatten()
                    .flat_map(|t| t.clone().into_sequences())
            })
            .filter_map(|s| sft_datum(&s))
            .collect();
        let (loss_value, tokens) = train_step(
            trainer,
            id,
            datums,
            Loss::CrossEntropy,
            warmup.learning_rate,
        )?;
        reporter.line(&StepMetrics {
            step,
            phase: "warmup",
            reward_mean: 0.0,
            reward_std: 0.0,
            episode_steps: mean(outcomes.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            groups_trained: 0,
            errors: errors(&outcomes),
            env_metrics: BTreeMap::new(),
            eval: None,
            seconds: started.elapsed().as_secs_f64(),
        })?;
    }
    Ok(())
}
