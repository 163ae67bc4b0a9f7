//! The job driver of `opentinker train`, sync mode: sample a batch of groups with the current
//! policy version, score them, turn them into datums with group advantages, train one step,
//! publish the next version. Optional warm-up on the environment's demonstrations first; greedy
//! evaluation on seeds disjoint from training's before, every N steps, and after.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::DType;
use serde::Serialize;

use super::advantage::{GroupReturns, advantages};
use super::datum::{rl_datum, sft_datum};
use super::job::Job;
use super::job::WarmupSection;
use super::render::Renderer;
use super::rollout::{Actor, EpisodeOutcome, Rollout};
use crate::lora::{AdapterRegistry, PolicyVersion};
use crate::model::Model;
use crate::model::tiny::init_tiny;
use crate::plugin::{HostConfig, Limits, Plugin, PluginHost};
use crate::sample::{EngineConfig, PolicyRef, SamplingEngine, SamplingParams};
use crate::sched::SamplerService;
use crate::train::{AdamParams, Datum, FULL_PARAMETERS, Loss, TrainingEngine, WorkItem};

/// The adapter a single-policy job trains.
const POLICY: &str = "policy";
/// Evaluation seeds start here; training seeds stay below.
const EVAL_SEEDS: u64 = 1 << 40;

/// One line of `metrics.jsonl`.
#[derive(Debug, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
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
    config: String,
    limits: Limits,
    renderer: Renderer,
    sampler: Option<SamplerService>,
    context: usize,
}

