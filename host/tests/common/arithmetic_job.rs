//! The job file the tests that train end to end share: RL on the arithmetic environment (operands
//! up to 4) on the built-in tiny model (what a server serves as `opentinker/tiny`), after a warm-up
//! on its demonstrations so that RL has a signal.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// How a test's job differs from the others'.
pub struct ArithmeticJob {
    pub sft_steps: usize,
    /// A warm-up of every weight (which makes a base of the job's own), else of a LoRA adapter.
    pub full_parameters: bool,
    pub rl_steps: usize,
    /// More keys of `[rl]` (`kl_coef = 0.01`), and more sections after it.
    pub rl_extra: &'static str,
    pub sections: &'static str,
}

impl ArithmeticJob {
    /// Write the job as `dir/NAME.toml`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/arithmetic");
        let text = format!(
            r#"
[model]
init_tiny = {{ shape = "tiny", arch = "qwen2", seed = 0 }}

[lora]
rank = 8

[environment]
plugin = "{plugin}"
config = {{ max_operand = 4 }}

[sft]
source = "demonstrations"
steps = {sft_steps}
batch = 16
learning_rate = 3e-3
# The decay this short, fast warm-up was set with: with the default 0.999 its 30 steps at 3e-3
# leave a policy whose every RL episode is an invalid answer, so RL would have no signal.
beta2 = 0.95
full_parameters = {full_parameters}

[rl]
steps = {rl_steps}
groups_per_batch = 2
group_size = 4
learning_rate = 1e-3
max_turns = 1
max_tokens = 6
{rl_extra}

[eval]
every = 2
episodes = 8

{sections}
"#,
            plugin = plugin.display(),
            sft_steps = self.sft_steps,
            full_parameters = self.full_parameters,
            rl_steps = self.rl_steps,
            rl_extra = self.rl_extra,
            sections = self.sections,
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// The metric lines a run wrote into its folder, in order.
pub fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}
