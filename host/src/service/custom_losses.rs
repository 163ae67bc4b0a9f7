//! The custom losses of every tenant's sessions (`create_custom_loss`): each graph compiled once
//! against the engine's allow-list when it arrives, kept under its [`LossId`] until its session
//! finishes, and handed to `forward_backward` calls of `loss_fn = "custom"` that name it. A
//! tenant never reaches another's loss: its id answers as an unknown one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::api::{ApiError, CustomLossInput, LossGraph, LossId, SessionId, TenantId};
use crate::train::CompiledLoss;

/// A custom loss as its client sent it: what a durable server records, and compiles again when
/// it restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossRecord {
    pub name: String,
    pub inputs: Vec<CustomLossInput>,
    pub graph: LossGraph,
}

/// A loss as kept: whose it is, and the compiled graph.
struct Kept {
    tenant: TenantId,
    loss: Arc<CompiledLoss>,
}

#[derive(Default)]
pub struct CustomLosses {
    losses: Mutex<HashMap<LossId, Kept>>,
}

/// `record`'s graph checked against the engine's operations and its inputs; a refusal names
/// the node and the operation.
pub fn compile(record: &LossRecord) -> Result<CompiledLoss, ApiError> {
    CompiledLoss::compile(record.graph.clone(), &record.inputs)
        .map_err(|e| ApiError::invalid(format!("create_custom_loss {:?}: {e}", record.name)))
}

impl CustomLosses {
    fn lock(&self) -> MutexGuard<'_, HashMap<LossId, Kept>> {
        // One insert or remove per change: consistent across a panic.
        self.losses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `loss` as `tenant`'s `id`. The same id again (a retried request) keeps the first.
    pub fn keep(&self, tenant: &TenantId, id: LossId, loss: CompiledLoss) {
        self.lock().entry(id).or_insert_with(|| Kept {
            tenant: tenant.clone(),
            loss: Arc::new(loss),
        });
    }

    /// `tenant`'s loss `id`.
    pub fn get(&self, tenant: &TenantId, id: &LossId) -> Result<Arc<CompiledLoss>, ApiError> {
        match self.lock().get(id) {
            Some(kept) if &kept.tenant == tenant => Ok(Arc::clone(&kept.loss)),
            _ => Err(ApiError::not_found(format!("custom loss {id}"))),
        }
    }

    /// Let go of the losses of a finished session.
    pub fn forget_session(&self, session: &SessionId) {
        self.lock().retain(|id, _| &id.session != session);
    }
}
