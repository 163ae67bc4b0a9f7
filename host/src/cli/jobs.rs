//! Reading job files for the commands that run them (`train`, `play`, `replay`): the file is
//! checked, then each plugin given as a source folder is built into a component, so that the
//! driver only ever loads components.

use std::path::Path;

use anyhow::Context;

use crate::plugin::build::build_plugin;
use crate::rl::job::Job;

/// Read and check the job file at `path`, and build its plugins' source folders.
pub fn load_and_build(path: &Path) -> anyhow::Result<Job> {
    let mut job = Job::load(path)?;
    build_plugins(path, &mut job)?;
    Ok(job)
}

/// Build the plugins of `job` (read from `path`) that are source folders into components.
pub fn build_plugins(path: &Path, job: &mut Job) -> anyhow::Result<()> {
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
