//! What a plugin costs in each language the SDKs serve: the same environment (guess-number)
//! written in Rust (`plugins/guess-number`), in Python (`plugins/python/guess-number`, built with
//! componentize-py) and in JavaScript (`plugins/js/guess-number`, built with componentize-js); a
//! port that cannot be built is skipped, with a note. For each: the component's
//! size, its compilation cold and from the cache, a fresh episode (instance + start + observe), a
//! step on a live episode, and the resident memory of 1,000 live episodes held at once.
//!
//! Run: `cargo bench -p opentinker --bench plugin_languages` (or `scripts/bench.sh plugins`).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use opentinker::plugin::build_plugin;
use opentinker::plugin::{EnvironmentEpisode, HostConfig, Limits, Plugin, PluginHost};

const MIB: f64 = (1 << 20) as f64;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn host(cache: &Path) -> PluginHost {
    PluginHost::new(HostConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..HostConfig::default()
    })
    .expect("a plugin host")
}

/// One language's figures.
struct Figures {
    language: &'static str,
    size: u64,
    compile: Duration,
    cached_load: Duration,
    fresh_episode: Duration,
    step: Duration,
    live_bytes_per_episode: f64,
}

async fn start(plugin: &Plugin, seed: u64) -> EnvironmentEpisode {
    let limits = Limits::default();
    let task = plugin
        .generate_task("{}", seed, &limits)
        .await
        .expect("a task");
    let mut episode = plugin
        .start_episode("{}", &task, seed, &limits)
        .await
        .expect("an episode");
    episode.observe(0).await.expect("an observation");
    episode
}

async fn measure(language: &'static str, wasm: &Path, live: usize, rounds: u32) -> Figures {
    let size = std::fs::metadata(wasm).map(|m| m.len()).unwrap_or(0);
    let cache = tempfile::tempdir().expect("a cache folder");
    let started = Instant::now();
    host(cache.path())
        .load_file(wasm)
        .await
        .expect("compiling the plugin");
    let compile = started.elapsed();
    let host = host(cache.path());
    let started = Instant::now();
    let plugin = host.load_file(wasm).await.expect("loading from the cache");
    let cached_load = started.elapsed();

    // A fresh episode: a new instance, started on a fixed task, observed; then dropped.
    let limits = Limits::default();
    let task = r#"{"secret": 50}"#;
    let started = Instant::now();
    for seed in 0..u64::from(rounds) {
        let mut episode = plugin
            .start_episode("{}", task, seed, &limits)
            .await
            .expect("an episode");
        episode.observe(0).await.expect("an observation");
    }
    let fresh_episode = started.elapsed() / rounds;

    // A step that does not end the episode (a guess below the secret), on live episodes of many
    // turns.
    let config = r#"{"max": 100, "turns": 32}"#;
    let mut steps = 0u32;
    let mut spent = Duration::ZERO;
    while steps < rounds {
        let mut episode = plugin
            .start_episode(config, task, 0, &limits)
            .await
            .expect("an episode");
        episode.observe(0).await.expect("an observation");
        for _ in 0..31 {
            let started = Instant::now();
            episode.step("1").await.expect("a step");
            spent += started.elapsed();
            steps += 1;
        }
    }
    let step = spent / steps;

    let before = resident_bytes();
    let mut held = Vec::with_capacity(live);
    for seed in 0..live as u64 {
        held.push(start(&plugin, seed).await);
    }
    let grown = resident_bytes().saturating_sub(before);
    drop(held);
    Figures {
        language,
        size,
        compile,
        cached_load,
        fresh_episode,
        step,
        live_bytes_per_episode: grown as f64 / live as f64,
    }
}

fn main() {
    let quick = support::quick();
    let (live, rounds) = if quick { (10, 4) } else { (1_000, 200) };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let rust = build_plugin(&root.join("plugins/guess-number")).expect("building guess-number");
    let mut figures = vec![runtime.block_on(measure("Rust", &rust, live, rounds))];
    for (language, port) in [("Python", "python"), ("JavaScript", "js")] {
        if quick {
            // The ports' builds and cold compiles are most of a minute; the tests build and play
            // them already, and the quick mode only checks that this benchmark runs.
            println!("{language} skipped in the quick mode");
            continue;
        }
        match build_plugin(&root.join("plugins").join(port).join("guess-number")) {
            Ok(wasm) => figures.push(runtime.block_on(measure(language, &wasm, live, rounds))),
            Err(why) => println!("{language} skipped: {why:#}"),
        }
    }
    println!();
    println!(
        "| guess-number in | component | compile (cold) | load from cache | fresh episode | step | resident per live episode ({live} held) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for f in &figures {
        println!(
            "| {} | {:.1} MB | {:.2} s | {:.1} ms | {:.0} us | {:.1} us | {:.2} MiB |",
            f.language,
            f.size as f64 / 1e6,
            f.compile.as_secs_f64(),
            f.cached_load.as_secs_f64() * 1e3,
            f.fresh_episode.as_secs_f64() * 1e6,
            f.step.as_secs_f64() * 1e6,
            f.live_bytes_per_episode / MIB,
        );
    }
    if let [rust, others @ ..] = figures.as_slice() {
        for other in others {
            println!(
                "| {} / Rust | | | | {} | {} | |",
                other.language,
                support::ratio(
                    other.fresh_episode.as_secs_f64(),
                    rust.fresh_episode.as_secs_f64()
                ),
                support::ratio(other.step.as_secs_f64(), rust.step.as_secs_f64()),
            );
        }
    }
}
