//! Episodes of real plugins played by a model through the sampler: the token-in/token-out
//! transcripts the RL driver trains on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use opentinker::api::{LossInput, SamplingParams};
use opentinker::client::ServiceClient;
use opentinker::client::{LocalModel, TinyModelSpec};
use opentinker::model::BaseFormat;
use opentinker::plugin::Limits;
use opentinker::queue_auth::QueueLogin;
use opentinker::rl::Renderer;
use opentinker::rl::{Actor, FailureKind, Rollout};
use opentinker::rl::{GroupTask, PlayedGroup, PluginUse, PolicyRef, RewardUse, TASK_FORMAT};
use opentinker::rl::{Pool, Queue, QueueRollouts, QueueSettings, Rollouts, Seat, serve_tasks};
use opentinker::rl::{SpanKind, TaskPlugins, play_task, rl_datum};
use opentinker_test_tools::NatsServer;

/// A 5-turn guess-number episode with the built-in chat agent: one sequence, five action spans
/// in turn order, the prompt of each turn extending the previous one, and one datum whose mask
/// covers exactly the sampled tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_turn_episode_is_one_datum() {
    let table = Table::new().await;
    let environment = opentinker_tests::load(&table.host, "guess-number").await;
    let limits = Limits::default();
    let rollout = Rollout {
        environment: &environment,
        config: r#"{"max": 1000, "turns": 5}"#,
        agent: None,
        agent_config: "{}",
        reward: None,
        reward_config: "{}",
        limits: &limits,
        renderer: &table.renderer,
        params: SamplingParams {
            max_tokens: Some(6),
            ..SamplingParams::default()
        },
        max_turns: 16,
        context: table.context,
        failure_reward: -1.0,
    };
    let outcome = rollout.play(r#"{"secret": 777}"#, 11, &table.actors).await;
    assert_eq!(outcome.failure, None);
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
    let mask = datum.floats(LossInput::Mask).unwrap();
    assert_eq!(mask.iter().sum::<f32>() as usize, action_tokens);
    assert_eq!(datum.model_input.len() + 1, sequence.len());
    let advantages = datum.floats(LossInput::Advantages).unwrap();
    assert_eq!(*advantages.last().unwrap(), 5.0);
    // The last messages the player saw are the environment's, as text.
    assert!(
        outcome.messages[0]
            .iter()
            .any(|m| m.content.contains("guesses left"))
    );
}

/// What the tests play with: the plugin host, the tiny model (its renderer, the base model in one seat),
/// the arithmetic environment and the math-answer reward.
struct Table {
    _dir: tempfile::TempDir,
    host: opentinker::plugin::PluginHost,
    renderer: Renderer,
    context: usize,
    actors: [Actor; 1],
    environment: opentinker::plugin::Plugin,
    reward: opentinker::plugin::Plugin,
}

impl Table {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let model_dir = dir.path().join("model");
        TinyModelSpec {
            seed: 4,
            ..TinyModelSpec::built_in()
        }
        .generate(&model_dir)
        .unwrap();
        let model = LocalModel::load(&model_dir, BaseFormat::F32).unwrap();
        let renderer = Renderer::new(
            model.chat_template().unwrap().clone(),
            Arc::clone(model.tokenizer()),
        )
        .unwrap();
        let context = model.context_length();
        let service = model
            .serve(
                "tiny".into(),
                8192,
                None,
                opentinker::service::DeviceOptions::cpu(),
            )
            .unwrap();
        let host = opentinker_tests::test_host();
        Table {
            _dir: dir,
            renderer,
            context,
            actors: [Actor::Policy(service.base_sampling_client())],
            environment: opentinker_tests::load(&host, "arithmetic").await,
            reward: opentinker_tests::load(&host, "math-answer").await,
            host,
        }
    }

    fn plugins(&self) -> TaskPlugins<'_> {
        TaskPlugins {
            environment: &self.environment,
            agent: None,
            reward: Some(&self.reward),
        }
    }

    /// The task the tests play, naming these plugins.
    fn task(&self) -> GroupTask {
        arithmetic_task(
            self.environment.digest(),
            self.reward.digest(),
            self.context,
        )
    }
}

