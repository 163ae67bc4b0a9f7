//! A published version as an OCI artifact, in the layout the Wasm ecosystem uses (the CNCF
//! "Wasm OCI artifact" conventions of wkg and oras): an image manifest whose one layer is the
//! component (`application/wasm`) and whose config is a Wasm config
//! (`application/vnd.wasm.config.v0+json`), with the package's metadata in the manifest's
//! annotations. Signatures and yank markers are small artifacts whose `subject` is a version's
//! manifest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::signing::Statement;
use super::{Digest, MarketError, PackageId};
use crate::plugin::{PluginDescription, PluginKind};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.opentinker.plugin.signature.v1+json";
pub const YANK_ARTIFACT_TYPE: &str = "application/vnd.opentinker.plugin.yank.v1+json";
/// The OCI empty descriptor's content, `{}`.
pub const EMPTY_CONFIG: &[u8] = b"{}";

/// The largest component a registry may hand us (the server's upload cap).
pub const MAX_COMPONENT_BYTES: i64 = 64 << 20;
/// The largest manifest, signature or config we read.
pub const MAX_SMALL_BLOB_BYTES: i64 = 1 << 20;

const TITLE: &str = "org.opencontainers.image.title";
const VERSION: &str = "org.opencontainers.image.version";
const DESCRIPTION: &str = "org.opencontainers.image.description";
const LICENSES: &str = "org.opencontainers.image.licenses";
const SOURCE: &str = "org.opencontainers.image.source";
const KINDS: &str = "dev.opentinker.plugin.kinds";
const WIT_VERSION: &str = "dev.opentinker.plugin.wit-version";
const LANGUAGE: &str = "dev.opentinker.plugin.language";
const CONFIG_SCHEMA: &str = "dev.opentinker.plugin.config-schema";

/// An OCI content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes),
            size: bytes.len() as i64,
            annotations: None,
        }
    }
}

/// An OCI image manifest (the fields this artifact uses).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn parse(what: &str, bytes: &[u8]) -> Result<Manifest, MarketError> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| MarketError::Invalid {
                what: what.to_string(),
                message: format!("not an OCI image manifest: {e}"),
            })?;
        if manifest.schema_version != 2 || manifest.media_type != MANIFEST_MEDIA_TYPE {
            return Err(MarketError::Invalid {
                what: what.to_string(),
                message: format!(
                    "schema {} of media type {}, not an OCI image manifest",
                    manifest.schema_version, manifest.media_type
                ),
            });
        }
        Ok(manifest)
    }

    /// A small artifact of `artifact_type` about `subject`: one layer holding `content`.
    pub fn referrer(artifact_type: &str, subject: Descriptor, content: &[u8]) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            artifact_type: Some(artifact_type.into()),
            config: Descriptor::of(EMPTY_MEDIA_TYPE, EMPTY_CONFIG),
            layers: vec![Descriptor::of(artifact_type, content)],
            subject: Some(subject),
            annotations: BTreeMap::new(),
        }
    }
}

/// What a publisher says of a package, beside what the component itself shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PublishedMetadata {
    pub description: Option<String>,
    pub license: Option<String>,
    pub source: Option<String>,
    /// The language it was written in (`rust`, `python`, ...).
    pub language: Option<String>,
    /// A JSON Schema of its config.
    pub config_schema: Option<serde_json::Value>,
}

impl PublishedMetadata {
    /// Fill what is still unknown from the metadata the component exports (contract 0.2): the
    /// publisher's flags and the plugin's manifest come first.
    pub fn fill_from(&mut self, export: &crate::plugin::PluginMetadata) {
        let given = |text: &str| Some(text.to_string()).filter(|t| !t.is_empty());
        self.description = self
            .description
            .take()
            .or_else(|| given(&export.description));
        self.license = self.license.take().or_else(|| export.license.clone());
        self.language = self.language.take().or_else(|| given(&export.language));
        self.config_schema = self
            .config_schema
            .take()
            .or_else(|| export.config_schema.clone());
    }
}

