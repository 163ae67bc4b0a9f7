//! The registry's state, held by the server's state: where its packages are stored, who owns
//! each namespace, the uploads under way.

use super::owners::Owners;
use super::uploads::Uploads;
use crate::market::LayoutRegistry;

/// The registry's storage, owners, uploads and the tenants' trust policies.
pub struct HostedRegistry {
    pub(super) store: LayoutRegistry,
    pub(super) owners: Owners,
    pub(super) uploads: Uploads,
    pub(super) trust_dir: std::path::PathBuf,
    /// The registry as clients name it (`oci://ADDR`), for lock files.
    pub(super) location: String,
    /// Manifest pushes one at a time, so that two pushes of one version cannot both find it
    /// free.
    pub(super) publishing: tokio::sync::Mutex<()>,
}

impl HostedRegistry {
    /// The registry under `data` of the server at `addr` (blocking: opens the database and
    /// clears old uploads).
    pub fn open(data: &std::path::Path, addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let dir = data.join("registry");
        Ok(HostedRegistry {
            store: LayoutRegistry::new(&dir),
            owners: Owners::open(data)?,
            uploads: Uploads::open(&data.join("registry-uploads"))?,
            trust_dir: data.join("trust"),
            location: format!("oci://{addr}"),
            publishing: tokio::sync::Mutex::new(()),
        })
    }
}
