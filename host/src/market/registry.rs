//! Where packages live: any store of OCI manifests and blobs, with tags. The package operations
//! (`packages.rs`) are written once over this trait; an OCI distribution registry
//! (`oci.rs`) and an OCI image layout folder (`layout.rs`) implement it.
//!
//! The tags of a package's repository: its versions (`1.2.0`), the signature of a manifest
//! (`sha256-HEX.sig`, cosign's tag scheme, which registries without the referrers API serve
//! too) and yank markers (`yanked-1.2.0`).

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
