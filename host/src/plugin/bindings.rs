//! Host-side bindings of the plugin contract, one module per minor version in `wit/`, each
//! generated for the world that combines every plugin kind (a component that exports only some
//! kinds loads only those interfaces). The shared records of 0.1 and 0.3 are the same as 0.2's,
//! so their bindings reuse 0.2's types; `contract` adapts what differs.

/// `wit/v0.3`: the contract of objectives and advantage estimators; its environments, agents
/// and rewards are 0.2's.
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.3",
        world: "opentinker:plugin/plugin",
        exports: { default: async },
        with: { "opentinker:plugin/types": super::v0_2::opentinker::plugin::types },
    });

    pub use exports::opentinker::plugin::advantage::GuestIndices as AdvantageIndices;
    pub use exports::opentinker::plugin::agent::GuestIndices as AgentIndices;
    pub use exports::opentinker::plugin::environment::GuestIndices as EnvironmentIndices;
    pub use exports::opentinker::plugin::metadata::GuestIndices as MetadataIndices;
    pub use exports::opentinker::plugin::objective::GuestIndices as ObjectiveIndices;
    pub use exports::opentinker::plugin::reward::GuestIndices as RewardIndices;
}

/// `wit/v0.2`: the contract of the SDKs' environments, agents and rewards.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.2",
        world: "opentinker:plugin/plugin",
        exports: { default: async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
    });

    pub use exports::opentinker::plugin::agent::GuestIndices as AgentIndices;
    pub use exports::opentinker::plugin::environment::GuestIndices as EnvironmentIndices;
    pub use exports::opentinker::plugin::metadata::GuestIndices as MetadataIndices;
    pub use exports::opentinker::plugin::reward::GuestIndices as RewardIndices;
}

/// `wit/v0.1`: components built before 0.2, run with their old behaviour.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1",
        world: "opentinker:plugin/plugin",
        exports: { default: async },
        with: { "opentinker:plugin/types": super::v0_2::opentinker::plugin::types },
    });

    pub use exports::opentinker::plugin::agent::GuestIndices as AgentIndices;
    pub use exports::opentinker::plugin::environment::GuestIndices as EnvironmentIndices;
    pub use exports::opentinker::plugin::reward::GuestIndices as RewardIndices;
}
