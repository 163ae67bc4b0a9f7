//! Futures: an accepted op runs on its own task and its outcome waits here, by request id, for
//! the client's `retrieve_future` polls. A repeated request (same idempotency key, same payload)
//! gets the first one's request id instead of running twice; the same key with another payload
//! is refused.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::journal::{AcceptedRequest, FinishedRequest, Journal, Outcome};
use crate::api::{ApiError, ApiErrorKind, TenantId};
use crate::service::{Change, Hold};

type Slot = watch::Receiver<Option<Arc<Outcome>>>;

struct Entry {
    tenant: TenantId,
    outcome: Slot,
    /// Its idempotency key, forgotten with it.
    key: Option<String>,
    /// When it finished; finished entries leave memory after [`KEEP_FINISHED`] (the journal
    /// still answers for them).
    finished: Option<Instant>,
}

/// How long a finished request's answer stays in memory.
pub const KEEP_FINISHED: Duration = Duration::from_secs(30);

/// What identifies a repeat of a request: its key and a digest of its payload.
pub struct Idempotency {
    pub key: String,
    pub payload: [u8; 32],
}

impl Idempotency {
    pub fn new(key: String, body: &[u8]) -> Self {
        Idempotency {
            key,
            payload: accepted_payload(body),
        }
    }

    /// A repeat that may differ from the first request in the top-level JSON fields `varying`:
    /// the `tinker` SDK draws a fresh `sampling_session_seq_id` on every try of a
    /// `save_weights_for_sampler`, so the retry of one whose answer a restart cut differs there
    /// and nowhere else. A body that is no JSON object is compared whole.
    pub fn ignoring(key: String, body: &[u8], varying: &[&str]) -> Self {
        let canonical = match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(mut fields)) if !varying.is_empty() => {
                fields.retain(|name, _| !varying.contains(&name.as_str()));
                serde_json::to_vec(&fields).ok()
            }
            _ => None,
        };
        Idempotency::new(key, canonical.as_deref().unwrap_or(body))
    }
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// Count one more unfinished request of `tenant`, or refuse it past `max`.
fn take_place(table: &mut Table, tenant: &TenantId, max: usize) -> Result<(), ApiError> {
    let unfinished = table.unfinished.get(tenant).copied().unwrap_or(0);
    if unfinished >= max {
        return Err(ApiError::new(
            ApiErrorKind::TooManyRequests,
            format!(
                "{unfinished} requests of yours are queued or running; send more when some finish"
            ),
        ));
    }
    *table.unfinished.entry(tenant.clone()).or_default() += 1;
    Ok(())
}

/// One of a tenant's unfinished requests that is not a future ([`Futures::admit`]); dropped
/// when it is answered or its client has gone.
pub struct Place {
    table: Arc<Mutex<Table>>,
    tenant: TenantId,
}

impl Drop for Place {
    fn drop(&mut self) {
        finished_one(&mut lock(&self.table), &self.tenant);
    }
}

fn finished_one(table: &mut Table, tenant: &TenantId) {
    if let Some(count) = table.unfinished.get_mut(tenant) {
        *count = count.saturating_sub(1);
    }
}

/// The digest a request's payload is compared by.
fn accepted_payload(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

struct Table {
    entries: HashMap<String, Entry>,
    /// (tenant, idempotency key) -> (request id, payload digest).
    keys: HashMap<(TenantId, String), (String, [u8; 32])>,
    /// Requests of each tenant accepted and not finished.
    unfinished: HashMap<TenantId, usize>,
    /// When finished entries were last let go.
    swept: Instant,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            entries: HashMap::new(),
            keys: HashMap::new(),
            unfinished: HashMap::new(),
            swept: Instant::now(),
        }
    }
}

/// What an op's task gives back: its answer, the changes to record with it, and what must stay
/// alive until they are recorded (the model's turn: the next op waits for this one's record).
pub struct Finished {
    pub outcome: Outcome,
    pub changes: Vec<Change>,
    pub hold: Hold,
}

/// A request to run as a future.
pub struct Submission {
    pub tenant: TenantId,
    pub idempotency: Option<Idempotency>,
    /// The route and body it came with, recorded to run it again after a restart.
    pub route: String,
    pub body: Vec<u8>,
}

pub struct Futures {
    table: Arc<Mutex<Table>>,
    journal: Arc<Journal>,
    /// Unfinished requests a tenant may have; past it a request is answered 429.
    max_unfinished: usize,
}

