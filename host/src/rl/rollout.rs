//! Playing one episode with the policies: each turn, the player to move gets its prompt (its
//! previous prompt + its sampled tokens + the rendered new messages + the generation prompt),
//! samples from its policy version, and the environment steps on the completion's text.
//!
//! With an agent plugin, the agent decides what the player is shown (`prompt(history)`) and which
//! action a completion means (`act`); a prompt that does not extend the player's sequence starts
//! a new one (a new datum).
//!
//! A plugin error, a timeout or a conversation that outgrows the context ends the episode with
//! the job's failure reward for every player who acted; the kind is kept for the metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::failure::{EpisodeFailure, FailureKind};
use super::render::Renderer;
use super::transcript::{SpanKind, TokenSequence, Transcript};
use crate::api::{ModelInput, SamplingParams};
use crate::client::SamplingClient;
use crate::plugin::{
    AgentSession, CallError, EnvironmentEpisode, Limits, Message, Plugin,
    Transcript as PluginTranscript,
};
use crate::text::ChatMessage;

/// Where a player's actions come from.
#[derive(Clone)]
pub enum Actor {
    /// Sampled from an adapter version (or the base model).
    Policy(Arc<dyn SamplingClient>),
    /// The environment's demonstration for the player to move (SFT warm-up data).
    Demonstration,
}

/// Everything an episode needs besides its task and seed.
pub struct Rollout<'a> {
    pub environment: &'a Plugin,
    pub config: &'a str,
    /// The agent plugin between policy and environment; `None`: the built-in chat agent.
    pub agent: Option<&'a Plugin>,
    /// The agent's config (JSON).
    pub agent_config: &'a str,
    /// A reward plugin that scores each finished episode, and the weight of its score.
    pub reward: Option<(&'a Plugin, f64)>,
    /// The reward's config (JSON).
    pub reward_config: &'a str,
    pub limits: &'a Limits,
    pub renderer: &'a Renderer,
    /// The sampling parameters of every turn (each turn's seed is derived from the episode's).
    pub params: SamplingParams,
    /// The job's turn limit (the environment's own limit applies too).
    pub max_turns: usize,
    /// The model's context, in tokens.
    pub context: usize,
    /// The return of each player who acted in an episode that failed.
    pub failure_reward: f64,
}

/// What an episode left: per player its transcript and the reward of each of its turns.
#[derive(Debug, Serialize, Deserialize)]
pub struct EpisodeOutcome {
    pub seed: u64,
    pub task: String,
    pub transcripts: Vec<Option<Transcript>>,
    pub turn_rewards: Vec<Vec<f64>>,
    /// Why the episode failed, if it did.
    pub failure: Option<EpisodeFailure>,
    /// Environment steps taken.
    pub steps: usize,
    /// The environment's metrics, summed over steps.
    pub metrics: BTreeMap<String, f64>,
    /// What each player saw and said, as text (an agent's history, a reward plugin's
    /// transcripts, the rollout files).
    pub messages: Vec<Vec<Message>>,
    /// The reward plugin's weighted score of each player (already in its last turn's reward).
    pub scores: Vec<f64>,
}

/// One line of `rollouts/step-N.jsonl`: an episode as text and as the tokens trained on.
#[derive(Debug, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub group: usize,
    pub index: usize,
    pub seed: u64,
    pub task: String,
    pub returns: Vec<f64>,
    pub turn_rewards: Vec<Vec<f64>>,
    pub error: Option<FailureKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub messages: Vec<Vec<Message>>,
    pub sequences: Vec<SequenceRecord>,
}

/// A player's token sequence: `mask` is 1 on sampled tokens (the ones trained on), and
/// `advantages` and `logprobs` hold their advantage and sampler logprob (0 elsewhere).
#[derive(Debug, Serialize, Deserialize)]
pub struct SequenceRecord {
    pub player: usize,
    pub tokens: Vec<u32>,
    pub mask: Vec<u8>,
    pub advantages: Vec<f32>,
    pub logprobs: Vec<f32>,
}

