//! f32 helpers the graph runs between matrix products. Plain scalar loops (the compiler
//! autovectorizes them); each one follows ggml's CPU operator where the order of operations can
//! change the result.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// RMS normalization times a weight: `out[i] = (x[i] * scale) * w[i]` with
/// `scale = 1 / sqrtf(mean + eps)`.
///
/// As ggml's `ggml_compute_forward_rms_norm_f32` followed by `ggml_mul`: each square is formed in
/// f32 and accumulated in **f64** (`ggml_float`), the mean is narrowed to f32, and `scale` is
/// computed in f32. `w.len()` and `out.len()` must equal `x.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        w.len() == x.len() && out.len() == x.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let mut sum = 0.0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// SiLU: `x / (1 + e^-x)` (ggml's `ggml_silu_f32`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SiLU applied in place.
pub fn silu_inplace(x: &mut [f32]) {
    for v in x {
        *v = silu(*v);
    }
}

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]` (ggml's `swiglu` / `silu(g) * u`).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        up.len() == gate.len() && out.len() == gate.len(),
        "swiglu: length mismatch"
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// Softmax in place, as ggml's `soft_max`: subtract the max, `exp` in f32, sum in f64, multiply by
/// the f32 reciprocal of the sum. `-inf` entries (masked) become 0; an all-`-inf` row becomes all
/// zeros rather than NaN.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = (*v - max).exp();
        sum += f64::from(e);
        *v = e;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// f32 -> f16 (round to nearest even), element-wise; `dst.len() == src.len()`.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16_row: length mismatch");
    dst.convert_from_f32_slice(src);
}

/// f16 -> f32 (exact), element-wise; `dst.len() == src.len()`.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32_row: length mismatch");
    src.convert_to_f32_slice(dst);
}

/// `sum_i a[i] * b[i]` with `a` in f16 (e.g. a cached key) and `b` in f32, 8 f32 accumulator
/// lanes. Note that ggml, for an f16 weight, first rounds the f32 operand to f16 (its
/// `vec_dot_type`); callers that need that behaviour round `b` first or use [`super::vec_dot`].
pub fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16_f32: length mismatch");
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l].to_f32() * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x.to_f32() * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// `acc[i] += a * v[i]` with `v` in f16 (e.g. a cached value row).
pub fn axpy_f16(acc: &mut [f32], a: f32, v: &[f16]) {
    assert_eq!(acc.len(), v.len(), "axpy_f16: length mismatch");
    for (o, x) in acc.iter_mut().zip(v) {
        *o += a * x.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testutil::Rng;

    #[test]
    fn rms_norm_values() {
        let x = [1.0f32, -2.0, 3.0, -4.0];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &w, 0.0, &mut out);
        let scale = 1.0f32 / 7.5f32.sqrt();
        assert_eq!(
            out,
            [scale, -2.0 * scale * 0.5, 3.0 * scale * 2.0, -4.0 * scale]
        );
        // f64 accumulation: 1e8 + 1 + ... loses nothing.
        let mut big = vec![1.0f32; 1025];
        big[0] = 1.0e4;
        let mut o = vec![0.0; 1025];
        rms_norm(&big, &vec![1.0; 1025], 1e-5, &mut o);
        let mean = ((1.0e8f64 + 1024.0) / 1025.0) as f32;
        assert_eq!(o[1], 1.0 / (mean + 1e-5).sqrt());
    }

    #[test]
    fn silu_swiglu_softmax() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!(silu(-100.0).abs() < 1e-30);
        assert_eq!(silu(100.0), 100.0);
        let mut out = [0.0f32; 2];
        swiglu(&[1.0, 2.0], &[2.0, -1.0], &mut out);
        assert_eq!(out, [2.0 * silu(1.0), -silu(2.0)]);
        let mut x = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        softmax_inplace(&mut x);
        let e = [(-2.0f32).exp(), (-1.0f32).exp(), 1.0];
        let s: f32 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] - e[i] / s).abs() < 1e-7);
        }
        assert_eq!(x[3], 0.0);
        let mut m = [f32::NEG_INFINITY; 3];
        softmax_inplace(&mut m);
        assert_eq!(m, [0.0; 3]);
    }

    #[test]
    fn f16_helpers() {
        let mut r = Rng::new(70);
        let a = r.vec(37, 3.0);
        let b = r.vec(37, 3.0);
        let mut h = vec![f16::ZERO; 37];
        f32_to_f16_row(&a, &mut h);
        for (x, y) in a.iter().zip(&h) {
            assert_eq!(*y, f16::from_f32(*x));
        }
        let mut back = vec![0.0; 37];
        f16_to_f32_row(&h, &mut back);
        let want: f64 = back
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot_f16_f32(&h, &b)) - want).abs() < 1e-4);
        let mut acc = b.clone();
        axpy_f16(&mut acc, 0.5, &h);
        for i in 0..37 {
            assert_eq!(acc[i], b[i] + 0.5 * back[i]);
        }
    }
}
