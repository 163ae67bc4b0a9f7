//! Matrix products of the training path through the `gemm` crate (blocked, threaded with
//! rayon, AVX-512 where the CPU has it), in any of the layouts a backward pass needs. Unlike the
//! sampler's [`crate::linear`], their summation order depends on the shape, so they are not
//! batch-invariant; training does not need that.

use crate::float::Float;

/// gemm's threads: rayon's pool when it has more than one thread, and none inside a task of
/// the pool (the caller already spreads its products over the threads, as the attention's
/// blocks do; splitting each small product again would only add synchronisation).
fn parallelism() -> gemm::Parallelism {
    if rayon::current_thread_index().is_some() {
        return gemm::Parallelism::None;
    }
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        threads => gemm::Parallelism::Rayon(threads),
    }
}

/// `out (m × n) = x (m × k) · Wᵀ` with `W (n × k)` row-major; `+=` when `accumulate`.
pub fn matmul_nt<T: Float>(x: &[T], w: &[T], k: usize, out: &mut [T], accumulate: bool) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "x and W must be rows of {k}"
    );
    let (m, n) = (x.len() / k, w.len() / k);
    // Wᵀ is `k × n`: element (i, j) is w[j * k + i].
    product((m, k, n), x, (k, 1), w, (1, k), (out, n), accumulate);
}

/// [`matmul_nt`] into columns of a wider output: `out` holds `m` rows of `out_stride`, and this
/// writes the first `n` columns of each (a panel of a larger product).
pub(crate) fn matmul_nt_into<T: Float>(
    x: &[T],
    w: &[T],
    k: usize,
    (out, out_stride): (&mut [T], usize),
    accumulate: bool,
) {
    assert!(
        k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k),
        "x and W must be rows of {k}"
    );
    let (m, n) = (x.len() / k, w.len() / k);
    product(
        (m, k, n),
        x,
        (k, 1),
        w,
        (1, k),
        (out, out_stride),
        accumulate,
    );
}

/// `out (m × k) (+)= a · W` where `a` is `m` rows of `a_stride` of which the first `n` are read
/// and `W (n × k)`: [`matmul_nn`] over a panel of the columns of `a`.
pub(crate) fn matmul_nn_from<T: Float>(
    (a, a_stride): (&[T], usize),
    w: &[T],
    k: usize,
    out: &mut [T],
    accumulate: bool,
) {
    assert!(k > 0 && w.len().is_multiple_of(k), "W must be rows of {k}");
    let n = w.len() / k;
    let m = out.len() / k;
    assert!(
        a.len() >= m.saturating_sub(1) * a_stride + n * usize::from(m > 0) && n <= a_stride,
        "a must hold {m} rows of {a_stride} with {n} read"
    );
    product_strided((m, n, k), a, (a_stride, 1), w, (k, 1), (out, k), accumulate);
}

/// `out (m × k) = a (m × n) · W` with `W (n × k)` row-major: the input gradient of a
/// projection; `+=` when `accumulate`.
pub fn matmul_nn<T: Float>(a: &[T], w: &[T], k: usize, out: &mut [T], accumulate: bool) {
    assert!(k > 0 && w.len().is_multiple_of(k), "W must be rows of {k}");
    let n = w.len() / k;
    assert!(a.len().is_multiple_of(n), "a must be rows of {n}");
    let m = a.len() / n;
    product((m, n, k), a, (n, 1), w, (k, 1), (out, k), accumulate);
}

/// `out (n × k) = dyᵀ · x` with `dy (m × n)` and `x (m × k)` row-major: the weight gradient of
/// a projection; `+=` when `accumulate`.
pub fn matmul_tn<T: Float>(dy: &[T], x: &[T], k: usize, out: &mut [T], accumulate: bool) {
    assert!(k > 0 && x.len().is_multiple_of(k), "x must be rows of {k}");
    let m = x.len() / k;
    assert!(
        m > 0 && dy.len().is_multiple_of(m),
        "dy must have x's {m} rows"
    );
    let n = dy.len() / m;
    // dyᵀ is `n × m`: element (i, j) is dy[j * n + i].
    product((n, m, k), dy, (1, n), x, (k, 1), (out, k), accumulate);
}

/// `out (m × n) (+)= a (m × k) · b (k × n)`, `out` row-major with rows of `out_stride`, `a` and
/// `b` read with `(row stride, column stride)`. Panics when the lengths do not fit.
#[allow(clippy::too_many_arguments)]
fn product<T: Float>(
    (m, k, n): (usize, usize, usize),
    a: &[T],
    a_strides: (usize, usize),
    b: &[T],
    b_strides: (usize, usize),
    out: (&mut [T], usize),
    accumulate: bool,
) {
    assert_eq!(a.len(), m * k, "a must hold {m} × {k}");
    product_strided((m, k, n), a, a_strides, b, b_strides, out, accumulate)
}

/// [`product`] where `a` may hold more than it reads (a panel of a wider matrix).
#[allow(clippy::too_many_arguments)]
fn product_strided<T: Float>(
    (m, k, n): (usize, usize, usize),
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    (out, out_rs): (&mut [T], usize),
    accumulate: bool,
) {
    assert_eq!(b.len(), k * n, "b must hold {k} × {n}");
    assert!(
        n <= out_rs && out.len() >= m.saturating_sub(1) * out_rs + n * usize::from(m > 0),
        "out must hold {m} rows of {out_rs} with {n} written"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for row in out.chunks_mut(out_rs).take(m) {
                row[..n].fill(T::zero());
            }
        }
        return;
    }
    let a_last = (m - 1) * a_rs + (k - 1) * a_cs;
    assert!(a_last < a.len(), "a must hold {m} × {k} at its strides");
    // SAFETY: with the lengths checked above, every index gemm forms, `i * rs + j * cs` for
    // `i < rows` and `j < cols` of each operand, falls inside its slice (`b` covers exactly its
    // `k × n`, `a`'s last index and `out`'s last row were checked); `out` is not aliased by `a`
    // or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            out_rs as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
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
