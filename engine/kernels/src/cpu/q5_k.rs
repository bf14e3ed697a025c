//! Q5_K: 256 weights per 176-byte super-block, `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
//! u8 qs[128] }`: Q4_K (see `q4_k.rs`: same packed scales/mins, same nibble layout) plus a fifth
//! bit per weight: element `l` of sub-block `k` (l < 32) takes bit `k` of `qh[l]`. Value:
//! `d * sc * q - dmin * m`, q in 0..=31.
//!
//! Activations pair as Q8_K, as for Q4_K (ggml's `ggml_vec_dot_q5_K_q8_K`).

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::{f16_le, Block};
use super::q4_k::scale_min_k4;
use super::q8_k::{BlockQ8_K, QK_K};

/// One Q5_K block as it lies in memory (176 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_K {
    /// Super-block scale of the scales, f16 little-endian.
    pub d: [u8; 2],
    /// Super-block scale of the mins, f16 little-endian.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed as in Q4_K.
    pub scales: [u8; 12],
    /// Fifth bits: bit `k` of byte `l` belongs to element `l` of sub-block `k`.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits of the quants.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);
const _: () = assert!(std::mem::align_of::<BlockQ5_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ5_K {}

impl BlockQ5_K {
    /// The 256 quants (0..=31) in element order.
    #[inline(always)]
    pub(super) fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            let ql = &self.qs[32 * c..32 * c + 32];
            for l in 0..32 {
                let h = self.qh[l] >> (2 * c);
                q[64 * c + l] = (ql[l] & 0x0F) | ((h & 1) << 4);
                q[64 * c + 32 + l] = (ql[l] >> 4) | (((h >> 1) & 1) << 4);
            }
        }
        q
    }
}

/// Dequantizes whole blocks.
pub(super) fn dequantize_row(src: &[BlockQ5_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        let q = b.quants();
        for k in 0..8 {
            let (sc, m) = scale_min_k4(k, &b.scales);
            let (dl, ml) = (d * f32::from(sc), min * f32::from(m));
            for l in 32 * k..32 * k + 32 {
                y[l] = dl * f32::from(q[l]) - ml;
            }
        }
    }
}

/// Q5_K weights . Q8_K activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let q = bw.quants();
        let (mut isum, mut summs) = (0i32, 0i32);
        for k in 0..8 {
            let (sc, m) = scale_min_k4(k, &bw.scales);
            let mut s = 0i32;
            for l in 32 * k..32 * k + 32 {
                s += i32::from(q[l]) * i32::from(bx.qs[l]);
            }
            isum += i32::from(sc) * s;
            summs += i32::from(m) * (bx.bsum(2 * k) + bx.bsum(2 * k + 1));
        }
        let d = f16_le(bw.d) * bx.d();
        let dmin = f16_le(bw.dmin) * bx.d();
        sumf += d * isum as f32 - dmin * summs as f32;
    }
    sumf
}
