//! Episodes of an environment plugin: each in its own sandbox, every call guarded, every result
//! checked against the contract, and a record of what happened kept for logs and training.

use serde::Serialize;
use wasmtime::component::ResourceAny;

use super::contract::EnvironmentGuest;
use super::error::{CallError, ErrorKind};
use super::limits::Limits;
use super::loader::Plugin;
use super::sandbox::{FuelUse, Sandbox, guarded_call};
use super::types::{EnvInfo, GuestError, Message, Metric, OutputSize, StepResult};

/// A live episode. Dropping it drops its instance and returns its memory to the pool.
pub struct EnvironmentEpisode {
    sandbox: Sandbox,
    guest: EnvironmentGuest,
    episode: ResourceAny,
    info: EnvInfo,
    to_move: Option<u32>,
    record: EpisodeRecord,
}

/// What happened in an episode, kept for rollouts logs and training.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EpisodeRecord {
    pub seed: u64,
    pub task: String,
    /// Per player: what it was shown and what it said, in order.
    pub messages: Vec<Vec<Message>>,
    /// Per step: the reward of each player.
    pub step_rewards: Vec<Vec<f64>>,
    /// Per step: the metrics the environment reported.
    pub metrics: Vec<Vec<Metric>>,
    /// Per player: the sum of its step rewards.
    pub returns: Vec<f64>,
    /// Steps taken (successful `step` calls).
    pub steps: u32,
    /// Whether the environment ended the episode.
    pub finished: bool,
    /// The failure that ended the episode early, if any.
    pub error: Option<RecordedError>,
    /// The fuel the episode's calls used (filled in by [`EnvironmentEpisode::into_record`]).
    pub fuel: FuelUse,
}

impl EpisodeRecord {
    /// The record without its task, messages, per-step rewards and metrics: what is kept of an
    /// episode when its transcript is not asked for.
    pub fn summary(self) -> EpisodeRecord {
        EpisodeRecord {
            task: String::new(),
            messages: Vec::new(),
            step_rewards: Vec::new(),
            metrics: Vec::new(),
            ..self
        }
    }
}

/// A failure, with the step it happened at (1-based; 0 before the first step).
#[derive(Clone, Debug, Serialize)]
pub struct RecordedError {
    pub kind: ErrorKind,
    pub message: String,
    pub step: u32,
}

fn guest_error(error: GuestError) -> CallError {
    CallError::new(ErrorKind::PluginError, error.message)
}

fn invalid_request(message: impl Into<String>) -> CallError {
    CallError::new(ErrorKind::InvalidRequest, message)
}

impl Plugin {
    /// What the environment says about itself (asked once per plugin, then remembered).
    pub async fn environment_info(&self, limits: &Limits) -> Result<EnvInfo, CallError> {
        let (mut sandbox, guest) = self.environment_instance(limits, 0).await?;
        self.checked_info(&mut sandbox, &guest).await
    }

    /// Make a task with the environment's generator.
    pub async fn generate_task(
        &self,
        config: &str,
        seed: u64,
        limits: &Limits,
    ) -> Result<String, CallError> {
        let (mut sandbox, guest) = self.environment_instance(limits, seed).await?;
        let task = guarded_call!(&mut sandbox, config.len(), |store| guest
            .generate_task(store, config, seed))?
        .map_err(|e| sandbox.fail(guest_error(e)))?;
        sandbox.check_output(OutputSize::text(&task))?;
        Ok(task)
    }

    /// Start an episode of `task` in a fresh instance; a config or task the environment refuses
    /// is its `PluginError` (a 0.1 environment reports it at the first call instead).
    pub async fn start_episode(
        &self,
        config: &str,
        task: &str,
        seed: u64,
        limits: &Limits,
    ) -> Result<EnvironmentEpisode, CallError> {
        let (mut sandbox, guest) = self.environment_instance(limits, seed).await?;
        let info = self.checked_info(&mut sandbox, &guest).await?;
        let episode = guarded_call!(&mut sandbox, config.len() + task.len(), |store| guest
            .start(store, config, task, seed))?
        .map_err(|e| sandbox.fail(guest_error(e)))?;
        let players = info.players as usize;
        Ok(EnvironmentEpisode {
            sandbox,
            guest,
            episode,
            info,
            to_move: Some(0),
            record: EpisodeRecord {
                seed,
                task: task.to_string(),
                messages: vec![Vec::new(); players],
                returns: vec![0.0; players],
                ..EpisodeRecord::default()
            },
        })
    }

