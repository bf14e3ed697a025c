//! Q2_K: 256 weights per 84-byte super-block, `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`.
//! Sixteen sub-blocks of 16 weights; `scales[k]` holds sub-block `k`'s 4-bit scale (low nibble)
//! and 4-bit min (high nibble). The 2-bit quants: each half of the block (128 weights) uses 32
//! bytes of `qs`; bit pair `2s` of byte `l` (s = 0..4) is element `32s + l` of that half.
//! Value: `d * sc * q - dmin * m`.
//!
//! Activations pair as Q8_K: `dot = d_x * (d * sum_k sc_k * sum(q * y) - dmin * sum_k m_k *
//! bsum_k)`, the sums in integers (ggml's `ggml_vec_dot_q2_K_q8_K`).

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::{f16_le, Block};
use super::q8_k::{BlockQ8_K, QK_K};

/// One Q2_K block as it lies in memory (84 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_K {
    /// Per sub-block: scale (low nibble) and min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales, f16 little-endian.
    pub d: [u8; 2],
    /// Super-block scale of the mins, f16 little-endian.
    pub dmin: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::align_of::<BlockQ2_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ2_K {}

impl BlockQ2_K {
    /// The 256 quants (0..=3) in element order.
    #[inline(always)]
    pub(super) fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for half in 0..2 {
            let src = &self.qs[32 * half..32 * half + 32];
            for s in 0..4 {
                for l in 0..32 {
                    q[128 * half + 32 * s + l] = (src[l] >> (2 * s)) & 3;
                }
            }
        }
        q
    }
}

/// Dequantizes whole blocks.
pub(super) fn dequantize_row(src: &[BlockQ2_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        let q = b.quants();
        for k in 0..QK_K / 16 {
            let dl = d * f32::from(b.scales[k] & 0x0F);
            let ml = min * f32::from(b.scales[k] >> 4);
            for l in 0..16 {
                y[16 * k + l] = dl * f32::from(q[16 * k + l]) - ml;
            }
        }
    }
}

/// Q2_K weights . Q8_K activations (scalar reference).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))] // x86-64 runs `kquant_order`
pub(super) fn vec_dot(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let q = bw.quants();
        let mut isum = 0i32;
        let mut summs = 0i32;
        for k in 0..QK_K / 16 {
            let mut s = 0i32;
            for l in 16 * k..16 * k + 16 {
                s += i32::from(q[l]) * i32::from(bx.qs[l]);
            }
            isum += i32::from(bw.scales[k] & 0x0F) * s;
            summs += i32::from(bw.scales[k] >> 4) * bx.bsum(k);
        }
        let dall = bx.d() * f16_le(bw.d);
        let dmin = bx.d() * f16_le(bw.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}
