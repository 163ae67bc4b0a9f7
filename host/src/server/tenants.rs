//! Tenants and their API keys, in the server's SQLite database (WAL mode). A key is shown once,
//! when made; only a salted HMAC-SHA256 of it is stored. A key reads `tml-{id}_{secret}`: the
//! id finds the row, the secret proves the holder. A tenant has one key at a time: rotating it
//! makes a new one and the old stops working; revoking leaves none (until the next rotation).
//! The operator's command writes the database; a running server rechecks the keys it has seen
//! every [`KEY_RECHECK`](super::KEY_RECHECK), so either takes effect there within that time.

use std::path::Path;
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use rusqlite::{Connection, OptionalExtension, params};
use sha2::Sha256;

use crate::api::{ApiError, TenantId};
use crate::store::open_database;

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("a tenant named {0:?} exists already")]
    NameTaken(String),
    #[error("no tenant is named {0:?}")]
    Unknown(String),
    #[error("{0} holds no server database: is it the `--data` folder of `opentinker serve`?")]
    NoDatabase(String),
    #[error(transparent)]
    InvalidName(#[from] ApiError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the server database: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("no random numbers from the system: {0}")]
    Random(#[from] getrandom::Error),
}

/// The tenants table of the server database.
pub struct Tenants {
    db: Mutex<Connection>,
}

fn key_hash(salt: &[u8], key: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(salt)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(key.as_bytes());
    mac
}

fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer)?;
    Ok(hex::encode(buffer))
}

/// A fresh key with what the table keeps of it.
struct NewKey {
    key: String,
    key_id: String,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

impl NewKey {
    fn make() -> Result<Self, getrandom::Error> {
        let key_id = random_hex(8)?;
        let key = format!("tml-{key_id}_{}", random_hex(24)?);
        let mut salt = vec![0u8; 16];
        getrandom::fill(&mut salt)?;
        let hash = key_hash(&salt, &key).finalize().into_bytes().to_vec();
        Ok(NewKey {
            key,
            key_id,
            salt,
            hash,
        })
    }
}

impl Tenants {
    /// Open (or make) the database in `data`.
    pub fn open(data: &Path) -> Result<Self, TenantError> {
        std::fs::create_dir_all(data).map_err(|source| TenantError::Io {
            path: data.display().to_string(),
            source,
        })?;
        let db = open_database(data)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS tenants (
                 name TEXT PRIMARY KEY,
                 key_id TEXT NOT NULL UNIQUE,
                 salt BLOB NOT NULL,
                 key_hash BLOB NOT NULL,
                 created_at INTEGER NOT NULL,
                 weight INTEGER NOT NULL DEFAULT 1
             );",
        )?;
        Ok(Tenants { db: Mutex::new(db) })
    }

