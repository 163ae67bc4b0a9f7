//! A linear layer whose weight is frozen: `y = x Wᵀ + b` with a backward that returns only the
//! input's gradient. candle's own matmul backward also computes the weight's gradient (an extra
//! weight-sized GEMM and its memory per layer) even for a weight that is not trained; LoRA
//! training never needs it.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use super::gemm::{Float, contiguous, project, storage};

/// The frozen projection, applied with [`Tensor::apply_op1`].
pub struct FrozenLinear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl FrozenLinear {
    fn forward_slice<T: Float>(
        &self,
        data: &[T],
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(data, layout, "frozen-linear")?;
        let (out, inp) = self.weight.dims2()?;
        let mut dims = layout.dims().to_vec();
        if dims.last() != Some(&inp) {
            return Err(candle_core::Error::Msg(format!(
                "frozen-linear: input {dims:?} does not end in the weight's {inp}"
            )));
        }
        let y = project(x, &self.weight, self.bias.as_ref())?;
        *dims.last_mut().expect("checked above") = out;
        Ok((storage(y), Shape::from(dims)))
    }
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match storage {
            CpuStorage::F32(data) => self.forward_slice(data, layout),
            CpuStorage::F64(data) => self.forward_slice(data, layout),
            _ => Err(candle_core::Error::Msg(
                "frozen-linear supports f32 and f64 inputs".into(),
            )),
        }
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.broadcast_matmul(&self.weight)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

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

    fn random(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|i| (((i as u64 + 1) * 2654435761 + seed * 97) % 1000) as f64 / 1000.0 - 0.5)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn forward_matches_matmul_and_backward_gives_only_the_input_gradient() {
        let weight = random(&[5, 3], 1);
        let bias = random(&[5], 2);
        let x = Var::from_tensor(&random(&[2, 4, 3], 3)).unwrap();
        let weight_var = Var::from_tensor(&weight).unwrap();
        let frozen = FrozenLinear {
            weight: weight_var.as_tensor().clone(),
            bias: Some(bias.clone()),
        };
        let y = x.as_tensor().apply_op1(frozen).unwrap();
        let reference = x
            .as_tensor()
            .broadcast_matmul(&weight.t().unwrap())
            .unwrap()
            .broadcast_add(&bias)
            .unwrap();
        assert!(max_abs_diff(&y, &reference) < 1e-12);

        let loss = (y.sqr().unwrap().sum_all().unwrap() * 0.5).unwrap();
        let grads = loss.backward().unwrap();
        // d/dx of ½‖xWᵀ+b‖² is (xWᵀ+b)W.
        let expected = reference.broadcast_matmul(&weight).unwrap();
        let got = grads.get(x.as_tensor()).unwrap();
        assert!(max_abs_diff(got, &expected) < 1e-12);
        // Even a weight that is a variable gets no gradient through the frozen op.
        assert!(grads.get(weight_var.as_tensor()).is_none());
        assert_eq!(got.dtype(), DType::F64);
    }
}
