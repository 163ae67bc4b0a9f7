//! Rollouts on a NATS JetStream work queue: the driver publishes each [`GroupTask`] and
//! gathers its [`PlayedGroup`]; stateless workers, in any number of processes, pull tasks,
//! play them and publish what they played.
//!
//! Two streams, both on file storage so that a restarted queue server loses nothing:
//! `OPENTINKER_TASKS` (subjects `opentinker.tasks.<pool>.<job>`, work-queue retention: a task is
//! gone once a worker acknowledges it) and `OPENTINKER_PLAYED` (subjects
//! `opentinker.played.<pool>.<job>`, read by the job's durable driver consumer). A driver names
//! its job on the queue by the job's name and a nonce of its own (`<job>-<nonce>`), so two runs
//! of one job never mix, and a restarted driver plays its step's groups again rather than wait for
//! answers its predecessor took; what nobody reads any more expires after a day. Every message
//! carries a `Nats-Msg-Id` (`<job>.<group>.v<version>`), so a task published twice, or played
//! twice because its first worker was slow rather than dead, is stored once within the duplicate
//! window.
//!
//! The workers of a [`Pool`] share one durable pull consumer of the pool's tasks. A worker
//! acknowledges a task only after its trajectory is stored, and while it plays it tells the
//! server it is still working (an in-progress ack every third of the ack wait), so a long
//! episode keeps its task and a worker that stops acking (killed, hung) loses it to another
//! after the ack wait. A task whose player fails on every delivery is answered, at its last
//! delivery, with a group whose episodes failed with the player's error (`rollout_worker`); one
//! whose every worker stops before answering is answered the same way by its driver when the
//! server's `MAX_DELIVERIES` advisory names it (the driver knows its tasks by their stream
//! sequence), and taken out of the stream. Either way the job goes on.
//!
//! On a queue with accounts (`serve --rollout-key`), a worker logs in as a user the server signed
//! for its tenant's pool ([`Pool::worker_permissions`]): it may read the pool's consumer,
//! acknowledge what it took, answer under the pool's subjects and hear on its own inbox, and
//! nothing more, so it can neither take nor answer another pool's groups, nor make or change a
//! stream or a consumer. The server makes the pool's consumer before it signs the worker
//! ([`Queue::open_pool`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind, Context};
use futures::StreamExt;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::super::failure::{EpisodeFailure, FailureKind};
use super::players::Rollouts;
use super::task::{GroupTask, PlayedGroup};
use crate::queue_auth::{Permissions, QueueLogin};

/// The stream of tasks, which the workers' consumer reads (a deployment's autoscaler watches it).
pub const TASKS_STREAM: &str = "OPENTINKER_TASKS";
const PLAYED_STREAM: &str = "OPENTINKER_PLAYED";
/// How long a stream remembers a message id, so that a second copy is not stored.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);
/// How long a message nobody takes stays (the tasks and answers of a driver that has gone).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How long a driver's consumer of answers outlives its last read.
const DRIVER_INACTIVE: Duration = Duration::from_secs(3600);
/// How long one pull waits for a task before asking again.
const PULL_WAIT: Duration = Duration::from_secs(2);
/// How long a message is tried again before its publisher gives up.
const PUBLISH_PATIENCE: Duration = Duration::from_secs(60);
/// The pause before a failed pull or publish is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Whose tasks a worker plays: a driver publishes its job's groups to one pool, and only that
/// pool's workers take them. A server's jobs go to their tenant's pool (the tenant's name), so
/// that a worker holding one tenant's key never takes another's task; `train --rollouts` uses
/// `default` unless told otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool(String);

impl Pool {
    /// The pool called `name` (as a subject token: kept when it is letters, digits, `-` and
    /// `_`, otherwise a digest of it).
    pub fn new(name: &str) -> Self {
        Pool(subject_token(name))
    }

