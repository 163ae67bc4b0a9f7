//! Build a Python plugin into a component with componentize-py.
//!
//! The plugin's module marks its class with `@opentinker.plugin`; the build adds the SDK and its
//! glue (the WIT exports, delegating to that class), both carried inside this program so that a
//! build uses the SDK of the host it is for, and the WIT of this host. componentize-py, pinned, is
//! installed on first use into a virtual environment in the user's cache folder, outside any
//! project (or taken from [`COMPONENTIZE_PY_ENV`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::reuse::{Inputs, build_once};
use super::{cache_dir, write_file};
use crate::plugin::PluginKind;

/// The componentize-py this build installs and uses.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// Names a `componentize-py` program to use instead of the cached install.
pub const COMPONENTIZE_PY_ENV: &str = "OPENTINKER_COMPONENTIZE_PY";

/// The WIT the component is built against.
const WIT: &str = include_str!("../../../../wit/v0.3/plugin.wit");

/// The SDK and its glue, written into the build folder: (path under it, contents).
const SDK_FILES: [(&str, &str); 9] = [
    (
        "sdk/opentinker/__init__.py",
        include_str!("../../../../sdk/python/src/opentinker/__init__.py"),
    ),
    (
        "glue/_convert.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/_convert.py"),
    ),
    (
        "glue/environment.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/environment.py"),
    ),
    (
        "glue/opentinker_environment_app.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/opentinker_environment_app.py"),
    ),
    (
        "glue/agent.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/agent.py"),
    ),
    (
        "glue/opentinker_agent_app.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/opentinker_agent_app.py"),
    ),
    (
        "glue/opentinker_reward_app.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/opentinker_reward_app.py"),
    ),
    (
        "glue/opentinker_objective_app.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/opentinker_objective_app.py"),
    ),
    (
        "glue/opentinker_advantage_app.py",
        include_str!("../../../../sdk/python/src/opentinker/_glue/opentinker_advantage_app.py"),
    ),
];

/// What a plugin's `pyproject.toml` may say.
#[derive(Debug, Default, Deserialize)]
struct PyProject {
    #[serde(default)]
    project: Project,
    #[serde(default)]
    tool: Tool,
}

#[derive(Debug, Default, Deserialize)]
struct Project {
    name: Option<String>,
    version: Option<String>,
    description: Option<String>,
    /// An SPDX expression, or (older pyprojects) a table with `text`.
    license: Option<toml::Value>,
}

impl Project {
    /// The component's metadata fields, as the Python module `_opentinker_package` the glue reads.
    fn package_module(&self, name: &str) -> String {
        let license = match &self.license {
            Some(toml::Value::String(spdx)) => spdx.clone(),
            Some(toml::Value::Table(table)) => table
                .get("text")
                .and_then(toml::Value::as_str)
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        };
        // JSON strings are Python string literals.
        let literal = |text: &str| serde_json::Value::from(text).to_string();
        format!(
            "\"\"\"The project's fields for the component's metadata, from its pyproject.toml.\"\"\"\n\n\
             NAME = {}\nVERSION = {}\nDESCRIPTION = {}\nLICENSE = {}\n",
            literal(name),
            literal(self.version.as_deref().unwrap_or("0.0.0")),
            literal(self.description.as_deref().unwrap_or_default()),
            literal(&license),
        )
    }
}

#[derive(Debug, Default, Deserialize)]
struct Tool {
    opentinker: Option<Settings>,
}

/// The `[tool.opentinker]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    kind: PluginKind,
    /// The module that marks the plugin's class (default `app`).
    #[serde(default = "default_module")]
    module: String,
}

fn default_module() -> String {
    "app".into()
}

pub(super) fn is_python_plugin(dir: &Path) -> bool {
    dir.join("app.py").is_file()
        || read_pyproject(dir).is_ok_and(|project| project.tool.opentinker.is_some())
}

fn read_pyproject(dir: &Path) -> anyhow::Result<PyProject> {
    let path = dir.join("pyproject.toml");
    if !path.is_file() {
        return Ok(PyProject::default());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("{} is not a valid pyproject", path.display()))
}

