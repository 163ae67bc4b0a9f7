//! Glue from the author's traits to the generated `Guest` traits. Each world has its own copy of
//! the shared WIT types, so the conversions are written once as a macro over a bindings module.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::bindings::{
    advantage_plugin, agent_plugin, environment_plugin, metadata_plugin, objective_plugin,
    reward_plugin,
};
use crate::{
    Advantage, Agent, DatumLoss, Environment, Message, Objective, ObjectiveDatum, Package,
    PluginError, Reward, StepResult, Tensor, Transcript,
};

/// Conversions between this crate's types and the shared types of one world's bindings.
macro_rules! shared_glue {
    ($world:ident) => {
        use crate::bindings::$world::opentinker::plugin::types as wit;

        impl From<Message> for wit::Message {
            fn from(m: Message) -> Self {
                wit::Message {
                    role: m.role,
                    content: m.content,
                }
            }
        }

        impl From<wit::Message> for Message {
            fn from(m: wit::Message) -> Self {
                Message {
                    role: m.role,
                    content: m.content,
                }
            }
        }

        impl From<PluginError> for wit::PluginError {
            fn from(e: PluginError) -> Self {
                wit::PluginError { message: e.message }
            }
        }
    };
}

/// Implements the generated metadata bindings for the plugin `T` of package `P`, whose kind
/// `K` ([`EnvironmentKind`], [`AgentKind`], [`RewardKind`], [`ObjectiveKind`] or
/// [`AdvantageKind`]) says which trait gives its config schema.
pub struct MetadataAdapter<T, P, K>(PhantomData<(T, P, K)>);

/// The kind marker of an environment's [`MetadataAdapter`].
pub struct EnvironmentKind;
/// The kind marker of an agent's [`MetadataAdapter`].
pub struct AgentKind;
/// The kind marker of a reward's [`MetadataAdapter`].
pub struct RewardKind;
/// The kind marker of an objective's [`MetadataAdapter`].
pub struct ObjectiveKind;
/// The kind marker of an advantage estimator's [`MetadataAdapter`].
pub struct AdvantageKind;

mod metadata_glue {
    use super::*;
    use metadata_plugin::exports::opentinker::plugin::metadata as wit;
    use wit as wit_metadata;

    fn metadata_of<P: Package>(
        kind: wit::PluginKind,
        config_schema: Option<String>,
    ) -> wit::PluginMetadata {
        wit::PluginMetadata {
            name: P::NAME.to_string(),
            version: P::VERSION.to_string(),
            description: P::DESCRIPTION.to_string(),
            license: Some(P::LICENSE.to_string()).filter(|l| !l.is_empty()),
            kinds: vec![kind],
            config_schema,
            language: "rust".to_string(),
        }
    }

    impl<E: Environment, P: Package> wit_metadata::Guest for MetadataAdapter<E, P, EnvironmentKind> {
        fn metadata() -> wit::PluginMetadata {
            metadata_of::<P>(wit::PluginKind::Environment, E::config_schema())
        }
    }

    impl<A: Agent, P: Package> wit_metadata::Guest for MetadataAdapter<A, P, AgentKind> {
        fn metadata() -> wit::PluginMetadata {
            metadata_of::<P>(wit::PluginKind::Agent, A::config_schema())
        }
    }

    impl<R: Reward, P: Package> wit_metadata::Guest for MetadataAdapter<R, P, RewardKind> {
        fn metadata() -> wit::PluginMetadata {
            metadata_of::<P>(wit::PluginKind::Reward, R::config_schema())
        }
    }

    impl<O: Objective, P: Package> wit_metadata::Guest for MetadataAdapter<O, P, ObjectiveKind> {
        fn metadata() -> wit::PluginMetadata {
            metadata_of::<P>(wit::PluginKind::Objective, O::config_schema())
        }
    }

