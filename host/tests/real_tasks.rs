//! The validation tasks of `examples/real/` on a real pretrained chat model, SmolLM2-135M-Instruct
//! from its PyPI package's GGUF file (`scripts/models.sh`; `OPENTINKER_SMOLLM2_GGUF`): every job
//! file there, cut to one short RL step, runs as written, and the trainer agrees with the
//! sampler on what was sampled. Whether the tasks learn is a benchmark (`examples/LEARNING.md`),
//! not a test.

#[path = "common/plugin_build.rs"]
mod plugin_build;

use std::path::{Path, PathBuf};
use std::process::Command;

use plugin_build::built_plugin;

/// The job files of `examples/real/`, by name.
fn real_jobs() -> Vec<(String, PathBuf)> {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/real");
    let mut jobs: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, path)
        })
        .collect();
    jobs.sort();
    jobs
}

/// `job` on `model`, cut to one RL step of one group of four at the job's temperature, at most
/// two turns an episode, a warm-up (where it has one) of one step, and an evaluation of two
/// episodes, its plugins built here: the job file to run, in `dir`.
fn one_step_of(name: &str, job: &Path, model: &Path, dir: &Path) -> PathBuf {
    let mut job: toml::Table = toml::from_str(&std::fs::read_to_string(job).unwrap()).unwrap();
    job["model"]["dir"] = model.display().to_string().into();
    for section in ["environment", "agent", "reward"] {
        if let Some(plugin) = job.get_mut(section).and_then(|s| s.get_mut("plugin")) {
            let folder = plugin
                .as_str()
                .unwrap()
                .trim_start_matches("../../plugins/");
            *plugin = built_plugin(folder).display().to_string().into();
        }
    }
    let rl = job["rl"].as_table_mut().unwrap();
    rl.insert("steps".into(), 1.into());
    rl.insert("groups_per_batch".into(), 1.into());
    rl.insert("group_size".into(), 4.into());
    rl.insert("max_tokens".into(), 24.into());
    // Two turns show a multi-turn job's datums; six (guess-number's) take minutes on two cores.
    let turns = rl["max_turns"].as_integer().unwrap_or(1).min(2);
    rl.insert("max_turns".into(), turns.into());
    // All four samples may score alike; the step must still train, to compare the logprobs.
    rl.insert("skip_equal_groups".into(), false.into());
    job.insert(
        "eval".into(),
        toml::Table::from_iter([("episodes".into(), 2.into())]).into(),
    );
    // A warm-up (the calculator's, guess-number's) of one step of two episodes: the same path
    // in seconds rather than minutes.
    if let Some(sft) = job.get_mut("sft").and_then(|s| s.as_table_mut()) {
        sft.insert("steps".into(), 1.into());
        sft.insert("batch".into(), 2.into());
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(&job).unwrap()).unwrap();
    path
}

/// Every job of `examples/real/` takes an RL step on SmolLM2, all in one `train` (one model
/// load): the episodes are scored, the adapter trains, the environment's metrics are reported,
/// and the trainer's logprob of every sampled token, before the update, is the sampler's within
/// 1e-3, both of the distribution sampled from (`logits / temperature`, the jobs' 0.7). The two
/// paths sum in different orders (the sampler's batch-invariant dot products, the trainer's
/// blocked GEMM) through 30 layers of a real model's large activations: measured, up to 1.5e-4
/// apart at 0.7 (2.7e-4 at 1.0) where the tiny model's are within 1e-5 (`train_layers.rs`).
#[test]
fn every_real_task_takes_an_rl_step_on_smollm2_and_the_trainer_agrees_with_the_sampler() {
    let Some(model) = opentinker_test_tools::smollm2_gguf() else {
        return;
    };
    let jobs = real_jobs();
    assert!(jobs.len() >= 3, "examples/real has {jobs:?}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_opentinker"))
        .args(["train", "--json", "--out"])
        .arg(&out)
        .args(
            jobs.iter()
                .map(|(name, job)| one_step_of(name, job, &model, dir.path())),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "train: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summaries: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert_eq!(summaries.len(), jobs.len(), "{stdout}");
    for (name, job) in &jobs {
        let folder = out.join(name);
        let summary = summaries
            .iter()
            .find(|s| s["out"].as_str() == Some(folder.to_str().unwrap()))
            .unwrap_or_else(|| panic!("no summary of {name}: {stdout}"));
        assert_eq!(summary["steps"], 1, "{name}: {summary}");
        let metrics = std::fs::read_to_string(folder.join("metrics.jsonl")).unwrap();
        let step: serde_json::Value = metrics
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .find(|line: &serde_json::Value| line["phase"] == "rl")
            .unwrap_or_else(|| panic!("{name}: no RL step in {metrics}"));
        assert!(step["tokens"].as_u64().unwrap() > 0, "{name}: {step}");
        assert!(
            step["env_metrics"]
                .as_object()
                .is_some_and(|m| !m.is_empty()),
            "{name}: no environment metrics: {step}"
        );
        let gap = step["sampler_logprob_diff_max"].as_f64().expect("the gap");
        assert!(
            gap < 1e-3,
            "{name}: the trainer's logprobs differ from the sampler's by up to {gap}: {step}"
        );
        assert!(
            summary["final_eval"]["success_rate"].is_number(),
            "{name}: {summary}"
        );
        // A job that warms its adapter up first evaluates the model as it came too.
        if has_warm_up(job) {
            assert!(
                summary["untrained_eval"]["success_rate"].is_number(),
                "{name}: no evaluation before the warm-up: {summary}"
            );
        }
        // A job of several policies evaluates each of them.
        for policy in policies_of(job) {
            assert!(
                summary["policies"][&policy]["final_eval"]["success_rate"].is_number(),
                "{name}: no evaluation of policy {policy}: {summary}"
            );
        }
    }
}

/// The names of the `[[policies]]` of the job file `job`.
/// Whether `job` has an `[sft]` warm-up.
fn has_warm_up(job: &Path) -> bool {
    let job: toml::Table = toml::from_str(&std::fs::read_to_string(job).unwrap()).unwrap();
    job.contains_key("sft")
}

fn policies_of(job: &Path) -> Vec<String> {
    let job: toml::Table = toml::from_str(&std::fs::read_to_string(job).unwrap()).unwrap();
    job.get("policies")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}
