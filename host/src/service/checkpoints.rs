//! The tenants' saved checkpoints on disk: `data/checkpoints/TENANT/MODEL/KIND/NAME/`, each a
//! PEFT adapter folder (`train::checkpoint`) and a `checkpoint.json` that says when it was saved,
//! when it expires (`ttl_seconds` of `save_state` / `save_weights_for_sampler`) and what the
//! client attached to it (`user_metadata`).
//!
//! A path is only ever looked up under its tenant's own folder, so another tenant's checkpoint is
//! simply not there and is answered as an unknown one. An expired checkpoint is gone for every
//! reader at once; [`CheckpointStore::sweep`] frees its files later. A deletion first renames the
//! folder out of the tree (`data/deleted/`), so no reader sees it half removed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::export::ENCRYPTED_SUFFIX;
use crate::api::{
    ApiError, ApiErrorKind, CheckpointInfo, CheckpointKind, CheckpointPath, ModelId, SaveOptions,
    TenantId, UserMetadata,
};
use crate::store::unix_now;

/// The record of a checkpoint folder.
const RECORD_FILE: &str = "checkpoint.json";
/// Every checkpoint folder has it (`train::checkpoint` writes it); a folder without it is not one.
const ADAPTER_CONFIG: &str = "adapter_config.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// Unix seconds.
    saved_at: i64,
    /// Unix seconds; none: kept until deleted.
    expires_at: Option<i64>,
    #[serde(default)]
    user_metadata: UserMetadata,
}

/// The checkpoint folders under a server's data folder.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    root: PathBuf,
    deleted: PathBuf,
}

impl CheckpointStore {
    pub fn new(data: &Path) -> Self {
        CheckpointStore {
            root: data.join("checkpoints"),
            deleted: data.join("deleted"),
        }
    }

    /// Refuse a new checkpoint of `tenant`'s once its checkpoints take `max_bytes` or more on
    /// disk (a save may pass the quota by its own size, once).
    pub fn check_room(&self, tenant: &TenantId, max_bytes: u64) -> Result<(), ApiError> {
        let used = size_of_tree(&self.root.join(tenant.as_str()));
        if used >= max_bytes {
            return Err(ApiError::new(
                ApiErrorKind::QuotaExceeded,
                format!(
                    "your checkpoints take {used} bytes, the most a tenant keeps is {max_bytes}: \
                     delete some (or let their ttl_seconds expire) before saving more"
                ),
            ));
        }
        Ok(())
    }

    /// Where `tenant`'s checkpoint `path` is (or would be) kept.
    pub fn dir(&self, tenant: &TenantId, path: &CheckpointPath) -> PathBuf {
        self.model_dir(tenant, &path.model)
            .join(path.kind.as_str())
            .join(&path.name)
    }

    fn model_dir(&self, tenant: &TenantId, model: &ModelId) -> PathBuf {
        self.root.join(tenant.as_str()).join(model.to_string())
    }

    /// The folder of `path` if it is one of `tenant`'s checkpoints and has not expired.
    pub fn existing(&self, tenant: &TenantId, path: &CheckpointPath) -> Result<PathBuf, ApiError> {
        let dir = self.dir(tenant, path);
        let live = dir.is_dir() && !read_record(&dir).is_some_and(|r| expired(&r, unix_now()));
        match live {
            true => Ok(dir),
            false => Err(ApiError::not_found(format!("checkpoint {path}"))),
        }
    }

