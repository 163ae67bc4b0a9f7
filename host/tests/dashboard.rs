//! The web dashboard in a real headless browser during a running job: Playwright (from the test
//! venv) drives Debian's Chromium (`scripts/test.sh` installs it) through
//! `tests/dashboard/dashboard_live.py`. The screenshot it takes is docs/jobs.md's when
//! `OPENTINKER_SCREENSHOT` names where to keep it.

#[path = "common/arithmetic_job.rs"]
mod arithmetic_job;
#[path = "common/server.rs"]
mod server;

use std::path::Path;
use std::process::Command;

use arithmetic_job::ArithmeticJob;
use opentinker_test_tools::{chromium, test_python as python};
use server::{bin, start_server};

#[test]
fn the_dashboard_shows_a_running_job_its_curves_and_rollouts_in_a_real_browser() {
    let (Some(python), Some(chromium)) = (python(), chromium()) else {
        return;
    };
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let job = ArithmeticJob {
        sft_steps: 20,
        full_parameters: false,
        rl_steps: 200,
        rl_extra: "",
        sections: "",
    }
    .write(dir.path(), "arithmetic");
    let submitted = Command::new(bin())
        .args(["submit", "--detach"])
        .arg(&job)
        .env("TINKER_BASE_URL", &server.url)
        .env("TINKER_API_KEY", &server.alice)
        .output()
        .unwrap();
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let id = String::from_utf8(submitted.stdout)
        .unwrap()
        .trim()
        .to_string();
    let screenshot = std::env::var_os("OPENTINKER_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("dashboard.png"));
    let output = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/dashboard_live.py"))
        .env("TINKER_BASE_URL", &server.url)
        .env("TINKER_API_KEY", &server.alice)
        .env("JOB_ID", &id)
        .env("OPENTINKER_CHROMIUM", &chromium)
        .env("SCREENSHOT", &screenshot)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running the browser script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(
        output.status.success(),
        "the dashboard check failed:\n{text}"
    );
    assert!(screenshot.is_file());
}
