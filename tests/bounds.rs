//! Every class of attack on the host, one after another, alone in this test binary so that the
//! process's peak resident memory is the attack's: each must end in its typed error (or complete,
//! where the attack is only noise) within its stated time, and raise the host's peak resident
//! memory by less than 512 MiB. Prints the table docs/sandbox.md quotes.

use std::time::{Duration, Instant};

use opentinker::plugin::{ErrorKind, Limits, LoadError, Plugin, PluginHost};
use opentinker::plugin::{PlayOptions, play_random};
use opentinker_tests::hostile::{Patch, patched};
use opentinker_tests::{children_peak_resident_bytes, load, plugin_wasm, test_host};

const MIB: u64 = 1 << 20;

/// The most one attack may raise the host's peak resident memory: four episodes at once, each
/// with its guest's 64 MiB and its record's share, stay far below it.
const HOST_MEMORY_BOUND: u64 = 512 * MIB;

/// Reset this process's peak resident memory (`VmHWM`) to its current resident memory, and
/// return that.
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak resident memory");
    status_bytes("VmRSS:")
}

/// A `kB` line of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One attack: what to play, and what it must come to.
struct Attack {
    name: &'static str,
    plugin: &'static str,
    patch: Option<Patch>,
    config: &'static str,
    limits: Limits,
    /// `None`: every episode completes.
    expected: Option<ErrorKind>,
    within: Duration,
}

impl Attack {
    fn new(name: &'static str, plugin: &'static str, expected: Option<ErrorKind>) -> Self {
        Attack {
            name,
            plugin,
            patch: None,
            config: "{}",
            limits: Limits::default(),
            expected,
            within: Duration::from_secs(10),
        }
    }
}

async fn loaded(host: &PluginHost, attack: &Attack) -> Plugin {
    match attack.patch {
        None => load(host, attack.plugin).await,
        Some(patch) => {
            let base = std::fs::read(plugin_wasm(attack.plugin)).unwrap();
            host.load(patched(&base, patch)).await.unwrap()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_ends_typed_in_bounded_time_and_host_memory() {
    let host = test_host();
    let (episodes, at_once) = (16, 4);
    let attacks = [
        Attack::new(
            "loop forever",
            "adversarial/infinite-loop",
            Some(ErrorKind::OutOfFuel),
        ),
        Attack::new(
            "sleep in a loop (host calls)",
            "adversarial/sleeper",
            Some(ErrorKind::OutOfFuel),
        ),
        Attack::new(
            "grow memory without end",
            "adversarial/memory-hog",
            Some(ErrorKind::MemoryLimit),
        ),
        Attack::new(
            "recurse without end",
            "adversarial/deep-recursion",
            Some(ErrorKind::Trap),
        ),
        Attack::new(
            "return a giant string",
            "adversarial/giant-output",
            Some(ErrorKind::OutputTooLarge),
        ),
        Attack::new("flood the log", "adversarial/log-flood", None),
        Attack {
            config: r#"{"break": "flood"}"#,
            ..Attack::new(
                "return 100,000 empty messages",
                "adversarial/bad-output",
                Some(ErrorKind::OutputTooLarge),
            )
        },
        Attack {
            config: r#"{"break": "long-error"}"#,
            ..Attack::new(
                "fail with a 200 kB message",
                "adversarial/bad-output",
                Some(ErrorKind::PluginError),
            )
        },
        Attack::new(
            "never end, u32::MAX turns",
            "adversarial/endless",
            Some(ErrorKind::EpisodeLimit),
        ),
        Attack::new(
            "declare 100,000,000 players",
            "adversarial/crowd",
            Some(ErrorKind::InvalidOutput),
        ),
        Attack {
            patch: Some(Patch::Memories {
                count: 3,
                pages: 960,
            }),
            ..Attack::new(
                "four memories of 60 MiB",
                "arithmetic",
                Some(ErrorKind::MemoryLimit),
            )
        },
        Attack {
            patch: Some(Patch::CoreInstances { count: 200 }),
            ..Attack::new("218 core instances", "arithmetic", None)
        },
    ];
    println!(
        "| attack ({episodes} episodes, {at_once} at once) | result | time | host peak resident above baseline |"
    );
    println!("|---|---|---|---|");
    for attack in attacks {
        let plugin = loaded(&host, &attack).await;
        let options = PlayOptions {
            episodes,
            config: attack.config.into(),
            limits: attack.limits.clone(),
            concurrency: at_once,
            ..PlayOptions::default()
        };
        let baseline = reset_peak();
        let started = Instant::now();
        let summary = match play_random(&plugin, &options).await {
            Ok((summary, _)) => summary,
            // The environment's own `info()` is refused: the whole run is that error.
            Err(error) => {
                assert_eq!(
                    Some(error.kind),
                    attack.expected,
                    "{}: {error}",
                    attack.name
                );
                let took = started.elapsed();
                let peak = status_bytes("VmHWM:").saturating_sub(baseline);
                println!(
                    "| {} | `{}` from `info()` | {took:.2?} | {} MiB |",
                    attack.name,
                    error.kind,
                    peak / MIB
                );
                assert!(peak < HOST_MEMORY_BOUND, "{}: {peak} bytes", attack.name);
                continue;
            }
        };
        let took = started.elapsed();
        let peak = status_bytes("VmHWM:").saturating_sub(baseline);
        let result = match attack.expected {
            Some(kind) => {
                assert_eq!(summary.completed, 0, "{}: {summary:?}", attack.name);
                assert_eq!(
                    summary.errors.get(&kind),
                    Some(&episodes),
                    "{}: {summary:?}",
                    attack.name
                );
                format!("`{kind}`")
            }
            None => {
                assert_eq!(summary.completed, episodes, "{}: {summary:?}", attack.name);
                "completes".to_string()
            }
        };
        println!(
            "| {} | {result} | {took:.2?} | {} MiB |",
            attack.name,
            peak / MIB
        );
        assert!(took < attack.within, "{}: {took:?}", attack.name);
        assert!(peak < HOST_MEMORY_BOUND, "{}: {peak} bytes", attack.name);
    }

    // Attacks on loading: refused before any instance, the compiler's cost in its worker.
    let base = std::fs::read(plugin_wasm("arithmetic")).unwrap();
    let loads = [
        ("318 core instances", Patch::CoreInstances { count: 300 }),
        (
            "a compile bomb (258 kB)",
            Patch::CompileBomb {
                locals: 2_000,
                loops: 500,
            },
        ),
    ];
    for (name, patch) in loads {
        let component = patched(&base, patch);
        let baseline = reset_peak();
        let started = Instant::now();
        let error = host.load(component).await.err().unwrap();
        let took = started.elapsed();
        let peak = status_bytes("VmHWM:").saturating_sub(baseline);
        assert!(
            matches!(
                error,
                LoadError::Structure(_) | LoadError::CompileLimit { .. }
            ),
            "{name}: {error}"
        );
        println!(
            "| {name} | refused at load: {error} | {took:.2?} | {} MiB (worker: within its budget) |",
            peak / MIB
        );
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
        assert!(peak < HOST_MEMORY_BOUND, "{name}: {peak} bytes");
    }
    assert!(children_peak_resident_bytes() <= 1 << 30);
}
