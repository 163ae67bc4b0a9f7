//! `opentinker plugin new | build | inspect | run`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;

use super::HostArgs;
use super::market::Kind;
use crate::plugin::{Limits, PluginHost};
use crate::plugin::{PlayOptions, PlaySummary, play_random};
use crate::plugin::{TemplateLanguage, write_plugin};
use crate::plugin::{build_plugin, component_path};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Build a plugin (a Rust crate, a Python project or a JavaScript package) into a component;
    /// prints the path of the .wasm as its last line.
    Build {
        /// The plugin's directory: a crate (Cargo.toml), a Python project (pyproject.toml with a
        /// [tool.opentinker] table, or an app.py), or a JavaScript package (package.json with an
        /// `opentinker` field).
        dir: PathBuf,
    },
    /// Write a new plugin: a working, documented skeleton with a unit test, that builds and plays
    /// as written.
    New {
        /// The plugin's name (lowercase letters, digits, `-`).
        name: String,
        /// Its language.
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
        /// Its kind.
        #[arg(long, value_enum, default_value = "environment")]
        kind: Kind,
        /// Where to write it (default: ./NAME); must not exist, or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The SDK a Rust or JavaScript plugin depends on (default: the `sdk/rust` or `sdk/js` of
        /// the source tree this program was built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Print what a component is: digest, WIT version, plugin kinds, exports, imports, size, and
    /// the metadata it declares (name, version, licence, config schema; 0.2 components).
    Inspect {
        /// A component (.wasm), or a plugin directory to build first.
        file: PathBuf,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Publish a plugin as `namespace/name@version` to an OCI registry or layout folder, signed
    /// with your publisher key.
    Publish(super::market::PublishArgs),
    /// Find published plugins by text and kind.
    Search(super::market::SearchArgs),
    /// Show a published plugin's versions and metadata.
    Info(super::market::InfoArgs),
    /// Resolve `namespace/name@RANGE`, fetch it, verify it under the trust policy and cache it;
    /// prints the cached component's path.
    Install(super::market::FetchArgs),
    /// Fetch a published plugin and check its digest and signature, caching nothing.
    Verify(super::market::FetchArgs),
    /// Yank a published version: ranges stop picking it, exact pins still fetch it.
    Yank(super::market::YankArgs),
    /// Play episodes of an environment with a random policy and summarise them.
    Run {
        /// A component (.wasm), or a plugin directory to build first.
        file: PathBuf,
        /// How many episodes to play.
        #[arg(long, default_value_t = 100)]
        episodes: u32,
        /// Episode i uses seed SEED + i.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The environment config, as JSON.
        #[arg(long, default_value = "{}")]
        config: String,
        /// A fixed task for every episode (default: the environment generates one each).
        #[arg(long)]
        task: Option<String>,
        /// Episodes alive at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Limits as JSON, for example '{"memory_bytes": 33554432, "call_timeout_ms": 500}'.
        #[arg(long)]
        limits: Option<String>,
        /// Print one JSON object instead of a human summary.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        host: HostArgs,
    },
}

/// The languages of `plugin new`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

pub fn run(command: PluginCommand) -> anyhow::Result<()> {
    match command {
        PluginCommand::Build { dir } => {
            let wasm = build_plugin(&dir)?;
            println!("{}", wasm.display());
            Ok(())
        }
        PluginCommand::New {
            name,
            lang,
            kind,
            dir,
            sdk,
        } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let (lang, sdk_folder) = match lang {
                Lang::Rust => (TemplateLanguage::Rust, "rust"),
                Lang::Python => (TemplateLanguage::Python, "python"),
                Lang::Js => (TemplateLanguage::JavaScript, "js"),
            };
            let sdk = match sdk {
                Some(sdk) => sdk,
                None => {
                    let built_from =
                        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../sdk")).join(sdk_folder);
                    built_from.canonicalize().with_context(|| {
                        format!(
                            "the SDK of this program's source tree ({}) is gone: name one with \
                             --sdk",
                            built_from.display()
                        )
                    })?
                }
            };
            for file in write_plugin(&dir, &name, lang, kind.plugin_kind(), &sdk)? {
                println!("wrote {}", file.display());
            }
            Ok(())
        }
        PluginCommand::Publish(args) => super::market::run_publish(args),
        PluginCommand::Search(args) => super::market::run_search(args),
        PluginCommand::Info(args) => super::market::run_info(args),
        PluginCommand::Install(args) => super::market::run_install(args),
        PluginCommand::Verify(args) => super::market::run_verify(args),
        PluginCommand::Yank(args) => super::market::run_yank(args),
        PluginCommand::Inspect { file, host } => super::runtime(cores())?.block_on(async {
            let host = PluginHost::new(host.host_config())?;
            let plugin = host.load_file(&component_path(&file)?).await?;
            let metadata = plugin
                .metadata(&Limits::default())
                .await
                .context("asking the plugin for its metadata")?;
            let mut shown = serde_json::to_value(plugin.description())?;
            shown["metadata"] = serde_json::to_value(metadata)?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(())
        }),
        PluginCommand::Run {
            file,
            episodes,
            seed,
            config,
            task,
            concurrency,
            limits,
            json,
            host,
        } => {
            let limits: Limits = match limits {
                Some(text) => serde_json::from_str(&text).context("--limits")?,
                None => Limits::default(),
            };
            super::runtime(cores())?.block_on(async {
                let host = PluginHost::new(host.host_config())?;
                let plugin = host.load_file(&component_path(&file)?).await?;
                plugin.check_limits(&limits).context("--limits")?;
                let options = PlayOptions {
                    episodes,
                    seed,
                    config,
                    task,
                    concurrency,
                    limits,
                    keep_transcripts: false,
                };
                let (summary, _) = play_random(&plugin, &options)
                    .await
                    .context("asking the environment for its info")?;
                if json {
                    println!("{}", serde_json::to_string(&summary)?);
                } else {
                    print_summary(&summary);
                }
                Ok(())
            })
        }
    }
}

fn print_summary(summary: &PlaySummary) {
    let bold = |s: &str| {
        if std::io::stdout().is_terminal() {
            format!("\x1b[1m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    };
    println!(
        "{} ({})",
        bold(&super::terminal::terminal_safe(&summary.plugin)),
        &summary.digest[..12]
    );
    println!(
        "  episodes   {} played, {} completed, {} failed",
        summary.episodes,
        summary.completed,
        summary.episodes - summary.completed
    );
    println!("  reward     {:.3} mean (player 0)", summary.mean_reward);
    println!("  length     {:.2} steps mean", summary.mean_steps);
    for (kind, count) in &summary.errors {
        println!("  error      {kind}: {count}");
        for sampled in summary.error_messages.get(kind).into_iter().flatten() {
            println!(
                "             seed {}: {}",
                sampled.seed,
                super::terminal::terminal_safe(&sampled.message)
            );
        }
    }
    if summary.log_bytes_dropped > 0 {
        println!("  log        {} bytes dropped", summary.log_bytes_dropped);
    }
    println!(
        "  fuel       {} most in one call, {} most in one episode",
        summary.max_call_fuel, summary.max_episode_fuel
    );
    println!(
        "  speed      {:.0} episodes/s, {:.0} steps/s, {} alive at most, {:.2} s",
        summary.episodes_per_s, summary.steps_per_s, summary.max_live_episodes, summary.elapsed_s
    );
}

/// The machine's cores: episodes of `plugin run` play on all of them.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