    async fn environment_instance(
        &self,
        limits: &Limits,
        seed: u64,
    ) -> Result<(Sandbox, EnvironmentGuest), CallError> {
        let indices = self
            .0
            .environment
            .as_ref()
            .ok_or_else(|| invalid_request("the plugin is not an environment"))?;
        let mut sandbox = self.0.sandbox(limits, seed).await?;
        let guest = indices
            .load(&mut sandbox.store, &sandbox.instance)
            .map_err(|e| invalid_request(format!("loading the environment exports: {e:#}")))?;
        Ok((sandbox, guest))
    }

    async fn info_from(
        &self,
        sandbox: &mut Sandbox,
        guest: &EnvironmentGuest,
    ) -> Result<EnvInfo, CallError> {
        if let Some(info) = self.0.env_info.get() {
            return Ok(info.clone());
        }
        let info = guarded_call!(sandbox, 0, |store| guest.info(store))?;
        if info.players == 0 {
            return Err(sandbox.fail(CallError::new(
                ErrorKind::InvalidOutput,
                "info() says the environment has 0 players",
            )));
        }
        sandbox.check_output(OutputSize::text(&info.name))?;
        Ok(self.0.env_info.get_or_init(|| async { info }).await.clone())
    }

    /// The environment's info, refused when it declares more players than `sandbox`'s limits
    /// allow (the host allocates per player).
    async fn checked_info(
        &self,
        sandbox: &mut Sandbox,
        guest: &EnvironmentGuest,
    ) -> Result<EnvInfo, CallError> {
        let info = self.info_from(sandbox, guest).await?;
        let max = sandbox.limits().max_players;
        if info.players > max {
            return Err(sandbox.fail(CallError::new(
                ErrorKind::InvalidOutput,
                format!(
                    "info() says the environment has {} players, above this host's limit of {max} \
                     (max_players)",
                    info.players
                ),
            )));
        }
        Ok(info)
    }
}

impl EnvironmentEpisode {
    pub fn info(&self) -> &EnvInfo {
        &self.info
    }

    /// The player to move, or `None` once the episode is over.
    pub fn to_move(&self) -> Option<u32> {
        self.to_move
    }

    pub fn record(&self) -> &EpisodeRecord {
        &self.record
    }

    /// The episode's record, with the fuel its calls used, ending the episode.
    pub fn into_record(mut self) -> EpisodeRecord {
        self.record.fuel = self.sandbox.fuel_use();
        self.record
    }

    /// The episode's log (stdout, stderr, `host.log`) and how many bytes were dropped from it.
    pub fn log(&self) -> (String, u64) {
        self.sandbox.log()
    }

    /// What `player` sees before its first action.
    pub async fn observe(&mut self, player: u32) -> Result<Vec<Message>, CallError> {
        self.check_player(player)?;
        let result = self.observe_unrecorded(player).await;
        let messages = self.recorded(result)?;
        self.record.messages[player as usize].extend(messages.iter().cloned());
        Ok(messages)
    }

    async fn observe_unrecorded(&mut self, player: u32) -> Result<Vec<Message>, CallError> {
        let (guest, episode) = (&self.guest, self.episode);
        let messages = guarded_call!(&mut self.sandbox, 0, |store| guest
            .observe(store, episode, player))?
        .map_err(|e| self.sandbox.fail(guest_error(e)))?;
        self.sandbox.check_output(OutputSize::messages(&messages))?;
        Ok(messages)
    }

