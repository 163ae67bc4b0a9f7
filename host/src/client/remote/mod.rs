//! The clients on a remote server (`opentinker serve`, or any server of the Tinker wire), over
//! HTTP as the official SDK speaks it: `opentinker train JOB --server URL` runs the same RL and SFT
//! loops against it as in process, its plugins still running locally, sandboxed.
//!
//! Checkpoints stay on the server: [`TrainingClient::save_state`] saves the adapter there and
//! writes into the local folder only [`REMOTE_CHECKPOINT`], which names the server's
//! `tinker://` path; [`ServiceClient::create_training_client_from_state`] loads it back from
//! that path (so `--resume` works against the same server and tenant).

mod http;
mod jobs;

pub use jobs::JobsClient;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Mutex, OnceCell};

use self::http::{Body, Connection, text_field};
use super::{SamplingClient, ServiceClient, TrainingClient};
use crate::api::{
    AdamParams, ApiError, ApiErrorKind, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig,
    ModelInput, OptimStepOutput, SampleResponse, SamplingParams,
};
use crate::market::Digest;
use crate::plugin::{Limits, Plugin, PluginKind};
use crate::queue_auth::WorkerAccess;
use crate::wire;

/// The file a checkpoint folder holds when its adapter was saved on a remote server.
pub const REMOTE_CHECKPOINT: &str = "remote-checkpoint.json";

/// What [`REMOTE_CHECKPOINT`] records.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteCheckpoint {
    /// The server's `tinker://` path of the saved state.
    pub path: String,
    /// The base model the adapter was trained on.
    pub base_model: String,
}

/// A base model served by a remote server, in one session of one tenant; clone it freely.
#[derive(Clone)]
pub struct RemoteService(Arc<Remote>);

struct Remote {
    connection: Connection,
    session: String,
    base_model: String,
    context: usize,
    next_model: AtomicU64,
    next_sampler: AtomicU64,
}

impl RemoteService {
    /// Open a session on the server at `url` with API key `key`, for training on `base_model`
    /// (refused, naming the served models, when the server does not serve it).
    pub async fn connect(url: &str, key: &str, base_model: &str) -> Result<Self, ApiError> {
        let connection = Connection::new(url, key)?;
        let capabilities = connection.get("get_server_capabilities").await?;
        let models = capabilities["supported_models"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let served = models
            .iter()
            .find(|m| m["model_name"] == base_model)
            .ok_or_else(|| {
                let names: Vec<&str> = models
                    .iter()
                    .filter_map(|m| m["model_name"].as_str())
                    .collect();
                ApiError::invalid(format!(
                    "{url} does not serve {base_model:?} (it serves: {})",
                    names.join(", ")
                ))
            })?;
        let context = served["max_context_length"]
            .as_u64()
            .and_then(|c| usize::try_from(c).ok())
            .unwrap_or(usize::MAX);
        let session = json!({
            "tags": ["opentinker-train"],
            "user_metadata": {},
            "sdk_version": concat!("opentinker-", env!("CARGO_PKG_VERSION")),
            "type": "create_session",
        });
        let answer = connection
            .post("create_session", Body::Json(session))
            .await?
            .json("create_session")?;
        let session = text_field(&answer, "session_id", "create_session")?;
        Ok(RemoteService(Arc::new(Remote {
            connection,
            session,
            base_model: base_model.to_string(),
            context,
            next_model: AtomicU64::new(0),
            next_sampler: AtomicU64::new(0),
        })))
    }
}

impl Remote {
    fn training_client(self: &Arc<Self>, model_id: String) -> Arc<dyn TrainingClient> {
        Arc::new(RemoteTraining {
            remote: Arc::clone(self),
            model_id,
            next_seq: Mutex::new(1),
        })
    }
}

#[async_trait]
impl ServiceClient for RemoteService {
    fn base_model(&self) -> &str {
        &self.0.base_model
    }

    fn context_length(&self) -> usize {
        self.0.context
    }

    async fn create_lora_training_client(
        &self,
        _label: &str,
        config: &LoraConfig,
    ) -> Result<Arc<dyn TrainingClient>, ApiError> {
        let remote = &self.0;
        let request = json!({
            "session_id": remote.session,
            "model_seq_id": remote.next_model.fetch_add(1, Ordering::Relaxed),
            "base_model": remote.base_model,
            "lora_config": config,
            "optimizer_config": {"type": "adamw"},
        });
        let answer = remote
            .connection
            .call("create_model", Body::Json(request))
            .await?
            .json("create_model")?;
        Ok(remote.training_client(text_field(&answer, "model_id", "create_model")?))
    }

