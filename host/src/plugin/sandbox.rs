//! One sandboxed plugin instance: a fresh store from the pooling allocator, its limits, and the
//! guard around every call that turns traps, timeouts and limit hits into typed errors. After a
//! failed call the instance is poisoned: it answers every later call with the same error.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;

use wasmtime::component::{Instance, InstancePre, ResourceTable};
use wasmtime::{CallHook, Engine, ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{v0_1, v0_2, v0_3};
use super::error::{CallError, ErrorKind};
use super::limits::{ITEM_OVERHEAD_BYTES, Limits};
use super::types::OutputSize;
use super::wasi::{self, LogSink, VirtualClock, VirtualClockView};

/// Extra wall time for the timeout around a call, past the epoch deadline: the epoch trap
/// normally fires first; the timeout catches a guest blocked in a host call.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// Fuel one call into the host costs (an import, or a runtime call such as `memory.grow`): about
/// what a host call takes in guest instructions' time, so that a guest spinning through host calls
/// runs out of fuel as a computing one does, whatever the machine's load.
pub const HOST_CALL_FUEL: u64 = 1_000;

/// Caps on tables and instances, far above what a plugin needs.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
const MAX_RESOURCES: usize = 1 << 16;

/// Everything a plugin's store holds.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    clock: VirtualClock,
    limiter: MemoryLimiter,
    log: LogSink,
    budget: Budget,
}

/// Which limit bounds the running call: its own, or what is left of its episode's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    Call,
    Episode,
}

/// The fuel and wall time of one instance: what its episode has left, what the running call was
/// given, and what its calls have used.
struct Budget {
    episode_deadline: Instant,
    episode_fuel_left: u64,
    /// When the running call's wall time is up, and whether that is the call's or the episode's.
    deadline: Instant,
    time_bound: Bound,
    /// The fuel the running call was given, and whether that is the call's or the episode's.
    armed_fuel: u64,
    fuel_bound: Bound,
    used: FuelUse,
}

/// Fuel (wasm instructions, as wasmtime meters them) an instance's calls used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FuelUse {
    /// All calls together.
    pub total: u64,
    /// The most one call used.
    pub max_call: u64,
}

impl Budget {
    fn new(limits: &Limits) -> Self {
        let now = Instant::now();
        Budget {
            episode_deadline: now + Duration::from_millis(limits.episode_timeout_ms),
            episode_fuel_left: limits.episode_fuel,
            deadline: now,
            time_bound: Bound::Call,
            armed_fuel: 0,
            fuel_bound: Bound::Call,
            used: FuelUse::default(),
        }
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl StoreState {
    pub(crate) fn clock(&mut self) -> VirtualClockView<'_> {
        VirtualClockView {
            clock: &mut self.clock,
            table: &mut self.table,
        }
    }
}

impl v0_2::opentinker::plugin::host::Host for StoreState {
    fn log(&mut self, level: v0_2::opentinker::plugin::host::LogLevel, message: String) {
        use v0_2::opentinker::plugin::host::LogLevel;
        let level = match level {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        let line = format!("[{level}] {message}\n");
        self.log.append(line.as_bytes());
    }
}

/// A 0.1 component's log lines, as 0.2's.
impl v0_1::opentinker::plugin::host::Host for StoreState {
    fn log(&mut self, level: v0_1::opentinker::plugin::host::LogLevel, message: String) {
        use v0_1::opentinker::plugin::host::LogLevel as Old;
        use v0_2::opentinker::plugin::host::{Host, LogLevel};
        let level = match level {
            Old::Trace => LogLevel::Trace,
            Old::Debug => LogLevel::Debug,
            Old::Info => LogLevel::Info,
            Old::Warn => LogLevel::Warn,
            Old::Error => LogLevel::Error,
        };
        Host::log(self, level, message);
    }
}

/// A 0.3 component's log lines, as 0.2's.
impl v0_3::opentinker::plugin::host::Host for StoreState {
    fn log(&mut self, level: v0_3::opentinker::plugin::host::LogLevel, message: String) {
        use v0_2::opentinker::plugin::host::{Host, LogLevel};
        use v0_3::opentinker::plugin::host::LogLevel as New;
        let level = match level {
            New::Trace => LogLevel::Trace,
            New::Debug => LogLevel::Debug,
            New::Info => LogLevel::Info,
            New::Warn => LogLevel::Warn,
            New::Error => LogLevel::Error,
        };
        Host::log(self, level, message);
    }
}

/// What one table element counts against the instance's memory budget (a reference).
const TABLE_ELEMENT_BYTES: usize = 8;

/// One budget for the whole instance: the bytes of all its linear memories plus its tables'
/// elements, so a component with four memories gets the cap once, not four times. Refuses
/// growth past it and remembers that it did, so a guest that then aborts is reported as
/// `memory_limit` rather than a plain trap. (Wasmtime asks for each memory's and table's
/// creation too, with `current` 0, so the sum covers them all.)
struct MemoryLimiter {
    max_bytes: usize,
    used_bytes: usize,
    refused: bool,
}

impl MemoryLimiter {
    fn new(max_bytes: usize) -> Self {
        MemoryLimiter {
            max_bytes,
            used_bytes: 0,
            refused: false,
        }
    }

