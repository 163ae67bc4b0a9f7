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
    product((m, k, n), x, (k, 1), w, (1, k), out, accumulate);
}

/// `out (m × k) = a (m × n) · W` with `W (n × k)` row-major: the input gradient of a
/// projection; `+=` when `accumulate`.
pub fn matmul_nn<T: Float>(a: &[T], w: &[T], k: usize, out: &mut [T], accumulate: bool) {
    assert!(k > 0 && w.len().is_multiple_of(k), "W must be rows of {k}");
    let n = w.len() / k;
    assert!(a.len().is_multiple_of(n), "a must be rows of {n}");
    let m = a.len() / n;
    product((m, n, k), a, (n, 1), w, (k, 1), out, accumulate);
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
    product((n, m, k), dy, (1, n), x, (k, 1), out, accumulate);
}

/// `out (m × n) (+)= a (m × k) · b (k × n)`, `out` row-major, `a` and `b` read with
/// `(row stride, column stride)`. Panics when the lengths do not fit.
#[allow(clippy::too_many_arguments)]
fn product<T: Float>(
    (m, k, n): (usize, usize, usize),
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    out: &mut [T],
    accumulate: bool,
) {
    assert_eq!(a.len(), m * k, "a must hold {m} × {k}");
    assert_eq!(b.len(), k * n, "b must hold {k} × {n}");
    assert_eq!(out.len(), m * n, "out must be {m} × {n}");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out.fill(T::zero());
        }
        return;
    }
    // SAFETY: with the lengths checked above, every index gemm forms, `i * rs + j * cs` for
    // `i < rows` and `j < cols` of each operand, falls inside its slice (each layout passed
    // here covers exactly its `rows × cols`); `out` is not aliased by `a` or `b`.
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