    async fn create_training_client_from_state(
        &self,
        _label: &str,
        dir: &Path,
        with_optimizer: bool,
    ) -> Result<Arc<dyn TrainingClient>, ApiError> {
        let remote = &self.0;
        let file = dir.join(REMOTE_CHECKPOINT);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            ApiError::invalid(format!(
                "{}: {e} (a checkpoint trained against a server holds this file; one trained in \
                 process cannot be resumed against a server)",
                file.display()
            ))
        })?;
        let checkpoint: RemoteCheckpoint = serde_json::from_str(&text)
            .map_err(|e| ApiError::invalid(format!("{}: {e}", file.display())))?;
        if checkpoint.base_model != remote.base_model {
            return Err(ApiError::invalid(format!(
                "{}: trained on {:?}, not {:?}",
                file.display(),
                checkpoint.base_model,
                remote.base_model
            )));
        }
        let request = json!({
            "session_id": remote.session,
            "model_seq_id": remote.next_model.fetch_add(1, Ordering::Relaxed),
            "path": checkpoint.path,
            "optimizer": with_optimizer,
        });
        let answer = remote
            .connection
            .call("load_weights", Body::Json(request))
            .await?
            .json("load_weights")?;
        Ok(remote.training_client(text_field(&answer, "model_id", "load_weights")?))
    }

    fn base_sampling_client(&self) -> Arc<dyn SamplingClient> {
        Arc::new(RemoteSampling {
            remote: Arc::clone(&self.0),
            session: OnceCell::new(),
        })
    }

    /// Upload the objective's component; the server loads it when a `forward_backward` names
    /// its digest, and runs it under its own limits (not the job's).
    async fn objective_loss(
        &self,
        plugin: &Plugin,
        component: &Path,
        _limits: &Limits,
    ) -> Result<String, ApiError> {
        if !plugin.description().kinds.contains(&PluginKind::Objective) {
            return Err(ApiError::invalid(format!(
                "plugin sha256:{} is not an objective",
                plugin.digest()
            )));
        }
        let bytes = tokio::fs::read(component).await.map_err(|e| {
            ApiError::invalid(format!(
                "reading the objective {}: {e}",
                component.display()
            ))
        })?;
        let (digest, _) = self.0.connection.upload_plugin(bytes).await?;
        Ok(digest)
    }

    async fn share_plugin(&self, component: &Path) -> Result<String, ApiError> {
        let bytes = tokio::fs::read(component).await.map_err(|e| {
            ApiError::invalid(format!("reading the plugin {}: {e}", component.display()))
        })?;
        let (digest, _) = self.0.connection.upload_plugin(bytes).await?;
        Ok(digest)
    }

    fn sampling_client_at(&self, address: &str) -> Result<Arc<dyn SamplingClient>, ApiError> {
        Ok(Arc::new(RemoteSampling {
            remote: Arc::clone(&self.0),
            session: OnceCell::new_with(Some(address.to_string())),
        }))
    }

    async fn download_plugin(&self, digest: &str) -> Result<Vec<u8>, ApiError> {
        let bytes = self
            .0
            .connection
            .get_bytes(&format!("plugins/{digest}/component"))
            .await?;
        let found = Digest::of(&bytes);
        if found.as_str() != digest {
            return Err(ApiError::internal(format!(
                "the server's copy of plugin {digest} has digest {found}"
            )));
        }
        Ok(bytes.to_vec())
    }
}

impl RemoteService {
    /// How a rollout worker of this tenant logs in to the server's queue (`POST
    /// /api/v1/rollout_access`): `None` where the server signs no workers (its queue is open).
    pub async fn worker_access(&self) -> Result<Option<WorkerAccess>, ApiError> {
        let path = "rollout_access";
        let answer = match self.0.connection.post(path, Body::Json(json!({}))).await {
            Ok(answer) => answer.json(path)?,
            Err(error) if error.kind == ApiErrorKind::NotOffered => return Ok(None),
            Err(error) => return Err(error),
        };
        serde_json::from_value(answer)
            .map(Some)
            .map_err(|e| ApiError::internal(format!("the server's rollout access: {e}")))
    }
}

/// An adapter and its optimizer on the server. Its requests are numbered `seq_id` 1, 2, ... and
/// each is submitted only once the one before it was accepted: the server runs a model's
/// requests in that order.
struct RemoteTraining {
    remote: Arc<Remote>,
    model_id: String,
    next_seq: Mutex<i32>,
}

impl RemoteTraining {
    /// Submit the op that `body` makes from its `seq_id`, in order, and wait for its result.
    async fn call(
        &self,
        path: &str,
        body: impl FnOnce(i32) -> Body,
    ) -> Result<http::Reply, ApiError> {
        let mut next = self.next_seq.lock().await;
        let seq = *next;
        *next += 1;
        // Submitted under the lock (its order is the seq order), answered after it.
        let connection = &self.remote.connection;
        let submitted = connection.post(path, body(seq)).await;
        drop(next);
        let submitted = submitted?.json(path)?;
        let request_id = text_field(&submitted, "request_id", path)?;
        connection.wait(&request_id, path).await
    }