/// A version's metadata, as `plugin info` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PackageInfo {
    pub package: String,
    pub digest: Digest,
    pub manifest: Digest,
    pub size: i64,
    pub kinds: Vec<PluginKind>,
    pub wit_version: Option<String>,
    #[serde(flatten)]
    pub metadata: PublishedMetadata,
}

/// The Wasm config blob (`application/vnd.wasm.config.v0+json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    architecture: &'static str,
    os: &'static str,
    layer_digests: [&'a Digest; 1],
    component: ComponentWorld<'a>,
}

#[derive(Serialize)]
struct ComponentWorld<'a> {
    exports: &'a [String],
    imports: &'a [String],
}

/// A version ready to push: its manifest, config and component, each as stored.
pub struct Artifact {
    pub manifest: Vec<u8>,
    pub config: Vec<u8>,
    pub component: Vec<u8>,
}

impl Artifact {
    /// The artifact of the component `bytes` (described by the plugin host as `description`)
    /// published as `id` with `metadata`.
    pub fn build(
        id: &PackageId,
        component: Vec<u8>,
        description: &PluginDescription,
        metadata: &PublishedMetadata,
    ) -> Artifact {
        let layer = Descriptor::of(WASM_LAYER_MEDIA_TYPE, &component);
        let config = serde_json::to_vec(&WasmConfig {
            architecture: "wasm",
            os: "wasip2",
            layer_digests: [&layer.digest],
            component: ComponentWorld {
                exports: &description.exports,
                imports: &description.imports,
            },
        })
        .unwrap_or_default();
        let mut annotations = BTreeMap::new();
        annotations.insert(TITLE.into(), id.name.to_string());
        annotations.insert(VERSION.into(), id.version.to_string());
        let kinds: Vec<&str> = description.kinds.iter().map(|k| k.interface()).collect();
        annotations.insert(KINDS.into(), kinds.join(","));
        if let Some(wit) = &description.wit_version {
            annotations.insert(WIT_VERSION.into(), wit.clone());
        }
        let optional = [
            (DESCRIPTION, metadata.description.clone()),
            (LICENSES, metadata.license.clone()),
            (SOURCE, metadata.source.clone()),
            (LANGUAGE, metadata.language.clone()),
            (
                CONFIG_SCHEMA,
                metadata.config_schema.as_ref().map(|s| s.to_string()),
            ),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                annotations.insert(key.into(), value);
            }
        }
        let manifest = Manifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            artifact_type: Some(WASM_CONFIG_MEDIA_TYPE.into()),
            config: Descriptor::of(WASM_CONFIG_MEDIA_TYPE, &config),
            layers: vec![layer],
            subject: None,
            annotations,
        };
        Artifact {
            manifest: manifest.to_json(),
            config,
            component,
        }
    }

    pub fn manifest_digest(&self) -> Digest {
        Digest::of(&self.manifest)
    }

    pub fn component_digest(&self) -> Digest {
        Digest::of(&self.component)
    }

    /// What the publisher signs.
    pub fn statement(&self, id: &PackageId) -> Statement {
        Statement::new(id, self.manifest_digest(), self.component_digest())
    }
}

/// A fetched version's manifest, checked to be a plugin artifact of `id`.
pub struct PluginManifest {
    pub digest: Digest,
    pub manifest: Manifest,
}

impl PluginManifest {
    pub fn parse(id: &PackageId, bytes: &[u8]) -> Result<PluginManifest, MarketError> {
        let what = format!("the manifest of {id}");
        let manifest = Manifest::parse(&what, bytes)?;
        let invalid = |message: String| MarketError::Invalid {
            what: what.clone(),
            message,
        };
        if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
            return Err(invalid(format!(
                "its config is {}, not a Wasm config ({WASM_CONFIG_MEDIA_TYPE}): not a plugin",
                manifest.config.media_type
            )));
        }
        match manifest.layers.as_slice() {
            [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE => {
                if layer.size > MAX_COMPONENT_BYTES {
                    return Err(invalid(format!(
                        "its component is {} bytes, above the limit of {MAX_COMPONENT_BYTES}",
                        layer.size
                    )));
                }
            }
            _ => {
                return Err(invalid(format!(
                    "a plugin has one {WASM_LAYER_MEDIA_TYPE} layer"
                )));
            }
        }
        let title = manifest.annotations.get(TITLE).map(String::as_str);
        let version = manifest.annotations.get(VERSION).map(String::as_str);
        if title != Some(&id.name.to_string()) || version != Some(&id.version.to_string()) {
            return Err(invalid(format!(
                "it was published as {}@{}, not as {id}",
                title.unwrap_or("?"),
                version.unwrap_or("?")
            )));
        }
        Ok(PluginManifest {
            digest: Digest::of(bytes),
            manifest,
        })
    }

