//! Watching a policy act. `play` runs episodes of a job's environment with its trained adapters
//! (by default the episodes of the job's evaluation, so a greedy `play` shows the games behind
//! an evaluation figure) and hands them back whole; `replay` re-runs one recorded training
//! episode from its seed with the adapters that played it and says whether every token, message
//! and reward came back: the determinism the batch-invariant sampler promises, made visible.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::context::{
    JobContext, JobPlugins, ModelInfo, eval_seeds, greedy_params, play_batch, rollout,
    sampling_params, summarize,
};
use super::driver::model_dir;
use super::failure::FailureKind;
use super::job::{Job, PolicySection};
use super::metrics::Evaluation;
use super::rollout::{EpisodeOutcome, RolloutRecord};
use super::run_folder::RunFolder;
use super::training_loop::Versions;
use crate::client::{DeviceOptions, LocalBase, SamplingClient, TrainingClient};
use crate::plugin::{HostConfig, PluginHost};

/// Which adapters play.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterChoice {
    /// The run's final adapters, else its latest checkpoint, else fresh ones (the base model).
    Latest,
    /// The run's checkpoint after this many RL steps.
    Checkpoint(usize),
    /// This adapter folder for the watched policy; any other policy plays the base model.
    Dir(PathBuf),
    /// No adapters: every policy plays the base model (as fresh adapters compute).
    Base,
}

/// What `play` plays.
#[derive(Clone, Debug)]
pub struct PlayOptions {
    /// The run folder a `train` of the job wrote (its model, warm-up and checkpoints).
    pub run: Option<PathBuf>,
    pub adapters: AdapterChoice,
    /// The trainable policy whose evaluation is played (default: the job's first).
    pub policy: Option<String>,
    /// The first episode's seed (default: the evaluation's seeds).
    pub first_seed: Option<u64>,
    /// Episodes to play (default: the job's evaluation episodes).
    pub episodes: Option<usize>,
    /// Sample at temperature 0, as evaluations do (default: the job's sampling parameters).
    pub greedy: bool,
}

/// Episodes `play` played, with the evaluation-style figures of the watched player.
pub struct Played {
    pub policy: String,
    /// Where each trainable policy's adapter came from (`base` for none).
    pub sources: BTreeMap<String, String>,
    /// The player whose return the figures score.
    pub player: usize,
    pub outcomes: Vec<EpisodeOutcome>,
    pub summary: Evaluation,
}

/// A job's model served in this process with the adapters of its run, ready to play.
struct Stage {
    cx: JobContext,
    versions: Versions,
    sources: BTreeMap<String, String>,
    /// The adapters' training clients: an adapter lives as long as its client.
    _trainers: Vec<Arc<dyn TrainingClient>>,
    /// Where a tiny model was generated when there was no run folder to hold it.
    _scratch: Option<tempfile::TempDir>,
}

