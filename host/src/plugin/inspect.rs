//! What a component imports and exports, which plugin kinds and WIT version it implements, and
//! whether this host can run it.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::LoadError;

/// The minor versions of `opentinker:plugin` this host runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ContractVersion {
    V0_1,
    V0_2,
    V0_3,
}

impl ContractVersion {
    /// The version of an export named `...@VERSION`: releases of 0.1, 0.2 and 0.3, which the
    /// bindings' semver lookup finds. A pre-release (`0.2.0-rc1`) is refused, as the lookup would
    /// refuse it at the first call.
    pub fn of(version: &str) -> Option<Self> {
        let version = semver::Version::parse(version).ok()?;
        match (version.major, version.minor, version.pre.is_empty()) {
            (0, 1, true) => Some(ContractVersion::V0_1),
            (0, 2, true) => Some(ContractVersion::V0_2),
            (0, 3, true) => Some(ContractVersion::V0_3),
            _ => None,
        }
    }
}

/// The newest contract version, as its folder declares it (`package opentinker:plugin@X;` in
/// `wit/v0.3/plugin.wit`). Components of every `0.1.x`, `0.2.x` and `0.3.x` run.
pub fn wit_version() -> &'static str {
    static VERSION: LazyLock<String> =
        LazyLock::new(|| package_version(include_str!("../../../wit/v0.3/plugin.wit")).to_string());
    &VERSION
}

/// The version of a WIT file's `package opentinker:plugin@VERSION;` line.
fn package_version(wit: &str) -> &str {
    wit.lines()
        .find_map(|line| line.trim().strip_prefix("package opentinker:plugin@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .unwrap_or_default()
}

/// The kinds of plugin a component can be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginKind {
    #[default]
    Environment,
    Agent,
    Reward,
    /// A training objective (since 0.3).
    Objective,
    /// An advantage estimator (since 0.3).
    Advantage,
}

impl PluginKind {
    /// The kind's name: its WIT interface, and its world's prefix.
    pub fn interface(self) -> &'static str {
        match self {
            PluginKind::Environment => "environment",
            PluginKind::Agent => "agent",
            PluginKind::Reward => "reward",
            PluginKind::Objective => "objective",
            PluginKind::Advantage => "advantage",
        }
    }

    /// The kind whose interface is `name` (see [`PluginKind::interface`]).
    pub fn of_interface(name: &str) -> Option<Self> {
        KIND_INTERFACES
            .into_iter()
            .find(|kind| kind.interface() == name)
    }

    /// The kind with its article, as a sentence names it: "an environment".
    pub fn with_article(self) -> &'static str {
        match self {
            PluginKind::Environment => "an environment",
            PluginKind::Agent => "an agent",
            PluginKind::Reward => "a reward",
            PluginKind::Objective => "an objective",
            PluginKind::Advantage => "an advantage estimator",
        }
    }

    /// The first contract version that has the kind.
    pub fn since(self) -> ContractVersion {
        match self {
            PluginKind::Environment | PluginKind::Agent | PluginKind::Reward => {
                ContractVersion::V0_1
            }
            PluginKind::Objective | PluginKind::Advantage => ContractVersion::V0_3,
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

impl PluginDescription {
    /// The contract version this host runs the component with, when it runs it.
    pub fn contract(&self) -> Option<ContractVersion> {
        self.wit_version.as_deref().and_then(ContractVersion::of)
    }
}

/// What a plugin says about itself (the `metadata` export of a 0.2 or 0.3 component).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PluginMetadata {
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    pub description: String,
    /// An SPDX expression.
    pub license: Option<String>,
    pub kinds: Vec<PluginKind>,
    /// The JSON Schema of its config, when it declares one.
    pub config_schema: Option<serde_json::Value>,
    /// The language it was written in.
    pub language: String,
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

/// The contract's interfaces that are plugin kinds; `metadata` is not one.
const KIND_INTERFACES: [PluginKind; 5] = [
    PluginKind::Environment,
    PluginKind::Agent,
    PluginKind::Reward,
    PluginKind::Objective,
    PluginKind::Advantage,
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
    for kind in KIND_INTERFACES {
        let prefix = format!("opentinker:plugin/{}@", kind.interface());
        if let Some(version) = exports.iter().find_map(|e| e.strip_prefix(&prefix)) {
            if ContractVersion::of(version).is_some_and(|v| v >= kind.since()) {
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

/// Whether this host runs exports of `version` (see [`ContractVersion::of`]).
pub fn supports_wit_version(version: &str) -> bool {
    ContractVersion::of(version).is_some()
}

/// The versions of `opentinker:plugin` this host runs, as messages name them.
pub fn supported_wit_range() -> String {
    "opentinker:plugin@0.1.x, @0.2.x or @0.3.x".to_string()
}

/// Refuse a component this host cannot run, naming what it found; the contract version it runs
/// with otherwise.
pub(crate) fn check_supported(
    description: &PluginDescription,
) -> Result<ContractVersion, LoadError> {
    let Some(version) = description
        .contract()
        .filter(|_| !description.kinds.is_empty())
    else {
        let found = if description.exports.is_empty() {
            "nothing".to_string()
        } else {
            description.exports.join(", ")
        };
        return Err(LoadError::UnsupportedVersion {
            supported: supported_wit_range(),
            found,
        });
    };
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
    let metadata = match version {
        ContractVersion::V0_1 => None,
        ContractVersion::V0_2 => Some("opentinker:plugin/metadata@0.2."),
        ContractVersion::V0_3 => Some("opentinker:plugin/metadata@0.3."),
    };
    if let Some(metadata) = metadata
        && !description.exports.iter().any(|e| e.starts_with(metadata))
    {
        return Err(LoadError::MissingMetadata {
            found: description.exports.join(", "),
        });
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::{package_version, supports_wit_version, wit_version};

    #[test]
    fn releases_of_0_1_to_0_3_are_supported_and_pre_releases_are_not() {
        assert!(supports_wit_version("0.1.0"));
        assert!(supports_wit_version("0.1.7"));
        assert!(supports_wit_version("0.2.0"));
        assert!(supports_wit_version("0.3.1"));
        assert!(!supports_wit_version("0.1.0-rc1"));
        assert!(!supports_wit_version("0.4.0"));
        assert!(!supports_wit_version("0.1"));
    }

    #[test]
    fn the_newest_version_is_read_from_its_folder() {
        assert_eq!(wit_version(), "0.3.0");
        assert_eq!(
            package_version("/// x\npackage opentinker:plugin@0.1.0;\n"),
            "0.1.0"
        );
    }
}
