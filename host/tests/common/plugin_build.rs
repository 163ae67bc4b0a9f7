//! The repository's plugins built into components the way a user builds them
//! (`opentinker plugin build plugins/NAME`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `plugins/NAME` built into a component; the last line of the command's output is its path.
pub fn built_plugin(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(name);
    let output = Command::new(env!("CARGO_BIN_EXE_opentinker"))
        .args(["plugin", "build"])
        .arg(&dir)
        .output()
        .expect("running opentinker plugin build");
    assert!(
        output.status.success(),
        "building {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let wasm = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(
        wasm.extension().is_some_and(|e| e == "wasm") && wasm.is_file(),
        "building {}: {stdout}",
        dir.display()
    );
    wasm
}
