//! Loading components: the compile cache, and clear refusals of what the host cannot run.

use std::time::{Duration, Instant};

use opentinker::plugin::{
    CompileLimits, CompileResource, HostConfig, LimitError, Limits, LoadError, PluginHost,
    PluginKind, StructureError, wit_version,
};
use opentinker_tests::hostile::{Patch, patched};
use opentinker_tests::{children_peak_resident_bytes, load, plugin_wasm, test_host};

fn host_with_cache(dir: &std::path::Path) -> PluginHost {
    PluginHost::new(HostConfig {
        cache_dir: Some(dir.to_path_buf()),
        max_instances: 64,
        ..HostConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_load_skips_compilation_and_a_damaged_entry_is_rebuilt() {
    let cache = tempfile::tempdir().unwrap();
    let wasm = plugin_wasm("tictactoe");
    let first = host_with_cache(cache.path())
        .load_file(&wasm)
        .await
        .unwrap();
    assert!(!first.load_report().cache_hit);
    assert!(first.load_report().compile_time.as_nanos() > 0);

    // A new host (a restarted process) finds the compiled component on disk.
    let host = host_with_cache(cache.path());
    let second = host.load_file(&wasm).await.unwrap();
    assert!(second.load_report().cache_hit);
    assert_eq!(first.digest(), second.digest());
    let mut episode = second
        .start_episode("{}", "{}", 1, &Limits::default())
        .await
        .unwrap();
    episode.observe(0).await.unwrap();

    // Damage the entry: it is detected by its checksum, removed, and compiled again.
    let dir = host.cache_dir().unwrap().to_path_buf();
    let entry = dir.join(format!("{}.cwasm", first.digest()));
    let mut bytes = std::fs::read(&entry).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(&entry, &bytes).unwrap();
    let functions = dir.join("functions");
    let compiled_functions = std::fs::read_dir(&functions).unwrap().count();
    assert!(compiled_functions > 0);
    let third = host_with_cache(cache.path())
        .load_file(&wasm)
        .await
        .unwrap();
    assert!(!third.load_report().cache_hit);
    // The recompilation took most functions from the function cache (a few, whose compiler
    // input differs from one compilation to the next, are compiled anew each time).
    let anew = std::fs::read_dir(&functions).unwrap().count() - compiled_functions;
    assert!(
        anew * 4 < compiled_functions,
        "{anew} of {compiled_functions} functions compiled again"
    );
    let fourth = host_with_cache(cache.path())
        .load_file(&wasm)
        .await
        .unwrap();
    assert!(fourth.load_report().cache_hit);
    // No temporary files are left behind: the entry and the function cache's folder.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [format!("{}.cwasm", first.digest()), "functions".to_string()],
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_describes_itself() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let description = plugin.description();
    assert_eq!(description.kinds, vec![PluginKind::Environment]);
    assert_eq!(description.wit_version.as_deref(), Some(wit_version()));
    assert_eq!(description.digest.len(), 64);
    for export in ["environment", "metadata"] {
        let name = format!("opentinker:plugin/{export}@0.3.0");
        assert!(
            description.exports.contains(&name),
            "{:?}",
            description.exports
        );
    }
    assert!(
        description
            .imports
            .iter()
            .all(|i| i.starts_with("wasi:") || i.starts_with("opentinker:plugin/"))
    );
    let info = plugin.environment_info(&Limits::default()).await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.players, info.max_turns),
        ("tictactoe", 2, 9)
    );
}

async fn refusal(bytes: Vec<u8>) -> LoadError {
    test_host()
        .load(bytes)
        .await
        .err()
        .expect("the load is refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_core_modules_are_not_components() {
    let error = refusal(b"definitely not wasm".to_vec()).await;
    assert!(matches!(error, LoadError::NotAComponent(_)), "{error}");
    let core_module = wat::parse_str("(module)").unwrap();
    let error = refusal(core_module).await;
    assert!(matches!(error, LoadError::NotAComponent(_)), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_without_a_supported_version_is_refused_naming_its_exports() {
    let error = refusal(wat::parse_str("(component)").unwrap()).await;
    assert!(error.to_string().contains("exports: nothing"), "{error}");
    let future_version = wat::parse_str(
        r#"(component
            (instance $i)
            (export "opentinker:plugin/environment@0.9.0" (instance $i)))"#,
    )
    .unwrap();
    let error = refusal(future_version).await;
    assert!(
        matches!(error, LoadError::UnsupportedVersion { .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("opentinker:plugin/environment@0.9.0")
            && error.to_string().contains("0.1.x, @0.2.x or @0.3.x"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_2_component_without_metadata_is_refused() {
    let no_metadata = wat::parse_str(
        r#"(component
            (instance $i)
            (export "opentinker:plugin/environment@0.2.0" (instance $i)))"#,
    )
    .unwrap();
    let error = refusal(no_metadata).await;
    assert!(
        matches!(error, LoadError::MissingMetadata { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("opentinker:plugin/metadata"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_importing_what_the_host_does_not_provide_is_refused_by_name() {
    let greedy = wat::parse_str(
        r#"(component
            (import "evil:net/raw-socket@1.0.0" (instance))
            (instance $i)
            (export "opentinker:plugin/environment@0.1.0" (instance $i)))"#,
    )
    .unwrap();
    let error = refusal(greedy).await;
    assert!(
        matches!(error, LoadError::ForbiddenImports { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("evil:net/raw-socket@1.0.0"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_component_is_refused_before_compiling() {
    let host = PluginHost::new(HostConfig {
        max_component_bytes: 1024,
        max_instances: 16,
        ..HostConfig::default()
    })
    .unwrap();
    let error = host
        .load_file(&plugin_wasm("tictactoe"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(error, LoadError::TooLarge { max: 1024, .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_above_the_host_maxima_or_zero_are_refused() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let too_much = Limits {
        memory_bytes: 1 << 40,
        ..Limits::default()
    };
    assert!(matches!(
        plugin.check_limits(&too_much),
        Err(LimitError::AboveMaximum {
            name: "memory_bytes",
            ..
        })
    ));
    let no_fuel = Limits {
        fuel: 0,
        ..Limits::default()
    };
    assert_eq!(plugin.check_limits(&no_fuel), Err(LimitError::Zero("fuel")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_budgets_end_a_runaway_call_with_out_of_fuel() {
    let host = test_host();
    let plugin = load(&host, "adversarial/infinite-loop").await;
    let limits = Limits {
        fuel: 50_000_000,
        ..Limits::default()
    };
    plugin.check_limits(&limits).unwrap();
    let mut episode = plugin.start_episode("{}", "{}", 0, &limits).await.unwrap();
    let error = episode.step("go").await.unwrap_err();
    assert_eq!(
        error.kind,
        opentinker::plugin::ErrorKind::OutOfFuel,
        "{error}"
    );
    // The poisoned episode answers every later call with the same error.
    assert_eq!(episode.observe(0).await.unwrap_err(), error);
}

/// A way to damage a cache entry.
type Tampering<'a> = Box<dyn Fn() + 'a>;

/// The cache entry of `digest` in a host's cache folder.
fn entry(host: &PluginHost, digest: &str) -> std::path::PathBuf {
    host.cache_dir().unwrap().join(format!("{digest}.cwasm"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_cache_never_runs_other_code_never_hangs_and_costs_a_recompilation() {
    let cache = tempfile::tempdir().unwrap();
    let (tictactoe, arithmetic) = (plugin_wasm("tictactoe"), plugin_wasm("arithmetic"));
    let host = host_with_cache(cache.path());
    let good = host.load_file(&tictactoe).await.unwrap();
    let other = host.load_file(&arithmetic).await.unwrap();
    let (good_entry, other_entry) = (entry(&host, good.digest()), entry(&host, other.digest()));
    let good_bytes = std::fs::read(&good_entry).unwrap();

    // Each tampering of arithmetic's entry, then a load of arithmetic by a fresh host.
    let tamperings: Vec<(&str, Tampering<'_>)> = vec![
        (
            "tictactoe's entry under arithmetic's digest",
            Box::new(|| std::fs::write(&other_entry, &good_bytes).unwrap()),
        ),
        (
            "a link to tictactoe's entry",
            Box::new(|| std::os::unix::fs::symlink(&good_entry, &other_entry).unwrap()),
        ),
        (
            "a FIFO",
            Box::new(|| {
                let path = std::ffi::CString::new(other_entry.to_str().unwrap()).unwrap();
                // SAFETY: a valid C string and mode.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
            }),
        ),
        (
            "a 64 GiB sparse file",
            Box::new(|| {
                let file = std::fs::File::create(&other_entry).unwrap();
                file.set_len(64 << 30).unwrap();
            }),
        ),
    ];
    for (what, tamper) in tamperings {
        let _ = std::fs::remove_file(&other_entry);
        tamper();
        let started = std::time::Instant::now();
        let fresh = host_with_cache(cache.path());
        let loaded = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            fresh.load_file(&arithmetic),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: the load hung"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!loaded.load_report().cache_hit, "{what}");
        assert_eq!(loaded.digest(), other.digest(), "{what}");
        // It is arithmetic that runs: its own task generator answers.
        let task = loaded
            .generate_task("{}", 3, &Limits::default())
            .await
            .unwrap();
        assert!(task.contains("\"answer\""), "{what}: {task}");
        let info = loaded.environment_info(&Limits::default()).await.unwrap();
        assert_eq!(info.name, "arithmetic", "{what}");
        assert!(started.elapsed().as_secs() < 60, "{what}");
        // The recompiled entry is sound again.
        assert!(
            host_with_cache(cache.path())
                .load_file(&arithmetic)
                .await
                .unwrap()
                .load_report()
                .cache_hit,
            "{what}"
        );
    }

    // Another host's key (a copied cache folder without its key) makes every entry a miss.
    std::fs::remove_file(cache.path().join("cache.key")).unwrap();
    let rekeyed = host_with_cache(cache.path());
    assert!(
        !rekeyed
            .load_file(&tictactoe)
            .await
            .unwrap()
            .load_report()
            .cache_hit
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_evicts_the_entries_used_longest_ago_past_its_size_bound() {
    let cache = tempfile::tempdir().unwrap();
    let bound = {
        let host = host_with_cache(cache.path());
        let plugin = host.load_file(&plugin_wasm("tictactoe")).await.unwrap();
        std::fs::metadata(entry(&host, plugin.digest()))
            .unwrap()
            .len()
            * 5
            / 2
    };
    let host = PluginHost::new(HostConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        cache_max_bytes: bound,
        max_instances: 64,
        ..HostConfig::default()
    })
    .unwrap();
    for name in ["tictactoe", "arithmetic", "guess-number", "math-answer"] {
        host.load_file(&plugin_wasm(name)).await.unwrap();
    }
    let total: u64 = std::fs::read_dir(host.cache_dir().unwrap())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(total <= bound, "{total} > {bound}");
    // The last one loaded is still there.
    let last = host.load_file(&plugin_wasm("math-answer")).await.unwrap();
    assert!(last.load_report().cache_hit);
}

/// A plugin of the project's own with a compile bomb appended: 258 KB that take Cranelift minutes
/// and gigabytes (1.7 GB resident after 10 s, still compiling after 2 minutes, in a process
/// without limits).
fn compile_bomb() -> Vec<u8> {
    let plugin = std::fs::read(plugin_wasm("arithmetic")).unwrap();
    patched(
        &plugin,
        Patch::CompileBomb {
            locals: 2_000,
            loops: 500,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_bomb_is_refused_within_ten_seconds_and_a_gibibyte() {
    let host = test_host();
    let bomb = compile_bomb();
    let started = Instant::now();
    let error = host.load(bomb).await.err().unwrap();
    let took = started.elapsed();
    // The worker's address space is capped at 780 MiB for a component of this size, so no child
    // of this process (the workers, and the cargo builds of the plugins) ever held 1 GiB.
    assert!(
        matches!(
            error,
            LoadError::CompileLimit {
                resource: CompileResource::Memory | CompileResource::CpuTime,
                ..
            }
        ),
        "{error}"
    );
    assert!(took < Duration::from_secs(10), "refused after {took:?}");
    let peak = children_peak_resident_bytes();
    assert!(peak <= 1 << 30, "a child held {peak} bytes");
    // The host is unharmed: a good plugin still loads and runs.
    let plugin = load(&host, "arithmetic").await;
    plugin.environment_info(&Limits::default()).await.unwrap();
}

/// Load the compile bomb on a host whose compilation has 4 GiB, `cpu_time_ms` of CPU (however
/// large the component) and `wall_time_ms`: its error, and how long the refusal took.
async fn bomb_under(cpu_time_ms: u64, wall_time_ms: u64) -> (LoadError, Duration) {
    let host = PluginHost::new(HostConfig {
        max_instances: 16,
        compile: CompileLimits {
            wall_time_ms,
            cpu_time_ms,
            cpu_time_ms_per_mib: 0,
            memory_bytes: 4 << 30,
            ..CompileLimits::default()
        },
        ..HostConfig::default()
    })
    .unwrap();
    let started = Instant::now();
    let error = host.load(compile_bomb()).await.err().unwrap();
    (error, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compilation_past_its_cpu_time_is_stopped() {
    let (error, took) = bomb_under(1_000, 30_000).await;
    assert!(
        matches!(
            error,
            LoadError::CompileLimit {
                resource: CompileResource::CpuTime,
                limit: 1_000
            }
        ),
        "{error}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(error.to_string().contains("1000 ms of CPU time"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compilation_past_its_wall_time_is_stopped() {
    // One second of CPU (the limit's granularity) cannot pass in 300 ms on two cores.
    let (error, took) = bomb_under(100, 300).await;
    assert!(
        matches!(
            error,
            LoadError::CompileLimit {
                resource: CompileResource::WallTime,
                ..
            }
        ),
        "{error}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_defining_too_much_are_refused_before_compiling() {
    let host = test_host();
    let plugin = std::fs::read(plugin_wasm("arithmetic")).unwrap();
    let cases = [
        (Patch::CoreInstances { count: 300 }, "core instances"),
        (Patch::Memories { count: 4, pages: 1 }, "linear memories"),
    ];
    for (patch, what) in cases {
        let started = Instant::now();
        let error = host.load(patched(&plugin, patch)).await.err().unwrap();
        match &error {
            LoadError::Structure(StructureError::AboveLimit { what: named, .. }) => {
                assert_eq!(named, what, "{error}")
            }
            other => panic!("{patch:?}: {other}"),
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{patch:?}");
    }
    // Within the limits, the same patches load and run.
    for patch in [
        Patch::CoreInstances { count: 20 },
        Patch::Memories { count: 3, pages: 1 },
    ] {
        let plugin = host.load(patched(&plugin, patch)).await.unwrap();
        let (summary, _) = opentinker_tests::play(&plugin, 2, Limits::default()).await;
        assert_eq!(summary.completed, 2, "{patch:?}: {summary:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_compile_worker_is_a_clear_error() {
    let host = PluginHost::new(HostConfig {
        max_instances: 16,
        compile_worker: Some("/nonexistent/opentinker".into()),
        ..HostConfig::default()
    })
    .unwrap();
    let error = host
        .load(std::fs::read(plugin_wasm("arithmetic")).unwrap())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(error, LoadError::CompilerUnavailable(_)),
        "{error}"
    );
    assert!(
        error.to_string().contains("/nonexistent/opentinker"),
        "{error}"
    );
}
