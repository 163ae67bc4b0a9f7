//! The prefix cache: KV of token sequences that were computed before (a finished sample, a
//! prompt), so that a request sharing their start (the next turn of a conversation, the same
//! prompt again) computes only the rest. Keyed by policy version, since an adapter changes the
//! keys and values; least recently used entries go first when it is full.

use crate::model::ModelConfig;
use opentinker_kernels::KvCache;

/// Which weights computed a cache: the base model, or an adapter version.
pub type PolicyKey = Option<(String, u64)>;

struct Entry {
    policy: PolicyKey,
    tokens: Vec<u32>,
    cache: KvCache,
    last_used: u64,
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    capacity_positions: usize,
    clock: u64,
}

impl PrefixCache {
    /// A cache holding at most `capacity_positions` positions over all entries (0: disabled).
    pub fn new(capacity_positions: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            capacity_positions,
            clock: 0,
        }
    }

    /// The longest cached start of `prompt` under `policy`, at most `limit` positions, as a
    /// cache of its own (a copy).
    pub fn lookup(
        &mut self,
        policy: &PolicyKey,
        prompt: &[u32],
        limit: usize,
        config: &ModelConfig,
    ) -> Option<KvCache> {
        self.clock += 1;
        let (best, len) = self
            .entries
            .iter_mut()
            .filter(|e| &e.policy == policy)
            .map(|e| {
                let common = e
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                let len = common.min(limit).min(e.cache.len);
                (e, len)
            })
            .max_by_key(|(_, len)| *len)?;
        if len == 0 {
            return None;
        }
        best.last_used = self.clock;
        Some(best.cache.prefix(len, config.head_dim))
    }

    /// Remember `cache`, which holds the KV of `tokens[..cache.len]`.
    pub fn insert(&mut self, policy: PolicyKey, tokens: &[u32], cache: KvCache) {
        let len = cache.len;
        if len == 0 || len > self.capacity_positions {
            return;
        }
        // An entry that is a prefix of the new one adds nothing.
        self.entries.retain(|e| {
            !(e.policy == policy
                && e.cache.len <= len
                && tokens.starts_with(&e.tokens[..e.cache.len]))
        });
        self.clock += 1;
        self.entries.push(Entry {
            policy,
            tokens: tokens[..len].to_vec(),
            cache,
            last_used: self.clock,
        });
        while self.positions() > self.capacity_positions {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    self.entries.swap_remove(i);
                }
                None => break,
            }
        }
    }

    fn positions(&self) -> usize {
        self.entries.iter().map(|e| e.cache.len).sum()
    }
}
