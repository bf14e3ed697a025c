//! aarch64 NEON kernels for the quant types beyond Q4_0 / Q4_1 / Q8_0 (those are in `neon.rs`):
//! the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS against Q8_K activations, and Q5_0 /
//! IQ4_NL against Q8_0, Q5_1 against Q8_1. With these, every weight type the engine reads has a
//! NEON dot on aarch64.
//!
//! Each kernel is one `#[inline(always)]` body, generic over `SDOT`, compiled twice by
//! [`kernel!`]: with `sdot` (`neon,dotprod`) and with widening multiplies (`neon` only). The
//! integer parts are exact either way, so the two variants are bit-identical.
//!
//! # Order of operations: ggml's ARM NEON kernels, as GCC compiles them
//!
//! The float arithmetic follows the plain NEON branch of ggml-cpu's
//! `ggml/src/ggml-cpu/arch/arm/quants.c` (no SVE, no `i8mm`), and every scalar `a * b + c` in
//! it is one fused multiply-add, as GCC compiles that C code for llama.cpp (`neon.rs`:
//! `CONTRACT`, [`fmadd`]). `tests/data/neon-ggml/` holds ggml's own results, built that way and
//! run under qemu: both variants equal them bit for bit on every case. For the k-quants every
//! sub-block sum is an exact integer, and the floats are touched once per super-block
//! (`fma(a, b, c)` = one rounding):
//!
//! * Q4_K and Q2_K: `sumf = fma(-mins, dmin, sumf); sumf = fma(isum, d, sumf)`,
//! * Q5_K: `sumf += fma(isum, d, -(dmin * mins))`,
//! * Q6_K, Q3_K and IQ4_XS: `sumf = fma(d_w * d_x, isum, sumf)` (Q6_K's `-32` offset is added in
//!   integers through the `bsums`, as ggml does),
//!
//! where `d = d_x * d_w`, `dmin = d_x * dmin_w` and `mins = sum_k m_k * (bsum_2k + bsum_2k+1)`.
//!
//! The 32-element types keep per-block lanes in floats, as `neon.rs` describes for Q4_0:
//!
//! * Q5_0 and Q5_1 as Q4_0 / Q4_1 there (block pairs into two f32x4 accumulators of
//!   `acc + lanes * (d_w * d_x)`, unfused, then `hsum(acc0) + hsum(acc1)`), except that Q5_1
//!   sums the `m_w * s_x` of even and odd blocks apart (`summs_k = fma(m_w, s_x, summs_k)`) and
//!   adds them last: `((hsum0 + hsum1) + summs0) + summs1`;
//! * IQ4_NL in whole integers per block, per pair
//!   `sumf += fma(d_w0 * d_x0, sumi0, (d_w1 * d_x1) * sumi1)`.
//!
//! An odd last block is added in scalar code, as ggml's tail loop writes it (see the bodies).
//! The scalar references add block by block without fusing, so every type here differs from its
//! reference in the last bits: the tests hold the kernels to ggml's results and to scalar
//! emulations of ggml's order bit for bit, and to the references within a relative 1e-5.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::block::f16_le;
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::iq4_xs::BlockIq4Xs;
use super::neon::{block_idot, fmadd, hsum, load_q8, mla, nibbles, sdot, Token};
use super::q2_k::BlockQ2_K;
use super::q3_k::BlockQ3_K;
use super::q4_k::{scale_min_k4, BlockQ4_K};
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5_K;
use super::q6_k::BlockQ6_K;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8_K;

/// The 16 bytes of `s` at `at..at + 16`.
#[inline(always)]
unsafe fn load_u8(s: &[u8], at: usize) -> uint8x16_t {
    assert!(at + 16 <= s.len());
    // SAFETY: `at..at + 16` is in bounds (asserted; constant offsets into fixed-size arrays, so
    // the check folds away); `vld1q_u8` has no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr().add(at)) }
}

/// The 16 signed bytes of `s` at `at..at + 16`.
#[inline(always)]
unsafe fn load_i8(s: &[i8], at: usize) -> int8x16_t {
    assert!(at + 16 <= s.len());
    // SAFETY: as `load_u8`.
    unsafe { vld1q_s8(s.as_ptr().add(at)) }
}

/// The integer dot of 16 byte pairs, spread over 4 i32 lanes (only their sum is used). Bytes
/// are i8 on both sides (the callers' weights are small: -4..=63); exact either way.
#[inline(always)]
unsafe fn idot16<const SDOT: bool>(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if SDOT {
        // SAFETY: `SDOT` is true only when inlined into the `neon,dotprod` kernels of `kernel!`.
        unsafe { sdot(vdupq_n_s32(0), a, b) }
    } else {
        // i8 x i8 products fit i16; the pair sums are widened to i32.
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        vpadalq_s16(lo, vmull_high_s8(a, b))
    }
}

/// The dot of 32 weights (`w0`: elements 0..15, `w1`: 16..31) with 32 activations, as one i32.
#[inline(always)]
unsafe fn idot32<const SDOT: bool>(
    w0: int8x16_t,
    w1: int8x16_t,
    x0: int8x16_t,
    x1: int8x16_t,
) -> i32 {
    // SAFETY: `block_idot` with the caller's `SDOT` (see `idot16`).
    unsafe { vaddvq_s32(block_idot::<SDOT>(w0, w1, x0, x1)) }
}

/// Low and high nibbles of 16 bytes (values 0..15).
#[inline(always)]
unsafe fn split_nibbles(q: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
}