impl Stage {
    /// Load the job's model as `run` left it (its generated tiny model, its full-parameter
    /// warm-up), its plugins, and each trainable policy's adapter as `adapters` says (`watched`
    /// is the policy a [`AdapterChoice::Dir`] belongs to).
    async fn new(
        job: &Job,
        run: Option<&RunFolder>,
        adapters: &AdapterChoice,
        watched: &str,
    ) -> anyhow::Result<Stage> {
        let host = PluginHost::new(HostConfig::default())?;
        let plugins = JobPlugins::load(&host, job, "play").await?;
        let mut scratch = None;
        let dir = match (run, &job.model.dir) {
            (Some(run), _) => model_dir(job, run.root())?,
            (None, Some(dir)) => dir.clone(),
            (None, None) => {
                // A tiny model is generated from its seed: the same weights as the run's.
                let temp = tempfile::tempdir().context("making a folder for the tiny model")?;
                let dir = model_dir(job, temp.path())?;
                scratch = Some(temp);
                dir
            }
        };
        let mut model = LocalBase::load(&dir, DeviceOptions::cpu())?;
        if let Some(run) = run
            && run.saved_base()?.is_some()
        {
            model.load_weights(&run.base_dir())?;
        }
        let info = Arc::new(ModelInfo::of(model.text(), model.context_length())?);
        let episodes = job
            .eval
            .episodes
            .max(job.rl.group_size * job.rl.groups_per_batch);
        let kv_budget = episodes.max(1) * (256 + job.rl.max_tokens) * job.rl.max_turns.max(1);
        let service = model.serve(dir.display().to_string(), kv_budget)?;
        let cx = JobContext::new(plugins, job, info);

        let policies = job.policies();
        let multi_agent = policies.len() > 1;
        let mut versions = BTreeMap::new();
        let mut sources = BTreeMap::new();
        let mut trainers = Vec::new();
        for policy in policies.iter().filter(|p| p.trainable) {
            let Some(folder) = adapter_folder(run, adapters, policy, watched, multi_agent)? else {
                sources.insert(policy.name.clone(), "base".to_string());
                continue;
            };
            let trainer = service
                .create_training_client_from_state(&policy.name, &folder, false)
                .await
                .with_context(|| format!("loading the adapter in {}", folder.display()))?;
            versions.insert(
                policy.name.clone(),
                trainer.save_weights_and_get_sampling_client().await?,
            );
            sources.insert(policy.name.clone(), folder.display().to_string());
            trainers.push(trainer);
        }
        let base: Arc<dyn SamplingClient> = service.base_sampling_client();
        Ok(Stage {
            cx,
            versions: Versions {
                versions,
                ..Versions::new(policies, base)
            },
            sources,
            _trainers: trainers,
            _scratch: scratch,
        })
    }
}

/// The folder `policy`'s adapter loads from, or `None` for the base model.
fn adapter_folder(
    run: Option<&RunFolder>,
    adapters: &AdapterChoice,
    policy: &PolicySection,
    watched: &str,
    multi_agent: bool,
) -> anyhow::Result<Option<PathBuf>> {
    let needs_run = |what: &str| -> anyhow::Result<&RunFolder> {
        run.with_context(|| format!("{what} needs the run folder (--run)"))
    };
    match adapters {
        AdapterChoice::Base => Ok(None),
        AdapterChoice::Dir(dir) => Ok((policy.name == watched).then(|| dir.clone())),
        AdapterChoice::Checkpoint(steps) => {
            let dir = needs_run("--checkpoint")?
                .checkpoint_dir(&format!("step-{steps}"))
                .join(&policy.name);
            anyhow::ensure!(
                dir.is_dir(),
                "{}: no checkpoint of policy `{}` after {steps} steps",
                dir.display(),
                policy.name
            );
            Ok(Some(dir))
        }
        AdapterChoice::Latest => {
            let Some(run) = run else { return Ok(None) };
            let last = run.checkpoint_dir("final");
            let last = match multi_agent {
                true => last.join(&policy.name),
                false => last,
            };
            if last.is_dir() {
                return Ok(Some(last));
            }
            Ok(run
                .latest_checkpoint()?
                .map(|(dir, _)| dir.join(&policy.name)))
        }
    }
}

