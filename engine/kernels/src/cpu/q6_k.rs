//! Q6_K: 256 weights per 210-byte super-block, `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`.
//! Sixteen sub-blocks of 16 weights with signed 8-bit scales. Each half `h` of the block (128
//! weights) uses `ql[64h..64h + 64]` and `qh[32h..32h + 32]`: for `l < 32`, elements `l`,
//! `l + 32`, `l + 64`, `l + 96` take the low nibble of `ql[l]`, of `ql[l + 32]`, the high nibble
//! of `ql[l]`, of `ql[l + 32]`, and bit pairs 0, 2, 4, 6 of `qh[l]` as their top 2 bits.
//! Value: `d * sc * (q - 32)`.
//!
//! Activations pair as Q8_K: `dot = d * d_x * sum_k sc_k * sum((q - 32) * y)` in integers.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::{f16_le, Block};
use super::q8_k::{BlockQ8_K, QK_K};

/// One Q6_K block as it lies in memory (210 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6_K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16 little-endian.
    pub d: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(std::mem::align_of::<BlockQ6_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ6_K {}

impl BlockQ6_K {
    /// The 256 quants (-32..=31) in element order.
    #[inline(always)]
    pub(super) fn quants(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            let ql = &self.ql[64 * h..64 * h + 64];
            let qh = &self.qh[32 * h..32 * h + 32];
            let y = &mut q[128 * h..128 * h + 128];
            for l in 0..32 {
                y[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
                y[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        q
    }
}

/// Dequantizes whole blocks: `(d * sc) * q`, in ggml's order.
pub(super) fn dequantize_row(src: &[BlockQ6_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let q = b.quants();
        for k in 0..QK_K / 16 {
            let dl = d * f32::from(b.scales[k]);
            for l in 16 * k..16 * k + 16 {
                y[l] = dl * f32::from(q[l]);
            }
        }
    }
}

/// Q6_K weights . Q8_K activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let q = bw.quants();
        let mut isum = 0i32;
        for k in 0..QK_K / 16 {
            let mut s = 0i32;
            for l in 16 * k..16 * k + 16 {
                s += i32::from(q[l]) * i32::from(bx.qs[l]);
            }
            isum += i32::from(bw.scales[k]) * s;
        }
        sumf += f16_le(bw.d) * bx.d() * isum as f32;
    }
    sumf
}
