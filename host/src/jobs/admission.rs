//! The memory budget a server's jobs run under: each job is admitted with a reservation of the
//! memory it will hold before it makes anything, and waits in one queue, in submission order,
//! while the budget has no room for it (its place and the reason are part of its status). A job
//! that could never fit is refused when it is submitted. A restarted server admits what it
//! resumes the same way.
//!
//! What a job holds is estimated from its file and its base ([`footprint`]): its adapters with
//! their gradients and AdamW's moments; and, for a job whose warm-up trains every weight, a base
//! of its own (weights, AdamW's two moments, the accumulated gradients and a pass's own, 20
//! bytes a parameter, with the activations of a training pass, which the engine bounds by
//! `train::PASS_BYTES`) with a sampler and its KV cache over it; a job on a tiny model it
//! generates holds that model, its sampler and its training passes too. Any other job trains
//! adapters on a served base, whose weights, KV cache and one pass of the shared training loop
//! the server holds from its start ([`served_base_bytes`], outside the jobs' budget).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::api::{ApiError, ApiErrorKind, JobId};
use crate::model::ModelConfig;
use crate::model::layers::train_values_per_token;
use crate::rl::Job;
use crate::train::PASS_BYTES;
use opentinker_kernels::KvCache;

/// `bytes` as people read them (`1.50 GiB`, `12.0 MiB`).
pub fn human_bytes(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let value = bytes as f64;
    if value >= GIB {
        format!("{:.2} GiB", value / GIB)
    } else {
        format!("{:.1} MiB", value / MIB)
    }
}

/// The default budget: the machine's memory (`MemTotal`) less a tenth of it, at least 2 GiB,
/// for the system and what is not counted. `None` where the memory cannot be read.
pub fn machine_budget() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let total = kib * 1024;
    Some(total.saturating_sub((total / 10).max(2 << 30)))
}

/// A job's place in the queue: its position (1: next) and why it waits.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QueuePlace {
    pub position: usize,
    pub reason: String,
}

/// The memory the server's jobs may hold, and the jobs waiting for room.
pub struct MemoryBudget {
    total: u64,
    ledger: Mutex<Ledger>,
    /// Told whenever memory is released or the queue's head changes.
    changed: Notify,
}

#[derive(Default)]
struct Ledger {
    reserved: u64,
    /// Waiting jobs in submission order, with what each needs.
    waiting: VecDeque<(JobId, u64)>,
}

/// Memory held by an admitted job, given back when dropped (the job ended, failed or was
/// cancelled).
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.ledger().reserved -= self.bytes;
        self.budget.changed.notify_waiters();
    }
}

/// A job's entry in the queue, taken out if it stops waiting before it is admitted (its task
/// aborted by a cancellation).
struct Waiting<'a> {
    budget: &'a MemoryBudget,
    id: &'a JobId,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut ledger = self.budget.ledger();
        if let Some(at) = ledger.waiting.iter().position(|(id, _)| id == self.id) {
            ledger.waiting.remove(at);
            drop(ledger);
            self.budget.changed.notify_waiters();
        }
    }
}

