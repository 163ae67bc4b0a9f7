//! The training loop: one thread owns a base model's [`TrainingEngine`] and serves the training
//! work of every job and tenant that trains adapters on that base. Work is served in clock
//! cycles: a cycle takes the calls that have arrived when it starts, runs the other calls in
//! order, then fuses waiting `forward_backward` calls into one mixed batch (rows grouped by
//! adapter), so callers that train at the same moment share one pass.
//!
//! Which `forward_backward` work a pass takes is decided by deficit round robin over tenants
//! ([`FairQueue`]) with a token budget per pass: every busy tenant gets the same share of tokens,
//! and a call larger than its share is taken in slices of whole datums over several passes (its
//! gradients accumulate as if it had run at once), so a small call never waits behind a huge one
//! for long. With no budget (`FairShare::unlimited`, what `opentinker train` uses), a pass takes
//! every waiting call, as one fused batch.
//!
//! A caller's calls are awaited one at a time, so a cycle holds at most one call per model and
//! the fused calls touch different adapters: running them together, after the cycle's other
//! calls, changes nothing a caller can see but the numbers' last bits (a fused pass pads rows to
//! the longest of all its datums).
//!
//! A loop can also host *guest* engines ([`TrainerService::attach`]): a model of a job's own (a
//! full-parameter warm-up's copy of the base, the base it made) trains on the loop's thread, its
//! `forward_backward` work in the same fair queue as every tenant's adapters and counted in the
//! same usage, so a job that makes a model of its own takes its tenant's share of the passes and
//! no more. A pass runs each engine's slices as one fused batch of that engine.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::anticipate::Anticipation;
use super::fair::{Divisible, FairQueue, Taken, TenantKey};
use super::usage::Usage;
use crate::train::{ItemOutput, TrainError, TrainingEngine, WorkItem};

/// Why a call to the training loop failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainerServiceError {
    /// The loop has ended, or the call panicked.
    #[error("the trainer has stopped (or the call panicked)")]
    Stopped,
    #[error(transparent)]
    Train(#[from] TrainError),
}

type Outputs = Result<Vec<ItemOutput>, TrainError>;

/// A call run alone, in arrival order, with the engine to itself.
type Exclusive = Box<dyn FnOnce(&mut TrainingEngine) + Send>;

/// Which engine of a loop a call is for: the loop's own ([`OWN_ENGINE`]) or a guest.
type EngineId = u64;

/// The engine a loop was started with.
const OWN_ENGINE: EngineId = 0;

/// Numbers the guest engines of every loop (an id is never reused).
static NEXT_GUEST: AtomicU64 = AtomicU64::new(OWN_ENGINE + 1);

enum Command {
    Exclusive(EngineId, Exclusive),
    /// Host `engine` on the loop as `EngineId`.
    Attach(EngineId, Box<TrainingEngine>),
    /// Drop a guest engine (its last handle is gone).
    Detach(EngineId),
    /// A tenant's share relative to others'.
    Weight {
        tenant: TenantKey,
        weight: u64,
    },
    ForwardBackward {
        engine: EngineId,
        tenant: TenantKey,
        items: Vec<WorkItem>,
        reply: oneshot::Sender<Outputs>,
        /// When the caller sent it (the loop may be in a pass when it arrives).
        sent: std::time::Instant,
        /// Run right after the call's last pass, before anything else.
        then: Option<Exclusive>,
    },
}

