//! Q4_1: 32 weights per 20-byte block, `{ f16 d; f16 m; u8 qs[16] }`. Byte `j` holds element `j`
//! in its low nibble and element `j + 16` in its high nibble; element value is `d * q + m`.
//!
//! Activations pair as Q8_1 (ggml's `vec_dot_type`), whose `s = d_x * sum(q_x)` turns the min term
//! into one product per block: `dot = sum_b (d_w * d_x) * sum_j(q_w * q_x) + m_w * s_x`, with the
//! inner sum in integers (ggml's `ggml_vec_dot_q4_1_q8_1`).

use super::block::{f16_le, f16_le_bytes, Block, QK};
use super::q8_1::BlockQ8_1;

/// One Q4_1 block as it lies in memory (20 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Nibbles: low = element `j`, high = element `j + 16`.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ4_1 {}

impl BlockQ4_1 {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }

    /// The minimum as f32.
    #[inline(always)]
    pub fn m(&self) -> f32 {
        f16_le(self.m)
    }
}

/// Dequantizes whole blocks: `d * q + m`.
pub(super) fn dequantize_row(src: &[BlockQ4_1], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (b.d(), b.m());
        let (lo, hi) = y.split_at_mut(QK / 2);
        for j in 0..QK / 2 {
            lo[j] = f32::from(b.qs[j] & 0x0F) * d + m;
            hi[j] = f32::from(b.qs[j] >> 4) * d + m;
        }
    }
}

/// ggml's `quantize_row_q4_1_ref` (a weight quantizer; for tools and tests): `d = (max - min)/15`,
/// `m = min`, `q = min(15, trunc((x - min)/d + 0.5))`.
pub(super) fn quantize_row(src: &[f32], dst: &mut [BlockQ4_1]) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = f16_le_bytes(d);
        y.m = f16_le_bytes(min);
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            y.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Q4_1 weights . Q8_1 activations (scalar reference).
// The reference, and the scalar kernel off x86-64 (on x86-64 the scalar set adds in ggml's
// order instead, see `ggml_order`).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) fn vec_dot(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let q = bw.qs[j];
            sumi += i32::from(q & 0x0F) * i32::from(bx.qs[j])
                + i32::from(q >> 4) * i32::from(bx.qs[j + QK / 2]);
        }
        sumf += (bw.d() * bx.d()) * sumi as f32 + bw.m() * bx.s();
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    pub(crate) fn random_blocks(r: &mut Rng, nb: usize) -> Vec<BlockQ4_1> {
        (0..nb)
            .map(|_| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&r.bytes(16));
                BlockQ4_1 {
                    d: f16_le_bytes(r.f32(0.02).abs()),
                    m: f16_le_bytes(r.f32(0.15)),
                    qs,
                }
            })
            .collect()
    }

    fn zero() -> BlockQ4_1 {
        BlockQ4_1 {
            d: [0; 2],
            m: [0; 2],
            qs: [0; 16],
        }
    }

    #[test]
    fn hand_block() {
        // d = 0.5 (0x3800), m = -1.0 (0xBC00); byte j = (15 - j) << 4 | j.
        let mut b = zero();
        b.d = 0x3800u16.to_le_bytes();
        b.m = 0xBC00u16.to_le_bytes();
        for j in 0..16 {
            b.qs[j] = ((15 - j as u8) << 4) | j as u8;
        }
        let mut out = [0.0f32; QK];
        dequantize_row(&[b], &mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * j as f32 - 1.0);
            assert_eq!(out[16 + j], 0.5 * (15 - j) as f32 - 1.0);
        }
        // Activation: d = 0.25 (0x3400), q = 2 everywhere, s = 0.25 * 64 = 16 (0x4C00).
        let x = BlockQ8_1 {
            d: 0x3400u16.to_le_bytes(),
            s: 0x4C00u16.to_le_bytes(),
            qs: [2; QK],
        };
        // sum_j q_w = 2 * (0 + ... + 15) = 240; sumi = 480; 0.5*0.25*480 + (-1)*16 = 44.
        assert_eq!(vec_dot(&[b], &[x]), 44.0);
        let want: f32 = out.iter().map(|w| w * 0.5).sum();
        assert_eq!(want, 44.0);
    }

    #[test]
    fn quantize_hand_block() {
        // min = -1, max = 14 -> d = 1, m = -1: q = trunc(x + 1 + 0.5).
        let mut x = [0.0f32; QK];
        x[0] = -1.0; // 0
        x[1] = 14.0; // 15
        x[2] = 0.49; // trunc(1.99) = 1
        x[3] = 0.5; // trunc(2.0) = 2
        x[16] = 3.2; // 4
        let mut y = [zero()];
        quantize_row(&x, &mut y);
        assert_eq!((y[0].d(), y[0].m()), (1.0, -1.0));
        assert_eq!(&y[0].qs[..4], &[0x40, 0x1F, 0x11, 0x12]);
    }

    #[test]
    fn round_trip_error_bound() {
        let mut r = Rng::new(50);
        let x = r.vec(QK * 7, 1.0);
        let mut y = vec![zero(); 7];
        quantize_row(&x, &mut y);
        let mut back = vec![0.0; x.len()];
        dequantize_row(&y, &mut back);
        for ((xb, bb), b) in x.chunks(QK).zip(back.chunks(QK)).zip(&y) {
            let d = b.d();
            for (a, c) in xb.iter().zip(bb) {
                // Half a step, plus f16 rounding of d (times q <= 15) and of m.
                let tol = 0.5 * d + 15.0 * d * 2.0f32.powi(-11) + b.m().abs() * 2.0f32.powi(-11);
                assert!((a - c).abs() <= tol + 1e-6, "{a} vs {c}");
            }
        }
    }

    #[test]
    fn dot_matches_dequantized() {
        let mut r = Rng::new(51);
        for nb in [1, 2, 3, 5, 18, 48] {
            let w = random_blocks(&mut r, nb);
            let xf = r.vec(QK * nb, 1.5);
            let mut x = vec![crate::cpu::q8_1::tests::zero(); nb];
            crate::cpu::q8_1::quantize_row(&xf, &mut x);
            let (mut wd, mut xd) = (vec![0.0; QK * nb], vec![0.0; QK * nb]);
            dequantize_row(&w, &mut wd);
            crate::cpu::q8_1::dequantize_row(&x, &mut xd);
            let want: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let got = f64::from(vec_dot(&w, &x));
            // The m * s term uses s = f16(d * sum q) rather than sum(d_f16 * q): allow its rounding.
            let ms: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| f64::from((a.m() * b.s()).abs()))
                .sum();
            let scale: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + scale) + 2e-3 * ms,
                "{got} vs {want}"
            );
        }
    }
}
