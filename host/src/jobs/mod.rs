//! Jobs as a service (an opentinker extension of the API): tenants upload compiled plugins (the
//! [`PluginStore`]) or name published ones (a [`PackageSource`]) and submit whole job files, which
//! the [`JobService`] checks, admits under the server's [`MemoryBudget`] (each job's
//! [`footprint`]), records ([`JobRecord`], [`JobState`]) and runs with the RL driver on its
//! served bases, as the tenant, reporting [`JobEvent`]s; their RL groups go to the tenant's
//! rollout workers where the server has a queue ([`ServerRollouts`]), whose users a
//! [`RolloutAccess`] signs when the queue has accounts. The server's routes and the CLI are the
//! clients of this module; it knows nothing of HTTP.

mod admission;
mod packages;
mod plugin_store;
mod records;
mod rollout_access;
mod runner;

pub use admission::{
    MemoryBudget, QueuePlace, footprint, human_bytes, machine_budget, served_base_bytes,
};
pub use packages::PackageSource;
pub use plugin_store::{PluginStore, StoredPlugin};
pub use records::{JobRecord, JobState};
pub use rollout_access::{RolloutAccess, RolloutAccessError};
pub use runner::{
    JobEvent, JobQuotas, JobService, JobStatus, RunFile, ServerRollouts, StepLine, Submitted,
};
