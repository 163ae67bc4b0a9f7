//! Every contract version at once: components built against `wit/v0.1` and `wit/v0.2` by the
//! SDKs of their day (`fixtures/wit-0.1`, `fixtures/wit-0.2`) still load and play, and each
//! behaves exactly as its build of today (0.3) from the same source does; what 0.2 brought
//! (metadata, a fallible start, agent and reward configs) holds in 0.3.

use std::path::PathBuf;

use opentinker::plugin::{
    ContractVersion, EpisodeRecord, ErrorKind, Limits, Message, Plugin, PluginHost, PluginKind,
    Transcript,
};
use opentinker::plugin::{PlayOptions, play_random};
use opentinker_tests::{load, repo_root, test_host};

/// A component of the fixtures of `version` (`tests/fixtures/wit-0.1/FILE.wasm`).
async fn load_fixture(host: &PluginHost, version: ContractVersion, file: &str) -> Plugin {
    let (folder, named) = match version {
        ContractVersion::V0_1 => ("wit-0.1", "0.1.0"),
        ContractVersion::V0_2 => ("wit-0.2", "0.2.0"),
        ContractVersion::V0_3 => panic!("0.3 components are built by the tests"),
    };
    let path: PathBuf = repo_root()
        .join("tests/fixtures")
        .join(folder)
        .join(format!("{file}.wasm"));
    let plugin = host
        .load_file(&path)
        .await
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    assert_eq!(plugin.contract(), version);
    assert_eq!(plugin.description().wit_version.as_deref(), Some(named));
    plugin
}

/// The 0.1 fixture `file`.
async fn load_0_1(host: &PluginHost, file: &str) -> Plugin {
    load_fixture(host, ContractVersion::V0_1, file).await
}

/// The 0.2 fixture `file`.
async fn load_0_2(host: &PluginHost, file: &str) -> Plugin {
    load_fixture(host, ContractVersion::V0_2, file).await
}

/// What an episode did, without what differs between two builds of one source (the fuel).
fn played(records: &[EpisodeRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            serde_json::to_string(&(
                r.seed,
                &r.task,
                &r.messages,
                &r.step_rewards,
                &r.metrics,
                &r.returns,
                r.steps,
                r.finished,
            ))
            .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_of_tictactoe_against_0_1_0_2_and_0_3_give_the_same_transcripts() {
    let host = test_host();
    let oldest = load_0_1(&host, "tictactoe").await;
    let old = load_0_2(&host, "tictactoe").await;
    let new = load(&host, "tictactoe").await;
    assert_eq!(new.contract(), ContractVersion::V0_3);
    for config in [r#"{"opponent": "random"}"#, r#"{"opponent": "none"}"#] {
        let options = PlayOptions {
            episodes: 60,
            seed: 11,
            config: config.into(),
            keep_transcripts: true,
            ..PlayOptions::default()
        };
        let (new_summary, new_records) = play_random(&new, &options).await.unwrap();
        assert_eq!(new_summary.completed, 60, "{config}");
        for before in [&oldest, &old] {
            let (summary, records) = play_random(before, &options).await.unwrap();
            assert_eq!(summary.completed, 60, "{config}");
            assert_eq!(played(&records), played(&new_records), "{config}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_fails_at_the_start_since_0_2_and_at_the_first_call_in_0_1() {
    let host = test_host();
    let limits = Limits::default();
    let bad = r#"{"opponent": "grandmaster"}"#;
    for plugin in [
        load_0_2(&host, "tictactoe").await,
        load(&host, "tictactoe").await,
    ] {
        let error = match plugin.start_episode(bad, "{}", 3, &limits).await {
            Ok(_) => panic!("an episode with a bad config started"),
            Err(error) => error,
        };
        assert_eq!(error.kind, ErrorKind::PluginError);
        assert!(error.message.contains("grandmaster"), "{error}");
    }
    let old = load_0_1(&host, "tictactoe").await;
    let mut episode = old.start_episode(bad, "{}", 3, &limits).await.unwrap();
    let error = episode.observe(0).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::PluginError);
    assert!(error.message.contains("grandmaster"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_rewards_of_every_version_answer_alike() {
    let host = test_host();
    let limits = Limits::default();
    let history = vec![
        Message::new("system", "Play."),
        Message::new("user", "first"),
        Message::new("assistant", "1"),
        Message::new("user", "second"),
    ];
    let mut answers = Vec::new();
    for agent in [
        load_0_1(&host, "latest_observation").await,
        load_0_2(&host, "latest_observation").await,
        load(&host, "latest-observation").await,
    ] {
        let mut session = agent.start_agent("{}", 0, 5, &limits).await.unwrap();
        let prompt = session.prompt(&history).await.unwrap();
        let action = session.act(" 7 ").await.unwrap();
        answers.push((prompt, action));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);

    let transcript = |reply: &str| Transcript {
        player: 0,
        messages: vec![
            Message::new("user", "What is 6 * 7?"),
            Message::new("assistant", reply),
        ],
    };
    let transcripts = [transcript("It is 42."), transcript("41")];
    let task = r#"{"answer": 42}"#;
    let mut scores = Vec::new();
    for reward in [
        load_0_1(&host, "math_answer").await,
        load_0_2(&host, "math_answer").await,
        load(&host, "math-answer").await,
    ] {
        scores.push(
            reward
                .score("{}", task, &transcripts, &limits)
                .await
                .unwrap(),
        );
    }
    assert_eq!(scores[0], vec![1.0, 0.0]);
    assert_eq!(scores[0], scores[1]);
    assert_eq!(scores[0], scores[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_since_0_2_say_what_they_are_and_a_0_1_plugin_has_nothing_to_say() {
    let host = test_host();
    let limits = Limits::default();
    let old = load_0_2(&host, "tictactoe").await;
    let new = load(&host, "tictactoe").await;
    let old_metadata = old.metadata(&limits).await.unwrap().expect("0.2 metadata");
    let metadata = new.metadata(&limits).await.unwrap().expect("0.3 metadata");
    assert_eq!(old_metadata, metadata);
    assert_eq!(metadata.name, "tictactoe");
    assert_eq!(metadata.kinds, vec![PluginKind::Environment]);
    assert_eq!(metadata.language, "rust");
    assert_eq!(metadata.license.as_deref(), Some("Apache-2.0"));
    assert!(semver_like(&metadata.version), "{}", metadata.version);
    let schema = metadata.config_schema.expect("tictactoe's config schema");
    assert!(schema["properties"]["opponent"].is_object(), "{schema}");
    let reward = load(&host, "math-answer").await;
    let metadata = reward.metadata(&limits).await.unwrap().unwrap();
    assert_eq!(metadata.kinds, vec![PluginKind::Reward]);
    let old = load_0_1(&host, "tictactoe").await;
    assert_eq!(old.metadata(&limits).await.unwrap(), None);
}

fn semver_like(version: &str) -> bool {
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok())
}
