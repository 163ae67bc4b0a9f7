//! The float types the training kernels run in: f32, and f64 for gradient checks.

/// f32 or f64.
pub trait Float:
    num_traits::Float
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + Send
    + Sync
    + std::fmt::Debug
    + Default
    + 'static
{
    /// `n` as this type.
    fn of(n: f64) -> Self;

    /// `e^self` for the inner loops of the row-wise ops (SiLU, softmax): in f32 a polynomial
    /// without calls or branches, which the compiler vectorises where libm's `expf` is one call
    /// per value; in f64 (the gradient checks) std's `exp`.
    fn fast_exp(self) -> Self;
}

impl Float for f32 {
    fn of(n: f64) -> Self {
        n as f32
    }

    #[inline(always)]
    fn fast_exp(self) -> Self {
        exp_f32(self)
    }
}

impl Float for f64 {
    fn of(n: f64) -> Self {
        n
    }

    #[inline(always)]
    fn fast_exp(self) -> Self {
        self.exp()
    }
}

/// `e^x` in f32, within 2 ulp of the exact value for normal results. Cephes' `expf`: with
/// `x = n·ln 2 + r`, `e^r` by a degree-7 polynomial on `|r| ≤ ln 2 / 2`, times `2^n` made from
/// its bits. Arguments are clamped to `[-87.3, 88.3]`, so results below `2^-126` come out as
/// about `1e-38` instead of 0 or a subnormal (`e^-∞` too), and the largest is about `2^127`; a
/// NaN stays NaN. Only float and integer arithmetic, no branch: the loops that call it
/// vectorise.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    /// Adding `1.5 · 2^23` rounds to an integer in the low bits of the mantissa.
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let shifted = x * std::f32::consts::LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let exponent = (shifted.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    e_r * f32::from_bits((exponent.wrapping_add(127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn exp_f32_is_within_2_ulp_of_the_exact_value() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let exact = (x as f64).exp() as f32;
            let got = exp_f32(x);
            worst = worst.max(got.to_bits().abs_diff(exact.to_bits()));
            x += 0.000_37;
        }
        assert!(worst <= 2, "{worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(1000.0).is_finite());
    }
}
