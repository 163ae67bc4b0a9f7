//! The versions of the contract this host runs, behind one set of calls: each kind's exports,
//! found in a component of any version, called with the host's types (those of 0.2, which 0.3
//! shares). A 0.1 component is adapted here, keeping its old behaviour: its episode constructor
//! cannot fail (a bad config shows at the first call, as it always did), its agent is two
//! functions with no state and no config, its reward takes no config, and it has no metadata.
//! Objectives and advantage estimators exist since 0.3 only.

use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre, ResourceAny};

use super::bindings::{v0_1, v0_2, v0_3};
use super::error::{CallError, ErrorKind};
use super::inspect::{ContractVersion, PluginKind, PluginMetadata};
use super::sandbox::StoreState;
use super::types::{
    DatumLoss, EnvInfo, GuestError, Message, MetadataExport, ObjectiveDatum, PlayerMessages,
    StepResult, Transcript,
};

type Outcome<T> = wasmtime::Result<Result<T, GuestError>>;

/// Where a component's exports of one kind are, in its version of the contract: an enum of the
/// versions' generated indices, found in a pre-instantiated component of `version`.
macro_rules! versioned_indices {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub(crate) enum $name {
            V0_1(v0_1::$name),
            V0_2(v0_2::$name),
            V0_3(v0_3::$name),
        }

        impl $name {
            pub(crate) fn new(
                pre: &InstancePre<StoreState>,
                version: ContractVersion,
            ) -> Option<Self> {
                match version {
                    ContractVersion::V0_1 => v0_1::$name::new(pre).ok().map(Self::V0_1),
                    ContractVersion::V0_2 => v0_2::$name::new(pre).ok().map(Self::V0_2),
                    ContractVersion::V0_3 => v0_3::$name::new(pre).ok().map(Self::V0_3),
                }
            }
        }
    };
}

versioned_indices!(
    /// Where a component's environment exports are.
    EnvironmentIndices
);
versioned_indices!(
    /// Where a component's agent exports are.
    AgentIndices
);
versioned_indices!(
    /// Where a component's reward exports are.
    RewardIndices
);

/// A component's environment exports in one instance.
pub(crate) enum EnvironmentGuest {
    V0_1(v0_1::exports::opentinker::plugin::environment::Guest),
    V0_2(v0_2::exports::opentinker::plugin::environment::Guest),
    V0_3(v0_3::exports::opentinker::plugin::environment::Guest),
}

impl EnvironmentIndices {
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<EnvironmentGuest> {
        Ok(match self {
            Self::V0_1(indices) => EnvironmentGuest::V0_1(indices.load(store, instance)?),
            Self::V0_2(indices) => EnvironmentGuest::V0_2(indices.load(store, instance)?),
            Self::V0_3(indices) => EnvironmentGuest::V0_3(indices.load(store, instance)?),
        })
    }
}

impl EnvironmentGuest {
    pub(crate) async fn info(&self, store: &mut Store<StoreState>) -> wasmtime::Result<EnvInfo> {
        match self {
            Self::V0_1(guest) => guest.call_info(store).await,
            Self::V0_2(guest) => guest.call_info(store).await,
            Self::V0_3(guest) => guest.call_info(store).await,
        }
    }

    pub(crate) async fn generate_task(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        seed: u64,
    ) -> Outcome<String> {
        match self {
            Self::V0_1(guest) => guest.call_generate_task(store, config, seed).await,
            Self::V0_2(guest) => guest.call_generate_task(store, config, seed).await,
            Self::V0_3(guest) => guest.call_generate_task(store, config, seed).await,
        }
    }

    /// Start an episode; a 0.1 constructor cannot fail (its errors show at the first call).
    pub(crate) async fn start(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        task: &str,
        seed: u64,
    ) -> Outcome<ResourceAny> {
        match self {
            Self::V0_1(guest) => Ok(Ok(guest
                .episode()
                .call_constructor(store, config, task, seed)
                .await?)),
            Self::V0_2(guest) => guest.episode().call_start(store, config, task, seed).await,
            Self::V0_3(guest) => guest.episode().call_start(store, config, task, seed).await,
        }
    }

    pub(crate) async fn observe(
        &self,
        store: &mut Store<StoreState>,
        episode: ResourceAny,
        player: u32,
    ) -> Outcome<Vec<Message>> {
        match self {
            Self::V0_1(guest) => guest.episode().call_observe(store, episode, player).await,
            Self::V0_2(guest) => guest.episode().call_observe(store, episode, player).await,
            Self::V0_3(guest) => guest.episode().call_observe(store, episode, player).await,
        }
    }

