//! The server's durable record, in its SQLite database (WAL, `synchronous=FULL`): every
//! accepted request (before it is answered), every finished request's answer together with the
//! changes its op made (one transaction, so an answer is never recorded without its effect nor
//! the other way round), and the sessions, models (with their training state) and samplers those
//! changes describe. A restarted server restores the objects, answers the finished requests from
//! here, and runs the accepted ones again.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};

use crate::api::{
    ApiError, ApiErrorKind, LossId, ModelId, SamplerId, SessionId, TenantId, UserMetadata,
};
use crate::service::{Change, SamplerRecord};
use crate::store::open_database;
use crate::store::unix_now;

/// A finished op's answer body, as recorded and as answered.
#[derive(Clone, Debug)]
pub enum Answer {
    Json(serde_json::Value),
    /// Protobuf bytes (`forward_backward` and sample results).
    Proto(Vec<u8>),
}

/// What a finished op answered.
pub type Outcome = Result<Answer, ApiError>;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the server database: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("the server database holds a damaged record: {0}")]
    Damaged(String),
    #[error("the server database's worker task ended: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

impl From<JournalError> for ApiError {
    /// A database that cannot record is unavailable (the client may retry); a worker that
    /// ended abnormally is the server's own fault.
    fn from(error: JournalError) -> Self {
        match error {
            JournalError::Worker(_) => ApiError::internal(error.to_string()),
            _ => ApiError::new(ApiErrorKind::Unavailable, error.to_string()),
        }
    }
}

/// A request as it was accepted: what is needed to run it again.
#[derive(Clone, Debug)]
pub struct AcceptedRequest {
    pub id: String,
    pub tenant: TenantId,
    pub idempotency_key: Option<String>,
    pub payload: [u8; 32],
    pub route: String,
    pub body: Vec<u8>,
}

/// A finished request, as recorded.
pub struct FinishedRequest {
    pub id: String,
    pub tenant: TenantId,
    pub idempotency_key: Option<String>,
    pub payload: [u8; 32],
    pub outcome: Outcome,
}

/// Everything a restarted server needs.
pub struct Recorded {
    /// The latest record of every session, model and sampler.
    pub objects: Vec<Change>,
    pub finished: Vec<FinishedRequest>,
    /// Accepted and not finished, in the order they were accepted.
    pub pending: Vec<AcceptedRequest>,
}

pub struct Journal {
    db: Mutex<Connection>,
}

fn digest(bytes: Vec<u8>) -> Result<[u8; 32], JournalError> {
    bytes
        .try_into()
        .map_err(|_| JournalError::Damaged("a payload digest is not 32 bytes".into()))
}