/// How the loop shares passes between tenants.
#[derive(Clone, Copy, Debug)]
pub struct FairShare {
    /// Tokens (input positions) a fused pass takes at most (a single datum may exceed it).
    pub pass_tokens: u64,
    /// Tokens each busy tenant earns per round of the deficit round robin.
    pub quantum: u64,
    /// The time a pass should take: passes are sized from the tokens per second measured so
    /// far (at most `pass_tokens`), so that a call that arrives while one runs waits about this
    /// long. `None`: always `pass_tokens`.
    pub cycle: Option<std::time::Duration>,
    /// Tokens a pass takes at most while one tenant alone has work: more than a timed pass,
    /// since nobody waits behind it (a newcomer waits for one such pass at most, then passes are
    /// `cycle` long) and every pass costs a little besides its tokens. Counted in tokens, not
    /// time, so that a lone caller's passes depend on its own calls only and its results are
    /// reproducible (datums are padded to the longest of their pass). `None`: as `cycle`.
    pub solo_pass_tokens: Option<u64>,
    /// How long the loop may wait, after answering a small call, for the same tenant's next
    /// call before it starts a pass of others' work (`Anticipation`). `None`: never waits.
    pub anticipate: Option<std::time::Duration>,
}

impl FairShare {
    /// Every waiting call in one pass: no slicing, no reordering between tenants.
    pub fn unlimited() -> Self {
        FairShare {
            pass_tokens: u64::MAX,
            quantum: u64::MAX / 4,
            cycle: None,
            solo_pass_tokens: None,
            anticipate: None,
        }
    }
}

/// The fewest tokens a timed pass takes (a measured rate can be off at the start).
const MIN_PASS_TOKENS: u64 = 64;

/// Tokens per second of the passes so far, as a moving average.
struct Rate {
    tokens_per_second: Option<f64>,
}

impl Rate {
    /// The tokens of the next pass, with `busy` tenants waiting.
    fn budget(&self, share: &FairShare, busy: usize) -> u64 {
        if busy <= 1
            && let Some(tokens) = share.solo_pass_tokens
        {
            return tokens.min(share.pass_tokens);
        }
        match (share.cycle, self.tokens_per_second) {
            (None, _) => share.pass_tokens,
            (Some(_), None) => MIN_PASS_TOKENS.min(share.pass_tokens),
            (Some(cycle), Some(rate)) => ((rate * cycle.as_secs_f64()) as u64)
                .clamp(MIN_PASS_TOKENS, share.pass_tokens.max(MIN_PASS_TOKENS)),
        }
    }

    fn observe(&mut self, tokens: u64, elapsed: std::time::Duration) {
        let seconds = elapsed.as_secs_f64();
        if tokens == 0 || seconds <= 0.0 {
            return;
        }
        let rate = tokens as f64 / seconds;
        self.tokens_per_second = Some(match self.tokens_per_second {
            Some(old) => 0.8 * old + 0.2 * rate,
            None => rate,
        });
    }
}

/// A handle to the training loop; clone it freely. The loop ends when every handle is dropped.
#[derive(Clone)]
pub struct TrainerService {
    commands: mpsc::Sender<Command>,
    usage: Usage,
    /// The engine this handle's calls run on.
    engine: EngineId,
    /// For a guest engine: frees it when the last handle to it is dropped.
    _guest: Option<Arc<GuestLease>>,
}

/// Frees a guest engine on its loop when dropped.
struct GuestLease {
    id: EngineId,
    commands: mpsc::Sender<Command>,
}

impl Drop for GuestLease {
    fn drop(&mut self) {
        // A stopped loop has already dropped its engines.
        let _ = self.commands.send(Command::Detach(self.id));
    }
}

impl TrainerService {
    /// Start the loop on its own thread, every waiting call fused into one pass.
    pub fn start(engine: TrainingEngine) -> (Self, JoinHandle<()>) {
        Self::start_sharing(engine, FairShare::unlimited())
    }

    /// Start the loop on its own thread, sharing passes between tenants as `share` says.
    pub fn start_sharing(engine: TrainingEngine, share: FairShare) -> (Self, JoinHandle<()>) {
        let (commands, receiver) = mpsc::channel();
        let usage = Usage::default();
        let counted = usage.clone();
        let thread = std::thread::Builder::new()
            .name("opentinker-trainer".into())
            .spawn(move || serve(engine, receiver, share, counted))
            .expect("spawning the trainer thread");
        let service = TrainerService {
            commands,
            usage,
            engine: OWN_ENGINE,
            _guest: None,
        };
        (service, thread)
    }