/// Build the Python plugin in `dir` into `dir/target/opentinker/NAME.wasm`, or reuse the one
/// there that was built from the same inputs.
pub(super) fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let project = read_pyproject(&dir)?;
    let settings = project.tool.opentinker.unwrap_or(Settings {
        kind: PluginKind::default(),
        module: default_module(),
    });
    if !settings
        .module
        .split('.')
        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_'))
    {
        bail!(
            "[tool.opentinker] module `{}` is not a Python module name",
            settings.module
        );
    }
    let name = project
        .project
        .name
        .clone()
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "plugin".into());
    let build_dir = dir.join("target").join("opentinker");
    let package_module = project.project.package_module(&name);
    let user_module = format!(
        "\"\"\"The plugin's own module, imported so that it marks its class.\"\"\"\n\nimport {}  # noqa: F401\n",
        settings.module
    );
    let kind = settings.kind.interface();
    let output = build_dir.join(format!("{name}.wasm"));
    let componentize_py = componentize_py()?;
    let generated = [
        ("wit/plugin.wit", WIT),
        ("glue/_opentinker_package.py", package_module.as_str()),
        ("glue/_opentinker_user.py", user_module.as_str()),
    ];

    let mut inputs = Inputs::new(&format!(
        "componentize-py {COMPONENTIZE_PY_VERSION} at {}",
        componentize_py.display()
    ));
    inputs.add("world", kind.as_bytes());
    for (relative, contents) in SDK_FILES.iter().chain(&generated) {
        inputs.add(relative, contents.as_bytes());
    }
    inputs.add_folder(&dir)?;
    build_once(&build_dir, &output, inputs, || {
        for (relative, contents) in SDK_FILES.iter().chain(&generated) {
            write_file(&build_dir.join(relative), contents)?;
        }
        let status = Command::new(&componentize_py)
            .arg("-d")
            .arg(build_dir.join("wit"))
            .arg("-w")
            .arg(format!("{kind}-plugin"))
            .arg("componentize")
            .arg(format!("opentinker_{kind}_app"))
            .arg("-p")
            .arg(build_dir.join("glue"))
            .arg("-p")
            .arg(build_dir.join("sdk"))
            .arg("-p")
            .arg(&dir)
            .arg("-o")
            .arg(&output)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // Its progress goes with the build's other messages, never into a command's output.
            .stdout(std::io::stderr())
            .status()
            .with_context(|| format!("running {}", componentize_py.display()))?;
        if !status.success() {
            bail!(
                "componentize-py could not build {} ({status}; its errors are above)",
                dir.display()
            );
        }
        Ok(())
    })
}

/// The `componentize-py` to build with: [`COMPONENTIZE_PY_ENV`], or the pinned version in the
/// cache folder's virtual environment, installed there with pip on first use.
fn componentize_py() -> anyhow::Result<PathBuf> {
    if let Some(program) = std::env::var_os(COMPONENTIZE_PY_ENV) {
        return Ok(PathBuf::from(program));
    }
    let venv = cache_dir()?.join(format!("componentize-py-{COMPONENTIZE_PY_VERSION}"));
    let program = venv.join("bin").join("componentize-py");
    if program.is_file() {
        return Ok(program);
    }
    eprintln!(
        "installing componentize-py {COMPONENTIZE_PY_VERSION} into {} (once)",
        venv.display()
    );
    let python = std::env::var_os("OPENTINKER_PYTHON").unwrap_or_else(|| "python3".into());
    let made = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .context("running python3 -m venv (Python plugins are built with Python 3)")?;
    if !made.success() {
        bail!("python3 -m venv {} failed", venv.display());
    }
    let installed = Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet"])
        .arg(format!("componentize-py=={COMPONENTIZE_PY_VERSION}"))
        .status()
        .context("running pip")?;
    if !installed.success() || !program.is_file() {
        // A half-made environment would be taken for a good one next time.
        let _ = std::fs::remove_dir_all(&venv);
        bail!("pip could not install componentize-py=={COMPONENTIZE_PY_VERSION}");
    }
    Ok(program)
}
