//! The plugin marketplace: plugins published as `namespace/name@version` (semver), each
//! version one immutable component digest, signed by its publisher (ed25519), distributed as
//! OCI artifacts through any OCI distribution registry or an OCI image layout folder, resolved
//! by range under a trust policy, cached by digest and pinned in a job's lock file.
//!
//! Beside the plugin host (`plugin`), which it uses to describe components; below the CLI.

mod address;
pub mod artifact;
pub mod cache;
mod digest;
mod error;
pub mod layout;
pub mod lock;
mod name;
pub mod oci;
pub mod packages;
pub mod registry;
pub mod signing;
pub mod trust;

pub use address::RegistryRef;
pub use digest::Digest;
pub use error::{MarketError, MarketErrorKind};
pub use name::{PackageId, PackageName, PackageRef};
pub use registry::Registry;
