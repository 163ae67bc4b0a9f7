//! Loading components: the compile cache, and clear refusals of what the host cannot run.

use opentinker::plugin::{
    HostConfig, LimitError, Limits, LoadError, PluginHost, PluginKind, WIT_VERSION,
};
use opentinker_tests::{load, plugin_wasm, test_host};

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
    let third = host_with_cache(cache.path())
        .load_file(&wasm)
        .await
        .unwrap();
    assert!(!third.load_report().cache_hit);
    let fourth = host_with_cache(cache.path())
        .load_file(&wasm)
        .await
        .unwrap();
    assert!(fourth.load_report().cache_hit);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_describes_itself() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let description = plugin.description();
    assert_eq!(description.kinds, vec![PluginKind::Environment]);
    assert_eq!(description.wit_version.as_deref(), Some(WIT_VERSION));
    assert_eq!(description.digest.len(), 64);
    assert!(
        description
            .exports
            .iter()
            .any(|e| e == "opentinker:plugin/environment@0.1.0")
    );
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
            .contains("opentinker:plugin/environment@0.9.0"),
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
async fn limits_above_the_host_maxima_or_needing_fuel_are_refused() {
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
    let fuel = Limits {
        fuel: Some(1_000_000),
        ..Limits::default()
    };
    assert_eq!(plugin.check_limits(&fuel), Err(LimitError::FuelNotMetered));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_budgets_end_a_runaway_call_with_out_of_fuel() {
    let host = PluginHost::new(HostConfig {
        fuel: true,
        max_instances: 64,
        ..HostConfig::default()
    })
    .unwrap();
    let plugin = host
        .load_file(&plugin_wasm("adversarial/infinite-loop"))
        .await
        .unwrap();
    let limits = Limits {
        fuel: Some(50_000_000),
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
