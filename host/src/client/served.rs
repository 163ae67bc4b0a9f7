//! The bases a server already serves, as one tenant's job reaches them: a job the server runs
//! trains and samples on the same loops as every Tinker-API client, its share of them fair by
//! its tenant's weight, and its adapters named apart from everyone else's.

use std::path::PathBuf;
use std::sync::Arc;

use super::ModelText;
use super::local::{LocalService, WireSamplers};
use crate::api::TenantId;
use crate::queue_auth::QueueLogin;
use crate::service::{ServedBase, TINY_MODEL_NAME};

/// Where a job's rollout workers take its RL groups: the queue (`nats://host:port`) and the
/// pool of workers there (on a server, the job's tenant's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutQueue {
    pub url: String,
    pub pool: String,
    /// How the driver logs in to the queue.
    pub login: QueueLogin,
}

/// A server's served bases, for one tenant's job.
#[derive(Clone)]
pub struct TenantBases {
    bases: Vec<Arc<ServedBase>>,
    tenant: TenantId,
    adapter_prefix: String,
    /// The rollout queue whose workers play the job's groups (in the tenant's pool), and where
    /// its versions are opened for them.
    rollouts: Option<(RolloutQueue, WireSamplers)>,
}

/// One served base as a job sees it.
pub struct ServedModel {
    /// Training and sampling on the base's shared loops, as the tenant.
    pub service: LocalService,
    /// The base's model folder (a full-parameter warm-up starts from its weights).
    pub dir: PathBuf,
    pub text: ModelText,
    /// The rollout queue whose workers play the job's groups on this base (sampling its
    /// versions over the wire); `None`: the job plays them itself.
    pub rollouts: Option<RolloutQueue>,
}

impl TenantBases {
    /// `bases` as `tenant` reaches them; every adapter made on them is named `adapter_prefix...`.
    pub fn new(bases: Vec<Arc<ServedBase>>, tenant: TenantId, adapter_prefix: String) -> Self {
        TenantBases {
            bases,
            tenant,
            adapter_prefix,
            rollouts: None,
        }
    }

    /// These bases with the rollout queue at `url` playing the job's groups in the tenant's
    /// pool, its versions opened for the workers by `wire`.
    pub fn with_rollouts(self, url: String, login: QueueLogin, wire: WireSamplers) -> Self {
        let queue = RolloutQueue {
            url,
            pool: self.tenant.as_str().to_string(),
            login,
        };
        TenantBases {
            rollouts: Some((queue, wire)),
            ..self
        }
    }

    /// The name of the built-in tiny model, which a server always serves.
    pub fn built_in_tiny() -> &'static str {
        TINY_MODEL_NAME
    }

    /// The served base called `name`.
    pub fn base(&self, name: &str) -> Option<ServedModel> {
        let base = self.bases.iter().find(|b| b.name == name)?;
        let wire = self.rollouts.as_ref().map(|(_, wire)| wire.clone());
        Some(ServedModel {
            service: LocalService::on_base(base, &self.tenant, &self.adapter_prefix, wire),
            dir: base.dir.clone(),
            text: ModelText {
                tokenizer: Arc::clone(&base.tokenizer),
                chat_template: base.chat_template.clone(),
            },
            rollouts: self.rollouts.as_ref().map(|(queue, _)| queue.clone()),
        })
    }

    /// The names of the served bases.
    pub fn names(&self) -> Vec<&str> {
        self.bases.iter().map(|b| b.name.as_str()).collect()
    }
}
