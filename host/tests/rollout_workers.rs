//! `train --server URL --rollouts nats://...` with `opentinker worker` processes: the RL groups of
//! a job travel through a real NATS JetStream queue (the test venv's `nats-server` on loopback)
//! to workers that fetch the job's plugins from the server and sample there; the run must end as
//! the same job does with its groups played by the driver, also when a worker is killed in the
//! middle of a group. A server's queue runs with accounts as the deployment configures NATS, and
//! one tenant's worker can neither take nor answer another's groups.

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/server.rs"]
mod server;
#[path = "common/tinker_http.rs"]
mod tinker_http;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use arithmetic_job::{ArithmeticJob, metrics};
use opentinker_test_tools::NatsServer;
use server::{bin, start_server, start_server_with};

/// `train JOB --out OUT --server URL --api-key KEY` and `more` arguments, started (with
/// `--resume OUT` in place of `--out OUT` when `more` asks to resume).
fn train(server: &server::Server, job: &Path, out: &Path, more: &[&str]) -> Child {
    let (folder, more) = match more.split_first() {
        Some((&"--resume", rest)) => ("--resume", rest),
        _ => ("--out", more),
    };
    Command::new(bin())
        .arg("train")
        .arg(job)
        .arg(folder)
        .arg(out)
        .args(["--server", &server.url, "--api-key", &server.alice])
        .args(more)
        .env_remove("TINKER_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting opentinker train")
}

fn finish(child: Child, what: &str) {
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A worker of the default pool, its log lines sent to `lines` as they come (with its index).
fn worker(
    i: usize,
    nats: &NatsServer,
    server: &server::Server,
    lines: mpsc::Sender<(usize, String)>,
) -> Child {
    worker_of(i, "default", nats, server, lines)
}

/// A worker of `pool`, its log lines sent to `lines` as they come (with its index).
fn worker_of(
    i: usize,
    pool: &str,
    nats: &NatsServer,
    server: &server::Server,
    lines: mpsc::Sender<(usize, String)>,
) -> Child {
    let mut child = Command::new(bin())
        .arg("worker")
        .args([
            "--queue",
            &nats.url(),
            "--server",
            &server.url,
            "--pool",
            pool,
        ])
        .args(["--api-key", &server.alice, "--ack-wait-secs", "2"])
        .env_remove("TINKER_API_KEY")
        .env("OPENTINKER_LOG", "opentinker::rl::rollouts=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting opentinker worker");
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send((i, line)).is_err() {
                break;
            }
        }
    });
    child
}

/// A queue, a server, the test's job, its metrics when the driver plays its groups, and
/// workers with their log lines.
struct Cluster {
    dir: tempfile::TempDir,
    nats: NatsServer,
    server: server::Server,
    job: std::path::PathBuf,
    /// The job's run with its groups played by the driver.
    driver: std::path::PathBuf,
    workers: Vec<Child>,
    lines: mpsc::Receiver<(usize, String)>,
    /// Every worker log line read so far, with its worker.
    log: Vec<(usize, String)>,
}

impl Cluster {
    /// `workers` workers on a fresh queue and server, after the job has run with the driver
    /// playing its groups; `None` where nats-server is missing (skipped).
    fn start(workers: usize) -> Option<Cluster> {
        Cluster::start_with(workers, "", "")
    }

    /// [`Cluster::start`] with more keys of `[rl]` and more sections in the job file.
    fn start_with(
        workers: usize,
        rl_extra: &'static str,
        sections: &'static str,
    ) -> Option<Cluster> {
        let dir = tempfile::tempdir().unwrap();
        let nats = NatsServer::start(&dir.path().join("nats"))?;
        let server = start_server();
        let job = ArithmeticJob {
            sft_steps: 30,
            full_parameters: false,
            rl_steps: 3,
            rl_extra,
            sections,
        }
        .write(dir.path(), "job");
        let driver = dir.path().join("driver");
        finish(train(&server, &job, &driver, &[]), "train --server");
        let (send, lines) = mpsc::channel();
        let workers = (0..workers)
            .map(|i| worker(i, &nats, &server, send.clone()))
            .collect();
        Some(Cluster {
            dir,
            nats,
            server,
            job,
            driver,
            workers,
            lines,
            log: Vec::new(),
        })
    }