    /// Host `engine` on this loop as a guest: the returned handle's calls run on it, on the
    /// loop's thread, its `forward_backward` work taken by the same fair queue as the loop's own
    /// (and counted in the same usage). The engine is dropped when the last handle to it is.
    pub fn attach(&self, engine: TrainingEngine) -> TrainerService {
        let id = NEXT_GUEST.fetch_add(1, Ordering::Relaxed);
        // A stopped loop drops the engine; the handle's calls then answer `Stopped`.
        let _ = self.commands.send(Command::Attach(id, Box::new(engine)));
        TrainerService {
            commands: self.commands.clone(),
            usage: self.usage.clone(),
            engine: id,
            _guest: Some(Arc::new(GuestLease {
                id,
                commands: self.commands.clone(),
            })),
        }
    }

    /// The tokens trained for each tenant so far, and its calls waiting.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Run `work` on the engine alone (adding, loading or saving adapters, a `forward`, an
    /// `optim_step`): the calls that are not fused.
    pub async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut TrainingEngine) -> T + Send + 'static,
    ) -> Result<T, TrainerServiceError> {
        let (reply, answer) = oneshot::channel();
        let call: Exclusive = Box::new(move |engine| {
            // The asker may have gone; nothing to do then.
            let _ = reply.send(work(engine));
        });
        self.commands
            .send(Command::Exclusive(self.engine, call))
            .map_err(|_| TrainerServiceError::Stopped)?;
        answer.await.map_err(|_| TrainerServiceError::Stopped)
    }

    /// Run `work` on the engine alone, without waiting for it (work that must happen even where
    /// nothing can await it, such as freeing a job's adapters when the job is dropped).
    pub fn detach(&self, work: impl FnOnce(&mut TrainingEngine) + Send + 'static) {
        // A stopped loop has nothing left to free.
        let _ = self
            .commands
            .send(Command::Exclusive(self.engine, Box::new(work)));
    }

    /// Give `tenant` `weight` times an equal share of the passes.
    pub fn set_weight(&self, tenant: &str, weight: u64) {
        // A stopped loop has nobody to share with.
        let _ = self.commands.send(Command::Weight {
            tenant: tenant.to_string(),
            weight,
        });
    }

    /// `forward_backward` of `items`, fused with the other jobs' calls of the same cycle.
    pub async fn forward_backward(
        &self,
        items: Vec<WorkItem>,
    ) -> Result<Vec<ItemOutput>, TrainerServiceError> {
        self.forward_backward_for("", items).await
    }

    /// `forward_backward` of `items` on behalf of `tenant`, whose share of passes is fair.
    pub async fn forward_backward_for(
        &self,
        tenant: &str,
        items: Vec<WorkItem>,
    ) -> Result<Vec<ItemOutput>, TrainerServiceError> {
        self.send_forward_backward(tenant, items, None).await
    }

    /// `forward_backward_for`, then `then` on the engine right after the call's last pass (to
    /// read the adapters it changed without waiting for another cycle). `then`'s result is
    /// `None` if the call failed.
    pub async fn forward_backward_then<T: Send + 'static>(
        &self,
        tenant: &str,
        items: Vec<WorkItem>,
        then: impl FnOnce(&mut TrainingEngine) -> T + Send + 'static,
    ) -> Result<(Vec<ItemOutput>, Option<T>), TrainerServiceError> {
        let (sender, result) = oneshot::channel();
        let then: Exclusive = Box::new(move |engine| {
            let _ = sender.send(then(engine));
        });
        let outputs = self
            .send_forward_backward(tenant, items, Some(then))
            .await?;
        Ok((outputs, result.await.ok()))
    }

    async fn send_forward_backward(
        &self,
        tenant: &str,
        items: Vec<WorkItem>,
        then: Option<Exclusive>,
    ) -> Result<Vec<ItemOutput>, TrainerServiceError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::ForwardBackward {
                engine: self.engine,
                tenant: tenant.to_string(),
                items,
                reply,
                sent: std::time::Instant::now(),
                then,
            })
            .map_err(|_| TrainerServiceError::Stopped)?;
        Ok(answer.await.map_err(|_| TrainerServiceError::Stopped)??)
    }
}

