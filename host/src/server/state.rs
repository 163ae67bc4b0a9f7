//! What every request handler reaches: the service, the tenants and their keys, the futures
//! and their journal, and each concern's own state. `super::AppState::start` assembles it at
//! start-up; this file only holds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::access_log;
use super::futures::Futures;
use super::journal::Journal;
use super::openai::Samplers;
use super::registry::HostedRegistry;
use super::tenants::Tenants;
use super::url_signer::UrlSigner;
use crate::api::{ApiError, ApiErrorKind, TenantId};
use crate::jobs::{JobService, PluginStore, RolloutAccess};
use crate::service::Service;

/// How long a key checked against the database is taken as valid before it is checked again:
/// the most a rotated or revoked key (`opentinker tenant rotate-key`, `revoke`, which write
/// the database from another process) keeps working on a running server.
pub const KEY_RECHECK: Duration = Duration::from_secs(1);

/// Everything a request handler reaches.
pub struct AppState {
    pub service: Arc<Service>,
    pub tenants: Tenants,
    pub journal: Arc<Journal>,
    pub futures: Futures,
    pub poll_wait: Duration,
    /// Keys seen valid, by SHA-256, with when they were last checked, so that a request does
    /// not wait on the database (but a rotated or revoked key stops working within
    /// [`KEY_RECHECK`]).
    pub(super) known_keys: KnownKeys,
    /// The samplers of the OpenAI-compatible routes.
    pub openai: Samplers,
    /// The tenants' uploaded plugins.
    pub plugins: Arc<PluginStore>,
    /// The tenants' published plugins (the OCI distribution API under `/v2/`).
    pub registry: Arc<HostedRegistry>,
    /// The key that signs download URLs of exports.
    pub downloads: UrlSigner,
    /// The tenants' jobs.
    pub jobs: Arc<JobService>,
    /// What signs the rollout workers' users, on a queue with accounts.
    pub(super) rollout_access: Option<RolloutAccess>,
}

/// Keys seen valid, by SHA-256, with their tenant and when they were checked.
#[derive(Default)]
pub(super) struct KnownKeys(Mutex<HashMap<[u8; 32], (TenantId, Instant)>>);

impl AppState {
    /// The tenant of `key`; the database is read on a blocking thread, once per key and
    /// [`KEY_RECHECK`] (which also brings a changed weight in).
    pub async fn authenticate(self: &Arc<Self>, key: &str) -> Result<TenantId, ApiError> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        if let Some((tenant, checked)) = self.keys().get(&digest)
            && checked.elapsed() < KEY_RECHECK
        {
            access_log::record_tenant(tenant.as_str());
            return Ok(tenant.clone());
        }
        let (state, key) = (Arc::clone(self), key.to_string());
        let found = tokio::task::spawn_blocking(move || state.tenants.authenticate(&key))
            .await
            .map_err(|e| ApiError::internal(format!("checking the key: {e}")))?
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let Some((tenant, weight)) = found else {
            self.keys().remove(&digest);
            return Err(ApiError::new(ApiErrorKind::Unauthorized, "invalid API key"));
        };
        self.service.set_weight(&tenant, weight);
        self.keys().insert(digest, (tenant.clone(), Instant::now()));
        access_log::record_tenant(tenant.as_str());
        Ok(tenant)
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<[u8; 32], (TenantId, Instant)>> {
        self.known_keys.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
