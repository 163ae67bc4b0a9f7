//! Fair queueing between tenants by virtual time (weighted fair queueing, the virtual-time form
//! of deficit round robin): each tenant's work waits in its own queue with a tag, the virtual
//! time at which its next part starts; a pass always takes the part that would finish first in
//! virtual time (its tag plus its cost over its weight, so a small part goes before a heavy
//! tenant's whole quantum of a similar tag), and a part costing `c` moves its tenant's tag on by
//! `c / weight`. So every busy tenant gets
//! the same share of the cost (tokens), whatever the size and number of its requests; a tenant
//! that was idle starts at the smallest waiting tag, its work before larger work of the same tag
//! (it neither banks credit nor waits behind the busy tenants' backlogs, so its small request
//! goes in the next pass); and work is taken in
//! parts of at most a quantum, so one huge request cannot hold the device while others wait. A
//! unit that cannot be split and does not fit a pass runs first in a pass of its own.
//!
//! A pass that starts with a small request taken whole (at most a quantum: a light tenant's
//! call) is a short pass: it takes only more requests that finish in it, and leaves the large
//! ones' parts to the next pass. So a light tenant waits for the pass in service and its own
//! short one, not for a full pass of the heavy tenants' work; their shares are unchanged (tags
//! move by cost alone).

use std::collections::{HashMap, VecDeque};

use super::usage::Usage;

/// A tenant, as the loops know it (the service's tenant id, or "" for work of no tenant).
pub type TenantKey = String;

/// Work that can be taken in parts: `cost` is what remains, `split` takes a part.
pub trait Divisible: Sized {
    /// What remains of the work (e.g. its tokens).
    fn cost(&self) -> u64;
    /// The cost of the smallest part `split` can take (its first unit).
    fn unit_cost(&self) -> u64;
    /// Take a part costing at most `budget` off the front, or `None` when the first unit alone
    /// costs more (a unit is never split).
    fn split(&mut self, budget: u64) -> Option<Self::Part>;
    type Part;
}

/// One tenant's queue and virtual start tag.
struct Tenant<T> {
    queue: VecDeque<T>,
    tag: f64,
    weight: u64,
    /// Order of first arrival: breaks ties between equal tags.
    order: u64,
}

/// The queues of every tenant, taken from in order of virtual start tags.
pub struct FairQueue<T: Divisible> {
    tenants: HashMap<TenantKey, Tenant<T>>,
    /// The tag of the part taken last.
    virtual_time: f64,
    /// The most a part takes of one piece of work before others get their turn.
    quantum: u64,
    /// Where the cost served to each tenant and its waiting work are counted.
    usage: Usage,
}

impl<T: Divisible> FairQueue<T> {
    /// A queue whose parts cost at most `quantum` (a unit that costs more is taken whole).
    pub fn new(quantum: u64) -> Self {
        FairQueue {
            tenants: HashMap::new(),
            virtual_time: 0.0,
            quantum: quantum.max(1),
            usage: Usage::default(),
        }
    }