impl Futures {
    pub fn new(journal: Arc<Journal>, max_unfinished: usize) -> Self {
        Futures {
            table: Arc::new(Mutex::new(Table::default())),
            journal,
            max_unfinished,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// Record `submission` as accepted, run `work` as its future and return its request id (the
    /// first request's, for a repeat).
    pub async fn submit<F>(&self, submission: Submission, work: F) -> Result<String, ApiError>
    where
        F: Future<Output = Finished> + Send + 'static,
    {
        let Submission {
            tenant,
            idempotency,
            route,
            body,
        } = submission;
        let (id, outcome) = {
            let mut table = self.lock();
            if let Some(key) = &idempotency
                && let Some((id, payload)) = table.keys.get(&(tenant.clone(), key.key.clone()))
            {
                return if *payload == key.payload {
                    Ok(id.clone())
                } else {
                    Err(ApiError::new(
                        ApiErrorKind::Conflict,
                        format!(
                            "request {} was sent before with a different payload (a seq_id is used once)",
                            key.key
                        ),
                    ))
                };
            }
            take_place(&mut table, &tenant, self.max_unfinished)?;
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes)
                .map_err(|e| ApiError::internal(format!("no random request id: {e}")))?;
            let id = format!("req-{}", hex::encode(bytes));
            let (sender, outcome) = watch::channel(None);
            sweep(&mut table);
            table.entries.insert(
                id.clone(),
                Entry {
                    tenant: tenant.clone(),
                    outcome,
                    key: idempotency.as_ref().map(|k| k.key.clone()),
                    finished: None,
                },
            );
            if let Some(key) = &idempotency {
                table
                    .keys
                    .insert((tenant.clone(), key.key.clone()), (id.clone(), key.payload));
            }
            (id, sender)
        };
        let tenant_of_failed = tenant.clone();
        let (request, recorded_tenant) = (id.clone(), tenant.clone());
        // Hashed with the record, off the async workers (a body may be 64 MiB).
        let recorded = self
            .journal
            .off_thread(move |j| {
                let (idempotency_key, payload) = match idempotency {
                    Some(key) => (Some(key.key), key.payload),
                    None => (None, accepted_payload(&body)),
                };
                j.accept(&AcceptedRequest {
                    id: request,
                    tenant: recorded_tenant,
                    idempotency_key,
                    payload,
                    route,
                    body,
                })
            })
            .await;
        if let Err(error) = recorded {
            let mut table = self.lock();
            table.entries.remove(&id);
            table.keys.retain(|_, (request, _)| *request != id);
            finished_one(&mut table, &tenant_of_failed);
            return Err(ApiError::new(
                ApiErrorKind::Unavailable,
                format!("the request could not be recorded: {error}"),
            ));
        }
        self.run(id.clone(), tenant, outcome, work);
        Ok(id)
    }

    /// A place among `tenant`'s unfinished requests for one that is not a future (a sample of
    /// the OpenAI routes, answered on its connection): the same cap as the futures', refused
    /// with 429 past it, freed when the place is dropped.
    pub fn admit(&self, tenant: &TenantId) -> Result<Place, ApiError> {
        take_place(&mut self.lock(), tenant, self.max_unfinished)?;
        Ok(Place {
            table: Arc::clone(&self.table),
            tenant: tenant.clone(),
        })
    }

    /// Run an accepted request again (after a restart), under its recorded id.
    pub fn resubmit<F>(&self, request: &AcceptedRequest, work: F)
    where
        F: Future<Output = Finished> + Send + 'static,
    {
        let (sender, outcome) = watch::channel(None);
        let mut table = self.lock();
        table.entries.insert(
            request.id.clone(),
            Entry {
                tenant: request.tenant.clone(),
                outcome,
                key: request.idempotency_key.clone(),
                finished: None,
            },
        );
        if let Some(key) = &request.idempotency_key {
            table.keys.insert(
                (request.tenant.clone(), key.clone()),
                (request.id.clone(), request.payload),
            );
        }
        *table.unfinished.entry(request.tenant.clone()).or_default() += 1;
        drop(table);
        self.run(request.id.clone(), request.tenant.clone(), sender, work);
    }

    /// Answer finished requests (after a restart) as they were answered before.
    pub fn restore(&self, finished: Vec<FinishedRequest>) {
        let mut table = self.lock();
        for request in finished {
            let (_, outcome) = watch::channel(Some(Arc::new(request.outcome)));
            if let Some(key) = &request.idempotency_key {
                table.keys.insert(
                    (request.tenant.clone(), key.clone()),
                    (request.id.clone(), request.payload),
                );
            }
            table.entries.insert(
                request.id,
                Entry {
                    tenant: request.tenant,
                    outcome,
                    key: request.idempotency_key,
                    finished: Some(Instant::now()),
                },
            );
        }
    }

    fn run<F>(
        &self,
        id: String,
        tenant: TenantId,
        sender: watch::Sender<Option<Arc<Outcome>>>,
        work: F,
    ) where
        F: Future<Output = Finished> + Send + 'static,
    {
        let journal = Arc::clone(&self.journal);
        let table = Arc::clone(&self.table);
        tokio::spawn(async move {
            let finished = match tokio::spawn(work).await {
                Ok(finished) => finished,
                Err(_) => Finished {
                    outcome: Err(ApiError::internal(
                        "the op failed unexpectedly (it panicked)",
                    )),
                    changes: Vec::new(),
                    hold: Hold::none(),
                },
            };
            let Finished {
                outcome,
                changes,
                hold,
            } = finished;
            let outcome = Arc::new(outcome);
            let (record, request) = (Arc::clone(&outcome), id.clone());
            let recorded = journal
                .off_thread(move |j| j.finish(&request, &record, &changes))
                .await;
            if let Err(error) = recorded {
                tracing::error!(request = id, %error, "a finished request could not be recorded");
            }
            // The model's next op may run now that this one is recorded.
            drop(hold);
            {
                let mut table = lock(&table);
                finished_one(&mut table, &tenant);
                if let Some(entry) = table.entries.get_mut(&id) {
                    entry.finished = Some(Instant::now());
                }
            }
            let _ = sender.send(Some(outcome));
        });
    }

    /// The outcome of `tenant`'s request `id`, waiting at most `wait` for it; `None` if it has
    /// not finished by then. Another tenant's id is answered as an unknown one.
    pub async fn retrieve(
        &self,
        tenant: &TenantId,
        id: &str,
        wait: Duration,
    ) -> Result<Option<Arc<Outcome>>, ApiError> {
        let found = self
            .lock()
            .entries
            .get(id)
            .map(|e| (e.tenant.clone(), e.outcome.clone()));
        let mut slot = match found {
            Some((owner, slot)) if &owner == tenant => slot,
            Some(_) => return Err(ApiError::not_found(format!("request {id:?}"))),
            // Answered long ago: the journal still has it.
            None => return self.recorded(tenant, id).await.map(Some),
        };
        let ready = tokio::time::timeout(wait, slot.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(outcome)) => Ok(outcome.clone()),
            Ok(Err(_)) => Err(ApiError::internal("the op's task ended without an answer")),
            Err(_) => Ok(None),
        }
    }
}

