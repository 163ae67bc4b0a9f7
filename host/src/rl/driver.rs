//! The job driver of `opentinker train`, sync mode: sample a batch of groups with the current
//! policy version, score them, turn them into datums with group advantages, train one step,
//! publish the next version. Optional warm-up on the environment's demonstrations first; greedy
//! evaluation on seeds disjoint from training's before, every N steps, and after. Several jobs
//! run in one process, sharing a loaded base model when theirs is the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::advantage::{Estimator, GroupReturns, advantages};
use super::datum::{rl_datum, sft_datum};
use super::job::{Job, SftSection};
use super::render::Renderer;
use super::rollout::{Actor, EpisodeOutcome, Rollout, RolloutRecord};
use super::run_folder::{Cursor, MetricsLog, RunFolder};
use super::sft::{conversation_sequence, read_conversations};
use super::transcript::TokenSequence;
use crate::lora::{AdapterRegistry, PolicyVersion};
use crate::model::tiny::init_tiny;
use crate::model::{Model, ModelConfig, Transformer};
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
    /// SFT: the loss per token of the held-out conversations (`episodes` of them).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub loss: Option<f64>,
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

/// What a loaded model offers every job on it besides its weights.
struct ModelInfo {
    config: ModelConfig,
    renderer: Renderer,
    context: usize,
}

/// A base model loaded once for every job that trains on it: its weights (after the warm-up)
/// in one adapter registry, and the one sampling service that batches all their adapters.
struct SharedBase {
    info: Arc<ModelInfo>,
    registry: Arc<AdapterRegistry>,
    sampler: SamplerService,
    /// What the jobs' adapter checkpoints name as their base model.
    name: String,
}

/// What every episode of a job shares.
struct JobContext {
    /// `None` for an SFT job on a file.
    environment: Option<Plugin>,
    agent: Option<Plugin>,
    reward: Option<Plugin>,
    config: String,
    limits: Limits,
    model: Arc<ModelInfo>,
    sampler: Option<SamplerService>,
}

impl JobContext {
    fn environment(&self) -> anyhow::Result<&Plugin> {
        self.environment
            .as_ref()
            .context("the job has no [environment] to play")
    }

    async fn load(
        host: &PluginHost,
        job: &Job,
        model: Arc<ModelInfo>,
        sampler: Option<SamplerService>,
    ) -> anyhow::Result<Self> {
        let load = async |path: &Path| -> anyhow::Result<Plugin> {
            let wasm = crate::plugin::build::component_path(path)?;
            Ok(host.load_file(&wasm).await?)
        };
        let environment = match &job.environment {
            Some(section) => Some(load(&section.plugin).await?),
            None => None,
        };
        let agent = match &job.agent {
            Some(section) => Some(load(&section.plugin).await?),
            None => None,
        };
        let reward = match &job.reward {
            Some(section) => Some(load(&section.plugin).await?),
            None => None,
        };
        Ok(JobContext {
            environment,
            agent,
            reward,
            config: job
                .environment
                .as_ref()
                .map(|e| e.config_json())
                .unwrap_or_default(),
            limits: Limits::default(),
            model,
            sampler,
        })
    }
}

/// Told every metrics line, with the name of the job it belongs to.
pub type Progress = Arc<dyn Fn(&str, &StepMetrics) + Send + Sync>;

/// Where metric lines go: the log files (a shared warm-up writes into every job's) and the
/// progress display.
struct Reporter {
    name: String,
    logs: Vec<MetricsLog>,
    progress: Progress,
}

impl Reporter {
    fn line(&mut self, line: &StepMetrics) -> anyhow::Result<()> {
        (self.progress)(&self.name, line);
        self.logs.iter_mut().try_for_each(|log| log.append(line))
    }

    fn lines(&self) -> usize {
        self.logs.first().map_or(0, MetricsLog::lines)
    }
}

/// One job of a `train` command: its name (the job file's stem) and output folder.
pub struct JobRun {
    pub name: String,
    pub job: Job,
    pub out: PathBuf,
}

/// Where a job starts training: its run folder, its metrics log (holding the lines kept so
/// far) and the checkpoint it continues from.
struct JobStart {
    index: usize,
    run: JobRun,
    folder: RunFolder,
    log: MetricsLog,
    checkpoint: Option<(PathBuf, Cursor)>,
    /// The held-out loss before and after a full-parameter SFT that made the base.
    sft_evals: Option<(Evaluation, Evaluation)>,
}

