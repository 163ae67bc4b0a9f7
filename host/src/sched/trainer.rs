//! The training loop: one thread owns a base model's [`TrainingEngine`] and serves the training
//! work of every job that trains adapters on that base. Work is served in clock cycles: a cycle
//! takes the calls that have arrived when it starts (later ones wait for the next cycle), runs
//! the other calls in order, then fuses every `forward_backward` among them into one mixed batch
//! (rows grouped by adapter), so jobs that train at the same moment share one pass.
//!
//! A job's calls are awaited one at a time, so a cycle holds at most one call per job and the
//! fused calls of a cycle touch different adapters: running them together, after the cycle's
//! other calls, changes nothing a job can see but the numbers' last bits (a fused pass pads rows
//! to the longest of all its datums).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

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

enum Command {
    Exclusive(Exclusive),
    ForwardBackward(Vec<WorkItem>, oneshot::Sender<Outputs>),
}

/// A handle to the training loop; clone it freely. The loop ends when every handle is dropped.
#[derive(Clone)]
pub struct TrainerService {
    commands: mpsc::Sender<Command>,
}

impl TrainerService {
    /// Start the loop on its own thread.
    pub fn start(engine: TrainingEngine) -> (Self, JoinHandle<()>) {
        let (commands, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("opentinker-trainer".into())
            .spawn(move || serve(engine, receiver))
            .expect("spawning the trainer thread");
        (TrainerService { commands }, thread)
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
            .send(Command::Exclusive(call))
            .map_err(|_| TrainerServiceError::Stopped)?;
        answer.await.map_err(|_| TrainerServiceError::Stopped)
    }

    /// Run `work` on the engine alone, without waiting for it (work that must happen even where
    /// nothing can await it, such as freeing a job's adapters when the job is dropped).
    pub fn detach(&self, work: impl FnOnce(&mut TrainingEngine) + Send + 'static) {
        // A stopped loop has nothing left to free.
        let _ = self.commands.send(Command::Exclusive(Box::new(work)));
    }

    /// `forward_backward` of `items`, fused with the other jobs' calls of the same cycle.
    pub async fn forward_backward(
        &self,
        items: Vec<WorkItem>,
    ) -> Result<Vec<ItemOutput>, TrainerServiceError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::ForwardBackward(items, reply))
            .map_err(|_| TrainerServiceError::Stopped)?;
        Ok(answer.await.map_err(|_| TrainerServiceError::Stopped)??)
    }
}

fn serve(mut engine: TrainingEngine, commands: mpsc::Receiver<Command>) {
    while let Ok(first) = commands.recv() {
        // The cycle: what has arrived by now; later calls wait for the next one.
        let cycle: Vec<Command> = std::iter::once(first).chain(commands.try_iter()).collect();
        let mut fused = Vec::new();
        for command in cycle {
            match command {
                Command::Exclusive(call) => {
                    // A panicking call drops its answer (its caller hears the trainer stopped);
                    // the other jobs' work goes on.
                    let _ = catch_unwind(AssertUnwindSafe(|| call(&mut engine)));
                }
                Command::ForwardBackward(items, reply) => fused.push((items, reply)),
            }
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            forward_backward_fused(&mut engine, fused)
        }));
    }
}

/// One `forward_backward` over every call's items, each call answered with its own outputs. If
/// the engine refuses the fused pass (a bad datum, an unknown adapter: found before it computes
/// anything), each call runs alone, so one job's bad input fails only that job.
fn forward_backward_fused(
    engine: &mut TrainingEngine,
    calls: Vec<(Vec<WorkItem>, oneshot::Sender<Outputs>)>,
) {
    if calls.len() < 2 {
        for (items, reply) in calls {
            let _ = reply.send(engine.forward_backward(&items));
        }
        return;
    }
    let mut sizes = Vec::with_capacity(calls.len());
    let mut replies = Vec::with_capacity(calls.len());
    let mut all = Vec::new();
    for (items, reply) in calls {
        sizes.push(items.len());
        replies.push(reply);
        all.extend(items);
    }
    tracing::debug!(
        calls = sizes.len(),
        items = all.len(),
        "fused forward_backward"
    );
    match engine.forward_backward(&all) {
        Ok(outputs) => {
            let mut outputs = outputs.into_iter();
            for (size, reply) in sizes.into_iter().zip(replies) {
                let _ = reply.send(Ok(outputs.by_ref().take(size).collect()));
            }
        }
        Err(TrainError::BadDatum { .. } | TrainError::UnknownAdapter(_)) => {
            let mut rest = all.as_slice();
            for (size, reply) in sizes.into_iter().zip(replies) {
                let (items, after) = rest.split_at(size);
                rest = after;
                let _ = reply.send(engine.forward_backward(items));
            }
        }
        // A failure while computing may have left some gradients accumulated: running the
        // calls again would count them twice, so every call of the pass fails.
        Err(error) => {
            let message = format!("a fused training pass failed: {error}");
            for reply in replies {
                let error = candle_core::Error::Msg(message.clone());
                let _ = reply.send(Err(TrainError::Candle(error)));
            }
        }
    }
}