impl RolloutRecord {
    /// The record of `outcome`, with each player's sequences and the advantage of each of its
    /// turns: `(player, sequences, advantage per turn)`.
    pub fn new(
        group: usize,
        index: usize,
        outcome: &EpisodeOutcome,
        sequences: &[(usize, Vec<TokenSequence>, Vec<f64>)],
    ) -> Self {
        let mut records = Vec::new();
        for (player, player_sequences, advantages) in sequences {
            let turn_advantage = |turn: usize| advantages.get(turn).copied().unwrap_or(0.0) as f32;
            for sequence in player_sequences {
                let mut record = SequenceRecord {
                    player: *player,
                    tokens: Vec::new(),
                    mask: Vec::new(),
                    advantages: Vec::new(),
                    logprobs: Vec::new(),
                };
                for span in &sequence.spans {
                    let n = span.tokens.len();
                    record.tokens.extend(&span.tokens);
                    match span.kind {
                        SpanKind::Action { turn } => {
                            record.mask.extend(std::iter::repeat_n(1, n));
                            record
                                .advantages
                                .extend(std::iter::repeat_n(turn_advantage(turn), n));
                            record.logprobs.extend(&span.logprobs);
                        }
                        SpanKind::Context => {
                            record.mask.extend(std::iter::repeat_n(0, n));
                            record.advantages.extend(std::iter::repeat_n(0.0, n));
                            record.logprobs.extend(std::iter::repeat_n(0.0, n));
                        }
                    }
                }
                records.push(record);
            }
        }
        RolloutRecord {
            group,
            index,
            seed: outcome.seed,
            task: outcome.task.clone(),
            returns: outcome.returns(),
            turn_rewards: outcome.turn_rewards.clone(),
            error: outcome.failure.as_ref().map(|f| f.kind),
            error_message: outcome.failure.as_ref().and_then(|f| f.message.clone()),
            messages: outcome.messages.clone(),
            sequences: records,
        }
    }
}

impl EpisodeOutcome {
    /// The tokens every player's policy sampled in the episode.
    pub fn sampled_tokens(&self) -> usize {
        self.transcripts
            .iter()
            .flatten()
            .map(Transcript::sampled_tokens)
            .sum()
    }

    /// An episode that failed before it started: its task could not be generated (`error`,
    /// the plugin's failure). It trains nothing and counts as a failure of its kind.
    pub fn failed_to_start(seed: u64, error: &CallError) -> Self {
        EpisodeOutcome::not_started(seed, EpisodeFailure::from(error))
    }

    /// An episode that never started, for `failure`.
    pub fn not_started(seed: u64, failure: EpisodeFailure) -> Self {
        EpisodeOutcome {
            seed,
            task: String::new(),
            transcripts: Vec::new(),
            turn_rewards: Vec::new(),
            failure: Some(failure),
            steps: 0,
            metrics: BTreeMap::new(),
            messages: Vec::new(),
            scores: Vec::new(),
        }
    }

    /// Each player's messages, as a reward plugin reads them.
    pub fn plugin_transcripts(&self) -> Vec<PluginTranscript> {
        self.messages
            .iter()
            .enumerate()
            .map(|(player, messages)| PluginTranscript {
                player: player as u32,
                messages: messages.clone(),
            })
            .collect()
    }

    /// The episode failed: every player who acted gets `failure_reward` as its return.
    pub fn fail(&mut self, failure: EpisodeFailure, failure_reward: f64) {
        for (player, rewards) in self.turn_rewards.iter_mut().enumerate() {
            let acted = self.transcripts.get(player).is_some_and(Option::is_some);
            if acted && !rewards.is_empty() {
                rewards.iter_mut().for_each(|r| *r = 0.0);
                if let Some(last) = rewards.last_mut() {
                    *last = failure_reward;
                }
            }
        }
        self.failure = Some(failure);
    }

    /// Add `scores[p]` to player p's last turn reward (players who never acted get none).
    pub fn add_scores(&mut self, scores: &[f64]) {
        for (rewards, score) in self.turn_rewards.iter_mut().zip(scores) {
            if let Some(last) = rewards.last_mut() {
                *last += score;
            }
        }
    }

    /// A group scorer replaced this episode's scores with `weighted`.
    pub fn replace_scores(&mut self, weighted: Vec<f64>) {
        let change: Vec<f64> = weighted
            .iter()
            .enumerate()
            .map(|(p, new)| new - self.scores.get(p).copied().unwrap_or(0.0))
            .collect();
        self.add_scores(&change);
        self.scores = weighted;
    }

