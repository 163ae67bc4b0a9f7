//! `opentinker play JOB.toml` and `opentinker replay ROLLOUTS.jsonl --index I`: watch what a
//! trained policy does, and check a recorded episode comes back exactly.

use std::path::PathBuf;

use serde_json::json;

use super::terminal::terminal_safe;
use crate::rl::Evaluation;
use crate::rl::watch::{self, AdapterChoice, PlayOptions};

#[derive(Debug, clap::Args)]
pub struct PlayArgs {
    /// The job file (TOML) whose environment, agent and policies play.
    job: PathBuf,
    #[command(flatten)]
    packages: super::market::PackageArgs,
    /// The run folder a `train` of the job wrote: its model, warm-up and adapters.
    #[arg(long)]
    run: Option<PathBuf>,
    /// An adapter folder (PEFT format) for the watched policy, instead of the run's.
    #[arg(long, conflicts_with = "checkpoint")]
    adapter: Option<PathBuf>,
    /// The run's checkpoint after this many RL steps (default: its final adapters, else its
    /// latest checkpoint).
    #[arg(long)]
    checkpoint: Option<usize>,
    /// The trainable policy whose evaluation is played (default: the job's first).
    #[arg(long)]
    policy: Option<String>,
    /// The first episode's seed (default: the seeds of the job's evaluation).
    #[arg(long)]
    seed: Option<u64>,
    /// Episodes to play (default: the job's evaluation episodes).
    #[arg(long)]
    episodes: Option<usize>,
    /// Sample at temperature 0, as evaluations do (default: the job's sampling settings).
    #[arg(long)]
    greedy: bool,
    /// One JSON line per episode, then one with the summary.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// A rollouts file of a run: OUT/rollouts/step-N.jsonl.
    rollouts: PathBuf,
    #[command(flatten)]
    packages: super::market::PackageArgs,
    /// The episode to replay: its line in the file, from 0.
    #[arg(long)]
    index: usize,
    /// The job file (default: the one the run recorded).
    #[arg(long)]
    job: Option<PathBuf>,
}

pub fn run_play(args: PlayArgs) -> anyhow::Result<()> {
    let job = super::job_files::load_and_build(&args.job, &args.packages)?;
    let adapters = match (args.adapter, args.checkpoint) {
        (Some(dir), _) => AdapterChoice::Dir(dir),
        (None, Some(steps)) => AdapterChoice::Checkpoint(steps),
        (None, None) => AdapterChoice::Latest,
    };
    let options = PlayOptions {
        run: args.run,
        adapters,
        policy: args.policy,
        first_seed: args.seed,
        episodes: args.episodes,
        greedy: args.greedy,
    };
    let played = super::runtime(2)?.block_on(watch::play(&job, &options))?;
    if args.json {
        for outcome in &played.outcomes {
            let line = json!({
                "seed": outcome.seed,
                "task": outcome.task,
                "returns": outcome.returns(),
                "steps": outcome.steps,
                "error": outcome.failure.as_ref().map(|f| f.kind),
                "error_message": outcome.failure.as_ref().and_then(|f| f.message.as_ref()),
                "messages": outcome.messages,
            });
            println!("{line}");
        }
        let summary = json!({
            "summary": played.summary,
            "policy": played.policy,
            "player": played.player,
            "adapters": played.sources,
        });
        println!("{summary}");
        return Ok(());
    }
    let sources: Vec<String> = played
        .sources
        .iter()
        .map(|(policy, source)| format!("{policy}: {source}"))
        .collect();
    let episodes = match played.outcomes.len() {
        1 => "1 episode".to_string(),
        n => format!("{n} episodes"),
    };
    println!(
        "policy `{}` as player {} ({}); {episodes}, {}",
        played.policy,
        played.player,
        sources.join(", "),
        match options.greedy {
            true => "greedy",
            false => "sampled as in training",
        }
    );
    let total = played.outcomes.len();
    for (n, outcome) in played.outcomes.iter().enumerate() {
        println!(
            "\n── episode {}/{total} · seed {} · task {}",
            n + 1,
            outcome.seed,
            terminal_safe(&outcome.task)
        );
        // Players the environment plays itself (a built-in opponent) have no messages.
        let acted: Vec<usize> = (0..outcome.messages.len())
            .filter(|&p| !outcome.messages[p].is_empty())
            .collect();
        for &player in &acted {
            let messages = &outcome.messages[player];
            println!("  player {player}:");
            for message in messages {
                // Line breaks are the message's own (a board); other control characters are
                // escaped, so a plugin cannot draw on the terminal.
                let role = terminal_safe(&message.role);
                let indent = " ".repeat(role.chars().count() + 6);
                for (i, line) in message.content.split('\n').enumerate() {
                    match i {
                        0 => println!("    {role}: {}", terminal_safe(line)),
                        _ if line.is_empty() => println!(),
                        _ => println!("{indent}{}", terminal_safe(line)),
                    }
                }
            }
        }
        let returns = outcome.returns();
        let returns: Vec<String> = acted
            .iter()
            .map(|&p| format!("player {p} {:.3}", returns.get(p).copied().unwrap_or(0.0)))
            .collect();
        println!("  returns: {}", returns.join(", "));
        if let Some(failure) = &outcome.failure {
            println!(
                "  failed: {}: {}",
                failure.kind,
                terminal_safe(failure.message.as_deref().unwrap_or("(no message)"))
            );
        }
    }
    println!("\n{}", summary_line(played.player, &played.summary));
    Ok(())
}

/// An evaluation's figures in one line, as the training progress shows them.
fn summary_line(player: usize, summary: &Evaluation) -> String {
    let errors = match summary.errors.is_empty() {
        true => "none".to_string(),
        false => summary
            .errors
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "summary (player {player}): {} episode{}, reward {:.3}, success {:.3}, {:.1} steps an \
         episode, failures: {errors}",
        summary.episodes,
        if summary.episodes == 1 { "" } else { "s" },
        summary.reward_mean,
        summary.success_rate,
        summary.episode_steps
    )
}

pub fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let job_file = watch::replay_job_file(&args.rollouts, args.job.as_deref())?;
    let job = super::job_files::load_and_build(&job_file, &args.packages)?;
    let replayed = super::runtime(2)?.block_on(watch::replay(&job, &args.rollouts, args.index))?;
    let what = format!(
        "step {} group {} episode {} (seed {})",
        replayed.step, replayed.group, replayed.index, replayed.seed
    );
    match replayed.mismatch {
        None => {
            println!(
                "reproduced {what}: {} tokens and {} messages identical",
                replayed.tokens, replayed.messages
            );
            Ok(())
        }
        Some(difference) => anyhow::bail!(
            "replaying {what} did not reproduce the record: {}",
            terminal_safe(&difference)
        ),
    }
}
