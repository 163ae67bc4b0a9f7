//! The files of a run folder (OUT) and what `--resume` reads back:
//!
//! - `metrics.jsonl`: one line per step (SFT, then RL), and `report.png`, its curves;
//! - `rollouts/step-N.jsonl`: the trajectories sampled at RL step N;
//! - `base/`: the model after a full-parameter warm-up (a model directory of its own), with
//!   `warmup.json`, the number of metric lines it covers;
//! - `checkpoints/step-N/`: after N RL steps, one PEFT adapter folder per trained policy (with its
//!   optimizer state) and `cursor.json` (steps done, metric lines covered, evaluations so far);
//! - `job.json`: the job file the run was trained from, so `replay` finds the job of a rollout.
//!
//! Every folder is written under a temporary name, fsynced and renamed, so a run killed at any
//! moment leaves whole checkpoints only. No random state needs saving: every episode's seed and
//! every sampling seed derive from the job's seed, the step and the episode's place in its
//! group, so the cursor is the RNG state.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::metrics::{Evaluation, StepMetrics};
use crate::store::{StagedDir, write_atomic};

/// The metrics log of a run folder.
pub const METRICS: &str = "metrics.jsonl";
const CURSOR: &str = "cursor.json";
const WARMUP: &str = "warmup.json";
const JOB: &str = "job.json";
/// The training settings the run uses, every default filled in (`Job::settings`).
pub const SETTINGS: &str = "settings.toml";

/// Where training stands after a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cursor {
    /// RL steps done.
    pub steps: usize,
    /// Lines of `metrics.jsonl` this checkpoint covers.
    pub metric_lines: usize,
    /// Each trainable policy's first evaluation.
    pub initial_evals: BTreeMap<String, Evaluation>,
    /// Each trainable policy's latest evaluation.
    pub last_evals: BTreeMap<String, Evaluation>,
    /// What each policy did in its latest evaluation's episodes (their digests), so that the
    /// next evaluation's greedy agreement is the same after a resume.
    #[serde(default)]
    pub last_actions: BTreeMap<String, Vec<u64>>,
}

/// `metrics.jsonl`, appended one line at a time.
pub struct MetricsLog {
    file: std::fs::File,
    lines: usize,
}

impl MetricsLog {
    pub fn append(&mut self, line: &StepMetrics) -> anyhow::Result<()> {
        writeln!(self.file, "{}", serde_json::to_string(line)?)?;
        self.file.flush()?;
        self.lines += 1;
        Ok(())
    }

    /// Lines written so far (kept ones included).
    pub fn lines(&self) -> usize {
        self.lines
    }
}

/// A run's output folder.
#[derive(Clone)]
pub struct RunFolder {
    root: PathBuf,
}

impl RunFolder {
    pub fn create(root: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        Ok(RunFolder {
            root: root.to_path_buf(),
        })
    }

    /// A run folder that a `train` wrote, to read from.
    pub fn open(root: &Path) -> anyhow::Result<Self> {
        anyhow::ensure!(root.is_dir(), "{}: no such run folder", root.display());
        Ok(RunFolder {
            root: root.to_path_buf(),
        })
    }

    /// Record `job_file` (made absolute) as the job this run trains.
    pub fn record_job_file(&self, job_file: &Path) -> anyhow::Result<()> {
        let absolute = std::path::absolute(job_file)
            .with_context(|| format!("resolving {}", job_file.display()))?;
        let path = self.root.join(JOB);
        let text = serde_json::to_vec_pretty(&serde_json::json!({ "file": absolute }))?;
        write_atomic(&path, &text).with_context(|| format!("writing {}", path.display()))
    }

