//! IQ4_XS: 256 weights per 136-byte super-block, `{ f16 d; u16 scales_h; u8 scales_l[4];
//! u8 qs[128] }`. Eight sub-blocks of 32 weights, each an IQ4_NL block (16 bytes of table
//! indices, low nibble = element `j`, high = `j + 16`) with a 6-bit scale biased by 32: low 4 bits
//! = nibble `k % 2` of `scales_l[k / 2]`, high 2 bits = bits `2k..2k + 2` of `scales_h`.
//! Value: `d * (ls - 32) * KVALUES_IQ4NL[q]`.
//!
//! Activations pair as Q8_K (ggml's `vec_dot_type`); `bsums` are not needed.

use super::block::{f16_le, Block};
use super::iq4_nl::{dot16, KVALUES_IQ4NL};
use super::q8_k::{BlockQ8_K, QK_K};

/// One IQ4_XS block as it lies in memory (136 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Xs {
    /// Super-block scale, f16 little-endian.
    pub d: [u8; 2],
    /// High 2 bits of the eight sub-block scales, u16 little-endian.
    pub scales_h: [u8; 2],
    /// Low 4 bits of the eight sub-block scales.
    pub scales_l: [u8; QK_K / 64],
    /// Table indices, 16 bytes per sub-block.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);
const _: () = assert!(std::mem::align_of::<BlockIq4Xs>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockIq4Xs {}

impl BlockIq4Xs {
    /// Sub-block `k`'s scale, unbiased (-32..=31).
    #[inline(always)]
    pub(super) fn scale(&self, k: usize) -> i32 {
        let h = u16::from_le_bytes(self.scales_h);
        let lo = (self.scales_l[k / 2] >> (4 * (k % 2))) & 0x0F;
        let hi = ((h >> (2 * k)) & 3) as u8;
        i32::from(lo | (hi << 4)) - 32
    }
}

/// Dequantizes whole blocks.
pub(super) fn dequantize_row(src: &[BlockIq4Xs], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for k in 0..8 {
            let dl = d * b.scale(k) as f32;
            let qs = &b.qs[16 * k..16 * k + 16];
            let y = &mut y[32 * k..32 * k + 32];
            for j in 0..16 {
                y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]);
                y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

/// IQ4_XS weights . Q8_K activations (scalar reference).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))] // x86-64 runs `kquant_order`
pub(super) fn vec_dot(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut isum = 0i32;
        for k in 0..8 {
            isum += bw.scale(k) * dot16(&bw.qs[16 * k..16 * k + 16], &bx.qs[32 * k..32 * k + 32]);
        }
        sumf += f16_le(bw.d) * bx.d() * isum as f32;
    }
    sumf
}
