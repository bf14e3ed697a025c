//! Q8_K: 256 activations per 292-byte block, `{ f32 d; i8 qs[256]; i16 bsums[16] }`; value `j`
//! is `d * qs[j]`, and `bsums[k]` is the sum of `qs[16k..16k+16]` (the k-quants' min terms use it).
//! It is only the activation side of the k-quants and IQ4_XS (ggml's `vec_dot_type`).
//!
//! The quantizer is ggml's `quantize_row_q8_K_ref` (also what ggml-cpu runs on x86): `max` is
//! the element of largest magnitude (first one on ties), `iscale = -127 / max` in f32,
//! `q = min(127, nearest_int(iscale * x))` with round-half-to-even, `d = 1 / iscale`; an
//! all-zero block has `d = 0`.

use super::block::Block;

/// Elements per k-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// One Q8_K block as it lies in memory (292 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_K {
    /// Scale, f32 little-endian.
    pub d: [u8; 4],
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sums of 16 consecutive quants, i16 little-endian.
    pub bsums: [[u8; 2]; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ8_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ8_K {}

impl BlockQ8_K {
    /// The scale.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// `bsums[k]`.
    #[inline(always)]
    pub fn bsum(&self, k: usize) -> i32 {
        i32::from(i16::from_le_bytes(self.bsums[k]))
    }
}

/// ggml's `nearest_int`: round half to even, exact for |x| < 2^22 (here |x| <= 127), by adding
/// 1.5 * 2^23 so that the float's low mantissa bits are the rounded integer. Plain integer and
/// float operations, which the compiler vectorizes (`round_ties_even` calls libm's `rintf` on
/// baseline x86-64). Also for the infinities of a subnormal block maximum it gives ggml's value.
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// Quantizes `src` (whole blocks) into `dst`, exactly as `quantize_row_q8_K_ref`.
pub(super) fn quantize_row(src: &[f32], dst: &mut [BlockQ8_K]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        // The largest magnitude in 8 lanes (a select the compiler vectorizes, where the serial
        // loop is one long dependency chain), then the first element reaching it: the element
        // the serial `if |v| > amax` scan keeps. `>` skips NaNs in both.
        let mut lanes = [0.0f32; 8];
        for c in x.chunks_exact(8) {
            for (m, &v) in lanes.iter_mut().zip(c) {
                *m = if v.abs() > *m { v.abs() } else { *m };
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &a| if a > m { a } else { m });
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        if amax == 0.0 {
            y.d = 0.0f32.to_le_bytes();
            y.qs = [0; QK_K];
            y.bsums = [[0; 2]; QK_K / 16];
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (k, s) in y.bsums.iter_mut().enumerate() {
            let sum: i32 = y.qs[16 * k..16 * k + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            *s = (sum as i16).to_le_bytes();
        }
        y.d = (1.0f32 / iscale).to_le_bytes();
    }
}

/// Dequantizes whole blocks: `d * q`.
pub(super) fn dequantize_row(src: &[BlockQ8_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(*q) * d;
        }
    }
}

/// Q8_K . Q8_K (ggml has no such kernel; for completeness): integer sum per block times both `d`.
pub(super) fn vec_dot(w: &[BlockQ8_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let sumi: i32 = bw
            .qs
            .iter()
            .zip(&bx.qs)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum();
        sumf += bw.d() * bx.d() * sumi as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn zero() -> BlockQ8_K {
        BlockQ8_K {
            d: [0; 4],
            qs: [0; QK_K],
            bsums: [[0; 2]; QK_K / 16],
        }
    }

    /// The serial `amax` scan of `quantize_row_q8_K_ref`, for the vectorized one to match.
    fn serial_max(x: &[f32]) -> (f32, f32) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        (amax, max)
    }

    #[test]
    fn block_maximum_is_the_serial_scans() {
        let mut r = crate::testutil::Rng::new(11);
        for case in 0..2000 {
            let mut x: Vec<f32> = (0..QK_K).map(|_| r.f32(1.0)).collect();
            // Ties of magnitude with either sign, NaNs, infinities, zeros and subnormals.
            let pick = |r: &mut crate::testutil::Rng| (r.next_u64() % QK_K as u64) as usize;
            match case % 6 {
                0 => {
                    let (i, j) = (pick(&mut r), pick(&mut r));
                    x[i] = 3.0;
                    x[j] = -3.0;
                }
                1 => x[pick(&mut r)] = f32::NAN,
                2 => {
                    x[pick(&mut r)] = if case % 12 == 2 {
                        f32::INFINITY
                    } else {
                        f32::NEG_INFINITY
                    }
                }
                3 => x.iter_mut().for_each(|v| *v *= 1e-40),
                4 => x.fill(if case % 12 == 4 { 0.0 } else { -0.0 }),
                _ => {}
            }
            let (amax, max) = serial_max(&x);
            let mut y = [zero()];
            quantize_row(&x, &mut y);
            if amax == 0.0 {
                assert_eq!(y[0], zero(), "case {case}");
                continue;
            }
            let iscale = -127.0f32 / max;
            assert_eq!(
                y[0].d().to_bits(),
                (1.0f32 / iscale).to_bits(),
                "case {case}"
            );
            for (q, &v) in y[0].qs.iter().zip(&x) {
                assert_eq!(*q, nearest_int(iscale * v).min(127) as i8, "case {case}");
            }
        }
    }

    #[test]
    fn quantize_hand_block() {
        // max = -127/64 (largest magnitude, negative): iscale = 64 exactly, d = 1/64.
        let mut x = [0.0f32; QK_K];
        x[0] = -127.0 / 64.0;
        x[1] = 127.0 / 64.0;
        x[2] = 0.5 / 64.0; // 0.5 -> 0 (half to even)
        x[3] = 1.5 / 64.0; // 1.5 -> 2
        x[4] = 2.5 / 64.0; // 2.5 -> 2
        x[17] = -1.0; // -64
        let mut y = [zero()];
        quantize_row(&x, &mut y);
        assert_eq!(y[0].d(), 1.0 / 64.0);
        assert_eq!(&y[0].qs[..5], &[-127, 127, 0, 2, 2]);
        assert_eq!(y[0].qs[17], -64);
        assert_eq!(y[0].bsum(0), 4);
        assert_eq!(y[0].bsum(1), -64);
        let mut z = [zero()];
        quantize_row(&[0.0; QK_K], &mut z);
        assert_eq!(z[0], zero());
    }
}
