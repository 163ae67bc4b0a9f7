//! A job file (TOML, as `opentinker train` and the jobs service read it) is a job or a named
//! problem, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentinker::rl::Job;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Job::parse(text, std::path::Path::new("fuzz/job.toml"));
    }
});
