//! `train --server URL --rollouts nats://...` with `opentinker worker` processes: the RL groups of
//! a job travel through a real NATS JetStream queue (the test venv's `nats-server` on loopback)
//! to workers that fetch the job's plugins from the server and sample there; the run must end as
//! the same job does with its groups played by the driver, also when a worker is killed in the
//! middle of a group.

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/server.rs"]
mod server;

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
    let Some(nats) = NatsServer::start(&dir.path().join("nats")) else {
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

    let server = start_server_with(&["--rollouts", &nats.url()]);
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
