//! The sampling engine's backend on a CUDA device (feature `cuda`): the CUDA model
//! ([`CudaModel`]) with a block manager over its paged caches and adapter slots loaded on
//! demand.
//!
//! A sequence's cache is its [`BlockTable`]. A fork shares the whole blocks of the positions it
//! keeps and copies the partial last one, so a shared block is never written (and a block that
//! would be is copied first); a block returns to the free list when no table holds it. The
//! adapter versions of a call are loaded into free slots, or into the slots least recently used
//! by no sequence of the call; the engine runs no more versions at once than there are slots.
//! Tokens are drawn on the device from logits that stay there (`Gpu::draw_tokens`, the host's
//! `choose` on the same row); only the rows of prompts that ask for prompt logprobs come back.

use std::sync::Arc;

use opentinker_kernels::cuda::{AdapterRef, Draw, Gpu};

use super::backend::{BackendError, BackendInput, BackendOutput, SamplerBackend};
use super::cuda::{CudaModel, CudaModelError, CudaModelOptions, CudaSequence};
use super::engine::EngineConfig;
use super::params::Choice;
use crate::lora::PolicyVersion;
use crate::model::{GpuWeights, ModelConfig, Transformer};

/// One sequence's KV on the device: the blocks it reads, in order, and the positions it holds.
pub struct BlockTable {
    blocks: Vec<usize>,
    len: usize,
}

/// Which blocks are free, and how many tables hold each. What is in a block is the device's:
/// the pool asks `copy(from, to)` to copy one.
struct BlockPool {
    free: Vec<usize>,
    holders: Vec<u32>,
    block_size: usize,
}

impl BlockPool {
    fn new(blocks: usize, block_size: usize) -> Self {
        BlockPool {
            free: (0..blocks).rev().collect(),
            holders: vec![0; blocks],
            block_size: block_size.max(1),
        }
    }

    /// A table of its own holding the first `len` positions of `table` (at most its length):
    /// its whole blocks shared, the partial last one copied.
    fn fork(
        &mut self,
        table: &BlockTable,
        len: usize,
        mut copy: impl FnMut(usize, usize) -> Result<(), BackendError>,
    ) -> Result<BlockTable, BackendError> {
        let len = len.min(table.len);
        let whole = len / self.block_size;
        let mut fork = BlockTable {
            blocks: table.blocks[..whole].to_vec(),
            len,
        };
        for &block in &fork.blocks {
            self.share(block);
        }
        if !len.is_multiple_of(self.block_size) {
            let copied = self.take().and_then(|own| {
                fork.blocks.push(own);
                copy(table.blocks[whole], own)
            });
            if let Err(error) = copied {
                self.release(fork);
                return Err(error);
            }
        }
        Ok(fork)
    }

    /// Blocks enough in `table` for `end` positions, the block it writes next its own (copied
    /// first when another table shares it).
    fn make_room(
        &mut self,
        table: &mut BlockTable,
        end: usize,
        mut copy: impl FnMut(usize, usize) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let next = table.len / self.block_size;
        if let Some(&block) = table.blocks.get(next)
            && self.shared(block)
        {
            let own = self.take()?;
            if let Err(error) = copy(block, own) {
                self.give_back(own);
                return Err(error);
            }
            self.give_back(block);
            table.blocks[next] = own;
        }
        while table.blocks.len() * self.block_size < end {
            table.blocks.push(self.take()?);
        }
        Ok(())
    }

    fn release(&mut self, table: BlockTable) {
        for block in table.blocks {
            self.give_back(block);
        }
    }

    fn take(&mut self) -> Result<usize, BackendError> {
        let block = self.free.pop().ok_or(BackendError::KvBlocks {
            blocks: self.holders.len(),
        })?;
        self.holders[block] = 1;
        Ok(block)
    }

    fn share(&mut self, block: usize) {
        self.holders[block] += 1;
    }

    fn shared(&self, block: usize) -> bool {
        self.holders[block] > 1
    }

