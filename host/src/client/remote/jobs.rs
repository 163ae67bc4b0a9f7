//! The job API of an opentinker server (not part of the Tinker wire): upload plugins by digest,
//! submit job files, follow, list, cancel and download jobs. Answers are JSON as the server
//! sends it; the CLI reads them into its types.

use bytes::Bytes;
use serde_json::{Value, json};

use super::http::{Body, Connection};
use crate::api::ApiError;

/// One tenant's jobs on one server.
pub struct JobsClient {
    connection: Connection,
}

impl JobsClient {
    /// The job API of the server at `url` (`http://host:port`), as the tenant of `api_key`.
    pub fn connect(url: &str, api_key: &str) -> Result<Self, ApiError> {
        Ok(JobsClient {
            connection: Connection::new(url, api_key)?,
        })
    }

    /// Store the component `bytes` on the server unless it is there already; its digest
    /// (`sha256:HEX`) and whether it was uploaded now.
    pub async fn upload_plugin(&self, bytes: Vec<u8>) -> Result<(String, bool), ApiError> {
        self.connection.upload_plugin(bytes).await
    }

    /// Submit the job file `text` (plugins named by digest) as `name`; the job's record.
    pub async fn submit(&self, name: &str, text: &str) -> Result<Value, ApiError> {
        let body = json!({ "name": name, "job": text });
        self.connection
            .post("jobs", Body::Json(body))
            .await?
            .json("jobs")
    }

    pub async fn list(&self) -> Result<Value, ApiError> {
        self.connection.get("jobs").await
    }

    pub async fn status(&self, id: &str) -> Result<Value, ApiError> {
        self.connection.get(&format!("jobs/{id}")).await
    }

    pub async fn cancel(&self, id: &str) -> Result<Value, ApiError> {
        let path = format!("jobs/{id}/cancel");
        self.connection
            .post(&path, Body::Json(json!({})))
            .await?
            .json(&path)
    }

    /// The files of the job's run folder: `{"files": [{"path", "bytes"}]}`.
    pub async fn files(&self, id: &str) -> Result<Value, ApiError> {
        self.connection.get(&format!("jobs/{id}/files")).await
    }

    /// One file of the job's run folder.
    pub async fn file(&self, id: &str, path: &str) -> Result<Bytes, ApiError> {
        self.connection
            .get_bytes(&format!("jobs/{id}/files/{path}"))
            .await
    }

    /// Follow the job's events (`step`, `evaluation`, `end`, ...), each told to `each` with its
    /// data until the stream ends or `each` answers false.
    pub async fn follow(
        &self,
        id: &str,
        each: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), ApiError> {
        self.connection
            .events(&format!("jobs/{id}/events"), each)
            .await
    }
}
