//! What a rollout worker plays tasks with: the plugins a task names, fetched by digest from the
//! server the driver trains on (checked against the digest, loaded once, kept), the samplers of
//! the versions its seats name (their sampling sessions on that server), and the model's
//! renderer from its files on the worker's machine.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use futures::future::BoxFuture;

use super::super::render::Renderer;
use super::super::rollout::Actor;
use super::play::play_task;
use super::players::Rollouts;
use super::task::{GroupTask, PlayedGroup, TaskPlugins};
use crate::client::ServiceClient;
use crate::plugin::{Plugin, PluginHost};

/// Plays tasks on a server's samplers with its tenant's plugins: a worker's [`Rollouts`].
#[derive(Clone)]
pub struct WorkerPlayer(Arc<Worker>);

struct Worker {
    service: Arc<dyn ServiceClient>,
    host: PluginHost,
    renderer: Renderer,
    /// The plugins loaded so far, by digest (hex).
    plugins: tokio::sync::Mutex<HashMap<String, Plugin>>,
}

impl WorkerPlayer {
    /// A player that samples and fetches plugins through `service` (a session of the tenant
    /// whose jobs it plays), loads them into `host`, and renders with `renderer`.
    pub fn new(service: Arc<dyn ServiceClient>, host: PluginHost, renderer: Renderer) -> Self {
        WorkerPlayer(Arc::new(Worker {
            service,
            host,
            renderer,
            plugins: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }
}

impl Worker {
    /// Plugin `digest` (hex), from the server the first time.
    async fn plugin(&self, digest: &str) -> anyhow::Result<Plugin> {
        let mut plugins = self.plugins.lock().await;
        if let Some(plugin) = plugins.get(digest) {
            return Ok(plugin.clone());
        }
        let bytes = self
            .service
            .download_plugin(&format!("sha256:{digest}"))
            .await
            .with_context(|| format!("fetching plugin sha256:{digest}"))?;
        let plugin = self
            .host
            .load(bytes)
            .await
            .with_context(|| format!("loading plugin sha256:{digest}"))?;
        plugins.insert(digest.to_string(), plugin.clone());
        Ok(plugin)
    }

    async fn play(&self, task: &GroupTask) -> anyhow::Result<PlayedGroup> {
        let environment = self.plugin(&task.environment.digest).await?;
        let agent = match &task.agent {
            Some(agent) => Some(self.plugin(&agent.digest).await?),
            None => None,
        };
        let reward = match &task.reward {
            Some(reward) => Some(self.plugin(&reward.plugin.digest).await?),
            None => None,
        };
        let actors = task
            .seats
            .iter()
            .enumerate()
            .map(|(i, seat)| match &seat.sampler {
                Some(address) => Ok(Actor::Policy(self.service.sampling_client_at(address)?)),
                None => Err(anyhow::anyhow!(
                    "seat {i} ({}) has no sampling session on the server: a worker plays only \
                     the tasks of a driver that trains on a server (`train --server`)",
                    seat.policy
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let plugins = TaskPlugins {
            environment: &environment,
            agent: agent.as_ref(),
            reward: reward.as_ref(),
        };
        Ok(play_task(task, plugins, &self.renderer, &actors).await)
    }
}

impl Rollouts for WorkerPlayer {
    fn start(&self, task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>> {
        let worker = Arc::clone(&self.0);
        Box::pin(async move { worker.play(&task).await })
    }
}
