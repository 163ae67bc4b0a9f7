//! What each tenant has had of a loop: the cost (tokens) served to it so far and the work it has
//! waiting, kept by the loop's fair queue and read by whoever shows the queue and the shares (the
//! server's dashboard).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

/// One tenant's figures on one loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TenantUsage {
    /// Tokens served so far.
    pub served: u64,
    /// Pieces of work waiting now.
    pub waiting: usize,
}

/// A loop's figures by tenant; clone it freely (the clones share them).
#[derive(Clone, Debug, Default)]
pub struct Usage(Arc<Mutex<BTreeMap<String, TenantUsage>>>);

impl Usage {
    fn figures(&self) -> MutexGuard<'_, BTreeMap<String, TenantUsage>> {
        // Plain counters: whole after a panic.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `cost` more served to `tenant`.
    pub fn served(&self, tenant: &str, cost: u64) {
        self.figures().entry(tenant.to_string()).or_default().served += cost;
    }

    /// `tenant` has `waiting` pieces of work queued now.
    pub fn waiting(&self, tenant: &str, waiting: usize) {
        self.figures()
            .entry(tenant.to_string())
            .or_default()
            .waiting = waiting;
    }

    /// Every tenant's figures now.
    pub fn snapshot(&self) -> BTreeMap<String, TenantUsage> {
        self.figures().clone()
    }
}
