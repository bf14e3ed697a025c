//! x86_64 kernels for Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K and Q6_K that add in the order of ggml's
//! AVX2 code (`ggml_vec_dot_q5_0_q8_0` / llamafile's tinyBLAS, `ggml_vec_dot_q5_1_q8_1`, tinyBLAS
//! for IQ4_NL, `ggml_vec_dot_q{4,5,6}_K_q8_K`), so that files of these types give llama.cpp's
//! numbers on x86-64. Measured in `tests/tests/quant_reference.rs`: Q5_0, Q5_1, Q5_K and Q6_K
//! files give llama.cpp's logits exactly. Q4_K and IQ4_NL matrices with a multiple of 8 rows are
//! repacked by llama.cpp on x86 and run other kernels: `Kernels::matvec` uses `repack.rs` for
//! those, these dots for the others (and for `vec_dot`).
//!
//! The shape every one of them shares: per block, eight exact i32 lane sums, lane `i` holding the
//! (scaled) products of elements `4i..4i+4` of each 32-element group (what `maddubs` + `madd`
//! produce); each lane converted to f32 and fused-multiply-added with the block's f32 scale
//! (`d_w * d_x`) into an 8-lane accumulator; at the end ggml's `hsum_float_8`. Q4_K's min term
//! has its own 4-lane accumulator (`madd` of the mins with pair sums of `bsums`), folded
//! `(a0 + a2) + (a1 + a3)` and added last.
//!
//! The integer parts are written as plain loops (the compiler vectorizes them); the float order
//! is what matters and is explicit. The functions are compiled with FMA, so `mul_add` is one
//! fused instruction, as `_mm256_fmadd_ps` is.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::avx2::Token;
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::q4_k::{scale_min_k4, BlockQ4_K};
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5_K;
use super::q6_k::BlockQ6_K;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8_K;
use super::{f16_le, QK};

/// ggml's `hsum_float_8`: `(lo + hi)`, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_impl(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bw.d() * bx.d();
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            for e in 4 * i..4 * i + 4 {
                *l += (i32::from(q[e]) - 16) * i32::from(bx.qs[e]);
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

/// Q5_1 . Q8_1 as ggml's AVX2 `ggml_vec_dot_q5_1_q8_1`: lanes as Q5_0 (no offset), and the
/// `m_w * s_x` products summed in one f32 in block order, added after the lanes' `hsum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1_q8_1_impl(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        summs += bw.m() * bx.s();
        let d = bw.d() * bx.d();
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            for e in 4 * i..4 * i + 4 {
                *l += i32::from(q[e]) * i32::from(bx.qs[e]);
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = (l as f32).mul_add(d, *a);
        }
    }
    hsum8(&acc) + summs
}

/// IQ4_NL . Q8_0 as llamafile's tinyBLAS (which llama.cpp's x86 build runs for IQ4_NL): the Q5_0
/// shape with table values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl_q8_0_impl(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bw.d() * bx.d();
        let mut lanes = [0i32; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            for e in 4 * i..4 * i + 4 {
                let n = if e < 16 {
                    bw.qs[e] & 0x0F
                } else {
                    bw.qs[e - 16] >> 4
                };
                *l += i32::from(KVALUES_IQ4NL[usize::from(n)]) * i32::from(bx.qs[e]);
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_q8_k_impl(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let mut sc = [0i32; 8];
        let mut mn = [0i32; 8];
        for k in 0..8 {
            let (s, m) = scale_min_k4(k, &bw.scales);
            sc[k] = i32::from(s);
            mn[k] = i32::from(m);
        }
        for (k, a) in acc_m.iter_mut().enumerate() {
            let q8s0 = bx.bsum(4 * k) + bx.bsum(4 * k + 1);
            let q8s1 = bx.bsum(4 * k + 2) + bx.bsum(4 * k + 3);
            let prod = mn[2 * k] * q8s0 + mn[2 * k + 1] * q8s1;
            *a = dmin.mul_add(prod as f32, *a);
        }
        let mut lanes = [0i32; 8];
        for c in 0..4 {
            let q = &bw.qs[32 * c..32 * c + 32];
            let y = &bx.qs[64 * c..64 * c + 64];
            for (i, l) in lanes.iter_mut().enumerate() {
                let (mut lo, mut hi) = (0i32, 0i32);
                for e in 4 * i..4 * i + 4 {
                    lo += i32::from(q[e] & 0x0F) * i32::from(y[e]);
                    hi += i32::from(q[e] >> 4) * i32::from(y[e + 32]);
                }
                *l += sc[2 * c] * lo + sc[2 * c + 1] * hi;
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Q5_K . Q8_K as ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`: lanes as Q4_K's; the min term is one
/// integer per block, `dmin * it` summed in one f32 in block order and added after the `hsum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k_q8_k_impl(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let mut sc = [0i32; 8];
        let mut mins = 0i32;
        for k in 0..8 {
            let (s, m) = scale_min_k4(k, &bw.scales);
            sc[k] = i32::from(s);
            mins += i32::from(m) * (bx.bsum(2 * k) + bx.bsum(2 * k + 1));
        }
        summs = dmin.mul_add(mins as f32, summs);
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for c in 0..8 {
            for (i, l) in lanes.iter_mut().enumerate() {
                let base = 32 * c + 4 * i;
                let mut s = 0i32;
                for e in base..base + 4 {
                    s += i32::from(q[e]) * i32::from(bx.qs[e]);
                }
                *l += sc[c] * s;
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_q8_k_impl(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let q = bw.quants();
        // ggml multiplies the unsigned quants (q + 32) and subtracts 32 * scale * bsum afterwards,
        // lane `i` taking sub-blocks 2i and 2i + 1: the lanes differ from a signed sum's.
        let mut lanes = [0i32; 8];
        for c in 0..8 {
            for (i, l) in lanes.iter_mut().enumerate() {
                let base = 32 * c + 4 * i;
                let mut s = 0i32;
                for e in base..base + 4 {
                    s += (i32::from(q[e]) + 32) * i32::from(bx.qs[e]);
                }
                *l += i32::from(bw.scales[base / 16]) * s;
            }
        }
        for (i, l) in lanes.iter_mut().enumerate() {
            let sub = bx.bsum(2 * i) * i32::from(bw.scales[2 * i])
                + bx.bsum(2 * i + 1) * i32::from(bw.scales[2 * i + 1]);
            *l -= sub << 5;
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

// Safe wrappers. SAFETY (all of them): a `Token` exists only after `Token::detect` confirmed AVX2,
// FMA and F16C on this CPU, so the target features the kernels are compiled for are present.

pub(super) fn dot_q5_0_q8_0(_: Token, w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    debug_assert_eq!(QK, 32);
    // SAFETY: see above.
    unsafe { dot_q5_0_q8_0_impl(w, x) }
}

pub(super) fn dot_q5_1_q8_1(_: Token, w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q5_1_q8_1_impl(w, x) }
}

pub(super) fn dot_iq4_nl_q8_0(_: Token, w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_iq4_nl_q8_0_impl(w, x) }
}

pub(super) fn dot_q4_k_q8_k(_: Token, w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q4_k_q8_k_impl(w, x) }
}

pub(super) fn dot_q5_k_q8_k(_: Token, w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q5_k_q8_k_impl(w, x) }
}

pub(super) fn dot_q6_k_q8_k(_: Token, w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q6_k_q8_k_impl(w, x) }
}
