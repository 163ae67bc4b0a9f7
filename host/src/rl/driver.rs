//! The driver of `opentinker train`: several jobs in one process, jobs with the same base model
//! sharing it. Each group of jobs gets its base loaded once, warmed up once when a full-parameter
//! SFT makes it, one sampling service that batches all their adapters and one training service
//! that fuses their training steps; each job then trains concurrently with the others (`rl_job`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use candle_core::DType;

use super::context::{JobContext, ModelInfo, Reporter};
use super::job::Job;
use super::job_trainer::JobTrainer;
use super::metrics::Summary;
use super::render::Renderer;
use super::rl_job::train_job;
use super::run_folder::{Cursor, MetricsLog, RunFolder};
use super::sft::run_sft;
use crate::lora::AdapterRegistry;
use crate::model::tiny::init_tiny;
use crate::model::{Model, Transformer};
use crate::plugin::{HostConfig, PluginHost};
use crate::sample::{EngineConfig, SamplingEngine};
use crate::sched::{SamplerService, TrainerService};
use crate::train::{FULL_PARAMETERS, TrainingEngine};

pub use super::context::Progress;
pub use super::metrics::{Evaluation, StepMetrics};

/// A base model loaded once for every job that trains on it: its weights (after the warm-up)
/// in one adapter registry, the one sampling service that batches all their adapters, and the
/// one training service that holds all their adapters' weights and optimizer states.
pub(super) struct SharedBase {
    pub(super) info: Arc<ModelInfo>,
    pub(super) registry: Arc<AdapterRegistry>,
    pub(super) sampler: SamplerService,
    pub(super) trainer: TrainerService,
    /// What the jobs' adapter checkpoints name as their base model.
    pub(super) name: String,
}

/// One job of a `train` command: its name (the job file's stem) and output folder.
pub struct JobRun {
    pub name: String,
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
    /// The held-out loss before and after a full-parameter SFT that made the base.
    pub(super) sft_evals: Option<(Evaluation, Evaluation)>,
}

/// Run `runs` in one process: jobs with the same base model (the same model and warm-up) share
/// one loaded base, warmed up once, and one sampling service; each job trains its own adapter
/// with its own optimizer, metrics and checkpoints, concurrently with the others. With
/// `resume`, a (single) job continues from the last checkpoint in its folder. Summaries come
/// back in the order of `runs`, each job's its own result: a job that fails (its plugin fails
/// every time, its files cannot be written) ends alone, and the other jobs run to their end.
pub async fn run_jobs(
    runs: Vec<JobRun>,
    resume: bool,
    progress: Progress,
) -> anyhow::Result<Vec<anyhow::Result<Summary>>> {
    anyhow::ensure!(
        !resume || runs.len() == 1,
        "--resume continues one job at a time"
    );
    for run in &runs {
        check_plugin_paths(run)?;
    }
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
        let result = match handle.await {
            Ok(result) => result,
            Err(error) => Err(anyhow::anyhow!("the job's task ended abnormally: {error}")),
        };
        summaries.push((index, result));
    }
    summaries.sort_by_key(|(index, _)| *index);
    Ok(summaries.into_iter().map(|(_, s)| s).collect())
}

/// Refuse a job whose plugin paths do not exist before anything is generated, loaded or
/// written, naming the job and its section.
fn check_plugin_paths(run: &JobRun) -> anyhow::Result<()> {
    let job = &run.job;
    let sections = [
        ("environment", job.environment.as_ref().map(|s| &s.plugin)),
        ("agent", job.agent.as_ref().map(|s| &s.plugin)),
        ("reward", job.reward.as_ref().map(|s| &s.plugin)),
    ];
    for (section, path) in sections {
        if let Some(path) = path
            && !path.exists()
        {
            anyhow::bail!(
                "job `{}`: [{section}] plugin {}: no such file or plugin crate",
                run.name,
                path.display()
            );
        }
    }
    Ok(())
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
            let (warm, _thread) =
                TrainerService::start(TrainingEngine::full_parameters(transformer, DType::F32)?);
            let warm = JobTrainer::unscoped(warm);
            sft_evals = run_sft(
                &cx,
                &first.job,
                warmup,
                &warm,
                FULL_PARAMETERS,
                &mut reporter,
            )
            .await?;
            let model = warm.run(|e| e.model_snapshot()).await??;
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
    // The services' threads end when the last job drops its handles.
    let (sampler, _thread) = SamplerService::start(engine);
    let (trainer, _thread) =
        TrainerService::start(TrainingEngine::new(Arc::clone(registry.base()), DType::F32));
    let base = Arc::new(SharedBase {
        info,
        registry,
        sampler,
        trainer,
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
