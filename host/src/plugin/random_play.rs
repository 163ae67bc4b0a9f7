//! Play an environment with a random policy, many episodes at once: the smoke test of a plugin
//! (`opentinker plugin run`), with no model involved.
//!
//! The policy picks uniformly among the legal actions when the environment lists them;
//! otherwise it plays the environment's demonstration half of the time and a random small
//! number the other half.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use super::environment::{EnvironmentEpisode, EpisodeRecord, RecordedError};
use super::error::{CallError, ErrorKind};
use super::limits::Limits;
use super::loader::Plugin;

/// What to play.
#[derive(Clone, Debug)]
pub struct PlayOptions {
    pub episodes: u32,
    /// Episode `i` uses seed `seed + i`.
    pub seed: u64,
    /// The environment config (JSON).
    pub config: String,
    /// A fixed task for every episode; `None` asks the environment to generate one per episode.
    pub task: Option<String>,
    /// Episodes alive at once (at most the host's instance slots).
    pub concurrency: usize,
    pub limits: Limits,
    /// Return each episode's messages, per-step rewards and metrics; otherwise only its summary
    /// (seed, steps, returns, error, fuel), so that a long run keeps bounded memory.
    pub keep_transcripts: bool,
}

impl Default for PlayOptions {
    fn default() -> Self {
        PlayOptions {
            episodes: 100,
            seed: 0,
            config: "{}".into(),
            task: None,
            concurrency: 64,
            limits: Limits::default(),
            keep_transcripts: false,
        }
    }
}

/// Distinct messages kept per error kind in a [`PlaySummary`].
pub const MESSAGES_PER_KIND: usize = 3;

/// One distinct error message of a run, and the first episode that gave it.
#[derive(Clone, Debug, Serialize)]
pub struct SampledMessage {
    pub seed: u64,
    pub message: String,
}

/// The outcome of a run, as `opentinker plugin run --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct PlaySummary {
    pub plugin: String,
    pub digest: String,
    pub episodes: u32,
    /// Episodes that ran to their end without an error.
    pub completed: u32,
    /// Mean over completed episodes of player 0's return.
    pub mean_reward: f64,
    pub mean_steps: f64,
    /// Failed episodes, by error kind.
    pub errors: BTreeMap<ErrorKind, u32>,
    /// Up to [`MESSAGES_PER_KIND`] distinct messages of each error kind, in episode order, each
    /// with the seed of its first episode: the plugin's own words.
    pub error_messages: BTreeMap<ErrorKind, Vec<SampledMessage>>,
    /// The most episodes alive at once.
    pub max_live_episodes: usize,
    /// Log bytes dropped over all episodes (each episode's log is bounded).
    pub log_bytes_dropped: u64,
    /// The most fuel one call used, over all episodes: to compare with the `fuel` limit.
    pub max_call_fuel: u64,
    /// The most fuel one episode used: to compare with the `episode_fuel` limit.
    pub max_episode_fuel: u64,
    pub elapsed_s: f64,
    pub episodes_per_s: f64,
    pub steps_per_s: f64,
}

/// Play `options.episodes` episodes of `plugin` and summarise them; the records come back in
/// episode order.
pub async fn play_random(
    plugin: &Plugin,
    options: &PlayOptions,
) -> Result<(PlaySummary, Vec<EpisodeRecord>), CallError> {
    let info = plugin.environment_info(&options.limits).await?;
    let started = Instant::now();
    let mut records = Vec::with_capacity(options.episodes as usize);
    let mut max_live = 0;
    let mut log_bytes_dropped = 0;
    // A batch holds all its instances at once, so it must fit in the host's instance slots.
    let batch = options.concurrency.clamp(1, plugin.max_instances()) as u64;
    let mut first = 0u64;
    while first < u64::from(options.episodes) {
        let last = (first + batch).min(u64::from(options.episodes));
        // Make the batch's tasks, then start the whole batch before playing any of it, so all
        // of it is alive at once (and no task generation waits on a slot an episode holds).
        let mut tasks = tokio::task::JoinSet::new();
        for index in first..last {
            let (plugin, options) = (plugin.clone(), options.clone());
            tasks.spawn(async move { (index, task_for(&plugin, &options, index).await) });
        }
        let mut starting = tokio::task::JoinSet::new();
        for (index, task) in tasks.join_all().await {
            let (plugin, options) = (plugin.clone(), options.clone());
            starting.spawn(async move { (index, start(&plugin, &options, index, task).await) });
        }
        let mut started_episodes = Vec::new();
        for joined in starting.join_all().await {
            started_episodes.push(joined);
        }
        max_live = max_live.max(started_episodes.iter().filter(|(_, e)| e.is_ok()).count());
        let mut playing = tokio::task::JoinSet::new();
        for (index, episode) in started_episodes {
            playing.spawn(async move {
                match episode {
                    Ok(episode) => play(index, episode, info.max_turns).await,
                    Err(record) => (index, record, 0),
                }
            });
        }
        for (index, record, dropped) in playing.join_all().await {
            log_bytes_dropped += dropped;
            let record = if options.keep_transcripts {
                record
            } else {
                record.summary()
            };
            records.push((index, record));
        }
        first = last;
    }
    records.sort_by_key(|(index, _)| *index);
    let records: Vec<EpisodeRecord> = records.into_iter().map(|(_, r)| r).collect();
    let summary = summarise(
        plugin,
        &info.name,
        &records,
        max_live,
        log_bytes_dropped,
        started.elapsed(),
    );
    Ok((summary, records))
}

