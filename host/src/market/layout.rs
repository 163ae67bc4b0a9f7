//! An OCI image layout folder (the OCI image spec's `oci-layout`, `index.json`, `blobs/`) as a
//! registry, for offline use: `skopeo copy oci:DIR:NAMESPACE/NAME:VERSION ...` reads what it
//! holds. Each tag is an `index.json` entry whose `org.opencontainers.image.ref.name` is
//! `NAMESPACE/NAME:TAG`. One process writes a folder at a time; every file is written to a
//! temporary name, fsynced and renamed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::artifact::{Descriptor, MANIFEST_MEDIA_TYPE};
use super::registry::Registry;
use super::{Digest, MarketError, PackageName};

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    manifests: Vec<Descriptor>,
}

pub struct LayoutRegistry {
    dir: PathBuf,
    /// Index updates in this process, one at a time.
    writing: Arc<std::sync::Mutex<()>>,
}

impl LayoutRegistry {
    pub fn new(dir: &Path) -> Self {
        LayoutRegistry {
            dir: dir.to_path_buf(),
            writing: Arc::default(),
        }
    }

    /// Run the blocking file work `f` on tokio's blocking threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Layout) -> Result<T, MarketError> + Send + 'static,
    ) -> Result<T, MarketError> {
        let layout = Layout {
            dir: self.dir.clone(),
            writing: self.writing.clone(),
        };
        tokio::task::spawn_blocking(move || f(&layout))
            .await
            .map_err(|e| MarketError::Registry {
                registry: self.location(),
                message: e.to_string(),
            })?
    }
}

/// What a server hosting a layout as its registry needs beyond [`Registry`]: manifests by
/// digest, blob files, and blobs that arrive as files.
impl LayoutRegistry {
    /// The manifest `reference` of `name` (a tag, or the digest of a manifest one of its tags
    /// points at) and its digest; `None` when there is none.
    pub async fn find_manifest(
        &self,
        name: &PackageName,
        reference: &str,
    ) -> Result<Option<(Digest, Vec<u8>)>, MarketError> {
        let prefix = format!("{name}:");
        let reference = reference.to_string();
        self.blocking(move |layout| {
            let index = layout.index()?;
            let by_digest = reference.parse::<Digest>().ok();
            let entry = index.manifests.iter().find(|m| {
                let Some(tag) = Layout::ref_name(m).and_then(|r| r.strip_prefix(&prefix)) else {
                    return false;
                };
                match &by_digest {
                    Some(digest) => &m.digest == digest,
                    None => tag == reference,
                }
            });
            match entry {
                Some(entry) => Ok(Some((entry.digest.clone(), layout.read_blob(entry)?))),
                None => Ok(None),
            }
        })
        .await
    }