    /// `train` of the job with its groups published to the queue, into `name`.
    fn train_with_workers(&self, name: &str) -> (Child, std::path::PathBuf) {
        let out = self.dir.path().join(name);
        let run = train(
            &self.server,
            &self.job,
            &out,
            &["--rollouts", &self.nats.url()],
        );
        (run, out)
    }

    /// Read worker lines until one of worker `from` (any worker: `None`) says it plays a task
    /// of `version` (any: `None`).
    fn until_playing(&mut self, from: Option<usize>, version: Option<usize>) -> usize {
        for (i, line) in self.lines.iter() {
            let playing = line.contains("playing a task")
                && version.is_none_or(|v| line.contains(&format!("version={v} ")));
            self.log.push((i, line));
            if playing && from.is_none_or(|from| from == i) {
                return i;
            }
        }
        panic!(
            "the workers ended before one played a task:\n{}",
            self.text()
        );
    }

    /// Stop every worker and read what they said.
    fn stop_workers(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        self.log.extend(self.lines.try_iter());
    }

    fn text(&self) -> String {
        let lines: Vec<String> = self
            .log
            .iter()
            .map(|(i, l)| format!("worker {i}: {l}"))
            .collect();
        lines.join("\n")
    }

    /// The run in `out` ended as the driver's own ([`same_runs`]).
    fn assert_same_as_driver(&self, out: &Path) {
        same_runs(&self.driver, out);
    }
}

