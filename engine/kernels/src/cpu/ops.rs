//! f32 helpers the graph runs between matrix products (RMS norm, f16 rows; SiLU, softmax and
//! the f16 dots follow ggml's order in `ggml_order`). Plain scalar loops (the compiler
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
    scale_by_weight(x, w, rms_scale(x, eps), out);
}

/// RMSNorm's `1 / sqrt(mean(x^2) + eps)`, summed in f64 in order as ggml does (0 for an empty
/// row is never asked for).
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len().max(1) as f64) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// `out[i] = (x[i] * scale) * w[i]`: the second half of [`rms_norm`], on any part of the row.
pub fn scale_by_weight(x: &[f32], w: &[f32], scale: f32, out: &mut [f32]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// f32 -> f16 (round to nearest even), element-wise; `dst.len() == src.len()`.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16_row: length mismatch");
    dst.convert_from_f32_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

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
    fn f16_row_rounds_to_nearest_even() {
        let mut r = Rng::new(70);
        let a = r.vec(37, 3.0);
        let mut h = vec![f16::ZERO; 37];
        f32_to_f16_row(&a, &mut h);
        for (x, y) in a.iter().zip(&h) {
            assert_eq!(*y, f16::from_f32(*x));
        }
    }
}