    impl<A: Advantage, P: Package> wit_metadata::Guest for MetadataAdapter<A, P, AdvantageKind> {
        fn metadata() -> wit::PluginMetadata {
            metadata_of::<P>(wit::PluginKind::Advantage, A::config_schema())
        }
    }
}

fn messages_into<T: From<Message>>(messages: Vec<Message>) -> Vec<T> {
    messages.into_iter().map(T::from).collect()
}

/// Implements the generated environment bindings for any [`Environment`].
pub struct EnvironmentAdapter<E>(PhantomData<E>);

/// One live episode. WIT resources are called through `&self`, hence the `RefCell`.
pub struct EpisodeAdapter<E>(RefCell<E>);

mod environment_glue {
    use super::*;
    use environment_plugin::exports::opentinker::plugin::environment as wit_env;

    shared_glue!(environment_plugin);

    impl<E: Environment> wit_env::Guest for EnvironmentAdapter<E> {
        type Episode = EpisodeAdapter<E>;

        fn info() -> wit::EnvInfo {
            let info = E::info();
            wit::EnvInfo {
                name: info.name,
                players: info.players,
                max_turns: info.max_turns,
            }
        }

        fn generate_task(config: String, seed: u64) -> Result<String, wit::PluginError> {
            E::generate_task(&config, seed).map_err(Into::into)
        }
    }

    impl<E: Environment> wit_env::GuestEpisode for EpisodeAdapter<E> {
        fn start(
            config: String,
            task: String,
            seed: u64,
        ) -> Result<wit_env::Episode, wit::PluginError> {
            let episode = E::new(&config, &task, seed)?;
            Ok(wit_env::Episode::new(EpisodeAdapter(RefCell::new(episode))))
        }

        fn observe(&self, player: u32) -> Result<Vec<wit::Message>, wit::PluginError> {
            let messages = self.0.borrow_mut().observe(player)?;
            Ok(messages_into(messages))
        }

        fn step(&self, action: String) -> Result<wit_env::StepResult, wit::PluginError> {
            let result: StepResult = self.0.borrow_mut().step(&action)?;
            Ok(wit_env::StepResult {
                messages: result
                    .messages
                    .into_iter()
                    .map(|(player, messages)| wit::PlayerMessages {
                        player,
                        messages: messages_into(messages),
                    })
                    .collect(),
                rewards: result.rewards,
                next_player: result.next_player,
                metrics: result
                    .metrics
                    .into_iter()
                    .map(|m| wit::Metric {
                        name: m.name,
                        value: m.value,
                    })
                    .collect(),
            })
        }

        fn legal_actions(&self) -> Option<Vec<String>> {
            self.0.borrow().legal_actions()
        }

        fn demonstration(&self) -> Option<String> {
            self.0.borrow_mut().demonstration()
        }
    }
}

/// Implements the generated agent bindings for any [`Agent`].
pub struct AgentAdapter<A>(PhantomData<A>);

/// The agent of one player in one episode.
pub struct PlayerAgentAdapter<A>(RefCell<A>);

mod agent_glue {
    use super::*;
    use agent_plugin::exports::opentinker::plugin::agent as wit_agent;

    shared_glue!(agent_plugin);

    impl<A: Agent> wit_agent::Guest for AgentAdapter<A> {
        type PlayerAgent = PlayerAgentAdapter<A>;
    }

    impl<A: Agent> wit_agent::GuestPlayerAgent for PlayerAgentAdapter<A> {
        fn start(
            config: String,
            player: u32,
            seed: u64,
        ) -> Result<wit_agent::PlayerAgent, wit::PluginError> {
            let agent = A::new(&config, player, seed)?;
            Ok(wit_agent::PlayerAgent::new(PlayerAgentAdapter(
                RefCell::new(agent),
            )))
        }

        fn prompt(
            &self,
            history: Vec<wit::Message>,
        ) -> Result<Vec<wit::Message>, wit::PluginError> {
            let history = history.into_iter().map(Message::from).collect();
            let prompt = self.0.borrow_mut().prompt(history)?;
            Ok(messages_into(prompt))
        }