    /// Write the training settings the run uses (`Job::settings`), so that a run of a file that
    /// leaves them to the defaults still says what it ran with.
    pub fn record_settings(&self, settings: &toml::Table) -> anyhow::Result<()> {
        let path = self.root.join(SETTINGS);
        let text = format!(
            "# The training settings of this run, the job file's and the defaults it left out.\n{}",
            toml::to_string(settings)?
        );
        write_atomic(&path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
    }

    /// The job file [`RunFolder::record_job_file`] recorded, if any.
    pub fn job_file(&self) -> anyhow::Result<Option<PathBuf>> {
        let path = self.root.join(JOB);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let file = value["file"]
            .as_str()
            .with_context(|| format!("{}: no `file`", path.display()))?;
        Ok(Some(PathBuf::from(file)))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Open `metrics.jsonl` keeping its first `keep` lines (a fresh run keeps none): lines past
    /// the last checkpoint, and a line cut short by a kill, are dropped.
    pub fn metrics(&self, keep: usize) -> anyhow::Result<MetricsLog> {
        let path = self.root.join(METRICS);
        let kept: Vec<String> = match std::fs::read_to_string(&path) {
            Ok(text) if keep > 0 => text.lines().take(keep).map(str::to_string).collect(),
            _ => Vec::new(),
        };
        anyhow::ensure!(
            kept.len() == keep,
            "{} has {} lines but the checkpoint covers {keep}",
            path.display(),
            kept.len()
        );
        let text: String = kept.iter().map(|l| format!("{l}\n")).collect();
        write_atomic(&path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog { file, lines: keep })
    }

    /// Write the trajectories of RL step `step`, one JSON object per line.
    pub fn write_rollouts<T: Serialize>(&self, step: usize, records: &[T]) -> anyhow::Result<()> {
        let mut text = Vec::new();
        for record in records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        let path = self
            .root
            .join("rollouts")
            .join(format!("step-{step}.jsonl"));
        write_atomic(&path, &text).with_context(|| format!("writing {}", path.display()))
    }

    /// Draw `report.png` from the metrics so far.
    pub fn write_report(&self) -> anyhow::Result<()> {
        super::report::write_report(&self.root.join(METRICS), &self.root.join("report.png"))
    }

    pub fn base_dir(&self) -> PathBuf {
        self.root.join("base")
    }

    /// A warmed-up base model being written: its files go into the staged folder, then
    /// [`RunFolder::commit_base`] puts it in place.
    pub fn stage_base(&self) -> anyhow::Result<StagedDir> {
        let dir = self.base_dir();
        StagedDir::new(&dir).with_context(|| format!("writing {}", dir.display()))
    }

    /// Put a staged base in place, recording that it covers the first `metric_lines` lines.
    pub fn commit_base(&self, staged: StagedDir, metric_lines: usize) -> anyhow::Result<()> {
        let dir = self.base_dir();
        std::fs::write(
            staged.path().join(WARMUP),
            serde_json::to_vec(&serde_json::json!({ "metric_lines": metric_lines }))?,
        )
        .and_then(|()| staged.commit())
        .with_context(|| format!("writing {}", dir.display()))
    }

    /// The metric lines a saved base covers, if a whole one is there.
    pub fn saved_base(&self) -> anyhow::Result<Option<usize>> {
        let path = self.base_dir().join(WARMUP);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let lines = value["metric_lines"]
            .as_u64()
            .with_context(|| format!("{}: no `metric_lines`", path.display()))?;
        Ok(Some(lines as usize))
    }

    pub fn checkpoint_dir(&self, name: &str) -> PathBuf {
        self.root.join("checkpoints").join(name)
    }

    /// Checkpoint `cursor` being written: the policies' folders go into the staged folder,
    /// then [`RunFolder::commit_checkpoint`] puts it in place with the cursor, so a checkpoint
    /// is whole or absent.
    pub fn stage_checkpoint(&self, cursor: &Cursor) -> anyhow::Result<StagedDir> {
        let dir = self.checkpoint_dir(&format!("step-{}", cursor.steps));
        StagedDir::new(&dir).with_context(|| format!("writing {}", dir.display()))
    }

    pub fn commit_checkpoint(&self, staged: StagedDir, cursor: &Cursor) -> anyhow::Result<PathBuf> {
        let dir = self.checkpoint_dir(&format!("step-{}", cursor.steps));
        std::fs::write(
            staged.path().join(CURSOR),
            serde_json::to_vec_pretty(cursor)?,
        )
        .and_then(|()| staged.commit())
        .with_context(|| format!("writing {}", dir.display()))?;
        Ok(dir)
    }

    /// The checkpoint with the most steps, and its cursor.
    pub fn latest_checkpoint(&self) -> anyhow::Result<Option<(PathBuf, Cursor)>> {
        let Ok(entries) = std::fs::read_dir(self.root.join("checkpoints")) else {
            return Ok(None);
        };
        let mut best: Option<(usize, PathBuf)> = None;
        for entry in entries {
            let path = entry?.path();
            let steps = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(steps) = steps
                && path.join(CURSOR).is_file()
                && best.as_ref().is_none_or(|(b, _)| steps > *b)
            {
                best = Some((steps, path));
            }
        }
        let Some((_, dir)) = best else {
            return Ok(None);
        };
        let path = dir.join(CURSOR);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let cursor =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        Ok(Some((dir, cursor)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::metrics::Phase;

    fn line(step: usize) -> StepMetrics {
        StepMetrics {
            step,
            phase: Phase::Rl,
            ..StepMetrics::default()
        }
    }

    #[test]
    fn metrics_keep_only_the_lines_a_checkpoint_covers() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunFolder::create(dir.path()).unwrap();
        let mut log = run.metrics(0).unwrap();
        for step in 0..3 {
            log.append(&line(step)).unwrap();
        }
        // A kill mid-line leaves a partial last line.
        let path = dir.path().join(METRICS);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"{\"step\": 3, \"pha").unwrap();
        let mut log = run.metrics(2).unwrap();
        log.append(&line(7)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let steps: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, vec![0, 1, 7]);
        assert!(run.metrics(9).is_err(), "more lines than the file has");
    }

    #[test]
    fn the_latest_whole_checkpoint_wins() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunFolder::create(dir.path()).unwrap();
        let evals = BTreeMap::from([("policy".to_string(), Evaluation::default())]);
        for steps in [2, 10, 4] {
            let cursor = Cursor {
                steps,
                metric_lines: steps + 1,
                initial_evals: evals.clone(),
                last_evals: evals.clone(),
                last_actions: BTreeMap::new(),
            };
            let staged = run.stage_checkpoint(&cursor).unwrap();
            std::fs::create_dir(staged.path().join("policy")).unwrap();
            run.commit_checkpoint(staged, &cursor).unwrap();
        }
        // A checkpoint cut short by a kill has no cursor and is ignored.
        std::fs::create_dir_all(run.checkpoint_dir("step-12")).unwrap();
        let (dir, cursor) = run.latest_checkpoint().unwrap().unwrap();
        assert_eq!(cursor.steps, 10);
        assert_eq!(cursor.metric_lines, 11);
        assert!(dir.ends_with("step-10") && dir.join("policy").is_dir());
        // One whose policies failed to write is never committed, and leaves nothing behind.
        let staged = run
            .stage_checkpoint(&Cursor {
                steps: 20,
                ..cursor
            })
            .unwrap();
        std::fs::create_dir(staged.path().join("policy")).unwrap();
        drop(staged);
        assert_eq!(run.latest_checkpoint().unwrap().unwrap().1.steps, 10);
        let left: Vec<_> = std::fs::read_dir(run.root().join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!left.iter().any(|name| name.starts_with('.')), "{left:?}");
    }
}