    pub fn component(&self) -> &Descriptor {
        &self.manifest.layers[0]
    }

    /// This manifest as the subject of a referrer.
    pub fn descriptor(&self, bytes: &[u8]) -> Descriptor {
        Descriptor::of(MANIFEST_MEDIA_TYPE, bytes)
    }

    /// What a signature of this version must sign.
    pub fn statement(&self, id: &PackageId) -> Statement {
        Statement::new(id, self.digest.clone(), self.component().digest.clone())
    }

    pub fn info(&self, id: &PackageId) -> PackageInfo {
        let get = |key: &str| self.manifest.annotations.get(key).cloned();
        let kinds = get(KINDS)
            .unwrap_or_default()
            .split(',')
            .filter_map(PluginKind::of_interface)
            .collect();
        PackageInfo {
            package: id.to_string(),
            digest: self.component().digest.clone(),
            manifest: self.digest.clone(),
            size: self.component().size,
            kinds,
            wit_version: get(WIT_VERSION),
            metadata: PublishedMetadata {
                description: get(DESCRIPTION),
                license: get(LICENSES),
                source: get(SOURCE),
                language: get(LANGUAGE),
                config_schema: get(CONFIG_SCHEMA).and_then(|s| serde_json::from_str(&s).ok()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn description() -> PluginDescription {
        PluginDescription {
            digest: String::new(),
            wit_version: Some("0.1.0".into()),
            kinds: vec![PluginKind::Environment],
            exports: vec!["opentinker:plugin/environment@0.1.0".into()],
            imports: vec![],
            size: 4,
        }
    }

    #[test]
    fn a_built_artifact_reads_back_as_the_version_it_was_built_for() {
        let id: PackageId = "games/maze@1.2.0".parse().unwrap();
        let metadata = PublishedMetadata {
            description: Some("A maze".into()),
            config_schema: Some(serde_json::json!({"type": "object"})),
            ..PublishedMetadata::default()
        };
        let artifact = Artifact::build(&id, b"\0asm".to_vec(), &description(), &metadata);
        let read = PluginManifest::parse(&id, &artifact.manifest).unwrap();
        assert_eq!(read.digest, artifact.manifest_digest());
        assert_eq!(read.component().digest, Digest::of(b"\0asm"));
        assert_eq!(read.manifest.config.digest, Digest::of(&artifact.config));
        let info = read.info(&id);
        assert_eq!(info.kinds, vec![PluginKind::Environment]);
        assert_eq!(info.wit_version.as_deref(), Some("0.1.0"));
        assert_eq!(info.metadata.description.as_deref(), Some("A maze"));
        assert_eq!(read.statement(&id), artifact.statement(&id));

        // Every kind reads back, the 0.3 ones too.
        let objective = PluginDescription {
            wit_version: Some("0.3.0".into()),
            kinds: vec![PluginKind::Objective, PluginKind::Advantage],
            ..description()
        };
        let artifact = Artifact::build(&id, b"\0asm".to_vec(), &objective, &metadata);
        let read = PluginManifest::parse(&id, &artifact.manifest).unwrap();
        assert_eq!(read.info(&id).kinds, objective.kinds);

        let other: PackageId = "games/maze@1.3.0".parse().unwrap();
        let error = PluginManifest::parse(&other, &artifact.manifest)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("published as games/maze@1.2.0"), "{error}");
    }
}
