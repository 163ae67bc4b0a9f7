//! Installed plugins: components fetched and checked, kept under their digest
//! (`DIR/sha256/HEX.wasm`), so a job that pins a digest runs without the registry.

use std::path::{Path, PathBuf};

use super::{Digest, MarketError};

pub struct PackageCache {
    dir: PathBuf,
}

impl PackageCache {
    pub fn new(dir: &Path) -> Self {
        PackageCache {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir
            .join("sha256")
            .join(format!("{}.wasm", digest.hex()))
    }

    /// Keep `component` (already checked to have `digest`); returns its path.
    pub fn put(&self, digest: &Digest, component: &[u8]) -> Result<PathBuf, MarketError> {
        digest.check("the component to install", component)?;
        let path = self.path(digest);
        crate::store::write_atomic(&path, component).map_err(MarketError::io(&path))?;
        Ok(path)
    }

    /// The cached component of `digest`, if it is there with those bytes (a damaged copy is
    /// removed, to be fetched again).
    pub fn get(&self, digest: &Digest) -> Option<PathBuf> {
        let path = self.path(digest);
        let bytes = std::fs::read(&path).ok()?;
        if Digest::of(&bytes) == *digest {
            Some(path)
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_components_by_digest_and_drops_damaged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PackageCache::new(dir.path());
        let digest = Digest::of(b"component");
        assert!(cache.put(&digest, b"other").is_err());
        let path = cache.put(&digest, b"component").unwrap();
        assert_eq!(cache.get(&digest), Some(path.clone()));
        std::fs::write(&path, b"damaged").unwrap();
        assert_eq!(cache.get(&digest), None);
        assert!(!path.exists());
    }
}
