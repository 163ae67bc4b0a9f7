//! An objective that misbehaves as its config names: `"loop"` never returns (fuel or the
//! deadline must end it), `"nan"` returns a NaN gradient, `"short"` a gradient one value short,
//! `"memory"` allocates until the memory limit, `"error"` fails as a plugin; anything else is a
//! well-behaved `-Σ logp` (gradient -1 everywhere), so that one component serves every case. The
//! config is the JSON string of the case, or an object whose first key names it (the Tinker
//! wire's `loss_fn_config` holds numbers only: `{"nan": 1}`).

use opentinker_sdk::{DatumLoss, Objective, ObjectiveDatum, PluginError};

pub struct Misbehaving;

impl Objective for Misbehaving {
    fn loss(config: &str, datum: &ObjectiveDatum) -> Result<DatumLoss, PluginError> {
        let n = datum.logprobs.len();
        let mut gradient = vec![-1.0; n];
        match case(config) {
            "loop" => {
                let mut counter = n as u64;
                loop {
                    counter = std::hint::black_box(
                        counter.wrapping_mul(6364136223846793005).wrapping_add(1),
                    );
                }
            }
            "nan" => gradient[0] = f32::NAN,
            "short" => {
                gradient.pop();
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "error" => return Err(PluginError::new("refusing on purpose")),
            _ => {}
        }
        Ok(DatumLoss {
            value: -datum.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>(),
            gradient,
            metrics: Vec::new(),
        })
    }
}

/// The case a config names: `"nan"` and `{"nan": 1}` both name `nan`.
fn case(config: &str) -> &str {
    let inner = config.trim().trim_start_matches('{');
    inner
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
}

opentinker_sdk::export_objective!(Misbehaving);
