//! The rollout queue's users on a server whose queue has accounts (`serve --rollout-key`): the
//! server's own, unrestricted, and each worker's, limited to its tenant's pool.

use crate::api::{ApiError, ApiErrorKind, TenantId};
use crate::queue_auth::{QueueAuthError, QueueAuthority, QueueLogin, WorkerAccess};
use crate::rl::{Pool, Queue, QueueError, QueueSettings};

/// What signs the workers' users, and the server's own connection to the queue, which makes the
/// pools' consumers (their workers may not).
pub struct RolloutAccess {
    authority: QueueAuthority,
    queue: Queue,
    settings: QueueSettings,
}

/// Why the server could not log in to its queue.
#[derive(Debug, thiserror::Error)]
pub enum RolloutAccessError {
    #[error(transparent)]
    Keys(#[from] QueueAuthError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl RolloutAccess {
    /// Connect to the queue at `url` as an unrestricted user of `authority`'s account.
    pub async fn connect(url: &str, authority: QueueAuthority) -> Result<Self, RolloutAccessError> {
        let login = QueueLogin {
            credentials: Some(authority.unrestricted("opentinker-serve")?),
            inbox_prefix: None,
        };
        let settings = QueueSettings::default();
        let queue = Queue::connect(url, settings.clone(), &login).await?;
        Ok(RolloutAccess {
            authority,
            queue,
            settings,
        })
    }

    /// How the server's jobs log in to the queue: as a user of their own, unrestricted.
    pub fn driver_login(&self) -> Result<QueueLogin, QueueAuthError> {
        Ok(QueueLogin {
            credentials: Some(self.authority.unrestricted("opentinker-serve-jobs")?),
            inbox_prefix: None,
        })
    }

    /// A new user for a worker of `tenant`, who may play the tenant's pool only; the pool's
    /// consumer is made first.
    pub async fn worker(&self, tenant: &TenantId) -> Result<WorkerAccess, ApiError> {
        let pool = Pool::new(tenant.as_str());
        self.queue.open_pool(&pool).await.map_err(|e| {
            ApiError::new(
                ApiErrorKind::Unavailable,
                format!("opening the pool's consumer: {e}"),
            )
        })?;
        let credentials = self
            .authority
            .user(&format!("worker-{tenant}"), &pool.worker_permissions())
            .map_err(|e| ApiError::internal(format!("signing a worker: {e}")))?;
        Ok(WorkerAccess {
            pool: tenant.as_str().to_string(),
            login: QueueLogin {
                credentials: Some(credentials),
                inbox_prefix: Some(pool.inbox_prefix()),
            },
            ack_wait_secs: self.settings.ack_wait.as_secs(),
            max_deliver: self.settings.max_deliver,
        })
    }
}