    fn grow(&mut self, added_bytes: usize) -> bool {
        let next = self.used_bytes.saturating_add(added_bytes);
        if next > self.max_bytes {
            self.refused = true;
            return false;
        }
        self.used_bytes = next;
        true
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        let added = desired.saturating_sub(current);
        Ok(self.grow(added.saturating_mul(TABLE_ELEMENT_BYTES)))
    }
}

pub(crate) struct Sandbox {
    pub(crate) store: Store<StoreState>,
    pub(crate) instance: Instance,
    /// The plugin's and the pooling allocator's slots this instance holds until it is dropped.
    _slots: Slots,
    limits: Limits,
    failure: Option<CallError>,
    /// Bytes (items counted) all calls of this instance have returned.
    returned_bytes: u64,
}

/// The plugin's and the pooling allocator's slots an instance holds until it is dropped.
pub(crate) type Slots = (OwnedSemaphorePermit, OwnedSemaphorePermit);

impl Sandbox {
    /// A fresh instance of the pre-instantiated component `pre` on `engine`, for one episode (or
    /// one stateless call), bounded by `limits` (already checked against the plugin's maxima),
    /// holding `slots` (see `PluginInner::sandbox`).
    pub(crate) async fn new(
        engine: &Engine,
        pre: &InstancePre<StoreState>,
        limits: &Limits,
        seed: u64,
        slots: Slots,
    ) -> Result<Self, CallError> {
        let log = LogSink::new(usize::try_from(limits.log_bytes).unwrap_or(usize::MAX));
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        let state = StoreState {
            wasi: wasi::episode_ctx(seed, &log),
            table,
            clock: VirtualClock::default(),
            limiter: MemoryLimiter::new(usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX)),
            log,
            budget: Budget::new(limits),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.limiter);
        store.call_hook(|mut store, hook| {
            if matches!(hook, CallHook::CallingHost) {
                let fuel = store.get_fuel()?;
                store.set_fuel(fuel.saturating_sub(HOST_CALL_FUEL))?;
                if fuel < HOST_CALL_FUEL {
                    return Err(Trap::OutOfFuel.into());
                }
            }
            Ok(())
        });
        store.epoch_deadline_callback(|ctx| {
            Ok(if Instant::now() >= ctx.data().budget.deadline {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::Yield(1)
            })
        });
        let timeout = arm(&mut store, limits);
        let outcome = tokio::time::timeout(timeout, pre.instantiate_async(&mut store)).await;
        settle(&mut store);
        let instance = match outcome {
            Ok(Ok(instance)) => instance,
            Ok(Err(error)) => return Err(classify(store.data(), limits, Some(&error))),
            Err(_) => return Err(classify(store.data(), limits, None)),
        };
        Ok(Sandbox {
            store,
            instance,
            _slots: slots,
            limits: limits.clone(),
            failure: None,
            returned_bytes: 0,
        })
    }

    /// The fuel this instance's calls have used.
    pub(crate) fn fuel_use(&self) -> FuelUse {
        self.store.data().budget.used
    }

    /// The episode's log and the number of bytes dropped from it.
    pub(crate) fn log(&self) -> (String, u64) {
        self.store.data().log.contents()
    }