    pub(crate) async fn step(
        &self,
        store: &mut Store<StoreState>,
        episode: ResourceAny,
        action: &str,
    ) -> Outcome<StepResult> {
        match self {
            Self::V0_1(guest) => Ok(guest
                .episode()
                .call_step(store, episode, action)
                .await?
                .map(step_result_of_0_1)),
            Self::V0_2(guest) => guest.episode().call_step(store, episode, action).await,
            Self::V0_3(guest) => Ok(guest
                .episode()
                .call_step(store, episode, action)
                .await?
                .map(step_result_of_0_3)),
        }
    }

    pub(crate) async fn legal_actions(
        &self,
        store: &mut Store<StoreState>,
        episode: ResourceAny,
    ) -> wasmtime::Result<Option<Vec<String>>> {
        match self {
            Self::V0_1(guest) => guest.episode().call_legal_actions(store, episode).await,
            Self::V0_2(guest) => guest.episode().call_legal_actions(store, episode).await,
            Self::V0_3(guest) => guest.episode().call_legal_actions(store, episode).await,
        }
    }

    pub(crate) async fn demonstration(
        &self,
        store: &mut Store<StoreState>,
        episode: ResourceAny,
    ) -> wasmtime::Result<Option<String>> {
        match self {
            Self::V0_1(guest) => guest.episode().call_demonstration(store, episode).await,
            Self::V0_2(guest) => guest.episode().call_demonstration(store, episode).await,
            Self::V0_3(guest) => guest.episode().call_demonstration(store, episode).await,
        }
    }
}

/// 0.1's `(player, messages)` pairs as 0.2's named records.
fn step_result_of_0_1(
    result: v0_1::exports::opentinker::plugin::environment::StepResult,
) -> StepResult {
    StepResult {
        messages: result
            .messages
            .into_iter()
            .map(|(player, messages)| PlayerMessages { player, messages })
            .collect(),
        rewards: result.rewards,
        next_player: result.next_player,
        metrics: result.metrics,
    }
}

/// 0.3's step result, the same record as 0.2's in the environment interface of its own version.
fn step_result_of_0_3(
    result: v0_3::exports::opentinker::plugin::environment::StepResult,
) -> StepResult {
    StepResult {
        messages: result.messages,
        rewards: result.rewards,
        next_player: result.next_player,
        metrics: result.metrics,
    }
}

/// A component's agent exports in one instance, and (0.2, 0.3) the agent resource once started.
pub(crate) enum AgentGuest {
    V0_1(v0_1::exports::opentinker::plugin::agent::Guest),
    V0_2 {
        guest: v0_2::exports::opentinker::plugin::agent::Guest,
        agent: Option<ResourceAny>,
    },
    V0_3 {
        guest: v0_3::exports::opentinker::plugin::agent::Guest,
        agent: Option<ResourceAny>,
    },
}

impl AgentIndices {
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<AgentGuest> {
        Ok(match self {
            Self::V0_1(indices) => AgentGuest::V0_1(indices.load(store, instance)?),
            Self::V0_2(indices) => AgentGuest::V0_2 {
                guest: indices.load(store, instance)?,
                agent: None,
            },
            Self::V0_3(indices) => AgentGuest::V0_3 {
                guest: indices.load(store, instance)?,
                agent: None,
            },
        })
    }
}

impl AgentGuest {
    /// Start the agent of `player` (a 0.1 agent has nothing to start).
    pub(crate) async fn start(
        &mut self,
        store: &mut Store<StoreState>,
        config: &str,
        player: u32,
        seed: u64,
    ) -> Outcome<()> {
        match self {
            Self::V0_1(_) => Ok(Ok(())),
            Self::V0_2 { guest, agent } => {
                let started = guest
                    .player_agent()
                    .call_start(store, config, player, seed)
                    .await?;
                Ok(started.map(|resource| *agent = Some(resource)))
            }
            Self::V0_3 { guest, agent } => {
                let started = guest
                    .player_agent()
                    .call_start(store, config, player, seed)
                    .await?;
                Ok(started.map(|resource| *agent = Some(resource)))
            }
        }
    }

    pub(crate) async fn prompt(
        &self,
        store: &mut Store<StoreState>,
        history: &[Message],
    ) -> Outcome<Vec<Message>> {
        match self {
            Self::V0_1(guest) => guest.call_prompt(store, history).await,
            Self::V0_2 { guest, agent } => {
                let agent = started(*agent)?;
                guest
                    .player_agent()
                    .call_prompt(store, agent, history)
                    .await
            }
            Self::V0_3 { guest, agent } => {
                let agent = started(*agent)?;
                guest
                    .player_agent()
                    .call_prompt(store, agent, history)
                    .await
            }
        }
    }

