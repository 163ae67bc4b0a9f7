//! The prefix cache: KV of token sequences that were computed before (a finished sample, a
//! prompt), so that a request sharing their start (the next turn of a conversation, the same
//! prompt again) computes only the rest. Keyed by policy version, since an adapter changes the
//! keys and values; least recently used entries go first when it is full.

/// Which weights computed a cache: the base model, or an adapter version.
pub type PolicyKey = Option<(String, u64)>;

struct Entry<C> {
    policy: PolicyKey,
    tokens: Vec<u32>,
    cache: C,
    last_used: u64,
}

impl<C> Entry<C> {
    /// Positions the entry's cache holds (its tokens').
    fn len(&self) -> usize {
        self.tokens.len()
    }
}

/// The cache of a sampler's backend whose caches are of type `C`.
pub struct PrefixCache<C> {
    entries: Vec<Entry<C>>,
    capacity_positions: usize,
    /// Positions the backend's memory comes in: an entry counts its length rounded up to it.
    block_size: usize,
    clock: u64,
}

impl<C> PrefixCache<C> {
    /// A cache holding at most `capacity_positions` positions over all entries (0: disabled),
    /// each entry's rounded up to whole blocks of `block_size`.
    pub fn new(capacity_positions: usize, block_size: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            capacity_positions,
            block_size: block_size.max(1),
            clock: 0,
        }
    }

    /// The longest cached start of `prompt` under `policy`, at most `limit` positions: the
    /// entry's cache, whose first that many positions apply (the caller copies them).
    pub fn lookup(
        &mut self,
        policy: &PolicyKey,
        prompt: &[u32],
        limit: usize,
    ) -> Option<(&C, usize)> {
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
                (e, common.min(limit))
            })
            .max_by_key(|(_, len)| *len)?;
        if len == 0 {
            return None;
        }
        best.last_used = self.clock;
        Some((&best.cache, len))
    }

    /// Remember `cache`, which holds the KV of `tokens`. Returns the caches the prefix cache
    /// no longer holds, for their memory to be given back: entries it evicted or that the new
    /// one makes useless, and `cache` itself when it does not keep it.
    pub fn insert(&mut self, policy: PolicyKey, tokens: &[u32], cache: C) -> Vec<C> {
        let len = tokens.len();
        if len == 0 || self.rounded(len) > self.capacity_positions {
            return vec![cache];
        }
        // An entry that is a prefix of the new one adds nothing.
        let (useless, kept): (Vec<Entry<C>>, Vec<Entry<C>>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| e.policy == policy && e.len() <= len && tokens.starts_with(&e.tokens));
        self.entries = kept;
        let mut dropped: Vec<C> = useless.into_iter().map(|e| e.cache).collect();
        self.clock += 1;
        self.entries.push(Entry {
            policy,
            tokens: tokens.to_vec(),
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
                Some(i) => dropped.push(self.entries.swap_remove(i).cache),
                None => break,
            }
        }
        dropped
    }

    fn rounded(&self, len: usize) -> usize {
        len.next_multiple_of(self.block_size)
    }

    fn positions(&self) -> usize {
        self.entries.iter().map(|e| self.rounded(e.len())).sum()
    }
}
