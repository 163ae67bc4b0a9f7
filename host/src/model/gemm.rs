//! `out = x · Wᵀ` on slices, through the `gemm` crate that candle itself uses, for the custom
//! ops of the training path: it reads the weight in place and writes the op's output buffer
//! directly, where going through candle tensors would copy the input and the output once more
//! (on the 0.5B shape the unembedding's output alone is 600 MB).

use candle_core::{CpuStorage, Layout, Storage, Tensor, WithDType};

/// The float types the training ops run in.
pub trait Float: WithDType + num_traits::Float {}
impl Float for f32 {}
impl Float for f64 {}

/// gemm's threads: rayon's pool when it has more than one thread.
fn parallelism() -> gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        threads => gemm::Parallelism::Rayon(threads),
    }
}

/// `out (m × n) = x (m × k) · Wᵀ` with `W (n × k)` row-major; `out += ...` when `accumulate`.
pub fn matmul_nt<T: Float>(x: &[T], w: &[T], k: usize, out: &mut [T], accumulate: bool) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "x and W must be rows of {k}"
    );
    // Wᵀ is `k × n` with its columns the rows of W: column stride k, row stride 1.
    product(x, w, k, w.len() / k, (k, 1), out, accumulate);
}

/// `out (m × n) (+)= a (m × k) · b (k × n)` with `a` and `out` row-major and `b` read with
/// `(column stride, row stride)`. Panics when the lengths do not fit.
fn product<T: Float>(
    a: &[T],
    b: &[T],
    k: usize,
    n: usize,
    (b_cs, b_rs): (usize, usize),
    out: &mut [T],
    accumulate: bool,
) {
    let m = a.len() / k;
    assert_eq!(b.len(), k * n, "b must hold {k} × {n}");
    assert_eq!(out.len(), m * n, "out must be {m} × {n}");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: with the lengths checked above, every index gemm forms, `i * rs + j * cs` for
    // `i < rows` and `j < cols` of each operand, falls inside its slice (both layouts of `b`
    // passed here cover exactly `k × n`); `out` is not aliased.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism(),
        )
    }
}

/// The part of an op's input storage that its (contiguous) layout covers.
pub fn contiguous<'a, T>(data: &'a [T], layout: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op} needs contiguous inputs")))?;
    data.get(start..end).ok_or_else(|| {
        candle_core::Error::Msg(format!("{op}: an input is shorter than its layout"))
    })
}

/// Run `f` on the contiguous data of `tensor`, read in place, as `T`.
pub fn with_slice<T: Float, R>(
    tensor: &Tensor,
    f: impl FnOnce(&[T]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let (storage, layout) = tensor.storage_and_layout();
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("a weight of the model is not contiguous".into()))?;
    let Storage::Cpu(cpu) = &*storage else {
        return Err(candle_core::Error::Msg(
            "the training ops run on the CPU".into(),
        ));
    };
    let data: &[T] = T::cpu_storage_as_slice(cpu)?;
    f(&data[start..end])
}

/// `x Wᵀ + b` of the rows of `x` for a frozen projection stored in candle tensors.
pub fn project<T: Float>(
    x: &[T],
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> candle_core::Result<Vec<T>> {
    let (out, inp) = weight.dims2()?;
    let mut y = vec![T::zero(); x.len() / inp * out];
    with_slice(weight, |w| {
        matmul_nt(x, w, inp, &mut y, false);
        Ok(())
    })?;
    if let Some(bias) = bias {
        with_slice(bias, |b: &[T]| {
            add_bias(&mut y, b);
            Ok(())
        })?;
    }
    Ok(y)
}

/// Add `bias` to every row of `out`.
fn add_bias<T: Float>(out: &mut [T], bias: &[T]) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += *b;
        }
    }
}

/// The storage of an op's output.
pub fn storage<T: Float>(values: Vec<T>) -> CpuStorage {
    T::to_cpu_storage_owned(values)
}

/// `out (m × n) = a (m × k) · b (k × n)`, both row-major.
pub fn matmul_nn<T: Float>(a: &[T], b: &[T], k: usize, out: &mut [T]) {
    assert!(
        k > 0 && a.len().is_multiple_of(k) && b.len().is_multiple_of(k),
        "a must be rows of {k}, b {k} rows"
    );
    product(a, b, k, b.len() / k, (1, b.len() / k), out, false);
}