    /// The durable consumer the pool's workers share on [`TASKS_STREAM`]: its pending count is
    /// the pool's work waiting (what an autoscaler watches).
    pub fn consumer(&self) -> String {
        format!("opentinker-workers-{}", self.0)
    }

    /// Where job `job`'s tasks go in this pool.
    fn subject(&self, job: &str) -> String {
        format!("opentinker.tasks.{}.{}", self.0, subject_token(job))
    }

    /// Every task of the pool.
    fn subjects(&self) -> String {
        format!("opentinker.tasks.{}.>", self.0)
    }

    /// Where the answers to job `job`'s tasks in this pool go.
    fn played_subject(&self, job: &str) -> String {
        format!("opentinker.played.{}.{}", self.0, subject_token(job))
    }

    /// The start of a pool's workers' inbox subjects: the replies to their pulls and publishes.
    pub fn inbox_prefix(&self) -> String {
        format!("_INBOX.pool.{}", self.0)
    }

    /// What a worker of the pool may do on a queue with accounts: look up the streams and its
    /// pool's consumer, pull from that consumer and acknowledge what it took, publish answers
    /// under the pool's subjects, and hear replies on its inbox.
    pub fn worker_permissions(&self) -> Permissions {
        let consumer = self.consumer();
        Permissions {
            publish: vec![
                format!("$JS.API.STREAM.INFO.{TASKS_STREAM}"),
                format!("$JS.API.STREAM.INFO.{PLAYED_STREAM}"),
                format!("$JS.API.CONSUMER.INFO.{TASKS_STREAM}.{consumer}"),
                format!("$JS.API.CONSUMER.MSG.NEXT.{TASKS_STREAM}.{consumer}"),
                format!("$JS.ACK.{TASKS_STREAM}.{consumer}.>"),
                format!("opentinker.played.{}.>", self.0),
            ],
            subscribe: vec![format!("{}.>", self.inbox_prefix())],
        }
    }

    /// The pool's consumer of tasks, as its workers share it.
    fn consumer_config(&self, settings: &QueueSettings) -> pull::Config {
        pull::Config {
            durable_name: Some(self.consumer()),
            filter_subject: self.subjects(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: settings.max_deliver,
            ..Default::default()
        }
    }
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new("default")
    }
}

/// How a connection uses the queue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSettings {
    /// The pool whose tasks are published or played.
    pub pool: Pool,
    /// How long a worker may go without acknowledging a task (or saying it is still at it)
    /// before the task is delivered to another.
    pub ack_wait: Duration,
    /// Deliveries of a task before it is answered with its failure.
    pub max_deliver: i64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            pool: Pool::default(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 3,
        }
    }
}

/// What went wrong with the queue (not with an episode: those fail inside the group).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("connecting to the rollout queue at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("setting up the rollout queue's {what}: {message}")]
    Setup { what: String, message: String },
    #[error("publishing to {subject}: {message}")]
    Publish { subject: String, message: String },
    #[error("reading the rollout queue: {0}")]
    Read(String),
    #[error("removing task {sequence} from the rollout queue: {message}")]
    Remove { sequence: u64, message: String },
    #[error("the rollout queue's driver for job `{0}` has stopped")]
    DriverStopped(String),
}

impl QueueError {
    /// The kind of the failure, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            QueueError::Connect { .. } => "queue_connect",
            QueueError::Setup { .. } => "queue_setup",
            QueueError::Publish { .. } => "queue_publish",
            QueueError::Read(_) => "queue_read",
            QueueError::Remove { .. } => "queue_remove",
            QueueError::DriverStopped(_) => "queue_driver",
        }
    }
}

impl QueueError {
    /// Setting up `what` failed with `error`.
    fn setup(what: impl Into<String>, error: impl std::fmt::Display) -> Self {
        QueueError::Setup {
            what: what.into(),
            message: error.to_string(),
        }
    }
}