/// The runs in `here` and `there` did the same work: the same episodes, rewards, tokens,
/// errors, stale groups and evaluations at every step, and the same losses, with RL that had a
/// signal over its three steps.
fn same_runs(here: &Path, there: &Path) {
    let (played_here, played_there) = (metrics(here), metrics(there));
    assert_eq!(played_here.len(), played_there.len());
    let rl: Vec<_> = played_there.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 3);
    assert!(
        rl.iter().any(|l| l["tokens"].as_f64() > Some(0.0)),
        "{rl:?}"
    );
    for (here, there) in played_here.iter().zip(&played_there) {
        for key in [
            "phase",
            "reward_mean",
            "reward_std",
            "tokens",
            "errors",
            "eval",
            "policy_lag",
            "stale_groups",
        ] {
            assert_eq!(here[key], there[key], "{key}:\n{here}\n{there}");
        }
        let (a, b) = (
            here["loss"].as_f64().unwrap(),
            there["loss"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{here}\n{there}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// A worker killed with a group in hand loses it to another after the ack wait; the group is
/// counted once, and the run ends as the driver's own.
#[test]
fn a_job_played_by_three_workers_one_killed_mid_group_ends_as_it_does_in_the_driver() {
    let Some(mut cluster) = Cluster::start(3) else {
        return;
    };
    let (run, out) = cluster.train_with_workers("queued");
    cluster.until_playing(Some(0), None);
    cluster.workers[0].kill().unwrap();
    cluster.workers[0].wait().unwrap();
    finish(run, "train --server --rollouts");
    cluster.stop_workers();
    assert!(
        cluster
            .log
            .iter()
            .any(|(i, l)| *i != 0 && l.contains("playing a task") && l.contains("delivered=2")),
        "the killed worker's group was delivered again to another:\n{}",
        cluster.text()
    );
    cluster.assert_same_as_driver(&out);
}

/// The queue server killed and started again in the middle of a run (its streams on file
/// storage): nothing published is lost, the driver and the workers carry on, and the run ends
/// as the driver's own.
#[test]
fn a_job_whose_queue_server_restarts_mid_run_ends_as_it_does_in_the_driver() {
    let Some(mut cluster) = Cluster::start(2) else {
        return;
    };
    let (mut run, out) = cluster.train_with_workers("queued");
    cluster.until_playing(None, None);
    assert!(
        run.try_wait().unwrap().is_none(),
        "the run ended before the restart"
    );
    cluster.nats.restart();
    finish(run, "train --server --rollouts");
    cluster.stop_workers();
    cluster.assert_same_as_driver(&out);
}

/// The driver killed in the middle of an RL step and started again with `--resume`: it goes on
/// from its last checkpoint under a new name on the queue (what its predecessor published is
/// never counted), plays the step again, and the run ends as the driver's own.
#[test]
fn a_job_whose_driver_is_killed_mid_step_and_resumed_ends_as_it_does_in_the_driver() {
    let Some(mut cluster) = Cluster::start_with(2, "", "[checkpoint]\nevery = 1") else {
        return;
    };
    let (mut run, out) = cluster.train_with_workers("queued");
    // Step 1's groups (launched after one step trained): step 0 is checkpointed.
    cluster.until_playing(None, Some(1));
    run.kill().unwrap();
    run.wait().unwrap();
    let resumed = train(
        &cluster.server,
        &cluster.job,
        &out,
        &["--resume", "--rollouts", &cluster.nats.url()],
    );
    finish(resumed, "train --resume --server --rollouts");
    cluster.stop_workers();
    cluster.assert_same_as_driver(&out);
}

/// Async mode through the workers: groups played ahead of training come back stale as they do in
/// the driver (with no lag allowed, every group launched while a step trains), are counted and
/// played again with the current policy, and the run ends as the driver's own.
#[test]
fn an_async_job_through_workers_resamples_its_stale_groups_as_the_driver_does() {
    let Some(mut cluster) = Cluster::start_with(2, "mode = \"async\"\nmax_policy_lag = 0", "")
    else {
        return;
    };
    let (run, out) = cluster.train_with_workers("queued");
    finish(run, "train --server --rollouts (async)");
    cluster.stop_workers();
    let stale: f64 = metrics(&out)
        .iter()
        .filter_map(|l| l["stale_groups"].as_f64())
        .sum();
    assert!(stale > 0.0, "no group came back stale");
    cluster.assert_same_as_driver(&out);
}

/// `opentinker submit JOB` to `server` as alice, then its run folder downloaded into `out`.
fn submit(server: &server::Server, job: &Path, out: &Path) {
    let run = |args: &[&std::ffi::OsStr]| {
        let output = Command::new(bin())
            .args(args)
            .env("TINKER_BASE_URL", &server.url)
            .env("TINKER_API_KEY", &server.alice)
            .output()
            .expect("running opentinker");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{args:?}:\n{stderr}");
        stderr
    };
    let said = run(&["submit".as_ref(), job.as_os_str()]);
    assert!(said.contains("succeeded"), "{said}");
    let id = said
        .split_whitespace()
        .find(|w| w.starts_with("job-"))
        .unwrap_or_else(|| panic!("no job id in: {said}"));
    run(&[
        "jobs".as_ref(),
        "download".as_ref(),
        id.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
}

/// `serve --rollouts`: a job submitted to the server has its RL groups played by workers of its
/// tenant, which sample the job's versions on the server, and it ends as the same job does on
/// a server whose jobs play their own groups.
#[test]
fn a_job_submitted_to_a_server_with_rollout_workers_ends_as_on_one_without() {
    let dir = tempfile::tempdir().unwrap();
    let Some((nats, key)) = nats_with_accounts(dir.path()) else {
        return;
    };
    let job = ArithmeticJob {
        sft_steps: 30,
        full_parameters: false,
        rl_steps: 3,
        rl_extra: "",
        sections: "",
    }
    .write(dir.path(), "job");
    let (alone, queued) = (dir.path().join("alone"), dir.path().join("queued"));
    submit(&start_server(), &job, &alone);

    let server = start_server_with(&["--rollouts", &nats.url(), "--rollout-key", &key]);
    let (send, lines) = mpsc::channel();
    // A server's jobs go to their tenant's pool.
    let mut workers: Vec<Child> = (0..2)
        .map(|i| worker_of(i, "alice", &nats, &server, send.clone()))
        .collect();
    drop(send);
    submit(&server, &job, &queued);
    for worker in &mut workers {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    let log: Vec<String> = lines
        .iter()
        .map(|(i, l)| format!("worker {i}: {l}"))
        .collect();
    let played = log.iter().filter(|l| l.contains("playing a task")).count();
    assert_eq!(
        played,
        3 * 2,
        "3 steps of 2 groups each:\n{}",
        log.join("\n")
    );

    same_runs(&alone, &queued);
}

/// A NATS server configured as `deploy/kubernetes/nats.yaml` configures it, its accounts made
/// by `opentinker rollout-keys` (in `dir/accounts`, as the deployment mounts them); with the
/// account key's path. `None` where nats-server is missing (skipped).
fn nats_with_accounts(dir: &Path) -> Option<(NatsServer, String)> {
    let output = Command::new(bin())
        .args(["rollout-keys".as_ref(), dir.join("accounts").as_os_str()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let manifest = server::host_dir().join("../deploy/kubernetes/nats.yaml");
    let manifest = std::fs::read_to_string(manifest).unwrap();
    // The ConfigMap's `nats.conf: |` block, its indentation taken off.
    let config: String = manifest
        .lines()
        .skip_while(|l| l.trim() != "nats.conf: |")
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    assert!(config.contains("include ./accounts/"), "{config}");
    let store = dir.join("nats");
    let config = config.replace("/data/jetstream", &store.to_string_lossy());
    std::fs::write(dir.join("nats.conf"), config).unwrap();
    let nats = NatsServer::start_configured(&store, &dir.join("nats.conf"))?;
    let key = dir.join("accounts").join("account.nk");
    Some((nats, key.to_string_lossy().into_owned()))
}

/// What the server gives a worker that asks with `key`.
fn access(server: &server::Server, key: &str) -> opentinker::queue_auth::WorkerAccess {
    let (status, body) = tinker_http::call(
        server,
        "rollout_access",
        Some(key),
        "application/json",
        b"{}",
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body).unwrap()
}

/// On the deployment's NATS configuration, bob's worker (signed by the server for bob's key) can
/// neither see, take nor answer alice's groups, nor make itself a consumer of them, nor hear
/// alice's workers' replies; nobody without a signed user connects at all. Alice's worker, the
/// control, takes her task and answers it.
#[test]
fn a_worker_with_one_tenants_key_can_neither_take_nor_answer_another_tenants_groups() {
    use async_nats::jetstream::{self, consumer::pull};
    use futures::StreamExt;
    use opentinker::queue_auth::{QueueAuthority, QueueLogin};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let Some((nats, key)) = nats_with_accounts(dir.path()) else {
        return;
    };
    let server = start_server_with(&["--rollouts", &nats.url(), "--rollout-key", &key]);
    let (alice, bob) = (access(&server, &server.alice), access(&server, &server.bob));
    assert_eq!((alice.pool.as_str(), bob.pool.as_str()), ("alice", "bob"));
    // A worker that names another pool than its key's is refused before it starts.
    let wrong = Command::new(bin())
        .args([
            "worker",
            "--queue",
            &nats.url(),
            "--server",
            &server.url,
            "--pool",
            "alice",
        ])
        .args(["--api-key", &server.bob])
        .env_remove("TINKER_API_KEY")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && said.contains("--pool alice"),
        "{said}"
    );

    let alice_consumer = opentinker::rl::Pool::new("alice").consumer();
    let tasks = opentinker::rl::TASKS_STREAM;
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let url = nats.url();
        let connect =
            |login: QueueLogin, violations: Option<tokio::sync::mpsc::UnboundedSender<String>>| {
                let url = url.clone();
                async move {
                    let mut options = login.options().unwrap();
                    if let Some(violations) = violations {
                        options = options.event_callback(move |event| {
                            let violations = violations.clone();
                            async move {
                                if let async_nats::Event::ServerError(error) = event {
                                    let _ = violations.send(error.to_string());
                                }
                            }
                        });
                    }
                    options.connect(&url).await
                }
            };
        // The server's side, as its jobs log in: alice's task in her pool.
        let authority = QueueAuthority::load(Path::new(&key)).unwrap();
        let driver_login = QueueLogin {
            credentials: Some(authority.unrestricted("test-driver").unwrap()),
            inbox_prefix: None,
        };
        let driver = jetstream::new(connect(driver_login, None).await.unwrap());
        let task_subject = "opentinker.tasks.alice.job-1";
        driver
            .publish(task_subject, "task 1".into())
            .await
            .unwrap()
            .await
            .unwrap();

        // Nobody connects without a user the server signed.
        assert!(connect(QueueLogin::default(), None).await.is_err());

        let (sender, mut violations) = tokio::sync::mpsc::unbounded_channel();
        let bob_client = connect(bob.login.clone(), Some(sender)).await.unwrap();
        let mut bob_js = jetstream::new(bob_client.clone());
        bob_js.set_timeout(Duration::from_millis(500));
        // Bob listens where alice's tasks are published and where alice's replies come.
        let mut listening = bob_client.subscribe("opentinker.tasks.>").await.unwrap();
        let mut eavesdrop = bob_client.subscribe("_INBOX.pool.alice.>").await.unwrap();
        // Bob looks alice's consumer up, pulls from it, and makes a consumer of his own of her pool.
        let stream = bob_js.get_stream(tasks).await.unwrap();
        assert!(
            stream
                .get_consumer::<pull::Config>(&alice_consumer)
                .await
                .is_err()
        );
        let next = format!("$JS.API.CONSUMER.MSG.NEXT.{tasks}.{alice_consumer}");
        let pulled = tokio::time::timeout(
            Duration::from_secs(1),
            bob_client.request(next, r#"{"batch":1,"no_wait":true}"#.into()),
        )
        .await;
        assert!(
            !matches!(pulled, Ok(Ok(_))),
            "bob pulled from alice's consumer"
        );
        let own = pull::Config {
            durable_name: Some("bobs-copy".into()),
            filter_subject: "opentinker.tasks.alice.>".into(),
            ..Default::default()
        };
        assert!(stream.create_consumer(own).await.is_err());
        // Bob answers alice's group.
        let forged = bob_js
            .publish("opentinker.played.alice.job-1", "forged".into())
            .await;
        assert!(forged.is_err() || forged.unwrap().await.is_err());

        // Alice's worker, the control: it takes her task (another one published while bob
        // listens), and answers it.
        driver
            .publish(task_subject, "task 2".into())
            .await
            .unwrap()
            .await
            .unwrap();
        let alice_js = jetstream::new(connect(alice.login.clone(), None).await.unwrap());
        let consumer = alice_js
            .get_stream(tasks)
            .await
            .unwrap()
            .get_consumer::<pull::Config>(&alice_consumer)
            .await
            .unwrap();
        let mut batch = consumer.fetch().max_messages(2).messages().await.unwrap();
        let mut taken = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.unwrap();
            taken.push(String::from_utf8_lossy(&message.payload).into_owned());
            message.double_ack().await.unwrap();
        }
        assert_eq!(taken, ["task 1", "task 2"], "bob took one of alice's tasks");
        alice_js
            .publish("opentinker.played.alice.job-1", "answer".into())
            .await
            .unwrap()
            .await
            .unwrap();

        // Bob heard nothing, and stored nothing: the one answer is alice's.
        for subscription in [&mut listening, &mut eavesdrop] {
            let heard = tokio::time::timeout(Duration::from_millis(500), subscription.next()).await;
            assert!(!matches!(heard, Ok(Some(_))), "bob heard {heard:?}");
        }
        let mut played = driver.get_stream("OPENTINKER_PLAYED").await.unwrap();
        assert_eq!(played.info().await.unwrap().state.messages, 1);
        let answer = played
            .get_last_raw_message_by_subject("opentinker.played.alice.job-1")
            .await
            .unwrap();
        assert_eq!(&answer.payload[..], b"answer");
        // And NATS said why each of bob's tries failed.
        drop(bob_client);
        let mut said = Vec::new();
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_millis(200), violations.recv()).await
        {
            said.push(line);
        }
        let denied = |what: &str| {
            said.iter()
                .any(|l| l.to_lowercase().contains("permissions violation") && l.contains(what))
        };
        for what in [
            "opentinker.tasks.>",
            "_INBOX.pool.alice.>",
            &format!("CONSUMER.INFO.{tasks}.{alice_consumer}"),
            &format!("CONSUMER.MSG.NEXT.{tasks}.{alice_consumer}"),
            "CONSUMER.CREATE",
            "opentinker.played.alice.job-1",
        ] {
            assert!(denied(what), "no violation named {what}: {said:#?}");
        }
    });
}
