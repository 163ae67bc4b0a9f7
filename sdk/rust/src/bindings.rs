//! The wit-bindgen bindings of `wit/v0.3`, one module per world that has one export (and
//! `imports`, for logging). A component links only the modules whose export macros it calls, so
//! its component type names just the kind it implements and its metadata: the component tooling
//! merges `environment-exports` and `metadata-exports` into an `environment-plugin`.

/// The host import (logging), shared by every kind.
pub mod imports {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/imports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
    });
}

/// Bindings of the `metadata-exports` world: what every plugin says about itself.
pub mod metadata_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/metadata-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_metadata_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::metadata_plugin",
    });
}

/// Bindings of the `environment-exports` world.
pub mod environment_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/environment-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_environment_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::environment_plugin",
    });
}

/// Bindings of the `agent-exports` world.
pub mod agent_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/agent-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_agent_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::agent_plugin",
    });
}

/// Bindings of the `reward-exports` world.
pub mod reward_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/reward-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_reward_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::reward_plugin",
    });
}

/// Bindings of the `objective-exports` world.
pub mod objective_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/objective-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_objective_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::objective_plugin",
    });
}

/// Bindings of the `advantage-exports` world.
pub mod advantage_plugin {
    wit_bindgen::generate!({
        path: "../../wit/v0.3",
        world: "opentinker:plugin/advantage-exports",
        runtime_path: "::opentinker_sdk::__wit_bindgen_rt",
        with: { "opentinker:plugin/host@0.3.0": crate::bindings::imports::opentinker::plugin::host },
        pub_export_macro: true,
        export_macro_name: "__export_advantage_plugin",
        default_bindings_module: "::opentinker_sdk::bindings::advantage_plugin",
    });
}

#[cfg(test)]
mod tests {
    /// wit-bindgen's `with` keys above name the host interface with its version; they must be
    /// the version the folder declares.
    #[test]
    fn the_with_keys_name_the_version_of_the_folder() {
        let wit = include_str!("../../../wit/v0.3/plugin.wit");
        assert!(wit.contains("\npackage opentinker:plugin@0.3.0;\n"));
        assert_eq!(
            include_str!("bindings.rs").matches("host@0.3.0\"").count(),
            6
        );
    }
}