    /// Count what is served and waiting in `usage`.
    pub fn counting(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Set `tenant`'s weight (default 1): a weight of 2 earns twice the share.
    pub fn set_weight(&mut self, tenant: &str, weight: u64) {
        self.tenant(tenant).weight = weight.max(1);
    }

    fn tenant(&mut self, key: &str) -> &mut Tenant<T> {
        let order = self.tenants.len() as u64;
        self.tenants.entry(key.to_string()).or_insert(Tenant {
            queue: VecDeque::new(),
            tag: 0.0,
            weight: 1,
            order,
        })
    }

    pub fn push(&mut self, tenant: &str, work: T) {
        // Now, in virtual time: the smallest tag of the work waiting (what runs next).
        let now = self
            .tenants
            .values()
            .filter(|t| !t.queue.is_empty())
            .map(|t| t.tag)
            .min_by(f64::total_cmp)
            .unwrap_or(self.virtual_time);
        let entry = self.tenant(tenant);
        if entry.queue.is_empty() {
            // An idle tenant starts now: no credit saved from idleness (its tag is never
            // behind what runs next), no debt either.
            entry.tag = entry.tag.max(now);
        }
        entry.queue.push_back(work);
        let waiting = entry.queue.len();
        self.usage.waiting(tenant, waiting);
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.values().all(|t| t.queue.is_empty())
    }

    /// Whether `tenant` has work waiting.
    pub fn has_work(&self, tenant: &str) -> bool {
        self.tenants
            .get(tenant)
            .is_some_and(|t| !t.queue.is_empty())
    }

    /// How many tenants have work waiting.
    pub fn busy_tenants(&self) -> usize {
        self.tenants
            .values()
            .filter(|t| !t.queue.is_empty())
            .count()
    }

    /// Parts of work costing about `budget` in all, smallest tag first, each with its tenant;
    /// work fully taken comes back whole (`Taken::Whole`) so its owner can be answered. Always
    /// takes something when there is work (one unit larger than `budget` alone if need be).
    pub fn take(&mut self, budget: u64) -> Vec<(TenantKey, Taken<T>)> {
        let mut taken = Vec::new();
        let mut spent = 0u64;
        let mut short = false;
        while spent < budget {
            let quantum = self.quantum;
            // The virtual time at which a tenant's next part would finish: its tag plus the
            // part's cost (at most a quantum) over its weight.
            let finish = |t: &Tenant<T>| {
                let part = t
                    .queue
                    .front()
                    .map_or(0, |w| w.cost().min(quantum.max(w.unit_cost())));
                t.tag + part as f64 / t.weight as f64
            };
            let next = self
                .tenants
                .iter()
                .filter(|(_, t)| !t.queue.is_empty())
                .min_by(|(_, a), (_, b)| {
                    finish(a)
                        .total_cmp(&finish(b))
                        .then(a.tag.total_cmp(&b.tag))
                        .then(a.order.cmp(&b.order))
                })
                .map(|(key, _)| key.clone());
            let Some(key) = next else {
                break;
            };
            let tenant = self.tenants.get_mut(&key).expect("a tenant with work");
            let head = tenant.queue.front_mut().expect("a head");
            let mut room = budget - spent;
            if taken.is_empty() {
                room = room.max(head.unit_cost());
            }
            let limit = room.min(quantum.max(head.unit_cost()));
            let cost = head.cost();
            if taken.is_empty() {
                short = cost <= limit && cost <= quantum;
            } else if short && cost > limit.min(quantum) {
                break;
            }
            let (part, cost) = if cost <= limit {
                let work = tenant.queue.pop_front().expect("a head");
                (Taken::Whole(work), cost)
            } else {
                match head.split(limit) {
                    Some(part) => (Taken::Part(part), cost - head.cost()),
                    // The smallest tag does not fit what is left of the pass: the pass is full.
                    None => break,
                }
            };
            self.virtual_time = self.virtual_time.max(tenant.tag);
            tenant.tag += cost as f64 / tenant.weight as f64;
            spent = spent.saturating_add(cost);
            self.usage.served(&key, cost);
            self.usage.waiting(&key, tenant.queue.len());
            taken.push((key, part));
        }
        taken
    }
}

/// What [`FairQueue::take`] gives back of one piece of work.
pub enum Taken<T: Divisible> {
    /// The rest of the work: it is done once this part is.
    Whole(T),
    /// A part; the rest stays queued.
    Part(T::Part),
}

#[cfg(test)]
mod tests_support {
    use super::Divisible;

    /// Work of `units` units of `size` each.
    #[derive(Debug)]
    pub struct Units {
        pub id: u32,
        pub units: u64,
        pub size: u64,
    }

    impl Divisible for Units {
        type Part = (u32, u64);

        fn cost(&self) -> u64 {
            self.units * self.size
        }

        fn unit_cost(&self) -> u64 {
            self.size
        }