    fn give_back(&mut self, block: usize) {
        self.holders[block] = self.holders[block].saturating_sub(1);
        if self.holders[block] == 0 {
            self.free.push(block);
        }
    }
}

/// An adapter version in a slot, and when a call last used it.
struct Slot {
    policy: (String, u64),
    adapter: AdapterRef,
    used: u64,
}

/// The base model on one CUDA device, serving the sampling engine.
pub struct CudaSampler {
    model: CudaModel,
    pool: BlockPool,
    slots: Vec<Option<Slot>>,
    clock: u64,
}

impl CudaSampler {
    /// Uploads `base` with room for `options`' blocks and adapter slots.
    pub fn new(
        gpu: Arc<Gpu>,
        base: &Transformer,
        options: CudaModelOptions,
    ) -> Result<CudaSampler, CudaModelError> {
        let model = CudaModel::from_transformer(gpu, base, options)?;
        Ok(CudaSampler::over(model))
    }

    /// Over weights already on the device (shared with a trainer), with room for `options`'
    /// blocks and adapter slots.
    pub fn with_weights(
        gpu: Arc<Gpu>,
        config: &ModelConfig,
        weights: Arc<GpuWeights>,
        options: CudaModelOptions,
    ) -> Result<CudaSampler, CudaModelError> {
        let model = CudaModel::with_weights(gpu, config, weights, options)?;
        Ok(CudaSampler::over(model))
    }

    fn over(model: CudaModel) -> CudaSampler {
        let options = *model.options();
        CudaSampler {
            pool: BlockPool::new(options.kv_blocks, options.block_size),
            slots: (0..options.adapter_slots).map(|_| None).collect(),
            clock: 0,
            model,
        }
    }

    /// The KV blocks an engine of `config` needs at most: its running samples' reserved
    /// positions and its prefix cache's, in whole blocks of `block_size` (the engine reserves
    /// whole blocks), and one more for a fork's copy.
    pub fn blocks_for(config: &EngineConfig, block_size: usize) -> usize {
        let block_size = block_size.max(1);
        config.kv_budget_positions.div_ceil(block_size)
            + config.prefix_cache_positions.div_ceil(block_size)
            + 1
    }

    /// Each input's adapter version in a slot: loaded where it is not, into a free slot or the
    /// one least recently used by no input of this call.
    fn adapters(
        &mut self,
        inputs: &[BackendInput<'_, BlockTable>],
    ) -> Result<Vec<Option<AdapterRef>>, BackendError> {
        self.clock += 1;
        let mut wanted: Vec<&PolicyVersion> = Vec::new();
        for policy in inputs.iter().filter_map(|input| input.policy) {
            if !wanted
                .iter()
                .any(|p| p.name == policy.name && p.version == policy.version)
            {
                wanted.push(policy);
            }
        }
        if wanted.len() > self.slots.len() {
            return Err(BackendError::AdapterSlots {
                policies: wanted.len(),
                slots: self.slots.len(),
            });
        }
        let holds = |slot: &Slot, policy: &PolicyVersion| {
            slot.policy.0 == policy.name && slot.policy.1 == policy.version
        };
        let mut refs = Vec::with_capacity(wanted.len());
        for policy in &wanted {
            let loaded = self.slots.iter_mut().flatten().find(|s| holds(s, policy));
            let adapter = match loaded {
                Some(slot) => {
                    slot.used = self.clock;
                    slot.adapter
                }
                None => {
                    // A free slot first, then the least recently used that this call does not
                    // need.
                    let index = self
                        .slots
                        .iter()
                        .enumerate()
                        .filter(|(_, slot)| {
                            slot.as_ref()
                                .is_none_or(|s| !wanted.iter().any(|p| holds(s, p)))
                        })
                        .min_by_key(|(_, slot)| slot.as_ref().map_or(0, |s| s.used))
                        .map(|(index, _)| index)
                        .ok_or(BackendError::AdapterSlots {
                            policies: wanted.len(),
                            slots: self.slots.len(),
                        })?;
                    self.slots[index] = None;
                    let adapter = self.model.load_adapter(index, &policy.adapter)?;
                    self.slots[index] = Some(Slot {
                        policy: (policy.name.clone(), policy.version),
                        adapter,
                        used: self.clock,
                    });
                    adapter
                }
            };
            refs.push(((policy.name.as_str(), policy.version), adapter));
        }
        Ok(inputs
            .iter()
            .map(|input| {
                let policy = input.policy?;
                refs.iter()
                    .find(|((name, version), _)| *name == policy.name && *version == policy.version)
                    .map(|(_, adapter)| *adapter)
            })
            .collect())
    }
}

impl SamplerBackend for CudaSampler {
    type Cache = BlockTable;

