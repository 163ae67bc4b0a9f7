//! Who plays a job's groups. The driver hands each [`GroupTask`] to its [`Rollouts`] and awaits
//! the [`PlayedGroup`]; it neither knows nor cares where the episodes ran. [`Samplers`] holds the
//! policy versions the driver has published, by name, for a player in its process.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures::future::BoxFuture;

use super::task::{GroupTask, PlayedGroup, PolicyRef, TaskError};
use crate::client::SamplingClient;

/// Plays groups of episodes for the driver.
pub trait Rollouts: Send + Sync {
    /// Start playing `task`: the policies its seats name are resolved before this returns (a
    /// version published later is not the one the task names), and the future is the group.
    /// An error is the player's own failure (not an episode's): the job cannot go on.
    fn start(&self, task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>>;
}

/// The sampler of each policy version tasks may name now: the base model and the latest
/// version of each trainable policy.
#[derive(Clone, Default)]
pub(crate) struct Samplers(Arc<RwLock<BTreeMap<PolicyRef, Arc<dyn SamplingClient>>>>);

impl Samplers {
    /// `sampler` serves `policy` from now on, in place of the policy's earlier versions.
    pub(crate) fn publish(&self, policy: PolicyRef, sampler: Arc<dyn SamplingClient>) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let PolicyRef::Adapter { policy: name, .. } = &policy {
            table.retain(|served, _| {
                !matches!(served, PolicyRef::Adapter { policy: other, .. } if other == name)
            });
        }
        table.insert(policy, sampler);
    }

    /// The sampler of `policy`, if it is served now.
    pub(crate) fn resolve(&self, policy: &PolicyRef) -> Result<Arc<dyn SamplingClient>, TaskError> {
        let table = self.0.read().unwrap_or_else(PoisonError::into_inner);
        table
            .get(policy)
            .cloned()
            .ok_or_else(|| TaskError::UnknownPolicy(policy.clone()))
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::api::{ApiError, ModelInput, SampleResponse, SamplingParams};

    /// A sampler that is only ever resolved, never sampled.
    struct Unused;

    #[async_trait]
    impl SamplingClient for Unused {
        async fn sample(
            &self,
            _prompt: ModelInput,
            _num_samples: usize,
            _params: SamplingParams,
        ) -> Result<SampleResponse, ApiError> {
            Err(ApiError::internal("not sampled in this test"))
        }
    }

    fn adapter(policy: &str, version: usize) -> PolicyRef {
        PolicyRef::Adapter {
            policy: policy.into(),
            version,
        }
    }

    /// A task names the version it was launched with; once the next version of a policy is
    /// published, the earlier one is no longer served, and the other policies' are untouched.
    #[test]
    fn a_published_version_replaces_the_policys_earlier_ones_only() {
        let samplers = Samplers::default();
        let (first, next, other) = (Arc::new(Unused), Arc::new(Unused), Arc::new(Unused));
        samplers.publish(PolicyRef::Base, Arc::new(Unused));
        samplers.publish(adapter("x", 0), first.clone());
        samplers.publish(adapter("o", 0), other.clone());
        let same = |a: &Arc<dyn SamplingClient>, b: &Arc<Unused>| {
            std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
        };
        assert!(same(&samplers.resolve(&adapter("x", 0)).unwrap(), &first));
        samplers.publish(adapter("x", 1), next.clone());
        assert!(same(&samplers.resolve(&adapter("x", 1)).unwrap(), &next));
        assert!(same(&samplers.resolve(&adapter("o", 0)).unwrap(), &other));
        assert!(samplers.resolve(&PolicyRef::Base).is_ok());
        let gone = samplers.resolve(&adapter("x", 0)).err().unwrap();
        assert_eq!(gone, TaskError::UnknownPolicy(adapter("x", 0)));
        assert_eq!(gone.kind(), crate::rl::FailureKind::TaskPolicy);
        assert_eq!(
            gone.to_string(),
            "the task's policy `x` at version 0 is not served here"
        );
    }
}
