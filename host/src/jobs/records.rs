//! The jobs table of the server database: what each tenant submitted and where each job stands,
//! so that a restarted server knows which jobs to resume. A job's files (metrics, rollouts,
//! checkpoints) live in its run folder; the table holds what the API lists.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::api::{JobId, TenantId};
use crate::store::open_database;

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Accepted, not started (or waiting for the server to start again).
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            JobState::Queued,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
        ]
        .into_iter()
        .find(|s| s.name() == text)
    }

    /// Whether the job has ended (nothing will change it again).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// One job as recorded.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    #[serde(skip)]
    pub tenant: Option<TenantId>,
    /// The name the submitter gave (the job file's stem, by default).
    pub name: String,
    pub state: JobState,
    /// Why a failed job failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What a succeeded job reports (`train --json`'s summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<serde_json::Value>,
    /// Unix seconds.
    pub created_at: i64,
    pub updated_at: i64,
    /// The job file as submitted (plugins named by digest).
    #[serde(skip)]
    pub spec: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("the server database: {0}")]
    Database(#[from] rusqlite::Error),
    #[error("the jobs table holds an unknown state {0:?}")]
    UnknownState(String),
    #[error("the jobs table holds a bad id or tenant: {0}")]
    BadId(#[from] crate::api::ApiError),
}

/// The jobs table.
pub struct JobRecords {
    db: Mutex<Connection>,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

const COLUMNS: &str = "id, tenant, name, state, error, summary, created_at, updated_at, spec";

/// A row as read, before its id, tenant and state are checked.
struct Row {
    id: String,
    tenant: String,
    name: String,
    state: String,
    error: Option<String>,
    summary: Option<String>,
    created_at: i64,
    updated_at: i64,
    spec: String,
}

fn record_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: row.get(0)?,
        tenant: row.get(1)?,
        name: row.get(2)?,
        state: row.get(3)?,
        error: row.get(4)?,
        summary: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
        spec: row.get(8)?,
    })
}

fn complete(row: Row) -> Result<JobRecord, RecordError> {
    Ok(JobRecord {
        id: JobId::parse(&row.id)?,
        tenant: Some(TenantId::new(&row.tenant)?),
        name: row.name,
        state: JobState::parse(&row.state).ok_or(RecordError::UnknownState(row.state))?,
        error: row.error,
        summary: row.summary.and_then(|s| serde_json::from_str(&s).ok()),
        created_at: row.created_at,
        updated_at: row.updated_at,
        spec: row.spec,
    })
}

impl JobRecords {
    /// Open (or make) the table in the database of `data`.
    pub fn open(data: &Path) -> Result<Self, RecordError> {
        let db = open_database(data)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS jobs (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 name TEXT NOT NULL,
                 state TEXT NOT NULL,
                 error TEXT,
                 summary TEXT,
                 created_at INTEGER NOT NULL,
                 updated_at INTEGER NOT NULL,
                 spec TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, created_at);",
        )?;
        Ok(JobRecords { db: Mutex::new(db) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A statement either ran or did not: the connection is whole after a panic.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a new job, queued.
    pub fn insert(
        &self,
        id: &JobId,
        tenant: &TenantId,
        name: &str,
        spec: &str,
    ) -> Result<JobRecord, RecordError> {
        let at = now();
        self.db().execute(
            "INSERT INTO jobs (id, tenant, name, state, created_at, updated_at, spec)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
            params![
                id.as_str(),
                tenant.as_str(),
                name,
                JobState::Queued.name(),
                at,
                spec
            ],
        )?;
        Ok(JobRecord {
            id: id.clone(),
            tenant: Some(tenant.clone()),
            name: name.to_string(),
            state: JobState::Queued,
            error: None,
            summary: None,
            created_at: at,
            updated_at: at,
            spec: spec.to_string(),
        })
    }

    /// Move a job to `state`, with the error or summary it ended with. A job already ended
    /// stays as it ended (a cancelled job's task may still report its end).
    pub fn set_state(
        &self,
        id: &JobId,
        state: JobState,
        error: Option<&str>,
        summary: Option<&serde_json::Value>,
    ) -> Result<(), RecordError> {
        let summary = summary.map(|s| s.to_string());
        self.db().execute(
            "UPDATE jobs SET state = ?2, error = ?3, summary = ?4, updated_at = ?5
             WHERE id = ?1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            params![id.as_str(), state.name(), error, summary, now()],
        )?;
        Ok(())
    }

    /// `tenant`'s job `id`; another tenant's is `None`, as an unknown one.
    pub fn get(&self, tenant: &TenantId, id: &JobId) -> Result<Option<JobRecord>, RecordError> {
        let row = self
            .db()
            .query_row(
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1 AND tenant = ?2"),
                params![id.as_str(), tenant.as_str()],
                record_of,
            )
            .optional()?;
        row.map(complete).transpose()
    }

    /// `tenant`'s jobs, newest first.
    pub fn list(&self, tenant: &TenantId) -> Result<Vec<JobRecord>, RecordError> {
        let db = self.db();
        let mut statement = db.prepare(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE tenant = ?1 ORDER BY created_at DESC, id"
        ))?;
        let rows = statement.query_map(params![tenant.as_str()], record_of)?;
        rows.map(|row| complete(row?)).collect()
    }

    /// Every job that has not ended, the running ones first (they held their memory), then in
    /// the order they were submitted: what a restarted server resumes, and admits, in turn.
    pub fn unfinished(&self) -> Result<Vec<JobRecord>, RecordError> {
        let db = self.db();
        let mut statement = db.prepare(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE state IN ('queued', 'running')
             ORDER BY state = 'queued', created_at, rowid"
        ))?;
        let rows = statement.query_map([], record_of)?;
        rows.map(|row| complete(row?)).collect()
    }

    /// How many of `tenant`'s jobs have not ended.
    pub fn active(&self, tenant: &TenantId) -> Result<usize, RecordError> {
        let count: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state IN ('queued', 'running')",
            params![tenant.as_str()],
            |row| row.get(0),
        )?;
        Ok(count as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_only_its_jobs_and_an_ended_job_stays_ended() {
        let data = tempfile::tempdir().unwrap();
        let records = JobRecords::open(data.path()).unwrap();
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        let id = JobId::random().unwrap();
        records.insert(&id, &alice, "ttt", "[rl]").unwrap();
        assert!(records.get(&bob, &id).unwrap().is_none());
        assert!(records.list(&bob).unwrap().is_empty());
        assert_eq!(records.active(&alice).unwrap(), 1);
        records
            .set_state(&id, JobState::Cancelled, None, None)
            .unwrap();
        records
            .set_state(&id, JobState::Succeeded, None, None)
            .unwrap();
        let record = records.get(&alice, &id).unwrap().unwrap();
        assert_eq!(record.state, JobState::Cancelled);
        assert_eq!(record.spec, "[rl]");
        assert!(records.unfinished().unwrap().is_empty());
        // A reopened table holds the same.
        drop(records);
        let records = JobRecords::open(data.path()).unwrap();
        assert_eq!(records.list(&alice).unwrap().len(), 1);
    }
}