    /// The files of `tenant`'s live checkpoint `path`, by name (its record left out), each with
    /// where it lies.
    pub fn files(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
    ) -> Result<Vec<(String, PathBuf)>, ApiError> {
        let dir = self.existing(tenant, path)?;
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ApiError::internal(format!("listing checkpoint {path}: {e}")))?;
        let mut files: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.path().is_file())
            .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
            .filter(|(name, _)| name != RECORD_FILE)
            .collect();
        files.sort();
        Ok(files)
    }

    /// The folder of `path`, as [`Self::existing`], for a load into a model or a sampler: an
    /// export (`external_weights`) is refused, its files being for download (and perhaps
    /// encrypted to the client's keys).
    pub fn loadable(&self, tenant: &TenantId, path: &CheckpointPath) -> Result<PathBuf, ApiError> {
        if path.kind == CheckpointKind::External {
            return Err(ApiError::invalid(format!(
                "{path} is an export for download; load a training or sampler checkpoint"
            )));
        }
        self.existing(tenant, path)
    }

    /// Record when the checkpoint just saved in `dir` was saved, when it expires and what the
    /// client attached to it.
    pub fn set_retention(&self, dir: &Path, options: &SaveOptions) -> std::io::Result<()> {
        let saved_at = unix_now();
        let record = Record {
            saved_at,
            expires_at: expiry(saved_at, options.ttl_seconds),
            user_metadata: options.user_metadata.clone(),
        };
        write_record(dir, &record)
    }

    /// Change when `tenant`'s checkpoint `path` expires (`None`: never).
    pub fn set_ttl(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        ttl_seconds: Option<u64>,
    ) -> Result<CheckpointInfo, ApiError> {
        let dir = self.existing(tenant, path)?;
        let mut record = read_record(&dir).unwrap_or_else(|| Record {
            saved_at: modified_at(&dir),
            expires_at: None,
            user_metadata: UserMetadata::new(),
        });
        record.expires_at = expiry(unix_now(), ttl_seconds);
        write_record(&dir, &record).map_err(|e| {
            ApiError::internal(format!("recording the expiry of checkpoint {path}: {e}"))
        })?;
        self.info(&dir, path.clone())
            .ok_or_else(|| ApiError::not_found(format!("checkpoint {path}")))
    }

    /// `tenant`'s live checkpoints of `model`, oldest first (by name for the same second).
    pub fn list(&self, tenant: &TenantId, model: &ModelId) -> Vec<CheckpointInfo> {
        let mut found = Vec::new();
        for kind in CheckpointKind::ALL {
            let folder = self.model_dir(tenant, model).join(kind.as_str());
            for name in folder_names(&folder) {
                let Ok(path) = CheckpointPath::new(model.clone(), kind, &name) else {
                    continue;
                };
                if let Some(info) = self.info(&folder.join(&name), path) {
                    found.push(info);
                }
            }
        }
        oldest_first(found)
    }

    /// `tenant`'s live checkpoints of all its models, oldest first.
    pub fn list_all(&self, tenant: &TenantId) -> Vec<CheckpointInfo> {
        let found: Vec<CheckpointInfo> = folder_names(&self.root.join(tenant.as_str()))
            .into_iter()
            .filter_map(|model| model.parse::<ModelId>().ok())
            .flat_map(|model| self.list(tenant, &model))
            .collect();
        oldest_first(found)
    }

    /// What a checkpoint folder holds, if it is a live checkpoint.
    fn info(&self, dir: &Path, path: CheckpointPath) -> Option<CheckpointInfo> {
        let sealed_config = format!("{ADAPTER_CONFIG}{ENCRYPTED_SUFFIX}");
        if !(dir.join(ADAPTER_CONFIG).is_file() || dir.join(sealed_config).is_file()) {
            // A folder being written (`store::StagedDir`'s `.writing-*`) or set aside.
            return None;
        }
        let record = read_record(dir);
        if record.as_ref().is_some_and(|r| expired(r, unix_now())) {
            return None;
        }
        let size_bytes = size_of_tree(dir);
        Some(match record {
            Some(record) => CheckpointInfo {
                path,
                saved_at: record.saved_at,
                size_bytes,
                expires_at: record.expires_at,
                user_metadata: record.user_metadata,
            },
            None => CheckpointInfo {
                path,
                saved_at: modified_at(dir),
                size_bytes,
                expires_at: None,
                user_metadata: UserMetadata::new(),
            },
        })
    }

    /// Delete `tenant`'s checkpoint `path`: it is gone at once, its files freed before this
    /// returns. Another tenant's, or one already gone, is not found.
    pub fn delete(&self, tenant: &TenantId, path: &CheckpointPath) -> Result<(), ApiError> {
        let dir = self.existing(tenant, path)?;
        self.remove(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ApiError::not_found(format!("checkpoint {path}")),
            _ => ApiError::internal(format!("deleting checkpoint {path}: {e}")),
        })
    }

    /// Take `dir` out of the tree by one rename, then free its files.
    fn remove(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.deleted)?;
        let aside = tempfile::Builder::new()
            .prefix("checkpoint-")
            .tempdir_in(&self.deleted)?
            .keep();
        std::fs::rename(dir, aside.join("folder"))?;
        std::fs::remove_dir_all(&aside)
    }

    /// Delete every expired checkpoint of every tenant, and whatever an interrupted deletion
    /// left in `data/deleted/`; the paths deleted.
    pub fn sweep(&self, now: i64) -> Vec<(TenantId, CheckpointPath)> {
        if let Ok(entries) = std::fs::read_dir(&self.deleted) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let mut swept = Vec::new();
        for tenant in folder_names(&self.root) {
            let Ok(tenant) = TenantId::new(&tenant) else {
                continue;
            };
            for model in folder_names(&self.root.join(tenant.as_str())) {
                let Ok(model) = model.parse::<ModelId>() else {
                    continue;
                };
                for kind in CheckpointKind::ALL {
                    let folder = self.model_dir(&tenant, &model).join(kind.as_str());
                    for name in folder_names(&folder) {
                        let dir = folder.join(&name);
                        let due = read_record(&dir).is_some_and(|r| expired(&r, now));
                        let Ok(path) = CheckpointPath::new(model.clone(), kind, &name) else {
                            continue;
                        };
                        if !due {
                            continue;
                        }
                        match self.remove(&dir) {
                            Ok(()) => swept.push((tenant.clone(), path)),
                            Err(error) => {
                                tracing::warn!(%path, %tenant, %error, "sweeping an expired checkpoint");
                            }
                        }
                    }
                }
            }
        }
        swept
    }
}