/// The trainable policy named `name`, or the job's first.
fn watched_policy(job: &Job, name: Option<&str>) -> anyhow::Result<PolicySection> {
    let policies = job.policies();
    let mut trainable = policies.iter().filter(|p| p.trainable);
    let policy = match name {
        Some(name) => trainable.find(|p| p.name == name),
        None => trainable.next(),
    };
    policy.cloned().with_context(|| match name {
        Some(name) => format!(
            "the job has no trainable policy `{name}` (it has: {})",
            policies
                .iter()
                .filter(|p| p.trainable)
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "the job has no trainable policy".to_string(),
    })
}

/// Play `options`' episodes of `job` with its run's adapters: the watched policy's evaluation
/// (its evaluation config, or the job's environment in its seat with every policy in its own).
pub async fn play(job: &Job, options: &PlayOptions) -> anyhow::Result<Played> {
    let policy = watched_policy(job, options.policy.as_deref())?;
    let run = options.run.as_deref().map(RunFolder::open).transpose()?;
    let stage = Stage::new(job, run.as_ref(), &options.adapters, &policy.name).await?;
    let (config, actors, player) = stage.versions.evaluation_of(&stage.cx, &policy);
    let episodes = options.episodes.unwrap_or(job.eval.episodes);
    let seeds = match options.first_seed {
        Some(first) => (0..episodes as u64).map(|i| first + i).collect(),
        None => eval_seeds(episodes),
    };
    let params = match options.greedy {
        true => greedy_params(job),
        false => sampling_params(job),
    };
    let outcomes = play_batch(&stage.cx, job, &config, &seeds, &actors, Some(params)).await?;
    Ok(Played {
        policy: policy.name,
        sources: stage.sources,
        player,
        summary: summarize(&outcomes, player),
        outcomes,
    })
}

/// What `replay` found.
#[derive(Debug)]
pub struct Replayed {
    /// The RL step the episode was recorded at.
    pub step: usize,
    pub group: usize,
    pub index: usize,
    pub seed: u64,
    /// The first difference between the recorded episode and the replayed one, if any.
    pub mismatch: Option<String>,
    /// Tokens and messages compared.
    pub tokens: usize,
    pub messages: usize,
}

/// The job file a rollouts file `OUT/rollouts/step-N.jsonl` was played by: `job_file` when
/// given, else the one its run recorded.
pub fn replay_job_file(rollouts: &Path, job_file: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(file) = job_file {
        return Ok(file.to_path_buf());
    }
    let root = run_root(rollouts)?;
    RunFolder::open(root)?.job_file()?.with_context(|| {
        format!(
            "{} records no job file (a run of an older opentinker): name it with --job",
            root.display()
        )
    })
}

/// The run folder above a rollouts file.
fn run_root(rollouts: &Path) -> anyhow::Result<&Path> {
    rollouts
        .parent()
        .and_then(Path::parent)
        .with_context(|| format!("{}: no run folder above it", rollouts.display()))
}

/// Re-run episode `index` (its line number, from 0) of a rollouts file `OUT/rollouts/step-N.jsonl`
/// of `job` from its seed, with the adapters that played step N (the checkpoint after N steps),
/// and compare everything recorded of it.
pub async fn replay(job: &Job, rollouts: &Path, index: usize) -> anyhow::Result<Replayed> {
    let step = rollouts
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| {
            n.strip_prefix("step-")?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()
        })
        .with_context(|| {
            format!(
                "{}: not a rollouts file (expected OUT/rollouts/step-N.jsonl)",
                rollouts.display()
            )
        })?;
    let run = RunFolder::open(run_root(rollouts)?)?;
    anyhow::ensure!(
        !job.rl.asynchronous(),
        "replay re-runs episodes of sync-mode jobs: an async job's groups may have played with \
         older versions than the checkpoint of their step"
    );
    let text = std::fs::read_to_string(rollouts)
        .with_context(|| format!("reading {}", rollouts.display()))?;
    let line = text.lines().nth(index).with_context(|| {
        format!(
            "{} has {} episodes; there is no index {index}",
            rollouts.display(),
            text.lines().count()
        )
    })?;
    let recorded: RolloutRecord = serde_json::from_str(line)
        .with_context(|| format!("{} line {}", rollouts.display(), index + 1))?;

    // The adapters that played step N: the checkpoint after N steps; before any training (step
    // 0 without a warm-up of the adapters), fresh adapters, which compute as the base model.
    let checkpoint = run.checkpoint_dir(&format!("step-{step}"));
    let adapters = match checkpoint.is_dir() {
        true => AdapterChoice::Checkpoint(step),
        false if step == 0 && job.sft.as_ref().is_none_or(|s| s.full_parameters) => {
            AdapterChoice::Base
        }
        false => anyhow::bail!(
            "step {step} was played by the adapters after {step} steps, which the run did not \
             checkpoint ({} is missing; checkpoint.every = {}): replay a checkpointed step",
            checkpoint.display(),
            job.checkpoint.every
        ),
    };
    let stage = Stage::new(job, Some(&run), &adapters, "").await?;
    let actors = stage.versions.actors();
    let group_seed = recorded
        .seed
        .checked_sub(recorded.index as u64)
        .map(|s| s / 1000)
        .context("the record's seed is not an episode seed of its group")?;
    let task = stage
        .cx
        .environment()?
        .generate_task(&stage.cx.config, group_seed, &stage.cx.limits)
        .await
        .map_err(|error| anyhow::anyhow!("generating the task of seed {group_seed}: {error}"))?;
    let played = rollout(&stage.cx, job, &stage.cx.config, sampling_params(job))?
        .play(&task, recorded.seed, &actors)
        .await;
    let sequences: Vec<_> = played
        .transcripts
        .iter()
        .enumerate()
        .filter_map(|(seat, t)| Some((seat, t.clone()?.into_sequences(), Vec::new())))
        .collect();
    let replayed = RolloutRecord::new(recorded.group, recorded.index, &played, &sequences);
    // A group scorer's score depends on the whole group, which one episode does not replay.
    let group_scored = job.reward.as_ref().is_some_and(|r| r.group);
    Ok(Replayed {
        step,
        group: recorded.group,
        index: recorded.index,
        seed: recorded.seed,
        mismatch: first_difference(&recorded, &replayed, !group_scored),
        tokens: recorded.sequences.iter().map(|s| s.tokens.len()).sum(),
        messages: recorded.messages.iter().map(Vec::len).sum(),
    })
}

