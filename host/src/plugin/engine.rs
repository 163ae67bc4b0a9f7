//! The wasmtime engine shared by every plugin of a host: compilation settings, the pooling
//! allocator sized for many concurrent episodes, and the epoch clock that bounds call time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::limits::{
    CompileLimits, Limits, MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT,
    MAX_TABLES_PER_COMPONENT,
};

/// How a plugin host is set up. The defaults suit a shared multi-tenant server.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Where compiled components are cached; `None` compiles every load.
    pub cache_dir: Option<PathBuf>,
    /// The largest compile-cache entry read; a bigger file is a miss.
    pub cache_max_entry_bytes: u64,
    /// The compile cache's size, past which the entries used longest ago are evicted.
    pub cache_max_bytes: u64,
    /// The most a job may raise each limit to.
    pub maxima: Limits,
    /// The largest component accepted, in bytes.
    pub max_component_bytes: usize,
    /// Plugin instances alive at once (one per live episode or call); beyond it, a new instance
    /// waits for a free slot.
    pub max_instances: u32,
    /// Instances of one loaded plugin alive at once, so that one plugin (one job) cannot hold
    /// every slot of the host; beyond it, its new instance waits.
    pub max_instances_per_plugin: u32,
    /// What compiling one component may cost (it runs in a bounded worker process).
    pub compile: CompileLimits,
    /// The program to compile in (`opentinker`, run as its `compile-worker`); `None`: the
    /// program `OPENTINKER_COMPILE_WORKER` names, else the running executable when it is
    /// `opentinker`, else an `opentinker` beside it or one folder up.
    pub compile_worker: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cache_dir: None,
            cache_max_entry_bytes: 256 * 1024 * 1024,
            cache_max_bytes: 4 * 1024 * 1024 * 1024,
            maxima: Limits::default_maxima(),
            max_component_bytes: 64 * 1024 * 1024,
            max_instances: 4096,
            max_instances_per_plugin: 1024,
            compile: CompileLimits::default(),
            compile_worker: None,
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

/// The engine settings that decide how a component compiles: the same in the host and in its
/// compile worker, so the worker's artifacts load in the host's engine.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct EngineSettings {
    pub(crate) max_memory_bytes: u64,
}

impl EngineSettings {
    pub(crate) fn of(config: &HostConfig) -> Self {
        EngineSettings {
            max_memory_bytes: config.maxima.memory_bytes,
        }
    }
}

/// Compilation and runtime settings, without an allocation strategy.
pub(crate) fn wasm_config(settings: &EngineSettings) -> Config {
    let mut wasm = Config::new();
    // Fuel is always metered: it is what bounds a call's CPU deterministically (it costs guests
    // about a quarter of their speed, measured in `benches/plugin_calls.rs`).
    wasm.epoch_interruption(true)
        .consume_fuel(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(MAX_WASM_STACK + 512 * 1024)
        .memory_reservation(settings.max_memory_bytes)
        .memory_guard_size(MEMORY_GUARD)
        .memory_reservation_for_growth(0)
        .wasm_component_model(true);
    wasm
}

/// Linear memories the pool holds per instance slot: a component of more (up to
/// [`MAX_MEMORIES_PER_COMPONENT`]) takes more slots (see `Plugin::slot_weight`).
const MEMORIES_PER_SLOT: u32 = 2;

pub(crate) fn build_engine(config: &HostConfig) -> wasmtime::Result<Engine> {
    let settings = EngineSettings::of(config);
    let instances = config.max_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
        .total_memories(
            instances
                .saturating_mul(MEMORIES_PER_SLOT)
                .max(MAX_MEMORIES_PER_COMPONENT),
        )
        .total_tables(instances.saturating_mul(MAX_TABLES_PER_COMPONENT))
        .total_stacks(instances)
        .max_memory_size(usize::try_from(settings.max_memory_bytes).unwrap_or(usize::MAX))
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT);
    let mut wasm = wasm_config(&settings);
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&wasm)
}

/// The instance slots one instance of a component with `memories` linear memories takes on a
/// host of `slots`, so that the slots in use never need more memories than the pool holds (which
/// holds at least one component's worth on the smallest host).
pub(crate) fn slot_weight(memories: u32, slots: u32) -> u32 {
    memories.div_ceil(MEMORIES_PER_SLOT).clamp(1, slots.max(1))
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
