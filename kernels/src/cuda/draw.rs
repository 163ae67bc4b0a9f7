//! Drawing tokens from logits that stay on the device (`draw_tokens` in `kernels.cu`): the
//! sampler's temperature, top-k and top-p run where the logits are, and only the drawn tokens,
//! their logprobs and the most likely alternatives come back, instead of rows × vocab floats.
//!
//! A draw's result is the host's `choose` on the same row: the same cut, the same order of the
//! draw, the same logprobs up to the order of a sum in f64.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::error::{DriverContext, GpuError, ensure};
use super::{Gpu, grid, int};

/// Threads of a draw's block (`DRAW_THREADS` in `kernels.cu`).
const DRAW_THREADS: u32 = 256;

/// One token to draw from one row of logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    /// The row of the logits it is drawn from.
    pub row: usize,
    /// 0 takes the row's most likely token.
    pub temperature: f64,
    /// Keep the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest most-likely prefix whose mass reaches this (1: all).
    pub top_p: f64,
    /// The draw's uniform number in `[0, 1)`.
    pub uniform: f64,
    /// How many of the most likely tokens to return with it.
    pub top: usize,
}

/// A drawn token.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    pub token: u32,
    /// Its logprob under softmax(logits / temperature) (softmax(logits) at temperature 0), before
    /// any cut.
    pub logprob: f32,
    /// The most likely tokens of that distribution with their logprobs, most likely first, ties
    /// by id.
    pub top: Vec<(u32, f32)>,
}

impl Gpu {
    /// Draws each of `draws` from its row of `logits` (rows × `width`), on the device.
    pub fn draw_tokens(
        &self,
        logits: &CudaSlice<f32>,
        width: usize,
        draws: &[Draw],
    ) -> Result<Vec<Drawn>, GpuError> {
        ensure(width > 0 && logits.len().is_multiple_of(width), || {
            format!("logits have {} values, not rows × {width}", logits.len())
        })?;
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        let rows = logits.len() / width;
        for draw in draws {
            ensure(draw.row < rows, || {
                format!("a draw reads row {} of {rows}", draw.row)
            })?;
            ensure(
                draw.temperature.is_finite() && draw.temperature >= 0.0,
                || {
                    format!(
                        "temperature {} is not a finite number >= 0",
                        draw.temperature
                    )
                },
            )?;
            ensure(draw.top_p > 0.0 && draw.top_p <= 1.0, || {
                format!("top_p {} is outside (0, 1]", draw.top_p)
            })?;
            ensure(draw.top_k != Some(0), || "top_k is 0".to_string())?;
            ensure((0.0..1.0).contains(&draw.uniform), || {
                format!("uniform {} is outside [0, 1)", draw.uniform)
            })?;
        }
        let width_i = int(width, "row width")?;
        // Bits of a key's id part: width - 1 fits in them.
        let id_bits = (usize::BITS - (width - 1).leading_zeros()) as i32;
        let max_top = draws.iter().map(|d| d.top.min(width)).max().unwrap_or(0);
        let row_of: Vec<i32> = draws.iter().map(|d| d.row as i32).collect();
        // The kernel's scale: 1 / temperature as the host computes it, below 0 for the argmax.
        let scales: Vec<f32> = draws
            .iter()
            .map(|d| match d.temperature {
                0.0 => -1.0,
                t => (1.0 / t) as f32,
            })
            .collect();
        let top_k: Vec<i32> = draws
            .iter()
            .map(|d| d.top_k.map_or(width_i, |k| k.min(width) as i32))
            .collect();
        let top_p: Vec<f64> = draws.iter().map(|d| d.top_p).collect();
        let uniforms: Vec<f64> = draws.iter().map(|d| d.uniform).collect();
        let tops: Vec<i32> = draws.iter().map(|d| d.top.min(width) as i32).collect();
        let (row_of, scales, top_k) = (
            self.upload(&row_of)?,
            self.upload(&scales)?,
            self.upload(&top_k)?,
        );
        let (top_p, uniforms, tops_d) = (
            self.upload(&top_p)?,
            self.upload(&uniforms)?,
            self.upload(&tops)?,
        );
        let stream = self.stream();
        let alloc = "allocating device memory";
        let mut tokens = stream.alloc_zeros::<i32>(draws.len()).doing(alloc)?;
        let mut logprobs = stream.alloc_zeros::<f32>(draws.len()).doing(alloc)?;
        let top_len = (draws.len() * max_top).max(1);
        let mut top_ids = stream.alloc_zeros::<i32>(top_len).doing(alloc)?;
        let mut top_logprobs = stream.alloc_zeros::<f32>(top_len).doing(alloc)?;
        let max_top_i = int(max_top, "top")?;
        let mut launch = stream.launch_builder(&self.kernels.draw_tokens);
        launch
            .arg(logits)
            .arg(&width_i)
            .arg(&id_bits)
            .arg(&row_of)
            .arg(&scales)
            .arg(&top_k)
            .arg(&top_p)
            .arg(&uniforms)
            .arg(&tops_d)
            .arg(&max_top_i)
            .arg(&mut tokens)
            .arg(&mut logprobs)
            .arg(&mut top_ids)
            .arg(&mut top_logprobs);
        let config = LaunchConfig {
            grid_dim: (grid(draws.len())?, 1, 1),
            block_dim: (DRAW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `draw_tokens`: every row index is below `rows` (checked), each draw's
        // top list has `max_top` places, and one block of DRAW_THREADS runs each draw.
        unsafe { launch.launch(config) }.doing("launching draw_tokens")?;
        let copy = "copying from the device";
        let tokens = stream.clone_dtoh(&tokens).doing(copy)?;
        let logprobs = stream.clone_dtoh(&logprobs).doing(copy)?;
        let top_ids = stream.clone_dtoh(&top_ids).doing(copy)?;
        let top_logprobs = stream.clone_dtoh(&top_logprobs).doing(copy)?;
        Ok(tokens
            .iter()
            .zip(&logprobs)
            .zip(&tops)
            .enumerate()
            .map(|(d, ((&token, &logprob), &top))| {
                let from = d * max_top;
                let mut top: Vec<(u32, f32)> = top_ids[from..from + top as usize]
                    .iter()
                    .zip(&top_logprobs[from..])
                    .map(|(&id, &logprob)| (id as u32, logprob))
                    .collect();
                top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                Drawn {
                    token: token as u32,
                    logprob,
                    top,
                }
            })
            .collect())
    }
}
