//! Q8_1: 32 values per 36-byte block, `{ f16 d; f16 s; i8 qs[32] }`, value `j` is `d * qs[j]`,
//! and `s = d * sum(qs)` precomputed for the `m` term of Q4_1 dots.
//!
//! The quantizer is ggml's `quantize_row_q8_1_ref`: as Q8_0 (f32 `d = amax/127`, `roundf(x/d)`,
//! `d` stored as f16), and `s = f16(sum_j(qs[j]) as f32 * d)` with the *f32* `d` (not the
//! f16-rounded one, and not the sum of the inputs).

use super::block::{f16_le, f16_le_bytes, Block, QK};
use super::q8_0::{amax, round, scale};
use super::rounding::Q8Rounding;

/// One Q8_1 block as it lies in memory (36 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// `d * sum(qs)`, f16 little-endian.
    pub s: [u8; 2],
    /// Quants.
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ8_1 {}

impl BlockQ8_1 {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }

    /// `d * sum(qs)` as f32.
    #[inline(always)]
    pub fn s(&self) -> f32 {
        f16_le(self.s)
    }
}

/// Quantizes `src` (whole blocks) into `dst`, exactly as `quantize_row_q8_1_ref`.
pub(super) fn quantize_row(src: &[f32], dst: &mut [BlockQ8_1]) {
    quantize_row_with(src, dst, Q8Rounding::GgmlRef);
}

/// Quantizes `src` (whole blocks) into `dst` with the given ggml rounding flavour (`s` is
/// `f16(sum(q) * d)` with the f32 `d` in every flavour).
pub(super) fn quantize_row_with(src: &[f32], dst: &mut [BlockQ8_1], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (d, id) = scale(amax(x), r);
        y.d = f16_le_bytes(d);
        let mut sum = 0i32;
        for (q, v) in y.qs.iter_mut().zip(x) {
            *q = round(v * id, r);
            sum += i32::from(*q);
        }
        y.s = f16_le_bytes(sum as f32 * d);
    }
}

/// Dequantizes whole blocks: `d * q` (`s` is redundant).
pub(super) fn dequantize_row(src: &[BlockQ8_1], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        for (o, q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(*q) * d;
        }
    }
}

/// Q8_1 . Q8_1 (ggml has no such kernel; provided for completeness): as Q8_0 . Q8_0.
pub(super) fn vec_dot(w: &[BlockQ8_1], x: &[BlockQ8_1]) -> f32 {
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
pub(crate) mod tests;
