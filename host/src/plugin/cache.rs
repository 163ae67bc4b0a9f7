//! The on-disk cache of compiled components, keyed by (engine compatibility hash, sha256 of the
//! component). Files hold only what this host compiled, behind a checksum, and are written to a
//! temporary name, fsynced and renamed, so a crash never leaves a torn entry.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

pub(crate) struct CompileCache {
    dir: PathBuf,
}

const CHECKSUM_LEN: usize = 32;

impl CompileCache {
    /// The cache for `engine` under `root`: one folder per engine compatibility hash.
    pub(crate) fn new(root: &Path, engine: &Engine) -> Self {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        CompileCache {
            dir: root.join(format!("engine-{:016x}", hasher.finish())),
        }
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.cwasm"))
    }

    /// The cached compilation of the component with `digest`, if there is a sound one. A
    /// damaged entry is removed and reported as a miss.
    pub(crate) fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        let bytes = std::fs::read(&path).ok()?;
        let sound = bytes.len() > CHECKSUM_LEN
            && Sha256::digest(&bytes[CHECKSUM_LEN..]).as_slice() == &bytes[..CHECKSUM_LEN];
        // SAFETY: the bytes were produced by `Engine::precompile_component`-equivalent
        // serialization of this host (same engine compatibility hash) and pass their checksum;
        // bytes from anywhere else are never deserialized.
        let component = sound
            .then(|| unsafe { Component::deserialize(engine, &bytes[CHECKSUM_LEN..]) }.ok())
            .flatten();
        if component.is_none() {
            tracing::warn!(path = %path.display(), "removing a damaged compile-cache entry");
            let _ = std::fs::remove_file(&path);
        }
        component
    }

    /// Store the compilation of `digest` atomically.
    pub(crate) fn put(&self, digest: &str, component: &Component) -> std::io::Result<()> {
        let artifact = component
            .serialize()
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        crate::store::write_atomic_with(&self.path(digest), |file| {
            file.write_all(&Sha256::digest(&artifact))?;
            file.write_all(&artifact)
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}
