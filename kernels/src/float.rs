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
}

impl Float for f32 {
    fn of(n: f64) -> Self {
        n as f32
    }
}

impl Float for f64 {
    fn of(n: f64) -> Self {
        n
    }
}