    /// Each player's return: the sum of its turn rewards.
    pub fn returns(&self) -> Vec<f64> {
        self.turn_rewards.iter().map(|r| r.iter().sum()).collect()
    }
}

fn chat(messages: &[Message]) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect()
}

fn turn_seed(seed: u64, turn: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(turn as u64)
        .rotate_left(17)
}

impl Rollout<'_> {
    /// Play one episode of `task` with seed `seed`; player `p` acts as `actors[p]` (the last
    /// actor serves any further players).
    pub async fn play(&self, task: &str, seed: u64, actors: &[Actor]) -> EpisodeOutcome {
        let mut outcome = EpisodeOutcome {
            seed,
            task: task.to_string(),
            transcripts: Vec::new(),
            turn_rewards: Vec::new(),
            failure: None,
            steps: 0,
            metrics: BTreeMap::new(),
            messages: Vec::new(),
            scores: Vec::new(),
        };
        let mut played = self.run(task, seed, actors, &mut outcome).await;
        if played.is_ok()
            && let Some((reward, weight)) = self.reward
        {
            played = self.score(reward, weight, &mut outcome).await;
        }
        if let Err(failure) = played {
            outcome.fail(failure, self.failure_reward);
        }
        outcome
    }

    async fn run(
        &self,
        task: &str,
        seed: u64,
        actors: &[Actor],
        outcome: &mut EpisodeOutcome,
    ) -> Result<(), EpisodeFailure> {
        let mut episode = self
            .environment
            .start_episode(self.config, task, seed, self.limits)
            .await?;
        let players = episode.info().players as usize;
        let turn_limit = match episode.info().max_turns {
            0 => self.max_turns,
            limit => self.max_turns.min(limit as usize),
        };
        outcome.transcripts = vec![None; players];
        outcome.turn_rewards = vec![Vec::new(); players];
        outcome.messages = vec![Vec::new(); players];
        let mut unseen: Vec<Vec<Message>> = vec![Vec::new(); players];
        let mut agents: Vec<Option<AgentSession>> = (0..players).map(|_| None).collect();
        let mut ended_turn = vec![true; players];
        // Rewards of a player who has not acted yet wait for its first turn.
        let mut pending_reward = vec![0.0; players];
        let mut turns = 0;
        while let Some(player) = episode.to_move() {
            let player = player as usize;
            if turns >= turn_limit {
                break;
            }
            let actor = actors
                .get(player)
                .or(actors.last())
                .ok_or_else(|| EpisodeFailure::of(FailureKind::NoPolicy))?;
            let new = match outcome.transcripts[player] {
                Some(_) => std::mem::take(&mut unseen[player]),
                None => episode.observe(player as u32).await?,
            };
            outcome.messages[player].extend(new.iter().cloned());
            let mut agent = match self.agent {
                Some(plugin) => Some(match &mut agents[player] {
                    Some(session) => session,
                    slot @ None => slot.insert(
                        plugin
                            .start_agent(
                                self.agent_config,
                                player as u32,
                                seed ^ ((player as u64) << 56),
                                self.limits,
                            )
                            .await?,
                    ),
                }),
                None => None,
            };
            let transcript = match (agent.as_deref_mut(), &mut outcome.transcripts[player]) {
                (Some(agent), slot) => {
                    let shown = agent.prompt(&outcome.messages[player]).await?;
                    let prompt = self.render_first(&shown)?;
                    match slot {
                        Some(transcript) => {
                            let so_far = transcript.prompt();
                            match prompt.strip_prefix(so_far.as_slice()) {
                                Some(rest) => {
                                    transcript.push_observation(rest.to_vec()).map_err(|e| {
                                        EpisodeFailure::with(FailureKind::Transcript, e)
                                    })?
                                }
                                None => transcript.rewrite(prompt),
                            }
                            transcript
                        }
                        None => slot.insert(Transcript::new(prompt)),
                    }
                }
                (None, Some(transcript)) => {
                    let tokens = self
                        .renderer
                        .continuation(ended_turn[player], &chat(&new))
                        .map_err(|e| EpisodeFailure::with(FailureKind::Render, e))?;
                    transcript
                        .push_observation(tokens)
                        .map_err(|e| EpisodeFailure::with(FailureKind::Transcript, e))?;
                    transcript
                }
                (None, slot @ None) => slot.insert(Transcript::new(self.render_first(&new)?)),
            };
            let prompt = transcript.prompt();
            if prompt.len() + 1 > self.context {
                return Err(EpisodeFailure::of(FailureKind::ContextExceeded));
            }
            let (tokens, logprobs, text, ends_turn) = self
                .act(actor, &mut episode, prompt, turn_seed(seed, turns))
                .await?;
            ended_turn[player] = ends_turn;
            transcript
                .push_action(tokens, logprobs)
                .map_err(|e| EpisodeFailure::with(FailureKind::Transcript, e))?;
            outcome.turn_rewards[player].push(std::mem::take(&mut pending_reward[player]));
            outcome.messages[player].push(Message::new("assistant", text.clone()));
            let action = match (agent, actor) {
                (Some(agent), Actor::Policy(_)) => agent.act(&text).await?,
                _ => text,
            };
            let result = episode.step(&action).await?;
            turns += 1;
            outcome.steps += 1;
            for (to, reward) in result.rewards.iter().enumerate() {
                match outcome.turn_rewards[to].last_mut() {
                    Some(last) => *last += reward,
                    None => pending_reward[to] += reward,
                }
            }
            for to in result.messages {
                unseen[to.player as usize].extend(to.messages);
            }
            for metric in result.metrics {
                *outcome.metrics.entry(metric.name).or_default() += metric.value;
            }
        }
        Ok(())
    }
}