/// A connection to the rollout queue, its streams made if they are not there.
#[derive(Clone)]
pub struct Queue {
    jetstream: Context,
    settings: QueueSettings,
}

impl Queue {
    /// Connect to the NATS server at `url` (`nats://host:port`), logged in as `login` says, and
    /// make sure both streams exist (a worker on a queue with accounts only looks them up).
    pub async fn connect(
        url: &str,
        settings: QueueSettings,
        login: &QueueLogin,
    ) -> Result<Self, QueueError> {
        let failed = |message: String| QueueError::Connect {
            url: url.to_string(),
            message,
        };
        let options = login.options().map_err(|e| failed(e.to_string()))?;
        let client = options
            .connect(url)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let jetstream = jetstream::new(client);
        for (name, subjects) in [
            (TASKS_STREAM, "opentinker.tasks.>"),
            (PLAYED_STREAM, "opentinker.played.>"),
        ] {
            jetstream
                .get_or_create_stream(jetstream::stream::Config {
                    name: name.to_string(),
                    subjects: vec![subjects.to_string()],
                    retention: RetentionPolicy::WorkQueue,
                    storage: StorageType::File,
                    duplicate_window: DUPLICATE_WINDOW,
                    max_age: MAX_AGE,
                    ..Default::default()
                })
                .await
                .map_err(|e| QueueError::setup(format!("stream {name}"), e))?;
        }
        Ok(Queue {
            jetstream,
            settings,
        })
    }

    /// Make the consumer of `pool`'s tasks if it is not there, with this connection's ack wait
    /// and deliveries: on a queue with accounts, its workers may not make it themselves.
    pub async fn open_pool(&self, pool: &Pool) -> Result<(), QueueError> {
        self.consumer(TASKS_STREAM, pool.consumer_config(&self.settings))
            .await
            .map(drop)
    }

    async fn consumer(
        &self,
        stream: &str,
        config: pull::Config,
    ) -> Result<PullConsumer, QueueError> {
        let name = config.durable_name.clone().unwrap_or_default();
        let what = format!("consumer {name} of {stream}");
        let stream = self
            .jetstream
            .get_stream(stream)
            .await
            .map_err(|e| QueueError::setup(what.clone(), e))?;
        stream
            .get_or_create_consumer(&name, config)
            .await
            .map_err(|e| QueueError::setup(what, e))
    }

