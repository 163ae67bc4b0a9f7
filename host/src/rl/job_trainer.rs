//! A job's view of its base model's training loop ([`TrainerService`]): the job names its
//! policies, and the loop knows them as `job/policy`, next to every other job's adapters on that
//! base. A training step is one `forward_backward` (fused with other jobs' steps of the same
//! clock cycle) and then an `optim_step` of each adapter that had datums.

use std::path::PathBuf;
use std::sync::Arc;

use crate::lora::{AdapterRegistry, LoraConfig, PolicyVersion};
use crate::sched::TrainerService;
use crate::train::{AdamParams, Datum, ItemOutput, Loss, TrainingEngine, WorkItem};

/// The datums of one policy in a training step.
pub(super) type PolicyBatch = (String, Vec<Datum>);

#[derive(Clone)]
pub(super) struct JobTrainer {
    service: TrainerService,
    /// `Some(job)`: the job's policies are `job/policy` in the loop; `None`: names as they are
    /// (a full-parameter engine, whose one trainable is `FULL_PARAMETERS`).
    job: Option<String>,
}

impl JobTrainer {
    pub(super) fn new(service: TrainerService, job: &str) -> Self {
        JobTrainer {
            service,
            job: Some(job.to_string()),
        }
    }

    /// A trainer whose names are the engine's own (a full-parameter warm-up's engine).
    pub(super) fn unscoped(service: TrainerService) -> Self {
        JobTrainer { service, job: None }
    }

    /// The engine's name for the job's `policy`.
    pub(super) fn id(&self, policy: &str) -> String {
        match &self.job {
            Some(job) => format!("{job}/{policy}"),
            None => policy.to_string(),
        }
    }

    /// Run `work` on the engine alone, on the loop's thread.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut TrainingEngine) -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        Ok(self.service.with(work).await?)
    }

    pub(super) async fn add_adapter(&self, policy: &str, config: LoraConfig) -> anyhow::Result<()> {
        let id = self.id(policy);
        Ok(self.run(move |e| e.add_adapter(&id, config)).await??)
    }

    pub(super) async fn load_adapter(
        &self,
        policy: &str,
        dir: PathBuf,
        with_optimizer: bool,
    ) -> anyhow::Result<()> {
        let id = self.id(policy);
        Ok(self
            .run(move |e| e.load_adapter(&id, &dir, with_optimizer))
            .await??)
    }

    pub(super) async fn save_adapter(
        &self,
        policy: &str,
        dir: PathBuf,
        base_name: &str,
        with_optimizer: bool,
    ) -> anyhow::Result<()> {
        let (id, base_name) = (self.id(policy), base_name.to_string());
        Ok(self
            .run(move |e| e.save_adapter(&id, &dir, &base_name, with_optimizer))
            .await??)
    }

    /// Publish `policy`'s adapter as the next version of `name` in `registry` (taken on the
    /// loop's thread, so no training step is half applied to it).
    pub(super) async fn publish(
        &self,
        policy: &str,
        registry: Arc<AdapterRegistry>,
        name: String,
    ) -> anyhow::Result<Arc<PolicyVersion>> {
        let id = self.id(policy);
        self.run(move |e| -> anyhow::Result<Arc<PolicyVersion>> {
            let adapter = e
                .adapter(&id)
                .ok_or_else(|| anyhow::anyhow!("no adapter for policy {id}"))?;
            Ok(registry.publish(&name, adapter)?)
        })
        .await?
    }

    /// `policy`'s logprobs of `datums` (and its cross-entropy), without gradients.
    pub(super) async fn forward_cross_entropy(
        &self,
        policy: &str,
        datums: Vec<Datum>,
    ) -> anyhow::Result<Vec<ItemOutput>> {
        let item = WorkItem {
            adapter: self.id(policy),
            datums,
            loss: Loss::CrossEntropy,
        };
        Ok(self.run(move |e| e.forward(&[item])).await??)
    }

    /// One training step: a `forward_backward` over every policy's datums, then an
    /// `optim_step` of each policy that had some. Returns the loss per counted token and the
    /// counted tokens.
    pub(super) async fn train(
        &self,
        batches: Vec<PolicyBatch>,
        loss: Loss,
        learning_rate: f64,
    ) -> anyhow::Result<(f64, usize)> {
        let items: Vec<WorkItem> = batches
            .into_iter()
            .filter(|(_, datums)| !datums.is_empty())
            .map(|(policy, datums)| WorkItem {
                adapter: self.id(&policy),
                datums,
                loss: loss.clone(),
            })
            .collect();
        if items.is_empty() {
            return Ok((0.0, 0));
        }
        let adapters: Vec<String> = items.iter().map(|i| i.adapter.clone()).collect();
        let outputs = self.service.forward_backward(items).await?;
        let params = AdamParams {
            learning_rate,
            grad_clip_norm: 1.0,
            ..AdamParams::default()
        };
        self.run(move |e| {
            adapters
                .iter()
                .try_for_each(|id| e.optim_step(id, &params).map(|_| ()))
        })
        .await??;
        Ok(loss_per_token(&outputs))
    }
}

/// A job's adapter slots in the shared trainer, freed when this is dropped (the job finished or
/// failed), so the trainer goes on serving the other jobs without them.
pub(super) struct Slots {
    trainer: JobTrainer,
    policies: Vec<String>,
}

impl Slots {
    pub(super) fn new(trainer: &JobTrainer) -> Self {
        Slots {
            trainer: trainer.clone(),
            policies: Vec::new(),
        }
    }

    /// Free `policy`'s slot (if it comes to have one) with the others.
    pub(super) fn hold(&mut self, policy: &str) {
        self.policies.push(policy.to_string());
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for policy in &self.policies {
            let id = self.trainer.id(policy);
            self.trainer.service.detach(move |engine| {
                // A slot that was never made has nothing to free.
                let _ = engine.remove_adapter(&id);
            });
        }
    }
}

/// The summed losses of `outputs` per token that counts, and those tokens.
pub(super) fn loss_per_token(outputs: &[ItemOutput]) -> (f64, usize) {
    let tokens: f64 = outputs
        .iter()
        .map(|o| o.metrics.get("tokens:sum").copied().unwrap_or(0.0))
        .sum();
    let total: f64 = outputs.iter().map(|o| o.loss).sum();
    (total / tokens.max(1.0), tokens as usize)
}
