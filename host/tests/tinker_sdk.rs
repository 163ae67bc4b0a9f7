//! The compatibility suite: the official `tinker` Python SDK (0.38.0, unmodified) drives
//! `opentinker serve` on loopback. Each test starts a server with two tenants and runs one script
//! of `tests/tinker_sdk/` with the SDK's environment (`TINKER_BASE_URL`, `TINKER_API_KEY`).
//!
//! The Python interpreter is `OPENTINKER_TEST_PYTHON`, a virtual environment that
//! `scripts/test.sh` makes outside the repository from `scripts/requirements-test.txt`. Without it
//! the tests say so and pass, except under CI (`CI` set), where they fail.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_opentinker");

fn python() -> Option<PathBuf> {
    match std::env::var_os("OPENTINKER_TEST_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None if std::env::var_os("CI").is_some() => {
            panic!("OPENTINKER_TEST_PYTHON is not set: run the tests with scripts/test.sh")
        }
        None => {
            eprintln!(
                "skipped: OPENTINKER_TEST_PYTHON is not set (scripts/test.sh makes the SDK's venv and sets it)"
            );
            None
        }
    }
}

/// A server on loopback with tenants `alice` and `bob`; stopped when dropped.
struct Server {
    child: Child,
    url: String,
    data: tempfile::TempDir,
    alice: String,
    bob: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn create_tenant(data: &Path, name: &str) -> String {
    let output = Command::new(BIN)
        .args(["tenant", "create", name, "--data"])
        .arg(data)
        .output()
        .expect("running opentinker tenant create");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let key = String::from_utf8(output.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("tml-"), "{key}");
    key
}

fn start_server() -> Server {
    let data = tempfile::tempdir().unwrap();
    let alice = create_tenant(data.path(), "alice");
    let bob = create_tenant(data.path(), "bob");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--poll-wait",
            "5",
            "--data",
        ])
        .arg(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting opentinker serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("the server did not say where it listens: {line:?}"))
        .to_string();
    Server {
        child,
        url,
        data,
        alice,
        bob,
    }
}

/// Run `tests/tinker_sdk/{script}` against a fresh server; its output is printed, and a failure
/// (an assertion in the script, an SDK error) fails the test.
fn run_script(script: &str) {
    let Some(python) = python() else { return };
    let server = start_server();
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tinker_sdk");
    let output = Command::new(python)
        .arg(scripts.join(script))
        .current_dir(&scripts)
        .env("TINKER_BASE_URL", &server.url)
        .env("TINKER_API_KEY", &server.alice)
        .env("OTHER_TINKER_API_KEY", &server.bob)
        .env("TENANT_NAME", "alice")
        .env("OPENTINKER_BIN", BIN)
        .env("OPENTINKER_DATA", server.data.path())
        .env(
            "OPENTINKER_TINY_MODEL",
            server.data.path().join("models/opentinker-tiny"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running the SDK script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(output.status.success(), "{script} failed:\n{text}");
}

#[test]
fn an_sft_loop_through_the_sdk_lowers_the_loss() {
    run_script("sft_loss_falls.py");
}

#[test]
fn an_rl_loop_through_the_sdk_raises_the_reward() {
    run_script("rl_reward_rises.py");
}

#[test]
fn forward_and_compute_logprobs_agree_with_the_cli() {
    run_script("logprobs_agree.py");
}

#[test]
fn sampling_through_the_sdk_honours_seeds_stops_and_prompt_logprobs() {
    run_script("sampling.py");
}

#[test]
fn saved_state_resumes_with_identical_next_step_losses() {
    run_script("checkpoints.py");
}

#[test]
fn tenants_cannot_see_each_others_objects() {
    run_script("tenants.py");
}
