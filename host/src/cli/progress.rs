//! What `train` shows while it runs: on a terminal, one progress bar per job (step, reward,
//! episodes/s, tokens/s, ETA) with each step's line printed above the bars; elsewhere (a pipe, a
//! log file, the tests) the lines alone.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::terminal::terminal_safe;
use crate::rl::Job;
use crate::rl::{Evaluation, Phase, StepMetrics};

/// A job's bar and what a step of each phase plays.
struct JobBar {
    bar: ProgressBar,
    rl_steps: usize,
    sft_batch: usize,
    rl_episodes: usize,
}

pub struct TrainProgress {
    bars: BTreeMap<String, JobBar>,
    /// Held so the bars draw together.
    _multi: Option<MultiProgress>,
}

impl TrainProgress {
    /// Bars for `jobs` (name, job) when stderr is a terminal.
    pub fn new(jobs: &[(String, &Job)]) -> Self {
        if !std::io::stderr().is_terminal() {
            return TrainProgress {
                bars: BTreeMap::new(),
                _multi: None,
            };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let style =
            ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos:>4}/{len} {msg} ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        let bars = jobs
            .iter()
            .map(|(name, job)| {
                let sft_steps = job.sft.as_ref().map_or(0, |s| s.steps);
                let bar = multi.add(ProgressBar::new((sft_steps + job.rl.steps) as u64));
                bar.set_style(style.clone());
                bar.set_prefix(name.clone());
                let state = JobBar {
                    bar,
                    rl_steps: job.rl.steps,
                    sft_batch: job.sft.as_ref().map_or(0, |s| s.batch),
                    rl_episodes: job.rl.groups_per_batch * job.rl.group_size,
                };
                (name.clone(), state)
            })
            .collect();
        TrainProgress {
            bars,
            _multi: Some(multi),
        }
    }

    /// Show one metrics line of job `name`: its figures, the evaluation before RL (on the
    /// first RL line) and any later one, and failed episodes with the first failure's text.
    pub fn show(&self, name: &str, line: &StepMetrics) {
        let before = line
            .initial_evals
            .values()
            .next()
            .map_or(String::new(), |eval| {
                format!("  before RL:{}", describe(eval))
            });
        let agreement = line.greedy_agreement.map_or(String::new(), |a| {
            format!(" (greedy as before: {:.0}%)", a * 100.0)
        });
        let eval = line.eval.as_ref().map_or(String::new(), |eval| {
            format!("  eval:{}{agreement}", describe(eval))
        });
        let errors = match line.errors.is_empty() {
            true => String::new(),
            false => {
                let counts: Vec<String> = line
                    .errors
                    .iter()
                    .map(|(kind, count)| format!("{kind} {count}"))
                    .collect();
                let first = line
                    .error_messages
                    .values()
                    .next()
                    .map_or(String::new(), |m| {
                        let shown: String = m.chars().take(120).collect();
                        format!(" (first: {})", terminal_safe(&shown))
                    });
                format!("  failed: {}{first}", counts.join(", "))
            }
        };
        // An SFT step has no episodes, so no reward: its figures are the loss and the tokens.
        // An RL step's signal: groups whose returns tie, and the mean |advantage|.
        let reward = match line.phase {
            Phase::Rl => format!(
                "  reward {:.3}  tied {:.2}  |adv| {:.3}",
                line.reward_mean, line.tied_groups, line.advantage_abs_mean
            ),
            Phase::Sft => String::new(),
        };
        let stop = line.warmup_stop.as_ref().map_or(String::new(), |why| {
            format!("\n{name} warm-up stopped after step {}: {why}", line.step)
        });
        let text = format!(
            "{name} {:>6} {:>4}{reward}  loss {:.4}  tokens {:>6}  {:.1}s{before}{eval}{errors}{stop}",
            line.phase, line.step, line.loss, line.tokens, line.seconds
        );
        let Some(job) = self.bars.get(name) else {
            eprintln!("{text}");
            return;
        };
        if line.warmup_stop.is_some() {
            job.bar.set_length((line.step + 1 + job.rl_steps) as u64);
        }
        // The warm-up's steps are the bar's first (as many as it ran), RL's the rest.
        let warmup_steps = (job.bar.length().unwrap_or(0) as usize).saturating_sub(job.rl_steps);
        let (done, episodes) = match line.phase {
            Phase::Rl => (warmup_steps + line.step + 1, job.rl_episodes),
            Phase::Sft => (line.step + 1, job.sft_batch),
        };
        let seconds = line.seconds.max(1e-9);
        job.bar.println(text);
        job.bar.set_position(done as u64);
        job.bar.set_message(match line.phase {
            Phase::Rl => format!(
                "rl reward {:.3}  {:.1} episodes/s  {:.0} tokens/s",
                line.reward_mean,
                episodes as f64 / seconds,
                line.tokens as f64 / seconds
            ),
            Phase::Sft => format!(
                "sft loss {:.4}  {:.0} tokens/s",
                line.loss,
                line.tokens as f64 / seconds
            ),
        });
    }

    pub fn finish(&self) {
        for job in self.bars.values() {
            job.bar.finish();
        }
    }
}

/// An evaluation's figures: the held-out loss of SFT, or reward and success rate (and failed
/// episodes) of an RL evaluation.
fn describe(eval: &Evaluation) -> String {
    match eval.loss {
        Some(loss) => format!(" loss {loss:.4}"),
        None => {
            let failed: usize = eval.errors.values().sum();
            let failed = match failed {
                0 => String::new(),
                n => format!(" ({n} failed)"),
            };
            format!(
                " reward {:.3} success {:.3}{failed}",
                eval.reward_mean, eval.success_rate
            )
        }
    }
}
