//! Q4_K: 256 weights per 144-byte super-block, `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`.
//! Eight sub-blocks of 32 weights, each with a 6-bit scale and a 6-bit min packed into `scales`
//! ([`scale_min_k4`]). Sub-blocks `2c` and `2c + 1` share bytes `qs[32c..32c + 32]`: low nibbles
//! for the first, high nibbles for the second. Value: `d * sc * q - dmin * m`.
//!
//! Activations pair as Q8_K: `dot = d_x * (d * sum_k sc_k * sum(q * y) - dmin * sum_k m_k *
//! (bsum_2k + bsum_2k+1))`, the sums in integers (ggml's `ggml_vec_dot_q4_K_q8_K`).

use super::block::{f16_le, Block};
use super::q8_k::{BlockQ8_K, QK_K};

/// One Q4_K block as it lies in memory (144 bytes, alignment 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_K {
    /// Super-block scale of the scales, f16 little-endian.
    pub d: [u8; 2],
    /// Super-block scale of the mins, f16 little-endian.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; 12],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::align_of::<BlockQ4_K>() == 1);
// SAFETY: repr(C), only byte arrays, size and alignment asserted above.
unsafe impl Block for BlockQ4_K {}

/// ggml's `get_scale_min_k4`: scale and min of sub-block `j` (0..8) from the 12 packed bytes of
/// Q4_K and Q5_K. `j < 4`: the low 6 bits of bytes `j` and `j + 4`; `j >= 4`: the nibbles of byte
/// `j + 4` with the top 2 bits of bytes `j - 4` and `j` above them.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes whole blocks.
pub(super) fn dequantize_row(src: &[BlockQ4_K], dst: &mut [f32]) {
    for (b, y) in src.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        for c in 0..4 {
            let q = &b.qs[32 * c..32 * c + 32];
            let (sc1, m1) = scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let y = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                y[l] = d1 * f32::from(q[l] & 0x0F) - m1;
                y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

/// Q4_K weights . Q8_K activations (scalar reference).
pub(super) fn vec_dot(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let (mut isum, mut summs) = (0i32, 0i32);
        for c in 0..4 {
            let q = &bw.qs[32 * c..32 * c + 32];
            let y = &bx.qs[64 * c..64 * c + 64];
            let (sc1, m1) = scale_min_k4(2 * c, &bw.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &bw.scales);
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                s1 += i32::from(q[l] & 0x0F) * i32::from(y[l]);
                s2 += i32::from(q[l] >> 4) * i32::from(y[l + 32]);
            }
            isum += i32::from(sc1) * s1 + i32::from(sc2) * s2;
            summs += i32::from(m1) * (bx.bsum(4 * c) + bx.bsum(4 * c + 1))
                + i32::from(m2) * (bx.bsum(4 * c + 2) + bx.bsum(4 * c + 3));
        }
        let d = f16_le(bw.d) * bx.d();
        let dmin = f16_le(bw.dmin) * bx.d();
        sumf += d * isum as f32 - dmin * summs as f32;
    }
    sumf
}
