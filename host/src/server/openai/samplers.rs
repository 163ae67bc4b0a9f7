//! The sampling sessions made for the OpenAI routes, by tenant and model name, so that a model
//! is resolved once (a session evicted since is made again). Only what is known: making a
//! sampler is the routes' (`super::resolve`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::api::{SamplerId, SessionId, TenantId};
use crate::service::ServedBase;

#[derive(Default)]
pub struct Samplers {
    inner: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    /// The session each tenant's samplers live in.
    sessions: HashMap<TenantId, SessionId>,
    samplers: HashMap<(TenantId, String), Resolved>,
    next_seq: u64,
}

/// A model's sampler and the base it samples.
#[derive(Clone)]
pub struct Resolved {
    pub sampler: SamplerId,
    pub base: Arc<ServedBase>,
}

impl Samplers {
    fn known(&self) -> MutexGuard<'_, Known> {
        // A panic elsewhere while holding it leaves plain maps behind: still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session `tenant`'s samplers live in, once made.
    pub fn session(&self, tenant: &TenantId) -> Option<SessionId> {
        self.known().sessions.get(tenant).cloned()
    }

    pub fn set_session(&self, tenant: &TenantId, session: SessionId) {
        self.known().sessions.insert(tenant.clone(), session);
    }

    /// The number of the next sampler made in a tenant's session.
    pub fn next_seq(&self) -> u64 {
        let mut known = self.known();
        known.next_seq += 1;
        known.next_seq
    }

    /// The sampler made for `tenant`'s `model`, if one was.
    pub fn get(&self, tenant: &TenantId, model: &str) -> Option<Resolved> {
        let key = (tenant.clone(), model.to_string());
        self.known().samplers.get(&key).cloned()
    }

    pub fn insert(&self, tenant: &TenantId, model: &str, resolved: Resolved) {
        let key = (tenant.clone(), model.to_string());
        self.known().samplers.insert(key, resolved);
    }

    pub fn forget(&self, tenant: &TenantId, model: &str) {
        self.known()
            .samplers
            .remove(&(tenant.clone(), model.to_string()));
    }

    /// Forget `tenant`'s session and every sampler made in it.
    pub fn forget_tenant(&self, tenant: &TenantId) {
        let mut known = self.known();
        known.sessions.remove(tenant);
        known.samplers.retain(|(owner, _), _| owner != tenant);
    }
}