        fn split(&mut self, budget: u64) -> Option<(u32, u64)> {
            let n = (budget / self.size).min(self.units);
            if n == 0 {
                return None;
            }
            self.units -= n;
            Some((self.id, n * self.size))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::Units;
    use super::*;

    fn cost(taken: &Taken<Units>) -> u64 {
        match taken {
            Taken::Whole(w) => w.cost(),
            Taken::Part((_, c)) => *c,
        }
    }

    #[test]
    fn busy_tenants_share_the_cost_equally_whatever_their_request_sizes() {
        let mut queue = FairQueue::new(256);
        // A tenant with big requests and one with small ones, both busy throughout.
        for i in 0..200 {
            queue.push(
                "heavy",
                Units {
                    id: i,
                    units: 64,
                    size: 32,
                },
            );
        }
        for i in 0..2000 {
            queue.push(
                "light",
                Units {
                    id: i,
                    units: 2,
                    size: 32,
                },
            );
        }
        let mut served: HashMap<String, u64> = HashMap::new();
        for _ in 0..100 {
            for (tenant, taken) in queue.take(1024) {
                *served.entry(tenant).or_default() += cost(&taken);
            }
        }
        let (heavy, light) = (served["heavy"] as f64, served["light"] as f64);
        assert!((0.8..1.25).contains(&(heavy / light)), "{served:?}");
    }

    #[test]
    fn weights_scale_the_share_and_huge_work_is_taken_in_parts() {
        let mut queue = FairQueue::new(100);
        queue.set_weight("gold", 2);
        queue.push(
            "gold",
            Units {
                id: 1,
                units: 10_000,
                size: 1,
            },
        );
        queue.push(
            "basic",
            Units {
                id: 2,
                units: 10_000,
                size: 1,
            },
        );
        let mut served: HashMap<String, u64> = HashMap::new();
        for _ in 0..30 {
            let taken = queue.take(300);
            assert!(taken.iter().map(|(_, t)| cost(t)).sum::<u64>() <= 300);
            for (tenant, taken) in taken {
                assert!(matches!(taken, Taken::Part(_)), "10,000 units in one go");
                *served.entry(tenant).or_default() += cost(&taken);
            }
        }
        let ratio = served["gold"] as f64 / served["basic"] as f64;
        assert!((1.8..2.2).contains(&ratio), "{served:?}");
    }

    #[test]
    fn work_larger_than_the_budget_still_runs_and_everything_ends() {
        let mut queue = FairQueue::new(10);
        queue.push(
            "a",
            Units {
                id: 1,
                units: 1,
                size: 500,
            },
        );
        queue.push(
            "b",
            Units {
                id: 2,
                units: 3,
                size: 1,
            },
        );
        let mut done = Vec::new();
        for _ in 0..200 {
            for (_, taken) in queue.take(50) {
                if let Taken::Whole(w) = taken {
                    done.push(w.id);
                }
            }
            if queue.is_empty() {
                break;
            }
        }
        done.sort();
        assert_eq!(done, vec![1, 2]);
    }
}

#[cfg(test)]
mod fresh_tests {
    use super::tests_support::Units;
    use super::*;

    #[test]
    fn a_tenant_that_just_sent_work_goes_before_the_busy_ones() {
        let mut queue = FairQueue::new(256);
        for tenant in ["a", "b", "c"] {
            for i in 0..10 {
                queue.push(
                    tenant,
                    Units {
                        id: i,
                        units: 4,
                        size: 128,
                    },
                );
            }
        }
        // A pass fits one unit: the busy tenants take turns.
        for _ in 0..5 {
            queue.take(100);
        }
        queue.push(
            "light",
            Units {
                id: 99,
                units: 1,
                size: 32,
            },
        );
        let next = queue.take(100);
        assert_eq!(next[0].0, "light");
    }

    #[test]
    fn a_small_request_taken_whole_gets_a_short_pass_without_the_heavy_parts() {
        let mut queue = FairQueue::new(256);
        for tenant in ["heavy-1", "heavy-2"] {
            queue.push(
                tenant,
                Units {
                    id: 0,
                    units: 64,
                    size: 32,
                },
            );
        }
        // The heavy tenants' passes are full ones.
        let full: u64 = queue.take(1024).iter().map(|(_, t)| cost(t)).sum();
        assert_eq!(full, 1024);
        for id in [7, 8] {
            queue.push(
                "light",
                Units {
                    id,
                    units: 1,
                    size: 32,
                },
            );
        }
        queue.push(
            "other-light",
            Units {
                id: 9,
                units: 2,
                size: 32,
            },
        );
        // The light requests finish in a pass of their own; no heavy part rides along. (Parts
        // go in the order of their virtual finish times, so the light tenant's second request,
        // finishing before the heavy tenants' next part of a whole quantum, rides too.)
        let short = queue.take(1024);
        let tenants: Vec<&str> = short.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tenants, ["light", "other-light", "light"]);
        assert!(short.iter().all(|(_, t)| matches!(t, Taken::Whole(_))));
        // Then the heavy work goes on in full passes.
        let next = queue.take(1024);
        assert_eq!(next.iter().map(|(_, t)| cost(t)).sum::<u64>(), 1024);
        assert!(next.iter().all(|(t, _)| t.starts_with("heavy")));
    }

    fn cost(taken: &Taken<Units>) -> u64 {
        match taken {
            Taken::Whole(w) => w.cost(),
            Taken::Part((_, c)) => *c,
        }
    }
}