    /// The file of the blob `digest` and its size, when it is stored.
    pub async fn blob_file(&self, digest: &Digest) -> Result<Option<(PathBuf, u64)>, MarketError> {
        let digest = digest.clone();
        self.blocking(move |layout| {
            let path = layout.blob_path(&digest);
            match std::fs::metadata(&path) {
                Ok(meta) => Ok(Some((path, meta.len()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(MarketError::io(&path)(e)),
            }
        })
        .await
    }

    /// Take `file` (fsynced, on the same file system, its bytes checked to have `digest`) as
    /// the blob `digest`; a blob already stored stays and `file` is removed.
    pub async fn adopt_blob(&self, file: PathBuf, digest: &Digest) -> Result<(), MarketError> {
        let digest = digest.clone();
        self.blocking(move |layout| {
            let path = layout.blob_path(&digest);
            if path.exists() {
                return std::fs::remove_file(&file).map_err(MarketError::io(&file));
            }
            crate::store::rename_durably(&file, &path).map_err(MarketError::io(&path))
        })
        .await
    }
}

struct Layout {
    dir: PathBuf,
    writing: Arc<std::sync::Mutex<()>>,
}

impl Layout {
    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(digest.hex())
    }

    fn index(&self) -> Result<Index, MarketError> {
        let path = self.index_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| MarketError::Invalid {
                what: path.display().to_string(),
                message: format!("not an OCI image index: {e}"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index {
                schema_version: 2,
                media_type: Some(INDEX_MEDIA_TYPE.into()),
                manifests: Vec::new(),
            }),
            Err(e) => Err(MarketError::io(&path)(e)),
        }
    }

    fn tagged(name: &PackageName, tag: &str) -> String {
        format!("{name}:{tag}")
    }

    fn ref_name(entry: &Descriptor) -> Option<&str> {
        entry
            .annotations
            .as_ref()?
            .get(REF_NAME)
            .map(String::as_str)
    }

    fn write_blob(&self, bytes: &[u8]) -> Result<Digest, MarketError> {
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !path.exists() {
            crate::store::write_atomic(&path, bytes).map_err(MarketError::io(&path))?;
        }
        Ok(digest)
    }

    fn read_blob(&self, descriptor: &Descriptor) -> Result<Vec<u8>, MarketError> {
        let path = self.blob_path(&descriptor.digest);
        let size = std::fs::metadata(&path)
            .map_err(MarketError::io(&path))?
            .len();
        if size as i64 != descriptor.size {
            return Err(MarketError::Invalid {
                what: path.display().to_string(),
                message: format!(
                    "{size} bytes, not the {} its descriptor says",
                    descriptor.size
                ),
            });
        }
        std::fs::read(&path).map_err(MarketError::io(&path))
    }
}

#[async_trait]
impl Registry for LayoutRegistry {
    fn location(&self) -> String {
        format!("oci-layout:{}", self.dir.display())
    }

    async fn tags(&self, name: &PackageName) -> Result<Vec<String>, MarketError> {
        let prefix = format!("{name}:");
        self.blocking(move |layout| {
            Ok(layout
                .index()?
                .manifests
                .iter()
                .filter_map(|m| Layout::ref_name(m)?.strip_prefix(&prefix))
                .map(String::from)
                .collect())
        })
        .await
    }

    async fn manifest(
        &self,
        name: &PackageName,
        tag: &str,
    ) -> Result<Option<Vec<u8>>, MarketError> {
        let wanted = Layout::tagged(name, tag);
        self.blocking(move |layout| {
            let index = layout.index()?;
            let Some(entry) = index
                .manifests
                .iter()
                .find(|m| Layout::ref_name(m) == Some(&wanted))
            else {
                return Ok(None);
            };
            layout.read_blob(entry).map(Some)
        })
        .await
    }

    async fn blob(
        &self,
        _name: &PackageName,
        descriptor: &Descriptor,
    ) -> Result<Vec<u8>, MarketError> {
        let descriptor = descriptor.clone();
        self.blocking(move |layout| layout.read_blob(&descriptor))
            .await
    }

    async fn push_blob(&self, _name: &PackageName, bytes: &[u8]) -> Result<(), MarketError> {
        let bytes = bytes.to_vec();
        self.blocking(move |layout| layout.write_blob(&bytes).map(|_| ()))
            .await
    }

    async fn push_manifest(
        &self,
        name: &PackageName,
        tag: &str,
        manifest: &[u8],
    ) -> Result<(), MarketError> {
        let manifest = manifest.to_vec();
        let ref_name = Layout::tagged(name, tag);
        self.blocking(move |layout| {
            let _one_writer = layout.writing.lock().unwrap_or_else(|e| e.into_inner());
            let marker = layout.dir.join("oci-layout");
            if !marker.exists() {
                crate::store::write_atomic(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)
                    .map_err(MarketError::io(&marker))?;
            }
            layout.write_blob(&manifest)?;
            let mut index = layout.index()?;
            index
                .manifests
                .retain(|m| Layout::ref_name(m) != Some(&ref_name));
            let mut entry = Descriptor::of(MANIFEST_MEDIA_TYPE, &manifest);
            entry.annotations = Some([(REF_NAME.to_string(), ref_name)].into());
            index.manifests.push(entry);
            let path = layout.index_path();
            let text = serde_json::to_vec_pretty(&index).map_err(|e| MarketError::Invalid {
                what: path.display().to_string(),
                message: e.to_string(),
            })?;
            crate::store::write_atomic(&path, &text).map_err(MarketError::io(&path))
        })
        .await
    }

    async fn catalog(&self) -> Result<Vec<PackageName>, MarketError> {
        self.blocking(|layout| {
            let mut names: Vec<PackageName> = layout
                .index()?
                .manifests
                .iter()
                .filter_map(|m| Layout::ref_name(m)?.split_once(':')?.0.parse().ok())
                .collect();
            names.sort();
            names.dedup();
            Ok(names)
        })
        .await
    }
}