/// The first difference between a recorded episode and its replay, in words.
fn first_difference(
    recorded: &RolloutRecord,
    replayed: &RolloutRecord,
    compare_rewards: bool,
) -> Option<String> {
    if recorded.task != replayed.task {
        return Some(format!(
            "the task: recorded {:?}, replayed {:?}",
            recorded.task, replayed.task
        ));
    }
    if recorded.error != replayed.error {
        return Some(format!(
            "the failure: recorded {}, replayed {}",
            recorded.error.map_or("none", FailureKind::as_str),
            replayed.error.map_or("none", FailureKind::as_str)
        ));
    }
    for (player, (a, b)) in recorded.messages.iter().zip(&replayed.messages).enumerate() {
        if let Some(m) = (0..a.len().max(b.len())).find(|&m| a.get(m) != b.get(m)) {
            return Some(format!(
                "player {player}'s message {m}: recorded {:?}, replayed {:?}",
                a.get(m),
                b.get(m)
            ));
        }
    }
    if recorded.messages.len() != replayed.messages.len() {
        return Some(format!(
            "the players: recorded {}, replayed {}",
            recorded.messages.len(),
            replayed.messages.len()
        ));
    }
    if recorded.sequences.len() != replayed.sequences.len() {
        return Some(format!(
            "the token sequences: recorded {}, replayed {}",
            recorded.sequences.len(),
            replayed.sequences.len()
        ));
    }
    for (s, (a, b)) in recorded
        .sequences
        .iter()
        .zip(&replayed.sequences)
        .enumerate()
    {
        let tokens = (0..a.tokens.len().max(b.tokens.len()))
            .find(|&t| a.tokens.get(t) != b.tokens.get(t) || a.mask.get(t) != b.mask.get(t));
        if let Some(t) = tokens {
            return Some(format!(
                "sequence {s} (player {}) at token {t}: recorded {:?}, replayed {:?}",
                a.player,
                a.tokens.get(t),
                b.tokens.get(t)
            ));
        }
        let logprob = (0..a.logprobs.len()).find(|&t| a.logprobs[t] != b.logprobs[t]);
        if let Some(t) = logprob {
            return Some(format!(
                "sequence {s} (player {}): the sampler's logprob of token {t}: recorded {}, \
                 replayed {}",
                a.player, a.logprobs[t], b.logprobs[t]
            ));
        }
    }
    if compare_rewards && recorded.turn_rewards != replayed.turn_rewards {
        return Some(format!(
            "the rewards: recorded {:?}, replayed {:?}",
            recorded.turn_rewards, replayed.turn_rewards
        ));
    }
    None
}