/// The same 16 bytes as signed (the callers' values are below 64, so unchanged).
#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// The 8 unpacked 6-bit scales of a Q4_K / Q5_K block and its min term
/// `sum_k m_k * (bsum_2k + bsum_2k+1)` (exact integers).
#[inline(always)]
fn scales_and_mins(packed: &[u8; 12], x: &BlockQ8_K) -> ([i32; 8], i32) {
    let (mut sc, mut mins) = ([0i32; 8], 0i32);
    for k in 0..8 {
        let (s, m) = scale_min_k4(k, packed);
        sc[k] = i32::from(s);
        mins += i32::from(m) * (x.bsum(2 * k) + x.bsum(2 * k + 1));
    }
    (sc, mins)
}

/// Q4_K . Q8_K in ggml's NEON order (module docs).
#[inline(always)]
unsafe fn dot_q4_k_q8_k_body<const SDOT: bool>(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = bx.d() * f16_le(bw.dmin);
        let (sc, mins) = scales_and_mins(&bw.scales, bx);
        sumf = fmadd(-(mins as f32), dmin, sumf);
        let mut isum = 0i32;
        for c in 0..4 {
            // SAFETY: in-bounds loads (`load_*`), plain NEON, `SDOT` as the caller's.
            unsafe {
                let (l0, h0) = split_nibbles(load_u8(&bw.qs, 32 * c));
                let (l1, h1) = split_nibbles(load_u8(&bw.qs, 32 * c + 16));
                let y = |k: usize| load_i8(&bx.qs, 64 * c + 16 * k);
                let lo = idot32::<SDOT>(s8(l0), s8(l1), y(0), y(1));
                let hi = idot32::<SDOT>(s8(h0), s8(h1), y(2), y(3));
                isum += lo * sc[2 * c] + hi * sc[2 * c + 1];
            }
        }
        sumf = fmadd(isum as f32, d, sumf);
    }
    sumf
}

/// Q5_K . Q8_K in ggml's NEON order (module docs).
#[inline(always)]
unsafe fn dot_q5_k_q8_k_body<const SDOT: bool>(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = bx.d() * f16_le(bw.dmin);
        let (sc, mins) = scales_and_mins(&bw.scales, bx);
        let mut isum = 0i32;
        // SAFETY: in-bounds loads (`load_*`), plain NEON, `SDOT` as the caller's.
        unsafe {
            // Fifth bits of elements l = 0..15 and 16..31; shifted down 2 bits per 64 weights.
            let (mut qh0, mut qh1) = (load_u8(&bw.qh, 0), load_u8(&bw.qh, 16));
            let (one, two) = (vdupq_n_u8(1), vdupq_n_u8(2));
            for c in 0..4 {
                let (l0, h0) = split_nibbles(load_u8(&bw.qs, 32 * c));
                let (l1, h1) = split_nibbles(load_u8(&bw.qs, 32 * c + 16));
                let l0 = vorrq_u8(l0, vshlq_n_u8::<4>(vandq_u8(qh0, one)));
                let l1 = vorrq_u8(l1, vshlq_n_u8::<4>(vandq_u8(qh1, one)));
                let h0 = vorrq_u8(h0, vshlq_n_u8::<3>(vandq_u8(qh0, two)));
                let h1 = vorrq_u8(h1, vshlq_n_u8::<3>(vandq_u8(qh1, two)));
                qh0 = vshrq_n_u8::<2>(qh0);
                qh1 = vshrq_n_u8::<2>(qh1);
                let y = |k: usize| load_i8(&bx.qs, 64 * c + 16 * k);
                let lo = idot32::<SDOT>(s8(l0), s8(l1), y(0), y(1));
                let hi = idot32::<SDOT>(s8(h0), s8(h1), y(2), y(3));
                isum += lo * sc[2 * c] + hi * sc[2 * c + 1];
            }
        }
        // GCC fuses `d * isum` and rounds `dmin * mins`.
        sumf += fmadd(isum as f32, d, -(dmin * mins as f32));
    }
    sumf
}

/// Q6_K . Q8_K in ggml's NEON order (module docs): the quants as unsigned 0..63, the `-32`
/// folded in afterwards as `32 * sum_k sc_k * bsum_k`.
#[inline(always)]
unsafe fn dot_q6_k_q8_k_body<const SDOT: bool>(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut isum_mins = 0i32;
        for k in 0..16 {
            isum_mins += i32::from(bw.scales[k]) * bx.bsum(k);
        }
        let sc = |k: usize| i32::from(bw.scales[k]);
        let mut isum = 0i32;
        for h in 0..2 {
            // SAFETY: in-bounds loads (`load_*`), plain NEON, `SDOT` as the caller's.
            unsafe {
                let (qh0, qh1) = (load_u8(&bw.qh, 32 * h), load_u8(&bw.qh, 32 * h + 16));
                let ql = [0, 1, 2, 3].map(|k| split_nibbles(load_u8(&bw.ql, 64 * h + 16 * k)));
                let three = vdupq_n_u8(3);
                // The quant's top 2 bits: the low bit pair of `qh` (shifted into place), at 4..5.
                let top = |qh: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(qh, three));
                // Elements 128h + 16k.. for k = 0..8: low nibbles of ql 0..63 with bit pairs 0
                // and 1 of qh, then high nibbles with bit pairs 2 and 3.
                let q = [
                    vorrq_u8(ql[0].0, top(qh0)),
                    vorrq_u8(ql[1].0, top(qh1)),
                    vorrq_u8(ql[2].0, top(vshrq_n_u8::<2>(qh0))),
                    vorrq_u8(ql[3].0, top(vshrq_n_u8::<2>(qh1))),
                    vorrq_u8(ql[0].1, top(vshrq_n_u8::<4>(qh0))),
                    vorrq_u8(ql[1].1, top(vshrq_n_u8::<4>(qh1))),
                    vorrq_u8(ql[2].1, top(vshrq_n_u8::<6>(qh0))),
                    vorrq_u8(ql[3].1, top(vshrq_n_u8::<6>(qh1))),
                ];
                for (k, qk) in q.into_iter().enumerate() {
                    let y = load_i8(&bx.qs, 128 * h + 16 * k);
                    isum += vaddvq_s32(idot16::<SDOT>(s8(qk), y)) * sc(8 * h + k);
                }
            }
        }
        sumf = fmadd(f16_le(bw.d) * bx.d(), (isum - 32 * isum_mins) as f32, sumf);
    }
    sumf
}

