//! Durable files: every write of state goes to a temporary name in the same folder, is fsynced,
//! then renamed over the destination, so a crash leaves the old file or the new one, never half.
//! The server's SQLite database ([`DATABASE_FILE`], opened by [`open_database`]) is the one
//! store that is not a file of its own.

mod database;

pub use database::{DATABASE_FILE, open_database};

use std::io::Write;
use std::path::{Path, PathBuf};

/// A temporary file in `dir`, readable by all like any file the process would create (the
/// default of temporary files is owner-only), ending like `like` (so writers that pick a format
/// by extension, such as image encoders, see the destination's).
fn temp_file_in(dir: &Path, like: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    let suffix = like
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    builder.suffix(&suffix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    builder.tempfile_in(dir)
}

/// The folder that holds `path` (the current one for a bare name), created if missing.
fn parent_folder(path: &Path) -> std::io::Result<&Path> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    Ok(parent)
}

/// Make a rename inside `folder` durable (best effort: not every filesystem syncs folders).
fn sync_folder(folder: &Path) {
    if let Ok(folder) = std::fs::File::open(folder) {
        let _ = folder.sync_all();
    }
}

/// Write `path` atomically with what `fill` writes into the temporary file.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    write_atomic_via_path(path, |temp| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(temp)?;
        fill(&mut file)
    })
}

/// Write `path` atomically with a writer that wants a path (such as a safetensors writer): it
/// writes a temporary file in the same folder, which is then fsynced and renamed.
pub fn write_atomic_via_path(
    path: &Path,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let folder = parent_folder(path)?;
    let temp = temp_file_in(folder, path)?;
    fill(temp.path())?;
    std::fs::File::open(temp.path())?.sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    sync_folder(folder);
    Ok(())
}

/// A folder being written under a temporary name beside `dir`, which [`StagedDir::commit`]
/// fsyncs and renames over `dir` (an old `dir` is moved aside first and removed after), so `dir`
/// is never half written. Dropped without a commit, it is removed. For writers that fill the
/// folder across `await`s; [`write_atomic_dir`] is the one-call form.
pub struct StagedDir {
    dir: PathBuf,
    temp: tempfile::TempDir,
}

impl StagedDir {
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix(".writing-")
            .tempdir_in(parent_folder(dir)?)?;
        Ok(StagedDir {
            dir: dir.to_path_buf(),
            temp,
        })
    }

    /// Where to write the folder's files.
    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    /// Fsync what was written and put it in place of `dir`.
    pub fn commit(self) -> std::io::Result<()> {
        let parent = parent_folder(&self.dir)?;
        sync_tree(self.temp.path())?;
        let temp = self.temp.keep();
        let old = if self.dir.exists() {
            let aside = tempfile::Builder::new()
                .prefix(".replaced-")
                .tempdir_in(parent)?
                .keep();
            std::fs::rename(&self.dir, aside.join("old"))?;
            Some(aside)
        } else {
            None
        };
        std::fs::rename(&temp, &self.dir)?;
        sync_folder(parent);
        if let Some(aside) = old {
            std::fs::remove_dir_all(aside)?;
        }
        Ok(())
    }
}

/// Fsync every file and folder under `dir`, and `dir` itself.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Replace the folder `dir` atomically with one that `fill` writes (see [`StagedDir`]).
pub fn write_atomic_dir(
    dir: &Path,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let staged = StagedDir::new(dir)?;
    fill(staged.path())?;
    staged.commit()
}

/// Move the finished file `from` to `to` (same file system) durably: `from` is fsynced, then
/// renamed, then the folder of `to` is synced.
pub fn rename_durably(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::File::open(from)?.sync_all()?;
    let folder = parent_folder(to)?;
    std::fs::rename(from, to)?;
    sync_folder(folder);
    Ok(())
}

/// The current time in Unix seconds: what recorded state is stamped with.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_writer_sees_the_destination_extension() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.png");
        write_atomic_via_path(&path, |temp| {
            assert_eq!(temp.extension().unwrap(), "png");
            std::fs::write(temp, b"image")
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"image");
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
