//! Anticipation: after answering a tenant's small call, the training loop may wait a few
//! milliseconds for that tenant's next call before it starts a pass of other tenants' work.
//!
//! A pass cannot be stopped once started, and a client that sends one call after another (a
//! training loop: answer, think, next call) is never waiting at the moment its previous answer
//! leaves, so without this the loop always starts a heavy tenant's pass in that gap and the light
//! call arrives just after, to wait for all of it: "deceptive idleness", which anticipatory disk
//! scheduling (Iyer and Druschel, SOSP 2001) answers by idling briefly for the process just
//! served. As there, a tenant is waited for only while its measured think time (from its answer
//! to its next call being sent) is shorter than the window, and once per answer: a tenant that
//! does not come back costs the others one window, and its longer think time then stops the
//! waiting. Fairness is the queue's: a light tenant served back to back soon has the later
//! virtual finish times, and the heavy tenants' parts go first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::fair::TenantKey;

/// Weight of the newest gap in a tenant's mean think time.
const NEWEST: f64 = 0.3;

/// Think times, and the answers the loop may wait on.
pub struct Anticipation {
    window: Duration,
    /// Mean seconds from an answer to the tenant's next call, per tenant.
    think: HashMap<TenantKey, f64>,
    /// Tenants answered with nothing else queued, and when: each may be waited for once.
    answered: HashMap<TenantKey, Instant>,
}

impl Anticipation {
    /// Wait at most `window` for a tenant's next call.
    pub fn new(window: Duration) -> Self {
        Anticipation {
            window,
            think: HashMap::new(),
            answered: HashMap::new(),
        }
    }

    /// `tenant`'s small call was answered at `at`, and it has nothing else queued.
    pub fn answered(&mut self, tenant: &str, at: Instant) {
        self.answered.insert(tenant.to_string(), at);
    }

    /// A call of `tenant` was sent at `at`: its gap since its last answer is a think time.
    pub fn arrived(&mut self, tenant: &str, at: Instant) {
        if let Some(answered) = self.answered.remove(tenant) {
            self.record(tenant, at.saturating_duration_since(answered));
        }
    }

    /// The tenant to wait for at `now`, and until when: one answered within the window whose
    /// mean think time fits in it (the most recently answered first). `None`: start a pass.
    pub fn wait_for(&self, now: Instant) -> Option<(TenantKey, Instant)> {
        let window = self.window.as_secs_f64();
        self.answered
            .iter()
            .filter(|(tenant, _)| self.think.get(*tenant).is_some_and(|&t| t < window))
            .map(|(tenant, &at)| (tenant, at + self.window))
            .filter(|(_, deadline)| *deadline > now)
            .max_by_key(|(_, deadline)| *deadline)
            .map(|(tenant, deadline)| (tenant.clone(), deadline))
    }

    /// `tenant` did not come back by its deadline: it is not waited for again until its next
    /// answer, and its think time counts as twice the window (it is at least the window;
    /// counting only that would keep the mean below it forever).
    pub fn gave_up(&mut self, tenant: &str) {
        if self.answered.remove(tenant).is_some() {
            self.record(tenant, 2 * self.window);
        }
    }

    /// Add a think time to `tenant`'s mean, counted up to twice the window: a longer gap (a
    /// client that paused between loops) says no more than that, and would keep the mean out
    /// of the window long after the tenant is back to short ones.
    fn record(&mut self, tenant: &str, gap: Duration) {
        let gap = gap.min(2 * self.window).as_secs_f64();
        self.think
            .entry(tenant.to_string())
            .and_modify(|mean| *mean = (1.0 - NEWEST) * *mean + NEWEST * gap)
            .or_insert(gap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_tenant_is_waited_for_only_once_its_think_time_is_known_to_fit_the_window() {
        let start = Instant::now();
        let mut anticipation = Anticipation::new(ms(10));
        anticipation.answered("light", start);
        // No think time measured yet: nothing to wait for.
        assert_eq!(anticipation.wait_for(start), None);
        anticipation.arrived("light", start + ms(4));
        anticipation.answered("light", start + ms(20));
        assert_eq!(
            anticipation.wait_for(start + ms(21)),
            Some(("light".to_string(), start + ms(30)))
        );
        // Past the deadline, the loop goes on.
        assert_eq!(anticipation.wait_for(start + ms(30)), None);
    }

    #[test]
    fn a_slow_thinker_is_not_waited_for_and_one_that_stops_coming_back_soon_is_not_either() {
        let start = Instant::now();
        let mut anticipation = Anticipation::new(ms(10));
        anticipation.answered("sampler", start);
        anticipation.arrived("sampler", start + ms(50));
        anticipation.answered("sampler", start + ms(60));
        assert_eq!(anticipation.wait_for(start + ms(61)), None);

        anticipation.answered("light", start);
        anticipation.arrived("light", start + ms(9));
        let answered = start + ms(100);
        anticipation.answered("light", answered);
        assert!(anticipation.wait_for(answered).is_some());
        anticipation.gave_up("light");
        // Waited once per answer, and a give-up counts as a long think.
        assert_eq!(anticipation.wait_for(answered), None);
        anticipation.answered("light", start + ms(200));
        assert_eq!(anticipation.wait_for(start + ms(200)), None);
    }
}