/// Bits `2s..2s+1` of every byte of `q` (`s` = 0..3).
#[inline(always)]
unsafe fn crumbs(q: uint8x16_t, s: usize) -> uint8x16_t {
    // `vshlq_u8` shifts right for a negative count.
    vandq_u8(vshlq_u8(q, vdupq_n_s8(-2 * s as i8)), vdupq_n_u8(3))
}

/// Q2_K . Q8_K in ggml's NEON order (module docs): quants 0..3 from 2-bit fields,
/// `sumf -= dmin * mins; sumf += d * isum`.
#[inline(always)]
unsafe fn dot_q2_k_q8_k_body<const SDOT: bool>(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = bx.d() * f16_le(bw.dmin);
        let mut mins = 0i32;
        for k in 0..16 {
            mins += i32::from(bw.scales[k] >> 4) * bx.bsum(k);
        }
        sumf = fmadd(-(mins as f32), dmin, sumf);
        let mut isum = 0i32;
        for h in 0..2 {
            // SAFETY: in-bounds loads (`load_*`), plain NEON, `SDOT` as the caller's.
            unsafe {
                let q = [load_u8(&bw.qs, 32 * h), load_u8(&bw.qs, 32 * h + 16)];
                for s in 0..4 {
                    for (i, qi) in q.into_iter().enumerate() {
                        let k = 8 * h + 2 * s + i;
                        let y = load_i8(&bx.qs, 16 * k);
                        let dot = vaddvq_s32(idot16::<SDOT>(s8(crumbs(qi, s)), y));
                        isum += dot * i32::from(bw.scales[k] & 0x0F);
                    }
                }
            }
        }
        sumf = fmadd(isum as f32, d, sumf);
    }
    sumf
}

/// Q3_K . Q8_K in ggml's NEON order (module docs): quants -4..3 (2-bit field, minus 4 where
/// the `hmask` bit is clear), `sumf += d * isum`.
#[inline(always)]
unsafe fn dot_q3_k_q8_k_body<const SDOT: bool>(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let sc = bw.scales();
        let mut isum = 0i32;
        // SAFETY: in-bounds loads (`load_*`), plain NEON, `SDOT` as the caller's.
        unsafe {
            let hm = [load_u8(&bw.hmask, 0), load_u8(&bw.hmask, 16)];
            let four = vdupq_n_u8(4);
            for h in 0..2 {
                let q = [load_u8(&bw.qs, 32 * h), load_u8(&bw.qs, 32 * h + 16)];
                for s in 0..4 {
                    let bit = vdupq_n_u8(1 << (4 * h + s));
                    for i in 0..2 {
                        let k = 8 * h + 2 * s + i;
                        // 4 where the bit is clear, 0 where it is set.
                        let off = vbicq_u8(four, vtstq_u8(hm[i], bit));
                        let qk = vsubq_s8(s8(crumbs(q[i], s)), s8(off));
                        let y = load_i8(&bx.qs, 16 * k);
                        isum += vaddvq_s32(idot16::<SDOT>(qk, y)) * sc[k];
                    }
                }
            }
        }
        sumf = fmadd(isum as f32, d, sumf);
    }
    sumf
}

/// IQ4_XS . Q8_K in ggml's NEON order (module docs): IQ4_NL values with 6-bit signed scales
/// per 32 weights, `sumf += (d_w * d_x) * isum`.
#[inline(always)]
unsafe fn dot_iq4_xs_q8_k_body<const SDOT: bool>(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut isum = 0i32;
        for k in 0..8 {
            let qs: &[u8; 16] = bw.qs[16 * k..16 * k + 16]
                .try_into()
                .expect("16 bytes by construction");
            // SAFETY: in-bounds loads (`load_i8`, `iq4_nl_values`), `SDOT` as the caller's.
            unsafe {
                let (wl, wh) = iq4_nl_values(qs);
                let (yl, yh) = (load_i8(&bx.qs, 32 * k), load_i8(&bx.qs, 32 * k + 16));
                isum += idot32::<SDOT>(wl, wh, yl, yh) * bw.scale(k);
            }
        }
        sumf = fmadd(f16_le(bw.d) * bx.d(), isum as f32, sumf);
    }
    sumf
}

