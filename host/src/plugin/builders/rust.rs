//! Build a Rust plugin crate into a component with cargo.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Build the plugin crate in `dir` (release, `wasm32-wasip2`) and return the path of its
/// component. Builds go to `target/wasm-plugins` under the crate's workspace root: a target
/// directory of their own, so a build never waits on the caller's cargo lock, shared by all the
/// plugins of a workspace.
pub(super) fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!("{} has no Cargo.toml: not a plugin crate", dir.display());
    }
    let manifest = manifest
        .canonicalize()
        .with_context(|| format!("resolving {}", manifest.display()))?;
    ensure_target_installed()?;
    let target_dir = workspace_root(&manifest)?
        .join("target")
        .join("wasm-plugins");
    let output = cargo()
        .args([
            "build",
            "--release",
            "--target",
            WASM_TARGET,
            "--message-format",
            "json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    if !output.status.success() {
        bail!(
            "cargo build of {} failed (its errors are above)",
            dir.display()
        );
    }
    component_from_messages(&output.stdout, &manifest).with_context(|| {
        format!(
            "cargo built {} but made no .wasm: is its crate-type \"cdylib\"?",
            dir.display()
        )
    })
}

/// The `.wasm` that cargo's JSON messages report for the package of `manifest`.
fn component_from_messages(stdout: &[u8], manifest: &Path) -> Option<PathBuf> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| m["manifest_path"].as_str().map(Path::new) == Some(manifest))
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "wasm"))
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // A caller's target dir must not redirect the plugin build onto its own lock.
    command.env_remove("CARGO_TARGET_DIR");
    command
}

fn workspace_root(manifest: &Path) -> anyhow::Result<PathBuf> {
    let output = cargo()
        .args([
            "locate-project",
            "--workspace",
            "--message-format",
            "plain",
            "--manifest-path",
        ])
        .arg(manifest)
        .output()
        .context("running cargo locate-project")?;
    if !output.status.success() {
        bail!(
            "cargo locate-project failed for {}: {}",
            manifest.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let root_manifest = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    Ok(root_manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// Install the `wasm32-wasip2` target with rustup when it is missing.
fn ensure_target_installed() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET)
        })
        .unwrap_or(false);
    if installed {
        return Ok(());
    }
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .context("running rustup (needed to install the wasm32-wasip2 target)")?;
    if !status.success() {
        bail!("rustup target add {WASM_TARGET} failed");
    }
    Ok(())
}