/// The datums of a `forward_backward` call not yet run, as (item index, item with those datums).
struct Remaining {
    call: u64,
    engine: EngineId,
    pieces: std::collections::VecDeque<(usize, WorkItem)>,
}

/// A slice of a call: some of its datums, by item.
struct Slice {
    call: u64,
    engine: EngineId,
    pieces: Vec<(usize, WorkItem)>,
}

fn tokens(item: &WorkItem) -> u64 {
    item.datums
        .iter()
        .map(|d| d.input_tokens.len().max(1) as u64)
        .sum()
}

impl Divisible for Remaining {
    type Part = Slice;

    fn cost(&self) -> u64 {
        self.pieces.iter().map(|(_, item)| tokens(item)).sum()
    }

    fn unit_cost(&self) -> u64 {
        self.pieces
            .iter()
            .find_map(|(_, item)| item.datums.first())
            .map_or(0, |d| d.input_tokens.len().max(1) as u64)
    }

    fn split(&mut self, budget: u64) -> Option<Slice> {
        let mut slice = Slice {
            call: self.call,
            engine: self.engine,
            pieces: Vec::new(),
        };
        let mut spent = 0;
        while let Some((index, item)) = self.pieces.front_mut() {
            let mut taken = Vec::new();
            while let Some(datum) = item.datums.first() {
                let cost = datum.input_tokens.len().max(1) as u64;
                if spent + cost > budget {
                    break;
                }
                spent += cost;
                taken.push(item.datums.remove(0));
            }
            if !taken.is_empty() {
                slice.pieces.push((*index, item.part(taken)));
            }
            if !item.datums.is_empty() {
                break;
            }
            self.pieces.pop_front();
        }
        (!slice.pieces.is_empty()).then_some(slice)
    }
}

/// A call being served: its outputs so far, and where to answer.
struct Call {
    tenant: TenantKey,
    /// The engine it runs on (its `then` too).
    engine: EngineId,
    /// It costs at most a quantum: its tenant may be waited for after it ([`Anticipation`]).
    small: bool,
    outputs: Vec<ItemOutput>,
    reply: oneshot::Sender<Outputs>,
    then: Option<Exclusive>,
    /// Set when a slice failed: the call is answered then, and its later slices are dropped.
    failed: bool,
}

/// Add a slice's output of one item to what the call has so far.
fn merge(into: &mut ItemOutput, part: ItemOutput) {
    into.logprobs.extend(part.logprobs);
    into.loss += part.loss;
    for (key, value) in part.metrics {
        let slot = into
            .metrics
            .entry(key.clone())
            .or_insert(match key.rsplit(':').next() {
                Some("max") => f64::NEG_INFINITY,
                Some("min") => f64::INFINITY,
                _ => 0.0,
            });
        *slot = match key.rsplit(':').next() {
            Some("max") => slot.max(value),
            Some("min") => slot.min(value),
            _ => *slot + value,
        };
    }
}

/// The loop's state between passes.
struct Loop {
    /// The loop's own engine ([`OWN_ENGINE`]) and its guests.
    engines: HashMap<EngineId, TrainingEngine>,
    queue: FairQueue<Remaining>,
    calls: HashMap<u64, Call>,
    next_call: u64,
    quantum: u64,
    anticipation: Option<Anticipation>,
}

