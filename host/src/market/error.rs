//! Why a publish, a resolution or an install was refused: each variant says what would fix it.

use std::path::PathBuf;

use semver::Version;

use super::digest::DigestError;
use super::name::NameError;
use super::{Digest, PackageId, PackageName};

#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error("`{text}` is not a package name: {reason}")]
    BadName { text: String, reason: String },
    #[error(
        "{registry} has no package {name} (publish it with `opentinker plugin publish`, or check the name)"
    )]
    NoSuchPackage { registry: String, name: PackageName },
    #[error(
        "{registry} has no version of {name} in `{range}`: it has {}",
        list_versions(available)
    )]
    NoVersionInRange {
        registry: String,
        name: PackageName,
        range: String,
        available: Vec<Version>,
    },
    #[error("{registry} has no version {id}")]
    NoSuchVersion { registry: String, id: String },
    #[error("{id} is yanked: a range no longer picks it (pin it exactly, `={}`, or ask for a later version)", id.version)]
    Yanked { id: PackageId },
    #[error(
        "{id} is already published with other bytes ({published}); a version never changes: publish a new version"
    )]
    VersionExists { id: String, published: Digest },
    #[error(
        "the namespace `{namespace}` belongs to another publisher: publish under a namespace of your own"
    )]
    NamespaceTaken { namespace: String },
    #[error(
        "{id} is not signed, and the trust policy ({policy}) requires a signature: ask its publisher to sign it, or allow unsigned plugins in the policy"
    )]
    SignatureMissing { id: String, policy: String },
    #[error(
        "the signature of {id} is not valid: {reason}; the bytes may have been changed after publishing: do not run it"
    )]
    SignatureInvalid { id: String, reason: String },
    #[error(
        "{id} is signed by {key}, whom the trust policy ({policy}) does not trust for `{namespace}`: add the key with `opentinker keys trust` if you trust its publisher"
    )]
    UntrustedPublisher {
        id: String,
        key: String,
        namespace: String,
        policy: String,
    },
    #[error(
        "{id} implements opentinker:plugin {found}; this host supports {supported}: pick a version built for this host"
    )]
    UnsupportedWit {
        id: String,
        found: String,
        supported: String,
    },
    #[error(
        "{what} has digest {found}, not the {expected} it was published with: the registry's copy was changed or damaged"
    )]
    DigestMismatch {
        what: String,
        expected: Digest,
        found: Digest,
    },
    #[error("{what} is not valid: {message}")]
    Invalid { what: String, message: String },
    #[error("the component is not a plugin this host can run: {0}")]
    NotAPlugin(#[from] crate::plugin::LoadError),
    #[error("the registry {registry}: {message}")]
    Registry { registry: String, message: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What kind of refusal, for programs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarketErrorKind {
    BadName,
    NotFound,
    Yanked,
    VersionExists,
    NamespaceTaken,
    SignatureMissing,
    SignatureInvalid,
    UntrustedPublisher,
    UnsupportedWit,
    DigestMismatch,
    Invalid,
    Unavailable,
}

impl MarketError {
    pub fn kind(&self) -> MarketErrorKind {
        use MarketErrorKind as K;
        match self {
            MarketError::BadName { .. } => K::BadName,
            MarketError::NoSuchPackage { .. }
            | MarketError::NoVersionInRange { .. }
            | MarketError::NoSuchVersion { .. } => K::NotFound,
            MarketError::Yanked { .. } => K::Yanked,
            MarketError::VersionExists { .. } => K::VersionExists,
            MarketError::NamespaceTaken { .. } => K::NamespaceTaken,
            MarketError::SignatureMissing { .. } => K::SignatureMissing,
            MarketError::SignatureInvalid { .. } => K::SignatureInvalid,
            MarketError::UntrustedPublisher { .. } => K::UntrustedPublisher,
            MarketError::UnsupportedWit { .. } => K::UnsupportedWit,
            MarketError::DigestMismatch { .. } => K::DigestMismatch,
            MarketError::Invalid { .. } | MarketError::NotAPlugin(_) => K::Invalid,
            MarketError::Registry { .. } | MarketError::Io { .. } => K::Unavailable,
        }
    }

    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> MarketError + '_ {
        move |source| MarketError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn list_versions(versions: &[Version]) -> String {
    if versions.is_empty() {
        return "none that is not yanked".into();
    }
    versions
        .iter()
        .map(Version::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<NameError> for MarketError {
    fn from(error: NameError) -> Self {
        MarketError::BadName {
            text: error.text,
            reason: error.reason,
        }
    }
}

impl From<DigestError> for MarketError {
    fn from(error: DigestError) -> Self {
        match error {
            DigestError::Mismatch {
                what,
                expected,
                found,
            } => MarketError::DigestMismatch {
                what,
                expected,
                found,
            },
            DigestError::Invalid { text } => MarketError::Invalid {
                what: "a digest".into(),
                message: format!("`{text}` is not `sha256:` and 64 lowercase hex digits"),
            },
        }
    }
}