    /// Store `payload` on `subject` under message id `id`, once (a second copy within the
    /// duplicate window is acknowledged and dropped, which makes trying again safe: a queue
    /// server that is restarting is tried again for up to [`PUBLISH_PATIENCE`]).
    /// Answers the message's sequence in its stream (the first copy's, for a second copy).
    async fn publish(
        &self,
        subject: String,
        id: &str,
        payload: Vec<u8>,
    ) -> Result<u64, QueueError> {
        let payload = bytes::Bytes::from(payload);
        let started = std::time::Instant::now();
        let failed = |error: &dyn std::fmt::Display| QueueError::Publish {
            subject: subject.clone(),
            message: error.to_string(),
        };
        loop {
            let message = PublishMessage::build()
                .payload(payload.clone())
                .message_id(id);
            let stored = match self.jetstream.send_publish(subject.clone(), message).await {
                Ok(ack) => ack.await.map(|a| a.sequence).map_err(|e| failed(&e)),
                Err(error) => Err(failed(&error)),
            };
            match stored {
                Ok(sequence) => return Ok(sequence),
                Err(error) if started.elapsed() >= PUBLISH_PATIENCE => return Err(error),
                Err(error) => {
                    tracing::warn!(%error, "publishing to the rollout queue; trying again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    /// Take the message `sequence` out of the tasks stream.
    async fn remove_task(&self, sequence: u64) -> Result<(), QueueError> {
        let removed = match self.jetstream.get_stream(TASKS_STREAM).await {
            Ok(stream) => stream.delete_message(sequence).await.map(|_| ()),
            Err(error) => return Err(QueueError::setup(format!("stream {TASKS_STREAM}"), error)),
        };
        removed.map_err(|e| QueueError::Remove {
            sequence,
            message: e.to_string(),
        })
    }
}

/// A name (a job's, a pool's) as one token of a subject or a consumer's name: kept when it is
/// letters, digits, `-` and `_`, otherwise a digest of it.
fn subject_token(job: &str) -> String {
    let plain = !job.is_empty()
        && job.len() <= 64
        && job
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match plain {
        true => job.to_string(),
        false => format!("job-{}", &hex::encode(Sha256::digest(job.as_bytes()))[..16]),
    }
}

/// The message id of group `group` at `version` of a job: the same for the task and its answer.
fn message_id(job: &str, group: u64, version: usize) -> String {
    format!("{}.{group}.v{version}", subject_token(job))
}

/// A driver's groups on the queue that have no answer yet.
#[derive(Default)]
struct Pending {
    /// Who waits for each group's answer, by (group, version).
    waiting: HashMap<(u64, usize), oneshot::Sender<PlayedGroup>>,
    /// Each group's task, by its sequence in the tasks stream: what a dead letter names.
    published: HashMap<u64, GroupTask>,
}

impl Pending {
    /// Hand `played` to whoever waits for it. Nobody does for a second copy of an answer
    /// already handed over, and a waiter that has gone (its job ended) needs nothing.
    fn answer(&mut self, played: PlayedGroup) {
        let key = (played.id, played.version);
        self.published
            .retain(|_, task| (task.group, task.version) != key);
        if let Some(waiter) = self.waiting.remove(&key) {
            let _ = waiter.send(played);
        }
    }
}

type Shared = Arc<Mutex<Pending>>;

fn lock(pending: &Shared) -> std::sync::MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where the server says a task of `pool` reached its last delivery unanswered.
fn max_deliveries_subject(pool: &Pool) -> String {
    let consumer = pool.consumer();
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{TASKS_STREAM}.{consumer}")
}

/// What the server says when a task has been delivered `max_deliver` times unanswered.
#[derive(serde::Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u64,
}

/// The driver's side of the queue for one job: [`Rollouts`] whose groups are played by the
/// workers.
pub struct QueueRollouts {
    queue: Queue,
    /// The job's name on the queue: its own name and this driver's nonce.
    job: String,
    pending: Shared,
    /// Reading answers, and dead letters.
    readers: [JoinHandle<()>; 2],
}

impl QueueRollouts {
    /// The rollouts of job `job` on `queue`, under a name of this driver's own: its answers are
    /// read by the durable consumer `driver-<name>` from now on.
    pub async fn new(queue: Queue, job: &str) -> Result<Self, QueueError> {
        let nonce = getrandom::u64().map_err(|e| QueueError::setup("a driver nonce", e))?;
        let job = format!("{}-{nonce:016x}", subject_token(job));
        let token = subject_token(&job);
        let consumer = queue
            .consumer(
                PLAYED_STREAM,
                pull::Config {
                    durable_name: Some(format!("driver-{token}")),
                    filter_subject: queue.settings.pool.played_subject(&token),
                    ack_policy: AckPolicy::Explicit,
                    // A driver that has gone (its run ended, or it was killed) leaves no consumer.
                    inactive_threshold: DRIVER_INACTIVE,
                    ..Default::default()
                },
            )
            .await?;
        let advisories = queue
            .jetstream
            .client()
            .subscribe(max_deliveries_subject(&queue.settings.pool))
            .await
            .map_err(|e| QueueError::setup("the dead-letter advisories", e))?;
        let pending = Shared::default();
        let readers = [
            tokio::spawn(gather(consumer, Arc::clone(&pending), job.clone())),
            tokio::spawn(dead_letters(
                advisories,
                queue.clone(),
                Arc::clone(&pending),
            )),
        ];
        Ok(QueueRollouts {
            queue,
            job,
            pending,
            readers,
        })
    }
}

/// Answer each of the driver's tasks that the server gives up on (delivered `max_deliver` times,
/// every worker that took it stopped before answering) with its episodes failed as
/// `rollout_worker`, and take the task out of the stream: the job goes on without it.
async fn dead_letters(mut advisories: async_nats::Subscriber, queue: Queue, pending: Shared) {
    while let Some(advisory) = advisories.next().await {
        let Ok(advisory) = serde_json::from_slice::<MaxDeliveries>(&advisory.payload) else {
            continue;
        };
        let Some(task) = lock(&pending).published.remove(&advisory.stream_seq) else {
            continue;
        };
        let message = format!(
            "no worker answered group {} in {} deliveries: each one that took it stopped first",
            task.group, advisory.deliveries
        );
        tracing::warn!(job = %task.job, group = task.group, "{message}");
        lock(&pending).answer(PlayedGroup::failed(
            &task,
            EpisodeFailure::with(FailureKind::RolloutWorker, message),
        ));
        if let Err(error) = queue.remove_task(advisory.stream_seq).await {
            tracing::warn!(%error, "removing a dead task from the queue");
        }
    }
}

/// Hand each answer of job `job` to the group waiting for it, for good: a broken read (the queue
/// server restarting) is opened again. An answer nobody waits for is a second copy of one
/// already handed over (or of a group whose job has gone) and is dropped.
async fn gather(consumer: PullConsumer, pending: Shared, job: String) {
    loop {
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(error) => {
                tracing::warn!(%job, %error, "reading played groups; trying again");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        while let Some(message) = messages.next().await {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    tracing::warn!(%job, %error, "reading played groups; opening the read again");
                    break;
                }
            };
            match serde_json::from_slice::<PlayedGroup>(&message.payload) {
                Ok(played) => {
                    lock(&pending).answer(played);
                }
                Err(error) => {
                    tracing::warn!(%job, %error, "a played group that does not decode");
                }
            }
            if let Err(error) = message.ack().await {
                tracing::warn!(%job, %error, "acknowledging a played group");
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

impl Drop for QueueRollouts {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
    }
}

impl Rollouts for QueueRollouts {
    /// Publish `task` under this driver's name for its job and await its answer.
    fn start(&self, mut task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>> {
        task.job = self.job.clone();
        let key = (task.group, task.version);
        let (send, answer) = oneshot::channel();
        lock(&self.pending).waiting.insert(key, send);
        let (queue, job, pending) = (
            self.queue.clone(),
            self.job.clone(),
            Arc::clone(&self.pending),
        );
        Box::pin(async move {
            let payload = serde_json::to_vec(&task)?;
            let subject = queue.settings.pool.subject(&task.job);
            let id = message_id(&task.job, task.group, task.version);
            let sequence = queue.publish(subject, &id, payload).await?;
            {
                let mut pending = lock(&pending);
                // Unless its answer came first.
                if pending.waiting.contains_key(&key) {
                    pending.published.insert(sequence, task);
                }
            }
            Ok(answer.await.map_err(|_| QueueError::DriverStopped(job))?)
        })
    }
}

/// Play tasks from `queue` with `player`, `slots` at a time, for good: a failed pull or answer
/// is logged and tried again (a task whose answer was not stored is not acknowledged, so it comes
/// back). Returns only if the workers' consumer cannot be set up. Each task is acknowledged
/// only once its answer is stored.
pub async fn serve_tasks(
    queue: Queue,
    player: Arc<dyn Rollouts>,
    slots: usize,
) -> Result<std::convert::Infallible, QueueError> {
    let pool = &queue.settings.pool;
    let consumer = queue
        .consumer(TASKS_STREAM, pool.consumer_config(&queue.settings))
        .await?;
    let slots = (0..slots.max(1)).map(|_| Box::pin(serve_slot(&queue, &consumer, player.as_ref())));
    let (never, _, _) = futures::future::select_all(slots).await;
    match never {}
}

/// One task at a time: pull one (none is held waiting while another plays, so none ages).
async fn serve_slot(
    queue: &Queue,
    consumer: &PullConsumer,
    player: &dyn Rollouts,
) -> std::convert::Infallible {
    loop {
        let pulled = consumer
            .batch()
            .max_messages(1)
            .expires(PULL_WAIT)
            .messages()
            .await;
        let mut batch = match pulled {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, "pulling a task; trying again");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        while let Some(message) = batch.next().await {
            let served = match message {
                Ok(message) => serve_task(queue, player, message).await,
                Err(error) => Err(QueueError::Read(error.to_string())),
            };
            if let Err(error) = served {
                tracing::warn!(%error, "serving a task; it will come back if it was not answered");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

async fn serve_task(
    queue: &Queue,
    player: &dyn Rollouts,
    message: jetstream::Message,
) -> Result<(), QueueError> {
    let task: GroupTask = match serde_json::from_slice(&message.payload) {
        Ok(task) => task,
        Err(error) => {
            // Nobody can play it: no redelivery, and no job to answer.
            tracing::warn!(%error, subject = %message.subject, "a task that does not decode");
            return ack(&message, AckKind::Term).await;
        }
    };
    let delivered = message.info().map_or(1, |info| info.delivered);
    tracing::info!(job = %task.job, group = task.group, version = task.version, delivered, "playing a task");
    let ack_wait = queue.settings.ack_wait;
    let mut playing = player.start(task.clone());
    let mut still_working = tokio::time::interval(ack_wait / 3);
    still_working.tick().await;
    let played = loop {
        tokio::select! {
            played = &mut playing => break played,
            _ = still_working.tick() => {
                // A missed one only shortens the task's lease; the play goes on.
                if let Err(error) = ack(&message, AckKind::Progress).await {
                    tracing::warn!(%error, "telling the queue a task is still being played");
                }
            }
        }
    };
    let played = match played {
        Ok(played) => played,
        Err(error) if delivered >= queue.settings.max_deliver => {
            tracing::warn!(job = %task.job, group = task.group, %error, "a task failed on its last delivery");
            let failure = EpisodeFailure::with(FailureKind::RolloutWorker, format!("{error:#}"));
            PlayedGroup::failed(&task, failure)
        }
        Err(error) => {
            tracing::warn!(job = %task.job, group = task.group, delivered, %error, "a task failed; it will be delivered again");
            return ack(&message, AckKind::Nak(None)).await;
        }
    };
    let subject = queue.settings.pool.played_subject(&task.job);
    let payload = serde_json::to_vec(&played).map_err(|e| QueueError::Publish {
        subject: subject.clone(),
        message: e.to_string(),
    })?;
    let id = message_id(&task.job, task.group, task.version);
    queue.publish(subject, &id, payload).await?;
    message
        .double_ack()
        .await
        .map_err(|e| QueueError::Read(format!("acknowledging a task: {e}")))
}

async fn ack(message: &jetstream::Message, kind: AckKind) -> Result<(), QueueError> {
    message
        .ack_with(kind)
        .await
        .map_err(|e| QueueError::Read(format!("acknowledging a task: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_that_is_no_subject_token_becomes_a_digest_of_itself() {
        assert_eq!(subject_token("take-away_2"), "take-away_2");
        let long = "x".repeat(65);
        for awkward in ["a.b", "a b", "a>*", "", &long] {
            let token = subject_token(awkward);
            assert!(
                token.starts_with("job-") && token.len() == 20,
                "{awkward:?}: {token}"
            );
            assert_eq!(subject_token(awkward), token);
        }
        assert_ne!(subject_token("a.b"), subject_token("a b"));
        assert_eq!(message_id("take-away", 7, 3), "take-away.7.v3");
    }
}
