//! Host-side bindings of the plugin contract, one module per minor version in `wit/`, each
//! generated for the world that combines every plugin kind (a component that exports only some
//! kinds loads only those interfaces). Version 0.1's shared records are the same as 0.2's, so its
//! bindings reuse 0.2's types; `contract` adapts what differs.

/// `wit/v0.2`: the contract new plugins are built against.
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
