//! The `opentinker` command line: argument parsing and dispatch to one module per subcommand.

mod job_files;
mod market;
mod model;
mod plugin;
mod progress;
mod sample;
mod serve;
mod submit;
mod terminal;
mod train;
mod watch;
mod worker;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::plugin::HostConfig;

#[derive(Debug, Parser)]
#[command(
    name = "opentinker",
    version,
    about = "Train LLM agents with sandboxed WebAssembly environments"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate models and look at what they compute.
    Model {
        #[command(subcommand)]
        command: model::ModelCommand,
    },
    /// Generate text from a model (and optionally a LoRA adapter).
    Sample(sample::SampleArgs),
    /// Train a policy as job files describe (warm-up, then RL with plugin environments).
    Train(train::TrainArgs),
    /// Play episodes of a job's environment with its trained policy and print them.
    Play(watch::PlayArgs),
    /// Re-run a recorded training episode from its seed and check it comes back exactly.
    Replay(watch::ReplayArgs),
    /// Serve the engine over HTTP in the Tinker wire protocol (the `tinker` SDK drives it).
    Serve(serve::ServeArgs),
    /// Play RL groups from a rollout queue for `train --rollouts` (a stateless rollout worker).
    Worker(worker::WorkerArgs),
    /// Make the rollout queue's NATS accounts: DIR/nats-accounts.conf for the NATS server to
    /// include, DIR/account.nk for `serve --rollout-key`, which signs each tenant's workers.
    RolloutKeys {
        /// The folder to write (refused where it already holds keys).
        dir: PathBuf,
    },
    /// Run a job file on a server: upload its plugins, submit it, show its progress.
    Submit(submit::SubmitArgs),
    /// The jobs of a server: list, status, logs, cancel, download.
    Jobs {
        #[command(subcommand)]
        command: submit::JobsCommand,
    },
    /// Make tenants of a server and their API keys.
    Tenant {
        #[command(subcommand)]
        command: serve::TenantCommand,
    },
    /// Publisher keys for signing plugins, and the trust policy that lists whom to trust.
    Keys {
        #[command(subcommand)]
        command: market::KeysCommand,
    },
    /// Build, inspect and run plugin components; publish, find and install them by name.
    Plugin {
        #[command(subcommand)]
        command: plugin::PluginCommand,
    },
    /// Compile one component read on stdin, for the plugin host that starts this bounded worker.
    #[command(name = "compile-worker", hide = true)]
    CompileWorker { request: String },
}

/// Options shared by the commands that load plugins.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Where compiled components are cached (default: $XDG_CACHE_HOME/opentinker or
    /// ~/.cache/opentinker).
    #[arg(long, env = "OPENTINKER_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every time; read and write no cache.
    #[arg(long)]
    no_cache: bool,
}

impl HostArgs {
    fn host_config(&self) -> HostConfig {
        let cache_dir = if self.no_cache {
            None
        } else {
            self.cache_dir.clone().or_else(default_cache_dir)
        };
        HostConfig {
            cache_dir,
            ..Default::default()
        }
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    user_folder("XDG_CACHE_HOME", ".cache").map(|base| base.join("components"))
}

/// The user's opentinker folder of a kind: `$XDG_VAR/opentinker`, else `~/HOME_FALLBACK/opentinker`.
fn user_folder(xdg_var: &str, home_fallback: &str) -> Option<PathBuf> {
    let base = std::env::var_os(xdg_var)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(home_fallback)))?;
    Some(base.join("opentinker"))
}

/// The async runtime of a command, with `workers` threads for its tasks (the engines' compute
/// runs on threads of their own).
fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Model { command } => model::run(command),
        Command::Plugin { command } => plugin::run(command),
        Command::Keys { command } => market::run_keys(command),
        Command::Sample(args) => sample::run(args),
        Command::Train(args) => train::run(args),
        Command::Play(args) => watch::run_play(args),
        Command::Replay(args) => watch::run_replay(args),
        Command::Serve(args) => serve::run(args),
        Command::Worker(args) => worker::run(args),
        Command::RolloutKeys { dir } => worker::run_rollout_keys(&dir),
        Command::Tenant { command } => serve::run_tenant(command),
        Command::Submit(args) => submit::run_submit(args),
        Command::Jobs { command } => submit::run_jobs(command),
        Command::CompileWorker { request } => {
            std::process::exit(crate::plugin::run_compile_worker(&request))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap checks a command's arguments only when that command is parsed; this checks every
    /// subcommand's at once (unique names, valid defaults and relations).
    #[test]
    fn every_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
