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
use server::{BIN, start_server};

/// `train JOB --out OUT --server URL --api-key KEY` and `more` arguments, started.
fn train(server: &server::Server, job: &Path, out: &Path, more: &[&str]) -> Child {
    Command::new(BIN)
        .arg("train")
        .arg(job)
        .arg("--out")
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

/// A worker, its log lines sent to `lines` as they come (with its index).
fn worker(
    i: usize,
    nats: &NatsServer,
    server: &server::Server,
    lines: mpsc::Sender<(usize, String)>,
) -> Child {
    let mut child = Command::new(BIN)
        .arg("worker")
        .args(["--queue", &nats.url(), "--server", &server.url])
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

#[test]
fn a_job_played_by_three_workers_one_killed_mid_group_ends_as_it_does_in_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let Some(nats) = NatsServer::start(&dir.path().join("nats")) else {
        return;
    };
    let server = start_server();
    let job = ArithmeticJob {
        sft_steps: 30,
        full_parameters: false,
        rl_steps: 3,
        rl_extra: "",
        sections: "",
    }
    .write(dir.path(), "job");
    let (driver, queued) = (dir.path().join("driver"), dir.path().join("queued"));
    finish(train(&server, &job, &driver, &[]), "train --server");

    let (send, lines) = mpsc::channel();
    let mut workers: Vec<Child> = (0..3)
        .map(|i| worker(i, &nats, &server, send.clone()))
        .collect();
    drop(send);
    let run = train(&server, &job, &queued, &["--rollouts", &nats.url()]);
    // Kill worker 0 as soon as it has a group in hand: its group goes to another worker after
    // the ack wait.
    let mut log: Vec<(usize, String)> = Vec::new();
    for (i, line) in lines.iter() {
        let playing = line.contains("playing a task");
        log.push((i, line));
        if i == 0 && playing {
            workers[0].kill().unwrap();
            workers[0].wait().unwrap();
            break;
        }
    }
    finish(run, "train --server --rollouts");
    for worker in &mut workers[1..] {
        worker.kill().unwrap();
        worker.wait().unwrap();
    }
    log.extend(lines.iter());
    let text: Vec<String> = log
        .iter()
        .map(|(i, l)| format!("worker {i}: {l}"))
        .collect();
    let text = text.join("\n");
    assert!(
        log.iter()
            .any(|(i, l)| *i != 0 && l.contains("playing a task") && l.contains("delivered=2")),
        "the killed worker's group was delivered again to another:\n{text}"
    );

    let (played_here, played_there) = (metrics(&driver), metrics(&queued));
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