impl Loop {
    /// Run or queue one command.
    fn accept(&mut self, command: Command) {
        match command {
            Command::Exclusive(engine, call) => {
                // A call for an engine that is gone is dropped: its caller hears the trainer
                // stopped.
                if let Some(engine) = self.engines.get_mut(&engine) {
                    // A panicking call drops its answer (its caller hears the trainer stopped);
                    // the other callers' work goes on.
                    let _ = catch_unwind(AssertUnwindSafe(|| call(engine)));
                }
            }
            Command::Attach(id, engine) => {
                self.engines.insert(id, *engine);
            }
            Command::Detach(id) => {
                self.engines.remove(&id);
            }
            Command::Weight { tenant, weight } => self.queue.set_weight(&tenant, weight),
            Command::ForwardBackward {
                engine,
                tenant,
                items,
                reply,
                sent,
                then,
            } => {
                if let Some(anticipation) = &mut self.anticipation {
                    anticipation.arrived(&tenant, sent);
                }
                self.next_call += 1;
                let small = items.iter().map(tokens).sum::<u64>() <= self.quantum;
                self.calls.insert(
                    self.next_call,
                    Call {
                        tenant: tenant.clone(),
                        engine,
                        small,
                        outputs: vec![ItemOutput::default(); items.len()],
                        reply,
                        then,
                        failed: false,
                    },
                );
                self.queue.push(
                    &tenant,
                    Remaining {
                        call: self.next_call,
                        engine,
                        pieces: items.into_iter().enumerate().collect(),
                    },
                );
            }
        }
    }