impl Journal {
    /// Run `work` on the journal on a blocking thread (SQLite's calls block and fsync), off
    /// the async workers.
    pub async fn off_thread<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Journal) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, JournalError> {
        let journal = Arc::clone(self);
        tokio::task::spawn_blocking(move || work(&journal)).await?
    }

    /// Open (or make) the journal in `data`'s database.
    pub fn open(data: &Path) -> Result<Self, JournalError> {
        let db = open_database(data)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS sessions (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS models (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 base TEXT NOT NULL,
                 lora_rank INTEGER NOT NULL,
                 applied_seq INTEGER NOT NULL,
                 state BLOB NOT NULL
             );
             CREATE TABLE IF NOT EXISTS samplers (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 base TEXT NOT NULL,
                 checkpoint TEXT,
                 snapshot BLOB
             );
             CREATE TABLE IF NOT EXISTS custom_losses (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 loss BLOB NOT NULL
             );
             CREATE TABLE IF NOT EXISTS requests (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 id TEXT NOT NULL UNIQUE,
                 tenant TEXT NOT NULL,
                 idempotency_key TEXT,
                 payload BLOB NOT NULL,
                 route TEXT NOT NULL,
                 body BLOB NOT NULL,
                 finished INTEGER NOT NULL DEFAULT 0,
                 answer_kind TEXT,
                 answer BLOB,
                 finished_at INTEGER
             );",
        )?;
        // Columns added since the first release, to databases made before them.
        for (table, column, kind) in [
            ("models", "user_metadata", "TEXT"),
            ("models", "last_request_at", "INTEGER"),
            ("sessions", "finished_at", "INTEGER"),
            ("samplers", "model", "TEXT"),
        ] {
            let columns: Vec<String> = db
                .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            if !columns.iter().any(|c| c == column) {
                db.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))?;
            }
        }
        Ok(Journal { db: Mutex::new(db) })
    }

    /// `tenant`'s training runs (its models), oldest first: `limit` of them from `offset`, and
    /// how many it has in all.
    pub fn training_runs(
        &self,
        tenant: &TenantId,
        limit: u64,
        offset: u64,
    ) -> Result<(Vec<RunRecord>, u64), JournalError> {
        let db = self.lock();
        let total: i64 = db.query_row(
            "SELECT count(*) FROM models WHERE tenant = ?1",
            params![tenant.as_str()],
            |r| r.get(0),
        )?;
        let mut query = db.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM models WHERE tenant = ?1 ORDER BY rowid LIMIT ?2 OFFSET ?3"
        ))?;
        let runs = query
            .query_map(
                params![
                    tenant.as_str(),
                    limit.min(i64::MAX as u64) as i64,
                    offset.min(i64::MAX as u64) as i64
                ],
                run_record,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok((runs, total as u64))
    }

    /// `tenant`'s training run `id`, if it has one by that id.
    pub fn training_run(
        &self,
        tenant: &TenantId,
        id: &ModelId,
    ) -> Result<Option<RunRecord>, JournalError> {
        let db = self.lock();
        let record = db
            .query_row(
                &format!("SELECT {RUN_COLUMNS} FROM models WHERE tenant = ?1 AND id = ?2"),
                params![tenant.as_str(), id.to_string()],
                run_record,
            )
            .optional()?;
        Ok(record)
    }

    /// `tenant`'s sessions, oldest first: `limit` of them from `offset`.
    pub fn sessions(
        &self,
        tenant: &TenantId,
        limit: u64,
        offset: u64,
    ) -> Result<Vec<String>, JournalError> {
        let db = self.lock();
        let mut query = db.prepare(
            "SELECT id FROM sessions WHERE tenant = ?1 ORDER BY rowid LIMIT ?2 OFFSET ?3",
        )?;
        let ids = query
            .query_map(
                params![
                    tenant.as_str(),
                    limit.min(i64::MAX as u64) as i64,
                    offset.min(i64::MAX as u64) as i64
                ],
                |r| r.get(0),
            )?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(ids)
    }

    /// `tenant`'s session `id`: its training runs and its samplers that are not freed, each
    /// oldest first; `None` if the tenant has no session by that id.
    pub fn session(
        &self,
        tenant: &TenantId,
        id: &SessionId,
    ) -> Result<Option<SessionRecord>, JournalError> {
        let db = self.lock();
        let known = db
            .query_row(
                "SELECT 1 FROM sessions WHERE tenant = ?1 AND id = ?2",
                params![tenant.as_str(), id.as_str()],
                |_| Ok(()),
            )
            .optional()?;
        if known.is_none() {
            return Ok(None);
        }
        let ids_of = |table: &str| -> Result<Vec<String>, JournalError> {
            let mut query = db.prepare(&format!(
                "SELECT id FROM {table} WHERE tenant = ?1 ORDER BY rowid"
            ))?;
            let ids = query
                .query_map(params![tenant.as_str()], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(ids)
        };
        let training_runs = ids_of("models")?
            .into_iter()
            .filter_map(|run| run.parse::<ModelId>().ok())
            .filter(|run| &run.session == id)
            .collect();
        let samplers = ids_of("samplers")?
            .into_iter()
            .filter_map(|sampler| SamplerId::parse(&sampler).ok())
            .filter(|sampler| sampler.session() == id.as_str())
            .collect();
        Ok(Some(SessionRecord {
            training_runs,
            samplers,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record an accepted request (before its id is answered).
    pub fn accept(&self, request: &AcceptedRequest) -> Result<(), JournalError> {
        self.lock().execute(
            "INSERT INTO requests (id, tenant, idempotency_key, payload, route, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                request.id,
                request.tenant.as_str(),
                request.idempotency_key,
                request.payload.as_slice(),
                request.route,
                request.body
            ],
        )?;
        Ok(())
    }

    /// Record changes made outside any request (sessions, sampling sessions).
    pub fn record(&self, changes: &[Change]) -> Result<(), JournalError> {
        let mut db = self.lock();
        let tx = db.transaction()?;
        for change in changes {
            apply(&tx, change)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Record request `id`'s answer and the changes its op made, in one transaction. The body
    /// is dropped: a finished request is never run again.
    pub fn finish(
        &self,
        id: &str,
        outcome: &Outcome,
        changes: &[Change],
    ) -> Result<(), JournalError> {
        let (kind, answer) = match outcome {
            Ok(Answer::Json(value)) => ("json", value.to_string().into_bytes()),
            Ok(Answer::Proto(bytes)) => ("proto", bytes.clone()),
            Err(error) => (
                "error",
                serde_json::to_vec(error).map_err(|e| JournalError::Damaged(e.to_string()))?,
            ),
        };
        let mut db = self.lock();
        let tx = db.transaction()?;
        for change in changes {
            apply(&tx, change)?;
        }
        tx.execute(
            "UPDATE requests SET finished = 1, answer_kind = ?2, answer = ?3, body = x'',
                 finished_at = ?4
             WHERE id = ?1",
            params![id, kind, answer, unix_now()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Forget the requests answered more than `retention` ago (their answers and payload
    /// digests): the SDK has long stopped asking for them, and the database stays bounded.
    /// Unfinished requests are kept. Returns how many went.
    pub fn prune_answers(&self, retention: std::time::Duration) -> Result<usize, JournalError> {
        let before = unix_now() - retention.as_secs() as i64;
        Ok(self.lock().execute(
            "DELETE FROM requests WHERE finished = 1 AND finished_at < ?1",
            params![before],
        )?)
    }

    /// The answer of finished request `id`, with its tenant.
    pub fn answer(&self, id: &str) -> Result<Option<(TenantId, Outcome)>, JournalError> {
        let row: Option<(String, Option<String>, Option<Vec<u8>>)> = self
            .lock()
            .query_row(
                "SELECT tenant, answer_kind, answer FROM requests WHERE id = ?1 AND finished = 1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((tenant, kind, answer)) = row else {
            return Ok(None);
        };
        let tenant = TenantId::new(&tenant).map_err(|e| JournalError::Damaged(e.to_string()))?;
        Ok(Some((
            tenant,
            outcome(kind.as_deref(), answer.unwrap_or_default())?,
        )))
    }

    /// Everything recorded; of the finished requests, those that finished within `recent`
    /// (older ones are answered from the journal when asked for).
    pub fn load(&self, recent: std::time::Duration) -> Result<Recorded, JournalError> {
        let since = unix_now() - recent.as_secs() as i64;
        let db = self.lock();
        let objects = load_objects(&db)?;
        let (finished, pending) = load_requests(&db, since)?;
        Ok(Recorded {
            objects,
            finished,
            pending,
        })
    }
}

/// A tenant's id as the journal recorded it.
fn recorded_tenant(name: String) -> Result<TenantId, JournalError> {
    TenantId::new(&name).map_err(|e| JournalError::Damaged(e.to_string()))
}

/// The sessions, models, samplers and custom losses the journal records, as the changes that
/// made them.
fn load_objects(db: &Connection) -> Result<Vec<Change>, JournalError> {
    let mut objects = Vec::new();
    let mut query = db.prepare("SELECT id, tenant, finished_at IS NOT NULL FROM sessions")?;
    let rows = query.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get(1)?, r.get::<_, bool>(2)?))
    })?;
    for row in rows {
        let (id, owner, finished) = row?;
        let id = SessionId::new(&id).map_err(|e| JournalError::Damaged(e.to_string()))?;
        objects.push(Change::Session {
            id: id.clone(),
            tenant: recorded_tenant(owner)?,
        });
        if finished {
            objects.push(Change::SessionFinished { id });
        }
    }
    // A finished session's models keep their rows (the training runs list them) without
    // their state.
    let mut query = db.prepare(
        "SELECT id, tenant, base, lora_rank, applied_seq, state FROM models
         WHERE length(state) > 0",
    )?;
    let rows = query.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, Vec<u8>>(5)?,
        ))
    })?;
    for row in rows {
        let (id, owner, base, rank, applied, state) = row?;
        objects.push(Change::Model {
            id: id
                .parse::<ModelId>()
                .map_err(|e| JournalError::Damaged(e.to_string()))?,
            tenant: recorded_tenant(owner)?,
            base,
            lora_rank: rank as usize,
            applied_seq: applied as u64,
            state: Some(state),
            user_metadata: None,
        });
    }
    let mut query =
        db.prepare("SELECT id, tenant, base, checkpoint, snapshot, model FROM samplers")?;
    let rows = query.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, Option<Vec<u8>>>(4)?,
            r.get::<_, Option<String>>(5)?,
        ))
    })?;
    for row in rows {
        let (id, owner, base, checkpoint, snapshot, model) = row?;
        let damaged = |e: ApiError| JournalError::Damaged(e.to_string());
        let source = match (checkpoint, snapshot) {
            (Some(path), _) => SamplerRecord::Checkpoint(path.parse().map_err(damaged)?),
            (None, Some(state)) => SamplerRecord::Snapshot {
                model: model
                    .map(|m| m.parse::<ModelId>())
                    .transpose()
                    .map_err(damaged)?,
                state,
            },
            (None, None) => SamplerRecord::Base,
        };
        objects.push(Change::Sampler {
            id: SamplerId::parse(&id).map_err(damaged)?,
            tenant: recorded_tenant(owner)?,
            base,
            source,
        });
    }
    let mut query = db.prepare("SELECT id, tenant, loss FROM custom_losses")?;
    let rows = query.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Vec<u8>>(2)?,
        ))
    })?;
    for row in rows {
        let (id, owner, loss) = row?;
        objects.push(Change::CustomLoss {
            id: id
                .parse::<LossId>()
                .map_err(|e| JournalError::Damaged(e.to_string()))?,
            tenant: recorded_tenant(owner)?,
            loss: serde_json::from_slice(&loss)
                .map_err(|e| JournalError::Damaged(format!("custom loss {id}: {e}")))?,
        });
    }
    Ok(objects)
}

