//! The driver of `opentinker train`: several jobs in one process, jobs with the same base model
//! sharing it. Each group of jobs gets its base loaded once, warmed up once when a full-parameter
//! SFT makes it, one sampling service that batches all their adapters and one training service
//! that fuses their training steps; each job then trains concurrently with the others (`training_loop`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use std::sync::Arc;

use super::context::{JobContext, JobPlugins, JobStart, ModelInfo, Reporter, SharedBase};
use super::job::Job;
use super::metrics::{Summary, Warmup};
use super::rollouts::{Pool, Queue, QueueSettings};
use super::run_folder::{Cursor, MetricsLog, RunFolder};
use super::sft::run_sft;
use super::training_loop::train_job;
use crate::client::{BaseModel, BaseRequest, Engine, ReadyBase, RolloutQueue, TINY_MODEL_NAME};
use crate::plugin::{HostConfig, PluginHost};

use super::context::{JobRun, Progress};

/// Run `runs` in one process: jobs with the same base model (the same model and warm-up) share
/// one loaded base, warmed up once, and one sampling service; each job trains its own adapter
/// with its own optimizer, metrics and checkpoints, concurrently with the others. With
/// `resume`, a (single) job continues from the last checkpoint in its folder. Summaries come
/// back in the order of `runs`, each job's its own result: a job that fails (its plugin fails
/// every time, its files cannot be written) ends alone, and the other jobs run to their end.
pub async fn run_jobs(
    runs: Vec<JobRun>,
    resume: bool,
    engine: &Engine,
    progress: Progress,
) -> anyhow::Result<Vec<anyhow::Result<Summary>>> {
    anyhow::ensure!(
        !resume || runs.len() == 1,
        "--resume continues one job at a time"
    );
    for run in &runs {
        check_plugin_paths(run)?;
    }
    let host = PluginHost::new(HostConfig::default())?;
    let mut groups: Vec<Vec<(usize, JobRun, JobPlugins)>> = Vec::new();
    for (index, run) in runs.into_iter().enumerate() {
        let plugins = JobPlugins::load(&host, &run.job, &run.name).await?;
        match groups.iter_mut().find(|g| g[0].1.job.same_base(&run.job)) {
            Some(group) => group.push((index, run, plugins)),
            None => groups.push(vec![(index, run, plugins)]),
        }
    }
    let mut handles = Vec::new();
    for group in groups {
        let (base, starts) = prepare_base(group, resume, engine, &progress).await?;
        for start in starts {
            let (base, progress) = (Arc::clone(&base), progress.clone());
            let index = start.index;
            handles.push((
                index,
                tokio::spawn(async move { train_job(&base, start, progress).await }),
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

/// Check the plugins of `job` (called `name`) as a run of it would before any work: each
/// component loads on `host`, is of its section's kind, and takes its section's config (by the
/// schema it declares). A server checks a submitted job with this, to refuse it at once.
pub async fn check_job_plugins(host: &PluginHost, job: &Job, name: &str) -> anyhow::Result<()> {
    JobPlugins::load(host, job, name).await.map(drop)
}

/// Run one job on `engine` with the plugins of `host`, in the calling task: dropping the
/// returned future stops the job, its episodes and its adapters (how a server cancels a job).
pub async fn run_job(
    run: JobRun,
    resume: bool,
    engine: &Engine,
    host: &PluginHost,
    progress: Progress,
) -> anyhow::Result<Summary> {
    check_plugin_paths(&run)?;
    let plugins = JobPlugins::load(host, &run.job, &run.name).await?;
    let (base, mut starts) =
        prepare_base(vec![(0, run, plugins)], resume, engine, &progress).await?;
    let start = starts.pop().context("the job has no start")?;
    train_job(&base, start, progress).await
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
            && super::job::is_digest(path)
        {
            anyhow::bail!(
                "job `{}`: [{section}] plugin {}: a digest names a plugin stored on a server; \
                 run the job there (`opentinker submit`)",
                run.name,
                path.display()
            );
        }
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

/// Open the base model of a group of jobs on `engine`, warm it up once (a full-parameter
/// warm-up trains the model itself, saved as `base/` in every job's folder so a resumed run does
/// not warm up again), and start its sampling service.
async fn prepare_base(
    group: Vec<(usize, JobRun, JobPlugins)>,
    resume: bool,
    engine: &Engine,
    progress: &Progress,
) -> anyhow::Result<(Arc<SharedBase>, Vec<JobStart>)> {
    let (_, first, first_plugins) = &group[0];
    let full_warmup = first.job.sft.as_ref().filter(|w| w.full_parameters);
    let request = BaseRequest {
        served: served_base_name(&first.job),
        full_parameters: full_warmup.is_some(),
        model_dir: &|| model_dir(&first.job, &first.out),
    };
    let mut model = match engine
        .open(request)
        .await
        .with_context(|| format!("job `{}`", first.name))?
    {
        BaseModel::Ready(ready) => return prepare_ready_base(group, resume, *ready).await,
        BaseModel::Local(model) => *model,
    };
    let folders = run_folders(&group, resume)?;
    let info = Arc::new(ModelInfo::of(model.text(), model.context_length())?);
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
    let mut warmup_done = None;
    let (model, base_dir, logs) = match (full_warmup, saved_base) {
        (Some(_), Some(base_lines)) => {
            model.load_weights(&folders[0].base_dir())?;
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
            let cx = JobContext::new(first_plugins.clone(), &first.job, Arc::clone(&info));
            let warm_up = model.warm_up()?;
            let trainer = warm_up.trainer();
            warmup_done = Some(run_sft(&cx, &first.job, warmup, trainer, &mut reporter).await?);
            for folder in &folders {
                let staged = folder.stage_base()?;
                trainer.save_state(staged.path(), false).await?;
                folder.commit_base(staged, reporter.lines())?;
            }
            (
                warm_up.finish().await?,
                folders[0].base_dir(),
                reporter.logs,
            )
        }
        (None, _) => {
            let logs = (0..folders.len())
                .map(|i| folders[i].metrics(covered(i).unwrap_or(0)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let dir = model.dir().to_path_buf();
            (model, dir, logs)
        }
    };
    let kv_budget_positions = group
        .iter()
        .map(|(_, run, _)| {
            let rl = &run.job.rl;
            let concurrency = (rl.group_size * rl.groups_per_batch).max(run.job.eval.episodes);
            let per_episode = (256 + rl.max_tokens) * rl.max_turns.max(1);
            concurrency * per_episode.min(info.context)
        })
        .sum();
    let base = Arc::new(SharedBase {
        info,
        service: model.serve(base_dir.display().to_string(), kv_budget_positions)?,
        queue: None,
    });
    Ok((
        base,
        job_starts(group, folders, logs, checkpoints, warmup_done),
    ))
}

/// `prepare_base` on a base ready for adapters (a server's, or one a server serves): nothing is
/// loaded here, the jobs' adapters join its loops, and a run resumes from its checkpoints.
async fn prepare_ready_base(
    group: Vec<(usize, JobRun, JobPlugins)>,
    resume: bool,
    ready: ReadyBase,
) -> anyhow::Result<(Arc<SharedBase>, Vec<JobStart>)> {
    let folders = run_folders(&group, resume)?;
    let context = ready.service.context_length();
    let base = SharedBase {
        info: Arc::new(ModelInfo::of(ready.text, context)?),
        service: ready.service,
        queue: rollout_queue(ready.rollouts.as_ref()).await?,
    };
    adapter_starts(group, folders, resume, base)
}

/// The rollout queue, connected, if there is one.
async fn rollout_queue(queue: Option<&RolloutQueue>) -> anyhow::Result<Option<Queue>> {
    let Some(RolloutQueue { url, pool, login }) = queue else {
        return Ok(None);
    };
    let settings = QueueSettings {
        pool: Pool::new(pool),
        ..QueueSettings::default()
    };
    let queue = Queue::connect(url, settings, login)
        .await
        .with_context(|| format!("the rollout queue {url}"))?;
    Ok(Some(queue))
}

/// The starts of a group of jobs that train adapters of an unchanged base (no full-parameter
/// warm-up), each from its latest checkpoint with `resume`.
fn adapter_starts(
    group: Vec<(usize, JobRun, JobPlugins)>,
    folders: Vec<RunFolder>,
    resume: bool,
    base: SharedBase,
) -> anyhow::Result<(Arc<SharedBase>, Vec<JobStart>)> {
    let mut checkpoints = Vec::new();
    for folder in &folders {
        checkpoints.push(match resume {
            true => folder.latest_checkpoint()?,
            false => None,
        });
    }
    let logs = folders
        .iter()
        .zip(&checkpoints)
        .map(|(folder, checkpoint)| {
            folder.metrics(checkpoint.as_ref().map_or(0, |(_, c)| c.metric_lines))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let starts = job_starts(group, folders, logs, checkpoints, None);
    Ok((Arc::new(base), starts))
}

/// The name of the served base `job` trains on: its `model.base`, or the built-in tiny model's
/// for a job on that model's settings; `None` for a model of its own.
pub fn served_base_name(job: &Job) -> Option<&str> {
    let built_in = crate::client::TinyModelSpec::built_in();
    match (&job.model.base, &job.model.init_tiny) {
        (Some(name), _) => Some(name.as_str()),
        (None, Some(tiny)) if *tiny == built_in => Some(TINY_MODEL_NAME),
        _ => None,
    }
}

/// The run folders of a group's jobs (with `resume`, folders that must exist), each given its
/// job file.
fn run_folders(
    group: &[(usize, JobRun, JobPlugins)],
    resume: bool,
) -> anyhow::Result<Vec<RunFolder>> {
    group
        .iter()
        .map(|(_, run, _)| {
            anyhow::ensure!(
                !resume || run.out.is_dir(),
                "--resume {}: no such run folder",
                run.out.display()
            );
            let folder = RunFolder::create(&run.out)?;
            folder.record_job_file(&run.file)?;
            folder.record_settings(&run.job.settings())?;
            Ok(folder)
        })
        .collect()
}

/// Where each job of a group starts, in the group's order.
fn job_starts(
    group: Vec<(usize, JobRun, JobPlugins)>,
    folders: Vec<RunFolder>,
    logs: Vec<MetricsLog>,
    checkpoints: Vec<Option<(PathBuf, Cursor)>>,
    warmup: Option<Warmup>,
) -> Vec<JobStart> {
    group
        .into_iter()
        .zip(folders)
        .zip(logs)
        .zip(checkpoints)
        .map(
            |((((index, run, plugins), folder), log), checkpoint)| JobStart {
                index,
                run,
                folder,
                log,
                checkpoint,
                warmup: warmup.clone(),
                plugins,
            },
        )
        .collect()
}

/// The job's model directory; a tiny model is generated into the run's folder once.
pub(super) fn model_dir(job: &Job, out: &Path) -> anyhow::Result<PathBuf> {
    match (&job.model.dir, &job.model.init_tiny) {
        (Some(dir), _) => Ok(dir.clone()),
        (None, Some(tiny)) => {
            let dir = out.join("model");
            tiny.generate(&dir)?;
            Ok(dir)
        }
        (None, None) => match &job.model.base {
            Some(name) => anyhow::bail!(
                "model.base = {name:?} names a model a server serves: submit the job to \
                 `opentinker serve` (`opentinker submit`), or give `model.dir`"
            ),
            None => anyhow::bail!("the job names no model"),
        },
    }
}
