//! Q3_K: 256 weights per 110-byte super-block, `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`.
//! Sixteen sub-blocks of 16 weights with 6-bit signed scales (stored biased by 32 and packed: the
//! low 4 bits of scale `k` are nibble `k % 8`... of bytes 0..8, the high 2 bits come from bytes
//! 8..12; see [`BlockQ3_K::scales`]). The 2 low bits of each quant are laid out as in Q2_K; the
//! third bit of element `32s + l` of half `h` (s = 0..4) is bit `4h + s` of `hmask[l]`, and a
//! *clear* bit subtracts 4. Value: `d * (sc - 32) * q`, q in -4..=3.
//!
//! Activations pair as Q8_K: `dot = d * d_x * sum_k (sc_k - 32) * sum(q * y)` in integers.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::{f16_le, Block};
use super::q8_k::{BlockQ8_K, QK_K};

/// One Q3_K block as it lies in memory (110 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3_K {
    /// Third bits of the quants (set = no offset, clear = minus 4).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale, f16 little-endian.
    pub d: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::align_of::<BlockQ3_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ3_K {}

impl BlockQ3_K {
    /// The sixteen scales, unbiased (-32..=31). Scale `k < 8`: low 4 bits = low nibble of byte
    /// `k`, `k >= 8`: high nibble of byte `k - 8`; high 2 bits = bits `2 (k / 4)` of byte
    /// `8 + k % 4`.
    #[inline(always)]
    pub(super) fn scales(&self) -> [i32; 16] {
        let s = &self.scales;
        let mut out = [0i32; 16];
        for (k, o) in out.iter_mut().enumerate() {
            let lo = if k < 8 { s[k] & 0x0F } else { s[k - 8] >> 4 };
            let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
            *o = i32::from(lo | (hi << 4)) - 32;
        }
        out
    }

    /// The 256 quants (-4..=3) in element order.
    #[inline(always)]
    pub(super) fn quants(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for half in 0..2 {
            let src = &self.qs[32 * half..32 * half + 32];
            for s in 0..4 {
                let m = 1u8 << (4 * half + s);
                for l in 0..32 {
                    let low = ((src[l] >> (2 * s)) & 3) as i8;
                    let off = if self.hmask[l] & m != 0 { 0 } else { 4 };
                    q[128 * half + 32 * s + l] = low - off;
                }
            }
        }
        q
    }
}

/// Dequantizes whole blocks.
pub(super) fn dequantize_row(src: &[BlockQ3_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let sc = b.scales();
        let q = b.quants();
        for k in 0..QK_K / 16 {
            let dl = d * sc[k] as f32;
            for l in 16 * k..16 * k + 16 {
                y[l] = dl * f32::from(q[l]);
            }
        }
    }
}

/// Q3_K weights . Q8_K activations (scalar reference).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))] // x86-64 runs `kquant_order`
pub(super) fn vec_dot(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let sc = bw.scales();
        let q = bw.quants();
        let mut isum = 0i32;
        for k in 0..QK_K / 16 {
            let mut s = 0i32;
            for l in 16 * k..16 * k + 16 {
                s += i32::from(q[l]) * i32::from(bx.qs[l]);
            }
            isum += sc[k] * s;
        }
        sumf += f16_le(bw.d) * bx.d() * isum as f32;
    }
    sumf
}