/// The fifth bits of a Q5_0 / Q5_1 block as `0x10` bytes: elements 0..15 and 16..31.
#[inline(always)]
unsafe fn fifth_bits(qh: &[u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `BIT` is 16 readable bytes; the rest is plain NEON on registers.
    unsafe {
        let bit = vld1q_u8(BIT.as_ptr());
        let tens = vdupq_n_u8(0x10);
        let lo = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
        let hi = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
        (
            vandq_u8(vtstq_u8(lo, bit), tens),
            vandq_u8(vtstq_u8(hi, bit), tens),
        )
    }
}

/// The 32 unsigned 5-bit quants of a Q5_0 / Q5_1 block: elements 0..15 and 16..31.
#[inline(always)]
unsafe fn q5_quants(qs: &[u8; 16], qh: &[u8; 4]) -> (int8x16_t, int8x16_t) {
    // SAFETY: plain NEON on in-bounds arrays (`nibbles`, `fifth_bits`).
    unsafe {
        let (lo, hi) = nibbles(qs);
        let (blo, bhi) = fifth_bits(qh);
        (
            vorrq_s8(lo, vreinterpretq_s8_u8(blo)),
            vorrq_s8(hi, vreinterpretq_s8_u8(bhi)),
        )
    }
}

/// Scalar integer dot of 32 quants (minus `offset`) with 32 activations (the tail block).
#[inline(always)]
fn q5_sumi(q: [u8; 32], x: &[i8; 32], offset: i32) -> i32 {
    q.iter()
        .zip(x)
        .map(|(&q, &y)| (i32::from(q) - offset) * i32::from(y))
        .sum()
}

/// Q5_0 . Q8_0 in ggml's NEON order, as Q4_0's in `neon.rs`: block pairs into two f32x4
/// accumulators (`acc + lanes * (d_w * d_x)`), `hsum(acc0) + hsum(acc1)`, an odd last block as
/// `sumf += (d_w * d_x) * sumi`.
#[inline(always)]
unsafe fn dot_q5_0_q8_0_body<const SDOT: bool>(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len().min(x.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut ib = 0;
    while ib + 1 < nb {
        let pairs = [(&w[ib], &x[ib]), (&w[ib + 1], &x[ib + 1])];
        for (a, (bw, bx)) in acc.iter_mut().zip(pairs) {
            // SAFETY: plain NEON on in-bounds block references; `SDOT` as the caller's.
            unsafe {
                let (wl, wh) = q5_quants(&bw.qs, &bw.qh);
                let sixteen = vdupq_n_s8(16);
                let (wl, wh) = (vsubq_s8(wl, sixteen), vsubq_s8(wh, sixteen));
                let (xl, xh) = load_q8(&bx.qs);
                *a = mla(*a, block_idot::<SDOT>(wl, wh, xl, xh), bw.d() * bx.d());
            }
        }
        ib += 2;
    }
    // SAFETY: plain NEON arithmetic on registers.
    let mut sumf = unsafe { hsum(acc[0]) + hsum(acc[1]) };
    if ib < nb {
        let sumi = q5_sumi(w[ib].quants(), &x[ib].qs, 16);
        sumf = fmadd(w[ib].d() * x[ib].d(), sumi as f32, sumf);
    }
    sumf
}

/// Q5_1 . Q8_1 in ggml's NEON order: as Q5_0 without the offset, the `m_w * s_x` products of
/// even and odd blocks summed apart: `((hsum(acc0) + hsum(acc1)) + summs0) + summs1`; an odd
/// last block as `sumf += ((d_w * d_x) * sumi + m_w * s_x)`.
#[inline(always)]
unsafe fn dot_q5_1_q8_1_body<const SDOT: bool>(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    let nb = w.len().min(x.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut summs = [0.0f32; 2];
    let mut ib = 0;
    while ib + 1 < nb {
        let pairs = [(&w[ib], &x[ib]), (&w[ib + 1], &x[ib + 1])];
        for ((a, sm), (bw, bx)) in acc.iter_mut().zip(&mut summs).zip(pairs) {
            *sm = fmadd(bw.m(), bx.s(), *sm);
            // SAFETY: plain NEON on in-bounds block references; `SDOT` as the caller's.
            unsafe {
                let (wl, wh) = q5_quants(&bw.qs, &bw.qh);
                let (xl, xh) = load_q8(&bx.qs);
                *a = mla(*a, block_idot::<SDOT>(wl, wh, xl, xh), bw.d() * bx.d());
            }
        }
        ib += 2;
    }
    // SAFETY: plain NEON arithmetic on registers.
    let mut sumf = unsafe { hsum(acc[0]) + hsum(acc[1]) } + summs[0] + summs[1];
    if ib < nb {
        let sumi = q5_sumi(w[ib].quants(), &x[ib].qs, 0);
        sumf += fmadd(w[ib].d() * x[ib].d(), sumi as f32, w[ib].m() * x[ib].s());
    }
    sumf
}

/// The 32 IQ4_NL values of a block (table lookups of the nibbles): elements 0..15, 16..31.
#[inline(always)]
unsafe fn iq4_nl_values(qs: &[u8; 16]) -> (int8x16_t, int8x16_t) {
    // SAFETY: the table is 16 readable bytes; `nibbles` reads the 16 of `qs`; `vqtbl1q_s8`
    // with indices 0..15 only reads the table register.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let (lo, hi) = nibbles(qs);
        (
            vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)),
            vqtbl1q_s8(table, vreinterpretq_u8_s8(hi)),
        )
    }
}

/// IQ4_NL . Q8_0 in ggml's NEON order: per block pair
/// `sumf += (d_w0 * d_x0) * sumi0 + (d_w1 * d_x1) * sumi1`, an odd last block as
/// `sumf += (d_x * d_w) * sumi`.
#[inline(always)]
unsafe fn dot_iq4_nl_q8_0_body<const SDOT: bool>(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len().min(x.len());
    let mut sumf = 0.0f32;
    let mut ib = 0;
    let sumi = |bw: &BlockIq4Nl, bx: &BlockQ8_0| {
        // SAFETY: plain NEON on in-bounds block references; `SDOT` as the caller's.
        unsafe {
            let (wl, wh) = iq4_nl_values(&bw.qs);
            let (xl, xh) = load_q8(&bx.qs);
            idot32::<SDOT>(wl, wh, xl, xh)
        }
    };
    while ib + 1 < nb {
        let s0 = sumi(&w[ib], &x[ib]);
        let s1 = sumi(&w[ib + 1], &x[ib + 1]);
        // GCC fuses the first block's product.
        let second = (w[ib + 1].d() * x[ib + 1].d()) * s1 as f32;
        sumf += fmadd(w[ib].d() * x[ib].d(), s0 as f32, second);
        ib += 2;
    }
    if ib < nb {
        sumf = fmadd(sumi(&w[ib], &x[ib]) as f32, x[ib].d() * w[ib].d(), sumf);
    }
    sumf
}