/// Run `runs` in one process: jobs with the same base model (the same model and warm-up) share
/// one loaded base, warmed up once, and one sampling service; each job trains its own adapter
/// with its own optimizer, metrics and checkpoints, concurrently with the others. With
/// `resume`, a (single) job continues from the last checkpoint in its folder. Summaries come
/// back in the order of `runs`.
pub async fn run_jobs(
    runs: Vec<JobRun>,
    resume: bool,
    progress: Progress,
) -> anyhow::Result<Vec<Summary>> {
    anyhow::ensure!(
        !resume || runs.len() == 1,
        "--resume continues one job at a time"
    );
    let host = Arc::new(PluginHost::new(HostConfig::default())?);
    let mut groups: Vec<Vec<(usize, JobRun)>> = Vec::new();
    for (index, run) in runs.into_iter().enumerate() {
        match groups.iter_mut().find(|g| g[0].1.job.same_base(&run.job)) {
            Some(group) => group.push((index, run)),
            None => groups.push(vec![(index, run)]),
        }
    }
    let mut handles = Vec::new();
    for group in groups {
        let (base, starts) = prepare_base(&host, group, resume, &progress).await?;
        for start in starts {
            let (host, base, progress) = (Arc::clone(&host), Arc::clone(&base), progress.clone());
            let index = start.index;
            handles.push((
                index,
                tokio::spawn(async move { train_job(&host, &base, start, progress).await }),
            ));
        }
    }
    let mut summaries = Vec::new();
    for (index, handle) in handles {
        summaries.push((index, handle.await??));
    }
    summaries.sort_by_key(|(index, _)| *index);
    Ok(summaries.into_iter().map(|(_, s)| s).collect())
}

