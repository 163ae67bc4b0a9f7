//! Glue from the author's traits to the generated `Guest` traits. Each world has its own copy of
//! the shared WIT types, so the conversions are written once as a macro over a bindings module.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::bindings::{agent_plugin, environment_plugin, reward_plugin};
use crate::{Agent, Environment, Message, PluginError, Reward, StepResult, Transcript};

/// Conversions between this crate's types and the shared types of one world's bindings.
macro_rules! convert_shared_types {
    ($types:path) => {
        use $types as wit;

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

mod environment_types {
    use super::*;
    convert_shared_types!(environment_plugin::opentinker::plugin::types);
}

mod agent_types {
    use super::*;
    convert_shared_types!(agent_plugin::opentinker::plugin::types);
}

mod reward_types {
    use super::*;
    convert_shared_types!(reward_plugin::opentinker::plugin::types);

    impl From<wit::Transcript> for Transcript {
        fn from(t: wit::Transcript) -> Self {
            Transcript {
                player: t.player,
                messages: t.messages.into_iter().map(Message::from).collect(),
            }
        }
    }
}

fn messages_into<T: From<Message>>(messages: Vec<Message>) -> Vec<T> {
    messages.into_iter().map(T::from).collect()
}

/// Implements the generated environment bindings for any [`Environment`].
pub struct EnvironmentAdapter<E>(PhantomData<E>);

/// One live episode. WIT resources are called through `&self`, hence the `RefCell`; a failed
/// constructor is kept and reported by the episode's first call.
pub struct EpisodeAdapter<E>(RefCell<Result<E, PluginError>>);

mod environment_glue {
    use super::*;
    use environment_plugin::exports::opentinker::plugin::environment as wit_env;
    use environment_plugin::opentinker::plugin::types as wit;

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

    impl<E: Environment> EpisodeAdapter<E> {
        fn with<T>(
            &self,
            call: impl FnOnce(&mut E) -> Result<T, PluginError>,
        ) -> Result<T, wit::PluginError> {
            match &mut *self.0.borrow_mut() {
                Ok(episode) => call(episode).map_err(Into::into),
                Err(error) => Err(error.clone().into()),
            }
        }
    }

    impl<E: Environment> wit_env::GuestEpisode for EpisodeAdapter<E> {
        fn new(config: String, task: String, seed: u64) -> Self {
            EpisodeAdapter(RefCell::new(E::new(&config, &task, seed)))
        }

        fn observe(&self, player: u32) -> Result<Vec<wit::Message>, wit::PluginError> {
            self.with(|e| e.observe(player).map(messages_into))
        }

        fn step(&self, action: String) -> Result<wit_env::StepResult, wit::PluginError> {
            self.with(|e| e.step(&action))
                .map(|r: StepResult| wit_env::StepResult {
                    messages: r
                        .messages
                        .into_iter()
                        .map(|(player, messages)| (player, messages_into(messages)))
                        .collect(),
                    rewards: r.rewards,
                    next_player: r.next_player,
                    metrics: r
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
            self.0.borrow().as_ref().ok()?.legal_actions()
        }

        fn demonstration(&self) -> Option<String> {
            self.0.borrow_mut().as_mut().ok()?.demonstration()
        }
    }
}

/// Implements the generated agent bindings for any [`Agent`].
pub struct AgentAdapter<A>(PhantomData<A>);

mod agent_glue {
    use super::*;
    use agent_plugin::exports::opentinker::plugin::agent as wit_agent;
    use agent_plugin::opentinker::plugin::types as wit;

    impl<A: Agent> wit_agent::Guest for AgentAdapter<A> {
        fn prompt(history: Vec<wit::Message>) -> Result<Vec<wit::Message>, wit::PluginError> {
            let history = history.into_iter().map(Message::from).collect();
            A::prompt(history).map(messages_into).map_err(Into::into)
        }

        fn act(completion: String) -> Result<String, wit::PluginError> {
            A::act(&completion).map_err(Into::into)
        }
    }
}

/// Implements the generated reward bindings for any [`Reward`].
pub struct RewardAdapter<R>(PhantomData<R>);

mod reward_glue {
    use super::*;
    use reward_plugin::exports::opentinker::plugin::reward as wit_reward;
    use reward_plugin::opentinker::plugin::types as wit;

    fn transcripts(list: Vec<wit::Transcript>) -> Vec<Transcript> {
        list.into_iter().map(Transcript::from).collect()
    }

    impl<R: Reward> wit_reward::Guest for RewardAdapter<R> {
        fn score(task: String, list: Vec<wit::Transcript>) -> Result<Vec<f64>, wit::PluginError> {
            R::score(&task, &transcripts(list)).map_err(Into::into)
        }

        fn score_group(
            task: String,
            episodes: Vec<Vec<wit::Transcript>>,
        ) -> Result<Option<Vec<Vec<f64>>>, wit::PluginError> {
            let episodes: Vec<Vec<Transcript>> = episodes.into_iter().map(transcripts).collect();
            R::score_group(&task, &episodes).map_err(Into::into)
        }
    }
}
