//! `opentinker worker --queue nats://HOST:PORT --server URL`: a stateless rollout worker. It
//! pulls RL group tasks from the queue, fetches the plugins they name from the server (by
//! digest, checked), plays them in its sandbox on the server's samplers, and publishes the
//! trajectories; start as many as the environments need, on any machines that reach both.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::client::{ModelText, RemoteService, TinyModelSpec};
use crate::plugin::PluginHost;
use crate::queue_auth::{
    ACCOUNT_KEY, ACCOUNTS_CONF, OPERATOR_KEY, QueueKeys, QueueLogin, WorkerAccess,
};
use crate::rl::{Pool, Queue, QueueSettings, Renderer, WorkerPlayer, serve_tasks};
use crate::service::TINY_MODEL_NAME;

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The rollout queue: the NATS server (with JetStream) that `train --rollouts` publishes to.
    #[arg(long, value_name = "URL")]
    queue: String,
    /// The server the driver trains on (`opentinker serve`, `http://host:port`): where the
    /// worker samples and fetches plugins.
    #[arg(long, value_name = "URL")]
    server: String,
    /// The API key of the tenant whose jobs this worker plays.
    #[arg(long, env = "TINKER_API_KEY", hide_env_values = true)]
    api_key: String,
    /// The model's folder on this machine, for its tokenizer and chat template (default: the
    /// built-in tiny model's, made here).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// The name under which the server serves that model (default: `opentinker/tiny` for the
    /// built-in tiny model).
    #[arg(long, value_name = "NAME")]
    base_model: Option<String>,
    /// The pool of workers this one joins on an open queue: it plays the tasks published to
    /// that pool only (`train --rollout-pool NAME`; default `default`). A server that signs its
    /// workers (`serve --rollout-key`) names the pool itself, its tenant's, and logs the worker
    /// in as a user that may play that pool only.
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Tasks played at once.
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// Seconds a task may go unacknowledged before another worker gets it (the worker says it
    /// is still at it every third of this while it plays). On an open queue; a server that
    /// signs its workers sets its pools' own.
    #[arg(long, default_value_t = 30)]
    ack_wait_secs: u64,
    /// Deliveries of a task before it is answered with its failure (on an open queue).
    #[arg(long, default_value_t = 3)]
    max_deliver: i64,
    #[command(flatten)]
    host: super::HostArgs,
}

pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let base_model = match (&args.base_model, &args.model) {
        (Some(name), _) => name.clone(),
        (None, None) => TINY_MODEL_NAME.to_string(),
        (None, Some(dir)) => anyhow::bail!(
            "--model {} needs --base-model NAME, the name under which the server serves it",
            dir.display()
        ),
    };
    // The built-in tiny model's text comes from generating it; kept while the worker runs.
    let scratch = tempfile::tempdir().context("making a scratch folder")?;
    let model_dir = match &args.model {
        Some(dir) => dir.clone(),
        None => {
            let dir = scratch.path().join("model");
            TinyModelSpec::built_in().generate(&dir)?;
            dir
        }
    };
    let text = ModelText::load(&model_dir)?;
    let template = text
        .chat_template
        .with_context(|| format!("{}: the model has no chat template", model_dir.display()))?;
    let renderer = Renderer::new(template, text.tokenizer)?;
    let host = PluginHost::new(args.host.host_config())?;
    let runtime = super::runtime(args.slots + 1)?;
    runtime.block_on(async {
        let service = RemoteService::connect(&args.server, &args.api_key, &base_model)
            .await
            .with_context(|| format!("connecting to {}", args.server))?;
        let access = service
            .worker_access()
            .await
            .with_context(|| format!("asking {} how to log in to the queue", args.server))?;
        let (settings, login) = queue_access(&args, access)?;
        let pool = settings.pool.clone();
        let player = Arc::new(WorkerPlayer::new(Arc::new(service), host, renderer));
        let queue = Queue::connect(&args.queue, settings, &login).await?;
        eprintln!(
            "worker: playing pool {pool:?}'s tasks from {} on {} ({} at a time)",
            args.queue, args.server, args.slots
        );
        tokio::select! {
            served = serve_tasks(queue, player, args.slots) => match served? {},
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}

/// The pool and login of the worker: the server's, where it signs its workers, otherwise the
/// open queue's from the flags.
fn queue_access(
    args: &WorkerArgs,
    access: Option<WorkerAccess>,
) -> anyhow::Result<(QueueSettings, QueueLogin)> {
    let Some(access) = access else {
        let settings = QueueSettings {
            pool: Pool::new(args.pool.as_deref().unwrap_or("default")),
            ack_wait: Duration::from_secs(args.ack_wait_secs.max(1)),
            max_deliver: args.max_deliver,
        };
        return Ok((settings, QueueLogin::default()));
    };
    if let Some(pool) = args.pool.as_ref().filter(|p| **p != access.pool) {
        anyhow::bail!(
            "--pool {pool}: this key's pool on {} is {:?} (a server that signs its workers \
             gives each key its tenant's pool only)",
            args.server,
            access.pool
        );
    }
    let settings = QueueSettings {
        pool: Pool::new(&access.pool),
        ack_wait: Duration::from_secs(access.ack_wait_secs.max(1)),
        max_deliver: access.max_deliver,
    };
    Ok((settings, access.login))
}

/// `opentinker rollout-keys DIR`.
pub fn run_rollout_keys(dir: &std::path::Path) -> anyhow::Result<()> {
    let account = QueueKeys::generate(dir)?;
    println!("the rollout queue's account: {account}");
    println!(
        "wrote {conf} (add `include {conf}` to the NATS server's configuration) and \
         {key} (for `opentinker serve --rollouts URL --rollout-key {key}`; keep it secret, \
         as {operator}, which signs the accounts again)",
        conf = dir.join(ACCOUNTS_CONF).display(),
        key = dir.join(ACCOUNT_KEY).display(),
        operator = dir.join(OPERATOR_KEY).display(),
    );
    Ok(())
}