impl Rollout<'_> {
    /// The actor's action on `prompt`: its tokens, their logprobs, its text, and whether it
    /// ended its turn (a sample cut by `max_tokens` did not, so the next observation closes it).
    async fn act(
        &self,
        actor: &Actor,
        episode: &mut EnvironmentEpisode,
        prompt: Vec<u32>,
        seed: u64,
    ) -> Result<(Vec<u32>, Vec<f32>, String, bool), EpisodeFailure> {
        match actor {
            Actor::Policy(sampler) => {
                let mut params = self.params.clone();
                params.seed = Some(seed);
                let room = self.context - prompt.len();
                params.max_tokens = Some(params.max_tokens.map_or(room, |m| m.min(room)));
                let mut output = sampler
                    .sample(ModelInput::from_tokens(prompt), 1, params)
                    .await
                    .map_err(|e| EpisodeFailure::with(FailureKind::Sampler, e))?;
                let sample = output
                    .sequences
                    .pop()
                    .ok_or_else(|| EpisodeFailure::of(FailureKind::Sampler))?;
                let text = self
                    .renderer
                    .action_text(&sample.tokens)
                    .map_err(|e| EpisodeFailure::with(FailureKind::Render, e))?;
                let ends_turn = self.renderer.end_of_turn_id() == sample.tokens.last().copied();
                Ok((sample.tokens, sample.logprobs, text, ends_turn))
            }
            Actor::Demonstration => {
                let text = episode
                    .demonstration()
                    .await?
                    .ok_or_else(|| EpisodeFailure::of(FailureKind::NoDemonstration))?;
                let tokens = self
                    .renderer
                    .action_tokens(&text)
                    .map_err(|e| EpisodeFailure::with(FailureKind::Render, e))?;
                let logprobs = vec![0.0; tokens.len()];
                Ok((tokens, logprobs, text, true))
            }
        }
    }

    /// Add the reward plugin's score of each player who acted to its last turn's reward.
    async fn score(
        &self,
        reward: &Plugin,
        weight: f64,
        outcome: &mut EpisodeOutcome,
    ) -> Result<(), EpisodeFailure> {
        let scores = reward
            .score(
                self.reward_config,
                &outcome.task,
                &outcome.plugin_transcripts(),
                self.limits,
            )
            .await?;
        let weighted: Vec<f64> = scores.iter().map(|s| s * weight).collect();
        outcome.add_scores(&weighted);
        outcome.scores = weighted;
        Ok(())
    }

    fn render_first(&self, messages: &[Message]) -> Result<Vec<u32>, EpisodeFailure> {
        self.renderer
            .first_prompt(&chat(messages))
            .map_err(|e| EpisodeFailure::with(FailureKind::Render, e))
    }
}
