//! The wit-bindgen bindings, one module per world of `wit/plugin.wit`. A component links only the
//! module whose export macro it calls (and `imports`, for logging), so its component type names
//! just the kind it implements.

/// The host import (logging), shared by every kind.
pub mod imports {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "opentinker:plugin/imports@0.1.0",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
    });
}

/// Bindings of the `environment-plugin` world.
pub mod environment_plugin {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "opentinker:plugin/environment-plugin@0.1.0",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.1.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_environment_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::environment_plugin",
    });
}

/// Bindings of the `agent-plugin` world.
pub mod agent_plugin {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "opentinker:plugin/agent-plugin@0.1.0",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.1.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_agent_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::agent_plugin",
    });
}

/// Bindings of the `reward-plugin` world.
pub mod reward_plugin {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "opentinker:plugin/reward-plugin@0.1.0",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.1.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_reward_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::reward_plugin",
    });
}