/// The requests not finished, and those finished since `since` (their answers kept for the
/// SDK's polls).
type Requests = (Vec<FinishedRequest>, Vec<AcceptedRequest>);

/// The requests the journal holds: those finished since `since`, and those not finished.
fn load_requests(db: &Connection, since: i64) -> Result<Requests, JournalError> {
    let mut finished = Vec::new();
    let mut pending = Vec::new();
    let mut query = db.prepare(
        "SELECT id, tenant, idempotency_key, payload, route, body, finished, answer_kind, answer
         FROM requests WHERE finished = 0 OR finished_at >= ?1 ORDER BY seq",
    )?;
    let rows = query.query_map(params![since], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, Vec<u8>>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, Vec<u8>>(5)?,
            r.get::<_, bool>(6)?,
            r.get::<_, Option<String>>(7)?,
            r.get::<_, Option<Vec<u8>>>(8)?,
        ))
    })?;
    for row in rows {
        let (id, owner, key, payload, route, body, done, kind, answer) = row?;
        let (tenant, payload) = (recorded_tenant(owner)?, digest(payload)?);
        if !done {
            pending.push(AcceptedRequest {
                id,
                tenant,
                idempotency_key: key,
                payload,
                route,
                body,
            });
            continue;
        }
        let outcome = outcome(kind.as_deref(), answer.unwrap_or_default())?;
        finished.push(FinishedRequest {
            id,
            tenant,
            idempotency_key: key,
            payload,
            outcome,
        });
    }
    Ok((finished, pending))
}