    pub(crate) async fn act(
        &self,
        store: &mut Store<StoreState>,
        completion: &str,
    ) -> Outcome<String> {
        match self {
            Self::V0_1(guest) => guest.call_act(store, completion).await,
            Self::V0_2 { guest, agent } => {
                let agent = started(*agent)?;
                guest
                    .player_agent()
                    .call_act(store, agent, completion)
                    .await
            }
            Self::V0_3 { guest, agent } => {
                let agent = started(*agent)?;
                guest
                    .player_agent()
                    .call_act(store, agent, completion)
                    .await
            }
        }
    }
}

fn started(agent: Option<ResourceAny>) -> wasmtime::Result<ResourceAny> {
    agent.ok_or_else(|| wasmtime::format_err!("the agent was called before it was started"))
}

/// A component's reward exports in one instance.
pub(crate) enum RewardGuest {
    V0_1(v0_1::exports::opentinker::plugin::reward::Guest),
    V0_2(v0_2::exports::opentinker::plugin::reward::Guest),
    V0_3(v0_3::exports::opentinker::plugin::reward::Guest),
}

impl RewardIndices {
    pub(crate) fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<RewardGuest> {
        Ok(match self {
            Self::V0_1(indices) => RewardGuest::V0_1(indices.load(store, instance)?),
            Self::V0_2(indices) => RewardGuest::V0_2(indices.load(store, instance)?),
            Self::V0_3(indices) => RewardGuest::V0_3(indices.load(store, instance)?),
        })
    }
}

impl RewardGuest {
    /// One score per player; a 0.1 reward takes no config.
    pub(crate) async fn score(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        task: &str,
        transcripts: &[Transcript],
    ) -> Outcome<Vec<f64>> {
        match self {
            Self::V0_1(guest) => guest.call_score(store, task, transcripts).await,
            Self::V0_2(guest) => guest.call_score(store, config, task, transcripts).await,
            Self::V0_3(guest) => guest.call_score(store, config, task, transcripts).await,
        }
    }

    pub(crate) async fn score_group(
        &self,
        store: &mut Store<StoreState>,
        config: &str,
        task: &str,
        episodes: &[Vec<Transcript>],
    ) -> Outcome<Option<Vec<Vec<f64>>>> {
        match self {
            Self::V0_1(guest) => guest.call_score_group(store, task, episodes).await,
            Self::V0_2(guest) => guest.call_score_group(store, config, task, episodes).await,
            Self::V0_3(guest) => guest.call_score_group(store, config, task, episodes).await,
        }
    }
}

/// Where a component's objective exports are (since 0.3).
pub(crate) struct ObjectiveIndices(v0_3::ObjectiveIndices);

impl ObjectiveIndices {
    pub(crate) fn new(pre: &InstancePre<StoreState>, version: ContractVersion) -> Option<Self> {
        match version {
            ContractVersion::V0_1 | ContractVersion::V0_2 => None,
            ContractVersion::V0_3 => v0_3::ObjectiveIndices::new(pre).ok().map(Self),
        }
    }

    /// Call `loss` in `instance`.
    pub(crate) async fn loss(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
        config: &str,
        datums: &[ObjectiveDatum],
    ) -> Outcome<Vec<DatumLoss>> {
        let guest = self.0.load(&mut *store, instance)?;
        guest.call_loss(store, config, datums).await
    }
}

/// Where a component's advantage estimator is (since 0.3).
pub(crate) struct AdvantageIndices(v0_3::AdvantageIndices);

impl AdvantageIndices {
    pub(crate) fn new(pre: &InstancePre<StoreState>, version: ContractVersion) -> Option<Self> {
        match version {
            ContractVersion::V0_1 | ContractVersion::V0_2 => None,
            ContractVersion::V0_3 => v0_3::AdvantageIndices::new(pre).ok().map(Self),
        }
    }

    /// Call `advantages` in `instance` on a group given as each episode's turn rewards.
    pub(crate) async fn advantages(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
        config: &str,
        group: &[Vec<f64>],
    ) -> Outcome<Vec<Vec<f64>>> {
        use v0_3::exports::opentinker::plugin::advantage::Episode;
        let guest = self.0.load(&mut *store, instance)?;
        let group: Vec<Episode> = group
            .iter()
            .map(|turn_rewards| Episode {
                turn_rewards: turn_rewards.clone(),
            })
            .collect();
        guest.call_advantages(store, config, &group).await
    }
}

