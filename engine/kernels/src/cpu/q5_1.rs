//! Q5_1: 32 weights per 24-byte block, `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`: the 5-bit quants
//! of Q5_0 (see `q5_0.rs`) without the offset, value `d * q + m`.
//!
//! Activations pair as Q8_1 (ggml's `vec_dot_type`): `dot = sum_b (d_w * d_x) * sum_j(q_w * q_x)
//! + m_w * s_x`, the inner sum in integers (ggml's `ggml_vec_dot_q5_1_q8_1`).

use super::block::{f16_le, Block, QK};
use super::q8_1::BlockQ8_1;

/// One Q5_1 block as it lies in memory (24 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Fifth bits, a little-endian u32: bit `j` belongs to element `j`.
    pub qh: [u8; 4],
    /// Nibbles: low = element `j`, high = element `j + 16`.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ5_1 {}

impl BlockQ5_1 {
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

/// Dequantizes whole blocks: `d * q + m`.
pub(super) fn dequantize_row(src: &[BlockQ5_1], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (b.d(), b.m());
        for (o, q) in y.iter_mut().zip(b.quants()) {
            *o = f32::from(q) * d + m;
        }
    }
}

/// Q5_1 weights . Q8_1 activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let sumi: i32 = bw
            .quants()
            .iter()
            .zip(&bx.qs)
            .map(|(&q, &y)| i32::from(q) * i32::from(y))
            .sum();
        sumf += (bw.d() * bx.d()) * sumi as f32 + bw.m() * bx.s();
    }
    sumf
}
