//! The fused LoRA projection `y = x Wᵀ + b + scale · (x Aᵀ) Bᵀ` as one custom op with its own
//! backward.
//!
//! Built from separate candle ops, the graph keeps the base output, the delta, its scaled copy
//! and the sum alive until the backward pass: four output-sized tensors per projection where one
//! suffices (on the 0.5B shape that made LoRA training use more memory than full-parameter
//! training). The op keeps only its output, and its backward computes the gradients of `x`, `A`
//! and `B`, never the frozen `W`'s.

use candle_core::{CpuStorage, CustomOp3, D, Layout, Shape, Tensor};

use crate::model::gemm::{Float, contiguous, matmul_nt, project, storage};

use crate::model::transformer::Linear;

/// One LoRA-adapted projection, applied with [`Tensor::apply_op3`] to `(x, A, B)`.
pub struct LoraLinear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub scale: f64,
}

impl LoraLinear {
    pub fn new(base: &Linear, scale: f64) -> Self {
        LoraLinear {
            weight: base.weight.clone(),
            bias: base.bias.clone(),
            scale,
        }
    }

    fn forward_slices<T: Float>(
        &self,
        [(x, x_layout), (a, a_layout), (b, b_layout)]: [(&[T], &Layout); 3],
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, a, b) = (
            contiguous(x, x_layout, "lora-linear")?,
            contiguous(a, a_layout, "lora-linear")?,
            contiguous(b, b_layout, "lora-linear")?,
        );
        let (out, inp) = self.weight.dims2()?;
        let rank = a_layout.dims().first().copied().unwrap_or(0);
        let mut dims = x_layout.dims().to_vec();
        if dims.last() != Some(&inp) || a.len() != rank * inp || b.len() != out * rank || rank == 0
        {
            return Err(candle_core::Error::Msg(format!(
                "lora-linear: x {dims:?}, A {:?} and B {:?} do not fit a weight of ({out}, {inp})",
                a_layout.dims(),
                b_layout.dims()
            )));
        }
        let rows = x.len() / inp;
        let mut y = project(x, &self.weight, self.bias.as_ref())?;
        let mut down = vec![T::zero(); rows * rank];
        matmul_nt(x, a, inp, &mut down, false);
        let scale = T::from_f64(self.scale);
        for v in &mut down {
            *v *= scale;
        }
        matmul_nt(&down, b, rank, &mut y, true);
        *dims.last_mut().expect("checked above") = out;
        Ok((storage(y), Shape::from(dims)))
    }
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match (x, a, b) {
            (CpuStorage::F32(x), CpuStorage::F32(a), CpuStorage::F32(b)) => {
                self.forward_slices([(x, x_layout), (a, a_layout), (b, b_layout)])
            }
            (CpuStorage::F64(x), CpuStorage::F64(a), CpuStorage::F64(b)) => {
                self.forward_slices([(x, x_layout), (a, a_layout), (b, b_layout)])
            }
            _ => Err(candle_core::Error::Msg(
                "lora-linear needs x, A and B all f32 or all f64".into(),
            )),
        }
    }

    /// With `g` the output's gradient and `s` the scale: `dx = g W + s (g B) A`,
    /// `dA = s (g B)ᵀ x`, `dB = s gᵀ (x Aᵀ)`, summed over every row.
    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (x, a, b) = (x.detach(), a.detach(), b.detach());
        let inp = x.dim(D::Minus1)?;
        let out = g.dim(D::Minus1)?;
        let rows_x = x.reshape(((), inp))?;
        let rows_g = g.reshape(((), out))?;
        let g_b = (rows_g.matmul(&b)? * self.scale)?;
        let dx = (rows_g.matmul(&self.weight)? + g_b.matmul(&a)?)?.reshape(x.shape())?;
        let da = g_b.t()?.matmul(&rows_x)?;
        let down = (rows_x.matmul(&a.t()?)? * self.scale)?;
        let db = rows_g.t()?.matmul(&down)?;
        Ok((Some(dx), Some(da), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Var};

    use super::*;

    fn random(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|i| (((i as u64 + 1) * 2654435761 + seed * 97) % 1000) as f64 / 1000.0 - 0.5)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// The fused op against the same math from differentiable candle ops: output and the
    /// gradients of x, A and B; the frozen weight gets none.
    #[test]
    fn matches_the_unfused_graph_forward_and_backward() {
        let weight = Var::from_tensor(&random(&[6, 5], 1)).unwrap();
        let bias = random(&[6], 2);
        let x = Var::from_tensor(&random(&[2, 3, 5], 3)).unwrap();
        let a = Var::from_tensor(&random(&[4, 5], 4)).unwrap();
        let b = Var::from_tensor(&random(&[6, 4], 5)).unwrap();
        let scale = 1.7;
        let op = LoraLinear {
            weight: weight.as_tensor().detach(),
            bias: Some(bias.clone()),
            scale,
        };
        let fused = x
            .as_tensor()
            .apply_op3(a.as_tensor(), b.as_tensor(), op)
            .unwrap();
        let reference = (x
            .as_tensor()
            .broadcast_matmul(&weight.as_tensor().t().unwrap())
            .unwrap()
            .broadcast_add(&bias)
            .unwrap()
            + (x.as_tensor()
                .broadcast_matmul(&a.as_tensor().t().unwrap())
                .unwrap()
                .broadcast_matmul(&b.as_tensor().t().unwrap())
                .unwrap()
                * scale)
                .unwrap())
        .unwrap();
        assert!(max_abs_diff(&fused, &reference) < 1e-12);
        assert_eq!(fused.dtype(), DType::F64);

        let weights_of_output = random(&[2, 3, 6], 6);
        let loss = |y: &Tensor| (y * &weights_of_output).unwrap().sum_all().unwrap();
        let fused_grads = loss(&fused).backward().unwrap();
        let reference_grads = loss(&reference).backward().unwrap();
        for var in [&x, &a, &b] {
            let got = fused_grads.get(var.as_tensor()).unwrap();
            let want = reference_grads.get(var.as_tensor()).unwrap();
            assert!(max_abs_diff(got, want) < 1e-12);
        }
        assert!(fused_grads.get(weight.as_tensor()).is_none());
    }
}