    async fn forward_backward_call(
        &self,
        input: ForwardBackwardInput,
        forward_only: bool,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        let model_id = self.model_id.clone();
        let reply = self
            .call("forward_backward", |seq| {
                Body::Proto(wire::encode_forward_backward_request(
                    &model_id,
                    seq,
                    &input,
                    forward_only,
                ))
            })
            .await?;
        wire::decode_forward_backward_output(&reply.proto("forward_backward")?)
    }
}

#[async_trait]
impl TrainingClient for RemoteTraining {
    async fn forward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        self.forward_backward_call(input, true).await
    }

    async fn forward_backward(
        &self,
        input: ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput, ApiError> {
        self.forward_backward_call(input, false).await
    }

    async fn optim_step(&self, params: AdamParams) -> Result<OptimStepOutput, ApiError> {
        let reply = self
            .call("optim_step", |seq| {
                Body::Json(json!({
                    "model_id": self.model_id,
                    "seq_id": seq,
                    "adam_params": params,
                }))
            })
            .await?
            .json("optim_step")?;
        let metrics = serde_json::from_value(reply["metrics"].clone()).unwrap_or_default();
        Ok(OptimStepOutput { metrics })
    }

    async fn save_weights_and_get_sampling_client(
        &self,
    ) -> Result<Arc<dyn SamplingClient>, ApiError> {
        let sampler_seq = self.remote.next_sampler.fetch_add(1, Ordering::Relaxed);
        let reply = self
            .call("save_weights_for_sampler", |seq| {
                Body::Json(json!({
                    "model_id": self.model_id,
                    "sampling_session_seq_id": sampler_seq,
                    "seq_id": seq,
                    "kind": "sampler",
                }))
            })
            .await?
            .json("save_weights_for_sampler")?;
        let session = text_field(&reply, "sampling_session_id", "save_weights_for_sampler")?;
        Ok(Arc::new(RemoteSampling {
            remote: Arc::clone(&self.remote),
            session: OnceCell::new_with(Some(session)),
        }))
    }

    /// Save the adapter and its optimizer state on the server (the server always keeps both)
    /// and record its `tinker://` path in `dir`.
    async fn save_state(&self, dir: &Path, _with_optimizer: bool) -> Result<(), ApiError> {
        let reply = self
            .call("save_weights", |seq| {
                Body::Json(json!({
                    "model_id": self.model_id,
                    "path": format!("state-{seq}"),
                    "seq_id": seq,
                    "overwrite": false,
                }))
            })
            .await?
            .json("save_weights")?;
        let checkpoint = RemoteCheckpoint {
            path: text_field(&reply, "path", "save_weights")?,
            base_model: self.remote.base_model.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&checkpoint)
            .map_err(|e| ApiError::internal(format!("encoding {REMOTE_CHECKPOINT}: {e}")))?;
        std::fs::create_dir_all(dir)
            .and_then(|()| crate::store::write_atomic(&dir.join(REMOTE_CHECKPOINT), &bytes))
            .map_err(|e| ApiError::internal(format!("writing into {}: {e}", dir.display())))
    }
}

/// A sampling session on the server: a frozen adapter version, or the base model (its session
/// made at the first sample).
struct RemoteSampling {
    remote: Arc<Remote>,
    session: OnceCell<String>,
}

impl RemoteSampling {
    async fn session(&self) -> Result<&str, ApiError> {
        let remote = &self.remote;
        self.session
            .get_or_try_init(|| async {
                let request = json!({
                    "session_id": remote.session,
                    "sampling_session_seq_id": remote.next_sampler.fetch_add(1, Ordering::Relaxed),
                    "base_model": remote.base_model,
                });
                let answer = remote
                    .connection
                    .post("create_sampling_session", Body::Json(request))
                    .await?
                    .json("create_sampling_session")?;
                text_field(&answer, "sampling_session_id", "create_sampling_session")
            })
            .await
            .map(String::as_str)
    }
}

#[async_trait]
impl SamplingClient for RemoteSampling {
    async fn sample(
        &self,
        prompt: ModelInput,
        num_samples: usize,
        params: SamplingParams,
    ) -> Result<SampleResponse, ApiError> {
        let request = json!({
            "num_samples": num_samples,
            "prompt": prompt,
            "sampling_params": params,
            "sampling_session_id": self.session().await?,
            "prompt_logprobs": false,
        });
        let reply = self
            .remote
            .connection
            .call("asample", Body::Json(request))
            .await?;
        wire::decode_sample_response(&reply.proto("asample")?)
    }

    async fn address(&self) -> Result<Option<String>, ApiError> {
        Ok(Some(self.session().await?.to_string()))
    }
}
