//! Deficit round robin over tenants: each tenant's work waits in its own queue, and each round
//! every tenant with work earns a quantum of credit (times its weight) and spends it on its
//! queue's head, so that every busy tenant gets the same share of the cost (tokens), whatever
//! the size and number of its requests. Work may be split: the head is taken in parts of at most
//! the credit, so one huge request cannot hold the device for long while others wait.

use std::collections::{HashMap, VecDeque};

/// A tenant, as the loops know it (the service's tenant id, or "" for work of no tenant).
pub type TenantKey = String;

/// Work that can be taken in parts: `cost` is what remains, `split` takes a part.
pub trait Divisible: Sized {
    /// What remains of the work (e.g. its tokens).
    fn cost(&self) -> u64;
    /// Take a part costing at most `budget` off the front, or `None` when the first unit alone
    /// costs more (a unit is never split).
    fn split(&mut self, budget: u64) -> Option<Self::Part>;
    type Part;
}

/// One tenant's queue and credit.
struct Tenant<T> {
    queue: VecDeque<T>,
    deficit: u64,
    weight: u64,
}

/// The queues of every tenant, taken from in deficit-round-robin order.
pub struct FairQueue<T: Divisible> {
    tenants: HashMap<TenantKey, Tenant<T>>,
    /// Tenants with work, in round-robin order.
    active: VecDeque<TenantKey>,
    quantum: u64,
}

impl<T: Divisible> FairQueue<T> {
    /// A queue whose tenants earn `quantum` of cost per round (times their weight).
    pub fn new(quantum: u64) -> Self {
        FairQueue {
            tenants: HashMap::new(),
            active: VecDeque::new(),
            quantum: quantum.max(1),
        }
    }

    /// Set `tenant`'s weight (default 1): a weight of 2 earns twice the share.
    pub fn set_weight(&mut self, tenant: &str, weight: u64) {
        self.tenant(tenant).weight = weight.max(1);
    }

    fn tenant(&mut self, key: &str) -> &mut Tenant<T> {
        self.tenants.entry(key.to_string()).or_insert(Tenant {
            queue: VecDeque::new(),
            deficit: 0,
            weight: 1,
        })
    }

    pub fn push(&mut self, tenant: &str, work: T) {
        let entry = self.tenant(tenant);
        entry.queue.push_back(work);
        if entry.queue.len() == 1 && !self.active.iter().any(|t| t == tenant) {
            self.active.push_back(tenant.to_string());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Every queued piece of work, in no particular order (to fail them all).
    pub fn drain(&mut self) -> Vec<T> {
        self.active.clear();
        self.tenants
            .values_mut()
            .flat_map(|t| {
                t.deficit = 0;
                t.queue.drain(..)
            })
            .collect()
    }

    /// Parts of work costing about `budget` in all, in deficit-round-robin order, each with its
    /// tenant; work fully taken comes back whole (`Taken::Whole`) so its owner can be answered.
    /// Always takes something when there is work (a part larger than `budget` alone if need be).
    pub fn take(&mut self, budget: u64) -> Vec<(TenantKey, Taken<T>)> {
        let mut taken = Vec::new();
        let mut spent = 0u64;
        let mut idle_rounds = 0;
        while spent < budget && !self.active.is_empty() && idle_rounds < 2 {
            let mut progress = false;
            for _ in 0..self.active.len() {
                let Some(key) = self.active.pop_front() else {
                    break;
                };
                let quantum = self.quantum;
                let tenant = self.tenant(&key);
                tenant.deficit = tenant.deficit.saturating_add(quantum * tenant.weight);
                while let Some(head) = tenant.queue.front_mut() {
                    let room = budget.saturating_sub(spent);
                    let limit = match taken.is_empty() {
                        // Something is always taken, however small the budget.
                        true => tenant.deficit,
                        false => tenant.deficit.min(room),
                    };
                    let cost = head.cost();
                    let part = match cost <= limit {
                        true => None,
                        false => head.split(limit),
                    };
                    if let Some(part) = part {
                        let cost = cost - head.cost();
                        tenant.deficit -= cost.min(tenant.deficit);
                        spent += cost;
                        taken.push((key.clone(), Taken::Part(part)));
                        progress = true;
                        break;
                    }
                    // Whole: it fits, or it is one unit the tenant has earned the credit for
                    // (such a unit may go past the budget: it is never split).
                    if cost > tenant.deficit {
                        break;
                    }
                    let work = tenant.queue.pop_front().expect("a head");
                    tenant.deficit -= cost;
                    spent += cost;
                    taken.push((key.clone(), Taken::Whole(work)));
                    progress = true;
                    if spent >= budget {
                        break;
                    }
                }
                if tenant.queue.is_empty() {
                    // An idle tenant keeps no credit.
                    tenant.deficit = 0;
                } else {
                    self.active.push_back(key);
                }
                if spent >= budget {
                    break;
                }
            }
            idle_rounds = if progress { 0 } else { idle_rounds + 1 };
            if !taken.is_empty() && !progress {
                break;
            }
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
mod tests {
    use super::*;

    /// Work of `units` units of `size` each.
    #[derive(Debug)]
    struct Units {
        id: u32,
        units: u64,
        size: u64,
    }

    impl Divisible for Units {
        type Part = (u32, u64);

        fn cost(&self) -> u64 {
            self.units * self.size
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