impl Futures {
    /// A finished request's answer from the journal.
    async fn recorded(&self, tenant: &TenantId, id: &str) -> Result<Arc<Outcome>, ApiError> {
        let request = id.to_string();
        let answer = self.journal.off_thread(move |j| j.answer(&request)).await?;
        match answer {
            Some((owner, outcome)) if &owner == tenant => Ok(Arc::new(outcome)),
            _ => Err(ApiError::not_found(format!("request {id:?}"))),
        }
    }
}

/// Let go of finished entries older than [`KEEP_FINISHED`], with their idempotency keys.
fn sweep(table: &mut Table) {
    let now = Instant::now();
    if now.duration_since(table.swept) < Duration::from_secs(5) {
        return;
    }
    table.swept = now;
    let old: Vec<(String, TenantId, Option<String>)> = table
        .entries
        .iter()
        .filter(|(_, e)| {
            e.finished
                .is_some_and(|f| now.duration_since(f) > KEEP_FINISHED)
        })
        .map(|(id, e)| (id.clone(), e.tenant.clone(), e.key.clone()))
        .collect();
    for (id, tenant, key) in old {
        table.entries.remove(&id);
        if let Some(key) = key {
            table.keys.remove(&(tenant, key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::journal::Answer;

    fn submission(tenant: &TenantId, key: Option<(&str, &[u8])>) -> Submission {
        Submission {
            tenant: tenant.clone(),
            idempotency: key.map(|(k, body)| Idempotency::new(k.into(), body)),
            route: "test".into(),
            body: key.map(|(_, b)| b.to_vec()).unwrap_or_default(),
        }
    }

    async fn answer(value: i32) -> Finished {
        Finished {
            outcome: Ok(Answer::Json(serde_json::json!(value))),
            changes: Vec::new(),
            hold: Hold::none(),
        }
    }

    #[tokio::test]
    async fn repeats_share_one_run_and_other_tenants_see_nothing() {
        let data = tempfile::tempdir().unwrap();
        let futures = Futures::new(Arc::new(Journal::open(data.path()).unwrap()), 100);
        let alice = TenantId::new("alice").unwrap();
        let bob = TenantId::new("bob").unwrap();
        let key = Some(("m#1", b"payload".as_slice()));
        let first = futures
            .submit(submission(&alice, key), answer(1))
            .await
            .unwrap();
        let again = futures
            .submit(submission(&alice, key), answer(2))
            .await
            .unwrap();
        assert_eq!(first, again);
        let changed = futures
            .submit(submission(&alice, Some(("m#1", b"other"))), answer(3))
            .await;
        assert_eq!(changed.unwrap_err().kind, ApiErrorKind::Conflict);
        let outcome = futures
            .retrieve(&alice, &first, Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(&*outcome, Ok(Answer::Json(v)) if v == 1));
        let hidden = futures.retrieve(&bob, &first, Duration::from_secs(1)).await;
        assert_eq!(hidden.unwrap_err().kind, ApiErrorKind::NotFound);
    }

    #[tokio::test]
    async fn finished_and_accepted_requests_survive_a_restart() {
        let data = tempfile::tempdir().unwrap();
        let alice = TenantId::new("alice").unwrap();
        let (done, waiting) = {
            let futures = Futures::new(Arc::new(Journal::open(data.path()).unwrap()), 100);
            let done = futures
                .submit(submission(&alice, Some(("m#1", b"a"))), answer(7))
                .await
                .unwrap();
            futures
                .retrieve(&alice, &done, Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
            let waiting = futures
                .submit(submission(&alice, Some(("m#2", b"b"))), async {
                    std::future::pending().await
                })
                .await
                .unwrap();
            (done, waiting)
        };
        let journal = Arc::new(Journal::open(data.path()).unwrap());
        let recorded = journal.load(KEEP_FINISHED).unwrap();
        assert_eq!(recorded.pending.len(), 1);
        assert_eq!(recorded.pending[0].id, waiting);
        assert_eq!(recorded.pending[0].body, b"b");
        let futures = Futures::new(journal, 100);
        futures.restore(recorded.finished);
        futures.resubmit(&recorded.pending[0], answer(8));
        for (id, value) in [(&done, 7), (&waiting, 8)] {
            let outcome = futures
                .retrieve(&alice, id, Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
            assert!(matches!(&*outcome, Ok(Answer::Json(v)) if v == value));
        }
        let repeat = futures
            .submit(submission(&alice, Some(("m#1", b"a"))), answer(9))
            .await
            .unwrap();
        assert_eq!(repeat, done);
        // An answer no longer in memory comes from the journal, to its tenant only.
        let journal = Arc::new(Journal::open(data.path()).unwrap());
        let forgetful = Futures::new(journal, 100);
        let outcome = forgetful
            .retrieve(&alice, &done, Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(&*outcome, Ok(Answer::Json(v)) if v == 7));
        let bob = TenantId::new("bob").unwrap();
        let hidden = forgetful
            .retrieve(&bob, &done, Duration::from_secs(1))
            .await;
        assert_eq!(hidden.unwrap_err().kind, ApiErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_tenant_past_its_queue_cap_is_told_to_come_back_and_others_are_not() {
        let data = tempfile::tempdir().unwrap();
        let futures = Futures::new(Arc::new(Journal::open(data.path()).unwrap()), 2);
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        let (release, released) = tokio::sync::watch::channel(false);
        let blocked = |mut released: watch::Receiver<bool>| async move {
            let _ = released.wait_for(|r| *r).await;
            answer(1).await
        };
        for _ in 0..2 {
            let work = blocked(released.clone());
            futures
                .submit(submission(&alice, None), work)
                .await
                .unwrap();
        }
        let refused = futures.submit(submission(&alice, None), answer(2)).await;
        assert_eq!(refused.unwrap_err().kind, ApiErrorKind::TooManyRequests);
        futures
            .submit(submission(&bob, None), answer(3))
            .await
            .unwrap();
        release.send(true).unwrap();
        for _ in 0..100 {
            if futures
                .submit(submission(&alice, None), answer(4))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("alice's finished requests did not free her queue");
    }

    #[tokio::test]
    async fn an_unfinished_op_answers_not_yet() {
        let data = tempfile::tempdir().unwrap();
        let futures = Futures::new(Arc::new(Journal::open(data.path()).unwrap()), 100);
        let alice = TenantId::new("alice").unwrap();
        let id = futures
            .submit(submission(&alice, None), async {
                std::future::pending().await
            })
            .await
            .unwrap();
        let outcome = futures
            .retrieve(&alice, &id, Duration::from_millis(50))
            .await
            .unwrap();
        assert!(outcome.is_none());
    }
}