    fn block_size(&self) -> usize {
        self.model.options().block_size
    }

    fn max_policies(&self) -> Option<usize> {
        Some(self.slots.len())
    }

    fn check_policy(&self, policy: &PolicyVersion) -> Result<(), BackendError> {
        let adapter = &policy.adapter;
        let max = self.model.options().max_rank;
        if adapter.config.rank > max {
            return Err(BackendError::AdapterRank {
                rank: adapter.config.rank,
                max,
            });
        }
        if adapter.sites.contains_key(&crate::model::Site::Unembed) {
            return Err(BackendError::AdapterUnembedding);
        }
        Ok(())
    }

    fn empty_cache(&mut self) -> BlockTable {
        BlockTable {
            blocks: Vec::new(),
            len: 0,
        }
    }

    fn cache_len(cache: &BlockTable) -> usize {
        cache.len
    }

    fn fork(&mut self, cache: &BlockTable, len: usize) -> Result<BlockTable, BackendError> {
        let model = &mut self.model;
        self.pool
            .fork(cache, len, |from, to| Ok(model.copy_block(from, to)?))
    }

    fn release(&mut self, cache: BlockTable) {
        self.pool.release(cache);
    }

    fn forward(
        &mut self,
        _base: &Transformer,
        inputs: &mut [BackendInput<'_, BlockTable>],
    ) -> Result<Vec<BackendOutput>, BackendError> {
        let adapters = self.adapters(inputs)?;
        for input in inputs.iter_mut() {
            let end = input.cache.len + input.tokens.len();
            let model = &mut self.model;
            self.pool
                .make_room(input.cache, end, |from, to| Ok(model.copy_block(from, to)?))?;
        }
        let sequences: Vec<CudaSequence<'_>> = inputs
            .iter()
            .zip(&adapters)
            .map(|(input, adapter)| CudaSequence {
                tokens: input.tokens,
                start: input.cache.len,
                blocks: &input.cache.blocks,
                adapter: *adapter,
                all_logits: input.all_logits,
            })
            .collect();
        let logits = self.model.forward(&sequences)?;
        let vocab = self.model.config().vocab_size;
        // Each input's rows of the logits, and the draws from its last.
        let mut draws = Vec::new();
        let mut spans = Vec::with_capacity(inputs.len());
        let mut row = 0;
        for input in inputs.iter() {
            let rows = if input.all_logits {
                input.tokens.len()
            } else {
                1
            };
            spans.push(row..row + rows);
            row += rows;
            draws.extend(input.picks.iter().map(|pick| Draw {
                row: row - 1,
                temperature: pick.params.temperature,
                top_k: pick.params.top_k,
                top_p: pick.params.top_p,
                uniform: pick.uniform,
                top: pick.top,
            }));
        }
        let gpu = self.model.gpu();
        let mut drawn = gpu
            .draw_tokens(&logits, vocab, &draws)
            .map_err(CudaModelError::from)?
            .into_iter();
        // Only prompt logprobs need whole rows on the host.
        let host_logits = match inputs.iter().any(|input| input.all_logits) {
            true => gpu.download(&logits).map_err(CudaModelError::from)?,
            false => Vec::new(),
        };
        let mut outputs = Vec::with_capacity(inputs.len());
        for (input, span) in inputs.iter_mut().zip(spans) {
            let choices = drawn
                .by_ref()
                .take(input.picks.len())
                .map(|d| Choice {
                    token: d.token,
                    logprob: d.logprob,
                    top: d.top,
                })
                .collect();
            let logits = match input.all_logits {
                true => host_logits[span.start * vocab..span.end * vocab].to_vec(),
                false => Vec::new(),
            };
            outputs.push(BackendOutput { choices, logits });
            input.cache.len += input.tokens.len();
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `blocks` blocks of 4 positions whose copies are recorded.
    fn pool(blocks: usize) -> BlockPool {
        BlockPool::new(blocks, 4)
    }

    #[test]
    fn forks_share_whole_blocks_copy_the_partial_one_and_free_on_the_last_release() {
        let mut pool = pool(8);
        let mut copies = Vec::new();
        let mut table = BlockTable {
            blocks: Vec::new(),
            len: 0,
        };
        pool.make_room(&mut table, 10, |_, _| unreachable!())
            .unwrap();
        table.len = 10;
        assert_eq!(table.blocks.len(), 3);
        // 6 positions: block 0 shared, block 1 (half full) copied.
        let fork = pool
            .fork(&table, 6, |from, to| {
                copies.push((from, to));
                Ok(())
            })
            .unwrap();
        assert_eq!(fork.len, 6);
        assert_eq!(fork.blocks[0], table.blocks[0]);
        assert_eq!(copies, vec![(table.blocks[1], fork.blocks[1])]);
        assert!(pool.shared(table.blocks[0]) && !pool.shared(fork.blocks[1]));
        assert_eq!(pool.free.len(), 8 - 4);
        // A whole-block fork copies nothing; writing past it takes a fresh block.
        let mut whole = pool.fork(&table, 8, |_, _| unreachable!()).unwrap();
        pool.make_room(&mut whole, 9, |_, _| unreachable!())
            .unwrap();
        assert_eq!(whole.blocks.len(), 3);
        assert_ne!(whole.blocks[2], table.blocks[2]);
        pool.release(table);
        pool.release(fork);
        pool.release(whole);
        assert_eq!(pool.free.len(), 8, "every block back");
        assert!(pool.holders.iter().all(|&h| h == 0));
    }

    #[test]
    fn a_shared_block_is_copied_before_it_is_written() {
        let mut pool = pool(4);
        let mut table = BlockTable {
            blocks: Vec::new(),
            len: 0,
        };
        pool.make_room(&mut table, 3, |_, _| unreachable!())
            .unwrap();
        table.len = 3;
        // A table that shares the partial block (as a restored one might) writes into a copy.
        let shared = table.blocks[0];
        pool.share(shared);
        let mut other = BlockTable {
            blocks: vec![shared],
            len: 3,
        };
        let mut copies = Vec::new();
        pool.make_room(&mut other, 4, |from, to| {
            copies.push((from, to));
            Ok(())
        })
        .unwrap();
        assert_eq!(copies, vec![(shared, other.blocks[0])]);
        assert_ne!(other.blocks[0], shared);
        assert!(!pool.shared(shared));
    }

    #[test]
    fn a_full_pool_says_so_and_a_failed_fork_gives_its_blocks_back() {
        let mut pool = pool(2);
        let mut table = BlockTable {
            blocks: Vec::new(),
            len: 0,
        };
        pool.make_room(&mut table, 6, |_, _| unreachable!())
            .unwrap();
        table.len = 6;
        let error = pool.fork(&table, 6, |_, _| Ok(())).err().unwrap();
        assert!(
            error.to_string().contains("no free block (of 2)"),
            "{error}"
        );
        assert!(
            !pool.shared(table.blocks[0]),
            "the failed fork's share was given back"
        );
        let mut longer = BlockTable {
            blocks: Vec::new(),
            len: 0,
        };
        assert!(pool.make_room(&mut longer, 1, |_, _| Ok(())).is_err());
    }
}
