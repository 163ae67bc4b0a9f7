//! Who may publish where in the server's registry, and how many bytes each tenant has
//! published, in the server's SQLite database. A namespace named as a tenant is that tenant's;
//! any other belongs to the first tenant that publishes a version into it.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use crate::api::TenantId;
use crate::store::open_database;

pub struct Owners {
    db: Mutex<Connection>,
}

impl Owners {
    pub fn open(data: &Path) -> rusqlite::Result<Self> {
        let db = open_database(data)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS registry_namespaces (
                 namespace TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 claimed_at INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS registry_blobs (
                 tenant TEXT NOT NULL,
                 digest TEXT NOT NULL,
                 bytes INTEGER NOT NULL,
                 PRIMARY KEY (tenant, digest)
             );",
        )?;
        Ok(Owners { db: Mutex::new(db) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tenant that claimed `namespace`, if one has.
    pub fn owner(&self, namespace: &str) -> rusqlite::Result<Option<String>> {
        self.lock()
            .query_row(
                "SELECT tenant FROM registry_namespaces WHERE namespace = ?1",
                params![namespace],
                |row| row.get(0),
            )
            .optional()
    }

    /// Claim `namespace` for `tenant` unless another tenant has; whether it is `tenant`'s now.
    pub fn claim(&self, namespace: &str, tenant: &TenantId) -> rusqlite::Result<bool> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let db = self.lock();
        db.execute(
            "INSERT INTO registry_namespaces (namespace, tenant, claimed_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(namespace) DO NOTHING",
            params![namespace, tenant.as_str(), now],
        )?;
        let owner: String = db.query_row(
            "SELECT tenant FROM registry_namespaces WHERE namespace = ?1",
            params![namespace],
            |row| row.get(0),
        )?;
        Ok(owner == tenant.as_str())
    }

    /// Count the blob `digest` of `bytes` against `tenant` (once per tenant and blob).
    pub fn record_blob(&self, tenant: &TenantId, digest: &str, bytes: u64) -> rusqlite::Result<()> {
        self.lock().execute(
            "INSERT INTO registry_blobs (tenant, digest, bytes) VALUES (?1, ?2, ?3)
             ON CONFLICT(tenant, digest) DO NOTHING",
            params![tenant.as_str(), digest, bytes as i64],
        )?;
        Ok(())
    }

    /// The bytes of the blobs `tenant` has pushed.
    pub fn bytes_of(&self, tenant: &TenantId) -> rusqlite::Result<u64> {
        let bytes: i64 = self.lock().query_row(
            "SELECT COALESCE(SUM(bytes), 0) FROM registry_blobs WHERE tenant = ?1",
            params![tenant.as_str()],
            |row| row.get(0),
        )?;
        Ok(bytes.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_its_first_claimants_and_blobs_count_once() {
        let data = tempfile::tempdir().unwrap();
        let owners = Owners::open(data.path()).unwrap();
        let alice = TenantId::new("alice").unwrap();
        let bob = TenantId::new("bob").unwrap();
        assert_eq!(owners.owner("games").unwrap(), None);
        assert!(owners.claim("games", &alice).unwrap());
        assert!(owners.claim("games", &alice).unwrap());
        assert!(!owners.claim("games", &bob).unwrap());
        assert_eq!(owners.owner("games").unwrap().as_deref(), Some("alice"));
        owners.record_blob(&alice, "sha256:aa", 10).unwrap();
        owners.record_blob(&alice, "sha256:aa", 10).unwrap();
        owners.record_blob(&alice, "sha256:bb", 5).unwrap();
        owners.record_blob(&bob, "sha256:aa", 10).unwrap();
        assert_eq!(owners.bytes_of(&alice).unwrap(), 15);
        assert_eq!(owners.bytes_of(&bob).unwrap(), 10);
        drop(owners);
        let again = Owners::open(data.path()).unwrap();
        assert!(!again.claim("games", &bob).unwrap(), "claims are durable");
    }
}