    /// Apply the action of the player to move, and record it with its results.
    pub async fn step(&mut self, action: &str) -> Result<StepResult, CallError> {
        let Some(player) = self.to_move else {
            return Err(invalid_request("the episode is over"));
        };
        let result = self.step_unrecorded(action).await;
        let result = self.recorded(result)?;
        let record = &mut self.record;
        record.messages[player as usize].push(Message::new("assistant", action));
        for to in &result.messages {
            record.messages[to.player as usize].extend(to.messages.iter().cloned());
        }
        for (total, reward) in record.returns.iter_mut().zip(&result.rewards) {
            *total += reward;
        }
        record.step_rewards.push(result.rewards.clone());
        record.metrics.push(result.metrics.clone());
        record.steps += 1;
        self.to_move = result.next_player;
        record.finished = result.next_player.is_none();
        let cap = self.sandbox.limits().max_turns;
        let declared = self.info.max_turns;
        if !record.finished && record.steps >= cap && (declared == 0 || declared > cap) {
            let error = CallError::new(
                ErrorKind::EpisodeLimit,
                format!(
                    "the episode is still running after {cap} steps, this host's limit \
                     (max_turns; the environment declares {declared})"
                ),
            );
            let error = self.sandbox.fail(error);
            let _ = self.recorded::<()>(Err(error));
        }
        Ok(result)
    }

    async fn step_unrecorded(&mut self, action: &str) -> Result<StepResult, CallError> {
        let (guest, episode) = (&self.guest, self.episode);
        let result = guarded_call!(&mut self.sandbox, action.len(), |store| guest
            .step(store, episode, action))?
        .map_err(|e| self.sandbox.fail(guest_error(e)))?;
        self.sandbox.check_output(result.output_size())?;
        if let Err(problem) = self.check_step_result(&result) {
            return Err(self
                .sandbox
                .fail(CallError::new(ErrorKind::InvalidOutput, problem)));
        }
        Ok(result)
    }

    /// The legal actions of the player to move, if the environment lists them.
    pub async fn legal_actions(&mut self) -> Result<Option<Vec<String>>, CallError> {
        let (guest, episode) = (&self.guest, self.episode);
        let actions = guarded_call!(&mut self.sandbox, 0, |store| guest
            .legal_actions(store, episode));
        let actions = self.recorded(actions)?;
        let size = actions
            .as_deref()
            .map(OutputSize::strings)
            .unwrap_or_default();
        let checked = self.sandbox.check_output(size);
        self.recorded(checked)?;
        Ok(actions)
    }

    /// A legal action for the player to move, if the environment knows one.
    pub async fn demonstration(&mut self) -> Result<Option<String>, CallError> {
        let (guest, episode) = (&self.guest, self.episode);
        let action = guarded_call!(&mut self.sandbox, 0, |store| guest
            .demonstration(store, episode));
        let action = self.recorded(action)?;
        let checked = self
            .sandbox
            .check_output(action.as_deref().map(OutputSize::text).unwrap_or_default());
        self.recorded(checked)?;
        Ok(action)
    }

    /// Note a failure in the record (the first one ends the episode).
    fn recorded<T>(&mut self, result: Result<T, CallError>) -> Result<T, CallError> {
        if let Err(error) = &result
            && self.record.error.is_none()
            && error.kind != ErrorKind::InvalidRequest
        {
            self.record.error = Some(RecordedError {
                kind: error.kind,
                message: error.message.clone(),
                step: self.record.steps + 1,
            });
            self.to_move = None;
        }
        result
    }

    fn check_player(&self, player: u32) -> Result<(), CallError> {
        if player >= self.info.players {
            return Err(invalid_request(format!(
                "player {player} does not exist: the environment has {} players",
                self.info.players
            )));
        }
        Ok(())
    }

    /// Whether a step result keeps the contract; the problem otherwise.
    fn check_step_result(&self, result: &StepResult) -> Result<(), String> {
        let players = self.info.players;
        if result.rewards.len() != players as usize {
            return Err(format!(
                "step returned {} rewards for {players} players",
                result.rewards.len()
            ));
        }
        if let Some(bad) = result.rewards.iter().find(|r| !r.is_finite()) {
            return Err(format!("step returned a reward of {bad}"));
        }
        if let Some(next) = result.next_player.filter(|p| *p >= players) {
            return Err(format!(
                "step named player {next} to move, of {players} players"
            ));
        }
        if let Some(to) = result.messages.iter().find(|m| m.player >= players) {
            return Err(format!(
                "step sent messages to player {}, of {players} players",
                to.player
            ));
        }
        if let Some(metric) = result.metrics.iter().find(|m| !m.value.is_finite()) {
            return Err(format!(
                "step reported metric {} = {}",
                metric.name, metric.value
            ));
        }
        Ok(())
    }
}
