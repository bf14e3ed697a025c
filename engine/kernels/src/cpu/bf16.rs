//! BF16: the top 16 bits of an f32, little-endian, block size 1.
//!
//! f32 -> bf16 follows ggml's `ggml_compute_fp32_to_bf16`: round to nearest even on the dropped 16
//! bits; NaNs are kept and made quiet (`(bits >> 16) | 64`); subnormals are *not* flushed (current
//! ggml; early versions flushed them). ggml's `vec_dot_type` for BF16 is BF16.

/// ggml's f32 -> bf16 conversion (round to nearest even, quiet NaN), as raw bits.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// bf16 raw bits -> f32 (exact).
#[inline]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Decodes little-endian bf16 bytes (`src.len() == 2 * dst.len()`).
pub(super) fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = rd(b);
    }
}

/// Encodes as little-endian bf16 bytes.
pub(super) fn quantize_row(src: &[f32], dst: &mut [u8]) {
    for (b, s) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_bf16_bits(*s).to_le_bytes());
    }
}

/// Dot product of two bf16 rows given as bytes (products in f32, 8 f32 accumulator lanes).
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
    bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn hand_values() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(-2.0), 0xC000);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.0.
        assert_eq!(f32_to_bf16_bits(1.0 + 2.0f32.powi(-8)), 0x3F80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up.
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2.0f32.powi(-8)), 0x3F82);
        // Just above the tie rounds up.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        // NaN stays NaN and becomes quiet; subnormals are rounded, not flushed.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x0001_8000)), 0x0002);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80); // overflows to +inf, as ggml's
        let mut d = [0.0f32; 2];
        dequantize_row(&[0x80, 0x3F, 0x00, 0xC0], &mut d);
        assert_eq!(d, [1.0, -2.0]);
    }

    #[test]
    fn round_trip_and_dot() {
        let mut r = Rng::new(3);
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
                assert!((a - b).abs() <= a.abs() * 2.0f32.powi(-8));
            }
            let want: f64 = xd.iter().zip(&yd).map(|(a, b)| f64::from(a * b)).sum();
            assert!((f64::from(vec_dot(&xb, &yb)) - want).abs() < 1e-4 * (1.0 + n as f64));
        }
    }
}
