//! Jobs as a service (an opentinker extension of the API): tenants upload compiled plugins
//! ([`plugin_store`]) or name published ones ([`packages`]) and submit whole job files, which the server checks, records
//! ([`records`]) and runs ([`runner`]) with the RL driver on its served bases, as the tenant.
//! The server's routes and the CLI are the clients of this module; it knows nothing of HTTP.

pub mod admission;
pub mod packages;
pub mod plugin_store;
pub mod records;
pub mod runner;

pub use admission::{MemoryBudget, QueuePlace, human_bytes, served_base_bytes};
pub use packages::PackageSource;
pub use plugin_store::{PluginStore, StoredPlugin};
pub use records::{JobRecord, JobState};
pub use runner::{JobEvent, JobQuotas, JobService, JobStatus, RunFile, StepLine, Submitted};