        fn act(&self, completion: String) -> Result<String, wit::PluginError> {
            self.0.borrow_mut().act(&completion).map_err(Into::into)
        }
    }
}

/// Implements the generated reward bindings for any [`Reward`].
pub struct RewardAdapter<R>(PhantomData<R>);

mod reward_glue {
    use super::*;
    use reward_plugin::exports::opentinker::plugin::reward as wit_reward;

    shared_glue!(reward_plugin);

    impl From<wit::Transcript> for Transcript {
        fn from(t: wit::Transcript) -> Self {
            Transcript {
                player: t.player,
                messages: t.messages.into_iter().map(Message::from).collect(),
            }
        }
    }

    fn transcripts(list: Vec<wit::Transcript>) -> Vec<Transcript> {
        list.into_iter().map(Transcript::from).collect()
    }

    impl<R: Reward> wit_reward::Guest for RewardAdapter<R> {
        fn score(
            config: String,
            task: String,
            list: Vec<wit::Transcript>,
        ) -> Result<Vec<f64>, wit::PluginError> {
            R::score(&config, &task, &transcripts(list)).map_err(Into::into)
        }

        fn score_group(
            config: String,
            task: String,
            episodes: Vec<Vec<wit::Transcript>>,
        ) -> Result<Option<Vec<Vec<f64>>>, wit::PluginError> {
            let episodes: Vec<Vec<Transcript>> = episodes.into_iter().map(transcripts).collect();
            R::score_group(&config, &task, &episodes).map_err(Into::into)
        }
    }
}

/// Implements the generated objective bindings for any [`Objective`].
pub struct ObjectiveAdapter<O>(PhantomData<O>);

mod objective_glue {
    use super::*;
    use objective_plugin::exports::opentinker::plugin::objective as wit_objective;
    use objective_plugin::opentinker::plugin::types as wit;

    impl<O: Objective> wit_objective::Guest for ObjectiveAdapter<O> {
        fn loss(
            config: String,
            datums: Vec<wit_objective::Datum>,
        ) -> Result<Vec<wit_objective::DatumLoss>, wit::PluginError> {
            datums
                .into_iter()
                .map(|datum| {
                    let datum = ObjectiveDatum {
                        logprobs: datum.logprobs,
                        inputs: datum
                            .inputs
                            .into_iter()
                            .map(|t| Tensor {
                                name: t.name,
                                shape: t.shape,
                                values: t.values,
                            })
                            .collect(),
                    };
                    let DatumLoss {
                        value,
                        gradient,
                        metrics,
                    } = O::loss(&config, &datum)
                        .map_err(|e| wit::PluginError { message: e.message })?;
                    Ok(wit_objective::DatumLoss {
                        value,
                        gradient,
                        metrics: metrics
                            .into_iter()
                            .map(|m| wit::Metric {
                                name: m.name,
                                value: m.value,
                            })
                            .collect(),
                    })
                })
                .collect()
        }
    }
}

/// Implements the generated advantage bindings for any [`Advantage`].
pub struct AdvantageAdapter<A>(PhantomData<A>);

mod advantage_glue {
    use super::*;
    use advantage_plugin::exports::opentinker::plugin::advantage as wit_advantage;
    use advantage_plugin::opentinker::plugin::types as wit;

    impl<A: Advantage> wit_advantage::Guest for AdvantageAdapter<A> {
        fn advantages(
            config: String,
            group: Vec<wit_advantage::Episode>,
        ) -> Result<Vec<Vec<f64>>, wit::PluginError> {
            let group: Vec<Vec<f64>> = group.into_iter().map(|e| e.turn_rewards).collect();
            A::advantages(&config, &group).map_err(|e| wit::PluginError { message: e.message })
        }
    }
}
