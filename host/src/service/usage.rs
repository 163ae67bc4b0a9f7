//! What each tenant has had of a loop: the cost (tokens) served to it so far and the work it has
//! waiting, kept by the loop's fair queue and read by whoever shows the queue and the shares (the
//! server's dashboard).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

/// One tenant's figures on one loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TenantUsage {
    /// Tokens served so far; it stops at `u64::MAX` (then `saturated` says so).
    pub served: u64,
    /// Whether `served` reached its largest value and no longer counts.
    pub saturated: bool,
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
        let mut figures = self.figures();
        let figures = figures.entry(tenant.to_string()).or_default();
        match figures.served.checked_add(cost) {
            Some(served) => figures.served = served,
            None => {
                figures.served = u64::MAX;
                figures.saturated = true;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_that_would_overflow_saturates_and_says_so() {
        let usage = Usage::default();
        usage.served("a", u64::MAX - 1);
        assert!(!usage.snapshot()["a"].saturated);
        usage.served("a", 5);
        let figures = usage.snapshot()["a"];
        assert_eq!(figures.served, u64::MAX);
        assert!(figures.saturated);
    }
}