/// `checkpoints` by when they were saved, by path within a second.
fn oldest_first(mut checkpoints: Vec<CheckpointInfo>) -> Vec<CheckpointInfo> {
    checkpoints.sort_by_cached_key(|c| (c.saved_at, c.path.to_string()));
    checkpoints
}

fn expired(record: &Record, now: i64) -> bool {
    record.expires_at.is_some_and(|at| at <= now)
}

/// When a checkpoint kept `ttl_seconds` from `from` expires.
fn expiry(from: i64, ttl_seconds: Option<u64>) -> Option<i64> {
    ttl_seconds.map(|ttl| from.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX)))
}

fn read_record(dir: &Path) -> Option<Record> {
    let bytes = std::fs::read(dir.join(RECORD_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_record(dir: &Path, record: &Record) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    crate::store::write_atomic(&dir.join(RECORD_FILE), &bytes)
}

/// The names of the folders in `folder` (none if it is missing).
fn folder_names(folder: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// When a folder saved before retention records was last changed, in Unix seconds.
fn modified_at(dir: &Path) -> i64 {
    std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64)
}

fn size_of_tree(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => size_of_tree(&entry.path()),
            _ => entry.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(
        store: &CheckpointStore,
        tenant: &TenantId,
        path: &CheckpointPath,
        ttl: Option<u64>,
    ) {
        let dir = store.dir(tenant, path);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(ADAPTER_CONFIG), b"{}").unwrap();
        std::fs::write(dir.join("adapter_model.safetensors"), vec![0u8; 100]).unwrap();
        let options = SaveOptions {
            ttl_seconds: ttl,
            user_metadata: UserMetadata::from([("step".to_string(), "7".to_string())]),
        };
        store.set_retention(&dir, &options).unwrap();
    }

    #[test]
    fn checkpoints_are_listed_deleted_and_swept_per_tenant() {
        let data = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(data.path());
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        let model: ModelId = "s-1:train:0".parse().unwrap();
        let kept = CheckpointPath::new(model.clone(), CheckpointKind::Weights, "kept").unwrap();
        let brief =
            CheckpointPath::new(model.clone(), CheckpointKind::SamplerWeights, "brief").unwrap();
        checkpoint(&store, &alice, &kept, None);
        checkpoint(&store, &alice, &brief, Some(60));

        let listed = store.list(&alice, &model);
        assert_eq!(listed.len(), 2, "{listed:?}");
        let brief_info = listed.iter().find(|c| c.path == brief).unwrap();
        assert!(brief_info.expires_at.unwrap() >= brief_info.saved_at + 60);
        assert!(brief_info.size_bytes >= 100);
        assert_eq!(brief_info.user_metadata["step"], "7");
        assert!(
            store.list(&bob, &model).is_empty(),
            "bob sees alice's checkpoints"
        );
        assert_eq!(
            store.delete(&bob, &kept).unwrap_err().kind,
            crate::api::ApiErrorKind::NotFound
        );

        // Not due yet: the sweep keeps it; an hour later it is gone, files and all.
        assert!(store.sweep(unix_now()).is_empty());
        let swept = store.sweep(unix_now() + 3600);
        assert_eq!(swept, vec![(alice.clone(), brief.clone())]);
        assert!(!store.dir(&alice, &brief).exists());

        store.delete(&alice, &kept).unwrap();
        assert!(!store.dir(&alice, &kept).exists());
        assert!(store.existing(&alice, &kept).is_err());
        assert!(store.list(&alice, &model).is_empty());
        let leftovers: Vec<_> = std::fs::read_dir(data.path().join("deleted"))
            .unwrap()
            .collect();
        assert!(
            leftovers.is_empty(),
            "deleted files left behind: {leftovers:?}"
        );
    }

    #[test]
    fn an_expired_checkpoint_is_gone_before_the_sweep() {
        let data = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(data.path());
        let alice = TenantId::new("alice").unwrap();
        let model: ModelId = "s-1:train:0".parse().unwrap();
        let path = CheckpointPath::new(model.clone(), CheckpointKind::Weights, "old").unwrap();
        checkpoint(&store, &alice, &path, Some(0));
        assert!(store.existing(&alice, &path).is_err());
        assert!(store.list(&alice, &model).is_empty());
        assert_eq!(
            store.set_ttl(&alice, &path, None).unwrap_err().kind,
            crate::api::ApiErrorKind::NotFound
        );
    }

    #[test]
    fn a_tenant_past_its_checkpoint_bytes_saves_no_more() {
        let data = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(data.path());
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        store.check_room(&alice, 1000).unwrap();
        let dir = data.path().join("checkpoints/alice/s-1:train:0/weights/a");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("adapter.safetensors"), vec![0u8; 1000]).unwrap();
        let refused = store.check_room(&alice, 1000).unwrap_err();
        assert_eq!(refused.kind, ApiErrorKind::QuotaExceeded, "{refused}");
        store.check_room(&alice, 1001).unwrap();
        store.check_room(&bob, 1000).unwrap();
    }
}