    /// Prepare a call that passes `input_bytes` of strings: refuse it if the instance already
    /// failed, the input is too large or the episode's budget is spent, then arm the call's fuel
    /// and wall-time deadline. Returns the timeout to put around the call.
    pub(crate) fn begin(&mut self, input_bytes: usize) -> Result<Duration, CallError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        if input_bytes as u64 > self.limits.input_bytes {
            return Err(CallError::new(
                ErrorKind::InputTooLarge,
                format!(
                    "{input_bytes} bytes of input, above the limit of {}",
                    self.limits.input_bytes
                ),
            ));
        }
        let budget = &self.store.data().budget;
        if budget.episode_fuel_left == 0 || Instant::now() >= budget.episode_deadline {
            let error = episode_spent(&self.limits, budget.episode_fuel_left == 0);
            return Err(self.fail(error));
        }
        Ok(arm(&mut self.store, &self.limits))
    }

    /// Turn the outcome of a guarded call into a value or a typed error, poisoning the instance
    /// on failure.
    pub(crate) fn finish<R>(
        &mut self,
        outcome: Result<wasmtime::Result<R>, tokio::time::error::Elapsed>,
    ) -> Result<R, CallError> {
        settle(&mut self.store);
        let error = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => classify(self.store.data(), &self.limits, Some(&error)),
            Err(_) => classify(self.store.data(), &self.limits, None),
        };
        Err(self.fail(error))
    }

    /// Refuse (and poison on) an output of more items or bytes than the limits allow, each
    /// item counting `ITEM_OVERHEAD_BYTES` on top of its text, and an instance whose calls have
    /// returned more than the episode may.
    pub(crate) fn check_output(&mut self, size: OutputSize) -> Result<(), CallError> {
        let max_items = self.limits.max_items;
        if size.items > max_items as usize {
            return Err(self.fail(CallError::new(
                ErrorKind::OutputTooLarge,
                format!(
                    "the call returned {} items, above the limit of {max_items} (max_items)",
                    size.items
                ),
            )));
        }
        let bytes = size.bytes as u64 + size.items as u64 * ITEM_OVERHEAD_BYTES;
        let max = self.limits.output_bytes;
        if bytes > max {
            return Err(self.fail(CallError::new(
                ErrorKind::OutputTooLarge,
                format!("the call returned {bytes} bytes, above the limit of {max}"),
            )));
        }
        self.returned_bytes += bytes;
        let episode_max = self.limits.episode_output_bytes;
        if self.returned_bytes > episode_max {
            return Err(self.fail(CallError::new(
                ErrorKind::EpisodeLimit,
                format!(
                    "the episode's calls returned {} bytes in all, above the limit of \
                     {episode_max} (episode_output_bytes)",
                    self.returned_bytes
                ),
            )));
        }
        Ok(())
    }

    /// Record a failure (its message cut to the limit), poisoning the instance. A plugin error
    /// after a refused memory growth is the memory limit's: a language whose allocator turns the
    /// refusal into an exception (Python's `MemoryError`) fails as a Rust plugin aborting does.
    pub(crate) fn fail(&mut self, error: CallError) -> CallError {
        let error = if error.kind == ErrorKind::PluginError && self.store.data().limiter.refused {
            CallError::new(
                ErrorKind::MemoryLimit,
                format!(
                    "memory growth beyond {} bytes was refused; then: {error}",
                    self.limits.memory_bytes
                ),
            )
        } else {
            error
        };
        let error = error.truncated(self.limits.error_message_bytes);
        self.failure = Some(error.clone());
        error
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// Arm a store for one call: its fuel and its wall-time deadline (checked at each epoch tick),
/// each the call's limit or what is left of the episode's, whichever is less. Returns the timeout
/// to put around the call, for a guest blocked outside its own code.
fn arm(store: &mut Store<StoreState>, limits: &Limits) -> Duration {
    let now = Instant::now();
    let budget = &mut store.data_mut().budget;
    let call_deadline = now + limits.call_timeout();
    (budget.deadline, budget.time_bound) = if budget.episode_deadline < call_deadline {
        (budget.episode_deadline, Bound::Episode)
    } else {
        (call_deadline, Bound::Call)
    };
    (budget.armed_fuel, budget.fuel_bound) = if budget.episode_fuel_left < limits.fuel {
        (budget.episode_fuel_left, Bound::Episode)
    } else {
        (limits.fuel, Bound::Call)
    };
    let (fuel, timeout) = (
        budget.armed_fuel,
        budget.deadline.saturating_duration_since(now) + TIMEOUT_GRACE,
    );
    store.set_epoch_deadline(1);
    // Cannot fail: the engine meters fuel.
    let _ = store.set_fuel(fuel);
    timeout
}

/// Count what the finished call used against its episode.
fn settle(store: &mut Store<StoreState>) {
    let left = store.get_fuel().unwrap_or(0);
    let budget = &mut store.data_mut().budget;
    let used = budget.armed_fuel.saturating_sub(left);
    budget.episode_fuel_left = budget.episode_fuel_left.saturating_sub(used);
    budget.used.total = budget.used.total.saturating_add(used);
    budget.used.max_call = budget.used.max_call.max(used);
    budget.armed_fuel = left;
}

/// The error of an episode whose fuel (`fuel_spent`) or wall time is used up.
fn episode_spent(limits: &Limits, fuel_spent: bool) -> CallError {
    let message = if fuel_spent {
        format!(
            "the episode used all of its {} fuel (episode_fuel)",
            limits.episode_fuel
        )
    } else {
        format!(
            "the episode ran past {} ms (episode_timeout_ms)",
            limits.episode_timeout_ms
        )
    };
    CallError::new(ErrorKind::EpisodeLimit, message)
}

/// The typed error of a failed call: `error` from wasmtime, or `None` when the timeout around the
/// call fired (the guest was blocked outside its own code).
fn classify(state: &StoreState, limits: &Limits, error: Option<&wasmtime::Error>) -> CallError {
    let budget = &state.budget;
    let Some(error) = error else {
        if budget.time_bound == Bound::Episode {
            return episode_spent(limits, false);
        }
        return CallError::new(
            ErrorKind::Timeout,
            format!(
                "the call ran past {} ms (blocked outside guest code)",
                limits.call_timeout_ms
            ),
        );
    };
    let detail = format!("{error:#}");
    if state.limiter.refused {
        return CallError::new(
            ErrorKind::MemoryLimit,
            format!(
                "memory growth beyond {} bytes was refused; then: {detail}",
                limits.memory_bytes
            ),
        );
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) if budget.time_bound == Bound::Episode => {
            episode_spent(limits, false)
        }
        Some(Trap::Interrupt) => CallError::new(
            ErrorKind::Timeout,
            format!("the call ran past {} ms", limits.call_timeout_ms),
        ),
        Some(Trap::OutOfFuel) if budget.fuel_bound == Bound::Episode => episode_spent(limits, true),
        Some(Trap::OutOfFuel) => CallError::new(
            ErrorKind::OutOfFuel,
            format!("the call used all of its {} fuel", limits.fuel),
        ),
        Some(Trap::StackOverflow) => {
            CallError::new(ErrorKind::Trap, format!("stack overflow: {detail}"))
        }
        _ => CallError::new(ErrorKind::Trap, detail),
    }
}

