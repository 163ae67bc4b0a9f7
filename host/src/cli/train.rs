//! `opentinker train JOB.toml... [--out OUT | --resume OUT] [--json]`: run training jobs.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::progress::TrainProgress;
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
    let shown: Vec<(String, &Job)> = runs.iter().map(|r| (r.name.clone(), &*r.job)).collect();
    let display = Arc::new(TrainProgress::new(&shown));
    let show: Progress = {
        let display = Arc::clone(&display);
        Arc::new(move |name: &str, line: &StepMetrics| display.show(name, line))
    };
    let summaries = runtime.block_on(driver::run_jobs(runs, args.resume.is_some(), show));
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