/// A session as recorded: what it made that is still there.
#[derive(Clone, Debug)]
pub struct SessionRecord {
    pub training_runs: Vec<ModelId>,
    pub samplers: Vec<SamplerId>,
}

/// A training run (one model) as recorded.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub id: ModelId,
    pub base: String,
    pub lora_rank: usize,
    pub user_metadata: UserMetadata,
    /// When an op of the model last changed it (its creation at least), in Unix seconds.
    pub last_request_at: i64,
}

const RUN_COLUMNS: &str = "id, base, lora_rank, user_metadata, last_request_at";

/// A `models` row as a [`RunRecord`]; a damaged id or metadata is a conversion failure.
fn run_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let damaged = |column: usize, error: Box<dyn std::error::Error + Send + Sync>| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, error)
    };
    let id: String = row.get(0)?;
    let metadata: Option<String> = row.get(3)?;
    Ok(RunRecord {
        id: id
            .parse()
            .map_err(|e: ApiError| damaged(0, e.message.into()))?,
        base: row.get(1)?,
        lora_rank: row.get::<_, i64>(2)? as usize,
        user_metadata: match metadata {
            Some(text) => serde_json::from_str(&text).map_err(|e| damaged(3, e.into()))?,
            None => UserMetadata::new(),
        },
        last_request_at: row.get::<_, Option<i64>>(4)?.unwrap_or(0),
    })
}

