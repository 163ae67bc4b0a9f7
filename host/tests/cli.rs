//! The `opentinker` commands, run as a user runs them.

#[path = "common/plugin_build.rs"]
mod plugin_build;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use plugin_build::built_plugin;

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

/// The compile cache of the commands these tests run: the test script's one
/// (`OPENTINKER_TEST_COMPILE_CACHE`, shared by every test process and kept between runs, so that
/// each component is compiled once, not once per test), else a temporary one for this process.
fn cache_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    static TEMPORARY: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("OPENTINKER_TEST_COMPILE_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => TEMPORARY
            .get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
            .path()
            .to_path_buf(),
    })
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

/// `train JOB --out OUT --json`, which must succeed: its summary.
fn train_json(job: &Path, out: &Path) -> serde_json::Value {
    let (job, out) = (job.to_str().unwrap(), out.to_str().unwrap());
    json(&opentinker(&["train", job, "--out", out, "--json"]))
}

/// `train JOB --out OUT`, which must fail: its standard error.
fn train_refused(job: &Path, out: &Path) -> String {
    let output = opentinker(&[
        "train",
        job.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    stderr
}

/// A small arithmetic job (operands 0 to 9, LoRA rank 4) on a tiny model generated from `seed`:
/// its model, LoRA and environment sections, then `rest`.
fn arithmetic_job(wasm: &Path, seed: u64, rest: &str) -> String {
    format!(
        "
[model]
init_tiny = {{ seed = {seed} }}
[lora]
rank = 4
[environment]
plugin = {wasm:?}
config = {{ max_operand = 9 }}
{rest}"
    )
}

#[test]
fn inspect_prints_what_a_component_is() {
    let wasm = built_plugin("tictactoe");
    let description = json(&opentinker(&["plugin", "inspect", wasm.to_str().unwrap()]));
    assert_eq!(description["kinds"], serde_json::json!(["environment"]));
    assert_eq!(description["wit_version"], "0.3.0");
    assert_eq!(description["digest"].as_str().map(str::len), Some(64));
    assert!(description["size"].as_u64().unwrap() > 1000);
    assert!(description["imports"].as_array().unwrap().len() > 1);
    let metadata = &description["metadata"];
    assert_eq!(metadata["name"], "tictactoe");
    assert_eq!(metadata["language"], "rust");
    assert_eq!(
        metadata["config_schema"]["properties"]["opponent"]["enum"],
        serde_json::json!(["random", "minimax", "none"])
    );
    // A component of contract 0.1 (built before 0.2) has no metadata to show.
    let old = repo_root().join("tests/fixtures/wit-0.1/tictactoe.wasm");
    let description = json(&opentinker(&["plugin", "inspect", old.to_str().unwrap()]));
    assert_eq!(description["wit_version"], "0.1.0");
    assert_eq!(description["metadata"], serde_json::Value::Null);

    let not_wasm = repo_root().join("Cargo.toml");
    let output = opentinker(&["plugin", "inspect", not_wasm.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a WebAssembly component"), "{stderr}");
}

#[test]
fn run_summarises_random_play_as_json() {
    let wasm = built_plugin("tictactoe");
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
    let wasm = built_plugin("tictactoe");
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
        ("infinite-loop", Some("out_of_fuel")),
        ("sleeper", Some("out_of_fuel")),
        ("memory-hog", Some("memory_limit")),
        ("deep-recursion", Some("trap")),
        ("giant-output", Some("output_too_large")),
        ("log-flood", None),
        ("trap-at-step", Some("trap")),
        ("probe", None),
    ];
    for (name, expected_error) in cases {
        let wasm = built_plugin(&format!("adversarial/{name}"));
        let started = Instant::now();
        // memory-hog writes 64 MiB per episode before the cap refuses it: a few at a time keep
        // the test's memory small.
        let concurrency = if name == "memory-hog" { "4" } else { "64" };
        let summary = json(&opentinker(&[
            "plugin",
            "run",
            wasm.to_str().unwrap(),
            "--episodes",
            "20",
            "--concurrency",
            concurrency,
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

/// `--device` on every command that runs the model: `cpu` runs (the other tests), a text that
/// names no device is refused by clap with the value named, and `cuda` is refused before any
/// model file is read, saying why on this machine: no driver (a CPU machine), or the engine not
/// on CUDA yet (a machine with a GPU).
#[test]
fn every_command_that_runs_the_model_refuses_a_device_it_cannot_use_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    assert!(
        opentinker(&["model", "init-tiny", model.to_str().unwrap()])
            .status
            .success()
    );
    let model = model.to_str().unwrap();
    let missing = dir.path().join("no-such-model");
    let missing = missing.to_str().unwrap();
    let data = dir.path().join("data");
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "[model]\ninit_tiny = {}\n[environment]\nplugin = \"no-such-plugin\"\n[rl]\nsteps = 1\n",
    )
    .unwrap();
    let commands: [(&str, Vec<&str>); 4] = [
        (
            "sample",
            vec!["sample", "--model", missing, "--prompt", "hi"],
        ),
        (
            "model logprobs",
            vec!["model", "logprobs", "--model", missing, "--text", "hi"],
        ),
        (
            "serve",
            vec![
                "serve",
                "--data",
                data.to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ],
        ),
        ("train", vec!["train", job.to_str().unwrap()]),
    ];
    for (name, args) in &commands {
        let with = |device: &str| {
            let mut args = args.clone();
            args.extend(["--device", device]);
            opentinker(&args)
        };
        let bad = with("gpu");
        assert!(!bad.status.success(), "{name} --device gpu");
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(stderr.contains("`gpu` is not a device"), "{name}: {stderr}");

        let cuda = with("cuda:1");
        assert!(!cuda.status.success(), "{name} --device cuda:1");
        let stderr = String::from_utf8_lossy(&cuda.stderr);
        let why = ["has no CUDA backend", "no CUDA driver", "is not available"];
        assert!(
            stderr.contains("cuda:1") && why.iter().any(|w| stderr.contains(w)),
            "{name}: {stderr}"
        );
        // Refused before the model (missing here for sample and logprobs) or the job's plugin
        // was looked at.
        assert!(
            !stderr.contains("no-such-model") && !stderr.contains("no-such-plugin"),
            "{name}: {stderr}"
        );
    }
    assert!(
        !data.join("models").exists(),
        "serve made its tiny model first"
    );

    // With --server, the server's own device decides.
    let both = opentinker(&[
        "train",
        job.to_str().unwrap(),
        "--server",
        "http://127.0.0.1:9",
        "--device",
        "cpu",
    ]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("--server"));

    // The CPU samples as before.
    let cpu = opentinker(&[
        "sample",
        "--model",
        model,
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
        "--device",
        "cpu",
    ]);
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
}

/// A warm-up of the LoRA adapter before RL: RL's first evaluation comes after it, so the
/// summary also holds the model's own as it came (what the warm-up and RL each added); a job
/// without a warm-up has none.
#[test]
fn a_lora_warm_up_leaves_the_untrained_models_evaluation_in_the_summary() {
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let rl = "[rl]\nsteps = 1\ngroups_per_batch = 1\ngroup_size = 2\nmax_turns = 1\n\
              max_tokens = 4\n[eval]\nepisodes = 3\n";
    let warm_up = "[sft]\nsource = \"demonstrations\"\nsteps = 1\nbatch = 2\n\
                   full_parameters = false\n";
    for (name, rest, untrained) in [
        ("warm", format!("{warm_up}{rl}"), true),
        ("cold", rl.into(), false),
    ] {
        let job = dir.path().join(format!("{name}.toml"));
        std::fs::write(&job, arithmetic_job(&wasm, 3, &rest)).unwrap();
        let summary = train_json(&job, &dir.path().join(name));
        assert_eq!(summary["initial_eval"]["episodes"], 3, "{name}: {summary}");
        match untrained {
            true => assert_eq!(summary["untrained_eval"]["episodes"], 3, "{summary}"),
            false => assert!(summary.get("untrained_eval").is_none(), "{summary}"),
        }
    }
}

#[test]
fn train_runs_a_short_job_and_writes_its_files() {
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("short.toml");
    let text = arithmetic_job(
        &wasm,
        3,
        r#"[sft]
source = "demonstrations"
steps = 2
batch = 4
learning_rate = 3e-3
[rl]
steps = 2
groups_per_batch = 2
group_size = 3
max_turns = 1
max_tokens = 6
skip_equal_groups = false
[eval]
episodes = 4
"#,
    );
    std::fs::write(&job, &text).unwrap();
    let out = dir.path().join("run");
    let summary = train_json(&job, &out);
    assert_eq!(summary["steps"], 2);
    // The settings it ran with, the defaults the file left out filled in.
    let settings: toml::Table = std::fs::read_to_string(out.join("settings.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(settings["rl"]["group_size"].as_integer(), Some(3));
    assert_eq!(settings["rl"]["temperature"].as_float(), Some(1.0));
    assert_eq!(settings["lora"]["rank"].as_integer(), Some(4));
    assert_eq!(settings["lora"]["alpha"].as_float(), Some(32.0));
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
    assert_eq!(phases, ["sft", "sft", "rl", "rl"]);
    for line in &lines {
        assert!(line["tokens"].as_u64().unwrap() > 0, "{line}");
        assert!(line["loss"].as_f64().unwrap().is_finite());
        assert!(line["errors"].as_object().unwrap().is_empty(), "{line}");
    }
    assert!(lines[3]["eval"]["reward_mean"].is_number());
    // Each RL step's diagnostics: how far the adapter moved (nothing here: every group tied,
    // so every advantage and gradient was zero), and the group signal.
    for line in &lines[2..] {
        // Its throughput: every token trained on was sampled in the step, and the sequences
        // trained hold their prompts too; the step's wall time holds both phases.
        let counted = line["tokens"].as_u64().unwrap();
        assert!(
            line["sampled_tokens"].as_u64().unwrap() >= counted,
            "{line}"
        );
        assert!(line["train_tokens"].as_u64().unwrap() > counted, "{line}");
        let (sample, train) = (
            line["sample_seconds"].as_f64().unwrap(),
            line["train_seconds"].as_f64().unwrap(),
        );
        assert!(sample > 0.0 && train > 0.0, "{line}");
        assert!(
            sample + train <= line["seconds"].as_f64().unwrap(),
            "{line}"
        );
        assert_eq!(line["tied_groups"], 1.0, "{line}");
        assert_eq!(line["advantage_abs_mean"], 0.0, "{line}");
        assert_eq!(line["update_ratio"], 0.0, "{line}");
    }
    // The evaluation step measures the drift from the policy at RL start: none, as nothing moved
    // (the sampler's logprobs against the trainer's, within their agreement).
    assert!(lines[2].get("kl").is_none(), "{}", lines[2]);
    assert!(
        lines[3]["kl"].as_f64().unwrap().abs() < 1e-3,
        "{}",
        lines[3]
    );

    let misspelt = dir.path().join("misspelt.toml");
    std::fs::write(&misspelt, text.replace("max_tokens = 6", "max_tokenz = 6")).unwrap();
    let refused = opentinker(&["train", misspelt.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("max_tokenz"));

    // Two jobs of one command with one name would share a folder and adapter names.
    let twin = dir.path().join("twin");
    std::fs::create_dir(&twin).unwrap();
    std::fs::write(twin.join("short.toml"), &text).unwrap();
    let twin = twin.join("short.toml");
    let refused = opentinker(&["train", job.to_str().unwrap(), twin.to_str().unwrap()]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(r#"two job files are named "short""#),
        "{stderr}"
    );
}

/// The metric lines of a run, without their timings.
fn metric_lines(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let mut line: serde_json::Value = serde_json::from_str(l).unwrap();
            for timing in ["seconds", "sample_seconds", "train_seconds"] {
                line.as_object_mut().unwrap().remove(timing);
            }
            line
        })
        .collect()
}

/// A job on the trap-at-step plugin, whose episodes with a seed that is a multiple of
/// `trap_every` trap: 2 RL steps of 2 groups of `group_size`, failure reward -1, `rl_extra` added
/// to its `[rl]` section.
fn trap_job(trap_every: u64, group_size: usize, rl_extra: &str) -> String {
    let wasm = built_plugin("adversarial/trap-at-step");
    format!(
        r#"
[model]
init_tiny = {{ seed = 5 }}
[environment]
plugin = {wasm:?}
config = {{ trap_every = {trap_every} }}
[rl]
steps = 2
groups_per_batch = 2
group_size = {group_size}
max_turns = 4
max_tokens = 3
failure_reward = -1.0
{rl_extra}
[eval]
episodes = 4
"#
    )
}

#[test]
fn an_async_job_whose_environment_traps_on_some_episodes_finishes_and_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("traps.toml");
    std::fs::write(&job, trap_job(2, 4, "mode = \"async\"\n")).unwrap();
    let out = dir.path().join("run");
    let summary = train_json(&job, &out);
    assert_eq!(summary["steps"], 2);
    let lines = metric_lines(&out);
    assert_eq!(lines.len(), 2);
    // Async (lag limit 1): the second batch was sampled while the first step trained, one
    // version behind.
    assert_eq!(lines[0]["policy_lag"], 0);
    assert_eq!(lines[1]["policy_lag"], 1);
    for line in &lines {
        // Episode seeds alternate parity within a group: half of the 8 episodes trap.
        assert_eq!(line["errors"]["trap"], 4, "{line}");
        assert!(line["tokens"].as_u64().unwrap() > 0, "{line}");
    }
    let rollouts = std::fs::read_to_string(out.join("rollouts/step-1.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = rollouts
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 8);
    for record in &records {
        let trapped = record["error"] == "trap";
        assert_eq!(
            trapped,
            record["seed"].as_u64().unwrap() % 2 == 0,
            "{record}"
        );
        // A trapped episode gets the failure reward; the others 0.5 for each of 4 steps.
        let expected = if trapped { -1.0 } else { 2.0 };
        assert_eq!(record["returns"][0], expected, "{record}");
    }
}

#[test]
fn async_groups_older_than_the_lag_limit_are_resampled_or_dropped_and_counted() {
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, mode: &str| -> PathBuf {
        let job = dir.path().join(format!("{name}.toml"));
        let rest = format!(
            "[rl]
steps = 3
groups_per_batch = 2
group_size = 3
max_turns = 1
max_tokens = 6
{mode}
[eval]
episodes = 2
"
        );
        std::fs::write(&job, arithmetic_job(&wasm, 3, &rest)).unwrap();
        let out = dir.path().join(name);
        train_json(&job, &out);
        out
    };
    let sync = run("sync", "");
    let resampled = run("resampled", "mode = \"async\"\nmax_policy_lag = 0");
    let dropped = run(
        "dropped",
        "mode = \"async\"\nmax_policy_lag = 0\nstale = \"drop\"",
    );
    // With a lag limit of 0, the groups launched while a step trains are a version old when
    // the next step wants them: both of every later batch are stale.
    for out in [&resampled, &dropped] {
        let lines = metric_lines(out);
        let stale: Vec<u64> = lines
            .iter()
            .map(|l| l["stale_groups"].as_u64().unwrap())
            .collect();
        assert_eq!(stale, [0, 2, 2], "{}", out.display());
        assert!(lines.iter().all(|l| l["policy_lag"] == 0));
    }
    // Resampled with the current policy, they are the very groups sync mode plays.
    let without_stale = |out: &Path| -> Vec<serde_json::Value> {
        let mut lines = metric_lines(out);
        for line in &mut lines {
            line.as_object_mut().unwrap().remove("stale_groups");
        }
        lines
    };
    assert_eq!(without_stale(&resampled), without_stale(&sync));
    let rollouts = |out: &Path, step: usize| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(out.join(format!("rollouts/step-{step}.jsonl")));
        text.unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    for step in 0..3 {
        assert_eq!(
            rollouts(&resampled, step),
            rollouts(&sync, step),
            "step {step}"
        );
    }
    // Dropped, their tasks give way to new ones.
    let seeds = |out: &Path, step: usize| -> Vec<u64> {
        let mut seeds: Vec<u64> = rollouts(out, step)
            .iter()
            .map(|r| r["seed"].as_u64().unwrap())
            .collect();
        seeds.dedup();
        seeds
    };
    assert_eq!(seeds(&dropped, 0), seeds(&sync, 0));
    assert_ne!(seeds(&dropped, 1), seeds(&sync, 1));
}

/// The metric lines the newest whole checkpoint (or the saved warm-up base) of a run covers.
fn covered_metric_lines(out: &Path) -> usize {
    let read = |path: PathBuf| -> Option<usize> {
        let text = std::fs::read_to_string(path).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["metric_lines"].as_u64().map(|n| n as usize)
    };
    let newest = std::fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let steps: usize = path
                .file_name()?
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            Some((steps, read(path.join("cursor.json"))?))
        })
        .max();
    newest
        .map(|(_, lines)| lines)
        .or_else(|| read(out.join("base/warmup.json")))
        .unwrap_or(0)
}

#[test]
fn a_run_killed_at_random_moments_resumes_to_the_same_metrics() {
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("resume.toml");
    let rest = r#"[sft]
source = "demonstrations"
steps = 3
batch = 8
[rl]
steps = 8
groups_per_batch = 2
group_size = 4
max_turns = 1
max_tokens = 6
skip_equal_groups = false
kl_coef = 0.05
[eval]
every = 3
episodes = 8
[checkpoint]
every = 1
"#;
    std::fs::write(&job, arithmetic_job(&wasm, 7, rest)).unwrap();
    let whole = dir.path().join("whole");
    let started = Instant::now();
    let summary = train_json(&job, &whole);
    let job = job.to_str().unwrap();
    let run_time = started.elapsed();
    let expected = metric_lines(&whole);
    assert_eq!(expected.len(), 3 + 8);
    for line in &expected[3..] {
        assert!(line["kl"].as_f64().is_some_and(f64::is_finite), "{line}");
        assert!(line["entropy"].as_f64().unwrap() > 0.0, "{line}");
    }
    // The first step samples from the reference itself.
    assert!(
        expected[3]["kl"].as_f64().unwrap().abs() < 1e-3,
        "{}",
        expected[3]
    );

    // Kill the run three times at random moments, resuming after each, then let it finish.
    let killed = dir.path().join("killed");
    std::fs::create_dir(&killed).unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut rng = u64::from(seed) | 1;
    let mut delays = Vec::new();
    for attempt in 0..3 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = run_time.mul_f64((rng % 1000) as f64 / 1000.0);
        delays.push(delay);
        let flag = if attempt == 0 { "--out" } else { "--resume" };
        let mut child = Command::new(env!("CARGO_BIN_EXE_opentinker"))
            .args(["train", job, flag, killed.to_str().unwrap()])
            .env("OPENTINKER_CACHE_DIR", cache_dir())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SIGKILL: no chance to clean up.
        let _ = child.kill();
        let _ = child.wait();
    }
    let covered = covered_metric_lines(&killed);
    let last = opentinker(&["train", job, "--resume", killed.to_str().unwrap(), "--json"]);
    let resumed = json(&last);
    let progress_lines = String::from_utf8_lossy(&last.stderr)
        .lines()
        .filter(|l| l.starts_with("resume "))
        .count();
    assert_eq!(
        progress_lines,
        expected.len() - covered,
        "the resumed run redid steps its checkpoint covers"
    );
    assert_eq!(
        metric_lines(&killed),
        expected,
        "kills after {delays:?} (of a {run_time:?} run)"
    );
    assert_eq!(resumed["final_eval"], summary["final_eval"]);
    assert_eq!(resumed["initial_eval"], summary["initial_eval"]);
    let adapter = |out: &Path| {
        std::fs::read(out.join("checkpoints/final/adapter_model.safetensors")).unwrap()
    };
    assert_eq!(adapter(&killed), adapter(&whole), "kills after {delays:?}");
    for step in 0..8 {
        let file = format!("rollouts/step-{step}.jsonl");
        assert_eq!(
            std::fs::read(killed.join(&file)).unwrap(),
            std::fs::read(whole.join(&file)).unwrap(),
            "{file}"
        );
    }
}

/// `examples/*.toml` and the defaults-only jobs of `examples/defaults/` cut down to a few steps,
/// with their plugin paths made absolute.
fn short_examples(into: &Path) -> Vec<PathBuf> {
    let examples = repo_root().join("examples");
    let mut files = Vec::new();
    for (folder, prefix) in [
        (examples.clone(), ""),
        (examples.join("defaults"), "defaults-"),
    ] {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let name = path.file_name().unwrap().to_str().unwrap();
            let short = into.join(format!("{prefix}{name}"));
            std::fs::write(&short, short_job(&path)).unwrap();
            files.push(short);
        }
    }
    files.sort();
    files
}

/// The job file `path` cut down to a few steps: a defaults-only job gets the `[sft]` (its
/// implied warm-up on demonstrations), `[rl]` and `[eval]` sections it leaves out, at the same
/// sizes.
fn short_job(path: &Path) -> String {
    let folder = path.parent().unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let mut job: toml::Table = text.parse().unwrap();
    if job.contains_key("environment") {
        if !job.contains_key("sft") && !job.contains_key("rl") {
            job.insert(
                "sft".into(),
                toml::toml! { source = "demonstrations" }.into(),
            );
        }
        for section in ["rl", "eval"] {
            job.entry(section)
                .or_insert_with(|| toml::Table::new().into());
        }
    }
    let mut set = |section: &str, key: &str, value: toml::Value| {
        if let Some(table) = job.get_mut(section).and_then(|s| s.as_table_mut()) {
            table.insert(key.into(), value);
        }
    };
    set("sft", "steps", 2.into());
    set("sft", "batch", 4.into());
    set("sft", "eval_every", 1.into());
    set("rl", "steps", 2.into());
    set("rl", "groups_per_batch", 2.into());
    set("rl", "group_size", 2.into());
    set("eval", "episodes", 4.into());
    set("eval", "every", 1.into());
    job.insert("checkpoint".into(), toml::toml! { every = 1 }.into());
    let absolute = |table: &mut toml::Table| {
        let plugin = table["plugin"].as_str().unwrap();
        let absolute = folder.join(plugin).canonicalize().unwrap();
        table.insert("plugin".into(), absolute.to_str().unwrap().into());
    };
    for section in ["environment", "agent", "reward"] {
        if let Some(table) = job.get_mut(section).and_then(|s| s.as_table_mut()) {
            absolute(table);
        }
    }
    // `[rl] loss` and `advantage` name plugins as tables (a built-in loss is a string).
    if let Some(rl) = job.get_mut("rl").and_then(|s| s.as_table_mut()) {
        for key in ["loss", "advantage"] {
            if let Some(table) = rl.get_mut(key).and_then(|v| v.as_table_mut()) {
                absolute(table);
            }
        }
    }
    if let Some(sft) = job.get_mut("sft").and_then(|s| s.as_table_mut()) {
        let source = sft["source"].as_str().unwrap();
        if source != "demonstrations" {
            let absolute = folder.join(source).canonicalize().unwrap();
            sft.insert("source".into(), absolute.to_str().unwrap().into());
        }
    }
    toml::to_string(&job).unwrap()
}

#[test]
fn every_example_runs_a_few_steps_in_one_process_and_writes_complete_files() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = short_examples(dir.path());
    assert!(jobs.len() >= 3, "{jobs:?}");
    let out = dir.path().join("runs");
    let mut args = vec!["train".to_string()];
    args.extend(jobs.iter().map(|j| j.to_str().unwrap().to_string()));
    args.extend([
        "--out".into(),
        out.to_str().unwrap().into(),
        "--json".into(),
    ]);
    let output = opentinker(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summaries: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(summaries.len(), jobs.len());
    for (job, summary) in jobs.iter().zip(&summaries) {
        let name = job.file_stem().unwrap().to_str().unwrap();
        let run = out.join(name);
        assert_eq!(summary["out"], run.to_str().unwrap(), "{name}");
        assert_eq!(summary["steps"], 2, "{name}");
        let checkpoint = PathBuf::from(summary["checkpoint"].as_str().unwrap());
        // A multi-agent job has one adapter folder per policy.
        let policies: Vec<String> = match summary["policies"].as_object() {
            Some(policies) => policies.keys().cloned().collect(),
            None => Vec::new(),
        };
        let finals: Vec<PathBuf> = match policies.is_empty() {
            true => vec![checkpoint.clone()],
            false => policies.iter().map(|p| checkpoint.join(p)).collect(),
        };
        for adapter in &finals {
            assert!(
                adapter.join("adapter_model.safetensors").is_file(),
                "{name}"
            );
        }
        let report = std::fs::read(run.join("report.png")).unwrap();
        assert_eq!(&report[1..4], b"PNG", "{name}");
        let lines = metric_lines(&run);
        for line in &lines {
            for key in ["reward_mean", "reward_std", "episode_steps", "loss"] {
                assert!(line[key].as_f64().unwrap().is_finite(), "{name}: {line}");
            }
            assert!(line["errors"].is_object(), "{name}: {line}");
        }
        let text = std::fs::read_to_string(job).unwrap();
        if !text.contains("[rl]") {
            // An SFT job: two steps, each evaluated on the held-out conversations.
            assert_eq!(lines.len(), 2, "{name}");
            assert!(
                lines
                    .iter()
                    .all(|l| l["phase"] == "sft" && l["eval"]["loss"].is_number())
            );
            assert!(
                summary["final_eval"]["loss"].as_f64().unwrap() > 0.0,
                "{name}"
            );
            continue;
        }
        let rl: Vec<_> = lines.iter().filter(|l| l["phase"] == "rl").collect();
        assert_eq!(rl.len(), 2, "{name}");
        for policy in &policies {
            assert!(
                rl.iter()
                    .all(|l| l["policy_evals"][policy]["success_rate"].is_number())
            );
            assert!(
                rl.iter().all(|l| l["policy_rewards"][policy].is_number()),
                "{name}"
            );
        }
        assert!(
            rl.iter().all(|l| l["eval"]["success_rate"].is_number()),
            "{name}"
        );
        for eval in ["initial_eval", "final_eval"] {
            assert_eq!(summary[eval]["episodes"], 4, "{name}: {summary}");
            assert!(summary[eval]["success_rate"].is_number(), "{name}");
        }
        for step in 0..2 {
            let rollouts =
                std::fs::read_to_string(run.join(format!("rollouts/step-{step}.jsonl"))).unwrap();
            let records: Vec<serde_json::Value> = rollouts
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(records.len(), 4, "{name}: 2 groups of 2");
            for record in &records {
                assert!(
                    record["messages"][0]
                        .as_array()
                        .is_some_and(|m| !m.is_empty())
                );
                for sequence in record["sequences"].as_array().unwrap() {
                    let tokens = sequence["tokens"].as_array().unwrap().len();
                    assert_eq!(sequence["mask"].as_array().unwrap().len(), tokens);
                    assert_eq!(sequence["advantages"].as_array().unwrap().len(), tokens);
                }
            }
            let checkpoint = run.join(format!("checkpoints/step-{}", step + 1));
            assert!(checkpoint.join("cursor.json").is_file(), "{name}");
            let adapters = match policies.is_empty() {
                true => vec!["policy".to_string()],
                false => policies.clone(),
            };
            for adapter in adapters {
                let adapter = checkpoint.join(adapter);
                assert!(
                    adapter.join("adapter_model.safetensors").is_file(),
                    "{name}"
                );
                assert!(adapter.join("optimizer.safetensors").is_file(), "{name}");
            }
        }
    }
}

#[test]
fn a_job_whose_plugin_always_fails_stops_itself_and_the_other_job_runs_as_it_runs_alone() {
    let (arithmetic, bad) = (
        built_plugin("arithmetic"),
        built_plugin("adversarial/bad-output"),
    );
    let dir = tempfile::tempdir().unwrap();
    let rest = |steps: usize| {
        format!(
            "[rl]\nsteps = {steps}\ngroups_per_batch = 2\ngroup_size = 3\nmax_turns = 1\n\
             max_tokens = 6\nskip_equal_groups = false\n[eval]\nepisodes = 4\n"
        )
    };
    let good = dir.path().join("good.toml");
    std::fs::write(&good, arithmetic_job(&arithmetic, 3, &rest(4))).unwrap();
    // Every step of bad-output returns a NaN reward: each episode ends as invalid_output.
    let failing = dir.path().join("failing.toml");
    std::fs::write(&failing, arithmetic_job(&bad, 3, &rest(8))).unwrap();

    let solo = train_json(&good, &dir.path().join("solo"));
    let out = dir.path().join("both");
    let output = opentinker(&[
        "train",
        good.to_str().unwrap(),
        failing.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("failing: failed")
            && stderr.contains("stopped at RL step 0: every episode of the step failed (6)")
            && stderr.contains("invalid_output")
            && stderr.contains("1 of 2 jobs failed: failing"),
        "{stderr}"
    );
    // The progress lines show the evaluation before RL and the failures with their text.
    assert!(
        stderr.contains("before RL: reward 0.000 success 0.000 (4 failed)")
            && stderr.contains("failed: invalid_output 6 (first: seed "),
        "{stderr}"
    );
    // The plugin's own words travel with the failure: in the error, the metrics and the rollouts.
    assert!(
        stderr.contains("step returned a reward of NaN") && stderr.contains("the first, seed "),
        "{stderr}"
    );
    let failed_lines = metric_lines(&out.join("failing"));
    assert!(
        failed_lines
            .iter()
            .any(|line| line["error_messages"]["invalid_output"]
                .as_str()
                .is_some_and(|m| m.contains("reward of NaN"))),
        "{failed_lines:?}"
    );
    // Its evaluation before RL counts the failures by kind.
    let initial = &failed_lines[0]["initial_evals"];
    let first_policy = initial.as_object().unwrap().values().next().unwrap();
    assert_eq!(first_policy["errors"]["invalid_output"], 4, "{initial}");
    let rollouts = std::fs::read_to_string(out.join("failing/rollouts/step-0.jsonl")).unwrap();
    assert!(rollouts.contains(r#""error_message":"step returned a reward of NaN""#));
    // With --json, the good job's summary and the failed job's error, one line each.
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let [summary, failure] = lines.as_slice() else {
        panic!("{lines:?}")
    };
    assert_eq!(failure["job"], "failing");
    assert!(
        failure["error"]
            .as_str()
            .is_some_and(|e| e.contains("reward of NaN") && e.contains("seed ")),
        "{failure}"
    );
    assert_eq!(summary["steps"], 4);
    let both_good = PathBuf::from(summary["out"].as_str().unwrap());
    let solo_out = PathBuf::from(solo["out"].as_str().unwrap());
    assert_eq!(metric_lines(&both_good), metric_lines(&solo_out));
    assert_eq!(summary["final_eval"], solo["final_eval"]);
}

#[test]
fn a_missing_plugin_path_fails_before_any_model_file_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("typo.toml");
    let missing = dir.path().join("no-such-plugin.wasm");
    std::fs::write(&job, arithmetic_job(&missing, 3, "[rl]\nsteps = 1\n")).unwrap();
    let out = dir.path().join("run");
    let stderr = train_refused(&job, &out);
    assert!(
        stderr.contains("[environment] plugin") && stderr.contains("no-such-plugin.wasm"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("no-such-plugin.wasm").count(),
        1,
        "said once: {stderr}"
    );
    assert!(!out.exists(), "nothing is written: {stderr}");
}

#[test]
fn play_shows_the_final_evaluation_and_replay_reproduces_a_recorded_episode() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = short_examples(dir.path());
    let job = jobs
        .iter()
        .find(|j| j.file_name().is_some_and(|n| n == "tictactoe.toml"))
        .expect("the tic-tac-toe example");
    let out = dir.path().join("run");
    let summary = train_json(job, &out);
    let (job, run) = (job.to_str().unwrap(), out.to_str().unwrap());

    // Greedy play of the final adapter on the evaluation's seeds is the final evaluation.
    let output = opentinker(&["play", job, "--run", run, "--greedy", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (played, episodes) = lines.split_last().unwrap();
    assert_eq!(played["summary"], summary["final_eval"], "{played}");
    assert_eq!(episodes.len(), 4);
    assert!(
        episodes
            .iter()
            .all(|e| e["messages"][0].as_array().is_some_and(|m| m.len() >= 2)),
        "each game is shown: {episodes:?}"
    );
    // The same, printed for a person.
    let output = opentinker(&["play", job, "--run", run, "--greedy", "--episodes", "1"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("episode 1/1") && stdout.contains("assistant: "),
        "{stdout}"
    );

    // A recorded training episode comes back token for token from its seed...
    let rollouts = out.join("rollouts/step-1.jsonl");
    let replay = |file: &Path| opentinker(&["replay", file.to_str().unwrap(), "--index", "1"]);
    let output = replay(&rollouts);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("reproduced step 1 group 0 episode 1"),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // ...and an edited record is caught, naming what differs.
    let text = std::fs::read_to_string(&rollouts).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tokens = lines[1]["sequences"][0]["tokens"].as_array_mut().unwrap();
    let last = tokens.len() - 2;
    tokens[last] = (tokens[last].as_u64().unwrap() ^ 1).into();
    let edited: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&rollouts, edited).unwrap();
    let output = replay(&rollouts);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("did not reproduce the record")
            && stderr.contains(&format!("at token {last}")),
        "{stderr}"
    );
    // A step the run did not checkpoint cannot be replayed, and says so.
    std::fs::remove_dir_all(out.join("checkpoints/step-1")).unwrap();
    std::fs::write(&rollouts, text).unwrap();
    let stderr = String::from_utf8_lossy(&replay(&rollouts).stderr).into_owned();
    assert!(stderr.contains("did not checkpoint"), "{stderr}");
}

#[test]
fn a_job_whose_plugin_fails_one_episode_in_seven_trains_and_shows_the_plugins_words() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("sometimes.toml");
    std::fs::write(&job, trap_job(7, 7, "")).unwrap();
    let out = dir.path().join("run");
    let output = opentinker(&[
        "train",
        job.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let lines = metric_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let trapped: u64 = lines
        .iter()
        .map(|l| l["errors"]["trap"].as_u64().unwrap_or(0))
        .sum();
    assert!((1..=6).contains(&trapped), "about 1 in 7 of 28: {lines:?}");
    assert!(
        lines.iter().all(|l| l["tokens"].as_u64().unwrap() > 0),
        "{lines:?}"
    );
    // The plugin's own words: in the metrics, the rollouts and the terminal.
    let message = lines
        .iter()
        .find_map(|l| l["error_messages"]["trap"].as_str())
        .expect("a trap's message in the metrics")
        .to_string();
    assert!(!message.is_empty());
    let rollouts: String = (0..2)
        .map(|s| std::fs::read_to_string(out.join(format!("rollouts/step-{s}.jsonl"))).unwrap())
        .collect();
    assert!(rollouts.contains(r#""error":"trap""#), "{rollouts}");
    assert!(rollouts.contains(r#""error_message":""#), "{rollouts}");
    let first_line = message.lines().next().unwrap_or_default();
    assert!(
        stderr.contains("failed: trap")
            && stderr.contains("(first: seed ")
            && stderr.contains(first_line),
        "{first_line}: {stderr}"
    );
}

#[test]
fn a_plugin_of_the_wrong_kind_fails_before_any_model_file_is_written() {
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("mixed-up.toml");
    // The arithmetic environment named as the agent.
    let rest = format!("[agent]\nplugin = {wasm:?}\n[rl]\nsteps = 1\n");
    std::fs::write(&job, arithmetic_job(&wasm, 3, &rest)).unwrap();
    let out = dir.path().join("run");
    let stderr = train_refused(&job, &out);
    assert!(
        stderr.contains("job `mixed-up`: [agent] plugin")
            && stderr.contains("is not an agent plugin (it implements: environment)"),
        "{stderr}"
    );
    assert!(
        !out.join("model").exists() && !out.join("metrics.jsonl").exists(),
        "no model generated: {stderr}"
    );
}

#[test]
fn a_config_that_breaks_the_plugins_schema_fails_before_any_model_file_is_written() {
    let wasm = built_plugin("tictactoe");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("misspelt.toml");
    let text = format!(
        "[model]\ninit_tiny = {{ seed = 3 }}\n[environment]\nplugin = {wasm:?}\n\
         config = {{ oponent = \"random\", demonstrations = \"best\" }}\n[rl]\nsteps = 1\n"
    );
    std::fs::write(&job, text).unwrap();
    let out = dir.path().join("run");
    let stderr = train_refused(&job, &out);
    assert!(
        stderr.contains("job `misspelt`: [environment] config")
            && stderr.contains("oponent")
            && stderr.contains("`demonstrations`")
            && stderr.contains("best"),
        "{stderr}"
    );
    assert!(
        !out.join("model").exists() && !out.join("metrics.jsonl").exists(),
        "no model generated: {stderr}"
    );
}

#[test]
fn plugin_run_samples_each_error_kinds_messages() {
    let wasm = built_plugin("adversarial/trap-at-step");
    let output = opentinker(&[
        "plugin",
        "run",
        wasm.to_str().unwrap(),
        "--episodes",
        "6",
        "--json",
    ]);
    let summary = json(&output);
    assert_eq!(summary["errors"]["trap"], 6, "{summary}");
    let sampled = summary["error_messages"]["trap"].as_array().unwrap();
    // Every trap has the same words: one distinct message, with its first episode's seed.
    assert_eq!(sampled.len(), 1, "{summary}");
    assert_eq!(sampled[0]["seed"], 0);
    assert!(
        sampled[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unreachable")),
        "{summary}"
    );
}

/// The learning check: the main example as it is (its warm-up stopped by its plateau rule, then
/// 60 RL steps), evaluated on 100 games before and after RL only, must raise the greedy win rate
/// by at least 0.15 through RL alone (measured: +0.265 to +0.28 on 200 games for RL seeds 0-2,
/// examples/LEARNING.md). A change that breaks learning (the losses, the advantages, the
/// sampler's logprobs, the adapter's update) fails here.
#[test]
fn rl_raises_the_main_examples_greedy_win_rate_by_at_least_0_15() {
    let examples = repo_root().join("examples");
    let text = std::fs::read_to_string(examples.join("tictactoe.toml")).unwrap();
    let mut job: toml::Table = text.parse().unwrap();
    for section in ["environment", "agent"] {
        let table = job[section].as_table_mut().unwrap();
        let plugin = examples.join(table["plugin"].as_str().unwrap());
        let plugin = plugin.canonicalize().unwrap();
        table.insert("plugin".into(), plugin.to_str().unwrap().into());
    }
    job.insert(
        "eval".into(),
        toml::toml! { every = 0 episodes = 100 }.into(),
    );
    job.insert("checkpoint".into(), toml::toml! { every = 0 }.into());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tictactoe.toml");
    std::fs::write(&file, toml::to_string(&job).unwrap()).unwrap();
    let summary = train_json(&file, &dir.path().join("run"));
    let (before, after) = (
        summary["initial_eval"]["success_rate"].as_f64().unwrap(),
        summary["final_eval"]["success_rate"].as_f64().unwrap(),
    );
    assert_eq!(summary["steps"], 60, "{summary}");
    assert!(
        after - before >= 0.15,
        "RL took the greedy win rate from {before} to {after} (at least +0.15 expected): {summary}"
    );
}

#[test]
fn a_job_whose_rewards_ignore_the_actions_is_reported_as_having_no_signal() {
    // trap-at-step pays 0.5 a step whatever the action; with a trap period no seed of this job
    // reaches, every episode returns the same.
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("unlearnable.toml");
    std::fs::write(&job, trap_job(1_000_000_007, 4, "seed = 1\n")).unwrap();
    let summary = train_json(&job, &dir.path().join("run"));
    let diagnosis = summary["diagnosis"].as_str().expect("a diagnosis");
    assert!(
        diagnosis.contains("did not improve")
            && diagnosis.contains("100% of groups tied")
            && diagnosis.contains("Likely cause: no signal")
            && diagnosis.contains("rl.group_size"),
        "{diagnosis}"
    );
    for line in metric_lines(&dir.path().join("run")) {
        assert_eq!(line["tied_groups"], 1.0, "{line}");
        assert_eq!(line["advantage_abs_mean"], 0.0, "{line}");
    }
}

/// The guess-number port in `plugins/PORT` builds and plays 200 episodes as `name`; its errors
/// are its episodes' own `plugin_error`s, with their text. Returns its component.
fn a_port_builds_plays_and_reports_its_own_errors(port: &str, name: &str) -> PathBuf {
    let wasm = built_plugin(port);
    let path = wasm.to_str().unwrap();
    let summary = json(&opentinker(&[
        "plugin",
        "run",
        path,
        "--episodes",
        "200",
        "--json",
    ]));
    assert_eq!(summary["plugin"], name, "{summary}");
    assert_eq!(summary["completed"], 200, "{summary}");
    assert!(summary["mean_reward"].as_f64().unwrap() > 0.05, "{summary}");

    let summary = json(&opentinker(&[
        "plugin",
        "run",
        path,
        "--episodes",
        "4",
        "--config",
        r#"{"maxx": 5}"#,
        "--json",
    ]));
    assert_eq!(summary["errors"]["plugin_error"], 4, "{summary}");
    let message = summary["error_messages"]["plugin_error"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("unknown config field `maxx`"), "{summary}");
    wasm
}

/// The guess-number example with only its environment swapped for the port in `plugins/PORT`
/// runs its RL steps, and its rollouts carry the port's words.
fn the_guess_number_example_runs_on(port: &str) {
    let dir = tempfile::tempdir().unwrap();
    let job = short_examples(dir.path())
        .into_iter()
        .find(|job| job.file_stem().is_some_and(|s| s == "guess-number"))
        .unwrap();
    let mut table: toml::Table = std::fs::read_to_string(&job).unwrap().parse().unwrap();
    let plugin = repo_root().join("plugins").join(port);
    table["environment"]
        .as_table_mut()
        .unwrap()
        .insert("plugin".into(), plugin.to_str().unwrap().into());
    std::fs::write(&job, toml::to_string(&table).unwrap()).unwrap();
    let out = dir.path().join("run");
    let summary = train_json(&job, &out);
    assert_eq!(summary["steps"], 2, "{summary}");
    let rollouts = std::fs::read_to_string(out.join("rollouts").join("step-1.jsonl")).unwrap();
    assert!(
        rollouts.contains("I am thinking of a number from 1 to 16"),
        "{rollouts}"
    );
}

/// Whether the test script's componentize-py is here (`OPENTINKER_COMPONENTIZE_PY`): a strict
/// run fails without it, another skips and counts the skip.
fn componentize_py_present() -> bool {
    opentinker_test_tools::componentize_py().is_some()
}

/// Whether the test script's JavaScript toolchain is here (`OPENTINKER_JS_TOOLCHAIN`), as above.
fn js_toolchain_present() -> bool {
    opentinker_test_tools::js_toolchain().is_some()
}

/// A Python plugin (`plugins/python/guess-number`, on the Python SDK) builds with the test
/// script's componentize-py, plays, and reports its exceptions as its episodes' own errors.
#[test]
fn a_python_plugin_builds_plays_and_reports_its_own_errors() {
    if componentize_py_present() {
        a_port_builds_plays_and_reports_its_own_errors("python/guess-number", "guess-number-py");
    }
}

/// The guess-number example runs its RL steps on the Python port.
#[test]
fn the_guess_number_example_runs_on_its_python_port() {
    if componentize_py_present() {
        the_guess_number_example_runs_on("python/guess-number");
    }
}

/// A JavaScript plugin (`plugins/js/guess-number`, on the JavaScript SDK) builds with the test
/// script's toolchain, plays, and reports its errors as its episodes' own; `plugin inspect` shows
/// its metadata and config schema.
#[test]
fn a_javascript_plugin_builds_plays_and_reports_its_own_errors() {
    if !js_toolchain_present() {
        return;
    }
    let wasm = a_port_builds_plays_and_reports_its_own_errors("js/guess-number", "guess-number-js");
    let described = json(&opentinker(&["plugin", "inspect", wasm.to_str().unwrap()]));
    assert_eq!(described["wit_version"], "0.3.0", "{described}");
    assert_eq!(described["metadata"]["language"], "javascript");
    assert_eq!(described["metadata"]["license"], "Apache-2.0");
    assert_eq!(
        described["metadata"]["config_schema"]["properties"]["turns"],
        serde_json::json!({"type": "number", "default": 10}),
        "{described}"
    );
}

/// The guess-number example runs its RL steps on the JavaScript port.
#[test]
fn the_guess_number_example_runs_on_its_javascript_port() {
    if js_toolchain_present() {
        the_guess_number_example_runs_on("js/guess-number");
    }
}

/// The templates `plugin new` wrote into `dir` as `PREFIX-environment`, `PREFIX-agent` and
/// `PREFIX-reward`: the environment plays 200 episodes, and the agent and the reward build into
/// 0.2 components that say what they are.
fn templates_play_and_say_what_they_are(dir: &Path, prefix: &str, language: &str) {
    let environment = dir.join(format!("{prefix}-environment"));
    let summary = json(&opentinker(&[
        "plugin",
        "run",
        environment.to_str().unwrap(),
        "--episodes",
        "200",
        "--json",
    ]));
    assert_eq!(
        (summary["plugin"].as_str(), summary["completed"].as_u64()),
        (Some(format!("{prefix}-environment").as_str()), Some(200)),
        "{summary}"
    );
    for kind in ["agent", "reward"] {
        let plugin = dir.join(format!("{prefix}-{kind}"));
        let described = json(&opentinker(&[
            "plugin",
            "inspect",
            plugin.to_str().unwrap(),
        ]));
        assert_eq!(described["kinds"], serde_json::json!([kind]), "{described}");
        assert_eq!(described["metadata"]["name"], format!("{prefix}-{kind}"));
        assert_eq!(described["metadata"]["language"], language);
    }
}

/// `plugin new --lang js` writes plugins of each kind whose tests pass in Node's test runner,
/// which build, and which play (the environment) or say what they are (the agent and reward).
#[test]
fn plugin_new_writes_javascript_plugins_that_test_build_and_play_as_written() {
    if !js_toolchain_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sdk = repo_root().join("sdk/js");
    for kind in ["environment", "agent", "reward"] {
        let plugin = dir.path().join(format!("js-{kind}"));
        let written = opentinker(&[
            "plugin",
            "new",
            &format!("js-{kind}"),
            "--lang",
            "js",
            "--kind",
            kind,
            "--dir",
            plugin.to_str().unwrap(),
            "--sdk",
            sdk.to_str().unwrap(),
        ]);
        assert!(
            written.status.success(),
            "{}",
            String::from_utf8_lossy(&written.stderr)
        );
        // The SDK is a `file:` dependency: npm links it, with no registry.
        let installed = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--no-package-lock",
                "--offline",
            ])
            .current_dir(&plugin)
            .output()
            .unwrap();
        assert!(
            installed.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
        let tested = Command::new("node")
            .args(["--test", "test/"])
            .current_dir(&plugin)
            .output()
            .unwrap();
        assert!(
            tested.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&tested.stdout)
        );
    }
    templates_play_and_say_what_they_are(dir.path(), "js", "javascript");
}

/// `plugin new` writes plugins whose own tests pass in their language's runner and which build
/// and play as written; it refuses a bad name and a folder that is not empty.
#[test]
fn plugin_new_writes_plugins_that_test_build_and_play_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let sdk = repo_root().join("sdk/rust");
    let rust = dir.path().join("word-rs");
    let (rust_dir, sdk) = (rust.to_str().unwrap(), sdk.to_str().unwrap());
    let written = opentinker(&["plugin", "new", "word-rs", "--dir", rust_dir, "--sdk", sdk]);
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let tested = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["test", "--quiet", "--manifest-path"])
        .arg(rust.join("Cargo.toml"))
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    assert!(
        tested.status.success(),
        "{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let summary = json(&opentinker(&[
        "plugin",
        "run",
        rust_dir,
        "--episodes",
        "200",
        "--json",
    ]));
    assert_eq!(
        (summary["plugin"].as_str(), summary["completed"].as_u64()),
        (Some("word-rs"), Some(200))
    );

    let again = opentinker(&["plugin", "new", "word-rs", "--dir", rust_dir, "--sdk", sdk]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not empty"));
    let bad = opentinker(&["plugin", "new", "Word RS", "--dir", rust_dir]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lowercase letters"));

    let (Some(python), Some(_)) = (
        opentinker_test_tools::test_python(),
        opentinker_test_tools::componentize_py(),
    ) else {
        return;
    };
    for kind in ["environment", "agent", "reward"] {
        let plugin = dir.path().join(format!("py-{kind}"));
        let written = opentinker(&[
            "plugin",
            "new",
            &format!("py-{kind}"),
            "--lang",
            "python",
            "--kind",
            kind,
            "--dir",
            plugin.to_str().unwrap(),
        ]);
        assert!(
            written.status.success(),
            "{}",
            String::from_utf8_lossy(&written.stderr)
        );
        let tested = Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&plugin)
            .env(
                "PYTHONPATH",
                format!("{}:.", repo_root().join("sdk/python/src").display()),
            )
            .output()
            .unwrap();
        assert!(
            tested.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&tested.stdout)
        );
    }
    templates_play_and_say_what_they_are(dir.path(), "py", "python");
}

/// The centred rank in [-1, 1] of each of `returns` (ties share their mean rank): what the
/// `rank-advantage` plugin answers.
fn centred_ranks(returns: &[f64]) -> Vec<f64> {
    let n = returns.len();
    returns
        .iter()
        .map(|r| {
            let below = returns.iter().filter(|o| *o < r).count() as f64;
            let equal = returns.iter().filter(|o| *o == r).count() as f64;
            match n {
                0 | 1 => 0.0,
                _ => 2.0 * (below + (equal - 1.0) / 2.0) / (n - 1) as f64 - 1.0,
            }
        })
        .collect()
}

#[test]
fn a_job_with_an_advantage_plugin_trains_on_the_plugins_advantages() {
    let dir = tempfile::tempdir().unwrap();
    // sort-digits gives partial credit, so a barely warmed-up policy's groups differ.
    let environment = built_plugin("sort-digits");
    let rank = built_plugin("rank-advantage");
    let job_with = |estimator: &Path| {
        format!(
            "[model]\ninit_tiny = {{ seed = 3 }}\n[lora]\nrank = 4\n\
             [environment]\nplugin = {environment:?}\n\
             [sft]\nsource = \"demonstrations\"\nsteps = 2\n\
             [rl]\nsteps = 2\ngroups_per_batch = 8\ngroup_size = 4\n\
             advantage = {{ plugin = {estimator:?} }}\n[eval]\nepisodes = 4\n"
        )
    };
    let job = dir.path().join("ranked.toml");
    std::fs::write(&job, job_with(&rank)).unwrap();
    let out = dir.path().join("run");
    train_json(&job, &out);
    // Every trained group's sampled tokens carry the centred rank of their episode's return.
    let mut checked = 0;
    for step in 0..2 {
        let text =
            std::fs::read_to_string(out.join(format!("rollouts/step-{step}.jsonl"))).unwrap();
        let records: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for group in 0..8 {
            let members: Vec<&serde_json::Value> =
                records.iter().filter(|r| r["group"] == group).collect();
            let returns: Vec<f64> = members
                .iter()
                .map(|r| r["returns"][0].as_f64().unwrap())
                .collect();
            if returns.windows(2).all(|w| w[0] == w[1]) {
                continue;
            }
            for (record, expected) in members.iter().zip(centred_ranks(&returns)) {
                let sequence = &record["sequences"][0];
                let masked = sequence["mask"].as_array().unwrap().iter();
                for (mask, advantage) in masked.zip(sequence["advantages"].as_array().unwrap()) {
                    if mask == 1 {
                        let advantage = advantage.as_f64().unwrap();
                        assert!(
                            (advantage - expected).abs() < 1e-6,
                            "{advantage} vs {expected}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        checked > 0,
        "no group's returns differed: nothing was checked"
    );

    // A plugin of another kind is refused by name before any work.
    std::fs::write(&job, job_with(&environment)).unwrap();
    let refused = train_refused(&job, &dir.path().join("wrong"));
    assert!(
        refused.contains("[rl.advantage]") && refused.contains("not an advantage estimator"),
        "{refused}"
    );
}

#[test]
fn a_job_whose_loss_is_the_ppo_plugin_trains_as_the_built_in_ppo_does() {
    let dir = tempfile::tempdir().unwrap();
    let environment = built_plugin("sort-digits");
    let ppo = built_plugin("ppo-loss");
    let job_with = |loss: &str| {
        format!(
            "[model]\ninit_tiny = {{ seed = 3 }}\n[lora]\nrank = 4\n\
             [environment]\nplugin = {environment:?}\n\
             [sft]\nsource = \"demonstrations\"\nsteps = 2\n\
             [rl]\nsteps = 2\ngroups_per_batch = 8\ngroup_size = 4\nloss = {loss}\n\
             loss_config = {{ clip_high_threshold = 1.1 }}\n[eval]\nepisodes = 4\n"
        )
    };
    let mut losses = Vec::new();
    for (name, loss) in [
        ("built-in", "\"ppo\"".to_string()),
        ("plugin", format!("{{ plugin = {ppo:?} }}")),
    ] {
        let job = dir.path().join(format!("{name}.toml"));
        std::fs::write(&job, job_with(&loss)).unwrap();
        let out = dir.path().join(name);
        train_json(&job, &out);
        let rl: Vec<f64> = metric_lines(&out)
            .iter()
            .filter(|l| l["phase"] == "rl")
            .map(|l| l["loss"].as_f64().unwrap())
            .collect();
        assert_eq!(rl.len(), 2, "{name}");
        losses.push(rl);
    }
    // The first step samples the same episodes with the same adapter: the same loss.
    let (ours, theirs) = (losses[0][0], losses[1][0]);
    assert!(ours != 0.0, "the first step trained nothing");
    assert!(
        (ours - theirs).abs() <= 1e-5 * ours.abs(),
        "built-in {ours} vs plugin {theirs}"
    );

    // A plugin of another kind is refused by name; so is a config its schema refuses.
    let job = dir.path().join("wrong.toml");
    std::fs::write(&job, job_with(&format!("{{ plugin = {environment:?} }}"))).unwrap();
    let refused = train_refused(&job, &dir.path().join("wrong"));
    assert!(
        refused.contains("[rl.loss]") && refused.contains("not an objective"),
        "{refused}"
    );
    let bad_key =
        job_with(&format!("{{ plugin = {ppo:?} }}")).replace("clip_high_threshold", "clip");
    std::fs::write(&job, bad_key).unwrap();
    let refused = train_refused(&job, &dir.path().join("bad-key"));
    assert!(refused.contains("clip"), "{refused}");
}

/// A job on a real pretrained chat model read from its GGUF file: SmolLM2-135M-Instruct (the
/// test venv's package) warms up in full on the arithmetic demonstrations, which writes the
/// job's own base as a model directory (its tokenizer and chat template from the GGUF's
/// metadata), then takes one RL step of a LoRA adapter through the chat template, evaluated
/// before and after.
#[test]
fn train_runs_a_job_on_smollm2_from_its_gguf_file() {
    let Some(gguf) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let wasm = built_plugin("arithmetic");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("smollm2.toml");
    let text = format!(
        r#"
[model]
dir = {gguf:?}
[lora]
rank = 4
[environment]
plugin = {wasm:?}
config = {{ max_operand = 9 }}
[sft]
source = "demonstrations"
steps = 1
batch = 2
learning_rate = 1e-5
full_parameters = true
[rl]
steps = 1
groups_per_batch = 1
group_size = 2
max_turns = 1
max_tokens = 8
skip_equal_groups = false
[eval]
episodes = 2
"#
    );
    std::fs::write(&job, text).unwrap();
    let out = dir.path().join("run");
    let summary = train_json(&job, &out);
    assert_eq!(summary["steps"], 1);
    assert_eq!(summary["initial_eval"]["episodes"], 2);
    assert!(summary["final_eval"]["reward_mean"].is_number());
    let base = out.join("base");
    for name in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "chat_template.jinja",
    ] {
        assert!(
            base.join(name).is_file(),
            "the warmed-up base has no {name}"
        );
    }
    let (_, template) = opentinker::model::load_text(&base).unwrap();
    assert!(
        template.is_some(),
        "the warmed-up base lost its chat template"
    );
    let checkpoint = PathBuf::from(summary["checkpoint"].as_str().unwrap());
    assert!(checkpoint.join("adapter_model.safetensors").is_file());
}
