//! `y = x · Wᵀ` for a few rows of `x` (a question's tokens), reading each weight row once: with
//! AVX2 and FMA when the CPU has them (checked at run time), else the same loops without. Each
//! dot product adds in one fixed order, so one machine always gives the same bits. Imports
//! nothing of the crate.
#![allow(unsafe_code)] // Calling a `#[target_feature]` function is `unsafe`: this module is its only caller.

/// Tokens and weight rows done together: the loads per multiply-add that bound these loops.
const TOKENS: usize = 4;

/// `y[t][j] = x[t] · w[j]` for `n` rows of `x` (each `inp` long) and `out` rows of `w`.
pub(crate) fn xwt(x: &[f32], n: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    assert!(
        x.len() >= n * inp
            && w.len() >= out * inp
            && y.len() >= n * out
            && inp.is_multiple_of(8)
            && out.is_multiple_of(2)
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { xwt_fma(x, n, w, out, inp, y) };
        return;
    }
    body::<false>(x, n, w, out, inp, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn xwt_fma(x: &[f32], n: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    body::<true>(x, n, w, out, inp, y);
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn body<const FMA: bool>(x: &[f32], n: usize, w: &[f32], out: usize, inp: usize, y: &mut [f32]) {
    for j in (0..out).step_by(2) {
        let (w0, w1) = (&w[j * inp..(j + 1) * inp], &w[(j + 1) * inp..(j + 2) * inp]);
        let mut t = 0;
        while t < n {
            let rows = TOKENS.min(n - t);
            let mut acc = [[[0.0f32; 8]; 2]; TOKENS];
            for i in (0..inp).step_by(8) {
                let (a, b) = (&w0[i..i + 8], &w1[i..i + 8]);
                for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                    let xs = &x[(t + r) * inp + i..(t + r) * inp + i + 8];
                    for l in 0..8 {
                        acc[0][l] = madd::<FMA>(xs[l], a[l], acc[0][l]);
                        acc[1][l] = madd::<FMA>(xs[l], b[l], acc[1][l]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                for (h, lanes) in acc.iter().enumerate() {
                    let s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
                    y[(t + r) * out + j + h] = s;
                }
            }
            t += rows;
        }
    }
}