/// Run `job` with its outputs in `out`; `progress` is told each metrics line.
pub async fn run(
    job: &Job,
    out: &Path,
    progress: &dyn Fn(&StepMetrics),
) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let model_dir = match (&job.model.dir, &job.model.init_tiny) {
        (Some(dir), _) => dir.clone(),
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
            dir
        }
        (None, None) => anyhow::bail!("the job names no model"),
    };
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
    let wasm = crate::plugin::build::component_path(&job.environment.plugin)?;
    let environment = host.load_file(&wasm).await?;
    let mut cx = JobContext {
        environment,
        config: job.environment.config_json(),
        limits: Limits::default(),
        renderer,
        sampler: None,
        context,
    };
    let mut metrics_file = std::fs::File::create(out.join("metrics.jsonl"))?;
    let mut write_line = |line: &StepMetrics| -> anyhow::Result<()> {
        progress(line);
        writeln!(metrics_file, "{}", serde_json::to_string(line)?)?;
        metrics_file.flush()?;
        Ok(())
    };

    // A full-parameter warm-up trains the model itself, which then becomes the shared base.
    let full_warmup = job.warmup.as_ref().filter(|w| w.full_parameters);
    let transformer = match full_warmup {
        Some(warmup) => {
            let mut warm = TrainingEngine::full_parameters(transformer, DType::F32)?;
            run_warmup(
                &cx,
                job,
                warmup,
                &mut warm,
                FULL_PARAMETERS,
                &mut write_line,
            )
            .await?;
            warm.model_snapshot()?
        }
        None => transformer,
    };
    let registry = AdapterRegistry::new(Arc::new(transformer));
    let mut trainer = TrainingEngine::new(Arc::clone(registry.base()), DType::F32);
    trainer.add_adapter(POLICY, job.lora.clone())?;
    if let Some(warmup) = job.warmup.as_ref().filter(|w| !w.full_parameters) {
        run_warmup(&cx, job, warmup, &mut trainer, POLICY, &mut write_line).await?;
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
    let mut version = registry.publish(
        POLICY,
        trainer.adapter(POLICY).context("the policy adapter")?,
    )?;

    let initial_eval = evaluate(&cx, job, &version).await?;
    let mut last_eval = initial_eval.clone();
    for step in 0..job.rl.steps {
        let started = Instant::now();
        let policy = Actor::Policy(Some(PolicyRef {
            name: version.name.clone(),
            version: Some(version.version),
        }));
        let groups = job.rl.groups_per_batch;
        let size = job.rl.group_size;
        // Group g of step s plays one task (seeded) with `size` episode seeds.
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
        let sampling = SamplingParams {
            temperature: job.rl.temperature,
            ..sampling_params(job)
        };
        let rollout = rollout(&cx, job, sampling);
        let task_seeds = &task_seeds;
        let episodes = tasks.iter().enumerate().flat_map(|(g, task)| {
            (0..size).map(move |i| (g, task, task_seeds[g] * 1000 + i as u64))
        });
        let actors = [policy.clone()];
        let outcomes: Vec<(usize, EpisodeOutcome)> =
            futures::future::join_all(episodes.map(|(g, task, seed)| {
                let (rollout, actors) = (&rollout, &actors);
                async move { (g, rollout.play(task, seed, actors).await) }
            }))
            .await;
        let mut datums = Vec::new();
        let mut groups_trained = 0;
        for g in 0..groups {
            let group: Vec<&EpisodeOutcome> = outcomes
                .iter()
                .filter(|(i, _)| *i == g)
                .map(|(_, o)| o)
                .collect();
            let returns = GroupReturns {
                turn_rewards: group
                    .iter()
                    .map(|o| o.turn_rewards.first().cloned().unwrap_or_default())
                    .collect(),
            };
            let Some(advantage) = advantages(&returns, estimator, job.rl.skip_equal_groups) else {
                continue;
            };
            groups_trained += 1;
            for (outcome, per_turn) in group.iter().zip(&advantage) {
                let Some(Some(transcript)) = outcome.transcripts.first() else {
                    continue;
                };
                for sequence in transcript.clone().into_sequences() {
                    let turn_advantage =
                        |turn: usize| per_turn.get(turn).copied().unwrap_or(0.0) as f32;
                    datums.extend(rl_datum(&sequence, turn_advantage));
                }
            }
        }
        let (loss_value, tokens) = train_step(
            &mut trainer,
            POLICY,
            datums,
            loss.clone(),
            job.rl.learning_rate,
        )?;
        version = registry.publish(
            POLICY,
            trainer.adapter(POLICY).context("the policy adapter")?,
        )?;
        let all: Vec<&EpisodeOutcome> = outcomes.iter().map(|(_, o)| o).collect();
        let rewards: Vec<f64> = all
            .iter()
            .map(|o| o.returns().first().copied().unwrap_or(0.0))
            .collect();
        let eval =
            if job.eval.every > 0 && (step + 1) % job.eval.every == 0 && step + 1 < job.rl.steps {
                Some(evaluate(&cx, job, &version).await?)
            } else if step + 1 == job.rl.steps {
                last_eval = evaluate(&cx, job, &version).await?;
                Some(last_eval.clone())
            } else {
                None
            };
        let mut env_metrics = BTreeMap::new();
        for outcome in &all {
            for (name, value) in &outcome.metrics {
                *env_metrics.entry(name.clone()).or_insert(0.0) += value / all.len() as f64;
            }
        }
        write_line(&StepMetrics {
            step,
            phase: "rl",
            reward_mean: mean(rewards.iter().copied()),
            reward_std: std(&rewards),
            episode_steps: mean(all.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            groups_trained,
            errors: errors_of(&all),
            env_metrics,
            eval,
            seconds: started.elapsed().as_secs_f64(),
        })?;
    }
    let checkpoint = out.join("checkpoints").join("final");
    trainer.save_adapter(POLICY, &checkpoint, &model_dir.display().to_string(), true)?;
    Ok(Summary {
        steps: job.rl.steps,
        initial_eval,
        final_eval: last_eval,
        checkpoint,
        out: out.to_path_buf(),
    })
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
    let n = outcomes.len().max(1) as f64;
    let mut metrics = BTreeMap::new();
    for outcome in &outcomes {
        for (name, value) in &outcome.metrics {
            *metrics.entry(name.clone()).or_insert(0.0) += value / n;
        }
    }
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
    write_line: &mut dyn FnMut(&StepMetrics) -> anyhow::Result<()>,
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
        write_line(&StepMetrics {
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