    /// Before a pass: wait for the next call of a tenant just answered, as long as
    /// [`Anticipation`] says. `false`: every handle is gone.
    fn anticipate(&mut self, commands: &mpsc::Receiver<Command>) -> bool {
        loop {
            let now = std::time::Instant::now();
            let Some((tenant, deadline)) = self.anticipation.as_ref().and_then(|a| a.wait_for(now))
            else {
                return true;
            };
            if self.queue.has_work(&tenant) {
                return true;
            }
            match commands.recv_timeout(deadline - now) {
                Ok(command) => self.accept(command),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(anticipation) = &mut self.anticipation {
                        anticipation.gave_up(&tenant);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// One pass: each engine's slices as one fused `forward_backward`.
    fn run(&mut self, slices: Vec<Slice>) {
        let mut by_engine: BTreeMap<EngineId, Vec<Slice>> = BTreeMap::new();
        for slice in slices {
            by_engine.entry(slice.engine).or_default().push(slice);
        }
        for (id, slices) in by_engine {
            match self.engines.get_mut(&id) {
                Some(engine) => {
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        forward_backward_fused(engine, &mut self.calls, slices)
                    }));
                }
                // Its caller holds a handle to it, so a guest cannot be gone; were it, the
                // calls are dropped and their callers hear the trainer stopped.
                None => {
                    for slice in slices {
                        self.calls.remove(&slice.call);
                    }
                }
            }
        }
    }

    /// Answer call `id`, whose last slice has run.
    fn finish(&mut self, id: u64) {
        let Some(call) = self.calls.remove(&id) else {
            return;
        };
        if call.failed {
            return;
        }
        if let Some(then) = call.then
            && let Some(engine) = self.engines.get_mut(&call.engine)
        {
            let _ = catch_unwind(AssertUnwindSafe(|| then(engine)));
        }
        let _ = call.reply.send(Ok(call.outputs));
        if let Some(anticipation) = &mut self.anticipation
            && call.small
            && !self.queue.has_work(&call.tenant)
        {
            anticipation.answered(&call.tenant, std::time::Instant::now());
        }
    }
}

fn serve(
    engine: TrainingEngine,
    commands: mpsc::Receiver<Command>,
    share: FairShare,
    usage: Usage,
) {
    let mut state = Loop {
        engines: HashMap::from([(OWN_ENGINE, engine)]),
        queue: FairQueue::new(share.quantum).counting(usage),
        calls: HashMap::new(),
        next_call: 0,
        quantum: share.quantum,
        anticipation: share.anticipate.map(Anticipation::new),
    };
    let mut rate = Rate {
        tokens_per_second: None,
    };
    loop {
        // Wait for work only when none is queued.
        let first = match state.queue.is_empty() {
            true => match commands.recv() {
                Ok(command) => Some(command),
                Err(_) => return,
            },
            false => None,
        };
        // The cycle: what has arrived by now; later calls wait for the next one.
        for command in first.into_iter().chain(commands.try_iter()) {
            state.accept(command);
        }
        if state.queue.is_empty() {
            continue;
        }
        if !state.anticipate(&commands) {
            return;
        }
        let mut slices = Vec::new();
        let mut finishing = Vec::new();
        let budget = rate.budget(&share, state.queue.busy_tenants());
        for (_, taken) in state.queue.take(budget) {
            match taken {
                Taken::Whole(rest) => {
                    finishing.push(rest.call);
                    slices.push(Slice {
                        call: rest.call,
                        engine: rest.engine,
                        pieces: rest.pieces.into_iter().collect(),
                    });
                }
                Taken::Part(slice) => slices.push(slice),
            }
        }
        slices.retain(|s| state.calls.get(&s.call).is_some_and(|c| !c.failed));
        let tokens: u64 = slices
            .iter()
            .flat_map(|s| &s.pieces)
            .map(|(_, item)| tokens(item))
            .sum();
        let started = std::time::Instant::now();
        state.run(slices);
        let elapsed = started.elapsed();
        tracing::debug!(tokens, ?elapsed, budget, "training pass");
        rate.observe(tokens, elapsed);
        for id in finishing {
            state.finish(id);
        }
    }
}

/// Fail call `id` with `error` now; its later slices are dropped.
fn fail(calls: &mut HashMap<u64, Call>, id: u64, error: TrainError) {
    if let Some(call) = calls.get_mut(&id)
        && !call.failed
    {
        call.failed = true;
        let (reply, _) = oneshot::channel();
        let reply = std::mem::replace(&mut call.reply, reply);
        let _ = reply.send(Err(error));
    }
}

/// One `forward_backward` over every slice, each slice's outputs added to its call's. If the
/// engine refuses the fused pass (a bad datum, a custom loss that does not fit its datums, an
/// objective that gives no answer, an unknown adapter: found before any gradient is
/// accumulated), each call's slice runs alone, so one caller's bad input fails only that caller.
fn forward_backward_fused(
    engine: &mut TrainingEngine,
    calls: &mut HashMap<u64, Call>,
    slices: Vec<Slice>,
) {
    let mut all = Vec::new();
    let mut owners = Vec::new();
    for slice in &slices {
        for (index, item) in &slice.pieces {
            all.push(item.clone());
            owners.push((slice.call, *index));
        }
    }
    if all.is_empty() {
        return;
    }
    tracing::debug!(
        slices = slices.len(),
        items = all.len(),
        "fused forward_backward"
    );
    let record =
        |calls: &mut HashMap<u64, Call>, owners: &[(u64, usize)], outputs: Vec<ItemOutput>| {
            for (&(id, index), output) in owners.iter().zip(outputs) {
                if let Some(call) = calls.get_mut(&id) {
                    merge(&mut call.outputs[index], output);
                }
            }
        };
    match engine.forward_backward(&all) {
        Ok(outputs) => record(calls, &owners, outputs),
        Err(error) if error.is_refusal() && slices.len() > 1 => {
            for slice in slices {
                let items: Vec<WorkItem> = slice.pieces.iter().map(|(_, i)| i.clone()).collect();
                let owners: Vec<(u64, usize)> = slice
                    .pieces
                    .iter()
                    .map(|(index, _)| (slice.call, *index))
                    .collect();
                match engine.forward_backward(&items) {
                    Ok(outputs) => record(calls, &owners, outputs),
                    Err(error) => fail(calls, slice.call, error),
                }
            }
        }
        Err(error) if error.is_refusal() => {
            if let Some(slice) = slices.first() {
                fail(calls, slice.call, error);
            }
        }
        // A failure while computing may have left some gradients accumulated: running the
        // slices again would count them twice, so every call of the pass fails.
        Err(error) => {
            let message = format!("a fused training pass failed: {error}");
            for slice in &slices {
                let error = candle_core::Error::Msg(message.clone());
                fail(calls, slice.call, TrainError::Candle(error));
            }
        }
    }
}
