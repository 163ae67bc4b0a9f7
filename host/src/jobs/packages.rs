//! Where the plugins a server job names as `namespace/name@RANGE` come from: a registry the
//! server holds, which resolves the range and checks the version under the submitting tenant's
//! trust (the server's own registry implements it).

use async_trait::async_trait;

use crate::api::TenantId;
use crate::market::packages::Fetched;
use crate::market::{MarketError, PackageRef};

#[async_trait]
pub trait PackageSource: Send + Sync {
    /// The registry, as a lock file names it.
    fn location(&self) -> String;

    /// The best version of `wanted` for `tenant`, fetched and checked under its trust.
    async fn fetch(&self, tenant: &TenantId, wanted: &PackageRef) -> Result<Fetched, MarketError>;
}
