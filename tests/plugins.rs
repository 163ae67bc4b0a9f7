//! The example plugins, run through the host: many episodes without errors, replay from a seed,
//! thousands of live episodes at once, and the reward plugin's scores.

use opentinker::plugin::{ErrorKind, Limits, Message, PluginKind, Transcript};
use opentinker::plugin::{PlayOptions, play_random};
use opentinker_tests::{load, test_host};

async fn play_many(name: &str, config: &str, episodes: u32) -> opentinker::plugin::PlaySummary {
    let host = test_host();
    let plugin = load(&host, name).await;
    let options = PlayOptions {
        episodes,
        seed: 1,
        config: config.into(),
        ..PlayOptions::default()
    };
    let (summary, _) = play_random(&plugin, &options).await.unwrap();
    assert_eq!(summary.completed, episodes, "{name} {config}: {summary:?}");
    assert!(summary.errors.is_empty(), "{name}: {summary:?}");
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arithmetic_plays_a_thousand_episodes() {
    let summary = play_many("arithmetic", "{}", 1_000).await;
    assert_eq!(summary.mean_steps, 1.0);
    // Half the answers are demonstrations (right), half random numbers (almost always wrong).
    assert!((0.4..0.6).contains(&summary.mean_reward), "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guess_number_plays_a_thousand_episodes() {
    let summary = play_many("guess-number", "{}", 1_000).await;
    assert!(summary.mean_steps > 1.0, "{summary:?}");
    assert!(summary.mean_reward > 0.0, "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tictactoe_plays_a_thousand_episodes_in_every_mode() {
    // The fewest steps a game can take: 3 moves of the policy to win or lose when it opens, 2
    // when the opponent opens, 5 moves of both players in self-play.
    let modes = [
        (r#"{"opponent": "random"}"#, 3.0),
        (r#"{"opponent": "minimax", "first": "opponent"}"#, 2.0),
        (r#"{"opponent": "none"}"#, 5.0),
    ];
    for (config, fewest_steps) in modes {
        let summary = play_many("tictactoe", config, 1_000).await;
        assert!(summary.mean_steps >= fewest_steps, "{config}: {summary:?}");
        if config.contains("minimax") {
            assert!(
                summary.mean_reward <= 0.0,
                "random play never beats minimax: {summary:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_live_tictactoe_episodes_all_complete() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let options = PlayOptions {
        episodes: 2_000,
        concurrency: 2_000,
        ..PlayOptions::default()
    };
    let (summary, _) = play_random(&plugin, &options).await.unwrap();
    assert_eq!(summary.max_live_episodes, 2_000, "{summary:?}");
    assert_eq!(summary.completed, 2_000, "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_plugin_task_and_seed_give_the_same_transcript() {
    let host = test_host();
    for (name, config) in [
        ("arithmetic", "{}"),
        ("guess-number", "{}"),
        ("tictactoe", r#"{"opponent": "random"}"#),
    ] {
        let plugin = load(&host, name).await;
        let options = PlayOptions {
            episodes: 30,
            seed: 99,
            config: config.into(),
            keep_transcripts: true,
            ..PlayOptions::default()
        };
        let (_, first) = play_random(&plugin, &options).await.unwrap();
        let (_, again) = play_random(&plugin, &options).await.unwrap();
        let first = serde_json::to_string(&first).unwrap();
        assert_eq!(first, serde_json::to_string(&again).unwrap(), "{name}");
        let other_seed = PlayOptions {
            seed: 100,
            ..options
        };
        let (_, other) = play_random(&plugin, &other_seed).await.unwrap();
        assert_ne!(
            first,
            serde_json::to_string(&other).unwrap(),
            "{name}: seeds must matter"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tictactoe_self_play_alternates_players_and_rewards_both() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let limits = Limits::default();
    let mut episode = plugin
        .start_episode(r#"{"opponent": "none"}"#, "{}", 3, &limits)
        .await
        .unwrap();
    assert_eq!(episode.info().players, 2);
    let first = episode.observe(0).await.unwrap();
    assert!(first.last().unwrap().content.contains("You play X"));
    let mut movers = Vec::new();
    for action in ["1", "4", "2", "5", "3"] {
        movers.push(episode.to_move().unwrap());
        episode.step(action).await.unwrap();
    }
    assert_eq!(movers, vec![0, 1, 0, 1, 0]);
    assert_eq!(episode.to_move(), None);
    assert_eq!(episode.record().returns, vec![1.0, -1.0]);
    let err = episode.step("6").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_the_plugins_own_error() {
    let host = test_host();
    let plugin = load(&host, "tictactoe").await;
    let started = plugin
        .start_episode(
            r#"{"opponent": "grandmaster"}"#,
            "{}",
            3,
            &Limits::default(),
        )
        .await;
    let Err(err) = started else {
        panic!("an episode with a bad config started");
    };
    assert_eq!(err.kind, ErrorKind::PluginError);
    assert!(err.message.contains("grandmaster"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn math_answer_scores_transcripts_through_the_host() {
    let host = test_host();
    let plugin = load(&host, "math-answer").await;
    assert_eq!(plugin.description().kinds, vec![PluginKind::Reward]);
    let transcript = |reply: &str| Transcript {
        player: 0,
        messages: vec![
            Message::new("user", "What is 6 * 7?"),
            Message::new("assistant", reply),
        ],
    };
    let limits = Limits::default();
    let task = r#"{"answer": 42}"#;
    let scores = plugin
        .score(
            "{}",
            task,
            &[transcript("It is 42."), transcript("41")],
            &limits,
        )
        .await
        .unwrap();
    assert_eq!(scores, vec![1.0, 0.0]);
    assert_eq!(
        plugin
            .score_group("{}", task, &[vec![transcript("42")]], &limits)
            .await
            .unwrap(),
        None
    );
    let err = plugin
        .score("{}", "{}", &[transcript("42")], &limits)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::PluginError);
    let err = plugin
        .start_episode("{}", "{}", 0, &limits)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
}
