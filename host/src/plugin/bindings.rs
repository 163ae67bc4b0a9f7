//! Host-side bindings of `wit/plugin.wit`, generated once for the world that combines every
//! plugin kind; a component that exports only some kinds loads only those interfaces.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "opentinker:plugin/plugin",
    exports: { default: async },
    additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
});

pub use exports::opentinker::plugin::agent::GuestIndices as AgentIndices;
pub use exports::opentinker::plugin::environment::GuestIndices as EnvironmentIndices;
pub use exports::opentinker::plugin::reward::GuestIndices as RewardIndices;