/// The task of episode `index`: the fixed one, or the environment's for the episode's seed.
async fn task_for(plugin: &Plugin, options: &PlayOptions, index: u64) -> Result<String, CallError> {
    match &options.task {
        Some(task) => Ok(task.clone()),
        None => {
            let seed = options.seed.wrapping_add(index);
            plugin
                .generate_task(&options.config, seed, &options.limits)
                .await
        }
    }
}

async fn start(
    plugin: &Plugin,
    options: &PlayOptions,
    index: u64,
    task: Result<String, CallError>,
) -> Result<EnvironmentEpisode, EpisodeRecord> {
    let seed = options.seed.wrapping_add(index);
    let failed = |error: CallError| EpisodeRecord {
        seed,
        error: Some(RecordedError {
            kind: error.kind,
            message: error.message,
            step: 0,
        }),
        ..EpisodeRecord::default()
    };
    let task = task.map_err(failed)?;
    plugin
        .start_episode(&options.config, &task, seed, &options.limits)
        .await
        .map_err(failed)
}

/// Play one episode to its end (or its first error, or the turn limit); returns its index, its
/// record and the log bytes it dropped.
async fn play(
    index: u64,
    mut episode: EnvironmentEpisode,
    max_turns: u32,
) -> (u64, EpisodeRecord, u64) {
    let mut rng = StdRng::seed_from_u64(episode.record().seed ^ 0x00C0_FFEE);
    let players = episode.info().players;
    let mut outcome = Ok(());
    for player in 0..players {
        if let Err(error) = episode.observe(player).await {
            outcome = Err(error);
            break;
        }
    }
    let mut turns = 0;
    while outcome.is_ok() && turns < max_turns.max(1) {
        if episode.to_move().is_none() {
            break;
        }
        outcome = async {
            let action = random_action(&mut episode, &mut rng).await?;
            episode.step(&action).await.map(|_| ())
        }
        .await;
        turns += 1;
    }
    let (_, dropped) = episode.log();
    (index, episode.into_record(), dropped)
}

async fn random_action(
    episode: &mut EnvironmentEpisode,
    rng: &mut StdRng,
) -> Result<String, CallError> {
    if let Some(actions) = episode.legal_actions().await?.filter(|a| !a.is_empty()) {
        return Ok(actions[rng.random_range(0..actions.len())].clone());
    }
    if rng.random_bool(0.5)
        && let Some(action) = episode.demonstration().await?
    {
        return Ok(action);
    }
    Ok(rng.random_range(0..100).to_string())
}

fn summarise(
    plugin: &Plugin,
    name: &str,
    records: &[EpisodeRecord],
    max_live_episodes: usize,
    log_bytes_dropped: u64,
    elapsed: Duration,
) -> PlaySummary {
    let mut errors = BTreeMap::new();
    let mut error_messages: BTreeMap<ErrorKind, Vec<SampledMessage>> = BTreeMap::new();
    for record in records {
        let Some(error) = &record.error else { continue };
        *errors.entry(error.kind).or_insert(0) += 1;
        let sampled = error_messages.entry(error.kind).or_default();
        if sampled.len() < MESSAGES_PER_KIND && !sampled.iter().any(|m| m.message == error.message)
        {
            sampled.push(SampledMessage {
                seed: record.seed,
                message: error.message.clone(),
            });
        }
    }
    let completed: Vec<&EpisodeRecord> = records.iter().filter(|r| r.error.is_none()).collect();
    let mean = |values: Vec<f64>| {
        if values.is_empty() {
            0.0
        } else {
            values.iter().sum::<f64>() / values.len() as f64
        }
    };
    let steps: u64 = records.iter().map(|r| u64::from(r.steps)).sum();
    let seconds = elapsed.as_secs_f64().max(1e-9);
    PlaySummary {
        plugin: name.to_string(),
        digest: plugin.digest().to_string(),
        episodes: records.len() as u32,
        completed: completed.len() as u32,
        mean_reward: mean(
            completed
                .iter()
                .map(|r| r.returns.first().copied().unwrap_or(0.0))
                .collect(),
        ),
        mean_steps: mean(completed.iter().map(|r| f64::from(r.steps)).collect()),
        errors,
        error_messages,
        max_live_episodes,
        log_bytes_dropped,
        max_call_fuel: records.iter().map(|r| r.fuel.max_call).max().unwrap_or(0),
        max_episode_fuel: records.iter().map(|r| r.fuel.total).max().unwrap_or(0),
        elapsed_s: elapsed.as_secs_f64(),
        episodes_per_s: records.len() as f64 / seconds,
        steps_per_s: steps as f64 / seconds,
    }
}
