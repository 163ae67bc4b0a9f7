//! Episodes of real plugins played by a model through the sampler: the token-in/token-out
//! transcripts the RL driver trains on.

use std::sync::Arc;

use opentinker::api::SamplingParams;
use opentinker::client::ServiceClient;
use opentinker::client::{LocalModel, TinyModelSpec};
use opentinker::plugin::Limits;
use opentinker::rl::Renderer;
use opentinker::rl::{Actor, Rollout};
use opentinker::rl::{SpanKind, rl_datum};

/// A 5-turn guess-number episode with the built-in chat agent: one sequence, five action spans
/// in turn order, the prompt of each turn extending the previous one, and one datum whose mask
/// covers exactly the sampled tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_turn_episode_is_one_datum() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    TinyModelSpec {
        seed: 4,
        ..TinyModelSpec::built_in()
    }
    .generate(&model_dir)
    .unwrap();
    let model = LocalModel::load(&model_dir).unwrap();
    let renderer = Renderer::new(
        model.chat_template().unwrap().clone(),
        Arc::clone(model.tokenizer()),
    )
    .unwrap();
    let context = model.context_length();
    let service = model.serve("tiny".into(), 8192, None);
    let host = opentinker_tests::test_host();
    let environment = opentinker_tests::load(&host, "guess-number").await;
    let limits = Limits::default();
    let rollout = Rollout {
        environment: &environment,
        config: r#"{"max": 1000, "turns": 5}"#,
        agent: None,
        agent_config: "{}",
        reward: None,
        reward_config: "{}",
        limits: &limits,
        renderer: &renderer,
        params: SamplingParams {
            max_tokens: Some(6),
            ..SamplingParams::default()
        },
        max_turns: 16,
        context,
        failure_reward: -1.0,
    };
    let outcome = rollout
        .play(
            r#"{"secret": 777}"#,
            11,
            &[Actor::Policy(service.base_sampling_client())],
        )
        .await;
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.steps, 5, "the random policy should not find 777");
    assert_eq!(outcome.turn_rewards, vec![vec![0.0; 5]]);
    let transcript = outcome.transcripts[0].clone().unwrap();
    let sequences = transcript.into_sequences();
    assert_eq!(sequences.len(), 1);
    let sequence = &sequences[0];
    assert_eq!(sequence.turns(), vec![0, 1, 2, 3, 4]);
    // Context and action spans alternate, starting and ending as a chat does.
    let kinds: Vec<bool> = sequence
        .spans
        .iter()
        .map(|s| matches!(s.kind, SpanKind::Action { .. }))
        .collect();
    assert_eq!(
        kinds,
        [
            false, true, false, true, false, true, false, true, false, true
        ]
    );
    let datum = rl_datum(sequence, |turn| turn as f32 + 1.0).unwrap();
    let action_tokens: usize = sequence
        .spans
        .iter()
        .filter(|s| matches!(s.kind, SpanKind::Action { .. }))
        .map(|s| s.tokens.len())
        .sum();
    assert_eq!(datum.mask.iter().sum::<f32>() as usize, action_tokens);
    assert_eq!(datum.input_tokens.len() + 1, sequence.len());
    let advantages = datum.advantages.unwrap();
    assert_eq!(*advantages.last().unwrap(), 5.0);
    // The last messages the player saw are the environment's, as text.
    assert!(
        outcome.messages[0]
            .iter()
            .any(|m| m.content.contains("guesses left"))
    );
}
