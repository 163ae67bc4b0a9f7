//! What goes wrong with the queue's keys or a login.

use std::path::{Path, PathBuf};

/// What went wrong with the queue's keys or a login.
#[derive(Debug, thiserror::Error)]
pub enum QueueAuthError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: not an account's nkey seed (`opentinker rollout-keys` writes one, account.nk): {message}"
    )]
    NotAnAccountKey { path: PathBuf, message: String },
    #[error("signing with an nkey: {0}")]
    Key(String),
    #[error("encoding a JWT's claims: {0}")]
    Encode(String),
}

impl QueueAuthError {
    /// The kind of the failure, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            QueueAuthError::Io { .. } => "queue_keys_io",
            QueueAuthError::NotAnAccountKey { .. } => "queue_keys_not_an_account",
            QueueAuthError::Key(_) => "queue_keys_sign",
            QueueAuthError::Encode(_) => "queue_keys_encode",
        }
    }

    pub(super) fn encode(error: serde_json::Error) -> Self {
        QueueAuthError::Encode(error.to_string())
    }

    pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| QueueAuthError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