impl MemoryBudget {
    /// A budget of `total` bytes for jobs.
    pub fn new(total: u64) -> Arc<Self> {
        Arc::new(MemoryBudget {
            total,
            ledger: Mutex::new(Ledger::default()),
            changed: Notify::new(),
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuse a job that needs more than the whole budget: it would wait forever.
    pub fn check(&self, needs: u64) -> Result<(), ApiError> {
        if needs > self.total {
            return Err(ApiError::new(
                ApiErrorKind::QuotaExceeded,
                format!(
                    "the job needs about {} of memory; the server's budget for jobs is {} \
                     (`serve --memory-budget`): train adapters (`sft.full_parameters = false`) \
                     or a smaller model",
                    human_bytes(needs),
                    human_bytes(self.total)
                ),
            ));
        }
        Ok(())
    }

    /// Wait for room for `needs` bytes, behind every job queued before `id`, and hold them.
    pub async fn admit(self: &Arc<Self>, id: &JobId, needs: u64) -> Reservation {
        self.ledger().waiting.push_back((id.clone(), needs));
        let waiting = Waiting { budget: self, id };
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a release between the check and the wait wakes it.
            notified.as_mut().enable();
            {
                let mut ledger = self.ledger();
                let first = ledger.waiting.front().is_some_and(|(head, _)| head == id);
                if first && ledger.reserved + needs <= self.total {
                    ledger.waiting.pop_front();
                    ledger.reserved += needs;
                    drop(ledger);
                    std::mem::forget(waiting);
                    // The next in line may fit beside this one.
                    self.changed.notify_waiters();
                    return Reservation {
                        budget: Arc::clone(self),
                        bytes: needs,
                    };
                }
            }
            notified.await;
        }
    }

    /// Where job `id` waits, if it does.
    pub fn place(&self, id: &JobId) -> Option<QueuePlace> {
        let ledger = self.ledger();
        let at = ledger.waiting.iter().position(|(queued, _)| queued == id)?;
        let needs = ledger.waiting[at].1;
        let free = self.total.saturating_sub(ledger.reserved);
        Some(QueuePlace {
            position: at + 1,
            reason: match at {
                0 => format!(
                    "waiting for memory: it needs about {}, {} of the jobs' {} is free",
                    human_bytes(needs),
                    human_bytes(free),
                    human_bytes(self.total)
                ),
                _ => format!("waiting behind {at} job(s) queued before it"),
            },
        })
    }
}

/// What a served base holds for as long as the server runs: its weights (f32), the KV cache
/// of `kv_positions` positions, and the activations of one pass of its shared training loop.
pub fn served_base_bytes(config: &ModelConfig, kv_positions: usize) -> u64 {
    parameters(config) * 4 + kv_bytes(config, kv_positions) + PASS_BYTES as u64
}

/// The memory `job` holds on a server, its model being of `config` with `context` positions:
/// a served base (`own_model` false) or one the job generates for itself. See the module's doc.
pub fn footprint(job: &Job, config: &ModelConfig, context: usize, own_model: bool) -> u64 {
    let full_warmup = job.sft.as_ref().is_some_and(|w| w.full_parameters);
    let adapters = lora_parameters(job, config) * 16 * job.policies.len().max(1) as u64;
    // On a served base, the shared training loop's passes are the server's (`served_base_bytes`).
    if !full_warmup && !own_model {
        return adapters;
    }
    let weights = parameters(config) * 4;
    let rl = &job.rl;
    let concurrency = (rl.group_size * rl.groups_per_batch).max(job.eval.episodes);
    let per_episode = ((256 + rl.max_tokens) * rl.max_turns.max(1)).min(context);
    // A training pass holds the activations of as many episodes as a batch has, up to
    // `PASS_BYTES` (the engine's bound), and at least one whole episode.
    let per_token = (train_values_per_token(config, true) * 4) as u64;
    let activations = |episodes: usize| {
        let batch = per_token * (episodes * per_episode) as u64;
        batch
            .min(PASS_BYTES as u64)
            .max(per_token * per_episode as u64)
    };
    let sampling = weights + adapters + kv_bytes(config, concurrency * per_episode);
    let Some(warmup) = job.sft.as_ref().filter(|w| w.full_parameters) else {
        return sampling + activations(rl.group_size * rl.groups_per_batch);
    };
    // A full-parameter warm-up holds the weights, AdamW's two moments and the accumulated
    // gradients throughout; in a pass, the pass's own gradients and activations and, adding
    // them up, a third copy of the largest weight; in a step, the step's temporaries of one
    // weight at a time.
    let largest = (config.vocab_size.max(config.intermediate_size) * config.hidden_size * 4) as u64;
    let pass = weights + activations(warmup.batch) + largest;
    let step = 6 * largest;
    sampling + 3 * weights + pass.max(step)
}

fn kv_bytes(config: &ModelConfig, positions: usize) -> u64 {
    (KvCache::bytes_per_position(config.num_layers, config.num_kv_heads, config.head_dim)
        * positions) as u64
}

/// The widths of a layer's queries and of its keys (and values).
fn attention_widths(config: &ModelConfig) -> (usize, usize) {
    (
        config.num_heads * config.head_dim,
        config.num_kv_heads * config.head_dim,
    )
}

/// The weights of a model of `config`, counted from its shapes (norms and biases included).
fn parameters(config: &ModelConfig) -> u64 {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = attention_widths(config);
    let attention = hidden * q * 2 + hidden * kv * 2 + q + 2 * kv;
    let mlp = 3 * hidden * inter;
    let norms = match config.features.block_output_norms {
        true => 4 * hidden,
        false => 2 * hidden,
    };
    let layer = attention + mlp + norms + 2 * config.head_dim;
    let embeddings = config.vocab_size * hidden;
    let head = if config.tie_word_embeddings {
        0
    } else {
        embeddings
    };
    (config.num_layers * layer + embeddings + head + hidden) as u64
}

/// The parameters of one adapter of `job`'s LoRA settings on `config`.
fn lora_parameters(job: &Job, config: &ModelConfig) -> u64 {
    let rank = job.lora.rank;
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = attention_widths(config);
    let mut per_layer = 0;
    if job.lora.train_attention {
        per_layer += rank * ((hidden + q) * 2 + (hidden + kv) * 2);
    }
    if job.lora.train_mlp {
        per_layer += rank * (hidden + inter) * 3;
    }
    let unembed = match job.lora.train_unembed {
        true => rank * (hidden + config.vocab_size),
        false => 0,
    };
    (config.num_layers * per_layer + unembed) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> JobId {
        JobId::parse(&format!("job-{n:02}00000000000000")).unwrap()
    }

    #[tokio::test]
    async fn jobs_wait_in_order_for_room_and_a_cancelled_one_leaves_the_queue() {
        let budget = MemoryBudget::new(100);
        assert!(budget.check(101).is_err());
        let first = budget.admit(&id(1), 60).await;
        // The second does not fit beside the first; the third would, but waits its turn.
        let second = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.admit(&id(2), 50).await }
        });
        tokio::task::yield_now().await;
        let third = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.admit(&id(3), 10).await }
        });
        let cancelled = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.admit(&id(4), 10).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(budget.place(&id(2)).map(|p| p.position), Some(1));
        assert!(
            budget
                .place(&id(2))
                .unwrap()
                .reason
                .contains("waiting for memory")
        );
        assert_eq!(budget.place(&id(3)).map(|p| p.position), Some(2));
        assert!(!third.is_finished());
        cancelled.abort();
        let _ = cancelled.await;
        assert_eq!(budget.place(&id(4)), None);
        drop(first);
        let second = second.await.unwrap();
        let third = third.await.unwrap();
        assert_eq!(budget.ledger().reserved, 60);
        drop((second, third));
        assert_eq!(budget.ledger().reserved, 0);
    }
}
