//! IQ4_NL: 32 weights per 18-byte block, `{ f16 d; u8 qs[16] }`: 4-bit indices into a fixed
//! non-linear table of 16 values ([`KVALUES_IQ4NL`]), nibbles as in Q4_0 (low = element `j`,
//! high = element `j + 16`). Value: `d * KVALUES_IQ4NL[q]`.
//!
//! Activations pair as Q8_0 (ggml's `vec_dot_type`): integer sum of table value times quant per
//! block, scaled by `d_w * d_x`.

use super::block::{f16_le, Block, QK};
use super::q8_0::BlockQ8_0;

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One IQ4_NL block as it lies in memory (18 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIq4Nl {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Table indices: low nibble = element `j`, high = element `j + 16`.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);
const _: () = assert!(std::mem::align_of::<BlockIq4Nl>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockIq4Nl {}

impl BlockIq4Nl {
    /// The scale as f32.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

/// Dequantizes whole blocks: `d * table[q]`.
pub(super) fn dequantize_row(src: &[BlockIq4Nl], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = b.d();
        let (lo, hi) = y.split_at_mut(QK / 2);
        for j in 0..QK / 2 {
            lo[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b.qs[j] & 0x0F)]);
            hi[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b.qs[j] >> 4)]);
        }
    }
}

/// Sum over 16 bytes of packed table indices times 32 activations (`q[j]` low nibbles with
/// `x[j]`, high nibbles with `x[j + 16]`), in integers.
#[inline(always)]
pub(super) fn dot16(qs: &[u8], x: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += i32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]) * i32::from(x[j])
            + i32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]) * i32::from(x[j + 16]);
    }
    s
}

/// IQ4_NL weights . Q8_0 activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        sumf += (bw.d() * bx.d()) * dot16(&bw.qs, &bx.qs) as f32;
    }
    sumf
}
