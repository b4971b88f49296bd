//! The one call of `matrixmultiply`'s SGEMM, whose API takes raw pointers and strides: wrapped
//! here behind slices whose lengths are checked first. Imports nothing of the crate.
#![allow(unsafe_code)] // `matrixmultiply::sgemm` is an `unsafe fn`: this module is its only caller.

/// `y[m×n] = a[m×k] · bᵀ`, `b` stored row-major as `[n][k]` (a PyTorch `Linear` weight).
pub(crate) fn abt(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], y: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= n * k && y.len() >= m * n, "matrix shapes");
    // SAFETY: `a` holds m×k values read at row stride k, column stride 1; `b` is read as the k×n
    // matrix bᵀ (row stride 1, column stride k) within its n×k values; `y` holds m×n values written
    // at row stride n; the assert above checked all three lengths, and the slices do not overlap
    // (`y` is borrowed mutably).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            1,
            k as isize,
            0.0,
            y.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}
