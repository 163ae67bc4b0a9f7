//! `opentinker serve`: the service over HTTP in the Tinker wire protocol, and `opentinker tenant`,
//! which makes the tenants and keys it accepts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::jobs::JobQuotas;
use crate::model::{BaseFormat, Device};
use crate::server::Tenants;
use crate::server::{AppState, DEFAULT_POLL_WAIT, ServerConfig, serve};
use crate::service::{DeviceOptions, FairShare, TINY_MODEL_NAME};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Where to listen. Keep it on loopback unless a TLS proxy sits in front.
    #[arg(long, default_value = "127.0.0.1:8000")]
    addr: SocketAddr,
    /// The server's database, checkpoints and generated models.
    #[arg(long)]
    data: PathBuf,
    /// Serve the model directory DIR as NAME (repeatable). The built-in tiny model is always
    /// served, as `opentinker/tiny`.
    #[arg(long = "model", value_name = "NAME=DIR", value_parser = parse_model)]
    models: Vec<(String, PathBuf)>,
    /// Seconds a `retrieve_future` poll waits for an unfinished op before answering `try_again`.
    #[arg(long, default_value_t = DEFAULT_POLL_WAIT.as_secs())]
    poll_wait: u64,
    /// KV-cache positions of running samples per base model (requests beyond it wait).
    #[arg(long, default_value_t = 262_144)]
    kv_positions: usize,
    /// Tokens a fused training pass takes at most. Tenants share passes by deficit round robin.
    #[arg(long, default_value_t = 16_384)]
    pass_tokens: u64,
    /// Milliseconds a training pass should take: passes are sized from the measured tokens per
    /// second, so a small request that arrives under load waits about this long (0: passes of
    /// `--pass-tokens`). Shorter passes let requests in sooner; longer ones fuse more.
    #[arg(long, default_value_t = 20)]
    cycle_ms: u64,
    /// Tokens a training pass takes at most while one tenant alone has work (0: timed as
    /// `--cycle-ms`). Longer passes cost less per token; a tenant that arrives meanwhile waits
    /// for one such pass at most. Counted in tokens, not time, so that a lone tenant's results
    /// do not depend on timing: its loop is bit-reproducible, across a restart too.
    #[arg(long, default_value_t = 1024)]
    solo_pass_tokens: u64,
    /// Milliseconds the training loop may wait, after answering a tenant's small call, for that
    /// tenant's next call before it starts a pass of other tenants' work; only for a tenant whose
    /// measured think time is shorter (0: never wait). A pass cannot be stopped, so without this
    /// a light tenant's next call would land just after a heavy pass began, and wait for all of it.
    #[arg(long, default_value_t = 20)]
    anticipate_ms: u64,
    /// Requests one tenant may have queued or running; past it requests are answered 429.
    #[arg(long, default_value_t = 4096)]
    max_queued_per_tenant: usize,
    /// Jobs one tenant may have queued or running at once; past it a submission is refused.
    #[arg(long, default_value_t = JobQuotas::default().active_jobs_per_tenant)]
    max_jobs_per_tenant: usize,
    /// Mebibytes of plugin components one tenant may store; past it an upload is refused.
    #[arg(long, default_value_t = 1024)]
    max_plugin_mib_per_tenant: u64,
    /// Gibibytes of checkpoints one tenant may keep; past it a save is refused (delete some,
    /// or let their `ttl_seconds` expire).
    #[arg(long, default_value_t = 64)]
    max_checkpoint_gib_per_tenant: u64,
    /// Models (adapters in training through the Tinker API) one tenant may hold; past it
    /// `create_model` is refused.
    #[arg(long, default_value_t = 256)]
    max_models_per_tenant: usize,
    /// Seconds between sweeps that delete expired checkpoints (`ttl_seconds`) and free their
    /// files; an expired checkpoint is gone for every request as it expires.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_sweep_secs: u64,
    /// Seconds an answered request's answer is kept for `retrieve_future` (the SDK asks within
    /// seconds); the sweep prunes older ones, so the database stays bounded.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    answer_retention_secs: u64,
    /// Seconds a session may go without a heartbeat (the SDK sends one every 10 s) or an op
    /// before the sweep finishes it, freeing its models and samplers as `close` would.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    session_idle_secs: u64,
    /// Seconds a training call waits for its turn (the calls its model's `seq_id` numbers
    /// before it) before it is failed; a call numbered further ahead than
    /// `--max-queued-per-tenant` is refused at once.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    turn_deadline_secs: u64,
    /// The memory the server may hold (`24GiB`, `512MiB`, or bytes): the served bases are
    /// counted first, and each job is admitted under the rest before it makes anything, queued
    /// while there is no room, refused if it could never fit. Default: the machine's memory
    /// less a headroom of a tenth (at least 2 GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_budget: Option<u64>,
    /// Have rollout workers (`opentinker worker`, with the tenant's key) play the RL groups of
    /// the jobs on served bases: the NATS JetStream queue at URL (`nats://host:port`) carries
    /// them. A job whose warm-up makes a base of its own plays its groups itself.
    #[arg(long, value_name = "URL")]
    rollouts: Option<String>,
    /// The key of the rollout queue's account (`account.nk`, written by `opentinker
    /// rollout-keys` with the NATS server's accounts): the server logs in with it and signs
    /// each worker that asks with a tenant's key a user that may play that tenant's groups
    /// only. Without it the queue must be open, and reachable by trusted workers only.
    #[arg(long, value_name = "FILE", requires = "rollouts")]
    rollout_key: Option<PathBuf>,
    /// The device the served bases run on: `cpu`, or `cuda` / `cuda:N` (a build without the
    /// `cuda` feature, a machine without a driver or without that device each says so).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// On CUDA, the adapter versions each base's sampler holds on the device at once; requests
    /// of another version wait for a slot.
    #[arg(long, default_value_t = 16)]
    adapter_slots: usize,
    /// On CUDA, the largest adapter rank the sampler's slots hold (a slot's memory grows with
    /// it); a larger adapter is refused when sampled.
    #[arg(long, default_value_t = 64)]
    max_adapter_rank: usize,
    /// On CUDA, the most device memory each base's trainer gives its adapters (weights, AdamW
    /// moments and gradients, 16 bytes per trained value), e.g. `8GiB`; a model that would pass
    /// it is refused (quota_exceeded). Default: what the device has.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    trainer_device_memory: Option<u64>,
    /// How the base's matrices are held in memory (LoRA trains on each; full-parameter
    /// training needs `f32`).
    #[arg(long, value_enum, default_value = "f32")]
    base_format: BaseFormat,
}

