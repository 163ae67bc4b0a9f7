//! Rollouts beyond one process: episodes per second of a CPU-heavy environment played by 1, 2 and
//! 4 `opentinker worker` processes through a real NATS JetStream queue, against the same groups
//! played in one process (the driver's own way), and what the queue itself costs per group
//! (publish, deliver, answer, acknowledge) with a player that does nothing.
//!
//! Every group samples the built-in tiny model on one `opentinker serve` (its turns are a few
//! tokens) and steps the `cpu-heavy` environment, whose steps burn CPU in the sandbox. Needs
//! `nats-server` (`OPENTINKER_NATS_SERVER`; `scripts/bench.sh` sets the test venv's). Run:
//! `scripts/bench.sh rollouts`.

#[path = "../tests/common/server.rs"]
mod server;
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use opentinker::api::SamplingParams;
use opentinker::client::{ModelText, RemoteService, ServiceClient, TinyModelSpec};
use opentinker::plugin::build_plugin;
use opentinker::plugin::{HostConfig, Limits, PluginHost};
use opentinker::queue_auth::QueueLogin;
use opentinker::rl::{
    EpisodeFailure, FailureKind, GroupTask, PlayedGroup, PluginUse, PolicyRef, Queue,
    QueueRollouts, QueueSettings, Renderer, Rollouts, Seat, TASK_FORMAT, WorkerPlayer, serve_tasks,
};
use opentinker::service::TINY_MODEL_NAME;
use opentinker_test_tools::NatsServer;

/// What one measurement plays.
struct Load {
    groups: u64,
    group_size: usize,
    /// The environment's rounds of hashing per step (times 1 to 4 by seed).
    rounds: u64,
}

