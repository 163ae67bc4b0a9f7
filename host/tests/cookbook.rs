//! The tinker-cookbook 0.6.1's own loops, unmodified, against `opentinker serve` on loopback: its
//! RL loop in sync mode (and resumed from its checkpoints), in async mode with its default loss
//! (`stable_reinforce`) and with PPO and a KL penalty, with streaming minibatches, its
//! supervised loop, its on-policy distillation (a student sampling, a teacher of other weights
//! served beside it scoring), its DPO, and its `weights.download` and `build_hf_model` (an adapter
//! taken home through signed URLs, decrypted, merged), each on an environment or data set written with the
//! cookbook's own classes (`tests/cookbook/`), on tiny models served under their directories'
//! paths (where the cookbook's `get_tokenizer` reads the tokenizer: nothing comes from the hub).
//! The server's access log must show no refused or failed request.
//!
//! The Python interpreter is `OPENTINKER_COOKBOOK_PYTHON`, a virtual environment that
//! `scripts/test.sh` makes outside the repository from `scripts/requirements-cookbook.txt`.

#[path = "common/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;

use opentinker_test_tools::cookbook_python;
use server::{Server, bin, create_tenant, spawn_server_logging};

/// A server with the tiny model served under its directory's path, logging every request.
struct Cookbook {
    server: Server,
    model: PathBuf,
    /// A tiny model of other weights (another seed), the distillation's teacher.
    teacher: PathBuf,
    log: PathBuf,
    python: PathBuf,
}

fn start() -> Option<Cookbook> {
    let python = cookbook_python()?;
    let data = tempfile::tempdir().unwrap();
    let (model, teacher) = (data.path().join("tiny"), data.path().join("teacher"));
    for (dir, seed) in [(&model, "0"), (&teacher, "7")] {
        let made = Command::new(bin())
            .args(["model", "init-tiny", "--seed", seed])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let alice = create_tenant(data.path(), "alice");
    let bob = create_tenant(data.path(), "bob");
    let log = data.path().join("serve.log");
    let served = format!("{0}={0}", model.display());
    let served_teacher = format!("{0}={0}", teacher.display());
    let (child, url, _) = spawn_server_logging(
        data.path(),
        "127.0.0.1:0",
        "opentinker::access=info",
        std::fs::File::create(&log).unwrap(),
        &["--model", &served, "--model", &served_teacher],
    );
    Some(Cookbook {
        server: Server {
            child,
            url,
            data,
            alice,
            bob,
        },
        model,
        teacher,
        log,
        python,
    })
}

impl Cookbook {
    /// Run `tests/cookbook/{script}` with `args`; its output, after asserting that it succeeded.
    fn run(&self, script: &str, args: &[&Path]) -> String {
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cookbook");
        let output = Command::new(&self.python)
            .arg(scripts.join(script))
            .args(args)
            .current_dir(self.server.data.path())
            .env("TINKER_BASE_URL", &self.server.url)
            .env("TINKER_API_KEY", &self.server.alice)
            .env("OPENTINKER_MODEL_DIR", &self.model)
            .env("OPENTINKER_TEACHER_DIR", &self.teacher)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // Nothing from the model hub: the tokenizer is read from the served directory.
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .expect("running the cookbook script");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "{script} failed ({}):\n{text}",
            output.status
        );
        text
    }

    /// The RL loop of `rl_letters.py` in `mode`, logging to the folder `rl-{mode}` (run again,
    /// it resumes from there): that folder and the output, after asserting that it completed.
    fn rl(&self, mode: &str) -> (PathBuf, String) {
        let log_dir = self.server.data.path().join(format!("rl-{mode}"));
        let output = self.run("rl_letters.py", &[Path::new(mode), &log_dir]);
        assert!(
            output.contains("Training completed successfully"),
            "{output}"
        );
        (log_dir, output)
    }

    /// Assert that the server answered every request of the loop with a success.
    fn every_request_served(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("opentinker::access"))
            .collect();
        assert!(lines.len() > 10, "the access log has {} lines", lines.len());
        let refused: Vec<&&str> = lines
            .iter()
            .filter(|l| !(l.contains("status=200") || l.contains("status=204")))
            .collect();
        assert!(
            refused.is_empty(),
            "requests the server refused: {refused:#?}"
        );
    }
}