/// A group of arithmetic episodes scored by the math-answer reward, with the base model in
/// its one seat.
fn arithmetic_task(environment: &str, reward: &str, context: usize) -> GroupTask {
    GroupTask {
        format: TASK_FORMAT,
        job: "arithmetic".into(),
        group: 7,
        version: 0,
        seed: 1234,
        group_size: 3,
        seats: vec![Seat {
            policy: PolicyRef::Base,
            sampler: None,
        }],
        environment: PluginUse {
            digest: environment.into(),
            config: r#"{"max_operand": 9, "operations": ["+"], "reward": false}"#.into(),
        },
        agent: None,
        reward: Some(RewardUse {
            plugin: PluginUse {
                digest: reward.into(),
                config: "{}".into(),
            },
            weight: 0.5,
            group: false,
        }),
        limits: Limits::default(),
        sampling: SamplingParams {
            max_tokens: Some(4),
            ..SamplingParams::default()
        },
        max_turns: 4,
        context,
        failure_reward: -1.0,
    }
}

/// A task is everything its group needs: the task read back from its JSON plays to the same
/// bits (tokens, sampler logprobs, rewards) as the task it was written from, and the played
/// group read back from its JSON is the group that was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_task_read_back_from_its_message_plays_to_the_same_bits() {
    let table = Table::new().await;
    let (plugins, renderer, actors) = (table.plugins(), &table.renderer, &table.actors);
    let (environment, reward) = (&table.environment, &table.reward);
    let task = table.task();
    let played = play_task(&task, plugins, renderer, actors).await;
    assert_eq!(
        (played.id, played.version, played.job.as_str()),
        (7, 0, "arithmetic")
    );
    assert_eq!(played.plugins, [environment.digest(), reward.digest()]);
    assert_eq!(played.episodes.len(), 3);
    for (i, (index, outcome)) in played.episodes.iter().enumerate() {
        assert_eq!(*index, i);
        assert_eq!(outcome.failure, None, "episode {i}");
        assert_eq!(outcome.seed, task.episode_seed(i));
        let transcript = outcome.transcripts[0].as_ref().unwrap();
        assert!(transcript.turns() > 0);
        // The reward plugin's score is in: 0 or 1, weighted by a half.
        assert!(outcome.scores == [0.0] || outcome.scores == [0.5]);
    }
    // The three episodes of one group differ (their seeds do): nothing above held by chance.
    let tokens = |group: &PlayedGroup, i: usize| {
        group.episodes[i].1.transcripts[0]
            .clone()
            .unwrap()
            .into_sequences()
    };
    assert_ne!(tokens(&played, 0), tokens(&played, 1));

    let message = serde_json::to_string(&task).unwrap();
    let read_back: GroupTask = serde_json::from_str(&message).unwrap();
    assert_eq!(read_back, task);
    let again = play_task(&read_back, plugins, renderer, actors).await;
    let answer = serde_json::to_string(&played).unwrap();
    assert_eq!(serde_json::to_string(&again).unwrap(), answer);
    let answer_read_back: PlayedGroup = serde_json::from_str(&answer).unwrap();
    assert_eq!(serde_json::to_string(&answer_read_back).unwrap(), answer);
    for i in 0..3 {
        assert_eq!(tokens(&answer_read_back, i), tokens(&played, i));
    }
}

/// A task this build cannot play as it says (another message format, other plugins than the
/// ones it names, no seats) fails each of its episodes with a reason that names the problem;
/// nothing is played.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_cannot_be_played_as_written_fails_its_episodes_with_the_reason() {
    let table = Table::new().await;
    let (plugins, renderer, actors) = (table.plugins(), &table.renderer, &table.actors);
    let reward = &table.reward;
    let good = table.task();
    let other = "ab".repeat(32);
    let cases = [
        (
            GroupTask {
                format: TASK_FORMAT + 1,
                ..good.clone()
            },
            "task_format",
            format!("format {}", TASK_FORMAT + 1),
        ),
        (
            arithmetic_task(&other, reward.digest(), table.context),
            "task_plugin",
            format!("environment plugin {other}"),
        ),
        (
            GroupTask {
                reward: None,
                ..good.clone()
            },
            "task_plugin",
            "no reward plugin".to_string(),
        ),
        (
            GroupTask {
                seats: Vec::new(),
                ..good.clone()
            },
            "task_seats",
            "no seats".to_string(),
        ),
    ];
    for (task, kind, words) in cases {
        let played = play_task(&task, plugins, renderer, actors).await;
        assert_eq!(played.episodes.len(), 3);
        for (i, (_, outcome)) in played.episodes.iter().enumerate() {
            let failure = outcome.failure.as_ref().unwrap();
            assert_eq!(failure.kind.as_str(), kind);
            let message = failure.message.as_deref().unwrap();
            assert!(message.contains(&words), "{kind}: {message}");
            assert_eq!(outcome.seed, task.episode_seed(i));
            assert_eq!(outcome.steps, 0);
        }
    }
}

/// The group the test's workers fail on, every time.
const DOOMED: u64 = 99;
/// The group the test's workers never finish: they tell the test they started it and wait.
const STUCK: u64 = 98;

