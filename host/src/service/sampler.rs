//! The sampling loop: one thread owns a [`SamplingEngine`] and serves requests from any number
//! of episodes (async tasks), so that every episode waiting for a completion decodes in the same
//! batch. Requests that arrive while a step runs join at the next step (continuous batching).
//!
//! Requests wait in per-tenant queues and reach the engine by fair queueing over their cost
//! (prompt plus sampled tokens, [`FairQueue`]); the engine is kept only a few requests ahead
//! of what it runs, so a tenant that sends many requests does not queue everyone behind them.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use super::fair::{Divisible, FairQueue, Taken};
use super::usage::Usage;
use crate::sample::{
    RequestId, SampleError, SampleOutput, SampleRequest, SamplerBackend, SamplingEngine,
};

/// Requests handed to the engine beyond those it runs (when several tenants wait): enough to
/// fill a step's free room, few enough that the fair queue decides the order.
const ENGINE_AHEAD: usize = 8;

/// Why a sampling request failed.
#[derive(Debug, thiserror::Error)]
pub enum SamplerServiceError {
    /// The loop has ended.
    #[error("the sampler has stopped")]
    Stopped,
    /// The engine refused the request (bad input); nothing ran.
    #[error(transparent)]
    Refused(#[from] SampleError),
    /// A decoding step failed while the request ran; every request of that step failed with it.
    #[error("sampling step failed: {0}")]
    StepFailed(String),
}

impl SamplerServiceError {
    /// Whether the request itself was at fault (sending it again would fail the same way).
    pub fn is_refusal(&self) -> bool {
        matches!(self, SamplerServiceError::Refused(refusal) if !matches!(refusal, SampleError::Backend(_)))
    }
}

type Reply = oneshot::Sender<Result<SampleOutput, SamplerServiceError>>;

enum Command {
    /// A tenant's share relative to others'.
    Weight { tenant: String, weight: u64 },
    Sample {
        tenant: String,
        request: Box<SampleRequest>,
        reply: Reply,
    },
}

/// A request waiting for the engine; taken whole (a request is never split).
struct Pending {
    request: Box<SampleRequest>,
    reply: Reply,
}

impl Divisible for Pending {
    type Part = std::convert::Infallible;

    fn cost(&self) -> u64 {
        let params = &self.request.params;
        let sampled = params.max_tokens.saturating_mul(params.num_samples);
        self.request.prompt.len().saturating_add(sampled) as u64
    }

    fn unit_cost(&self) -> u64 {
        self.cost()
    }

    fn split(&mut self, _budget: u64) -> Option<Self::Part> {
        None
    }
}

/// A handle to the sampling loop; clone it freely. The loop ends when every handle is dropped.
#[derive(Clone)]
pub struct SamplerService {
    commands: mpsc::Sender<Command>,
    usage: Usage,
}

impl SamplerService {
    /// Start the loop on its own thread.
    pub fn start<B: SamplerBackend + 'static>(engine: SamplingEngine<B>) -> (Self, JoinHandle<()>) {
        let (commands, receiver) = mpsc::channel();
        let usage = Usage::default();
        let counted = usage.clone();
        let thread = std::thread::Builder::new()
            .name("opentinker-sampler".into())
            .spawn(move || serve(engine, receiver, counted))
            .expect("spawning the sampler thread");
        (SamplerService { commands, usage }, thread)
    }

    /// The tokens sampled for each tenant so far, and its requests waiting.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// Sample `request`; resolves when all its samples are done.
    pub async fn sample(
        &self,
        request: SampleRequest,
    ) -> Result<SampleOutput, SamplerServiceError> {
        self.sample_for("", request).await
    }

    /// Give `tenant` `weight` times an equal share of the engine.
    pub fn set_weight(&self, tenant: &str, weight: u64) {
        // A stopped loop has nobody to share with.
        let _ = self.commands.send(Command::Weight {
            tenant: tenant.to_string(),
            weight,
        });
    }

    /// Sample `request` on behalf of `tenant`, whose share of the engine is fair.
    pub async fn sample_for(
        &self,
        tenant: &str,
        request: SampleRequest,
    ) -> Result<SampleOutput, SamplerServiceError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Sample {
                tenant: tenant.to_string(),
                request: Box::new(request),
                reply,
            })
            .map_err(|_| SamplerServiceError::Stopped)?;
        answer.await.map_err(|_| SamplerServiceError::Stopped)?
    }
}

fn serve<B: SamplerBackend>(
    mut engine: SamplingEngine<B>,
    commands: mpsc::Receiver<Command>,
    usage: Usage,
) {
    let mut waiting: HashMap<RequestId, Reply> = HashMap::new();
    // The cost unit is a token; one request per take is enough to keep the engine fed.
    let mut queue: FairQueue<Pending> = FairQueue::new(256).counting(usage);
    loop {
        if !engine.has_work() && queue.is_empty() {
            match commands.recv() {
                Ok(command) => enqueue(&mut queue, command),
                Err(_) => return,
            }
        }
        while let Ok(command) = commands.try_recv() {
            enqueue(&mut queue, command);
        }
        // With one tenant there is nobody to be fair to: everything goes in at once (the
        // engine admits what fits, in order).
        while !queue.is_empty() && (engine.load().0 < ENGINE_AHEAD || queue.busy_tenants() == 1) {
            for (_, taken) in queue.take(1) {
                match taken {
                    Taken::Whole(pending) => accept(&mut engine, &mut waiting, pending),
                    Taken::Part(never) => match never {},
                }
            }
        }
        // A request whose asker has gone (a streamed answer's client hung up) frees its
        // samples' slots and KV now rather than when it would have finished.
        waiting.retain(|&id, reply| {
            let gone = reply.is_closed();
            if gone {
                engine.abort(id);
            }
            !gone
        });
        if !engine.has_work() {
            continue;
        }
        match engine.decode_step() {
            Ok(finished) => {
                for output in finished {
                    if let Some(reply) = waiting.remove(&output.id) {
                        let _ = reply.send(Ok(output));
                    }
                }
            }
            Err(error) => {
                // A failed step leaves the running requests in an unknown state: fail them all.
                let message = error.to_string();
                for (id, reply) in waiting.drain() {
                    engine.abort(id);
                    let _ = reply.send(Err(SamplerServiceError::StepFailed(message.clone())));
                }
            }
        }
    }
}

fn enqueue(queue: &mut FairQueue<Pending>, command: Command) {
    match command {
        Command::Weight { tenant, weight } => queue.set_weight(&tenant, weight),
        Command::Sample {
            tenant,
            request,
            reply,
        } => queue.push(&tenant, Pending { request, reply }),
    }
}

/// Queue a request in the engine, or answer its refusal at once.
fn accept<B: SamplerBackend>(
    engine: &mut SamplingEngine<B>,
    waiting: &mut HashMap<RequestId, Reply>,
    pending: Pending,
) {
    if pending.reply.is_closed() {
        return;
    }
    match engine.add_request(*pending.request) {
        Ok(id) => {
            waiting.insert(id, pending.reply);
        }
        Err(error) => {
            // The asker may have gone; nothing to do then.
            let _ = pending.reply.send(Err(error.into()));
        }
    }
}
