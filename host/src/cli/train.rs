//! `opentinker train JOB.toml... [--out OUT] [--json]`: run training jobs.

use std::path::PathBuf;

use anyhow::Context;

use crate::rl::driver::{self, StepMetrics};
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
                .map(|job| (path, job))
                .map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    for (path, job) in &jobs {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "job".into());
        let out = match (args.resume.as_ref().or(args.out.as_ref()), jobs.len()) {
            (Some(out), 1) => out.clone(),
            (Some(out), _) => out.join(&stem),
            (None, _) => PathBuf::from("runs").join(format!("{stem}-{stamp}")),
        };
        let show = |line: &StepMetrics| {
            let eval = line
                .eval
                .as_ref()
                .map(|e| format!("  eval {:.3}", e.reward_mean))
                .unwrap_or_default();
            eprintln!(
                "{stem} {:>6} {:>4}  reward {:.3}  loss {:.4}  tokens {:>6}  {:.1}s{eval}",
                line.phase, line.step, line.reward_mean, line.loss, line.tokens, line.seconds
            );
        };
        let summary = runtime.block_on(driver::run(job, &out, args.resume.is_some(), &show))?;
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            eprintln!(
                "{stem}: eval reward {:.3} -> {:.3}; adapter in {}",
                summary.initial_eval.reward_mean,
                summary.final_eval.reward_mean,
                summary.checkpoint.display()
            );
        }
    }
    Ok(())
}