#[test]
fn the_cookbooks_async_rl_loop_trains_with_its_default_loss() {
    let Some(cookbook) = start() else { return };
    cookbook.rl("async");
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_async_rl_loop_trains_with_ppo_and_a_kl_penalty_against_the_base() {
    let Some(cookbook) = start() else { return };
    let (log_dir, _) = cookbook.rl("async-ppo-kl");
    let metrics = std::fs::read_to_string(log_dir.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.contains("\"kl_policy_base\""),
        "no KL penalty was computed: {metrics}"
    );
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_streaming_rl_loop_trains_in_minibatches() {
    let Some(cookbook) = start() else { return };
    cookbook.rl("stream");
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_sync_rl_loop_trains_and_resumes_from_its_checkpoint() {
    let Some(cookbook) = start() else { return };
    cookbook.rl("sync");
    let (_, resumed) = cookbook.rl("sync");
    assert!(resumed.contains("Renderer metadata matches"), "{resumed}");
    assert!(
        resumed.contains("Resumed training from tinker://"),
        "{resumed}"
    );
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_supervised_loop_lowers_the_loss() {
    let Some(cookbook) = start() else { return };
    let log_dir = cookbook.server.data.path().join("sl");
    let output = cookbook.run("sl_letters.py", &[&log_dir]);
    assert!(output.contains("cookbook sl: losses"), "{output}");
    cookbook.every_request_served();
}

/// The values of `key` in a cookbook log's `metrics.jsonl`, step by step.
fn metric(log_dir: &Path, key: &str) -> Vec<f64> {
    let metrics = std::fs::read_to_string(log_dir.join("metrics.jsonl")).unwrap();
    metrics
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|step| step[key].as_f64())
        .collect()
}

#[test]
fn the_cookbooks_on_policy_distillation_trains_a_student_on_a_teacher_served_beside_it() {
    let Some(cookbook) = start() else { return };
    let log_dir = cookbook.server.data.path().join("distill");
    let output = cookbook.run("distill_letters.py", &[&log_dir]);
    assert!(
        output.contains("Training completed successfully"),
        "{output}"
    );
    // A sample estimate of the reverse KL (it may come out below zero); a teacher of other
    // weights than the student's makes it differ from zero.
    let kl = metric(&log_dir, "teacher_kl");
    assert!(
        kl.len() == 2 && kl.iter().all(|kl| kl.is_finite()) && kl.iter().any(|kl| kl.abs() > 1e-4),
        "the teacher's KL to the student: {kl:?}"
    );
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_dpo_prefers_the_chosen_replies_of_comparisons_of_our_own() {
    let Some(cookbook) = start() else { return };
    let log_dir = cookbook.server.data.path().join("dpo");
    let output = cookbook.run("dpo_letters.py", &[&log_dir]);
    assert!(
        output.contains("DPO training completed successfully"),
        "{output}"
    );
    let losses = metric(&log_dir, "dpo_loss");
    assert!(
        losses.len() == 2 && losses[1] < losses[0],
        "the DPO loss did not fall: {losses:?}"
    );
    cookbook.every_request_served();
}

#[test]
fn the_cookbooks_weights_download_and_build_hf_model_take_a_trained_adapter_home() {
    let Some(cookbook) = start() else { return };
    let work = cookbook.server.data.path().join("weights-out");
    let output = cookbook.run("weights_out.py", &[&work]);
    assert!(output.contains("weights out: downloaded"), "{output}");
    cookbook.every_request_served();
}
