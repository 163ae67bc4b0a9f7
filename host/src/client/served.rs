//! The bases a server already serves, as one tenant's job reaches them: a job the server runs
//! trains and samples on the same loops as every Tinker-API client, its share of them fair by
//! its tenant's weight, and its adapters named apart from everyone else's.

use std::path::PathBuf;
use std::sync::Arc;

use super::ModelText;
use super::local::LocalService;
use crate::api::TenantId;
use crate::service::{ServedBase, TINY_MODEL_NAME};

/// A server's served bases, for one tenant's job.
#[derive(Clone)]
pub struct TenantBases {
    bases: Vec<Arc<ServedBase>>,
    tenant: TenantId,
    adapter_prefix: String,
}

/// One served base as a job sees it.
pub struct ServedModel {
    /// Training and sampling on the base's shared loops, as the tenant.
    pub service: LocalService,
    /// The base's model folder (a full-parameter warm-up starts from its weights).
    pub dir: PathBuf,
    pub text: ModelText,
}

impl TenantBases {
    /// `bases` as `tenant` reaches them; every adapter made on them is named `adapter_prefix...`.
    pub fn new(bases: Vec<Arc<ServedBase>>, tenant: TenantId, adapter_prefix: String) -> Self {
        TenantBases {
            bases,
            tenant,
            adapter_prefix,
        }
    }

    /// The name of the built-in tiny model, which a server always serves.
    pub fn built_in_tiny() -> &'static str {
        TINY_MODEL_NAME
    }

    /// The served base called `name`.
    pub fn base(&self, name: &str) -> Option<ServedModel> {
        let base = self.bases.iter().find(|b| b.name == name)?;
        Some(ServedModel {
            service: LocalService::on_base(base, &self.tenant, &self.adapter_prefix),
            dir: base.dir.clone(),
            text: ModelText {
                tokenizer: Arc::clone(&base.tokenizer),
                chat_template: base.chat_template.clone(),
            },
        })
    }

    /// The names of the served bases.
    pub fn names(&self) -> Vec<&str> {
        self.bases.iter().map(|b| b.name.as_str()).collect()
    }
}
