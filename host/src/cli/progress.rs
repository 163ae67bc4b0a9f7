//! What `train` shows while it runs: on a terminal, one progress bar per job (step, reward,
//! episodes/s, tokens/s, ETA) with each step's line printed above the bars; elsewhere (a pipe, a
//! log file, the tests) the lines alone.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::rl::driver::StepMetrics;
use crate::rl::job::Job;

/// A job's bar and what a step of each phase plays.
struct JobBar {
    bar: ProgressBar,
    sft_steps: usize,
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
                    sft_steps,
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

    /// Show one metrics line of job `name`.
    pub fn show(&self, name: &str, line: &StepMetrics) {
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
        let text = format!(
            "{name} {:>6} {:>4}  reward {:.3}  loss {:.4}  tokens {:>6}  {:.1}s{eval}",
            line.phase, line.step, line.reward_mean, line.loss, line.tokens, line.seconds
        );
        let Some(job) = self.bars.get(name) else {
            eprintln!("{text}");
            return;
        };
        let (done, episodes) = match line.phase {
            "rl" => (job.sft_steps + line.step + 1, job.rl_episodes),
            _ => (line.step + 1, job.sft_batch),
        };
        let seconds = line.seconds.max(1e-9);
        job.bar.println(text);
        job.bar.set_position(done as u64);
        job.bar.set_message(format!(
            "{} reward {:.3}  {:.1} episodes/s  {:.0} tokens/s",
            line.phase,
            line.reward_mean,
            episodes as f64 / seconds,
            line.tokens as f64 / seconds
        ));
    }

    pub fn finish(&self) {
        for job in self.bars.values() {
            job.bar.finish();
        }
    }
}