/// A `--memory-budget` that is not a size.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: expected a size such as 24GiB, 512MiB or a number of bytes")]
struct NotASize(String);

fn parse_size(text: &str) -> Result<u64, NotASize> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        _ => return Err(NotASize(text.to_string())),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| NotASize(text.to_string()))
}

/// A `--model` value that is not `NAME=DIR`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: expected NAME=DIR")]
struct NotNameEqualsDir(String);

fn parse_model(text: &str) -> Result<(String, PathBuf), NotNameEqualsDir> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(NotNameEqualsDir(text.to_string())),
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Make a tenant and print its API key (shown this once; only a salted hash is kept).
    Create {
        name: String,
        /// The server's `--data` folder.
        #[arg(long)]
        data: PathBuf,
        /// The tenant's share of each model's training and sampling relative to others', when
        /// they are busy at the same time (1: an equal share).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
        weight: u64,
    },
    /// Give a tenant a new API key (printed this once); its old key stops working, on a running
    /// server within a second.
    RotateKey {
        name: String,
        /// The server's `--data` folder.
        #[arg(long)]
        data: PathBuf,
    },
    /// Take a tenant's API key away, on a running server within a second; its models,
    /// checkpoints and jobs stay. `rotate-key` gives it a new one.
    Revoke {
        name: String,
        /// The server's `--data` folder.
        #[arg(long)]
        data: PathBuf,
    },
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Before the data folder is touched; each base opens it for its engines as it loads.
    args.device.check()?;
    let config = ServerConfig {
        addr: args.addr,
        data: args.data,
        models: args.models,
        poll_wait: Duration::from_secs(args.poll_wait),
        kv_positions: args.kv_positions,
        max_queued_per_tenant: args.max_queued_per_tenant,
        job_quotas: JobQuotas {
            active_jobs_per_tenant: args.max_jobs_per_tenant,
        },
        max_plugin_bytes_per_tenant: args.max_plugin_mib_per_tenant << 20,
        max_checkpoint_bytes_per_tenant: args.max_checkpoint_gib_per_tenant.saturating_mul(1 << 30),
        max_models_per_tenant: args.max_models_per_tenant,
        checkpoint_sweep: Duration::from_secs(args.checkpoint_sweep_secs),
        memory_budget: args.memory_budget,
        answer_retention: Duration::from_secs(args.answer_retention_secs),
        session_idle: Duration::from_secs(args.session_idle_secs),
        turn_deadline: Duration::from_secs(args.turn_deadline_secs),
        rollouts: args.rollouts,
        rollout_key: args.rollout_key,
        device: DeviceOptions {
            device: args.device,
            adapter_slots: args.adapter_slots.max(1),
            max_adapter_rank: args.max_adapter_rank.max(1),
            trainer_memory: args.trainer_device_memory,
            base_format: args.base_format,
        },
        share: FairShare {
            pass_tokens: args.pass_tokens.max(1),
            quantum: 128,
            cycle: (args.cycle_ms > 0).then(|| Duration::from_millis(args.cycle_ms)),
            solo_pass_tokens: (args.solo_pass_tokens > 0).then_some(args.solo_pass_tokens),
            anticipate: (args.anticipate_ms > 0).then(|| Duration::from_millis(args.anticipate_ms)),
        },
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .with_context(|| format!("listening on {}", config.addr))?;
        let addr = listener.local_addr()?;
        // The address bound (a port of 0 is one now), which the registry names itself by.
        let config = ServerConfig { addr, ..config };
        let (state, restored) = AppState::start(&config).await?;
        // The line tests and scripts wait for.
        let mut names = vec![TINY_MODEL_NAME.to_string()];
        names.extend(config.models.iter().map(|(n, _)| n.clone()));
        println!(
            "opentinker serving on http://{addr} (models: {}; {restored})",
            names.join(", ")
        );
        serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    })
}

pub fn run_tenant(command: TenantCommand) -> anyhow::Result<()> {
    match command {
        TenantCommand::Create { name, data, weight } => {
            let tenants = Tenants::open(&data)?;
            let (tenant, key) = tenants.create(&name, weight)?;
            eprintln!("tenant {tenant} created; its API key (shown only now):");
            println!("{key}");
            Ok(())
        }
        TenantCommand::RotateKey { name, data } => {
            let key = Tenants::open_existing(&data)?.rotate_key(&name)?;
            eprintln!("tenant {name}'s new API key (shown only now; the old one no longer works):");
            println!("{key}");
            Ok(())
        }
        TenantCommand::Revoke { name, data } => {
            Tenants::open_existing(&data)?.revoke(&name)?;
            eprintln!("tenant {name}'s API key is revoked (`tenant rotate-key` makes a new one)");
            Ok(())
        }
    }
}
