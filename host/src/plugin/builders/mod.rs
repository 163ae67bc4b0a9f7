//! Build a plugin's source into a component, for `opentinker plugin build` and for jobs that name
//! a plugin directory: a Rust crate with cargo, a Python project with componentize-py, a
//! JavaScript package with componentize-js. Like cargo for a crate, a Python or JavaScript build
//! whose inputs are unchanged reuses its component.

mod javascript;
mod python;
mod reuse;
mod rust;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The languages a plugin directory can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// A crate: `Cargo.toml`.
    Rust,
    /// A project with a `[tool.opentinker]` table in `pyproject.toml`, or an `app.py`.
    Python,
    /// A package with an `opentinker` field in `package.json`.
    JavaScript,
}

impl Language {
    /// The language of the plugin in `dir`, if it is a plugin directory.
    pub fn of(dir: &Path) -> Option<Language> {
        if dir.join("Cargo.toml").is_file() {
            Some(Language::Rust)
        } else if python::is_python_plugin(dir) {
            Some(Language::Python)
        } else if javascript::is_js_plugin(dir) {
            Some(Language::JavaScript)
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
        Some(Language::JavaScript) => javascript::build(dir),
        None => bail!(
            "{} is not a plugin directory: it has no Cargo.toml (Rust), no pyproject.toml with \
             a [tool.opentinker] table nor an app.py (Python), and no package.json with an \
             `opentinker` field (JavaScript)",
            dir.display()
        ),
    }
}

/// The user's cache folder for opentinker's build toolchains, outside any project.
fn cache_dir() -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .context("no cache folder for the build toolchains: set HOME or XDG_CACHE_HOME")?;
    Ok(cache.join("opentinker"))
}

/// Write `contents` to `path`, making its folder first.
fn write_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
