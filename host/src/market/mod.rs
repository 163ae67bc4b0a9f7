//! The plugin marketplace: plugins published as `namespace/name@version` (semver), each
//! version one immutable component digest, signed by its publisher (ed25519), distributed as
//! OCI artifacts through any OCI distribution registry or an OCI image layout folder, resolved
//! by range under a trust policy, cached by digest and pinned in a job's lock file.
//!
//! Beside the plugin host (`plugin`), which it uses to describe components; below the CLI.
//!
//! A package is named by a [`PackageRef`] (`namespace/name@range`) and published as an
//! [`Artifact`] (a [`Manifest`] of the component and its [`PublishedMetadata`], signed with a
//! publisher's [`KeyPair`]) to a [`Registry`]: an OCI distribution registry at a
//! [`RegistryRef`], or an OCI image layout folder ([`LayoutRegistry`]). [`packages`] holds the
//! operations on them (publish, resolve, fetch, search, yank, ...); a fetch is checked against
//! the [`TrustPolicy`] of the publishers' keys ([`PublisherKey`]), kept in a [`PackageCache`] by
//! digest, and pinned in a job's [`LockFile`]. Every failure is a [`MarketError`] with a
//! [`MarketErrorKind`].

mod address;
mod artifact;
mod cache;
mod digest;
mod error;
mod layout;
mod lock;
mod name;
mod oci;
pub mod packages;
mod registry;
mod signing;
mod trust;

pub use address::RegistryRef;
pub use artifact::{Artifact, MANIFEST_MEDIA_TYPE, Manifest, PluginManifest, PublishedMetadata};
pub use cache::PackageCache;
pub use digest::Digest;
pub use error::{MarketError, MarketErrorKind};
pub use layout::LayoutRegistry;
pub use lock::{LockFile, Locked, lock_path};
pub use name::{PackageId, PackageName, PackageRef};
pub use registry::Registry;
pub use signing::{KeyPair, PublisherKey, public_key_path};
pub use trust::TrustPolicy;
