//! Q4_0: 32 weights per 18-byte block, `{ f16 d; u8 qs[16] }`. Byte `j` holds element `j` in its
//! low nibble and element `j + 16` in its high nibble; element value is `d * (q - 8)`.
//!
//! Activations pair as Q8_0 (ggml's `vec_dot_type`). The dot accumulates
//! `sum_j (q_j - 8) * x_j` in integers per block, then multiplies by `d_w * d_x`.

use super::block::{f16_le, f16_le_bytes, Block, QK};
use super::q8_0::BlockQ8_0;

/// One Q4_0 block as it lies in memory (18 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Nibbles: low = element `j`, high = element `j + 16`.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ4_0 {}

impl BlockQ4_0 {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

/// Dequantizes whole blocks: `d * (q - 8)`.
pub(super) fn dequantize_row(src: &[BlockQ4_0], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        let (lo, hi) = y.split_at_mut(QK / 2);
        for j in 0..QK / 2 {
            lo[j] = (i32::from(b.qs[j] & 0x0F) - 8) as f32 * d;
            hi[j] = (i32::from(b.qs[j] >> 4) - 8) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref` (a weight quantizer; for tools and tests): `d = max / -8` where
/// `max` is the signed value of largest magnitude, `q = min(15, trunc(x/d + 8.5))`.
pub(super) fn quantize_row(src: &[f32], dst: &mut [BlockQ4_0]) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f16_le_bytes(d);
        for j in 0..QK / 2 {
            // `as i8` truncates toward zero like C's (int8_t) cast; x*id + 8.5 >= 0.5 here.
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            y.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Q4_0 weights . Q8_0 activations (scalar reference).
// The reference, and the scalar kernel off x86-64 (on x86-64 the scalar set adds in ggml's
// order instead, see `ggml_order`).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) fn vec_dot(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let q = bw.qs[j];
            sumi += (i32::from(q & 0x0F) - 8) * i32::from(bx.qs[j])
                + (i32::from(q >> 4) - 8) * i32::from(bx.qs[j + QK / 2]);
        }
        sumf += sumi as f32 * (bw.d() * bx.d());
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    pub(crate) fn random_blocks(r: &mut Rng, nb: usize) -> Vec<BlockQ4_0> {
        (0..nb)
            .map(|_| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&r.bytes(16));
                BlockQ4_0 {
                    d: f16_le_bytes(r.f32(0.05)),
                    qs,
                }
            })
            .collect()
    }

    #[test]
    fn hand_block() {
        // d = 0.5; byte j = (15 - j) << 4 | j -> element j = (j - 8) / 2, element 16 + j = (7 - j) / 2.
        let mut b = BlockQ4_0 {
            d: 0x3800u16.to_le_bytes(),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = ((15 - j as u8) << 4) | j as u8;
        }
        let mut out = [0.0f32; QK];
        dequantize_row(&[b], &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[16 + j], (7.0 - j as f32) * 0.5);
        }
        // Dot with x = all ones (d_x = 1 via 0x3C00): sum of the 32 weights = 0.5 * (-8 + 7) * ... .
        let x = BlockQ8_0 {
            d: 0x3C00u16.to_le_bytes(),
            qs: [1; QK],
        };
        let want: f32 = out.iter().sum();
        assert_eq!(vec_dot(&[b], &[x]), want);
    }

    #[test]
    fn quantize_hand_block() {
        // max magnitude value -8 -> d = 1, id = 1: q = trunc(x + 8.5) clipped to 15.
        let mut x = [0.0f32; QK];
        x[0] = -8.0; // 0
        x[1] = 7.0; // 15
        x[2] = 0.49; // trunc(8.99) = 8
        x[3] = 0.5; // trunc(9.0) = 9 (rounds half up)
        x[16] = -0.5; // trunc(8.0) = 8
        x[17] = 7.6; // 16 -> clipped to 15
        let mut y = [BlockQ4_0 {
            d: [0; 2],
            qs: [0; 16],
        }];
        quantize_row(&x, &mut y);
        assert_eq!(y[0].d(), 1.0);
        assert_eq!(y[0].qs[0], 0x80);
        assert_eq!(y[0].qs[1], 0xFF);
        assert_eq!(y[0].qs[2], 0x88);
        assert_eq!(y[0].qs[3], 0x89);
    }

    #[test]
    fn round_trip_error_bound() {
        let mut r = Rng::new(40);
        let x = r.vec(QK * 7, 1.0);
        let mut y = vec![
            BlockQ4_0 {
                d: [0; 2],
                qs: [0; 16]
            };
            7
        ];
        quantize_row(&x, &mut y);
        let mut back = vec![0.0; x.len()];
        dequantize_row(&y, &mut back);
        for ((xb, bb), b) in x.chunks(QK).zip(back.chunks(QK)).zip(&y) {
            let d = b.d().abs();
            for (a, c) in xb.iter().zip(bb) {
                // Half a step (plus f16 rounding of d), or a clipped top value (< one step).
                assert!((a - c).abs() <= d * 1.01 + 1e-6, "{a} vs {c}, d {d}");
            }
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut r = Rng::new(41);
        for nb in [1, 2, 3, 5, 18, 48] {
            let w = random_blocks(&mut r, nb);
            let xf = r.vec(QK * nb, 1.5);
            let mut x = vec![
                BlockQ8_0 {
                    d: [0; 2],
                    qs: [0; QK]
                };
                nb
            ];
            crate::cpu::q8_0::quantize_row(&xf, &mut x);
            let (mut wd, mut xd) = (vec![0.0; QK * nb], vec![0.0; QK * nb]);
            dequantize_row(&w, &mut wd);
            crate::cpu::q8_0::dequantize_row(&x, &mut xd);
            let want: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let got = f64::from(vec_dot(&w, &x));
            let scale: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + scale),
                "{got} vs {want}"
            );
        }
    }
}
