//! `opentinker train JOB.toml... [--out OUT] [--json]`: run training jobs.

use std::path::PathBuf;

use anyhow::Context;

use std::sync::Arc;

use crate::rl::driver::{self, JobRun, Progress, StepMetrics};
use crate::rl::job::Job;

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
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    // Check every job file before training any.
    let jobs = args
        .jobs
        .iter()
        .map(|path| {
            Job::load(path)
                .map(|job| (path.clone(), job))
                .map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(jobs.len() + 1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
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
            JobRun { name, job, out }
        })
        .collect();
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    let show: Progress = Arc::new(|name: &str, line: &StepMetrics| {
        let eval = match &line.eval {
            Some(eval) => match eval.loss {
                Some(loss) => format!("  eval loss {loss:.4}"),
                None => format!(
                    "  eval reward {:.3} success {:.3}",
                    eval.reward_mean, eval.success_rate
                ),
            },
            None => String::new(),
        };
        eprintln!(
            "{name} {:>6} {:>4}  reward {:.3}  loss {:.4}  tokens {:>6}  {:.1}s{eval}",
            line.phase, line.step, line.reward_mean, line.loss, line.tokens, line.seconds
        );
    });
    let summaries = runtime.block_on(driver::run_jobs(runs, args.resume.is_some(), show))?;
    for (name, summary) in names.iter().zip(&summaries) {
        if args.json {
            println!("{}", serde_json::to_string(summary)?);
        } else {
            eprintln!(
                "{name}: eval reward {:.3} -> {:.3}; adapter in {}",
                summary.initial_eval.reward_mean,
                summary.final_eval.reward_mean,
                summary.checkpoint.display()
            );
        }
    }
    Ok(())
}
