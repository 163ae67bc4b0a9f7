//! Cranelift's per-function compile cache, on disk beside the component cache.
//!
//! Components made by the same toolchain share most of their code: every componentize-py build
//! carries the same CPython, every componentize-js build the same SpiderMonkey. The component
//! cache ([`super::cache`]) only answers for a component compiled before; this one answers for
//! each function Cranelift has compiled before, in any component, so a second Python or
//! JavaScript plugin compiles in a fraction of the first one's time. Wasmtime asks it through
//! its incremental-compilation hook ([`wasmtime::CacheStore`]) while the compile worker compiles.
//!
//! An entry is native code, trusted as the component cache's are: it holds an HMAC-SHA256, under
//! the cache's secret key, of Cranelift's key for the function and the compiled bytes, so an entry
//! written by anyone without the key, copied under another name, or changed in a byte fails the
//! MAC and is a miss. Entries are read only from bounded regular files, never through a link.
//! Entries are not fsynced (a function is cheap to compile again, and there are tens of
//! thousands): a torn write fails its MAC. The component cache evicts the oldest past its bound.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::cache_file::{KEY_LEN, read_bounded};

type EntryMac = Hmac<Sha256>;

/// What an entry's MAC covers first, so that no other kind of MAC under the key can pass as one.
const DOMAIN: &[u8] = b"opentinker function-cache entry v1";
const MAC_LEN: usize = 32;
/// The largest entry read: far above any one function's code.
const MAX_ENTRY_BYTES: u64 = 16 * 1024 * 1024;

/// The function cache in one folder, under the component cache's secret key.
pub(crate) struct FunctionCache {
    dir: PathBuf,
    key: [u8; KEY_LEN],
}

impl std::fmt::Debug for FunctionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("FunctionCache")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl FunctionCache {
    pub(crate) fn new(dir: PathBuf, key: [u8; KEY_LEN]) -> Self {
        FunctionCache { dir, key }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The secret key, for the compile worker.
    pub(crate) fn key(&self) -> [u8; KEY_LEN] {
        self.key
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        self.dir.join(hex::encode(Sha256::digest(key)))
    }

    fn mac(&self, key: &[u8], value: &[u8]) -> EntryMac {
        let mut mac = EntryMac::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(DOMAIN);
        mac.update(&(key.len() as u64).to_le_bytes());
        mac.update(key);
        mac.update(value);
        mac
    }

    fn write(&self, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mac = self.mac(key, value).finalize().into_bytes();
        let mut temp = tempfile::NamedTempFile::new_in(&self.dir)?;
        temp.write_all(&mac)?;
        temp.write_all(value)?;
        temp.persist(self.path(key)).map_err(|e| e.error)?;
        Ok(())
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let path = self.path(key);
        let bytes = read_bounded(&path, MAX_ENTRY_BYTES).ok()?;
        let authentic = bytes.len() >= MAC_LEN
            && self
                .mac(key, &bytes[MAC_LEN..])
                .verify_slice(&bytes[..MAC_LEN])
                .is_ok();
        if !authentic {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Mark the use, for eviction by oldest use.
        if let Ok(file) = std::fs::File::options().append(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(Cow::Owned(bytes[MAC_LEN..].to_vec()))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.write(key, &value).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn an_entry_comes_back_only_to_its_key_and_only_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::new(dir.path().join("functions"), [7; 32]);
        assert!(cache.insert(b"function a", b"code of a".to_vec()));
        assert_eq!(cache.get(b"function a").as_deref(), Some(&b"code of a"[..]));
        assert_eq!(cache.get(b"function b"), None);

        // Under another key, or copied under another function's name, or changed: a miss.
        let stranger = FunctionCache::new(dir.path().join("functions"), [8; 32]);
        assert_eq!(stranger.get(b"function a"), None);
        assert!(cache.insert(b"function a", b"code of a".to_vec()));
        std::fs::copy(cache.path(b"function a"), cache.path(b"function b")).unwrap();
        assert_eq!(cache.get(b"function b"), None);
        let path = cache.path(b"function a");
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(cache.get(b"function a"), None);
        assert!(!path.exists(), "a bad entry is removed");
    }

    #[test]
    fn eviction_keeps_the_entries_used_last_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::new(dir.path().to_path_buf(), [1; 32]);
        for name in ["old", "middle", "new"] {
            assert!(cache.insert(name.as_bytes(), vec![0; 1000]));
            let file = std::fs::File::options()
                .append(true)
                .open(cache.path(name.as_bytes()))
                .unwrap();
            let age = match name {
                "old" => 300,
                "middle" => 200,
                _ => 100,
            };
            file.set_modified(SystemTime::now() - std::time::Duration::from_secs(age))
                .unwrap();
        }
        crate::plugin::cache::evict_oldest(cache.dir(), 2 * (1000 + MAC_LEN as u64)).unwrap();
        assert_eq!(cache.get(b"old"), None);
        assert!(cache.get(b"middle").is_some() && cache.get(b"new").is_some());
    }
}
