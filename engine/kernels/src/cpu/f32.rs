//! F32: plain little-endian IEEE floats, block size 1.
//!
//! ggml's `vec_dot_type` for F32 is F32. ggml's scalar `ggml_vec_dot_f32` accumulates in double,
//! its SIMD paths in several f32 lanes; this one uses 8 f32 lanes (autovectorized).

/// Decodes little-endian f32 bytes (`src.len() == 4 * dst.len()`).
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Encodes as little-endian f32 bytes.
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (b, s) in dst.chunks_exact_mut(4).zip(src) {
        b.copy_from_slice(&s.to_le_bytes());
    }
}

/// Dot product of two f32 rows given as bytes.
pub(super) fn vec_dot(w: &[u8], x: &[u8]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; 8];
    let (wc, xc) = (w.chunks_exact(32), x.chunks_exact(32));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for l in 0..8 {
            acc[l] += rd(&a[4 * l..]) * rd(&b[4 * l..]);
        }
    }
    let mut tail = 0.0f32;
    for (a, b) in wr.chunks_exact(4).zip(xr.chunks_exact(4)) {
        tail += rd(a) * rd(b);
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn rd(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn round_trip_and_dot() {
        let mut r = Rng::new(1);
        for n in [0, 1, 7, 8, 33, 100] {
            let x = r.vec(n, 2.0);
            let y = r.vec(n, 2.0);
            let mut xb = vec![0u8; 4 * n];
            let mut yb = vec![0u8; 4 * n];
            quantize_row(&x, &mut xb);
            quantize_row(&y, &mut yb);
            let mut back = vec![0.0; n];
            dequantize_row(&xb, &mut back);
            assert_eq!(back, x);
            let want: f64 = x.iter().zip(&y).map(|(a, b)| f64::from(a * b)).sum();
            assert!((f64::from(vec_dot(&xb, &yb)) - want).abs() < 1e-4 * (1.0 + n as f64));
        }
    }
}
