//! The sampling loop: one thread owns a [`SamplingEngine`] and serves requests from any number
//! of episodes (async tasks), so that every episode waiting for a completion decodes in the same
//! batch. Requests that arrive while a step runs join at the next step (continuous batching).

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::sample::{RequestId, SampleError, SampleOutput, SampleRequest, SamplingEngine};

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
        matches!(self, SamplerServiceError::Refused(refusal) if !matches!(refusal, SampleError::Model(_)))
    }
}

type Reply = oneshot::Sender<Result<SampleOutput, SamplerServiceError>>;

enum Command {
    Sample(Box<SampleRequest>, Reply),
}

/// A handle to the sampling loop; clone it freely. The loop ends when every handle is dropped.
#[derive(Clone)]
pub struct SamplerService {
    commands: mpsc::Sender<Command>,
}

impl SamplerService {
    /// Start the loop on its own thread.
    pub fn start(engine: SamplingEngine) -> (Self, JoinHandle<()>) {
        let (commands, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("opentinker-sampler".into())
            .spawn(move || serve(engine, receiver))
            .expect("spawning the sampler thread");
        (SamplerService { commands }, thread)
    }

    /// Sample `request`; resolves when all its samples are done.
    pub async fn sample(
        &self,
        request: SampleRequest,
    ) -> Result<SampleOutput, SamplerServiceError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Sample(Box::new(request), reply))
            .map_err(|_| SamplerServiceError::Stopped)?;
        answer.await.map_err(|_| SamplerServiceError::Stopped)?
    }
}

fn serve(mut engine: SamplingEngine, commands: mpsc::Receiver<Command>) {
    let mut waiting: HashMap<RequestId, Reply> = HashMap::new();
    loop {
        if !engine.has_work() {
            match commands.recv() {
                Ok(command) => accept(&mut engine, &mut waiting, command),
                Err(_) => return,
            }
        }
        while let Ok(command) = commands.try_recv() {
            accept(&mut engine, &mut waiting, command);
        }
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

/// Queue a request in the engine, or answer its refusal at once.
fn accept(engine: &mut SamplingEngine, waiting: &mut HashMap<RequestId, Reply>, command: Command) {
    match command {
        Command::Sample(request, reply) => match engine.add_request(*request) {
            Ok(id) => {
                waiting.insert(id, reply);
            }
            Err(error) => {
                // The asker may have gone; nothing to do then.
                let _ = reply.send(Err(error.into()));
            }
        },
    }
}
