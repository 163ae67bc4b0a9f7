//! Helpers shared by the integration tests: building the plugin components of this repository
//! (once per test process) and loading them into a host.

pub mod hostile;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use opentinker::plugin::{
    EpisodeRecord, ErrorKind, HostConfig, Limits, Plugin, PluginHost, build_plugin,
};
use opentinker::plugin::{PlayOptions, PlaySummary, play_random};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The component of the plugin crate at `plugins/<name>` (for example `tictactoe` or
/// `adversarial/sleeper`), built on first use.
pub fn plugin_wasm(name: &str) -> PathBuf {
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let path = build_plugin(&repo_root().join("plugins").join(name))
        .unwrap_or_else(|e| panic!("building plugin {name}: {e:#}"));
    built.insert(name.to_string(), path.clone());
    path
}

/// A host sized for tests (fewer instance slots than a server's). Its compile cache is the test
/// script's one (`OPENTINKER_TEST_COMPILE_CACHE`), shared with every other test process, so that
/// a component, and each function of the Python and JavaScript engines that many components
/// carry, is compiled once; without it, no cache.
pub fn test_host() -> PluginHost {
    let cache_dir = std::env::var_os("OPENTINKER_TEST_COMPILE_CACHE")
        .filter(|dir| !dir.is_empty())
        .map(std::path::PathBuf::from);
    PluginHost::new(HostConfig {
        max_instances: 2_500,
        max_instances_per_plugin: 2_500,
        cache_dir,
        ..HostConfig::default()
    })
    .expect("starting a plugin host")
}

/// Build (if needed) and load the plugin `name`.
pub async fn load(host: &PluginHost, name: &str) -> Plugin {
    host.load_file(&plugin_wasm(name))
        .await
        .unwrap_or_else(|e| panic!("loading plugin {name}: {e}"))
}

/// The largest resident memory of any child process this process has waited for (and of their
/// waited-for descendants), in bytes.
pub fn children_peak_resident_bytes() -> u64 {
    // SAFETY: `getrusage` fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
}

/// This process's resident memory, in bytes.
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Play `episodes` random-policy episodes (seed 7, 8 at once) under `limits`.
pub async fn play(
    plugin: &Plugin,
    episodes: u32,
    limits: Limits,
) -> (PlaySummary, Vec<EpisodeRecord>) {
    let options = PlayOptions {
        episodes,
        seed: 7,
        limits,
        concurrency: 8,
        keep_transcripts: true,
        ..PlayOptions::default()
    };
    play_random(plugin, &options)
        .await
        .expect("the environment answers info()")
}

/// Every episode of the run failed, all with `kind`.
pub fn assert_all_failed_with(summary: &PlaySummary, kind: ErrorKind) {
    assert_eq!(summary.completed, 0, "{summary:?}");
    assert_eq!(
        summary.errors.get(&kind).copied(),
        Some(summary.episodes),
        "{summary:?}"
    );
}
