//! Blob uploads in progress (the OCI distribution spec's upload sessions): each a file under
//! `DATA/registry/uploads/`, begun by one tenant for one repository; its bytes arrive with the
//! closing PUT or in PATCH chunks before it, and the PUT names the digest, which is checked
//! before the blob is stored. Uploads do not outlive the process: a start removes what an
//! earlier run left.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest as _, Sha256};

use super::errors::{OciCode, OciError};
use crate::api::TenantId;
use crate::market::{Digest, PackageName};

/// Uploads one tenant may have open at once.
const OPEN_PER_TENANT: usize = 64;

/// An upload in progress.
pub struct Upload {
    pub tenant: TenantId,
    pub name: PackageName,
    pub file: PathBuf,
    /// Bytes received so far.
    pub size: u64,
}

impl Upload {
    /// Append `bytes` (blocking file work).
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new().append(true).open(&self.file)?;
        file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// The digest of what was received (blocking file work).
    pub fn digest(&self) -> std::io::Result<Digest> {
        let mut file = std::fs::File::open(&self.file)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            let read = file.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        let text = format!("sha256:{}", hex::encode(hasher.finalize()));
        text.parse()
            .map_err(|e| std::io::Error::other(format!("{e}")))
    }
}

pub struct Uploads {
    dir: PathBuf,
    open: Mutex<HashMap<String, Upload>>,
}

impl Uploads {
    /// The uploads under `dir`, emptied of an earlier run's.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        Ok(Uploads {
            dir: dir.to_path_buf(),
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Begin an upload of `tenant` into `name` (blocking file work); its id.
    pub fn begin(&self, tenant: &TenantId, name: &PackageName) -> Result<String, OciError> {
        let open = self.lock().values().filter(|u| &u.tenant == tenant).count();
        if open >= OPEN_PER_TENANT {
            return Err(OciError::new(
                OciCode::Denied,
                format!(
                    "the tenant has {open} uploads open, the most it may: finish or abandon \
                     one first"
                ),
            ));
        }
        let mut id = [0u8; 16];
        getrandom::fill(&mut id)
            .map_err(|e| OciError::new(OciCode::Unknown, format!("no random id: {e}")))?;
        let id = hex::encode(id);
        let file = self.dir.join(&id);
        std::fs::File::create(&file)
            .map_err(|e| OciError::new(OciCode::Unknown, format!("beginning an upload: {e}")))?;
        self.lock().insert(
            id.clone(),
            Upload {
                tenant: tenant.clone(),
                name: name.clone(),
                file,
                size: 0,
            },
        );
        Ok(id)
    }

    /// Take upload `id` of `tenant` into `name` out while a request works on it (another
    /// request for it meanwhile finds none); another tenant's is unknown, as none is.
    pub fn take(
        &self,
        id: &str,
        tenant: &TenantId,
        name: &PackageName,
    ) -> Result<Upload, OciError> {
        let mut open = self.lock();
        match open.get(id) {
            Some(upload) if &upload.tenant == tenant && &upload.name == name => Ok(open
                .remove(id)
                .unwrap_or_else(|| unreachable!("just found"))),
            _ => Err(OciError::new(
                OciCode::BlobUploadUnknown,
                format!("no upload {id} of {name} is in progress"),
            )),
        }
    }

    /// Give back an upload taken with [`Uploads::take`] that goes on.
    pub fn put_back(&self, id: String, upload: Upload) {
        self.lock().insert(id, upload);
    }

    /// Bytes of `tenant`'s open uploads.
    pub fn pending_bytes(&self, tenant: &TenantId) -> u64 {
        self.lock()
            .values()
            .filter(|u| &u.tenant == tenant)
            .map(|u| u.size)
            .sum()
    }
}
