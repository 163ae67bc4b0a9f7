//! Untrusted plugins: each adversarial component gives its typed result, a well-behaved episode
//! running beside it finishes normally, and memory comes back after many limit hits.

use std::time::Duration;

use opentinker::plugin::{EpisodeRecord, ErrorKind, HostConfig, Limits, PluginHost};
use opentinker::plugin::{PlayOptions, PlaySummary, play_random};

use opentinker_tests::hostile::{Patch, patched};
use opentinker_tests::{assert_all_failed_with, load, play, plugin_wasm, test_host};

/// A short call timeout, and the most fuel a host allows (minutes of guest code), so that the
/// timeout is what ends a runaway call; everything else is the default.
fn quick_timeout() -> Limits {
    Limits {
        call_timeout_ms: 300,
        fuel: Limits::default_maxima().fuel,
        episode_fuel: Limits::default_maxima().episode_fuel,
        ..Limits::default()
    }
}

/// Run `episodes` of the adversarial plugin under `limits` and, at the same time, tic-tac-toe
/// episodes; check the tic-tac-toe episodes all finish normally and return the adversarial
/// records.
async fn beside_a_good_neighbour(
    host: &PluginHost,
    adversarial: &str,
    episodes: u32,
    limits: Limits,
) -> (PlaySummary, Vec<EpisodeRecord>) {
    let bad = load(host, adversarial).await;
    let good = load(host, "tictactoe").await;
    let ((bad_summary, records), (good_summary, _)) = tokio::join!(
        play(&bad, episodes, limits),
        play(&good, 40, Limits::default()),
    );
    assert_eq!(
        good_summary.completed, 40,
        "neighbour of {adversarial}: {good_summary:?}"
    );
    assert!(
        good_summary.errors.is_empty(),
        "neighbour of {adversarial}: {good_summary:?}"
    );
    (bad_summary, records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_runs_out_of_fuel_and_a_short_call_timeout_still_holds() {
    let host = test_host();
    let (summary, _) =
        beside_a_good_neighbour(&host, "adversarial/infinite-loop", 6, Limits::default()).await;
    assert_all_failed_with(&summary, ErrorKind::OutOfFuel);
    // With a wall-time backstop shorter than the fuel lasts (the most fuel a host allows runs
    // for minutes), the backstop ends the call.
    let (summary, _) =
        beside_a_good_neighbour(&host, "adversarial/infinite-loop", 2, quick_timeout()).await;
    assert_all_failed_with(&summary, ErrorKind::Timeout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeper_times_out_on_the_wall_clock_backstop() {
    let host = test_host();
    let (summary, _) =
        beside_a_good_neighbour(&host, "adversarial/sleeper", 6, quick_timeout()).await;
    assert_all_failed_with(&summary, ErrorKind::Timeout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_hits_the_memory_limit() {
    let host = test_host();
    let (summary, records) =
        beside_a_good_neighbour(&host, "adversarial/memory-hog", 6, Limits::default()).await;
    assert_all_failed_with(&summary, ErrorKind::MemoryLimit);
    assert!(
        records[0]
            .error
            .as_ref()
            .is_some_and(|e| e.message.contains("refused"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_recursion_traps_with_a_stack_overflow() {
    let host = test_host();
    let (summary, records) =
        beside_a_good_neighbour(&host, "adversarial/deep-recursion", 6, Limits::default()).await;
    assert_all_failed_with(&summary, ErrorKind::Trap);
    let message = &records[0]
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    assert!(message.contains("stack overflow"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giant_output_is_refused() {
    let host = test_host();
    let (summary, _) =
        beside_a_good_neighbour(&host, "adversarial/giant-output", 6, Limits::default()).await;
    assert_all_failed_with(&summary, ErrorKind::OutputTooLarge);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_flood_completes_with_its_log_truncated() {
    let host = test_host();
    let (summary, _) =
        beside_a_good_neighbour(&host, "adversarial/log-flood", 6, Limits::default()).await;
    assert_eq!(summary.completed, 6, "{summary:?}");
    assert_eq!(summary.mean_reward, 1.0);
    // Per episode: 2048 lines each of stdout and stderr (1021 bytes) and of `host.log` (1028).
    let written_per_episode = 2048 * (2 * 1021 + 1028);
    let kept = Limits::default().log_bytes;
    let expected_dropped = 6 * (written_per_episode - kept);
    assert!(
        summary.log_bytes_dropped.abs_diff(expected_dropped) < 6 * 64,
        "dropped {} bytes, expected about {expected_dropped}",
        summary.log_bytes_dropped
    );

    let plugin = load(&host, "adversarial/log-flood").await;
    let mut episode = plugin
        .start_episode("{}", "{}", 1, &Limits::default())
        .await
        .unwrap();
    episode.step("go").await.unwrap();
    let (log, dropped) = episode.log();
    assert_eq!(log.len() as u64, kept);
    assert!(log.starts_with("flood flood"), "{}", &log[..40]);
    assert!(dropped > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_at_step_three_keeps_the_earlier_rewards() {
    let host = test_host();
    let (summary, records) =
        beside_a_good_neighbour(&host, "adversarial/trap-at-step", 6, Limits::default()).await;
    assert_all_failed_with(&summary, ErrorKind::Trap);
    for record in &records {
        let error = record.error.as_ref().expect("an error");
        assert_eq!(error.step, 3);
        assert!(
            error.message.contains("deliberate fault at step 3")
                || error.message.contains("unreachable"),
            "{}",
            error.message
        );
        assert_eq!(record.step_rewards, vec![vec![0.5], vec![0.5]]);
        assert_eq!(record.returns, vec![1.0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_finds_nothing_of_the_host() {
    let host = test_host();
    let (summary, records) =
        beside_a_good_neighbour(&host, "adversarial/probe", 6, Limits::default()).await;
    assert_eq!(summary.completed, 6, "{summary:?}");
    assert_eq!(summary.mean_reward, 1.0, "{:?}", records[0].metrics);
    let metrics = &records[0].metrics[0];
    let value = |name: &str| metrics.iter().find(|m| m.name == name).map(|m| m.value);
    for name in [
        "readable_paths",
        "working_directory",
        "env_vars",
        "args",
        "tcp_connections",
        "udp_sockets",
        "name_lookups",
        "wall_clock_secs",
        "wall_ms_during_sleep",
        "found",
    ] {
        assert_eq!(value(name), Some(0.0), "{name}: {metrics:?}");
    }
    // The virtual monotonic clock moved by the sleep, at once.
    assert!(
        value("virtual_sleep_ms").is_some_and(|ms| ms >= 200.0),
        "{metrics:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_that_break_the_contract_are_invalid_output() {
    let host = test_host();
    let plugin = load(&host, "adversarial/bad-output").await;
    for (how, problem) in [
        ("nan", "reward of NaN"),
        ("infinite", "reward of inf"),
        ("length", "2 rewards for 1 players"),
        ("player", "named player 5 to move"),
        ("recipient", "messages to player 9"),
    ] {
        let config = format!(r#"{{"break": "{how}"}}"#);
        let mut episode = plugin
            .start_episode(&config, "{}", 0, &Limits::default())
            .await
            .unwrap();
        let error = episode.step("go").await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidOutput, "{how}: {error}");
        assert!(error.message.contains(problem), "{how}: {error}");
        assert_eq!(episode.record().error.as_ref().map(|e| e.step), Some(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_above_the_host_maxima_start_no_episode() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let limits = Limits {
        call_timeout_ms: 10_000_000,
        ..Limits::default()
    };
    let error = plugin
        .start_episode("{}", "{}", 0, &limits)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert!(error.message.contains("call_timeout_ms"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_episode_waits_for_a_free_instance_slot_instead_of_failing() {
    let host = PluginHost::new(HostConfig {
        max_instances: 4,
        ..Default::default()
    })
    .unwrap();
    let plugin = load(&host, "tictactoe").await;
    let limits = Limits::default();
    let mut held = Vec::new();
    for seed in 0..4 {
        held.push(
            plugin
                .start_episode("{}", "{}", seed, &limits)
                .await
                .unwrap(),
        );
    }
    let waiting = tokio::spawn({
        let (plugin, limits) = (plugin.clone(), limits.clone());
        async move {
            plugin
                .start_episode("{}", "{}", 9, &limits)
                .await
                .map(|_| ())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a fifth instance started with four slots"
    );
    held.pop();
    let started = tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await;
    assert!(matches!(started, Ok(Ok(Ok(())))), "{started:?}");

    // A random-play batch larger than the slots is cut to fit.
    drop(held);
    let options = PlayOptions {
        episodes: 12,
        concurrency: 64,
        ..PlayOptions::default()
    };
    let (summary, _) = play_random(&plugin, &options).await.unwrap();
    assert_eq!(
        (summary.completed, summary.max_live_episodes),
        (12, 4),
        "{summary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_flood_is_refused_and_a_long_error_is_cut() {
    let host = test_host();
    let plugin = load(&host, "adversarial/bad-output").await;
    let mut episode = plugin
        .start_episode(r#"{"break": "flood"}"#, "{}", 0, &Limits::default())
        .await
        .unwrap();
    let error = episode.step("go").await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutputTooLarge, "{error}");
    assert!(
        error.message.contains("items, above the limit of 4096"),
        "{error}"
    );

    let mut episode = plugin
        .start_episode(r#"{"break": "long-error"}"#, "{}", 0, &Limits::default())
        .await
        .unwrap();
    let error = episode.step("go").await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::PluginError, "{error}");
    assert!(
        error.message.ends_with("[195904 more bytes cut]"),
        "{error}"
    );
    let recorded = episode.record().error.as_ref().unwrap();
    assert!(recorded.message.len() < 4_200, "{}", recorded.message.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_episode_ends_at_the_hosts_turn_limit() {
    let host = test_host();
    let limits = Limits {
        max_turns: 200,
        ..Limits::default()
    };
    let (summary, records) = beside_a_good_neighbour(&host, "adversarial/endless", 4, limits).await;
    assert_all_failed_with(&summary, ErrorKind::EpisodeLimit);
    for record in &records {
        assert_eq!(record.steps, 200);
        assert_eq!(record.step_rewards.len(), 200);
        let error = record.error.as_ref().unwrap();
        assert!(error.message.contains("max_turns"), "{}", error.message);
    }
    // The bytes all of an episode's calls return are bounded too.
    let limits = Limits {
        episode_output_bytes: 2_000,
        ..Limits::default()
    };
    let (summary, records) = beside_a_good_neighbour(&host, "adversarial/endless", 4, limits).await;
    assert_all_failed_with(&summary, ErrorKind::EpisodeLimit);
    let error = records[0].error.as_ref().unwrap();
    assert!(
        error.message.contains("episode_output_bytes"),
        "{}",
        error.message
    );
    assert!(records[0].steps < 100, "{}", records[0].steps);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_million_players_are_refused_before_any_per_player_work() {
    let host = test_host();
    let plugin = load(&host, "adversarial/crowd").await;
    let error = plugin
        .environment_info(&Limits::default())
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidOutput, "{error}");
    assert!(
        error.message.contains("100000000 players") && error.message.contains("max_players"),
        "{error}"
    );
    let error = plugin
        .start_episode("{}", "{}", 0, &Limits::default())
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind, ErrorKind::InvalidOutput, "{error}");
}

/// Arithmetic with `extra` more linear memories of 1 MiB each.
/// A task of the arithmetic environment (which refuses an episode without one).
const ARITHMETIC_TASK: &str = r#"{"a": 2, "b": 3, "op": "+", "answer": 5}"#;

async fn with_memories(host: &PluginHost, extra: u32) -> opentinker::plugin::Plugin {
    let plugin = std::fs::read(plugin_wasm("arithmetic")).unwrap();
    host.load(patched(
        &plugin,
        Patch::Memories {
            count: extra,
            pages: 16,
        },
    ))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_memories_of_an_instance_share_one_budget() {
    let host = test_host();
    let limits = Limits {
        memory_bytes: 3 << 20,
        ..Limits::default()
    };
    // The plugin alone fits in 3 MiB; with three more memories of 1 MiB it does not, though each
    // memory alone would.
    let (alone, _) = play(&load(&host, "arithmetic").await, 4, limits.clone()).await;
    assert_eq!(alone.completed, 4, "{alone:?}");
    let error = with_memories(&host, 3)
        .await
        .start_episode("{}", ARITHMETIC_TASK, 1, &limits)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind, ErrorKind::MemoryLimit, "{error}");
}

/// Whether `start` is still waiting after 200 ms.
async fn still_waiting<T: Send + 'static>(start: &tokio::task::JoinHandle<T>) -> bool {
    tokio::time::sleep(Duration::from_millis(200)).await;
    !start.is_finished()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plugin_cannot_take_every_slot_and_many_memories_take_more_slots() {
    let host = PluginHost::new(HostConfig {
        max_instances: 8,
        max_instances_per_plugin: 4,
        ..Default::default()
    })
    .unwrap();
    let greedy = load(&host, "tictactoe").await;
    let other = load(&host, "arithmetic").await;
    let limits = Limits::default();
    let mut held = Vec::new();
    for seed in 0..4 {
        held.push(
            greedy
                .start_episode("{}", "{}", seed, &limits)
                .await
                .unwrap(),
        );
    }
    // The greedy plugin's fifth episode waits for its own share, holding nothing meanwhile ...
    let fifth = tokio::spawn({
        let (greedy, limits) = (greedy.clone(), limits.clone());
        async move { greedy.start_episode("{}", "{}", 9, &limits).await.map(drop) }
    });
    assert!(
        still_waiting(&fifth).await,
        "a fifth instance of one plugin started"
    );
    // ... while another plugin starts at once, on the slots left.
    let task = other.generate_task("{}", 1, &limits).await.unwrap();
    let started = tokio::time::timeout(
        Duration::from_secs(5),
        other.start_episode("{}", &task, 1, &limits),
    )
    .await;
    assert!(matches!(started, Ok(Ok(_))), "the other plugin waited");
    held.pop();
    let fifth = tokio::time::timeout(Duration::from_secs(5), fifth).await;
    assert!(matches!(fifth, Ok(Ok(Ok(())))), "{fifth:?}");
    drop(held);

    // An instance of four memories takes two slots (two memories each): on four slots, two run
    // and the third waits, instead of failing for want of pooled memories.
    let host = PluginHost::new(HostConfig {
        max_instances: 4,
        ..Default::default()
    })
    .unwrap();
    let wide = with_memories(&host, 3).await;
    assert_eq!(wide.max_instances(), 2);
    let mut held = Vec::new();
    for seed in 0..2 {
        held.push(
            wide.start_episode("{}", ARITHMETIC_TASK, seed, &limits)
                .await
                .unwrap(),
        );
    }
    let third = tokio::spawn({
        let (wide, limits) = (wide.clone(), limits.clone());
        async move {
            wide.start_episode("{}", ARITHMETIC_TASK, 9, &limits)
                .await
                .map(drop)
        }
    });
    assert!(still_waiting(&third).await, "a third wide instance started");
    held.pop();
    let third = tokio::time::timeout(Duration::from_secs(5), third).await;
    assert!(matches!(third, Ok(Ok(Ok(())))), "{third:?}");
}

/// What a seed's episode came to: its rewards and steps, or the kind of its failure and the step.
fn outcomes(records: &[EpisodeRecord]) -> Vec<(u64, String)> {
    records
        .iter()
        .map(|r| {
            let outcome = match &r.error {
                Some(error) => format!("{} at step {}", error.kind, error.step),
                None => format!("{:?} in {} steps", r.step_rewards, r.steps),
            };
            (r.seed, outcome)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_has_the_same_outcome_alone_and_among_sixty_four_cpu_heavy_neighbours() {
    let host = test_host();
    let plugin = load(&host, "adversarial/cpu-heavy").await;
    // Each step runs 200,000 x (1 + seed % 4) rounds of a hash, 21 instructions a round:
    // 4.2M, 8.4M, 12.6M or 16.8M fuel a step; seeds of remainder 3 are above the 14M limit.
    let limits = Limits {
        fuel: 14_000_000,
        ..Limits::default()
    };
    let options = |concurrency| PlayOptions {
        episodes: 64,
        seed: 0,
        config: r#"{"rounds": 200000}"#.into(),
        concurrency,
        limits: limits.clone(),
        keep_transcripts: true,
        ..PlayOptions::default()
    };
    let (alone, alone_records) = play_random(&plugin, &options(1)).await.unwrap();
    let (crowded, crowded_records) = play_random(&plugin, &options(64)).await.unwrap();
    assert_eq!(crowded.max_live_episodes, 64);
    assert_eq!(outcomes(&alone_records), outcomes(&crowded_records));
    assert_eq!(
        alone.errors.get(&ErrorKind::OutOfFuel),
        Some(&16),
        "{alone:?}"
    );
    assert_eq!(alone.completed, 48, "{alone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_ends_when_its_own_fuel_or_wall_time_is_spent() {
    let host = test_host();
    let plugin = load(&host, "adversarial/cpu-heavy").await;
    // Each step of seed 0 (4.2M fuel) fits the call's fuel, but the two together do not fit
    // the episode's.
    let limits = Limits {
        fuel: 10_000_000,
        episode_fuel: 6_000_000,
        ..Limits::default()
    };
    let options = PlayOptions {
        episodes: 1,
        config: r#"{"rounds": 200000}"#.into(),
        limits,
        ..PlayOptions::default()
    };
    let (summary, records) = play_random(&plugin, &options).await.unwrap();
    assert_all_failed_with(&summary, ErrorKind::EpisodeLimit);
    let error = records[0].error.as_ref().unwrap();
    assert_eq!(error.step, 2, "{error:?}");
    assert!(error.message.contains("episode_fuel"), "{error:?}");

    // An episode out of wall time ends at its next call, whatever the call's own limits.
    let limits = Limits {
        episode_timeout_ms: 1,
        ..Limits::default()
    };
    let mut episode = plugin.start_episode("{}", "{}", 0, &limits).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let error = episode.observe(0).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::EpisodeLimit, "{error}");
    assert!(error.message.contains("episode_timeout_ms"), "{error}");
}

/// The adversary plugin `adversary` (built by another language's SDK) fails each way with the
/// typed error its Rust counterpart gets, beside a neighbour that plays on; a raised exception
/// reaches the host as a `plugin_error` with the exception's type `raised` and text.
async fn an_adversary_is_contained_as_a_rust_one_is(adversary: &str, raised: &str) {
    let host = test_host();
    let plugin = load(&host, adversary).await;
    let good = load(&host, "tictactoe").await;
    let cases = [
        ("loop", Some(ErrorKind::OutOfFuel)),
        ("memory", Some(ErrorKind::MemoryLimit)),
        ("raise", Some(ErrorKind::PluginError)),
        ("probe", None),
    ];
    for (mode, expected) in cases {
        let options = PlayOptions {
            episodes: 4,
            config: format!(r#"{{"break": "{mode}"}}"#),
            concurrency: 4,
            ..PlayOptions::default()
        };
        let ((summary, _), (neighbour, _)) = tokio::join!(
            async { play_random(&plugin, &options).await.unwrap() },
            play(&good, 20, Limits::default()),
        );
        assert_eq!(neighbour.completed, 20, "beside {mode}: {neighbour:?}");
        match expected {
            Some(kind) => assert_all_failed_with(&summary, kind),
            // The probe rewards 1 for anything of the host it found.
            None => assert_eq!(
                (summary.completed, summary.mean_reward),
                (4, 0.0),
                "{summary:?}"
            ),
        }
    }
    let (summary, _) = play_random(
        &plugin,
        &PlayOptions {
            episodes: 1,
            config: r#"{"break": "raise"}"#.into(),
            ..PlayOptions::default()
        },
    )
    .await
    .unwrap();
    let message = &summary.error_messages[&ErrorKind::PluginError][0].message;
    assert!(
        message.starts_with(&format!("{raised}: deliberate fault")),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_is_contained_as_a_rust_one_is() {
    if opentinker_test_tools::componentize_py().is_none() {
        return;
    }
    an_adversary_is_contained_as_a_rust_one_is("python/adversary", "ValueError").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_plugin_is_contained_as_a_rust_one_is() {
    if opentinker_test_tools::js_toolchain().is_none() {
        return;
    }
    an_adversary_is_contained_as_a_rust_one_is("js/adversary", "TypeError").await;
}

/// The tool-use environment runs the policy's programs in its own interpreter: a program that
/// never ends, or that allocates without bound, ends its own episode with the host's typed error,
/// while an episode beside it on the same plugin plays on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policys_runaway_program_ends_its_own_episode_alone() {
    if opentinker_test_tools::componentize_py().is_none() {
        return;
    }
    let host = test_host();
    let plugin = load(&host, "python/list-code").await;
    let limits = Limits::default();
    let task = r#"{"question": "sum", "numbers": [3, 8, 1]}"#;
    let cases = [
        ("while True: pass", ErrorKind::OutOfFuel),
        ("xs * 10**8", ErrorKind::MemoryLimit),
    ];
    for (program, expected) in cases {
        let mut runaway = plugin.start_episode("{}", task, 0, &limits).await.unwrap();
        let mut neighbour = plugin.start_episode("{}", task, 1, &limits).await.unwrap();
        runaway.observe(0).await.unwrap();
        neighbour.observe(0).await.unwrap();
        let error = runaway.step(program).await.unwrap_err();
        assert_eq!(error.kind, expected, "{program}: {error}");
        let wrong = neighbour.step("min(xs)").await.unwrap();
        assert_eq!(wrong.messages[0].messages[0].content, "Output: 1");
        let right = neighbour.step("sum(xs)").await.unwrap();
        assert_eq!((right.rewards, right.next_player), (vec![0.5], None));
    }
}
