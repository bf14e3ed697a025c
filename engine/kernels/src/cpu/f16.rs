//! F16: little-endian IEEE binary16, block size 1.
//!
//! ggml's `vec_dot_type` for F16 is F16: activations are rounded to f16 (round to nearest even,
//! like F16C `vcvtps2ph` and ggml's software `fp32_to_fp16`) before the dot. Products are formed
//! in f32 and accumulated in 8 f32 lanes (ggml's SIMD path also accumulates f32 lanes; its scalar
//! path accumulates in double).

/// Decodes little-endian f16 bytes (`src.len() == 2 * dst.len()`).
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = super::block::f16_le([b[0], b[1]]);
    }
}

/// Encodes as little-endian f16 bytes, rounding to nearest even.
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (b, s) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&super::block::f16_le_bytes(*s));
    }
}

/// Dot product of two f16 rows given as bytes.
pub(super) fn vec_dot(w: &[u8], x: &[u8]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; 8];
    let (wc, xc) = (w.chunks_exact(16), x.chunks_exact(16));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for l in 0..8 {
            acc[l] += rd(&a[2 * l..]) * rd(&b[2 * l..]);
        }
    }
    let mut tail = 0.0f32;
    for (a, b) in wr.chunks_exact(2).zip(xr.chunks_exact(2)) {
        tail += rd(a) * rd(b);
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn rd(b: &[u8]) -> f32 {
    super::block::f16_le([b[0], b[1]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn hand_values() {
        // 0x3800 = 0.5, 0xC000 = -2.0, 0x7BFF = 65504 (max), 0x0001 = 2^-24 (smallest subnormal).
        let src = [0x00, 0x38, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00];
        let mut d = [0.0f32; 4];
        dequantize_row(&src, &mut d);
        assert_eq!(d, [0.5, -2.0, 65504.0, 2.0f32.powi(-24)]);
        // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1 (even).
        let mut b = [0u8; 6];
        quantize_row(
            &[1.0 + 2.0f32.powi(-11), 1.0 + 3.0 * 2.0f32.powi(-11), 1e6],
            &mut b,
        );
        assert_eq!(b, [0x00, 0x3C, 0x02, 0x3C, 0x00, 0x7C]); // 1.0, 1+2^-9 (tie up to even), inf
    }

    #[test]
    fn round_trip_and_dot() {
        let mut r = Rng::new(2);
        for n in [0, 1, 7, 8, 33, 100] {
            let x = r.vec(n, 4.0);
            let y = r.vec(n, 4.0);
            let mut xb = vec![0u8; 2 * n];
            let mut yb = vec![0u8; 2 * n];
            quantize_row(&x, &mut xb);
            quantize_row(&y, &mut yb);
            let mut xd = vec![0.0; n];
            let mut yd = vec![0.0; n];
            dequantize_row(&xb, &mut xd);
            dequantize_row(&yb, &mut yd);
            for (a, b) in x.iter().zip(&xd) {
                assert!((a - b).abs() <= a.abs() * 2.0f32.powi(-11) + 1e-7);
            }
            let want: f64 = xd.iter().zip(&yd).map(|(a, b)| f64::from(a * b)).sum();
            assert!((f64::from(vec_dot(&xb, &yb)) - want).abs() < 1e-4 * (1.0 + n as f64));
        }
    }
}