fn main() -> anyhow::Result<()> {
    let load = match support::quick() {
        true => Load {
            groups: 2,
            group_size: 2,
            rounds: 1_000,
        },
        false => Load {
            groups: 32,
            group_size: 4,
            rounds: 3_000_000,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(&load))
}

async fn run(load: &Load) -> anyhow::Result<()> {
    let store = tempfile::tempdir()?;
    let nats = NatsServer::start(store.path())
        .ok_or_else(|| anyhow::anyhow!("nats-server is missing (OPENTINKER_NATS_SERVER)"))?;
    let server = server::start_server();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let wasm = build_plugin(&root.join("plugins/adversarial/cpu-heavy"))?;
    let service = RemoteService::connect(&server.url, &server.alice, TINY_MODEL_NAME).await?;
    let digest = service.share_plugin(&wasm).await?;
    let base = service.base_sampling_client().address().await?;
    let model = tempfile::tempdir()?;
    let model_dir = model.path().join("model");
    TinyModelSpec::built_in().generate(&model_dir)?;
    let text = ModelText::load(&model_dir)?;
    let template = text
        .chat_template
        .ok_or_else(|| anyhow::anyhow!("the tiny model has no chat template"))?;
    let task = GroupTask {
        format: TASK_FORMAT,
        job: "bench".into(),
        group: 0,
        version: 0,
        seed: 0,
        group_size: load.group_size,
        seats: vec![Seat {
            policy: PolicyRef::Base,
            sampler: base,
        }],
        environment: PluginUse {
            digest: digest.trim_start_matches("sha256:").to_string(),
            config: format!(r#"{{"rounds": {}}}"#, load.rounds),
        },
        agent: None,
        reward: None,
        limits: Limits {
            fuel: 100_000_000_000,
            episode_fuel: 100_000_000_000,
            ..Limits::default()
        },
        sampling: SamplingParams {
            max_tokens: Some(4),
            ..SamplingParams::default()
        },
        max_turns: 2,
        context: service.context_length(),
        failure_reward: 0.0,
    };
    let tasks = |first: u64| -> Vec<GroupTask> {
        (first..first + load.groups)
            .map(|group| GroupTask {
                group,
                seed: group,
                ..task.clone()
            })
            .collect()
    };
    let episodes = load.groups as f64 * load.group_size as f64;

    // In process: the driver's own way, every group at once on this process's two threads.
    let host = PluginHost::new(HostConfig::default())?;
    let player = WorkerPlayer::new(
        Arc::new(service.clone()),
        host,
        Renderer::new(template, text.tokenizer)?,
    );
    // A first group loads the plugin (fetched, compiled) before anything is timed.
    player.start(tasks(1_000_000)[0].clone()).await?;
    let started = Instant::now();
    // Each group a task of its own, as the driver plays them: on every thread of the runtime.
    let playing = tasks(0).into_iter().map(|t| tokio::spawn(player.start(t)));
    let played = futures::future::try_join_all(playing)
        .await?
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let in_process = started.elapsed();
    check(&played)?;

    let mut rows = vec![("in process (the driver)".to_string(), in_process)];
    for (n, workers) in [1usize, 2, 4].into_iter().enumerate() {
        let mut children: Vec<Child> = (0..workers)
            .map(|_| worker(&nats, &server))
            .collect::<anyhow::Result<_>>()?;
        let queue = Queue::connect(
            &nats.url(),
            QueueSettings::default(),
            &QueueLogin::default(),
        )
        .await?;
        let driver = QueueRollouts::new(queue, &format!("bench-{workers}")).await?;
        // Each worker's first group fetches and compiles the plugin: not timed.
        let first = 2_000_000 * (n as u64 + 1);
        let warm = tasks(first)
            .into_iter()
            .take(workers)
            .map(|t| driver.start(t));
        futures::future::try_join_all(warm).await?;
        let started = Instant::now();
        let played =
            futures::future::try_join_all(tasks(0).into_iter().map(|t| driver.start(t))).await?;
        rows.push((format!("{workers} worker process(es)"), started.elapsed()));
        check(&played)?;
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    println!(
        "{} groups x {} episodes of cpu-heavy ({} rounds per step, 2 steps), tiny model turns",
        load.groups, load.group_size, load.rounds
    );
    println!("| who plays | episodes/s | vs in process |");
    println!("|---|---|---|");
    for (who, took) in &rows {
        let rate = episodes / took.as_secs_f64();
        let ratio = support::ratio(in_process.as_secs_f64(), took.as_secs_f64());
        println!("| {who} | {rate:.1} | {ratio} |");
    }
    queue_overhead(&nats, &task, if support::quick() { 20 } else { 2_000 }).await
}

/// Every episode played whole.
fn check(played: &[PlayedGroup]) -> anyhow::Result<()> {
    for group in played {
        for (_, outcome) in &group.episodes {
            if let Some(failure) = &outcome.failure {
                anyhow::bail!("group {}: {failure:?}", group.id);
            }
        }
    }
    Ok(())
}

fn worker(nats: &NatsServer, server: &server::Server) -> anyhow::Result<Child> {
    Ok(Command::new(server::bin())
        .arg("worker")
        .args(["--queue", &nats.url(), "--server", &server.url])
        .args(["--api-key", &server.alice])
        .env_remove("TINKER_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Answers every task at once with its group failed before it started: the queue's own cost.
struct Nothing;

impl Rollouts for Nothing {
    fn start(&self, task: GroupTask) -> BoxFuture<'static, anyhow::Result<PlayedGroup>> {
        Box::pin(async move {
            Ok(PlayedGroup::failed(
                &task,
                EpisodeFailure::of(FailureKind::RolloutWorker),
            ))
        })
    }
}

/// Microseconds per group through the queue with a player that plays nothing: one at a time
/// (publish, deliver, answer, acknowledge, gather: the latency) and `count` at once, on two
/// worker slots (the throughput).
async fn queue_overhead(nats: &NatsServer, task: &GroupTask, count: u64) -> anyhow::Result<()> {
    let settings = QueueSettings::default();
    let worker = Queue::connect(&nats.url(), settings.clone(), &QueueLogin::default()).await?;
    let serving = tokio::spawn(serve_tasks(worker, Arc::new(Nothing), 2));
    let driver = QueueRollouts::new(
        Queue::connect(&nats.url(), settings, &QueueLogin::default()).await?,
        "overhead",
    )
    .await?;
    let tasks = |first: u64| {
        (first..first + count).map(|group| GroupTask {
            group,
            ..task.clone()
        })
    };
    let warm: Vec<_> = tasks(10_000_000).take(10).collect();
    for t in warm {
        driver.start(t).await?;
    }
    let started = Instant::now();
    for t in tasks(0) {
        driver.start(t).await?;
    }
    let one_at_a_time = started.elapsed();
    let started = Instant::now();
    futures::future::try_join_all(tasks(count).map(|t| driver.start(t))).await?;
    let at_once = started.elapsed();
    serving.abort();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / count as f64;
    let size = task.group_size as f64;
    println!();
    println!(
        "| the queue's cost ({count} groups of {size} episodes, a player that plays nothing) \
         | us per group | us per episode |"
    );
    println!("|---|---|---|");
    for (how, took) in [
        (
            "one at a time: publish, deliver, answer, ack, gather",
            one_at_a_time,
        ),
        ("all at once, two worker slots (throughput)", at_once),
    ] {
        println!("| {how} | {:.0} | {:.0} |", per(took), per(took) / size);
    }
    Ok(())
}
