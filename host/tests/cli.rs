//! The `opentinker` commands, run as a user runs them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn opentinker(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_opentinker"))
        .args(args)
        .env("OPENTINKER_CACHE_DIR", cache_dir())
        .output()
        .expect("running opentinker")
}

fn cache_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
        .path()
}

/// `opentinker plugin build` of `plugins/<name>`: the last line of its output is the component.
fn build(name: &str) -> PathBuf {
    let dir = repo_root().join("plugins").join(name);
    let output = opentinker(&["plugin", "build", dir.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let wasm = PathBuf::from(stdout.lines().last().unwrap_or_default());
    assert!(
        wasm.extension().is_some_and(|e| e == "wasm") && wasm.is_file(),
        "{stdout}"
    );
    wasm
}

fn json(output: &std::process::Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

#[test]
fn inspect_prints_what_a_component_is() {
    let wasm = build("tictactoe");
    let description = json(&opentinker(&["plugin", "inspect", wasm.to_str().unwrap()]));
    assert_eq!(description["kinds"], serde_json::json!(["environment"]));
    assert_eq!(description["wit_version"], "0.1.0");
    assert_eq!(description["digest"].as_str().map(str::len), Some(64));
    assert!(description["size"].as_u64().unwrap() > 1000);
    assert!(description["imports"].as_array().unwrap().len() > 1);

    let not_wasm = repo_root().join("Cargo.toml");
    let output = opentinker(&["plugin", "inspect", not_wasm.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a WebAssembly component"), "{stderr}");
}

#[test]
fn run_summarises_random_play_as_json() {
    let wasm = build("tictactoe");
    let summary = json(&opentinker(&[
        "plugin",
        "run",
        wasm.to_str().unwrap(),
        "--episodes",
        "50",
        "--seed",
        "3",
        "--json",
    ]));
    assert_eq!(summary["episodes"], 50);
    assert_eq!(summary["completed"], 50);
    assert_eq!(summary["errors"], serde_json::json!({}));
    assert!(summary["mean_reward"].is_number());
}

#[test]
fn run_refuses_a_misspelt_limit_by_name() {
    let wasm = build("tictactoe");
    let output = opentinker(&[
        "plugin",
        "run",
        wasm.to_str().unwrap(),
        "--limits",
        r#"{"memroy_bytes": 1}"#,
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("memroy_bytes"), "{stderr}");
}

/// Each adversarial plugin, 20 episodes with default limits: its expected result, exit code 0,
/// in well under a minute.
#[test]
fn adversarial_plugins_give_their_expected_results_with_default_limits() {
    let cases = [
        ("infinite-loop", Some("timeout")),
        ("sleeper", Some("timeout")),
        ("memory-hog", Some("memory_limit")),
        ("deep-recursion", Some("trap")),
        ("giant-output", Some("output_too_large")),
        ("log-flood", None),
        ("trap-at-step", Some("trap")),
        ("probe", None),
    ];
    for (name, expected_error) in cases {
        let wasm = build(&format!("adversarial/{name}"));
        let started = Instant::now();
        let summary = json(&opentinker(&[
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--episodes",
            "20",
            "--json",
        ]));
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(60), "{name} took {elapsed:?}");
        assert_eq!(summary["episodes"], 20, "{name}: {summary}");
        match expected_error {
            Some(kind) => {
                assert_eq!(summary["completed"], 0, "{name}: {summary}");
                assert_eq!(summary["errors"][kind], 20, "{name}: {summary}");
            }
            None => {
                assert_eq!(summary["completed"], 20, "{name}: {summary}");
                assert_eq!(summary["mean_reward"], 1.0, "{name}: {summary}");
            }
        }
    }
}

#[test]
fn init_tiny_then_logprobs_prints_every_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let output = opentinker(&[
        "model",
        "init-tiny",
        model.to_str().unwrap(),
        "--arch",
        "qwen3",
        "--seed",
        "2",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = json(&opentinker(&[
        "model",
        "logprobs",
        "--model",
        model.to_str().unwrap(),
        "--text",
        "Your move? 5",
        "--json",
    ]));
    let tokens = printed["tokens"].as_array().unwrap();
    assert!(tokens.len() >= 4, "{printed}");
    assert!(tokens[0]["logprob"].is_null());
    assert!(
        tokens[1..]
            .iter()
            .all(|t| t["logprob"].as_f64().is_some_and(|l| l < 0.0))
    );
    let text: String = tokens.iter().map(|t| t["text"].as_str().unwrap()).collect();
    assert_eq!(text, "Your move? 5");

    let missing = opentinker(&[
        "model",
        "logprobs",
        "--model",
        dir.path().to_str().unwrap(),
        "--text",
        "x",
    ]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("config.json"));
}

#[test]
fn sample_prints_each_sample_as_json_and_is_reproducible_with_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let output = opentinker(&["model", "init-tiny", model.to_str().unwrap()]);
    assert!(output.status.success());
    let sample = |extra: &[&str]| {
        let mut args = vec![
            "sample",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "What is 2 + 3?",
            "--chat",
            "--n",
            "3",
            "--max-tokens",
            "12",
            "--seed",
            "7",
            "--json",
        ];
        args.extend_from_slice(extra);
        opentinker(&args)
    };
    let printed = json(&sample(&[]));
    let samples = printed["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3);
    for s in samples {
        let tokens = s["tokens"].as_array().unwrap();
        let logprobs = s["logprobs"].as_array().unwrap();
        assert!(!tokens.is_empty() && tokens.len() <= 12);
        assert_eq!(tokens.len(), logprobs.len());
        assert!(logprobs.iter().all(|l| l.as_f64().unwrap() <= 0.0));
        assert!(s["text"].is_string());
        let reason = s["stop_reason"].as_str().unwrap();
        assert!(reason == "stop" || reason == "length");
        if tokens.len() < 12 {
            assert_eq!(reason, "stop");
        }
    }
    assert_eq!(
        json(&sample(&[])),
        printed,
        "the same seed gave other samples"
    );

    let bad = sample(&["--top-p", "1.5"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("top_p"));
}

#[test]
fn train_runs_a_short_job_and_writes_its_files() {
    let wasm = build("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("short.toml");
    let text = format!(
        r#"
[model]
init_tiny = {{ seed = 3 }}
[lora]
rank = 4
[environment]
plugin = {wasm:?}
config = {{ max_operand = 9 }}
[warmup]
source = "demonstrations"
steps = 2
batch = 4
[rl]
steps = 2
groups_per_batch = 2
group_size = 3
max_turns = 1
max_tokens = 6
skip_equal_groups = false
[eval]
episodes = 4
"#
    );
    std::fs::write(&job, &text).unwrap();
    let out = dir.path().join("run");
    let summary = json(&opentinker(&[
        "train",
        job.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(summary["steps"], 2);
    assert_eq!(summary["initial_eval"]["episodes"], 4);
    assert!(summary["final_eval"]["reward_mean"].is_number());
    let checkpoint = PathBuf::from(summary["checkpoint"].as_str().unwrap());
    assert!(checkpoint.join("adapter_model.safetensors").is_file());
    assert!(checkpoint.join("adapter_config.json").is_file());

    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["warmup", "warmup", "rl", "rl"]);
    for line in &lines {
        assert!(line["tokens"].as_u64().unwrap() > 0, "{line}");
        assert!(line["loss"].as_f64().unwrap().is_finite());
        assert!(line["errors"].as_object().unwrap().is_empty(), "{line}");
    }
    assert!(lines[3]["eval"]["reward_mean"].is_number());

    let misspelt = dir.path().join("misspelt.toml");
    std::fs::write(&misspelt, text.replace("max_tokens = 6", "max_tokenz = 6")).unwrap();
    let refused = opentinker(&["train", misspelt.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("max_tokenz"));
}
