//! Reading job files for the commands that run them (`train`, `play`, `replay`, `submit`): the
//! file is checked, each plugin named `namespace/name@RANGE` is installed from its registry (as
//! the lock file pins it), and each plugin given as a source folder is built into a component,
//! so that the driver only ever loads components.

use std::path::Path;

use anyhow::Context;

use super::market::{PackageArgs, Unpinned};
use crate::plugin::build_plugin;
use crate::rl::Job;

/// Read and check the job file at `path`, and install or build its plugins.
pub fn load_and_build(path: &Path, packages: &PackageArgs) -> anyhow::Result<Job> {
    let mut job = Job::load(path)?;
    build_plugins(path, &mut job, packages, Unpinned::Install)?;
    Ok(job)
}

/// Install the published plugins of `job` (read from `path`) and build those that are source
/// folders into components.
pub fn build_plugins(
    path: &Path,
    job: &mut Job,
    packages: &PackageArgs,
    unpinned: Unpinned,
) -> anyhow::Result<()> {
    packages.install_job_packages(path, job, unpinned)?;
    for (section, plugin) in job.plugin_paths_mut() {
        if plugin.is_dir() {
            *plugin = build_plugin(plugin).with_context(|| {
                format!(
                    "{}: [{section}] plugin {}",
                    path.display(),
                    plugin.display()
                )
            })?;
        }
    }
    Ok(())
}