    /// Open the tenants of a server that has run in `data`, refusing a folder without its
    /// database (a mistyped `--data` would otherwise get an empty one).
    pub fn open_existing(data: &Path) -> Result<Self, TenantError> {
        if !data.join(crate::store::DATABASE_FILE).is_file() {
            return Err(TenantError::NoDatabase(data.display().to_string()));
        }
        Self::open(data)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make tenant `name` and its key; the key is returned once and never stored. `weight` is
    /// the tenant's share of the loops relative to others (1: an equal share).
    pub fn create(&self, name: &str, weight: u64) -> Result<(TenantId, String), TenantError> {
        let tenant = TenantId::new(name)?;
        let new = NewKey::make()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let inserted = self.lock().execute(
            "INSERT INTO tenants (name, key_id, salt, key_hash, created_at, weight)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(name) DO NOTHING",
            params![
                tenant.as_str(),
                new.key_id,
                new.salt,
                new.hash,
                now,
                weight.max(1) as i64
            ],
        )?;
        if inserted == 0 {
            return Err(TenantError::NameTaken(name.to_string()));
        }
        Ok((tenant, new.key))
    }

    /// Give tenant `name` a new key, returned once; its old key (or none, after a revocation)
    /// stops working.
    pub fn rotate_key(&self, name: &str) -> Result<String, TenantError> {
        let new = NewKey::make()?;
        let updated = self.lock().execute(
            "UPDATE tenants SET key_id = ?2, salt = ?3, key_hash = ?4 WHERE name = ?1",
            params![name, new.key_id, new.salt, new.hash],
        )?;
        match updated {
            0 => Err(TenantError::Unknown(name.to_string())),
            _ => Ok(new.key),
        }
    }

    /// Take tenant `name`'s key away: no key authenticates it until [`Tenants::rotate_key`]
    /// makes one. Its models, checkpoints and jobs stay.
    pub fn revoke(&self, name: &str) -> Result<(), TenantError> {
        // A key id no key can name (keys' ids are hex) and a hash no key can match (empty).
        let revoked_id = format!("revoked-{}", random_hex(8)?);
        let updated = self.lock().execute(
            "UPDATE tenants SET key_id = ?2, key_hash = X'' WHERE name = ?1",
            params![name, revoked_id],
        )?;
        match updated {
            0 => Err(TenantError::Unknown(name.to_string())),
            _ => Ok(()),
        }
    }

    /// Whether a tenant is named `name`.
    pub fn exists(&self, name: &str) -> Result<bool, TenantError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT 1 FROM tenants WHERE name = ?1",
                params![name],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The tenant whose key `key` is, with its weight, or `None` for a key that is not valid.
    pub fn authenticate(&self, key: &str) -> Result<Option<(TenantId, u64)>, TenantError> {
        let Some((key_id, _)) = key.strip_prefix("tml-").and_then(|k| k.split_once('_')) else {
            return Ok(None);
        };
        let row: Option<(String, Vec<u8>, Vec<u8>, i64)> = self
            .lock()
            .query_row(
                "SELECT name, salt, key_hash, weight FROM tenants WHERE key_id = ?1",
                params![key_id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()?;
        let Some((name, salt, stored, weight)) = row else {
            return Ok(None);
        };
        // Constant-time comparison of the MACs.
        if key_hash(&salt, key).verify_slice(&stored).is_err() {
            return Ok(None);
        }
        Ok(Some((TenantId::new(&name)?, weight.max(1) as u64)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DATABASE_FILE;

    #[test]
    fn a_key_authenticates_its_tenant_only_and_is_not_stored() {
        let data = tempfile::tempdir().unwrap();
        let tenants = Tenants::open(data.path()).unwrap();
        let (alice, key) = tenants.create("alice", 1).unwrap();
        let (bob, other) = tenants.create("bob", 3).unwrap();
        assert_eq!(tenants.authenticate(&key).unwrap(), Some((alice, 1)));
        assert_eq!(tenants.authenticate(&other).unwrap(), Some((bob, 3)));
        let mut forged = key.clone();
        forged.pop();
        forged.push('x');
        assert_eq!(tenants.authenticate(&forged).unwrap(), None);
        assert_eq!(tenants.authenticate("tml-nothing").unwrap(), None);
        assert!(matches!(
            tenants.create("alice", 1),
            Err(TenantError::NameTaken(_))
        ));
        drop(tenants);
        let file = std::fs::read(data.path().join(DATABASE_FILE)).unwrap();
        let secret = key.split_once('_').unwrap().1.as_bytes();
        assert!(!file.windows(secret.len()).any(|w| w == secret));
    }

    #[test]
    fn a_rotated_key_replaces_the_old_one_and_a_revoked_tenant_has_none() {
        let data = tempfile::tempdir().unwrap();
        let tenants = Tenants::open(data.path()).unwrap();
        let (alice, old) = tenants.create("alice", 2).unwrap();
        let (bob, bobs) = tenants.create("bob", 1).unwrap();
        let new = tenants.rotate_key("alice").unwrap();
        assert_ne!(new, old);
        assert_eq!(tenants.authenticate(&old).unwrap(), None);
        assert_eq!(
            tenants.authenticate(&new).unwrap(),
            Some((alice.clone(), 2))
        );
        tenants.revoke("alice").unwrap();
        assert_eq!(tenants.authenticate(&new).unwrap(), None);
        // A key of the revoked id's shape cannot match either.
        assert_eq!(tenants.authenticate("tml-revoked_").unwrap(), None);
        let again = tenants.rotate_key("alice").unwrap();
        assert_eq!(tenants.authenticate(&again).unwrap(), Some((alice, 2)));
        assert_eq!(tenants.authenticate(&bobs).unwrap(), Some((bob, 1)));
        assert!(matches!(
            tenants.rotate_key("carol"),
            Err(TenantError::Unknown(_))
        ));
        assert!(matches!(
            tenants.revoke("carol"),
            Err(TenantError::Unknown(_))
        ));
        let elsewhere = tempfile::tempdir().unwrap();
        let missing = elsewhere.path().join("not-a-server");
        assert!(matches!(
            Tenants::open_existing(&missing),
            Err(TenantError::NoDatabase(_))
        ));
        assert!(!missing.exists(), "a folder was made for a mistyped --data");
    }
}
