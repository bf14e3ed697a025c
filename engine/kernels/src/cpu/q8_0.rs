//! Q8_0: 32 values per 34-byte block, `{ f16 d; i8 qs[32] }`, value `j` is `d * qs[j]`.
//!
//! Used for Q8_0 weights and as the activation type of Q4_0 and Q8_0 weights. The quantizer is
//! ggml's `quantize_row_q8_0_ref`: `amax = max |x|`, `d = amax / 127` (f32), `id = 1/d` (0 when
//! `d == 0`), `qs[j] = roundf(x[j] * id)` (half away from zero), and only then `d` is stored as f16.

use super::block::{f16_le, f16_le_bytes, Block, QK};
use super::rounding::Q8Rounding;

/// One Q8_0 block as it lies in memory (34 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Quants.
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ8_0 {}

impl BlockQ8_0 {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

/// ggml's reference `amax`: `MAX(amax, fabsf(v))` with `MAX(a, b) = a > b ? a : b`.
#[inline(always)]
pub(super) fn amax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// Scale `d` (f32, before its f16 rounding) and the multiplier `id` for a block with the given
/// `amax`, per rounding flavour.
#[inline(always)]
pub(super) fn scale(amax: f32, r: Q8Rounding) -> (f32, f32) {
    let d = amax / 127.0;
    let id = match r {
        Q8Rounding::GgmlX86 => {
            if amax != 0.0 {
                127.0 / amax
            } else {
                0.0
            }
        }
        Q8Rounding::GgmlRef | Q8Rounding::GgmlArm => {
            if d != 0.0 {
                1.0 / d
            } else {
                0.0
            }
        }
    };
    (d, id)
}

/// Rounds a scaled value to its quant, per rounding flavour. `|v| <= 127` (+ rounding), so the
/// saturating cast never clips for finite inputs.
#[inline(always)]
pub(super) fn round(v: f32, r: Q8Rounding) -> i8 {
    match r {
        // f32::round is C roundf: half away from zero.
        Q8Rounding::GgmlRef => v.round() as i8,
        Q8Rounding::GgmlArm | Q8Rounding::GgmlX86 => v.round_ties_even() as i8,
    }
}

/// Quantizes `src` (whole blocks) into `dst`, exactly as `quantize_row_q8_0_ref`.
pub(super) fn quantize_row(src: &[f32], dst: &mut [BlockQ8_0]) {
    quantize_row_with(src, dst, Q8Rounding::GgmlRef);
}

/// Quantizes `src` (whole blocks) into `dst` with the given ggml rounding flavour.
pub(super) fn quantize_row_with(src: &[f32], dst: &mut [BlockQ8_0], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (d, id) = scale(amax(x), r);
        y.d = f16_le_bytes(d);
        for (q, v) in y.qs.iter_mut().zip(x) {
            *q = round(v * id, r);
        }
    }
}

/// Dequantizes whole blocks: `d * q`.
pub(super) fn dequantize_row(src: &[BlockQ8_0], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        for (o, q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(*q) * d;
        }
    }
}

/// Q8_0 weights . Q8_0 activations: `sum_b (sum_j qw*qx) * (d_w * d_x)`.
// The reference, and the scalar kernel off x86-64 (on x86-64 the scalar set adds in ggml's
// order instead, see `ggml_order`).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) fn vec_dot(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += i32::from(bw.qs[j]) * i32::from(bx.qs[j]);
        }
        sumf += sumi as f32 * (bw.d() * bx.d());
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    fn zero() -> BlockQ8_0 {
        BlockQ8_0 {
            d: [0; 2],
            qs: [0; QK],
        }
    }

    #[test]
    fn hand_block() {
        // d = 0.5 (0x3800), q = j - 16.
        let mut b = zero();
        b.d = 0x3800u16.to_le_bytes();
        for j in 0..QK {
            b.qs[j] = j as i8 - 16;
        }
        let mut out = [0.0f32; QK];
        dequantize_row(&[b], &mut out);
        for (j, o) in out.iter().enumerate() {
            assert_eq!(*o, 0.5 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn quantize_exact_with_ties() {
        // amax = 127 -> d = 1, id = 1: values are their own quants; .5 ties go away from zero.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -0.5;
        x[3] = 1.5;
        x[4] = -2.5;
        x[5] = 2.4999998;
        x[6] = -126.5;
        x[7] = 0.49999997;
        let mut y = [zero()];
        quantize_row(&x, &mut y);
        assert_eq!(y[0].d, 0x3C00u16.to_le_bytes()); // 1.0
        assert_eq!(&y[0].qs[..8], &[127, 1, -1, 2, -3, 2, -127, 0]);
        assert!(y[0].qs[8..].iter().all(|&q| q == 0));

        // amax = 254 -> d = 2 (0x4000), id = 0.5: x = 3 -> 1.5 -> 2; x = -5 -> -2.5 -> -3.
        let mut x = [0.0f32; QK];
        x[31] = -254.0;
        x[0] = 3.0;
        x[1] = -5.0;
        x[2] = 1.0;
        quantize_row(&x, &mut y);
        assert_eq!(y[0].d, 0x4000u16.to_le_bytes());
        assert_eq!(&y[0].qs[..3], &[2, -3, 1]);
        assert_eq!(y[0].qs[31], -127);

        // All zeros: d = 0, id = 0, quants 0.
        quantize_row(&[0.0; QK], &mut y);
        assert_eq!(y[0], zero());
    }

    #[test]
    fn quantize_uses_f32_d_not_f16_d() {
        // amax = 1 -> d = 1/127 in f32 (id = 127 exactly), stored as f16 0x2008 (1/d16 = 127.0078).
        // 0.5 * 127 = 63.5 is a tie -> 64. 0.49998 * 127 = 63.4975 -> 63, whereas scaling by the
        // f16 d would give 63.5014 -> 64.
        let mut x = [0.0f32; QK];
        x[0] = 1.0;
        x[1] = 0.5;
        x[2] = 0.49998;
        x[3] = -0.5;
        let mut y = [zero()];
        quantize_row(&x, &mut y);
        assert_eq!(u16::from_le_bytes(y[0].d), 0x2008);
        assert_eq!(&y[0].qs[..4], &[127, 64, 63, -64]);
    }

    #[test]
    fn round_trip_error_bound() {
        let mut r = Rng::new(8);
        let x = r.vec(QK * 9, 3.0);
        let mut y = vec![zero(); 9];
        quantize_row(&x, &mut y);
        let mut back = vec![0.0; x.len()];
        dequantize_row(&y, &mut back);
        for (xb, bb) in x.chunks(QK).zip(back.chunks(QK)) {
            let d = amax(xb) / 127.0;
            for (a, b) in xb.iter().zip(bb) {
                // Half a step, plus the f16 rounding of d (<= 2^-11 relative) times |q| <= 127.
                assert!((a - b).abs() <= 0.5 * d + 127.0 * d * 2.0f32.powi(-11) + 1e-6);
            }
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut r = Rng::new(9);
        for nb in [1, 2, 3, 7, 18] {
            let (a, b) = (r.vec(QK * nb, 2.0), r.vec(QK * nb, 1.0));
            let (mut qa, mut qb) = (vec![zero(); nb], vec![zero(); nb]);
            quantize_row(&a, &mut qa);
            quantize_row(&b, &mut qb);
            let (mut da, mut db) = (vec![0.0; a.len()], vec![0.0; b.len()]);
            dequantize_row(&qa, &mut da);
            dequantize_row(&qb, &mut db);
            let want: f64 = da
                .iter()
                .zip(&db)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = f64::from(vec_dot(&qa, &qb));
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }
}