/// What a rollout worker does, in this process: plays each task with the table's plugins and
/// the base model, counting the plays; fails on group [`DOOMED`] as a worker that cannot reach
/// what the task needs would; and on group [`STUCK`] says it started (its worker's index) and
/// never ends, so that the test can stop its worker as a kill would.
struct TablePlayer {
    table: Arc<Table>,
    plays: Arc<AtomicUsize>,
    index: usize,
    started: Option<tokio::sync::mpsc::UnboundedSender<usize>>,
}

impl TablePlayer {
    /// A worker that plays with this player: its queue connection (to `url`, as `settings`
    /// say) and its loop, in a task of its own (aborting it stops the worker as a kill would).
    fn serve(
        self,
        url: String,
        settings: QueueSettings,
    ) -> tokio::task::JoinHandle<Result<std::convert::Infallible, opentinker::rl::QueueError>> {
        tokio::spawn(async move {
            let queue = Queue::connect(&url, settings, &QueueLogin::default()).await?;
            serve_tasks(queue, Arc::new(self), 1).await
        })
    }
}

impl Rollouts for TablePlayer {
    fn start(&self, task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>> {
        self.plays.fetch_add(1, Ordering::SeqCst);
        let table = Arc::clone(&self.table);
        let (index, started) = (self.index, self.started.clone());
        Box::pin(async move {
            anyhow::ensure!(
                task.group != DOOMED,
                "this worker cannot play group {DOOMED}"
            );
            if task.group == STUCK {
                if let Some(started) = started {
                    let _ = started.send(index);
                }
                std::future::pending::<()>().await;
            }
            Ok(play_task(&task, table.plugins(), &table.renderer, &table.actors).await)
        })
    }
}

/// The driver goes on: group `group` comes back played, every episode whole.
async fn plays_on(driver: &QueueRollouts, table: &Table, group: u64) {
    let task = GroupTask {
        group,
        ..table.task()
    };
    let next = driver.start(task).await.unwrap();
    assert!(next.episodes.iter().all(|(_, o)| o.failure.is_none()));
}

/// Groups published by a driver to a real NATS JetStream queue and played by three workers come
/// back exactly as they play here, each played once; a group its workers fail on every time is
/// answered after the last delivery with episodes that carry the workers' error, and the driver
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_played_by_three_workers_through_a_real_queue_come_back_as_played_here() {
    let store = tempfile::tempdir().unwrap();
    let Some(nats) = NatsServer::start(store.path()) else {
        return;
    };
    let table = Arc::new(Table::new().await);
    let plays = Arc::new(AtomicUsize::new(0));
    let settings = QueueSettings {
        ack_wait: Duration::from_secs(5),
        max_deliver: 2,
        ..QueueSettings::default()
    };
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let player = TablePlayer {
                table: Arc::clone(&table),
                plays: Arc::clone(&plays),
                index: 0,
                started: None,
            };
            player.serve(nats.url(), settings.clone())
        })
        .collect();
    let queue = Queue::connect(&nats.url(), settings, &QueueLogin::default())
        .await
        .unwrap();
    // A job name that is no subject token (a space, a dot) travels as a digest of itself.
    let driver = QueueRollouts::new(queue, "queue test.1").await.unwrap();
    let tasks: Vec<GroupTask> = (0..6)
        .map(|group| GroupTask {
            group,
            seed: 100 + group,
            ..table.task()
        })
        .collect();
    let played = futures::future::try_join_all(tasks.iter().map(|t| driver.start(t.clone())))
        .await
        .unwrap();
    for (task, played) in tasks.iter().zip(&played) {
        assert_eq!((played.id, played.version), (task.group, task.version));
        assert!(played.job.starts_with("job-"), "{}", played.job);
        let here = play_task(task, table.plugins(), &table.renderer, &table.actors).await;
        assert_eq!(
            serde_json::to_string(&played.episodes).unwrap(),
            serde_json::to_string(&here.episodes).unwrap(),
            "group {}",
            task.group
        );
    }
    assert_eq!(plays.load(Ordering::SeqCst), 6, "each group is played once");

    let doomed = GroupTask {
        group: DOOMED,
        ..table.task()
    };
    let failed = driver.start(doomed.clone()).await.unwrap();
    assert_eq!(failed.episodes.len(), doomed.group_size);
    for (i, (_, outcome)) in failed.episodes.iter().enumerate() {
        let failure = outcome.failure.as_ref().unwrap();
        assert_eq!(failure.kind, FailureKind::RolloutWorker);
        let message = failure.message.as_deref().unwrap();
        assert!(message.contains("cannot play group 99"), "{message}");
        assert_eq!(outcome.seed, doomed.episode_seed(i));
    }
    assert_eq!(
        plays.load(Ordering::SeqCst),
        6 + 2,
        "two deliveries of the doomed group"
    );
    plays_on(&driver, &table, 6).await;
    for worker in workers {
        worker.abort();
    }
}

