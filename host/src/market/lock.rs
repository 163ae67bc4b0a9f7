//! The lock file beside a job (`job.lock` for `job.toml`): the exact version and digest each
//! plugin range of the job resolved to, so that a run with the lock file uses exactly those
//! bytes, whatever was published since. Delete it (or the entry) to resolve again.

use std::path::{Path, PathBuf};

use semver::Version;
use serde::{Deserialize, Serialize};

use super::{Digest, MarketError, PackageId, PackageRef};

const HEADER: &str = "# Written by opentinker: the plugin versions this job resolved to. Runs with this file use\n# exactly these digests; delete an entry to resolve its range again.\n\n";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockFile {
    #[serde(default, rename = "package")]
    pub packages: Vec<Locked>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    /// `namespace/name@range`, as the job names it.
    pub wanted: String,
    pub version: Version,
    pub digest: Digest,
    /// The registry it was fetched from.
    pub registry: String,
}

impl Locked {
    pub fn id(&self, wanted: &PackageRef) -> PackageId {
        PackageId {
            name: wanted.name.clone(),
            version: self.version.clone(),
        }
    }
}

/// The lock file of the job file `job`: the same name with `.lock` for its extension.
pub fn lock_path(job: &Path) -> PathBuf {
    job.with_extension("lock")
}

impl LockFile {
    /// The lock file at `path`, empty when there is none.
    pub fn load(path: &Path) -> Result<LockFile, MarketError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| MarketError::Invalid {
                what: format!("the lock file {}", path.display()),
                message: format!("{e} (delete it to resolve the job's plugins again)"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LockFile::default()),
            Err(e) => Err(MarketError::io(path)(e)),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), MarketError> {
        let text = toml::to_string_pretty(self).map_err(|e| MarketError::Invalid {
            what: "the lock file".into(),
            message: e.to_string(),
        })?;
        crate::store::write_atomic(path, format!("{HEADER}{text}").as_bytes())
            .map_err(MarketError::io(path))
    }

    /// What `wanted` was locked to, if it is in the file.
    pub fn get(&self, wanted: &PackageRef) -> Option<&Locked> {
        let wanted = wanted.to_string();
        self.packages.iter().find(|p| p.wanted == wanted)
    }

    /// Lock `wanted` to `locked`, replacing what it was locked to.
    pub fn set(&mut self, locked: Locked) {
        self.packages.retain(|p| p.wanted != locked.wanted);
        self.packages.push(locked);
        self.packages.sort_by(|a, b| a.wanted.cmp(&b.wanted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_round_trips_and_is_found_by_the_range_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(&dir.path().join("job.toml"));
        assert_eq!(path.file_name().unwrap(), "job.lock");
        let mut lock = LockFile::load(&path).unwrap();
        let wanted: PackageRef = "games/maze@^1.2".parse().unwrap();
        lock.set(Locked {
            wanted: wanted.to_string(),
            version: Version::new(1, 4, 0),
            digest: Digest::of(b"maze"),
            registry: "oci://127.0.0.1:5000".into(),
        });
        lock.save(&path).unwrap();
        let read = LockFile::load(&path).unwrap();
        assert_eq!(read, lock);
        assert_eq!(
            read.get(&wanted).unwrap().id(&wanted).to_string(),
            "games/maze@1.4.0"
        );
        let other: PackageRef = "games/maze@^2".parse().unwrap();
        assert!(read.get(&other).is_none());
    }
}