/// A safe kernel `$name(token, w, x)` from a body generic over `SDOT`: the body compiled once
/// with `sdot` and once with widening multiplies, picked by the token.
macro_rules! kernel {
    ($(#[$doc:meta])* $name:ident, $body:ident, $w:ty, $x:ty) => {
        $(#[$doc])*
        pub(super) fn $name(t: Token, w: &[$w], x: &[$x]) -> f32 {
            #[target_feature(enable = "neon,dotprod")]
            unsafe fn with_sdot(w: &[$w], x: &[$x]) -> f32 {
                // SAFETY: this function has the features the SDOT body needs.
                unsafe { $body::<true>(w, x) }
            }
            #[target_feature(enable = "neon")]
            unsafe fn widening(w: &[$w], x: &[$x]) -> f32 {
                // SAFETY: the widening body needs NEON only.
                unsafe { $body::<false>(w, x) }
            }
            debug_assert_eq!(w.len(), x.len());
            // SAFETY: a `Token` exists only after `Token::detect` confirmed NEON on this CPU, and
            // one with `dotprod() == true` only after it confirmed the dot-product extension.
            unsafe {
                if t.dotprod() {
                    with_sdot(w, x)
                } else {
                    widening(w, x)
                }
            }
        }
    };
}

kernel!(
    /// Q4_K weights . Q8_K activations.
    dot_q4_k_q8_k,
    dot_q4_k_q8_k_body,
    BlockQ4_K,
    BlockQ8_K
);
kernel!(
    /// Q5_K weights . Q8_K activations.
    dot_q5_k_q8_k,
    dot_q5_k_q8_k_body,
    BlockQ5_K,
    BlockQ8_K
);
kernel!(
    /// Q6_K weights . Q8_K activations.
    dot_q6_k_q8_k,
    dot_q6_k_q8_k_body,
    BlockQ6_K,
    BlockQ8_K
);
kernel!(
    /// Q5_0 weights . Q8_0 activations.
    dot_q5_0_q8_0,
    dot_q5_0_q8_0_body,
    BlockQ5_0,
    BlockQ8_0
);
kernel!(
    /// Q5_1 weights . Q8_1 activations.
    dot_q5_1_q8_1,
    dot_q5_1_q8_1_body,
    BlockQ5_1,
    BlockQ8_1
);
kernel!(
    /// IQ4_NL weights . Q8_0 activations.
    dot_iq4_nl_q8_0,
    dot_iq4_nl_q8_0_body,
    BlockIq4Nl,
    BlockQ8_0
);
kernel!(
    /// Q2_K weights . Q8_K activations.
    dot_q2_k_q8_k,
    dot_q2_k_q8_k_body,
    BlockQ2_K,
    BlockQ8_K
);
kernel!(
    /// Q3_K weights . Q8_K activations.
    dot_q3_k_q8_k,
    dot_q3_k_q8_k_body,
    BlockQ3_K,
    BlockQ8_K
);
kernel!(
    /// IQ4_XS weights . Q8_K activations.
    dot_iq4_xs_q8_k,
    dot_iq4_xs_q8_k_body,
    BlockIq4Xs,
    BlockQ8_K
);

/// Both NEON variants against the scalar references (bit for bit where ggml's NEON order is the
/// reference's order) and against scalar emulations of ggml's NEON order (bit for bit where it
/// is not), on random and extreme blocks, for several block counts.
#[cfg(test)]
mod tests {
    use super::super::block::{blocks, f16_le_bytes};
    use super::super::{dequantize_row, quantize_row, GgmlType, Kernels};
    use super::*;
    use crate::testutil::Rng;

    /// Every NEON variant this CPU runs: with `sdot` where it has dotprod (qemu-aarch64's
    /// default CPU and Orin do), and always the widening one.
    fn neon_kernels() -> Vec<Kernels> {
        let v: Vec<Kernels> = Kernels::available()
            .into_iter()
            .filter(|k| k.isa_name().starts_with("neon"))
            .collect();
        let want = if std::arch::is_aarch64_feature_detected!("dotprod") {
            2
        } else {
            1
        };
        assert_eq!(
            v.len(),
            want,
            "NEON variants: {:?}",
            v.iter().map(|k| k.isa_name())
        );
        v
    }

    /// Byte offsets of the f16 scales in a block of `ty`.
    fn f16_offsets(ty: GgmlType) -> &'static [usize] {
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::IQ4_XS => &[0],
            GgmlType::Q5_0 | GgmlType::IQ4_NL => &[0],
            GgmlType::Q5_1 => &[0, 2],
            _ => unreachable!("{ty}"),
        }
    }

    /// `nb` raw random blocks of `ty` with sane f16 scales. `extreme`: every quant at its
    /// largest magnitude (Q5_0: -16, IQ4_NL / IQ4_XS: -127, Q3_K: -4, with scales -32; the
    /// others their maximum, 6-bit scales 63, Q6_K's i8 scales -128), and every third block's
    /// f16 scales zero.
    fn weights(r: &mut Rng, ty: GgmlType, nb: usize, extreme: bool) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut w = r.bytes(bb * nb);
        for (i, blk) in w.chunks_mut(bb).enumerate() {
            if extreme {
                let lowest = matches!(
                    ty,
                    GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::Q3_K | GgmlType::IQ4_XS
                );
                blk.fill(if lowest { 0x00 } else { 0xFF });
                if ty == GgmlType::Q6_K {
                    blk[192..208].fill(0x80);
                }
            }
            for &o in f16_offsets(ty) {
                let d = if extreme && i % 3 == 1 {
                    0.0
                } else {
                    r.f32(0.05)
                };
                blk[o..o + 2].copy_from_slice(&f16_le_bytes(d));
            }
        }
        w
    }

    /// Activations of type `xt` (Q8_0, Q8_1 or Q8_K) for `nb` blocks, quantized from random
    /// floats; `extreme`: every quant -128 (Q8_K's bsums -2048), every fourth block's `d` zero.
    fn activations(r: &mut Rng, xt: GgmlType, nb: usize, extreme: bool) -> Vec<u8> {
        let n = nb * xt.block_size();
        let bb = xt.block_bytes();
        let mut x = vec![0u8; nb * bb];
        quantize_row(xt, &r.vec(n, 2.0), &mut x).unwrap();
        if extreme {
            // Where the quants start and how many bytes `d` has.
            let (q0, d_len) = match xt {
                GgmlType::Q8_K => (4, 4),
                GgmlType::Q8_1 => (4, 2),
                _ => (2, 2),
            };
            for (i, blk) in x.chunks_mut(bb).enumerate() {
                let nq = xt.block_size();
                blk[q0..q0 + nq].fill(0x80);
                for s in blk[q0 + nq..].chunks_mut(2) {
                    s.copy_from_slice(&(-2048i16).to_le_bytes());
                }
                if i % 4 == 2 {
                    blk[..d_len].fill(0);
                }
            }
        }
        x
    }

    /// ggml's 4 integer lanes of a 32-element block: lane `k` = elements `4k..4k+3` and
    /// `16+4k..16+4k+3`.
    fn lanes(w: &[i32; 32], x: &[i8; 32]) -> [i32; 4] {
        let mut l = [0i32; 4];
        for j in 0..32 {
            l[(j % 16) / 4] += w[j] * i32::from(x[j]);
        }
        l
    }

    /// `acc + lanes * scale`, each lane rounded twice (ggml's `vmlaq_n_f32`, as `neon.rs`).
    fn mla4(acc: &mut [f32; 4], l: [i32; 4], scale: f32) {
        for (a, v) in acc.iter_mut().zip(l) {
            *a += v as f32 * scale;
        }
    }

    fn hsum4(a: [f32; 4]) -> f32 {
        (a[0] + a[1]) + (a[2] + a[3])
    }

    /// ggml's NEON Q5_0 (`offset` 16, no mins) and Q5_1 (`offset` 0, `m * s` terms) order in
    /// scalar code; `(d_w, m_w, q)` and `(d_x, s_x, qs)` per block.
    fn arm_q5(w: &[(f32, f32, [u8; 32])], x: &[(f32, f32, [i8; 32])], offset: i32) -> f32 {
        let nb = w.len();
        let (mut acc, mut summs) = ([[0.0f32; 4]; 2], [0.0f32; 2]);
        let value = |q: [u8; 32]| q.map(|v| i32::from(v) - offset);
        let mut ib = 0;
        while ib + 1 < nb {
            for k in 0..2 {
                let ((dw, mw, q), (dx, sx, qs)) = (w[ib + k], x[ib + k]);
                summs[k] = fmadd(mw, sx, summs[k]);
                mla4(&mut acc[k], lanes(&value(q), &qs), dw * dx);
            }
            ib += 2;
        }
        let mut sumf = hsum4(acc[0]) + hsum4(acc[1]);
        if offset == 0 {
            sumf = sumf + summs[0] + summs[1];
        }
        if ib < nb {
            let ((dw, mw, q), (dx, sx, qs)) = (w[ib], x[ib]);
            let sumi: i32 = lanes(&value(q), &qs).iter().sum();
            sumf = if offset == 0 {
                sumf + fmadd(dw * dx, sumi as f32, mw * sx)
            } else {
                fmadd(dw * dx, sumi as f32, sumf)
            };
        }
        sumf
    }

    /// ggml's NEON IQ4_NL order in scalar code.
    fn arm_iq4_nl(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
        let sumi = |bw: &BlockIq4Nl, bx: &BlockQ8_0| -> i32 {
            (0..32)
                .map(|j| {
                    let nib = if j < 16 {
                        bw.qs[j] & 0x0F
                    } else {
                        bw.qs[j - 16] >> 4
                    };
                    i32::from(KVALUES_IQ4NL[usize::from(nib)]) * i32::from(bx.qs[j])
                })
                .sum()
        };
        let (nb, mut sumf, mut ib) = (w.len(), 0.0f32, 0);
        while ib + 1 < nb {
            let (s0, s1) = (sumi(&w[ib], &x[ib]), sumi(&w[ib + 1], &x[ib + 1]));
            let second = (w[ib + 1].d() * x[ib + 1].d()) * s1 as f32;
            sumf += fmadd(w[ib].d() * x[ib].d(), s0 as f32, second);
            ib += 2;
        }
        if ib < nb {
            sumf = fmadd(sumi(&w[ib], &x[ib]) as f32, x[ib].d() * w[ib].d(), sumf);
        }
        sumf
    }

    /// The emulation of ggml's NEON order for the 32-element types.
    fn arm_order(ty: GgmlType, w: &[u8], x: &[u8]) -> f32 {
        match ty {
            GgmlType::Q5_0 => {
                let (wb, xb): (&[BlockQ5_0], &[BlockQ8_0]) = (blocks(w), blocks(x));
                let wv: Vec<_> = wb.iter().map(|b| (b.d(), 0.0, b.quants())).collect();
                let xv: Vec<_> = xb.iter().map(|b| (b.d(), 0.0, b.qs)).collect();
                arm_q5(&wv, &xv, 16)
            }
            GgmlType::Q5_1 => {
                let (wb, xb): (&[BlockQ5_1], &[BlockQ8_1]) = (blocks(w), blocks(x));
                let wv: Vec<_> = wb.iter().map(|b| (b.d(), b.m(), b.quants())).collect();
                let xv: Vec<_> = xb.iter().map(|b| (b.d(), b.s(), b.qs)).collect();
                arm_q5(&wv, &xv, 0)
            }
            _ => arm_iq4_nl(blocks(w), blocks(x)),
        }
    }

    #[test]
    fn q5_and_iq4_nl_follow_ggml_neon_order_bit_for_bit() {
        let mut r = Rng::new(301);
        let ks = neon_kernels();
        for ty in [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL] {
            let xt = ty.vec_dot_type();
            for nb in [1usize, 2, 3, 4, 7, 9, 33] {
                for extreme in [false, true] {
                    let w = weights(&mut r, ty, nb, extreme);
                    let x = activations(&mut r, xt, nb, extreme);
                    let n = nb * 32;
                    let want = arm_order(ty, &w, &x);
                    for k in &ks {
                        let got = k.vec_dot(ty, n, &w, &x);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {ty} nb={nb} extreme={extreme}: {got} vs {want}",
                            k.isa_name()
                        );
                        let w2 = [w.clone(), w.clone()].concat();
                        let mut y = [0.0f32; 2];
                        k.matvec(ty, n, &w2, &x, 0..2, &mut y);
                        assert_eq!(y.map(f32::to_bits), [got.to_bits(); 2]);
                    }
                    // Another order than the scalar reference's: close to it.
                    let scalar = Kernels::scalar().vec_dot(ty, n, &w, &x);
                    let (mut wd, mut xd) = (vec![0.0; n], vec![0.0; n]);
                    dequantize_row(ty, &w, &mut wd).unwrap();
                    dequantize_row(xt, &x, &mut xd).unwrap();
                    let mut mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                    if ty == GgmlType::Q5_1 {
                        let (wb, xb): (&[BlockQ5_1], &[BlockQ8_1]) = (blocks(&w), blocks(&x));
                        mag += wb
                            .iter()
                            .zip(xb)
                            .map(|(a, b)| (a.m() * b.s()).abs())
                            .sum::<f32>();
                    }
                    assert!(
                        (want - scalar).abs() <= 1e-5 * mag + 1e-6,
                        "{ty} nb={nb} extreme={extreme}: {want} vs scalar {scalar}"
                    );
                }
            }
        }
    }

    use super::super::QK_K;

    /// ggml's NEON Q4_K order, in scalar code: per block `sumf -= dmin * mins`, then
    /// `sumf += d * isum`. Also returns the sum of the magnitudes of those terms.
    fn arm_q4_k(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> (f32, f32) {
        let (mut sumf, mut mag) = (0.0f32, 0.0f32);
        for (bw, bx) in w.iter().zip(x) {
            let (mut isum, mut mins) = (0i32, 0i32);
            for k in 0..8 {
                let (sc, m) = scale_min_k4(k, &bw.scales);
                for l in 0..32 {
                    let q = bw.qs[32 * (k / 2) + l];
                    let q = if k % 2 == 0 { q & 0x0F } else { q >> 4 };
                    let y = i32::from(bx.qs[32 * k + l]);
                    isum += i32::from(sc) * i32::from(q) * y;
                    mins += i32::from(m) * y;
                }
            }
            let d = bx.d() * f16_le(bw.d);
            let dmin = bx.d() * f16_le(bw.dmin);
            sumf = fmadd(-(mins as f32), dmin, sumf);
            sumf = fmadd(isum as f32, d, sumf);
            mag += (dmin * mins as f32).abs() + (d * isum as f32).abs();
        }
        (sumf, mag)
    }

    /// ggml's NEON Q2_K order, in scalar code (as Q4_K's: the min term first).
    fn arm_q2_k(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> (f32, f32) {
        let (mut sumf, mut mag) = (0.0f32, 0.0f32);
        for (bw, bx) in w.iter().zip(x) {
            let (mut isum, mut mins) = (0i32, 0i32);
            for k in 0..16 {
                let (sc, m) = (bw.scales[k] & 0x0F, bw.scales[k] >> 4);
                for l in 0..16 {
                    // Element 16k + l = 128h + 32s + l' takes bits 2s of qs[32h + l'].
                    let e = 16 * k + l;
                    let (h, s, lq) = (e / 128, (e % 128) / 32, e % 32);
                    let q = (bw.qs[32 * h + lq] >> (2 * s)) & 3;
                    let y = i32::from(bx.qs[e]);
                    isum += i32::from(sc) * i32::from(q) * y;
                    mins += i32::from(m) * y;
                }
            }
            let d = bx.d() * f16_le(bw.d);
            let dmin = bx.d() * f16_le(bw.dmin);
            sumf = fmadd(-(mins as f32), dmin, sumf);
            sumf = fmadd(isum as f32, d, sumf);
            mag += (dmin * mins as f32).abs() + (d * isum as f32).abs();
        }
        (sumf, mag)
    }

    /// The sum of `|w_i * x_i|` over the dequantized rows (the scale of rounding errors).
    fn magnitude(ty: GgmlType, w: &[u8], x: &[u8]) -> f32 {
        let n = w.len() / ty.block_bytes() * ty.block_size();
        let (mut wd, mut xd) = (vec![0.0; n], vec![0.0; n]);
        dequantize_row(ty, w, &mut wd).unwrap();
        dequantize_row(GgmlType::Q8_K, x, &mut xd).unwrap();
        wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum()
    }

    /// Both variants against the f64 dot of gguf-py's dequantized weights (data made
    /// independently of this code: `quant_vectors.rs`, within 1e-5 of the sum of |terms|).
    #[test]
    fn both_variants_match_gguf_py_vectors() {
        for k in neon_kernels() {
            let worst = super::super::quant_vectors::check_vec_dot(&k);
            eprintln!(
                "{}: worst relative error vs gguf-py {worst:.2e}",
                k.isa_name()
            );
        }
    }

    /// Both variants against ggml-cpu's own ARM NEON dots: `tests/data/neon-ggml/` holds random
    /// and extreme rows of every type (`cases.bin`) and the results of llama.cpp's
    /// `ggml_vec_dot_*` compiled for aarch64 with GCC and run under qemu (`ggml-arm.bin`; its
    /// README says how they were made).
    #[test]
    fn both_variants_equal_ggml_arm_build() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/neon-ggml");
        let cases = std::fs::read(dir.join("cases.bin")).expect("tests/data/neon-ggml/cases.bin");
        let want = std::fs::read(dir.join("ggml-arm.bin")).expect("neon-ggml/ggml-arm.bin");
        let rd = |p: &mut usize| {
            let v = u32::from_le_bytes(cases[*p..*p + 4].try_into().unwrap()) as usize;
            *p += 4;
            v
        };
        let mut pos = 0;
        let count = rd(&mut pos);
        assert_eq!(want.len(), 4 * count);
        let ks = neon_kernels();
        let mut mismatches = Vec::new();
        let mut per_type: std::collections::BTreeMap<String, usize> = Default::default();
        for c in 0..count {
            let (id, n) = (rd(&mut pos) as u32, rd(&mut pos));
            let wl = rd(&mut pos);
            let w = &cases[pos..pos + wl];
            pos += wl;
            let xl = rd(&mut pos);
            let x = &cases[pos..pos + xl];
            pos += xl;
            let ty = GgmlType::from_id(id).unwrap();
            let expect = f32::from_le_bytes(want[4 * c..4 * c + 4].try_into().unwrap());
            *per_type.entry(ty.to_string()).or_default() += 1;
            for k in &ks {
                let got = k.vec_dot(ty, n, w, x);
                if got.to_bits() != expect.to_bits() {
                    mismatches.push(format!(
                        "{} {ty} n={n} (case {c}): {got} vs ggml {expect}",
                        k.isa_name()
                    ));
                }
            }
        }
        assert_eq!(pos, cases.len());
        eprintln!("cases per type, each compared with ggml's ARM build: {per_type:?}");
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    }

    #[test]
    fn k_quants_agree_across_variants_and_with_emulation() {
        let mut r = Rng::new(300);
        let ks = neon_kernels();
        let types = [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::IQ4_XS,
        ];
        for ty in types {
            for nb in [1usize, 2, 3, 7, 9, 16] {
                for extreme in [false, true] {
                    let (w, x) = (
                        weights(&mut r, ty, nb, extreme),
                        activations(&mut r, GgmlType::Q8_K, nb, extreme),
                    );
                    let n = nb * QK_K;
                    let scalar = Kernels::scalar().vec_dot(ty, n, &w, &x);
                    let arm = match ty {
                        GgmlType::Q4_K => Some(arm_q4_k(blocks(&w), blocks(&x))),
                        GgmlType::Q2_K => Some(arm_q2_k(blocks(&w), blocks(&x))),
                        _ => None,
                    };
                    // The NEON results are ggml's order with GCC's contractions (checked
                    // against ggml itself in `both_variants_equal_ggml_arm_build`): for Q4_K
                    // and Q2_K a scalar emulation must hold bit for bit; every variant must
                    // give the same bits; all are close to the scalar reference.
                    let first = ks[0].vec_dot(ty, n, &w, &x);
                    let (want, mag) = arm.unwrap_or((first, magnitude(ty, &w, &x)));
                    let tol = 1e-5 * mag + 1e-5;
                    assert!(
                        (want - scalar).abs() <= tol,
                        "{ty} nb={nb} extreme={extreme}: {want} vs scalar {scalar}"
                    );
                    for k in &ks {
                        let got = k.vec_dot(ty, n, &w, &x);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {ty} nb={nb} extreme={extreme}: {got} vs {want}",
                            k.isa_name()
                        );
                        // And through matvec (2 rows).
                        let w2 = [w.clone(), w.clone()].concat();
                        let mut y = [0.0f32; 2];
                        k.matvec(ty, n, &w2, &x, 0..2, &mut y);
                        assert_eq!(y.map(f32::to_bits), [got.to_bits(); 2]);
                    }
                    // The reference itself is the dequantized dot, up to rounding.
                    let mag = magnitude(ty, &w, &x);
                    let exact: f64 = {
                        let mut wd = vec![0.0; n];
                        let mut xd = vec![0.0; n];
                        dequantize_row(ty, &w, &mut wd).unwrap();
                        dequantize_row(GgmlType::Q8_K, &x, &mut xd).unwrap();
                        wd.iter()
                            .zip(&xd)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum()
                    };
                    if !extreme {
                        assert!(
                            (f64::from(want) - exact).abs() <= 1e-4 * f64::from(mag) + 1e-5,
                            "{ty} nb={nb}: {want} vs dequantized {exact}"
                        );
                    }
                }
            }
        }
    }
}
