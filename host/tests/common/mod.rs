//! Helpers shared by the host's integration tests.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

pub mod reference;

use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};

/// A folder of the committed `transformers` fixture (see `scripts/make_model_fixture.py`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/transformers")
        .join(name)
}

/// The largest absolute difference between two tensors of the same shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .and_then(|d| d.abs()?.max_all()?.to_dtype(DType::F64)?.to_scalar::<f64>())
        .expect("tensors of the same shape")
}
