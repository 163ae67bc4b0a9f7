//! `opentinker train JOB.toml... [--out OUT | --resume OUT] [--json] [--server URL [--rollouts
//! nats://HOST:PORT]]`: run training jobs, in process or on a server, their RL groups played
//! here or by rollout workers.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::progress::TrainProgress;
use crate::client::{Engine, RemoteEngine, RolloutQueue, TinyModelSpec};
use crate::model::{BaseFormat, Device};
use crate::queue_auth::QueueLogin;
use crate::rl::Job;
use crate::rl::SETTINGS;
use crate::rl::{self, JobRun, Progress, StepMetrics};
use crate::service::{DeviceOptions, TINY_MODEL_NAME};

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Job files (TOML; see examples/README.md).
    #[arg(required = true)]
    jobs: Vec<PathBuf>,
    /// Where the run's files go (default: a new folder under `runs/`). With several jobs, one
    /// folder per job inside it, named by the job file's stem.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in this folder from its last checkpoint (with several jobs, one folder
    /// per job inside it, as with `--out`).
    #[arg(long, conflicts_with = "out")]
    resume: Option<PathBuf>,
    /// Print one JSON summary line per job at the end.
    #[arg(long)]
    json: bool,
    /// Train and sample on the server at URL (`opentinker serve`, `http://host:port`) instead of
    /// in this process; the plugins still run here, sandboxed. Checkpoints stay on the server:
    /// each checkpoint folder names its `tinker://` path.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The tenant's API key for `--server` (`opentinker tenant create` prints one).
    #[arg(long, env = "TINKER_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The name under which `--server` serves the jobs' base model (default: `opentinker/tiny`
    /// for jobs on the built-in tiny model). The job's own `[model]` gives the tokenizer and chat
    /// template: the same model's files, on this machine.
    #[arg(long, value_name = "NAME", requires = "server")]
    base_model: Option<String>,
    /// Have rollout workers (`opentinker worker`) play the RL groups: the NATS JetStream queue
    /// at URL (`nats://host:port`) carries each group's task to them and its trajectories back.
    /// The workers sample on `--server` and fetch the jobs' plugins from it.
    #[arg(long, value_name = "URL", requires = "server")]
    rollouts: Option<String>,
    /// The pool of workers on the `--rollouts` queue that plays the groups (`opentinker worker
    /// --pool NAME`).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        requires = "rollouts"
    )]
    rollout_pool: String,
    /// The device to train and sample on in this process: `cpu`, or `cuda` / `cuda:N` (a build
    /// without the `cuda` feature, a machine without a driver or without that device each says
    /// so). With `--server`, the server's own `--device` decides.
    #[arg(long, default_value = "cpu", conflicts_with = "server")]
    device: Device,
    /// How the base's matrices are held in memory (LoRA trains on each; full-parameter
    /// training needs `f32`).
    #[arg(long, value_enum, default_value = "f32", conflicts_with = "server")]
    base_format: BaseFormat,
    #[command(flatten)]
    packages: super::market::PackageArgs,
}

/// Where `args` says to train: in process, or on a server under a base model name.
fn engine(args: &TrainArgs, jobs: &[(PathBuf, Job)]) -> anyhow::Result<Engine> {
    let Some(url) = &args.server else {
        args.device.check()?;
        return Ok(Engine::InProcess(DeviceOptions {
            device: args.device,
            base_format: args.base_format,
            ..DeviceOptions::cpu()
        }));
    };
    let api_key = args
        .api_key
        .clone()
        .context("--server needs the tenant's API key: give --api-key or set TINKER_API_KEY")?;
    let base_model = match &args.base_model {
        Some(name) => name.clone(),
        None => {
            let built_in = TinyModelSpec::built_in();
            if let Some((path, _)) = jobs.iter().find(|(_, job)| {
                job.model.dir.is_some() || job.model.init_tiny.as_ref() != Some(&built_in)
            }) {
                anyhow::bail!(
                    "{}: --server needs --base-model NAME, the name under which the server serves \
                     this job's model (only jobs on the built-in tiny model, init_tiny = {{ shape = \
                     \"tiny\", arch = \"qwen2\", seed = 0 }}, default to {TINY_MODEL_NAME})",
                    path.display()
                );
            }
            TINY_MODEL_NAME.to_string()
        }
    };
    Ok(Engine::Remote(RemoteEngine {
        url: url.clone(),
        api_key,
        base_model,
        rollouts: args.rollouts.clone().map(|url| RolloutQueue {
            url,
            pool: args.rollout_pool.clone(),
            login: QueueLogin::default(),
        }),
    }))
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    // Check every job file before training any.
    let jobs = args
        .jobs
        .iter()
        .map(|path| {
            Job::load(path)
                .map(|job| (path.clone(), job))
                .map_err(anyhow::Error::from)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let engine = engine(&args, &jobs)?;
    // Every file checked: now build the plugins given as source folders.
    let mut jobs = jobs;
    for (path, job) in &mut jobs {
        super::job_files::build_plugins(
            path,
            job,
            &args.packages,
            super::market::Unpinned::Install,
        )?;
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let runtime = super::runtime(jobs.len() + 1)?;
    let folder = args.resume.as_ref().or(args.out.as_ref());
    let runs: Vec<JobRun> = jobs
        .into_iter()
        .map(|(path, job)| {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "job".into());
            let out = match (folder, args.jobs.len()) {
                (Some(out), 1) => out.clone(),
                (Some(out), _) => out.join(&name),
                (None, _) => PathBuf::from("runs").join(format!("{name}-{stamp}")),
            };
            JobRun {
                name,
                file: path,
                job: Arc::new(job),
                out,
            }
        })
        .collect();
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    // A job's name names its folder and its adapters in the shared trainer.
    for (i, name) in names.iter().enumerate() {
        anyhow::ensure!(
            !names[..i].contains(name),
            "two job files are named {name:?}: each job of one `train` needs a file name of its own"
        );
    }
    for run in &runs {
        if !run.job.defaults.is_empty() {
            eprintln!(
                "{}: defaults (the file leaves them out; all settings in {}): {}",
                run.name,
                run.out.join(SETTINGS).display(),
                run.job.defaults.join(", ")
            );
        }
    }
    let shown: Vec<(String, &Job)> = runs.iter().map(|r| (r.name.clone(), &*r.job)).collect();
    let display = Arc::new(TrainProgress::new(&shown));
    let show: Progress = {
        let display = Arc::clone(&display);
        Arc::new(move |name: &str, line: &StepMetrics| display.show(name, line))
    };
    let summaries = runtime.block_on(rl::run_jobs(runs, args.resume.is_some(), &engine, show));
    display.finish();
    let summaries = summaries?;
    let mut failed = Vec::new();
    for (name, summary) in names.iter().zip(&summaries) {
        match summary {
            Ok(summary) if args.json => println!("{}", serde_json::to_string(summary)?),
            Ok(summary) => {
                eprintln!(
                    "{name}: eval reward {:.3} -> {:.3}; adapter in {}",
                    summary.initial_eval.reward_mean,
                    summary.final_eval.reward_mean,
                    summary.checkpoint.display()
                );
                if let Some(diagnosis) = &summary.diagnosis {
                    eprintln!("{name}: {diagnosis}");
                }
            }
            Err(error) => {
                eprintln!("{name}: failed: {error:#}");
                if args.json {
                    let line = serde_json::json!({ "job": name, "error": format!("{error:#}") });
                    println!("{line}");
                }
                failed.push(name.as_str());
            }
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {} jobs failed: {}",
        failed.len(),
        summaries.len(),
        failed.join(", ")
    );
    Ok(())
}
