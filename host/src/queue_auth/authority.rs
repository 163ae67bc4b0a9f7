//! The keys of the rollout queue's accounts, the users they sign, and how a connection logs in.

use std::path::Path;

use nkeys::KeyPair;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::QueueAuthError;
use super::jwt;

/// What the NATS server includes: the operator it trusts and the accounts it signed.
pub const ACCOUNTS_CONF: &str = "nats-accounts.conf";
/// The seed of the account the queue lives in: what `opentinker serve --rollout-key` reads.
pub const ACCOUNT_KEY: &str = "account.nk";
/// The operator's seed: kept to sign the accounts again (other limits), needed by nothing that
/// runs.
pub const OPERATOR_KEY: &str = "operator.nk";

/// The subjects a user may publish to and subscribe to (NATS wildcards allowed); empty lists
/// allow everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

/// A user of the queue's account: its JWT, and the seed of its key, which answers the NATS
/// server's challenge when it connects (so a JWT alone is worth nothing).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub jwt: String,
    pub seed: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("jwt", &self.jwt)
            .field("seed", &"<secret>")
            .finish()
    }
}

/// How a connection to the queue presents itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLogin {
    /// `None` on an open queue (a NATS server without accounts).
    pub credentials: Option<Credentials>,
    /// Where the connection's replies come (its inbox subjects start so): the one prefix a
    /// worker's permissions let it subscribe to, so no worker reads another's replies.
    pub inbox_prefix: Option<String>,
}

impl QueueLogin {
    /// NATS connection options that log in so.
    pub fn options(&self) -> Result<async_nats::ConnectOptions, QueueAuthError> {
        let mut options = async_nats::ConnectOptions::new();
        if let Some(credentials) = &self.credentials {
            let key = std::sync::Arc::new(
                KeyPair::from_seed(&credentials.seed)
                    .map_err(|e| QueueAuthError::Key(e.to_string()))?,
            );
            options = options.jwt(credentials.jwt.clone(), move |nonce| {
                let key = std::sync::Arc::clone(&key);
                async move { key.sign(&nonce).map_err(async_nats::AuthError::new) }
            });
        }
        if let Some(prefix) = &self.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        Ok(options)
    }
}

/// What a server tells a worker that asks with a tenant's key (`POST /api/v1/rollout_access`):
/// the pool it plays (its tenant's), how it logs in, and how the pool's consumer redelivers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerAccess {
    pub pool: String,
    pub login: QueueLogin,
    /// Seconds a task may go unacknowledged before it goes to another worker.
    pub ack_wait_secs: u64,
    /// Deliveries of a task before it is answered with its failure.
    pub max_deliver: i64,
}

/// The operator, the system account and the queue's account, made together.
pub struct QueueKeys;

impl QueueKeys {
    /// Make new keys and write `dir/`[`ACCOUNTS_CONF`] (for the NATS server),
    /// `dir/`[`ACCOUNT_KEY`] (for `opentinker serve`) and `dir/`[`OPERATOR_KEY`], the seeds
    /// readable by their owner only. Refuses a folder that already holds keys: new ones would
    /// lock out every user the old ones signed. Answers the account's public key (what NATS's
    /// monitoring names it by).
    pub fn generate(dir: &Path) -> Result<String, QueueAuthError> {
        for name in [ACCOUNTS_CONF, ACCOUNT_KEY, OPERATOR_KEY] {
            let path = dir.join(name);
            if path.exists() {
                return Err(QueueAuthError::Io {
                    path,
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "already there: new keys would lock out the users the old ones signed",
                    ),
                });
            }
        }
        std::fs::create_dir_all(dir).map_err(QueueAuthError::io(dir))?;
        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let operator_jwt = jwt::sign(
            &operator,
            &operator.public_key(),
            "opentinker",
            json!({"type": "operator", "version": 2, "system_account": system.public_key()}),
        )?;
        let unlimited = json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
        });
        let system_jwt = jwt::sign(
            &operator,
            &system.public_key(),
            "SYS",
            json!({"type": "account", "version": 2, "limits": unlimited}),
        )?;
        let mut limits = unlimited;
        for key in [
            "mem_storage",
            "disk_storage",
            "streams",
            "consumer",
            "max_ack_pending",
        ] {
            limits[key] = json!(-1);
        }
        let account_jwt = jwt::sign(
            &operator,
            &account.public_key(),
            "opentinker",
            json!({"type": "account", "version": 2, "limits": limits}),
        )?;
        let conf = format!(
            "# Written by `opentinker rollout-keys`: the operator this NATS server trusts and the\n\
             # accounts it signed (the rollout queue lives in the second). Include it from the\n\
             # server's configuration; `opentinker serve --rollout-key {ACCOUNT_KEY}` signs the users.\n\
             operator: {operator_jwt}\n\
             system_account: {system}\n\
             resolver: MEMORY\n\
             resolver_preload: {{\n  {system}: {system_jwt}\n  {account}: {account_jwt}\n}}\n",
            system = system.public_key(),
            account = account.public_key(),
        );
        write(&dir.join(ACCOUNTS_CONF), conf.as_bytes(), 0o644)?;
        for (name, key) in [(ACCOUNT_KEY, &account), (OPERATOR_KEY, &operator)] {
            let seed = key.seed().map_err(|e| QueueAuthError::Key(e.to_string()))?;
            write(&dir.join(name), format!("{seed}\n").as_bytes(), 0o600)?;
        }
        Ok(account.public_key())
    }
}

