//! A Python or JavaScript build whose inputs have not changed since the last one reuses its
//! component, as cargo does for a Rust crate: the inputs (every file of the plugin's folder, and
//! what the host adds to them: the SDK, the glue, the WIT, the toolchain) are hashed into a stamp
//! kept beside the component. Such a build takes seconds to minutes of CPU (componentize-py,
//! componentize-js with Wizer), so `plugin build` on an unchanged plugin, and the many tests and
//! jobs that build the same one, should pay for it once.
//!
//! An exclusive lock on the build folder makes builds of one plugin run one at a time, across
//! processes, so that two never write the same files; the second finds the first's stamp.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// Folders of a plugin that are not its source: build outputs and caches.
const NOT_SOURCE: [&str; 4] = ["target", "__pycache__", ".pytest_cache", ".git"];

/// The hash of a build's inputs, fed in a fixed order.
pub(super) struct Inputs(Sha256);

impl Inputs {
    /// Inputs that start with the build's toolchain (its name and version, or its path).
    pub(super) fn new(toolchain: &str) -> Self {
        let mut inputs = Inputs(Sha256::new());
        inputs.add("toolchain", toolchain.as_bytes());
        inputs
    }

    /// One named input. Each is framed by its lengths, so that no two lists of inputs hash alike.
    pub(super) fn add(&mut self, name: &str, bytes: &[u8]) {
        for part in [name.as_bytes(), bytes] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
    }

    /// Every file under `dir` but its build outputs, by path relative to `dir` and contents; a
    /// symbolic link (npm links a `file:` dependency) by its target.
    pub(super) fn add_folder(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.add_folder_under(dir, Path::new(""))
    }

    fn add_folder_under(&mut self, root: &Path, relative: &Path) -> anyhow::Result<()> {
        let folder = root.join(relative);
        let mut entries = std::fs::read_dir(&folder)
            .with_context(|| format!("reading {}", folder.display()))?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading {}", folder.display()))?;
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let name = entry.file_name();
            if NOT_SOURCE.iter().any(|skip| name == *skip) {
                continue;
            }
            let path = relative.join(&name);
            let label = path.to_string_lossy();
            let kind = entry
                .file_type()
                .with_context(|| format!("reading {}", entry.path().display()))?;
            if kind.is_symlink() {
                let target = std::fs::read_link(entry.path())
                    .with_context(|| format!("reading {}", entry.path().display()))?;
                self.add(
                    &format!("link {label}"),
                    target.to_string_lossy().as_bytes(),
                );
            } else if kind.is_dir() {
                self.add(&format!("folder {label}"), b"");
                self.add_folder_under(root, &path)?;
            } else {
                let bytes = std::fs::read(entry.path())
                    .with_context(|| format!("reading {}", entry.path().display()))?;
                self.add(&format!("file {label}"), &bytes);
            }
        }
        Ok(())
    }

    fn digest(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// `output`, built by `build` into `build_dir` unless the stamp beside it says it was built from
/// the same `inputs`; builds of one `build_dir` wait for each other.
pub(super) fn build_once(
    build_dir: &Path,
    output: &Path,
    inputs: Inputs,
    build: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(build_dir)
        .with_context(|| format!("creating {}", build_dir.display()))?;
    let lock_path = build_dir.join(".lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;

    let digest = inputs.digest();
    let stamp = stamp_path(output);
    let built_from = std::fs::read_to_string(&stamp).unwrap_or_default();
    if built_from.trim() == digest && output.is_file() {
        return Ok(output.to_path_buf());
    }
    // A component whose build fails half-way must not be taken for this one's next time.
    match std::fs::remove_file(&stamp) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(error).with_context(|| format!("removing {}", stamp.display()));
        }
        _ => {}
    }
    build()?;
    write_stamp(&stamp, &digest)?;
    Ok(output.to_path_buf())
}

fn stamp_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".inputs");
    PathBuf::from(name)
}

/// The stamp, written under a temporary name, synced, then renamed into place.
fn write_stamp(stamp: &Path, digest: &str) -> anyhow::Result<()> {
    let temporary = stamp.with_extension("inputs.tmp");
    let mut file =
        File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
    writeln!(file, "{digest}").with_context(|| format!("writing {}", temporary.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, stamp).with_context(|| format!("writing {}", stamp.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(dir: &Path) -> String {
        let mut inputs = Inputs::new("tool 1.0");
        inputs.add_folder(dir).unwrap();
        inputs.digest()
    }

    #[test]
    fn the_digest_follows_the_sources_and_not_the_build_outputs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.py"), "print(1)").unwrap();
        let first = digest_of(dir.path());
        std::fs::create_dir_all(dir.path().join("target/opentinker")).unwrap();
        std::fs::write(dir.path().join("target/opentinker/x.wasm"), "out").unwrap();
        std::fs::create_dir_all(dir.path().join("__pycache__")).unwrap();
        std::fs::write(dir.path().join("__pycache__/app.pyc"), "cache").unwrap();
        assert_eq!(digest_of(dir.path()), first, "outputs changed the digest");
        std::fs::write(dir.path().join("app.py"), "print(2)").unwrap();
        assert_ne!(
            digest_of(dir.path()),
            first,
            "a source edit kept the digest"
        );
        let mut other_tool = Inputs::new("tool 1.1");
        other_tool.add_folder(dir.path()).unwrap();
        assert_ne!(other_tool.digest(), digest_of(dir.path()));
    }

    #[test]
    fn an_unchanged_build_runs_once_and_a_failed_one_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("p.wasm");
        let inputs = |text: &str| {
            let mut inputs = Inputs::new("tool");
            inputs.add("source", text.as_bytes());
            inputs
        };
        let mut runs = 0;
        for _ in 0..2 {
            build_once(dir.path(), &output, inputs("a"), || {
                runs += 1;
                Ok(std::fs::write(&output, "a")?)
            })
            .unwrap();
        }
        assert_eq!(runs, 1);
        let failed = build_once(dir.path(), &output, inputs("b"), || {
            anyhow::bail!("compile error")
        });
        assert!(failed.is_err());
        build_once(dir.path(), &output, inputs("a"), || {
            runs += 1;
            Ok(std::fs::write(&output, "a")?)
        })
        .unwrap();
        assert_eq!(runs, 2, "the stamp of a failed build was trusted");
    }
}
