//! The server's key for signing download URLs (`downloads`): HMAC-SHA256 over the tenant, the
//! export, the file and the expiry, under a random key kept in the data folder and made at the
//! server's first start.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::api::{CheckpointPath, TenantId};
use crate::store::write_atomic;

/// The signing key's file in the data folder.
const KEY_FILE: &str = "url-signing.key";

/// The server's key for signing download URLs, made at its first start.
pub struct UrlSigner {
    key: [u8; 32],
}

impl UrlSigner {
    /// The key kept in `data`, made (random, owner-readable only) if there is none.
    pub fn open(data: &Path) -> std::io::Result<Self> {
        let path = data.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key = bytes.try_into().map_err(|_| {
                    std::io::Error::other(format!("{} is not a 32-byte key", path.display()))
                })?;
                Ok(UrlSigner { key })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(std::io::Error::other)?;
                write_atomic(&path, &key)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                Ok(UrlSigner { key })
            }
            Err(error) => Err(error),
        }
    }

    fn mac(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        file: &str,
        expires: i64,
    ) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes a key of any size");
        for part in [
            tenant.as_str(),
            &path.to_string(),
            file,
            &expires.to_string(),
        ] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        mac
    }

    pub(super) fn sign(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        file: &str,
        expires: i64,
    ) -> String {
        hex::encode(
            self.mac(tenant, path, file, expires)
                .finalize()
                .into_bytes(),
        )
    }

    pub(super) fn verify(
        &self,
        tenant: &TenantId,
        path: &CheckpointPath,
        file: &str,
        expires: i64,
        signature: &str,
    ) -> bool {
        hex::decode(signature).is_ok_and(|bytes| {
            self.mac(tenant, path, file, expires)
                .verify_slice(&bytes)
                .is_ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_opens_its_own_file_until_its_expiry_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let signer = UrlSigner::open(dir.path()).unwrap();
        let again = UrlSigner::open(dir.path()).unwrap();
        assert_eq!(signer.key, again.key, "the key is kept");
        let tenant = TenantId::new("alice").unwrap();
        let path: CheckpointPath = "tinker://s1:train:0/external_weights/final"
            .parse()
            .unwrap();
        let signature = signer.sign(&tenant, &path, "adapter_model.safetensors", 100);
        assert!(signer.verify(&tenant, &path, "adapter_model.safetensors", 100, &signature));
        assert!(!signer.verify(&tenant, &path, "adapter_config.json", 100, &signature));
        assert!(!signer.verify(&tenant, &path, "adapter_model.safetensors", 101, &signature));
        let bob = TenantId::new("bob").unwrap();
        assert!(!signer.verify(&bob, &path, "adapter_model.safetensors", 100, &signature));
        assert!(!signer.verify(&tenant, &path, "adapter_model.safetensors", 100, "zz"));
    }
}
