//! Where packages live: any store of OCI manifests and blobs, with tags. The package operations
//! (`packages.rs`) are written once over this trait; an OCI distribution registry
//! (`oci.rs`) and an OCI image layout folder (`layout.rs`) implement it.
//!
//! The tags of a package's repository: its versions (`1.2.0`), the signature of a manifest
//! (`sha256-HEX.sig`, cosign's tag scheme, which registries without the referrers API serve
//! too) and yank markers (`yanked-1.2.0`).

use std::path::PathBuf;

use async_trait::async_trait;

use super::artifact::Descriptor;
use super::{Digest, MarketError, PackageName};

#[async_trait]
pub trait Registry: Send + Sync {
    /// Where the registry is, as messages name it.
    fn location(&self) -> String;

    /// The tags of `name`'s repository; empty when it has none.
    async fn tags(&self, name: &PackageName) -> Result<Vec<String>, MarketError>;

    /// The manifest `tag` points at, or `None` when there is no such tag.
    async fn manifest(&self, name: &PackageName, tag: &str)
    -> Result<Option<Vec<u8>>, MarketError>;

    /// The blob of `descriptor` (at most its size; its digest is the caller's to check).
    async fn blob(
        &self,
        name: &PackageName,
        descriptor: &Descriptor,
    ) -> Result<Vec<u8>, MarketError>;

    async fn push_blob(&self, name: &PackageName, bytes: &[u8]) -> Result<(), MarketError>;

    /// Store `manifest` and point `tag` at it.
    async fn push_manifest(
        &self,
        name: &PackageName,
        tag: &str,
        manifest: &[u8],
    ) -> Result<(), MarketError>;

    /// Every package the registry holds.
    async fn catalog(&self) -> Result<Vec<PackageName>, MarketError>;
}

/// The tag of the signature of the manifest `digest`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// The tag that marks `version` yanked.
pub fn yank_tag(version: &semver::Version) -> String {
    format!("yanked-{version}")
}

/// A registry as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryRef {
    /// `oci://HOST[:PORT][/PREFIX]`: an OCI distribution registry; packages are the
    /// repositories `PREFIX/NAMESPACE/NAME`. Loopback hosts are spoken to over plain HTTP,
    /// others over HTTPS.
    Oci { host: String, prefix: String },
    /// `oci-layout:DIR`: an OCI image layout folder, for offline use.
    Layout(PathBuf),
}

impl std::str::FromStr for RegistryRef {
    type Err = MarketError;

    fn from_str(text: &str) -> Result<Self, MarketError> {
        if let Some(dir) = text.strip_prefix("oci-layout:") {
            return Ok(RegistryRef::Layout(PathBuf::from(dir)));
        }
        if let Some(rest) = text.strip_prefix("oci://") {
            let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(MarketError::BadName {
                    text: text.into(),
                    reason: "no registry host after `oci://`".into(),
                });
            }
            return Ok(RegistryRef::Oci {
                host: host.to_string(),
                prefix: prefix.trim_end_matches('/').to_string(),
            });
        }
        Err(MarketError::BadName {
            text: text.into(),
            reason: "a registry is `oci://HOST[:PORT][/PREFIX]` or `oci-layout:DIR`".into(),
        })
    }
}

impl RegistryRef {
    /// Connect to the registry (nothing is sent until the first operation).
    pub fn open(&self) -> Result<Box<dyn Registry>, MarketError> {
        Ok(match self {
            RegistryRef::Oci { host, prefix } => {
                Box::new(super::oci::OciRegistry::new(host, prefix)?)
            }
            RegistryRef::Layout(dir) => Box::new(super::layout::LayoutRegistry::new(dir)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_named_by_scheme() {
        assert_eq!(
            "oci://127.0.0.1:5000/plugins"
                .parse::<RegistryRef>()
                .unwrap(),
            RegistryRef::Oci {
                host: "127.0.0.1:5000".into(),
                prefix: "plugins".into()
            }
        );
        assert_eq!(
            "oci-layout:out/market".parse::<RegistryRef>().unwrap(),
            RegistryRef::Layout("out/market".into())
        );
        let error = "https://x".parse::<RegistryRef>().unwrap_err().to_string();
        assert!(error.contains("oci-layout:DIR"), "{error}");
    }
}