/// Run one guarded call of a sandbox: check and arm the limits, run `$call` (which may use the
/// store through `$store`) under the call timeout, classify the outcome.
macro_rules! guarded_call {
    ($sandbox:expr, $input_bytes:expr, |$store:ident| $call:expr) => {{
        let sandbox: &mut $crate::plugin::sandbox::Sandbox = $sandbox;
        let timeout = sandbox.begin($input_bytes)?;
        let outcome = {
            let $store = &mut sandbox.store;
            tokio::time::timeout(timeout, $call).await
        };
        sandbox.finish(outcome)
    }};
}
pub(crate) use guarded_call;

#[cfg(test)]
mod tests {
    use wasmtime::ResourceLimiter;

    use super::{MemoryLimiter, TABLE_ELEMENT_BYTES};

    const MIB: usize = 1 << 20;

    #[test]
    fn all_memories_and_tables_share_one_budget() {
        let mut limiter = MemoryLimiter::new(64 * MIB);
        // Three memories of 20 MiB are created; a fourth would pass the cap, as would growing
        // one of the three past it.
        for _ in 0..3 {
            assert!(limiter.memory_growing(0, 20 * MIB, None).unwrap());
        }
        assert!(!limiter.memory_growing(0, 20 * MIB, None).unwrap());
        assert!(limiter.refused);
        assert!(!limiter.memory_growing(20 * MIB, 25 * MIB, None).unwrap());
        assert!(limiter.memory_growing(20 * MIB, 24 * MIB, None).unwrap());
        // Tables count their elements against the same budget, which is now spent.
        assert_eq!(limiter.used_bytes, 64 * MIB);
        assert!(!limiter.table_growing(0, 1, None).unwrap());
        let mut roomy = MemoryLimiter::new(MIB);
        assert!(roomy.table_growing(0, 1000, None).unwrap());
        assert_eq!(roomy.used_bytes, 1000 * TABLE_ELEMENT_BYTES);
    }
}
