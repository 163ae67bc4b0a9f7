//! The Python interpreter of the tests that drive the server with Python clients (the `tinker`
//! and `openai` packages, Playwright): `OPENTINKER_TEST_PYTHON`, a virtual environment that
//! `scripts/test.sh` makes outside the repository from `scripts/requirements-test.txt`. Without
//! it the tests say so and pass, except under CI (`CI` set), where they fail.

use std::path::PathBuf;

pub fn python() -> Option<PathBuf> {
    match std::env::var_os("OPENTINKER_TEST_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None if std::env::var_os("CI").is_some() => {
            panic!("OPENTINKER_TEST_PYTHON is not set: run the tests with scripts/test.sh")
        }
        None => {
            eprintln!(
                "skipped: OPENTINKER_TEST_PYTHON is not set (scripts/test.sh makes the venv and sets it)"
            );
            None
        }
    }
}
