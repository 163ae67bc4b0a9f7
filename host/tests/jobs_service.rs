//! Jobs as a service: `opentinker submit` uploads a job's plugins by digest and runs the job on
//! `opentinker serve` (on loopback), which trains it on its served base as the tenant; the job is
//! its tenant's alone, and a server killed in the middle of a job resumes it to the same metrics.

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/plugin_build.rs"]
mod plugin_build;
#[path = "common/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use arithmetic_job::ArithmeticJob;
use plugin_build::built_plugin;
use server::{Server, bin, spawn_server, start_server, start_server_with};

/// The arithmetic job checkpointed every 2 steps; `full_parameters`: a warm-up of every weight,
/// which makes a base of its own.
fn job(dir: &Path, name: &str, full_parameters: bool, rl_steps: usize) -> PathBuf {
    ArithmeticJob {
        sft_steps: 30,
        full_parameters,
        rl_steps,
        rl_extra: "",
        sections: "[checkpoint]\nevery = 2",
    }
    .write(dir, name)
}

/// Run `opentinker` with `args` as the tenant of `key` on `url`; (success, stdout, stderr).
fn opentinker(url: &str, key: &str, args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let output = Command::new(bin())
        .args(args)
        .env("TINKER_BASE_URL", url)
        .env("TINKER_API_KEY", key)
        .output()
        .expect("running opentinker");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn os(text: &str) -> &std::ffi::OsStr {
    text.as_ref()
}

/// The id `submit` printed.
fn job_id(stderr: &str) -> String {
    stderr
        .split_whitespace()
        .find(|w| w.starts_with("job-"))
        .unwrap_or_else(|| panic!("no job id in: {stderr}"))
        .to_string()
}

fn status(server: &Server, key: &str, id: &str) -> serde_json::Value {
    let (ok, out, err) = opentinker(&server.url, key, &[os("jobs"), os("status"), os(id)]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn metrics(file: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A metrics line without its timings.
fn untimed(mut line: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = line.as_object_mut() {
        for timing in ["seconds", "sample_seconds", "train_seconds"] {
            fields.remove(timing);
        }
    }
    line
}

/// Download job `id`'s run folder into `out`.
fn download(server: &Server, key: &str, id: &str, out: &Path) {
    let args = [
        os("jobs"),
        os("download"),
        os(id),
        os("--out"),
        out.as_os_str(),
    ];
    let (ok, _, err) = opentinker(&server.url, key, &args);
    assert!(ok, "{err}");
}

#[test]
fn a_submitted_job_runs_on_the_server_as_in_process_and_is_its_tenants_alone() {
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let lora = job(dir.path(), "arith", false, 2);
    let local = dir.path().join("local");
    let output = Command::new(bin())
        .args([
            os("train"),
            lora.as_os_str(),
            os("--out"),
            local.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let (ok, _, err) = opentinker(
        &server.url,
        &server.alice,
        &[os("submit"), lora.as_os_str()],
    );
    assert!(ok, "submit failed:\n{err}");
    // The plugin went up as bytes, and the progress came back live, a line per step.
    assert!(err.contains("(uploaded)"), "{err}");
    assert!(err.contains("arith     rl    1"), "{err}");
    assert!(err.contains("succeeded"), "{err}");
    let id = job_id(&err);
    let remote = dir.path().join("remote");
    download(&server, &server.alice, &id, &remote);
    // The same seeds and the same base as in process: the same episodes and, up to the
    // rounding of fused passes, the same losses.
    let (local_lines, remote_lines) = (
        metrics(&local.join("metrics.jsonl")),
        metrics(&remote.join("metrics.jsonl")),
    );
    assert_eq!(local_lines.len(), 32);
    assert_eq!(local_lines.len(), remote_lines.len());
    for (l, r) in local_lines.iter().zip(&remote_lines) {
        assert_eq!(l["phase"], r["phase"]);
        assert_eq!(l["reward_mean"], r["reward_mean"], "{l}\n{r}");
        assert_eq!(l["tokens"], r["tokens"], "{l}\n{r}");
        let (l_loss, r_loss) = (l["loss"].as_f64().unwrap(), r["loss"].as_f64().unwrap());
        assert!((l_loss - r_loss).abs() <= 1e-4 * l_loss.abs().max(1.0));
    }
    assert!(
        remote
            .join("checkpoints/final/adapter_model.safetensors")
            .exists()
    );
    let record = status(&server, &server.alice, &id);
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(
        record["evaluations"].as_array().unwrap().len(),
        2,
        "{record}"
    );

    // The job's adapter is sampled by its name through the OpenAI-compatible routes, greedy as
    // `opentinker sample` samples the downloaded adapter.
    let openai = |key: &str, path: &str, body: Option<serde_json::Value>| {
        let (method, bytes) = match &body {
            Some(body) => ("POST", body.to_string().into_bytes()),
            None => ("GET", Vec::new()),
        };
        let (status, _, answer) = server::request(
            &server.url,
            method,
            path,
            Some(key),
            "application/json",
            &bytes,
        );
        (
            status,
            serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
        )
    };
    let (code, models) = openai(&server.alice, "/v1/models", None);
    assert_eq!(code, 200);
    let listed = models["data"].as_array().unwrap();
    assert!(listed.iter().any(|m| m["id"] == id.as_str()), "{models}");
    let prompt = "What is 3 + 4?";
    let request = serde_json::json!({
        "model": id, "prompt": prompt, "max_tokens": 8, "temperature": 0
    });
    let (code, completion) = openai(&server.alice, "/v1/completions", Some(request.clone()));
    assert_eq!(code, 200, "{completion}");
    let sampled = Command::new(bin())
        .args([os("sample"), os("--model")])
        .arg(server.data.path().join("models/opentinker-tiny"))
        .arg("--adapter")
        .arg(remote.join("checkpoints/final"))
        .args([
            "--prompt",
            prompt,
            "--max-tokens",
            "8",
            "--temperature",
            "0",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&sampled.stderr);
    assert!(sampled.status.success(), "{stderr}");
    let sampled: serde_json::Value = serde_json::from_slice(&sampled.stdout).unwrap();
    assert_eq!(
        completion["choices"][0]["text"],
        sampled["samples"][0]["text"]
    );
    let (code, _) = openai(&server.bob, "/v1/completions", Some(request));
    assert_eq!(code, 404);

    // Submitted again, the plugin is not sent again.
    let (ok, _, err) = opentinker(
        &server.url,
        &server.alice,
        &[os("submit"), lora.as_os_str(), os("--detach")],
    );
    assert!(ok && err.contains("(already stored)"), "{err}");
    let detached = job_id(&err);

    // Another tenant: the job is unknown, and so is the plugin's digest in a job of its own.
    let (ok, _, err) = opentinker(
        &server.url,
        &server.bob,
        &[os("jobs"), os("status"), os(&id)],
    );
    assert!(!ok && err.contains("404"), "{err}");
    let digest = std::fs::read_to_string(remote.join("submitted.toml")).unwrap();
    let digest = digest
        .split('"')
        .find(|s| s.starts_with("sha256:"))
        .unwrap()
        .to_string();
    let text = std::fs::read_to_string(&lora).unwrap();
    let plugin_line = text.lines().find(|l| l.starts_with("plugin")).unwrap();
    let stolen = dir.path().join("stolen.toml");
    std::fs::write(
        &stolen,
        text.replace(plugin_line, &format!("plugin = \"{digest}\"")),
    )
    .unwrap();
    let (ok, _, err) = opentinker(
        &server.url,
        &server.bob,
        &[os("submit"), stolen.as_os_str()],
    );
    assert!(!ok, "{err}");
    assert!(err.contains("the tenant has no such plugin"), "{err}");
    let (ok, out, _) = opentinker(&server.url, &server.bob, &[os("jobs"), os("list")]);
    assert!(ok && out.trim().is_empty(), "{out}");

    // A full-parameter warm-up makes a base of the job's own on the server, trained (and its
    // adapters after it) in the served base's training loop: every token of the job is counted
    // in the tenant's share of that loop.
    let trained = |server: &Server| {
        let (code, _, body) = server::request(
            &server.url,
            "GET",
            "/api/v1/dashboard/usage",
            Some(&server.alice),
            "application/json",
            b"",
        );
        assert_eq!(code, 200);
        let usage: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let bases = usage["bases"].as_array().unwrap();
        let tiny = bases
            .iter()
            .find(|b| b["base"] == "opentinker/tiny")
            .unwrap();
        tiny["training"]["yours"].as_u64().unwrap()
    };
    // The detached job's tokens are not this one's.
    let deadline = Instant::now() + Duration::from_secs(300);
    while status(&server, &server.alice, &detached)["state"] != "succeeded" {
        assert!(Instant::now() < deadline, "the detached job did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = trained(&server);
    let full = job(dir.path(), "full", true, 2);
    let (ok, _, err) = opentinker(
        &server.url,
        &server.alice,
        &[os("submit"), full.as_os_str()],
    );
    assert!(ok, "submit of a full-parameter warm-up failed:\n{err}");
    let id = job_id(&err);
    let folder = dir.path().join("full-remote");
    download(&server, &server.alice, &id, &folder);
    let lines = metrics(&folder.join("metrics.jsonl"));
    let sft_tokens: u64 = lines
        .iter()
        .filter(|l| l["phase"] == "sft")
        .map(|l| l["tokens"].as_u64().unwrap())
        .sum();
    let all_tokens: u64 = lines.iter().map(|l| l["tokens"].as_u64().unwrap()).sum();
    assert!(sft_tokens > 0, "{lines:?}");
    let counted = trained(&server) - before;
    assert!(
        counted >= all_tokens,
        "the job trained {all_tokens} tokens ({sft_tokens} in its warm-up), its tenant's share \
         of the loop grew by {counted}"
    );
}

#[test]
fn a_server_killed_during_a_sync_job_resumes_it_to_the_same_metrics() {
    let mut server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let spec = job(dir.path(), "resumed", false, 8);
    let alice = server.alice.clone();

    // Uninterrupted.
    let (ok, _, err) = opentinker(&server.url, &alice, &[os("submit"), spec.as_os_str()]);
    assert!(ok, "{err}");
    let whole = dir.path().join("whole");
    download(&server, &alice, &job_id(&err), &whole);

    // Killed after RL step 3 (a checkpoint at step 2), then started again on the same data.
    let (ok, _, err) = opentinker(
        &server.url,
        &alice,
        &[os("submit"), spec.as_os_str(), os("--detach")],
    );
    assert!(ok, "{err}");
    let id = job_id(&err);
    let started = Instant::now();
    loop {
        let record = status(&server, &alice, &id);
        let latest = &record["latest"];
        if latest["phase"] == "rl" && latest["step"].as_u64() >= Some(3) {
            break;
        }
        assert!(record["state"] != "succeeded", "finished before the kill");
        assert!(started.elapsed() < Duration::from_secs(300), "{record}");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let (child, url, line) = spawn_server(server.data.path(), "127.0.0.1:0");
    server.child = child;
    server.url = url;
    assert!(line.contains("and 1 jobs"), "{line}");
    let started = Instant::now();
    loop {
        let record = status(&server, &alice, &id);
        match record["state"].as_str() {
            Some("succeeded") => break,
            Some("queued" | "running") => {}
            _ => panic!("the resumed job ended badly: {record}"),
        }
        assert!(started.elapsed() < Duration::from_secs(300), "{record}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let resumed = dir.path().join("resumed");
    download(&server, &alice, &id, &resumed);
    let whole_lines: Vec<_> = metrics(&whole.join("metrics.jsonl"))
        .into_iter()
        .map(untimed)
        .collect();
    let resumed_lines: Vec<_> = metrics(&resumed.join("metrics.jsonl"))
        .into_iter()
        .map(untimed)
        .collect();
    assert_eq!(whole_lines.len(), 30 + 8);
    assert_eq!(whole_lines, resumed_lines);
}

#[test]
fn each_tenant_quota_is_refused_with_a_clear_error_until_something_ends() {
    let server = start_server_with(&[
        "--max-jobs-per-tenant",
        "1",
        "--max-models-per-tenant",
        "1",
        "--max-plugin-mib-per-tenant",
        "1",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let long = job(dir.path(), "long", false, 1000);
    let submit = |key: &str| {
        opentinker(
            &server.url,
            key,
            &[os("submit"), long.as_os_str(), os("--detach")],
        )
    };
    let (ok, _, err) = submit(&server.alice);
    assert!(ok, "{err}");
    let first = job_id(&err);
    let (ok, _, err) = submit(&server.alice);
    assert!(!ok, "{err}");
    assert!(err.contains("403") && err.contains("quota"), "{err}");
    // Another tenant's quota is its own.
    let (ok, _, err) = submit(&server.bob);
    assert!(ok, "{err}");
    // Cancelled, the first job makes room.
    let (ok, _, err) = opentinker(
        &server.url,
        &server.alice,
        &[os("jobs"), os("cancel"), os(&first)],
    );
    assert!(ok && err.contains("cancelled"), "{err}");
    assert_eq!(status(&server, &server.alice, &first)["state"], "cancelled");
    let (ok, _, err) = submit(&server.alice);
    assert!(ok, "{err}");

    // Stored plugin bytes: the component is stored (about 0.2 MiB); 0.9 MiB more is not.
    let upload = |body: &[u8]| {
        let (status, _, answer) = server::request(
            &server.url,
            "POST",
            "/api/v1/plugins",
            Some(&server.alice),
            "application/wasm",
            body,
        );
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let (status, answer) = upload(&vec![7u8; 900 << 10]);
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("quota"), "{answer}");

    // Models through the Tinker API: the second is refused.
    let post = |path: &str, body: serde_json::Value| {
        let (status, _, answer) = server::request(
            &server.url,
            "POST",
            &format!("/api/v1/{path}"),
            Some(&server.bob),
            "application/json",
            body.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        serde_json::from_slice::<serde_json::Value>(&answer).unwrap()
    };
    let session = post(
        "create_session",
        serde_json::json!({"tags": [], "sdk_version": "test"}),
    );
    let create = |seq: u64| {
        let submitted = post(
            "create_model",
            serde_json::json!({
                "session_id": session["session_id"], "model_seq_id": seq,
                "base_model": "opentinker/tiny", "lora_config": {"rank": 4}
            }),
        );
        loop {
            let answer = post(
                "retrieve_future",
                serde_json::json!({ "request_id": submitted["request_id"] }),
            );
            if answer["type"] != "try_again" {
                return answer;
            }
        }
    };
    let first = create(0);
    assert!(first["model_id"].is_string(), "{first}");
    let second = create(1);
    assert_eq!(second["kind"], "quota_exceeded", "{second}");
}

/// One memory budget (issue 45): with room for one job whose warm-up trains every weight (a
/// base of its own), a second such job waits in the queue, its place and reason in its status,
/// while another tenant's job on the served base runs at once. Killed (`kill -9`) and started
/// again, the server admits what it resumes under the same budget: still one at a time. All
/// succeed. A job that could never fit is refused at once, naming the budget.
#[test]
fn jobs_wait_for_memory_under_the_budget_and_one_that_never_fits_is_refused() {
    use opentinker::jobs::{footprint, served_base_bytes};
    use opentinker::model::Architecture;
    use opentinker::model::{TinyShape, tiny_config};

    let dir = tempfile::tempdir().unwrap();
    let first = job(dir.path(), "first", true, 6);
    let second = job(dir.path(), "second", true, 1);
    let light = job(dir.path(), "light", false, 1);
    // The budget: the served tiny base (as the server counts it) and one and a half such jobs.
    let text = std::fs::read_to_string(&first).unwrap();
    let parsed = opentinker::rl::Job::parse(&text, &first).unwrap();
    let config = tiny_config(TinyShape::Tiny, Architecture::Qwen2).unwrap();
    let context = config.max_position_embeddings;
    let needs = footprint(&parsed, &config, context, false);
    let kv_positions = 4096;
    let held = served_base_bytes(&config, kv_positions.max(context));
    let budget = held + needs + needs / 2;
    let (kv_positions, budget) = (kv_positions.to_string(), budget.to_string());
    let options = ["--kv-positions", &kv_positions, "--memory-budget", &budget];
    let mut server = start_server_with(&options);
    let submit = |key: &str, file: &Path| {
        let (ok, _, err) = opentinker(
            &server.url,
            key,
            &[os("submit"), file.as_os_str(), os("--detach")],
        );
        assert!(ok, "{err}");
        job_id(&err)
    };
    let first_id = submit(&server.alice, &first);
    let second_id = submit(&server.alice, &second);
    let light_id = submit(&server.bob, &light);
    let queued = status(&server, &server.alice, &second_id);
    assert_eq!(queued["state"], "queued", "{queued}");
    assert_eq!(queued["queue"]["position"], 1, "{queued}");
    let reason = queued["queue"]["reason"].as_str().unwrap();
    assert!(reason.contains("waiting for memory"), "{reason}");
    // The list (which the dashboard shows) tells the same.
    let (ok, listed, err) = opentinker(&server.url, &server.alice, &[os("jobs"), os("list")]);
    assert!(ok, "{err}");
    assert!(listed.contains("queued #1"), "{listed}");
    assert_eq!(
        status(&server, &server.alice, &first_id)["state"],
        "running"
    );

    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let (child, url, line) = server::spawn_server_with(server.data.path(), "127.0.0.1:0", &options);
    (server.child, server.url) = (child, url);
    let states: Vec<serde_json::Value> = [&first_id, &second_id]
        .map(|id| status(&server, &server.alice, id))
        .into();
    let running = states.iter().filter(|s| s["state"] == "running").count();
    let waiting = states
        .iter()
        .filter(|s| s["queue"]["position"] == 1)
        .count();
    assert!(running <= 1 && waiting == 1, "{line}: {states:?}");

    let wait = |key: &str, id: &str| {
        let started = Instant::now();
        loop {
            let record = status(&server, key, id);
            match record["state"].as_str() {
                Some("succeeded") => return,
                Some("failed" | "cancelled") => panic!("{record}"),
                _ => {}
            }
            assert!(started.elapsed() < Duration::from_secs(600), "{record}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait(&server.bob, &light_id);
    wait(&server.alice, &first_id);
    wait(&server.alice, &second_id);

    // Its own 0.5B-shaped model would never fit.
    let big = dir.path().join("big.toml");
    std::fs::write(
        &big,
        text.replace(r#"shape = "tiny""#, r#"shape = "qwen2.5-0.5b""#),
    )
    .unwrap();
    let (ok, _, err) = opentinker(
        &server.url,
        &server.alice,
        &[os("submit"), big.as_os_str(), os("--detach")],
    );
    assert!(!ok, "{err}");
    assert!(
        err.contains("budget for jobs") && err.contains("--memory-budget"),
        "{err}"
    );
}

/// A job's final summary from its status.
fn summary(server: &Server, key: &str, id: &str) -> serde_json::Value {
    let record = status(server, key, id);
    assert_eq!(record["state"], "succeeded", "{record}");
    record["summary"].clone()
}

/// Whether a summary reaches the examples' target (examples/README.md): the greedy success rate
/// at least 0.15 above the warm-up's, or at least 0.9.
fn reaches_its_figure(summary: &serde_json::Value) -> bool {
    let initial = summary["initial_eval"]["success_rate"].as_f64().unwrap();
    let last = summary["final_eval"]["success_rate"].as_f64().unwrap();
    last >= 0.9 || last >= initial + 0.15
}

#[test]
#[ignore = "minutes of training: scripts/jobs-examples.sh runs it in release"]
fn two_tenants_examples_learn_on_a_server_as_under_train_in_about_the_same_time() {
    let server = start_server();
    let carol = server::create_tenant(server.data.path(), "carol");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let examples = ["tictactoe", "arithmetic"].map(|e| root.join(format!("examples/{e}.toml")));
    // The plugins built before any clock starts.
    for plugin in [
        "tictactoe",
        "arithmetic",
        "math-answer",
        "latest-observation",
    ] {
        built_plugin(plugin);
    }

    let started = Instant::now();
    let tenants = [server.alice.clone(), server.bob.clone()];
    let submits: Vec<_> = examples
        .iter()
        .zip(&tenants)
        .map(|(example, key)| {
            Command::new(bin())
                .arg("submit")
                .arg(example)
                .env("TINKER_BASE_URL", &server.url)
                .env("TINKER_API_KEY", key)
                .stderr(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for submit in submits {
        let output = submit.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{err}");
        ids.push(job_id(&err));
    }
    let on_server = started.elapsed();

    // A third tenant: neither the first tenant's job nor its plugin's digest is there for it.
    let (ok, _, err) = opentinker(
        &server.url,
        &carol,
        &[os("jobs"), os("status"), os(&ids[0])],
    );
    assert!(!ok && err.contains("404"), "{err}");
    let record = status(&server, &server.alice, &ids[0]);
    let folder = server.data.path().join("jobs/alice").join(&ids[0]);
    let submitted = std::fs::read_to_string(folder.join("submitted.toml")).unwrap();
    let stolen = Path::new(server.data.path()).join("stolen.toml");
    std::fs::write(&stolen, &submitted).unwrap();
    let (ok, _, err) = opentinker(&server.url, &carol, &[os("submit"), stolen.as_os_str()]);
    assert!(
        !ok && err.contains("the tenant has no such plugin"),
        "{record}\n{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let trained = Command::new(bin())
        .arg("train")
        .args(&examples)
        .arg("--out")
        .arg(dir.path().join("train"))
        .arg("--json")
        .output()
        .unwrap();
    let in_process = started.elapsed();
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let local: Vec<serde_json::Value> = String::from_utf8_lossy(&trained.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();

    let ratio = on_server.as_secs_f64() / in_process.as_secs_f64();
    let mut missed = Vec::new();
    for ((example, id), (key, local)) in ["tictactoe", "arithmetic"]
        .iter()
        .zip(&ids)
        .zip(tenants.iter().zip(&local))
    {
        let remote = summary(&server, key, id);
        println!(
            "{example}: on the server {:.3} -> {:.3}; by train {:.3} -> {:.3}",
            remote["initial_eval"]["success_rate"],
            remote["final_eval"]["success_rate"],
            local["initial_eval"]["success_rate"],
            local["final_eval"]["success_rate"],
        );
        if !reaches_its_figure(&remote) {
            missed.push(format!("{example}: {remote}"));
        }
    }
    println!(
        "wall time: both submitted to one server {:.0} s, both by one `train` {:.0} s: {ratio:.2}x",
        on_server.as_secs_f64(),
        in_process.as_secs_f64()
    );
    assert!(
        missed.is_empty(),
        "below examples/README.md's figures:\n{}",
        missed.join("\n")
    );
    assert!(ratio <= 1.3, "{ratio:.2}x");
}