/// Where a component's metadata export is (0.2 and later; a 0.1 component has none).
pub(crate) enum MetadataIndices {
    V0_2(v0_2::MetadataIndices),
    V0_3(v0_3::MetadataIndices),
}

impl MetadataIndices {
    /// The metadata export of a pre-instantiated component of `version`; `None` for 0.1.
    pub(crate) fn new(
        pre: &InstancePre<StoreState>,
        version: ContractVersion,
    ) -> wasmtime::Result<Option<Self>> {
        Ok(match version {
            ContractVersion::V0_1 => None,
            ContractVersion::V0_2 => Some(Self::V0_2(v0_2::MetadataIndices::new(pre)?)),
            ContractVersion::V0_3 => Some(Self::V0_3(v0_3::MetadataIndices::new(pre)?)),
        })
    }

    /// Call the metadata export.
    pub(crate) async fn metadata(
        &self,
        store: &mut Store<StoreState>,
        instance: &Instance,
    ) -> wasmtime::Result<MetadataExport> {
        // The two versions' records have the same fields, each in types of its own.
        macro_rules! export {
            ($m:expr) => {{
                let m = $m;
                MetadataExport {
                    name: m.name,
                    version: m.version,
                    description: m.description,
                    license: m.license,
                    kinds: m.kinds.into_iter().map(PluginKind::from).collect(),
                    config_schema: m.config_schema,
                    language: m.language,
                }
            }};
        }
        Ok(match self {
            Self::V0_2(indices) => {
                export!(
                    indices
                        .load(&mut *store, instance)?
                        .call_metadata(store)
                        .await?
                )
            }
            Self::V0_3(indices) => {
                export!(
                    indices
                        .load(&mut *store, instance)?
                        .call_metadata(store)
                        .await?
                )
            }
        })
    }
}

impl PluginMetadata {
    /// The host's view of a metadata export; a config schema that is not JSON is the plugin's
    /// fault (`InvalidOutput`), named.
    pub(crate) fn from_export(export: MetadataExport) -> Result<Self, CallError> {
        let config_schema = match &export.config_schema {
            Some(text) => Some(serde_json::from_str(text).map_err(|e| {
                CallError::new(
                    ErrorKind::InvalidOutput,
                    format!("metadata() returned a config-schema that is not JSON: {e}"),
                )
            })?),
            None => None,
        };
        Ok(PluginMetadata {
            name: export.name,
            version: export.version,
            description: export.description,
            license: export.license,
            kinds: export.kinds,
            config_schema,
            language: export.language,
        })
    }
}

impl From<v0_2::opentinker::plugin::types::PluginKind> for PluginKind {
    fn from(kind: v0_2::opentinker::plugin::types::PluginKind) -> Self {
        use v0_2::opentinker::plugin::types::PluginKind as Wit;
        match kind {
            Wit::Environment => PluginKind::Environment,
            Wit::Agent => PluginKind::Agent,
            Wit::Reward => PluginKind::Reward,
        }
    }
}

impl From<v0_3::exports::opentinker::plugin::metadata::PluginKind> for PluginKind {
    fn from(kind: v0_3::exports::opentinker::plugin::metadata::PluginKind) -> Self {
        use v0_3::exports::opentinker::plugin::metadata::PluginKind as Wit;
        match kind {
            Wit::Environment => PluginKind::Environment,
            Wit::Agent => PluginKind::Agent,
            Wit::Reward => PluginKind::Reward,
            Wit::Objective => PluginKind::Objective,
            Wit::Advantage => PluginKind::Advantage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ContractVersion;

    #[test]
    fn releases_of_0_1_to_0_3_are_run_and_pre_releases_are_not() {
        assert_eq!(ContractVersion::of("0.1.0"), Some(ContractVersion::V0_1));
        assert_eq!(ContractVersion::of("0.1.7"), Some(ContractVersion::V0_1));
        assert_eq!(ContractVersion::of("0.2.3"), Some(ContractVersion::V0_2));
        assert_eq!(ContractVersion::of("0.2.0-rc1"), None);
        assert_eq!(ContractVersion::of("0.3.0"), Some(ContractVersion::V0_3));
        assert_eq!(ContractVersion::of("0.4.0"), None);
        assert_eq!(ContractVersion::of("1.0.0"), None);
        assert_eq!(ContractVersion::of("0.1"), None);
    }
}
