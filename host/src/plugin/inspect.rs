//! What a component imports and exports, which plugin kinds and WIT version it implements, and
//! whether this host can run it.

use serde::{Deserialize, Serialize};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::LoadError;

/// The WIT package version this host implements; components of any `0.1.x` are accepted.
pub const WIT_VERSION: &str = "0.1.0";
const SUPPORTED_PREFIX: &str = "0.1.";

/// The kinds of plugin a component can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginKind {
    #[default]
    Environment,
    Agent,
    Reward,
}

impl PluginKind {
    /// The kind's name: its WIT interface, and its world's prefix.
    pub fn interface(self) -> &'static str {
        match self {
            PluginKind::Environment => "environment",
            PluginKind::Agent => "agent",
            PluginKind::Reward => "reward",
        }
    }
}

/// What `opentinker plugin inspect` prints.
#[derive(Clone, Debug, Serialize)]
pub struct PluginDescription {
    /// sha256 of the component's bytes, hex: the plugin's identity.
    pub digest: String,
    /// The `opentinker:plugin` version it exports, if any.
    pub wit_version: Option<String>,
    pub kinds: Vec<PluginKind>,
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    pub size: usize,
}

/// WASI 0.2 interfaces (linked in neutered form) and the host's own imports.
const PROVIDED_IMPORT_PREFIXES: &[&str] = &[
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:cli/",
    "wasi:filesystem/",
    "wasi:sockets/",
    "opentinker:plugin/host@",
    "opentinker:plugin/types@",
];

pub(crate) fn describe(
    engine: &Engine,
    component: &Component,
    digest: String,
    size: usize,
) -> PluginDescription {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let imports: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let mut kinds = Vec::new();
    let mut wit_version = None;
    for kind in [
        PluginKind::Environment,
        PluginKind::Agent,
        PluginKind::Reward,
    ] {
        let prefix = format!("opentinker:plugin/{}@", kind.interface());
        if let Some(version) = exports.iter().find_map(|e| e.strip_prefix(&prefix)) {
            if supports_wit_version(version) {
                kinds.push(kind);
            }
            wit_version.get_or_insert_with(|| version.to_string());
        }
    }
    PluginDescription {
        digest,
        wit_version,
        kinds,
        exports,
        imports,
        size,
    }
}

/// Whether this host runs exports of `version`: `0.1.x` releases, which the bindings' semver
/// lookup finds. A pre-release (`0.1.0-rc1`) is refused here, as the lookup would refuse it at
/// the first call.
pub fn supports_wit_version(version: &str) -> bool {
    semver::Version::parse(version).is_ok_and(|v| v.major == 0 && v.minor == 1 && v.pre.is_empty())
}

/// The versions of `opentinker:plugin` this host runs, as messages name them.
pub fn supported_wit_range() -> String {
    format!("opentinker:plugin@{SUPPORTED_PREFIX}x")
}

/// Refuse a component this host cannot run, naming what it found.
pub(crate) fn check_supported(description: &PluginDescription) -> Result<(), LoadError> {
    if description.kinds.is_empty() {
        let found = if description.exports.is_empty() {
            "nothing".to_string()
        } else {
            description.exports.join(", ")
        };
        return Err(LoadError::UnsupportedVersion {
            supported: supported_wit_range(),
            found,
        });
    }
    let forbidden: Vec<&str> = description
        .imports
        .iter()
        .filter(|name| !PROVIDED_IMPORT_PREFIXES.iter().any(|p| name.starts_with(p)))
        .map(String::as_str)
        .collect();
    if !forbidden.is_empty() {
        return Err(LoadError::ForbiddenImports {
            forbidden: forbidden.join(", "),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::supports_wit_version;

    #[test]
    fn releases_of_0_1_are_supported_and_pre_releases_are_not() {
        assert!(supports_wit_version("0.1.0"));
        assert!(supports_wit_version("0.1.7"));
        assert!(!supports_wit_version("0.1.0-rc1"));
        assert!(!supports_wit_version("0.2.0"));
        assert!(!supports_wit_version("0.1"));
    }
}
