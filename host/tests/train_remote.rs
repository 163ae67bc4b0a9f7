//! `opentinker train JOB --server URL`: the same RL job run against `opentinker serve` on loopback
//! through the Tinker wire, and in process; the server's run must match the in-process one where
//! their work is the same, keep its checkpoints on the server, and refuse what a server cannot do.

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/server.rs"]
mod server;

use std::path::Path;
use std::process::Command;

use arithmetic_job::{ArithmeticJob, metrics};
use server::{bin, start_server};

/// The arithmetic job with a KL penalty, so that its reference adapter is saved and loaded back
/// through the client. `full_parameters`: whether its warm-up trains every weight (in process
/// only) or LoRA.
fn job(dir: &Path, full_parameters: bool) -> std::path::PathBuf {
    ArithmeticJob {
        sft_steps: 30,
        full_parameters,
        rl_steps: 2,
        rl_extra: "kl_coef = 0.01",
        sections: "",
    }
    .write(dir, "job")
}

/// Run `train` with `args`; its output when it fails.
fn train(args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let output = Command::new(bin())
        .arg("train")
        .args(args)
        .env_remove("TINKER_API_KEY")
        .output()
        .expect("running opentinker train");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    match output.status.success() {
        true => Ok(text),
        false => Err(text),
    }
}

/// The runs in `local` and `remote` (each of `lines` metric lines) did the same work: RL with a
/// signal (episodes that differ, so datums to train on); and, from the same seeds, the same
/// batch-invariant sampler and passes that hold each call whole on both sides, the same
/// episodes and, up to float rounding, the same losses at every step, and the same evaluation.
fn the_same_run(local: &Path, remote: &Path, lines: usize) {
    let (local_lines, remote_lines) = (metrics(local), metrics(remote));
    assert_eq!(remote_lines.len(), lines, "{remote_lines:?}");
    assert_eq!(local_lines.len(), remote_lines.len());
    let rl: Vec<_> = remote_lines.iter().filter(|l| l["phase"] == "rl").collect();
    assert!(
        rl.iter().any(|l| l["tokens"].as_f64() > Some(0.0)),
        "{rl:?}"
    );
    for (l, r) in local_lines.iter().zip(&remote_lines) {
        assert_eq!(l["phase"], r["phase"]);
        assert_eq!(l["reward_mean"], r["reward_mean"], "{l}\n{r}");
        assert_eq!(l["tokens"], r["tokens"], "{l}\n{r}");
        let (l_loss, r_loss) = (l["loss"].as_f64().unwrap(), r["loss"].as_f64().unwrap());
        assert!(
            (l_loss - r_loss).abs() <= 1e-4 * l_loss.abs().max(1.0),
            "loss in process {l_loss}, on the server {r_loss}\n{l}\n{r}"
        );
    }
    assert_eq!(
        local_lines[lines - 1]["eval"],
        remote_lines[lines - 1]["eval"]
    );
}

/// `train JOB --out OUT --server URL --api-key KEY` against `server`.
fn train_on(server: &server::Server, job: &Path, out: &Path) -> String {
    train(&[
        job.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--server".as_ref(),
        server.url.as_ref(),
        "--api-key".as_ref(),
        server.alice.as_ref(),
    ])
    .unwrap_or_else(|text| panic!("train --server failed:\n{text}"))
}

#[test]
fn a_job_trained_on_a_server_matches_the_same_job_in_process_and_keeps_its_checkpoints_there() {
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let job = job(dir.path(), false);
    let (local, remote) = (dir.path().join("local"), dir.path().join("remote"));
    train(&[job.as_os_str(), "--out".as_ref(), local.as_os_str()]).unwrap();
    println!("{}", train_on(&server, &job, &remote));

    // A LoRA warm-up, then RL with a signal (episodes that differ, so datums to train on).
    the_same_run(&local, &remote, 32);

    // Checkpoints name the server's copy; the adapter's files stay there.
    let checkpoint = remote.join("checkpoints/final/remote-checkpoint.json");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert!(
        record["path"].as_str().unwrap().starts_with("tinker://"),
        "{record}"
    );
    assert_eq!(record["base_model"], "opentinker/tiny");
    assert!(
        !remote
            .join("checkpoints/final/adapter_model.safetensors")
            .exists()
    );
    // The KL reference was saved on the server and loaded back from its path.
    assert!(
        remote
            .join("reference")
            .read_dir()
            .unwrap()
            .next()
            .is_some()
    );
}

/// A job whose RL loss is an objective plugin (`plugins/ppo-loss`, a source folder the CLI
/// builds): `train --server` uploads its component, the server runs it in its passes, and the
/// run matches the same job in process.
#[test]
fn a_plugin_loss_is_uploaded_and_run_by_the_server_as_in_process() {
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let ppo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/ppo-loss");
    let rl_extra = format!(
        "loss = {{ plugin = {:?} }}\nloss_config = {{ clip_high_threshold = 1.1 }}",
        ppo.canonicalize().unwrap()
    );
    let job = ArithmeticJob {
        sft_steps: 30,
        full_parameters: false,
        rl_steps: 2,
        rl_extra: Box::leak(rl_extra.into_boxed_str()),
        sections: "",
    }
    .write(dir.path(), "job");
    let (local, remote) = (dir.path().join("local"), dir.path().join("remote"));
    train(&[job.as_os_str(), "--out".as_ref(), local.as_os_str()]).unwrap();
    train_on(&server, &job, &remote);
    the_same_run(&local, &remote, 32);
    let (status, _, listed) = server::request(
        &server.url,
        "GET",
        "/api/v1/plugins",
        Some(&server.alice),
        "application/json",
        b"",
    );
    let listed = String::from_utf8_lossy(&listed);
    assert!(status == 200 && listed.contains("objective"), "{listed}");
}

#[test]
fn what_a_server_cannot_do_is_refused_before_any_work_naming_the_fix() {
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let full = job(dir.path(), true);
    // `train JOB --out OUT --server URL` and `extra` arguments.
    let on_server = |job: &std::path::Path, extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            job.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--server".as_ref(),
            server.url.as_ref(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        train(&args)
    };
    let error = on_server(&full, &["--api-key", &server.alice]).unwrap_err();
    assert!(error.contains("full_parameters"), "{error}");
    let lora_job = job(dir.path(), false);
    let error = on_server(&lora_job, &[]).unwrap_err();
    assert!(error.contains("TINKER_API_KEY"), "{error}");
    let error = on_server(&lora_job, &["--api-key", "tml-not-a-key"]).unwrap_err();
    assert!(error.contains("401"), "{error}");
    let error = on_server(
        &lora_job,
        &["--api-key", &server.alice, "--base-model", "no/such-model"],
    )
    .unwrap_err();
    assert!(
        error.contains("does not serve") && error.contains("opentinker/tiny"),
        "{error}"
    );
}
