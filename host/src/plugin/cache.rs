//! The on-disk cache of compiled components. Its entries are native code that the host runs
//! without further checks, so an entry is trusted only when it proves it was written by this
//! host for this component: each holds an HMAC-SHA256, under a secret key made on first use, of
//! the engine's compatibility hash, the component's sha256 digest and the compiled bytes. An
//! entry copied under another digest, a changed byte, or one written by anyone without the key
//! fails the MAC. Entries are read only from regular files (never through a link, never from a
//! FIFO or a device) of a bounded size; any problem is a miss, logged, and costs a
//! recompilation. Writes go to a temporary name, are fsynced and renamed; the oldest entries
//! are evicted past a size bound.

use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::cache_file::{KEY_LEN, read_bounded};
use super::function_cache::FunctionCache;

type CacheMac = Hmac<Sha256>;

/// What an entry starts with, before its MAC.
const MAGIC: &[u8; 8] = b"otcache1";
const MAC_LEN: usize = 32;
const KEY_FILE: &str = "cache.key";
/// The per-function cache's folder inside an engine's folder.
const FUNCTIONS_FOLDER: &str = "functions";

pub(crate) struct CompileCache {
    dir: PathBuf,
    key: [u8; KEY_LEN],
    engine_hash: u64,
    /// The largest entry read (a bigger file is a miss, never read).
    max_entry_bytes: u64,
    /// Entries are evicted, oldest use first, while they take more than this.
    max_total_bytes: u64,
}

/// Why the cache cannot be used at all (the host then compiles every load).
#[derive(Debug, thiserror::Error)]
#[error("compile cache at {path}: {source}")]
pub(crate) struct CacheError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl CompileCache {
    /// The cache for `engine` under `root` (one folder per engine compatibility hash), with the
    /// root's secret key, made now if there is none (or a damaged one).
    pub(crate) fn new(
        root: &Path,
        engine: &Engine,
        max_entry_bytes: u64,
        max_total_bytes: u64,
    ) -> Result<Self, CacheError> {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_hash = hasher.finish();
        let failed = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError { path, source }
        };
        let dir = root.join(format!("engine-{engine_hash:016x}"));
        std::fs::create_dir_all(&dir).map_err(failed(&dir))?;
        let key_path = root.join(KEY_FILE);
        let key = match read_bounded(&key_path, KEY_LEN as u64) {
            Ok(bytes) if bytes.len() == KEY_LEN => {
                let mut key = [0; KEY_LEN];
                key.copy_from_slice(&bytes);
                key
            }
            _ => {
                let mut key = [0; KEY_LEN];
                getrandom::fill(&mut key)
                    .map_err(|e| std::io::Error::other(format!("no OS randomness: {e}")))
                    .map_err(failed(&key_path))?;
                crate::store::write_atomic_with(&key_path, |file| file.write_all(&key))
                    .map_err(failed(&key_path))?;
                tracing::info!(path = %key_path.display(), "made a new compile-cache key");
                key
            }
        };
        Ok(CompileCache {
            dir,
            key,
            engine_hash,
            max_entry_bytes,
            max_total_bytes,
        })
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.cwasm"))
    }

    /// The MAC of `artifact` as the compilation of `digest` by this engine.
    fn mac(&self, digest: &str, artifact: &[u8]) -> CacheMac {
        let mut mac = CacheMac::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(MAGIC);
        mac.update(&self.engine_hash.to_le_bytes());
        mac.update(digest.as_bytes());
        mac.update(artifact);
        mac
    }

    /// The cached compilation of the component with `digest`, if there is one this host wrote
    /// for it. Anything else (no entry, not a regular file, too big, a failed MAC, bytes the
    /// engine refuses) is a miss; a bad entry is removed.
    pub(crate) fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        let bytes = match read_bounded(&path, self.max_entry_bytes) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "compile-cache entry refused; recompiling");
                let _ = std::fs::remove_file(&path);
                return None;
            }
        };
        let header = MAGIC.len() + MAC_LEN;
        let authentic = bytes.len() > header
            && &bytes[..MAGIC.len()] == MAGIC
            && self
                .mac(digest, &bytes[header..])
                .verify_slice(&bytes[MAGIC.len()..header])
                .is_ok();
        // SAFETY: the bytes carry a MAC, under this host's secret key, of this engine's
        // compatibility hash, this component's digest and the bytes themselves: they are what
        // this host serialized from its own compilation of this component.
        let component = authentic
            .then(|| unsafe { Component::deserialize(engine, &bytes[header..]) }.ok())
            .flatten();
        match &component {
            Some(_) => {
                // Mark the use, for eviction by oldest use.
                if let Ok(file) = File::options().append(true).open(&path) {
                    let _ = file.set_modified(SystemTime::now());
                }
            }
            None => {
                tracing::warn!(path = %path.display(), "compile-cache entry failed its check; recompiling");
                let _ = std::fs::remove_file(&path);
            }
        }
        component
    }

    /// Store the compilation of `digest` atomically, then evict past the size bound.
    pub(crate) fn put(&self, digest: &str, component: &Component) -> std::io::Result<()> {
        let artifact = component
            .serialize()
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        let mac = self.mac(digest, &artifact).finalize().into_bytes();
        crate::store::write_atomic_with(&self.path(digest), |file| {
            file.write_all(MAGIC)?;
            file.write_all(&mac)?;
            file.write_all(&artifact)
        })?;
        self.evict()
    }

    /// Remove entries, oldest use first, until they take at most `max_total_bytes`: the
    /// components', then the per-function cache's, each under that bound.
    fn evict(&self) -> std::io::Result<()> {
        let evicted = evict_oldest(&self.dir, self.max_total_bytes)?
            + evict_oldest(&self.dir.join(FUNCTIONS_FOLDER), self.max_total_bytes)?;
        if evicted > 0 {
            tracing::info!(dir = %self.dir.display(), evicted, "evicted compile-cache entries");
        }
        Ok(())
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The per-function cache of this engine's compilations, under the same key (evicted with
    /// the components' entries).
    pub(crate) fn functions(&self) -> FunctionCache {
        FunctionCache::new(self.dir.join(FUNCTIONS_FOLDER), self.key)
    }
}

/// Remove the regular files of `dir`, oldest modification first, until they take at most
/// `max_total_bytes`; how many were removed. A missing folder holds nothing.
pub(crate) fn evict_oldest(dir: &Path, max_total_bytes: u64) -> std::io::Result<usize> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    let mut entries = Vec::new();
    for entry in listing {
        let entry = entry?;
        let metadata = entry.metadata()?;
        if metadata.is_file() {
            entries.push((metadata.modified()?, metadata.len(), entry.path()));
        }
    }
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    entries.sort();
    let mut removed = 0;
    for (_, len, path) in entries {
        if total <= max_total_bytes {
            break;
        }
        std::fs::remove_file(&path)?;
        total -= len;
        removed += 1;
    }
    Ok(removed)
}