/// Write `bytes` to `path` durably, readable as `mode` says.
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), QueueAuthError> {
    crate::store::write_atomic_with(path, |file| {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        #[cfg(not(unix))]
        let _ = mode;
        std::io::Write::write_all(file, bytes)
    })
    .map_err(QueueAuthError::io(path))
}

/// The queue account's key: it signs the queue's users.
pub struct QueueAuthority {
    account: KeyPair,
}

impl QueueAuthority {
    /// The account key in `path` (a seed, as [`QueueKeys::generate`] writes it).
    pub fn load(path: &Path) -> Result<Self, QueueAuthError> {
        let text = std::fs::read_to_string(path).map_err(QueueAuthError::io(path))?;
        let not_account = |message: String| QueueAuthError::NotAnAccountKey {
            path: path.to_path_buf(),
            message,
        };
        let account = KeyPair::from_seed(text.trim()).map_err(|e| not_account(e.to_string()))?;
        if account.key_pair_type() != nkeys::KeyPairType::Account {
            return Err(not_account(format!(
                "the seed of a {:?} key",
                account.key_pair_type()
            )));
        }
        Ok(QueueAuthority { account })
    }

    /// A user with every permission in the account: the server's own connection.
    pub fn unrestricted(&self, name: &str) -> Result<Credentials, QueueAuthError> {
        self.user(name, &Permissions::default())
    }

    /// A new user named `name` that may do what `permissions` allow, and nothing else.
    pub fn user(
        &self,
        name: &str,
        permissions: &Permissions,
    ) -> Result<Credentials, QueueAuthError> {
        let user = KeyPair::new_user();
        let allow = |subjects: &[String]| match subjects.is_empty() {
            true => json!({}),
            false => json!({"allow": subjects}),
        };
        let jwt = jwt::sign(
            &self.account,
            &user.public_key(),
            name,
            json!({
                "type": "user", "version": 2,
                "pub": allow(&permissions.publish),
                "sub": allow(&permissions.subscribe),
                "subs": -1, "data": -1, "payload": -1,
            }),
        )?;
        let seed = user
            .seed()
            .map_err(|e| QueueAuthError::Key(e.to_string()))?;
        Ok(Credentials { jwt, seed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_and_a_second_generation_in_the_same_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        QueueKeys::generate(dir.path()).unwrap();
        let conf = std::fs::read_to_string(dir.path().join(ACCOUNTS_CONF)).unwrap();
        assert!(conf.contains("resolver: MEMORY"), "{conf}");
        let authority = QueueAuthority::load(&dir.path().join(ACCOUNT_KEY)).unwrap();
        assert!(conf.contains(&authority.account.public_key()), "{conf}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(ACCOUNT_KEY))
                .unwrap()
                .permissions();
            assert_eq!(mode.mode() & 0o777, 0o600);
        }
        let again = QueueKeys::generate(dir.path()).unwrap_err();
        assert!(again.to_string().contains("already there"), "{again}");
        // The operator's seed is no account key.
        let wrong = QueueAuthority::load(&dir.path().join(OPERATOR_KEY))
            .err()
            .unwrap();
        assert_eq!(wrong.kind(), "queue_keys_not_an_account", "{wrong}");
    }
}
