//! Build a plugin's source into a component, for `opentinker plugin build` and for jobs that name
//! a plugin directory: a Rust crate with cargo, a Python project with componentize-py.

mod python;
mod rust;

use std::path::{Path, PathBuf};

use anyhow::bail;

pub use python::{COMPONENTIZE_PY_ENV, COMPONENTIZE_PY_VERSION};
pub use rust::WASM_TARGET;

/// The languages a plugin directory can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// A crate: `Cargo.toml`.
    Rust,
    /// A project with a `[tool.opentinker]` table in `pyproject.toml`, or an `app.py`.
    Python,
}

impl Language {
    /// The language of the plugin in `dir`, if it is a plugin directory.
    pub fn of(dir: &Path) -> Option<Language> {
        if dir.join("Cargo.toml").is_file() {
            Some(Language::Rust)
        } else if python::is_python_plugin(dir) {
            Some(Language::Python)
        } else {
            None
        }
    }
}

/// The component at `path`, building it first when `path` is a plugin directory.
pub fn component_path(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_dir() {
        build_plugin(path)
    } else {
        Ok(path.to_path_buf())
    }
}

/// Build the plugin in `dir` and return the path of its component.
pub fn build_plugin(dir: &Path) -> anyhow::Result<PathBuf> {
    match Language::of(dir) {
        Some(Language::Rust) => rust::build(dir),
        Some(Language::Python) => python::build(dir),
        None => bail!(
            "{} is not a plugin directory: it has no Cargo.toml (Rust), and no pyproject.toml with \
             a [tool.opentinker] table nor an app.py (Python)",
            dir.display()
        ),
    }
}
