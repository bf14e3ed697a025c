//! Q5_0: 32 weights per 22-byte block, `{ f16 d; u8 qh[4]; u8 qs[16] }`. Element `j < 16` is the
//! low nibble of `qs[j]` with bit `j` of `qh` (a little-endian u32) as its fifth bit; element
//! `j + 16` is the high nibble with bit `j + 16`. Value: `d * (q - 16)`.
//!
//! Activations pair as Q8_0 (ggml's `vec_dot_type`); the dot product sums each block in integers
//! and scales by `d_w * d_x` (ggml's `ggml_vec_dot_q5_0_q8_0`).

use super::block::{f16_le, Block, QK};
use super::q8_0::BlockQ8_0;

/// One Q5_0 block as it lies in memory (22 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Fifth bits, a little-endian u32: bit `j` belongs to element `j`.
    pub qh: [u8; 4],
    /// Nibbles: low = element `j`, high = element `j + 16`.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::align_of::<BlockQ5_0>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ5_0 {}

impl BlockQ5_0 {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }

    /// The 32 unsigned 5-bit quants (0..=31), in element order.
    #[inline(always)]
    pub(super) fn quants(&self) -> [u8; QK] {
        let qh = u32::from_le_bytes(self.qh);
        let mut q = [0u8; QK];
        for j in 0..QK / 2 {
            q[j] = (self.qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
            q[j + QK / 2] = (self.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        }
        q
    }
}

/// Dequantizes whole blocks: `d * (q - 16)`.
pub(super) fn dequantize_row(src: &[BlockQ5_0], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        for (o, q) in y.iter_mut().zip(b.quants()) {
            *o = (i32::from(q) - 16) as f32 * d;
        }
    }
}

/// Q5_0 weights . Q8_0 activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let sumi: i32 = bw
            .quants()
            .iter()
            .zip(&bx.qs)
            .map(|(&q, &y)| (i32::from(q) - 16) * i32::from(y))
            .sum();
        sumf += (bw.d() * bx.d()) * sumi as f32;
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_block() {
        // d = 0.5; element j has low nibble j % 16 and fifth bit set for odd j.
        let mut b = BlockQ5_0 {
            d: 0x3800u16.to_le_bytes(),
            qh: 0xAAAA_AAAAu32.to_le_bytes(),
            qs: [0; 16],
        };
        for j in 0..16 {
            b.qs[j] = ((15 - j as u8) << 4) | j as u8;
        }
        let mut out = [0.0f32; QK];
        dequantize_row(&[b], &mut out);
        for j in 0..16 {
            let hi = if j % 2 == 1 { 16 } else { 0 };
            assert_eq!(out[j], 0.5 * (j as f32 + hi as f32 - 16.0));
            assert_eq!(out[16 + j], 0.5 * ((15 - j) as f32 + hi as f32 - 16.0));
        }
    }
}
