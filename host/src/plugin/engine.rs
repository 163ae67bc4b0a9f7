//! The wasmtime engine shared by every plugin of a host: compilation settings, the pooling
//! allocator sized for many concurrent episodes, and the epoch clock that bounds call time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::limits::Limits;

/// How a plugin host is set up. The defaults suit a shared multi-tenant server.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Where compiled components are cached; `None` compiles every load.
    pub cache_dir: Option<PathBuf>,
    /// The largest compile-cache entry read; a bigger file is a miss.
    pub cache_max_entry_bytes: u64,
    /// The compile cache's size, past which the entries used longest ago are evicted.
    pub cache_max_bytes: u64,
    /// Meter fuel (deterministic instruction budgets). Costs 24-34% of guest speed, so off unless
    /// jobs ask for `fuel` limits.
    pub fuel: bool,
    /// The most a job may raise each limit to.
    pub maxima: Limits,
    /// The largest component accepted, in bytes.
    pub max_component_bytes: usize,
    /// Plugin instances alive at once (one per live episode or call); beyond it, a new instance
    /// waits for a free slot.
    pub max_instances: u32,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cache_dir: None,
            cache_max_entry_bytes: 256 * 1024 * 1024,
            cache_max_bytes: 4 * 1024 * 1024 * 1024,
            fuel: false,
            maxima: Limits::default_maxima(),
            max_component_bytes: 64 * 1024 * 1024,
            max_instances: 4096,
        }
    }
}

/// How often the epoch advances: the granularity of call timeouts and of yielding to other
/// episodes on the same thread.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The guest's native stack budget; a deeper recursion traps with a stack overflow.
const MAX_WASM_STACK: usize = 512 * 1024;

/// Guard pages after each linear memory, so most bounds checks are free.
const MEMORY_GUARD: u64 = 32 * 1024 * 1024;

pub(crate) fn build_engine(config: &HostConfig) -> wasmtime::Result<Engine> {
    let max_memory = config.maxima.memory_bytes;
    let instances = config.max_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        // A Rust component has a main module plus a shim and a fixup module.
        .total_core_instances(instances.saturating_mul(4))
        .total_memories(instances.saturating_mul(2))
        .total_tables(instances.saturating_mul(4))
        .total_stacks(instances)
        .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
        .max_memories_per_component(4)
        .max_tables_per_component(8);

    let mut wasm = Config::new();
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .epoch_interruption(true)
        .consume_fuel(config.fuel)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(MAX_WASM_STACK + 512 * 1024)
        .memory_reservation(max_memory)
        .memory_guard_size(MEMORY_GUARD)
        .memory_reservation_for_growth(0)
        .wasm_component_model(true);
    Engine::new(&wasm)
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`], stopped on drop.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("opentinker-epoch".into())
            .spawn(move || {
                while !stop_flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
