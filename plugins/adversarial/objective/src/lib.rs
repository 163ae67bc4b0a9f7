//! An objective that misbehaves as its config names: `"loop"` never returns (fuel or the
//! deadline must end it), `"nan"` returns a NaN gradient, `"short"` a gradient one value short,
//! `"memory"` allocates until the memory limit, `"error"` fails as a plugin; anything else is a
//! well-behaved `-Σ logp` (gradient -1 everywhere), so that one component serves every case.

use opentinker_sdk::{DatumLoss, Objective, ObjectiveDatum, PluginError};

pub struct Misbehaving;

impl Objective for Misbehaving {
    fn loss(config: &str, datum: &ObjectiveDatum) -> Result<DatumLoss, PluginError> {
        let n = datum.logprobs.len();
        let mut gradient = vec![-1.0; n];
        match config.trim_matches(|c| c == '"') {
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

opentinker_sdk::export_objective!(Misbehaving);