/// A recorded answer.
fn outcome(kind: Option<&str>, answer: Vec<u8>) -> Result<Outcome, JournalError> {
    Ok(match kind {
        Some("json") => Ok(Answer::Json(
            serde_json::from_slice(&answer).map_err(|e| JournalError::Damaged(e.to_string()))?,
        )),
        Some("proto") => Ok(Answer::Proto(answer)),
        Some("error") => Err(serde_json::from_slice(&answer).unwrap_or_else(|_| {
            ApiError::new(ApiErrorKind::Internal, "the recorded error is damaged")
        })),
        other => return Err(JournalError::Damaged(format!("answer kind {other:?}"))),
    })
}

fn apply(tx: &rusqlite::Transaction<'_>, change: &Change) -> Result<(), JournalError> {
    match change {
        Change::Session { id, tenant } => {
            tx.execute(
                "INSERT OR REPLACE INTO sessions (id, tenant) VALUES (?1, ?2)",
                params![id.as_str(), tenant.as_str()],
            )?;
        }
        Change::Model {
            id,
            tenant,
            base,
            lora_rank,
            applied_seq,
            state: Some(state),
            user_metadata,
        } => {
            let metadata = user_metadata
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| JournalError::Damaged(format!("a run's user_metadata: {e}")))?;
            tx.execute(
                "INSERT INTO models
                     (id, tenant, base, lora_rank, applied_seq, state, user_metadata, last_request_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(id) DO UPDATE SET
                     applied_seq = max(applied_seq, excluded.applied_seq),
                     state = excluded.state,
                     user_metadata = coalesce(excluded.user_metadata, user_metadata),
                     last_request_at = excluded.last_request_at",
                params![
                    id.to_string(),
                    tenant.as_str(),
                    base,
                    *lora_rank as i64,
                    *applied_seq as i64,
                    state,
                    metadata,
                    unix_now()
                ],
            )?;
        }
        Change::Model {
            id,
            applied_seq,
            state: None,
            ..
        } => {
            tx.execute(
                "UPDATE models SET applied_seq = max(applied_seq, ?2), last_request_at = ?3
                 WHERE id = ?1",
                params![id.to_string(), *applied_seq as i64, unix_now()],
            )?;
        }
        Change::Sampler {
            id,
            tenant,
            base,
            source,
        } => {
            let (checkpoint, snapshot, model) = match source {
                SamplerRecord::Base => (None, None, None),
                SamplerRecord::Checkpoint(path) => (Some(path.to_string()), None, None),
                SamplerRecord::Snapshot { model, state } => (
                    None,
                    Some(state.as_slice()),
                    model.as_ref().map(ToString::to_string),
                ),
            };
            tx.execute(
                "INSERT OR REPLACE INTO samplers (id, tenant, base, checkpoint, snapshot, model)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    id.as_str(),
                    tenant.as_str(),
                    base,
                    checkpoint,
                    snapshot,
                    model
                ],
            )?;
        }
        Change::SamplerDropped { id } => {
            tx.execute("DELETE FROM samplers WHERE id = ?1", params![id.as_str()])?;
        }
        Change::CustomLoss { id, tenant, loss } => {
            let loss = serde_json::to_vec(loss)
                .map_err(|e| JournalError::Damaged(format!("a custom loss: {e}")))?;
            tx.execute(
                "INSERT OR IGNORE INTO custom_losses (id, tenant, loss) VALUES (?1, ?2, ?3)",
                params![id.to_string(), tenant.as_str(), loss],
            )?;
        }
        // The session's objects are freed: its models' states (their rows stay, as training
        // runs), its samplers and custom losses. Ids are `SESSION:train:N`, `SESSION:sample:N`
        // and `SESSION:loss:N`.
        Change::SessionFinished { id } => {
            let session = id.as_str();
            tx.execute(
                "UPDATE sessions SET finished_at = coalesce(finished_at, ?2) WHERE id = ?1",
                params![session, unix_now()],
            )?;
            tx.execute(
                "UPDATE models SET state = x'' WHERE substr(id, 1, length(?1)) = ?1",
                params![format!("{session}:train:")],
            )?;
            tx.execute(
                "DELETE FROM samplers WHERE substr(id, 1, length(?1)) = ?1",
                params![format!("{session}:sample:")],
            )?;
            tx.execute(
                "DELETE FROM custom_losses WHERE substr(id, 1, length(?1)) = ?1",
                params![format!("{session}:loss:")],
            )?;
        }
    }
    Ok(())
}
