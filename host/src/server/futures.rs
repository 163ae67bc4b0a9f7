//! Futures: an accepted op runs on its own task and its outcome waits here, by request id, for
//! the client's `retrieve_future` polls. A repeated request (same idempotency key, same payload)
//! gets the first one's request id instead of running twice; the same key with another payload
//! is refused.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::api::{ApiError, ApiErrorKind, TenantId};

/// A finished op's answer body.
#[derive(Clone, Debug)]
pub enum Answer {
    Json(serde_json::Value),
    /// Protobuf bytes (`forward_backward` and sample results).
    Proto(Vec<u8>),
}

pub type Outcome = Result<Answer, ApiError>;

type Slot = watch::Receiver<Option<Arc<Outcome>>>;

struct Entry {
    tenant: TenantId,
    outcome: Slot,
}

/// What identifies a repeat of a request: its key and a digest of its payload.
pub struct Idempotency {
    pub key: String,
    pub payload: [u8; 32],
}

impl Idempotency {
    pub fn new(key: String, body: &[u8]) -> Self {
        Idempotency {
            key,
            payload: Sha256::digest(body).into(),
        }
    }
}

#[derive(Default)]
struct Table {
    entries: HashMap<String, Entry>,
    /// (tenant, idempotency key) -> (request id, payload digest).
    keys: HashMap<(TenantId, String), (String, [u8; 32])>,
}

#[derive(Default)]
pub struct Futures {
    table: Mutex<Table>,
}

impl Futures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `work` as a future of `tenant` and return its request id (the first request's, for
    /// a repeat).
    pub fn submit<F>(
        &self,
        tenant: &TenantId,
        idempotency: Option<Idempotency>,
        work: F,
    ) -> Result<String, ApiError>
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
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
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| ApiError::internal(format!("no random request id: {e}")))?;
        let id = format!("req-{}", hex::encode(bytes));
        let (sender, outcome) = watch::channel(None);
        table.entries.insert(
            id.clone(),
            Entry {
                tenant: tenant.clone(),
                outcome,
            },
        );
        if let Some(key) = idempotency {
            table
                .keys
                .insert((tenant.clone(), key.key), (id.clone(), key.payload));
        }
        drop(table);
        tokio::spawn(async move {
            let outcome = match tokio::spawn(work).await {
                Ok(outcome) => outcome,
                Err(_) => Err(ApiError::internal(
                    "the op failed unexpectedly (it panicked)",
                )),
            };
            let _ = sender.send(Some(Arc::new(outcome)));
        });
        Ok(id)
    }

    /// The outcome of `tenant`'s request `id`, waiting at most `wait` for it; `None` if it has
    /// not finished by then. Another tenant's id is answered as an unknown one.
    pub async fn retrieve(
        &self,
        tenant: &TenantId,
        id: &str,
        wait: Duration,
    ) -> Result<Option<Arc<Outcome>>, ApiError> {
        let mut slot = match self.lock().entries.get(id) {
            Some(entry) if &entry.tenant == tenant => entry.outcome.clone(),
            _ => return Err(ApiError::not_found(format!("request {id:?}"))),
        };
        let ready = tokio::time::timeout(wait, slot.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(outcome)) => Ok(outcome.clone()),
            Ok(Err(_)) => Err(ApiError::internal("the op's task ended without an answer")),
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn repeats_share_one_run_and_other_tenants_see_nothing() {
        let futures = Futures::default();
        let alice = TenantId::new("alice").unwrap();
        let bob = TenantId::new("bob").unwrap();
        let key = || Some(Idempotency::new("m#1".into(), b"payload"));
        let first = futures
            .submit(&alice, key(), async {
                Ok(Answer::Json(serde_json::json!(1)))
            })
            .unwrap();
        let again = futures
            .submit(&alice, key(), async {
                Ok(Answer::Json(serde_json::json!(2)))
            })
            .unwrap();
        assert_eq!(first, again);
        let changed = futures.submit(
            &alice,
            Some(Idempotency::new("m#1".into(), b"other")),
            async { Ok(Answer::Json(serde_json::json!(3))) },
        );
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
    async fn an_unfinished_op_answers_not_yet() {
        let futures = Futures::default();
        let alice = TenantId::new("alice").unwrap();
        let id = futures
            .submit(&alice, None, std::future::pending())
            .unwrap();
        let outcome = futures
            .retrieve(&alice, &id, Duration::from_millis(50))
            .await
            .unwrap();
        assert!(outcome.is_none());
    }
}
