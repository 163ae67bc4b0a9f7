//! The tenants' uploaded plugins: each component checked as the loader checks any plugin (a
//! component, a supported WIT version, only the imports the host provides, its structure within
//! the limits) and compiled a few at a time, off the request's thread, then stored under its
//! sha256, per tenant, in `DATA/plugins/TENANT/`. A job names them by digest; another tenant's
//! digest is unknown.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::api::{ApiError, ApiErrorKind, TenantId};
use crate::plugin::{HostConfig, LoadError, PluginHost, PluginKind};

/// Components compiled at once: compiling takes a core and up to a gibibyte each.
const CONCURRENT_COMPILES: usize = 2;

/// A stored plugin, as the API answers it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredPlugin {
    /// `sha256:` and the hex digest of its bytes.
    pub digest: String,
    pub kinds: Vec<PluginKind>,
    /// The `opentinker:plugin` version it exports.
    pub wit_version: Option<String>,
    pub bytes: usize,
}

/// The tenants' plugins, and the host that checks and compiles them.
pub struct PluginStore {
    root: PathBuf,
    host: PluginHost,
    compiles: Semaphore,
    /// The most bytes of components one tenant may store.
    max_bytes_per_tenant: u64,
}

impl PluginStore {
    /// The store under `data` (compiled artifacts cached in `data/plugin-cache`).
    pub fn open(data: &Path, max_bytes_per_tenant: u64) -> anyhow::Result<Self> {
        let host = PluginHost::new(HostConfig {
            cache_dir: Some(data.join("plugin-cache")),
            ..HostConfig::default()
        })?;
        Ok(PluginStore {
            root: data.join("plugins"),
            host,
            compiles: Semaphore::new(CONCURRENT_COMPILES),
            max_bytes_per_tenant,
        })
    }

    /// The host that compiled the plugins (its cache holds their compiled code): jobs load them
    /// with it.
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The stored component of `tenant`'s plugin `digest`; another tenant's is unknown.
    pub async fn component(&self, tenant: &TenantId, digest: &str) -> Result<PathBuf, ApiError> {
        let stored = self.get(tenant, digest).await?;
        let hex = stored.digest.trim_start_matches("sha256:");
        Ok(self.folder(tenant).join(format!("{hex}.wasm")))
    }

    fn folder(&self, tenant: &TenantId) -> PathBuf {
        self.root.join(tenant.as_str())
    }

    /// The most bytes of components one tenant may store (the server's registry counts what a
    /// tenant publishes against it too).
    pub fn max_bytes_per_tenant(&self) -> u64 {
        self.max_bytes_per_tenant
    }

    /// The bytes of components `tenant` has uploaded.
    pub async fn stored_bytes(&self, tenant: &TenantId) -> Result<u64, ApiError> {
        Ok(self
            .list(tenant)
            .await?
            .iter()
            .map(|p| p.bytes as u64)
            .sum())
    }

    /// Check and compile `bytes` as the loader does any plugin, without storing them: what it
    /// is, or why it is refused.
    pub async fn check(&self, bytes: Vec<u8>) -> Result<StoredPlugin, ApiError> {
        let size = bytes.len();
        let plugin = {
            let _turn =
                self.compiles.acquire().await.map_err(|_| {
                    ApiError::new(ApiErrorKind::Unavailable, "the server is stopping")
                })?;
            self.host.load(bytes).await.map_err(load_error)?
        };
        let description = plugin.description();
        Ok(StoredPlugin {
            digest: format!("sha256:{}", description.digest),
            kinds: description.kinds.clone(),
            wit_version: description.wit_version.clone(),
            bytes: size,
        })
    }

    /// Check, compile and store `bytes` for `tenant`.
    pub async fn put(&self, tenant: &TenantId, bytes: Vec<u8>) -> Result<StoredPlugin, ApiError> {
        let stored = self.stored_bytes(tenant).await?;
        if stored + bytes.len() as u64 > self.max_bytes_per_tenant {
            return Err(ApiError::new(
                ApiErrorKind::QuotaExceeded,
                format!(
                    "plugin refused: the tenant stores {stored} bytes of plugins, and {} more \
                     would pass its quota of {} bytes",
                    bytes.len(),
                    self.max_bytes_per_tenant
                ),
            ));
        }
        let stored = self.check(bytes.clone()).await?;
        let folder = self.folder(tenant);
        let hex = stored.digest.trim_start_matches("sha256:").to_string();
        let record = serde_json::to_vec_pretty(&stored)
            .map_err(|e| ApiError::internal(format!("encoding a plugin record: {e}")))?;
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&folder)?;
            // The bytes first: a record names only bytes that are there.
            crate::store::write_atomic(&folder.join(format!("{hex}.wasm")), &bytes)?;
            crate::store::write_atomic(&folder.join(format!("{hex}.json")), &record)
        })
        .await
        .map_err(|e| ApiError::internal(format!("storing the plugin: {e}")))?
        .map_err(|e| ApiError::internal(format!("storing the plugin: {e}")))?;
        Ok(stored)
    }

    /// The record of `tenant`'s plugin `digest` (`sha256:HEX`).
    pub async fn get(&self, tenant: &TenantId, digest: &str) -> Result<StoredPlugin, ApiError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "{digest:?} is not a digest (sha256: and 64 hex digits)"
                ))
            })?
            .to_ascii_lowercase();
        let path = self.folder(tenant).join(format!("{hex}.json"));
        let read = path.clone();
        let text = tokio::task::spawn_blocking(move || std::fs::read(read))
            .await
            .map_err(|e| ApiError::internal(format!("reading a plugin record: {e}")))?
            .map_err(|_| ApiError::not_found(format!("plugin {digest}")))?;
        serde_json::from_slice(&text)
            .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))
    }

    /// Every plugin of `tenant`, by digest.
    pub async fn list(&self, tenant: &TenantId) -> Result<Vec<StoredPlugin>, ApiError> {
        let folder = self.folder(tenant);
        tokio::task::spawn_blocking(move || {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                return Ok(Vec::new());
            };
            let mut plugins = Vec::new();
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "json") {
                    let text = std::fs::read(&path)
                        .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
                    plugins.push(
                        serde_json::from_slice::<StoredPlugin>(&text)
                            .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?,
                    );
                }
            }
            plugins.sort_by(|a, b| a.digest.cmp(&b.digest));
            Ok(plugins)
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing plugins: {e}")))?
    }
}

/// A component the host refuses is the uploader's fault; a host that cannot compile is not.
fn load_error(error: LoadError) -> ApiError {
    let kind = match error {
        LoadError::CompilerUnavailable(_) | LoadError::Read { .. } => ApiErrorKind::Internal,
        _ => ApiErrorKind::InvalidRequest,
    };
    ApiError::new(kind, format!("plugin refused: {error}"))
}