/// Load the base model of a group of jobs, warm it up once (a full-parameter warm-up trains
/// the model itself, saved as `base/` in every job's folder so a resumed run does not warm up
/// again), and start its sampling service.
async fn prepare_base(
    host: &PluginHost,
    group: Vec<(usize, JobRun)>,
    resume: bool,
    progress: &Progress,
) -> anyhow::Result<(Arc<SharedBase>, Vec<JobStart>)> {
    let first = &group[0].1;
    let folders = group
        .iter()
        .map(|(_, run)| {
            anyhow::ensure!(
                !resume || run.out.is_dir(),
                "--resume {}: no such run folder",
                run.out.display()
            );
            RunFolder::create(&run.out)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let model_dir = model_dir(&first.job, &first.out)?;
    let Model {
        config,
        transformer,
        tokenizer,
        chat_template,
        ..
    } = Model::load(&model_dir)?;
    let template = chat_template.context("the model has no chat template")?;
    let tokenizer = Arc::new(tokenizer);
    let info = Arc::new(ModelInfo {
        renderer: Renderer::new(template, Arc::clone(&tokenizer))?,
        context: transformer.context_length(),
        config,
    });
    let full_warmup = first.job.sft.as_ref().filter(|w| w.full_parameters);
    let saved_base = match (resume, full_warmup) {
        (true, Some(_)) => folders[0].saved_base()?,
        _ => None,
    };
    let mut checkpoints = Vec::new();
    for folder in &folders {
        checkpoints.push(match resume {
            true => folder
                .latest_checkpoint()?
                .filter(|_| full_warmup.is_none() || saved_base.is_some()),
            false => None,
        });
    }
    let covered = |i: usize| checkpoints[i].as_ref().map(|(_, c)| c.metric_lines);
    let mut sft_evals = None;
    let (transformer, base_dir, logs) = match (full_warmup, saved_base) {
        (Some(_), Some(base_lines)) => {
            let model = Transformer::load(info.config.clone(), &folders[0].base_dir())?;
            let logs = (0..folders.len())
                .map(|i| folders[i].metrics(covered(i).unwrap_or(base_lines)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            (model, folders[0].base_dir(), logs)
        }
        (Some(warmup), None) => {
            let mut reporter = Reporter {
                name: first.name.clone(),
                logs: folders
                    .iter()
                    .map(|f| f.metrics(0))
                    .collect::<anyhow::Result<_>>()?,
                progress: progress.clone(),
            };
            let cx = JobContext::load(host, &first.job, Arc::clone(&info), None).await?;
            let mut warm = TrainingEngine::full_parameters(transformer, DType::F32)?;
            sft_evals = run_sft(
                &cx,
                &first.job,
                warmup,
                &mut warm,
                FULL_PARAMETERS,
                &mut reporter,
            )
            .await?;
            let model = warm.model_snapshot()?;
            for folder in &folders {
                folder.save_base(&model, &model_dir, reporter.lines())?;
            }
            (model, folders[0].base_dir(), reporter.logs)
        }
        (None, _) => {
            let logs = (0..folders.len())
                .map(|i| folders[i].metrics(covered(i).unwrap_or(0)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            (transformer, model_dir, logs)
        }
    };
    let registry = AdapterRegistry::new(Arc::new(transformer));
    let kv_budget_positions = group
        .iter()
        .map(|(_, run)| {
            let rl = &run.job.rl;
            let concurrency = (rl.group_size * rl.groups_per_batch).max(run.job.eval.episodes);
            let per_episode = (256 + rl.max_tokens) * rl.max_turns.max(1);
            concurrency * per_episode.min(info.context)
        })
        .sum();
    let engine = SamplingEngine::new(
        Arc::clone(&registry),
        Some(tokenizer),
        info.config.eos_token_ids.clone(),
        EngineConfig {
            kv_budget_positions,
            prefix_cache_positions: 0,
        },
    );
    // The service's thread ends when the last job drops its handle.
    let (sampler, _thread) = SamplerService::start(engine);
    let base = Arc::new(SharedBase {
        info,
        registry,
        sampler,
        name: base_dir.display().to_string(),
    });
    let starts = group
        .into_iter()
        .zip(folders)
        .zip(logs)
        .zip(checkpoints)
        .map(|((((index, run), folder), log), checkpoint)| JobStart {
            index,
            run,
            folder,
            log,
            checkpoint,
            sft_evals: sft_evals.clone(),
        })
        .collect();
    Ok((base, starts))
}

/// RL for one job on its shared base: sample a batch of groups with the current policy
/// version, score, build datums, train one step, publish the next version; evaluate and
/// checkpoint as the job says.
async fn train_job(
    host: &PluginHost,
    base: &SharedBase,
    start: JobStart,
    progress: Progress,
) -> anyhow::Result<Summary> {
    let JobStart {
        run,
        folder,
        log,
        checkpoint,
        mut sft_evals,
        ..
    } = start;
    let job = &run.job;
    let cx = JobContext::load(
        host,
        job,
        Arc::clone(&base.info),
        Some(base.sampler.clone()),
    )
    .await?;
    let mut reporter = Reporter {
        name: run.name.clone(),
        logs: vec![log],
        progress,
    };
    let mut trainer = TrainingEngine::new(Arc::clone(base.registry.base()), DType::F32);
    match &checkpoint {
        Some((dir, _)) => trainer.load_adapter(POLICY, &dir.join(POLICY), true)?,
        None => {
            trainer.add_adapter(POLICY, job.lora.clone())?;
            if let Some(sft) = job.sft.as_ref().filter(|w| !w.full_parameters) {
                sft_evals = run_sft(&cx, job, sft, &mut trainer, POLICY, &mut reporter).await?;
            }
        }
    }
    if job.rl.steps == 0 {
        // An SFT job: its result is the adapter (or, after a full-parameter SFT, the base).
        let checkpoint = match job.sft.as_ref().is_some_and(|s| s.full_parameters) {
            true => PathBuf::from(&base.name),
            false => {
                let dir = folder.checkpoint_dir("final");
                trainer.save_adapter(POLICY, &dir, &base.name, true)?;
                dir
            }
        };
        let (initial_eval, final_eval) = sft_evals.unwrap_or_default();
        return Ok(Summary {
            steps: job.sft.as_ref().map_or(0, |s| s.steps),
            initial_eval,
            final_eval,
            checkpoint,
            out: folder.root().to_path_buf(),
        });
    }
    let loss = Loss::from_config(&job.rl.loss, &job.rl.loss_config)?;
    let estimator = job.rl.estimator().map_err(anyhow::Error::msg)?;
    // Each job publishes its policy under its own name in the shared registry.
    let publish = |trainer: &TrainingEngine| -> anyhow::Result<Arc<PolicyVersion>> {
        let adapter = trainer.adapter(POLICY).context("the policy adapter")?;
        Ok(base.registry.publish(&run.name, adapter)?)
    };
    let mut version = publish(&trainer)?;

    let (first_step, initial_eval, mut last_eval) = match checkpoint {
        Some((_, cursor)) => (cursor.steps, cursor.initial_eval, cursor.last_eval),
        None => {
            let eval = evaluate(&cx, job, &version).await?;
            (0, eval.clone(), eval)
        }
    };
    for step in first_step..job.rl.steps {
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
                metric_lines: reporter.lines(),
                initial_eval: initial_eval.clone(),
                last_eval: last_eval.clone(),
            };
            folder.save_checkpoint(&cursor, |temp| {
                Ok(trainer.save_adapter(POLICY, &temp.join(POLICY), &base.name, true)?)
            })?;
        }
    }
    let checkpoint = folder.checkpoint_dir("final");
    trainer.save_adapter(POLICY, &checkpoint, &base.name, true)?;
    Ok(Summary {
        steps: job.rl.steps,
        initial_eval,
        final_eval: last_eval,
        checkpoint,
        out: folder.root().to_path_buf(),
    })
}

/// The job's model directory; a tiny model is generated into the run's folder once.
fn model_dir(job: &Job, out: &Path) -> anyhow::Result<PathBuf> {
    match (&job.model.dir, &job.model.init_tiny) {
        (Some(dir), _) => Ok(dir.clone()),
        (None, Some(tiny)) => {
            let dir = out.join("model");
            if !dir.is_dir() {
                let (shape, arch) = (
                    tiny.shape().map_err(anyhow::Error::msg)?,
                    tiny.arch().map_err(anyhow::Error::msg)?,
                );
                // Whole or absent, so a run killed while generating it regenerates it.
                crate::store::write_atomic_dir(&dir, |temp| {
                    init_tiny(temp, shape, arch, tiny.seed).map_err(std::io::Error::other)
                })
                .with_context(|| format!("generating the tiny model in {}", dir.display()))?;
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
            cx.environment()?
                .generate_task(&cx.config, seed, &cx.limits)
                .await?,
        );
    }
    let rollout = rollout(cx, job, sampling_params(job))?;
    let actors = [policy];
    let episodes = tasks.iter().enumerate().flat_map(|(g, task)| {
        let seed = task_seeds[g];
        (0..size).map(move |i| (g, i, task, seed * 1000 + i as u64))
    });
    let mut played: Vec<(usize, usize, EpisodeOutcome)> =
        futures::future::join_all(episodes.map(|(g, i, task, seed)| {
            let (rollout, actors) = (&rollout, &actors);
            async move { (g, i, rollout.play(task, seed, actors).await) }
        }))
        .await;
    if let (Some(reward), Some(section)) = (&cx.reward, &job.reward)
        && section.group
    {
        for (g, task) in tasks.iter().enumerate() {
            score_group(
                cx,
                reward,
                section.weight,
                job.rl.failure_reward,
                task,
                g,
                &mut played,
            )
            .await;
        }
    }
    Ok(played)
}

/// Let the reward plugin's group scorer replace the scores of group `g`'s whole episodes; when
/// it fails, those episodes fail with its error kind.
async fn score_group(
    cx: &JobContext,
    reward: &Plugin,
    weight: f64,
    failure_reward: f64,
    task: &str,
    g: usize,
    played: &mut [(usize, usize, EpisodeOutcome)],
) {
    let mut members: Vec<&mut EpisodeOutcome> = played
        .iter_mut()
        .filter(|(group, _, o)| *group == g && o.error.is_none())
        .map(|(_, _, o)| o)
        .collect();
    let transcripts: Vec<_> = members.iter().map(|o| o.plugin_transcripts()).collect();
    match reward.score_group(task, &transcripts, &cx.limits).await {
        Ok(Some(scores)) => {
            for (outcome, scores) in members.iter_mut().zip(scores) {
                outcome.replace_scores(scores.iter().map(|s| s * weight).collect());
            }
        }
        Ok(None) => {}
        Err(error) => {
            for outcome in members {
                outcome.fail(error.kind.as_str().to_string(), failure_reward);
            }
        }
    }
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

fn rollout<'a>(
    cx: &'a JobContext,
    job: &Job,
    params: SamplingParams,
) -> anyhow::Result<Rollout<'a>> {
    Ok(Rollout {
        environment: cx.environment()?,
        config: &cx.config,
        agent: cx.agent.as_ref(),
        reward: cx
            .reward
            .as_ref()
            .zip(job.reward.as_ref().map(|r| r.weight)),
        limits: &cx.limits,
        renderer: &cx.model.renderer,
        sampler: cx.sampler.as_ref(),
        params,
        max_turns: job.rl.max_turns,
        context: cx.model.context,
        failure_reward: job.rl.failure_reward,
    })
}

/// Play one episode per seed, each with a task the environment generates from its seed.
async fn play_batch(
    cx: &JobContext,
    job: &Job,
    seeds: &[u64],
    actor: &Actor,
    params: Option<SamplingParams>,
) -> anyhow::Result<Vec<EpisodeOutcome>> {
    let rollout = rollout(cx, job, params.unwrap_or_else(|| sampling_params(job)))?;
    let mut tasks = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        tasks.push(
            cx.environment()?
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
        loss: None,
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
    blocking(|| train_on(trainer, id, datums, loss, learning_rate))
}

/// Run CPU-bound `work` without stalling the other tasks of a multi-threaded runtime (the other
/// jobs of the process, the plugin calls of the sampler's clients).
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

fn train_on(
    trainer: &mut TrainingEngine,
    id: &str,
    datums: Vec<Datum>,
    loss: Loss,
    learning_rate: f64,
) -> anyhow::Result<(f64, usize)> {
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

/// Where SFT batches come from.
enum SftData {
    /// Episodes played with the environment's demonstration actions.
    Demonstrations,
    /// Chat conversations from a file, and the datums of the held-out ones.
    Conversations {
        train: Vec<TokenSequence>,
        held_out: Vec<Datum>,
    },
}

impl SftData {
    fn load(sft: &SftSection, renderer: &Renderer) -> anyhow::Result<Self> {
        let Some(file) = sft.jsonl() else {
            return Ok(SftData::Demonstrations);
        };
        let conversations = read_conversations(file)?;
        anyhow::ensure!(
            sft.held_out < conversations.len(),
            "sft.held_out: {} of the {} conversations of {} leaves none to train on",
            sft.held_out,
            conversations.len(),
            file.display()
        );
        let mut sequences = conversations
            .iter()
            .enumerate()
            .map(|(n, messages)| {
                conversation_sequence(renderer, messages)
                    .with_context(|| format!("{} conversation {}", file.display(), n + 1))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let held_out = sequences
            .split_off(sequences.len() - sft.held_out)
            .iter()
            .filter_map(sft_datum)
            .collect();
        Ok(SftData::Conversations {
            train: sequences,
            held_out,
        })
    }
}

/// Supervised steps (the `[sft]` section: demonstrations or a chat file), training `id` of
/// `trainer`. Returns the held-out loss before and after, when there is a held-out set.
async fn run_sft(
    cx: &JobContext,
    job: &Job,
    sft: &SftSection,
    trainer: &mut TrainingEngine,
    id: &str,
    reporter: &mut Reporter,
) -> anyhow::Result<Option<(Evaluation, Evaluation)>> {
    let data = SftData::load(sft, &cx.model.renderer)?;
    let held_out_loss = |trainer: &TrainingEngine| -> anyhow::Result<Option<Evaluation>> {
        let SftData::Conversations { held_out, .. } = &data else {
            return Ok(None);
        };
        if held_out.is_empty() {
            return Ok(None);
        }
        let outputs = blocking(|| {
            trainer.forward(&[WorkItem {
                adapter: id.into(),
                datums: held_out.clone(),
                loss: Loss::CrossEntropy,
            }])
        })?;
        let tokens: f64 = outputs
            .iter()
            .map(|o| o.metrics.get("tokens:sum").copied().unwrap_or(0.0))
            .sum();
        let loss: f64 = outputs.iter().map(|o| o.loss).sum();
        Ok(Some(Evaluation {
            episodes: held_out.len(),
            loss: Some(loss / tokens.max(1.0)),
            ..Evaluation::default()
        }))
    };
    let initial = held_out_loss(trainer)?;
    let mut last = initial.clone();
    for step in 0..sft.steps {
        let started = Instant::now();
        let (datums, outcomes) = match &data {
            SftData::Demonstrations => {
                let seeds: Vec<u64> = (0..sft.batch as u64)
                    .map(|i| (1 << 32) + (step * sft.batch) as u64 + i)
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
                (datums, outcomes)
            }
            // Batches walk through the file in order, wrapping around.
            SftData::Conversations { train, .. } => {
                let datums = (0..sft.batch)
                    .filter_map(|i| sft_datum(&train[(step * sft.batch + i) % train.len()]))
                    .collect();
                (datums, Vec::new())
            }
        };
        let (loss_value, tokens) =
            train_step(trainer, id, datums, Loss::CrossEntropy, sft.learning_rate)?;
        let due = step + 1 == sft.steps || (sft.eval_every > 0 && (step + 1) % sft.eval_every == 0);
        let eval = if due { held_out_loss(trainer)? } else { None };
        if eval.is_some() {
            last = eval.clone();
        }
        reporter.line(&StepMetrics {
            step,
            phase: "sft",
            reward_mean: 0.0,
            reward_std: 0.0,
            episode_steps: mean(outcomes.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            groups_trained: 0,
            errors: errors(&outcomes),
            env_metrics: BTreeMap::new(),
            eval,
            seconds: started.elapsed().as_secs_f64(),
        })?;
    }
    Ok(initial.zip(last))
}