/// A group whose every worker stops before answering (killed: its play dropped, no more acks)
/// is delivered again after the ack wait, and after its last delivery the server's advisory
/// makes the driver answer it with its episodes failed as `rollout_worker`; the task leaves the
/// queue and the driver goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_every_worker_stops_before_answering_comes_back_failed() {
    let store = tempfile::tempdir().unwrap();
    let Some(nats) = NatsServer::start(store.path()) else {
        return;
    };
    let table = Arc::new(Table::new().await);
    let settings = QueueSettings {
        ack_wait: Duration::from_secs(1),
        max_deliver: 2,
        ..QueueSettings::default()
    };
    let (tell, mut started) = tokio::sync::mpsc::unbounded_channel();
    let worker = |index: usize| {
        let player = TablePlayer {
            table: Arc::clone(&table),
            plays: Arc::new(AtomicUsize::new(0)),
            index,
            started: Some(tell.clone()),
        };
        player.serve(nats.url(), settings.clone())
    };
    let mut workers = std::collections::BTreeMap::new();
    for index in 0..2 {
        workers.insert(index, worker(index));
    }
    let queue = Queue::connect(&nats.url(), settings.clone(), &QueueLogin::default())
        .await
        .unwrap();
    let driver = QueueRollouts::new(queue, "stuck").await.unwrap();
    let stuck = GroupTask {
        group: STUCK,
        ..table.task()
    };
    let answer = tokio::spawn(driver.start(stuck.clone()));
    for delivery in 0..2 {
        let index = tokio::time::timeout(Duration::from_secs(30), started.recv())
            .await
            .unwrap_or_else(|_| panic!("delivery {delivery} of the stuck group never came"))
            .unwrap();
        workers.remove(&index).unwrap().abort();
        let next = 2 + delivery;
        workers.insert(next, worker(next));
    }
    let failed = tokio::time::timeout(Duration::from_secs(30), answer)
        .await
        .expect("the driver answered the stuck group after its last delivery")
        .unwrap()
        .unwrap();
    assert_eq!(failed.episodes.len(), stuck.group_size);
    for (_, outcome) in &failed.episodes {
        let failure = outcome.failure.as_ref().unwrap();
        assert_eq!(failure.kind, FailureKind::RolloutWorker);
        let message = failure.message.as_deref().unwrap();
        assert!(message.contains("in 2 deliveries"), "{message}");
    }
    // The next group is played, and nothing more of the stuck one comes: no third delivery.
    plays_on(&driver, &table, 0).await;
    assert!(
        started.try_recv().is_err(),
        "the stuck group came a third time"
    );
    for worker in workers.into_values() {
        worker.abort();
    }
}

/// A driver's groups go to its pool's workers only: a worker of another pool (another tenant's,
/// on a server) never takes them, and they wait until a worker of their pool comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_goes_to_its_pools_workers_only() {
    let store = tempfile::tempdir().unwrap();
    let Some(nats) = NatsServer::start(store.path()) else {
        return;
    };
    let table = Arc::new(Table::new().await);
    let in_pool = |name: &str| QueueSettings {
        pool: Pool::new(name),
        ..QueueSettings::default()
    };
    let worker = |name: &str, plays: &Arc<AtomicUsize>| {
        let player = TablePlayer {
            table: Arc::clone(&table),
            plays: Arc::clone(plays),
            index: 0,
            started: None,
        };
        player.serve(nats.url(), in_pool(name))
    };
    let (bobs, alices) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let bob = worker("bob", &bobs);
    let queue = Queue::connect(&nats.url(), in_pool("alice"), &QueueLogin::default())
        .await
        .unwrap();
    let driver = QueueRollouts::new(queue, "alice's job").await.unwrap();
    let answer = tokio::spawn(driver.start(table.task()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!answer.is_finished(), "bob's worker played alice's group");
    assert_eq!(bobs.load(Ordering::SeqCst), 0);
    let alice = worker("alice", &alices);
    let played = tokio::time::timeout(Duration::from_secs(30), answer)
        .await
        .expect("alice's worker played her group")
        .unwrap()
        .unwrap();
    assert!(played.episodes.iter().all(|(_, o)| o.failure.is_none()));
    assert_eq!(
        (alices.load(Ordering::SeqCst), bobs.load(Ordering::SeqCst)),
        (1, 0)
    );
    bob.abort();
    alice.abort();
}
