//! x86_64 AVX2 + FMA + F16C kernels.
//!
//! Every kernel here is an `unsafe fn` with `#[target_feature]`; the safe wrappers at the bottom
//! take a [`Token`] (from `x86.rs`, with the small helpers shared with the other x86 files),
//! which exists only once the CPU features were detected. Where the token allows it, the
//! wrappers dispatch to the AVX-512 kernels of `avx512.rs` (this file depends on that one, never
//! the reverse).
//!
//! The dots are the scalar references regrouped: each block's integer products are exact, but are
//! summed as 8 f32 lanes (scaled by `d_w * d_x`) instead of one f32, so results may differ from the
//! scalar reference in the last bits. The quantizers are bit-identical to the scalar references.

use std::arch::x86_64::*;

use super::block::{f16_le_bytes, QK};
use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8_K;
use super::rounding::Q8Rounding;
use super::x86::{hsum, load_q8, nibbles, prefetch_stream, Token};

/// Converts the two f16 pairs `(a0, a1)` and `(b0, b1)` (each as 4 little-endian bytes) to
/// `[a0, a1, b0, b1]` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x4(a: [u8; 4], b: [u8; 4]) -> __m128 {
    let v = _mm_set_epi32(0, 0, i32::from_le_bytes(b), i32::from_le_bytes(a));
    _mm_cvtph_ps(v)
}

/// Q4_1 . Q8_1. Per block: `maddubs` (u8 nibble x i8 quant, pair sums <= 2*15*128, no i16
/// saturation) then `madd` with ones -> 8 exact i32 partial sums, scaled by `d_w*d_x` into f32
/// lanes; `m_w * s_x` is accumulated separately.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_impl(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    // One accumulator, lanes = elements 4k..4k+3, `m*s` summed apart and added last: ggml's
    // order, so results match llama.cpp's bit for bit (see ggml_order).
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let h = f16x4(
            [bw.d[0], bw.d[1], bw.m[0], bw.m[1]],
            [bx.d[0], bx.d[1], bx.s[0], bx.s[1]],
        );
        // [d_w*d_x, m_w*s_x, ..]
        let p = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        acc_m = _mm_add_ps(acc_m, p);
        let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles(&bw.qs), load_q8(&bx.qs)), ones);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(prod), acc);
    }
    let m = _mm_cvtss_f32(_mm_shuffle_ps(acc_m, acc_m, 1));
    hsum(acc) + m
}

/// Q4_0 . Q8_0: `sum (q - 8) * x = sum q*x - 8 * sum x`, both with `maddubs` on unsigned left
/// operands (exact for every i8 activation, including -128).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_q8_0_impl(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let eights = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let h = f16x4([bw.d[0], bw.d[1], 0, 0], [bx.d[0], bx.d[1], 0, 0]);
        let d = _mm_mul_ss(h, _mm_movehl_ps(h, h));
        let y = load_q8(&bx.qs);
        // Pair sums: |q*x| pairs <= 2*15*128 and 2*8*128; their difference fits i16.
        let qx = _mm256_maddubs_epi16(nibbles(&bw.qs), y);
        let ex = _mm256_maddubs_epi16(eights, y);
        let prod = _mm256_madd_epi16(_mm256_sub_epi16(qx, ex), ones);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc);
    }
    hsum(acc)
}

/// Q8_0 . Q8_0: both sides sign-extended to i16 and multiplied with `madd` (exact for all i8
/// values, unlike the `sign`/`maddubs` trick of [`dot_q8_0_q8_0_sign_impl`], which breaks on an
/// activation quant of -128).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_impl(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // ggml's lanes hold elements 4k..4k+3; `hadd` of the pair sums then a lane permute gives
    // exactly those groups.
    let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let h = f16x4([bw.d[0], bw.d[1], 0, 0], [bx.d[0], bx.d[1], 0, 0]);
        let d = _mm_mul_ss(h, _mm_movehl_ps(h, h));
        let a8 = load_q8(&bw.qs);
        let b8 = load_q8(&bx.qs);
        let lo = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a8)),
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(b8)),
        );
        let hi = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a8, 1)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(b8, 1)),
        );
        let prod = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo, hi), order);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc);
    }
    hsum(acc)
}

/// The products of one Q8_0 block pair as ggml's 8 lanes (lane k = elements 4k..4k+3), with
/// ggml's own trick: `maddubs(|w|, sign(x, w))`. `|w|` is read unsigned, so a weight of -128
/// is 128 and exact; the signed side `x * sign(w)` is exact unless `x` is -128, and a pair sum
/// is at most 2 * 128 * 127, within i16. So the lanes equal the exact ones whenever no
/// activation quant is -128, which [`sign_trick_exact`] checks once per activation row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_lanes_signed(w_abs: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), ones)
}

/// [`dot_q8_0_q8_0_impl`] with the `sign`/`maddubs` products of [`q8_0_lanes_signed`]: the
/// same integers in the same lanes (so the same bits) where no activation quant is -128, in
/// half the instructions; an output head of 49,152 x 576 Q8_0 weights is most of a decode
/// step's arithmetic on CPUs whose decode is compute-bound.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_sign_impl(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let h = f16x4([bw.d[0], bw.d[1], 0, 0], [bx.d[0], bx.d[1], 0, 0]);
        let d = _mm_mul_ss(h, _mm_movehl_ps(h, h));
        let a8 = load_q8(&bw.qs);
        let prod = q8_0_lanes_signed(_mm256_abs_epi8(a8), a8, load_q8(&bx.qs));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc);
    }
    hsum(acc)
}

/// How far ahead of a four-row group's current block [`dot_q8_0_q8_0_sign_rows4_impl`]
/// prefetches (as `legacy_rows`' four-row kernels).
const ROWS4_PREFETCH_AHEAD: usize = 4096;

/// [`dot_q8_0_q8_0`] (sign trick) of four weight rows (adjacent in the matrix): per block
/// the four rows' `d_w * d_x` in one 128-bit multiply, broadcast by in-lane shuffles, and the
/// group's lines prefetched as one stream 4 KiB ahead. The same bits as four one-row calls.
///
/// # Safety
/// AVX2, FMA and F16C are present; every row has `n` blocks and `x` at least `n`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_sign_rows4_impl(
    w: [&[BlockQ8_0]; 4],
    x: &[BlockQ8_0],
    n: usize,
) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in 0..n {
        // SAFETY: i < n <= every row's length and x's (caller).
        let (b, bx) = unsafe {
            (
                [
                    w[0].get_unchecked(i),
                    w[1].get_unchecked(i),
                    w[2].get_unchecked(i),
                    w[3].get_unchecked(i),
                ],
                x.get_unchecked(i),
            )
        };
        let ahead = w[0]
            .as_ptr()
            .cast::<i8>()
            .wrapping_add(ROWS4_PREFETCH_AHEAD + 4 * std::mem::size_of::<BlockQ8_0>() * i);
        // (A prefetch reads nothing architecturally and never faults, whatever the address.)
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128));
        let mut bits = 0u64;
        for (r, row) in b.iter().enumerate() {
            bits |= u64::from(u16::from_le_bytes(row.d)) << (16 * r);
        }
        let dx = _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bx.d)));
        // [d_w r * d_x]: each the one-row kernel's f32 product.
        let d = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)), dx);
        let ds = super::x86::broadcast_each(d);
        let xq = load_q8(&bx.qs);
        for r in 0..4 {
            let a = load_q8(&b[r].qs);
            let p = q8_0_lanes_signed(_mm256_abs_epi8(a), a, xq);
            acc[r] = _mm256_fmadd_ps(ds[r], _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

/// [`dot_q8_0_q8_0`] of four weight rows where no activation quant is -128 (`sign_ok` from
/// [`sign_trick_exact`]), AVX2 alone: the same bits as four calls.
///
/// # Panics
/// If the rows differ in length or the activation is shorter.
pub(super) fn dot_q8_0_q8_0_sign_rows4(
    _: Token,
    w: [&[BlockQ8_0]; 4],
    x: &[BlockQ8_0],
) -> [f32; 4] {
    let n = w[0].len();
    assert!(
        w.iter().all(|r| r.len() == n) && x.len() >= n,
        "row lengths differ"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q8_0_q8_0_sign_rows4_impl(w, x, n) }
}

/// Whether the `sign`/`maddubs` kernels are exact for this activation row (Q8_0, or Q8_K for
/// the IQ4_XS panels): none of its quants is -128. Quantizing activations never makes -128
/// (`|x| <= amax`, so `|x| * 127 / amax <= 127`); only hand-made rows hold it.
pub(super) fn sign_trick_exact<B: Quants32>(_: Token, x: &[B]) -> bool {
    // SAFETY: a `Token` exists only once AVX2 was detected.
    unsafe { no_min_quant_impl(x) }
}

/// Activation blocks whose quants are whole runs of 32 (what [`sign_trick_exact`] scans).
pub(super) trait Quants32 {
    /// The block's quants, 32 at a time.
    fn quants32(&self) -> &[[i8; 32]];
}

impl Quants32 for BlockQ8_0 {
    #[inline(always)]
    fn quants32(&self) -> &[[i8; 32]] {
        std::slice::from_ref(&self.qs)
    }
}

impl Quants32 for BlockQ8_K {
    #[inline(always)]
    fn quants32(&self) -> &[[i8; 32]] {
        bytemuck::cast_slice(&self.qs)
    }
}

/// See [`sign_trick_exact`]: one compare per 32 quants (a scalar scan cost 5% of a 4-token
/// kernel).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn no_min_quant_impl<B: Quants32>(x: &[B]) -> bool {
    let min = _mm256_set1_epi8(i8::MIN);
    let mut any = _mm256_setzero_si256();
    for b in x {
        for q in b.quants32() {
            any = _mm256_or_si256(any, _mm256_cmpeq_epi8(load_q8(q), min));
        }
    }
    _mm256_testz_si256(any, any) == 1
}

// ---- one weight row against several activation rows (prefill) ----
//
// Each token's accumulators see exactly the operations, in the order, of the one-row kernels
// above, so the results are bit-identical to them; what is shared is the weight block's loading
// and unpacking, and the independent accumulators keep the FMA units busy instead of waiting
// on one dependency chain.

/// [`dot_q4_1_q8_1_impl`] of one weight row with `N` (at most 4) activation rows. The tokens'
/// scale products are formed in one register, `[d_w*d_x0, m_w*s_x0, d_w*d_x1, m_w*s_x1, ..]`,
/// each lane the same single f32 product the one-row kernel forms, and the `m*s` lanes are
/// summed in one register, each lane with the one-row kernel's sequence of additions.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks; `N <= 4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_xn_impl<const N: usize>(w: &[BlockQ4_1], x: [&[BlockQ8_1]; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = _mm256_setzero_ps();
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(2 * t as i32));
    let ds = |a: [u8; 2], b: [u8; 2]| i32::from_le_bytes([a[0], a[1], b[0], b[1]]);
    for (i, bw) in w.iter().enumerate() {
        let q = nibbles(&bw.qs);
        let wdm = _mm256_cvtph_ps(_mm_set1_epi32(ds(bw.d, bw.m)));
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let dsx: [i32; 4] = std::array::from_fn(|t| if t < N { ds(bx[t].d, bx[t].s) } else { 0 });
        let xds = _mm256_cvtph_ps(_mm_setr_epi32(dsx[0], dsx[1], dsx[2], dsx[3]));
        let p = _mm256_mul_ps(wdm, xds);
        acc_m = _mm256_add_ps(acc_m, p);
        for t in 0..N {
            let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load_q8(&bx[t].qs)), ones);
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut m = [0.0f32; 8];
    // SAFETY: `m` has 8 f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(m.as_mut_ptr(), acc_m) };
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]) + m[2 * t + 1];
    }
    out
}

/// [`dot_q4_0_q8_0_impl`] of one weight row with `N` activation rows.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_q8_0_xn_impl<const N: usize>(w: &[BlockQ4_0], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let eights = _mm256_set1_epi8(8);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        let q = nibbles(&bw.qs);
        let dw = f16x4([bw.d[0], bw.d[1], 0, 0], [0; 4]);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let d = _mm_mul_ss(dw, f16x4([bx.d[0], bx.d[1], 0, 0], [0; 4]));
            let y = load_q8(&bx.qs);
            let qx = _mm256_maddubs_epi16(q, y);
            let ex = _mm256_maddubs_epi16(eights, y);
            let prod = _mm256_madd_epi16(_mm256_sub_epi16(qx, ex), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
    out
}

/// [`dot_q8_0_q8_0_impl`] of one weight row with `N` activation rows.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_xn_impl<const N: usize>(w: &[BlockQ8_0], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        let a8 = load_q8(&bw.qs);
        let a_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a8));
        let a_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a8, 1));
        let dw = f16x4([bw.d[0], bw.d[1], 0, 0], [0; 4]);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let d = _mm_mul_ss(dw, f16x4([bx.d[0], bx.d[1], 0, 0], [0; 4]));
            let b8 = load_q8(&bx.qs);
            let lo = _mm256_madd_epi16(a_lo, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(b8)));
            let hi = _mm256_madd_epi16(a_hi, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(b8, 1)));
            let prod = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo, hi), order);
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
    out
}

/// [`dot_q8_0_q8_0_xn_impl`] with the products of [`q8_0_lanes_signed`] (same bits where no
/// activation quant is -128). The `N` tokens' scale products `d_w * d_x` are formed in one
/// register, each lane the same single f32 product the one-row kernel forms.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks; `N <= 8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_xn_sign_impl<const N: usize>(
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; N],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    let mut xd = [0u16; 8];
    for (i, bw) in w.iter().enumerate() {
        let a8 = load_q8(&bw.qs);
        let a_abs = _mm256_abs_epi8(a8);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            xd[t] = u16::from_le_bytes(unsafe { x[t].get_unchecked(i) }.d);
        }
        // SAFETY: `xd` is 8 u16 = 16 readable bytes; loadu has no alignment requirement.
        let xd8 = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(xd.as_ptr().cast()) });
        let dw = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        let p = _mm256_mul_ps(dw, xd8);
        for t in 0..N {
            // SAFETY: as above.
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = q8_0_lanes_signed(a_abs, a8, load_q8(&bx.qs));
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
    out
}

/// [`dot_q8_0_q8_0_xn_sign_impl`] with the tokens' activation scales already converted, block
/// by block (`dx[i][t]`, from [`q8_0_token_scales`]): a matrix call forms them once for all its
/// rows instead of gathering and converting them per row and block. Same f32 products
/// `d_w * d_x` (an f16 to f32 conversion is exact either way), same bits.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `dx` have at least `w.len()` blocks;
/// `N <= 4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_xn_scaled_impl<const N: usize>(
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; N],
    dx: &[[f32; 4]],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    for (i, bw) in w.iter().enumerate() {
        let a8 = load_q8(&bw.qs);
        let a_abs = _mm256_abs_epi8(a8);
        // SAFETY: i < w.len() <= dx.len() (caller); 4 readable f32; loadu needs no alignment.
        let xd4 = unsafe { _mm_loadu_ps(dx.get_unchecked(i).as_ptr()) };
        let dw = _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        // Lanes 0..4 hold the products; the permute below reads only lanes t < N <= 4.
        let p = _mm256_castps128_ps256(_mm_mul_ps(dw, xd4));
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = q8_0_lanes_signed(a_abs, a8, load_q8(&bx.qs));
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
    out
}

/// The `N` (at most `W`) activation rows' block scales as f32, `out[i][t]` = scale of block `i`
/// of row `t` (lanes `N..W` zero), for [`dot_q8_0_q8_0_xn_scaled`] (`W` = 4) and
/// [`dot_q8_0_q8_0_x8_scaled`] (`W` = 8).
///
/// # Panics
/// If a row has fewer than `out.len()` blocks, or `N > W`.
pub(super) fn q8_0_token_scales<const N: usize, const W: usize>(
    _: Token,
    x: [&[BlockQ8_0]; N],
    out: &mut [[f32; W]],
) {
    const { assert!(N <= W && (W == 4 || W == 8)) };
    assert!(
        x.iter().all(|r| r.len() >= out.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { q8_0_token_scales_impl(x, out) }
}

/// Up to 512 blocks' worth of per-block token scales on the stack, sized to the row (32, 128
/// or 512 entries: zeroing a large buffer per call would cost more than it saves on narrow
/// matrices), given to `f`; `None` for longer rows.
pub(super) fn with_block_scales<S: Copy + Default, R>(
    nb: usize,
    f: impl FnOnce(&mut [S]) -> R,
) -> Option<R> {
    match nb {
        0..=32 => Some(f(&mut [S::default(); 32][..nb])),
        33..=128 => Some(f(&mut [S::default(); 128][..nb])),
        129..=512 => Some(f(&mut [S::default(); 512][..nb])),
        _ => None,
    }
}

/// [`q8_0_token_scales`]: the f16 scales gathered per block and widened by one F16C
/// conversion (exact, as the scalar one).
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `out.len()` blocks; `W` is 4 or 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_token_scales_impl<const N: usize, const W: usize>(
    x: [&[BlockQ8_0]; N],
    out: &mut [[f32; W]],
) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut h = [0u16; 8];
        for t in 0..N {
            // SAFETY: i < out.len() <= x[t].len() (caller).
            h[t] = u16::from_le_bytes(unsafe { x[t].get_unchecked(i) }.d);
        }
        // SAFETY: `h` is 16 readable bytes and `o` W writable f32 (4 or 8: the caller);
        // unaligned loads and stores have no alignment requirement.
        unsafe {
            let v = _mm_loadu_si128(h.as_ptr().cast());
            if W == 8 {
                _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(v));
            } else {
                _mm_storeu_ps(o.as_mut_ptr(), _mm_cvtph_ps(v));
            }
        }
    }
}

/// [`dot_q8_0_q8_0_xn`] where no activation quant is -128 ([`sign_trick_exact`] of every
/// row), with the rows' scales from [`q8_0_token_scales`]. Bit-identical to it.
///
/// # Panics
/// If an activation row or `dx` is shorter than `w`.
pub(super) fn dot_q8_0_q8_0_xn_scaled<const N: usize>(
    _: Token,
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; N],
    dx: &[[f32; 4]],
) -> [f32; N] {
    const { assert!(N <= 4) };
    assert!(
        dx.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q8_0_q8_0_xn_scaled_impl(w, x, dx) }
}

/// [`dot_q8_0_q8_0_xn_scaled`] for 8 activation rows: each weight block's load, `abs` and
/// scale conversion shared by twice the tokens of the 4-token kernel (AVX2 has the registers:
/// 8 accumulators). `dx[i][t]` from [`q8_0_token_scales`]; no activation quant is -128
/// ([`sign_trick_exact`] of every row). Bit-identical to one [`dot_q8_0_q8_0_xn_scaled`] per
/// token: the same `d_w * d_x` products, `fma`s and lanes.
///
/// # Panics
/// If an activation row or `dx` is shorter than `w`.
pub(super) fn dot_q8_0_q8_0_x8_scaled(
    _: Token,
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; 8],
    dx: &[[f32; 8]],
) -> [f32; 8] {
    assert!(
        dx.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q8_0_q8_0_x8_scaled_impl(w, x, dx) }
}

/// See [`dot_q8_0_q8_0_x8_scaled`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `dx` have at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0_x8_scaled_impl(
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; 8],
    dx: &[[f32; 8]],
) -> [f32; 8] {
    let mut acc = [_mm256_setzero_ps(); 8];
    for (i, bw) in w.iter().enumerate() {
        let a8 = load_q8(&bw.qs);
        let a_abs = _mm256_abs_epi8(a8);
        let dw = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        // SAFETY: i < w.len() <= dx.len() (caller).
        let dxi = unsafe { dx.get_unchecked(i) };
        for t in 0..8 {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = q8_0_lanes_signed(a_abs, a8, load_q8(&bx.qs));
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(dxi[t]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut out = [0.0f32; 8];
    for t in 0..8 {
        out[t] = hsum(acc[t]);
    }
    out
}

/// Quantizes one block of 32 floats exactly as the scalar `quantize_row_with` does for the same
/// flavour: returns the f32 `d` and the quants as i32 in 4 vectors of 8 (element order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block(x: &[f32], r: Q8Rounding) -> (f32, [__m256i; 4]) {
    debug_assert_eq!(x.len(), QK);
    // SAFETY: `x` has 32 floats (callers pass `chunks_exact(32)`); loadu needs no alignment.
    let v = [
        _mm256_loadu_ps(x.as_ptr()),
        _mm256_loadu_ps(x.as_ptr().add(8)),
        _mm256_loadu_ps(x.as_ptr().add(16)),
        _mm256_loadu_ps(x.as_ptr().add(24)),
    ];
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
    }
    let amax = hmax(m);
    // The same f32 operations as the scalar code, so the same d and id.
    let (d, id) = super::q8_0::scale(amax, r);
    let idv = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let mut q = [_mm256_setzero_si256(); 4];
    for (qi, vi) in q.iter_mut().zip(v) {
        let s = _mm256_mul_ps(vi, idv);
        let rounded = if r == Q8Rounding::GgmlRef {
            // roundf: truncate, then step away from zero when the dropped fraction is >= 0.5.
            // The fraction `s - trunc(s)` is exact for |s| < 2^23.
            let t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(s, t));
            let up = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
            let step = _mm256_or_ps(_mm256_and_ps(s, sign), one); // +-1 with the sign of s
            _mm256_add_ps(t, _mm256_and_ps(up, step))
        } else {
            _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
        };
        *qi = _mm256_cvtps_epi32(rounded);
    }
    (d, q)
}

/// Horizontal max of 8 non-negative, non-NaN f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Packs 32 i32 quants (4 vectors, element order, each in [-127, 127]) into 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_store(q: [__m256i; 4], out: &mut [i8; 32]) {
    // packs work per 128-bit lane: after both steps the 4-byte groups are in the order
    // 0 2 4 6 1 3 5 7; the permute restores element order.
    let a = _mm256_packs_epi32(q[0], q[1]);
    let b = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(a, b);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
    _mm256_storeu_si256(out.as_mut_ptr().cast(), p);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_q8_0_impl(src: &[f32], dst: &mut [BlockQ8_0], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (d, q) = quantize_block(x, r);
        y.d = f16_le_bytes(d);
        pack_store(q, &mut y.qs);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_q8_1_impl(src: &[f32], dst: &mut [BlockQ8_1], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        let (d, q) = quantize_block(x, r);
        y.d = f16_le_bytes(d);
        let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        let sum = _mm_cvtsi128_si32(s);
        y.s = f16_le_bytes(sum as f32 * d);
        pack_store(q, &mut y.qs);
    }
}

// Safe wrappers. SAFETY (all of them): a `Token` exists only after `Token::detect` confirmed AVX2,
// FMA and F16C on this CPU, so the target features the kernels are compiled for are present.

pub(super) fn dot_q4_1_q8_1(t: Token, w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    assert!(x.len() >= w.len(), "activation row too short");
    if t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        return unsafe { super::avx512::dot_q4_1_q8_1(w, x) };
    }
    // SAFETY: see above.
    unsafe { dot_q4_1_q8_1_impl(w, x) }
}

pub(super) fn dot_q4_0_q8_0(_: Token, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q4_0_q8_0_impl(w, x) }
}

pub(super) fn dot_q8_0_q8_0(t: Token, w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    dot_q8_0_q8_0_with(t, w, x, sign_trick_exact(t, &x[..w.len().min(x.len())]))
}

/// [`dot_q8_0_q8_0`] where the caller has checked the activation row once for many weight rows:
/// `sign_ok` is [`sign_trick_exact`] of `x` (with `false` the exact, slower products run).
pub(super) fn dot_q8_0_q8_0_with(t: Token, w: &[BlockQ8_0], x: &[BlockQ8_0], sign_ok: bool) -> f32 {
    assert!(x.len() >= w.len(), "activation row too short");
    if t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        return unsafe { super::avx512::dot_q8_0_q8_0(w, x) };
    }
    if sign_ok {
        // SAFETY: see above.
        return unsafe { dot_q8_0_q8_0_sign_impl(w, x) };
    }
    // SAFETY: see above.
    unsafe { dot_q8_0_q8_0_impl(w, x) }
}

/// [`dot_q4_1_q8_1`] of a weight row with 8 activation rows (bit-identical to 8 calls), with
/// the AVX-512 VNNI kernel.
///
/// # Panics
/// If `t` is not an AVX-512 token or an activation row is shorter than the weight row.
pub(super) fn dot_q4_1_q8_1_x8(t: Token, w: &[BlockQ4_1], x: [&[BlockQ8_1]; 8]) -> [f32; 8] {
    assert!(t.avx512(), "the 8-token kernel needs an AVX-512 token");
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
    unsafe { super::avx512::dot_q4_1_q8_1_x8(w, x) }
}

/// [`dot_q8_0_q8_0`] of `R` weight rows with 8 activation rows at once, with the AVX-512 VNNI
/// kernel (bit-identical to `8 * R` calls of it).
///
/// # Panics
/// If `t` is not an AVX-512 token, the rows differ in length or an activation row is shorter.
pub(super) fn dot_q8_0_q8_0_x8<const R: usize>(
    t: Token,
    w: [&[BlockQ8_0]; R],
    x: [&[BlockQ8_0]; 8],
) -> [[f32; 8]; R] {
    check_rows_x8(t, &w, &x);
    // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
    unsafe { super::avx512::dot_q8_0_q8_0_x8(w, x) }
}

/// The preconditions of the `R`-row, 8-token AVX-512 kernels (`dot_*_x8::<R>`): an AVX-512
/// token, weight rows of one length, activation rows at least that long.
///
/// # Panics
/// If one does not hold.
pub(super) fn check_rows_x8<W, X, const R: usize>(t: Token, w: &[&[W]; R], x: &[&[X]; 8]) {
    assert!(t.avx512(), "the 8-token kernel needs an AVX-512 token");
    let n = w.first().map_or(0, |r| r.len());
    assert!(w.iter().all(|r| r.len() == n), "row lengths differ");
    assert!(x.iter().all(|r| r.len() >= n), "activation row too short");
}

/// [`dot_q4_1_q8_1`] of two weight rows (bit-identical to two calls), with the AVX-512 VNNI
/// kernel.
///
/// # Panics
/// If `t` is not an AVX-512 token, the rows differ in length or the activation is shorter.
pub(super) fn dot_q4_1_q8_1_rows2(t: Token, w: [&[BlockQ4_1]; 2], x: &[BlockQ8_1]) -> [f32; 2] {
    assert!(t.avx512(), "the two-row kernel needs an AVX-512 token");
    assert!(
        w[0].len() == w[1].len() && x.len() >= w[0].len(),
        "row lengths differ"
    );
    // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
    unsafe { super::avx512::dot_q4_1_q8_1_rows2(w, x) }
}

/// [`dot_q8_0_q8_0`] of two weight rows: see [`dot_q4_1_q8_1_rows2`].
///
/// # Panics
/// If `t` is not an AVX-512 token, the rows differ in length or the activation is shorter.
pub(super) fn dot_q8_0_q8_0_rows2(t: Token, w: [&[BlockQ8_0]; 2], x: &[BlockQ8_0]) -> [f32; 2] {
    assert!(t.avx512(), "the two-row kernel needs an AVX-512 token");
    assert!(
        w[0].len() == w[1].len() && x.len() >= w[0].len(),
        "row lengths differ"
    );
    // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
    unsafe { super::avx512::dot_q8_0_q8_0_rows2(w, x) }
}

/// The one-row dots of a weight row with `N` (2 to 4) activation rows at once (bit-identical
/// to `N` calls of the one-row kernel). Panics if an activation row is shorter than the weight
/// row.
pub(super) fn dot_q4_1_q8_1_xn<const N: usize>(
    t: Token,
    w: &[BlockQ4_1],
    x: [&[BlockQ8_1]; N],
) -> [f32; N] {
    const { assert!(N <= 4) };
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    if N == 4 && t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        let r = unsafe { super::avx512::dot_q4_1_q8_1_x4(w, std::array::from_fn(|k| x[k])) };
        return std::array::from_fn(|k| r[k]);
    }
    // SAFETY: see above; lengths checked, N <= 4.
    unsafe { dot_q4_1_q8_1_xn_impl(w, x) }
}

/// The `N` (at most 4) activation rows' block scales as f32 for [`dot_q4_1_q8_1_xn_scaled`]:
/// `out[i]` = `[d_0, s_0, d_1, s_1, ..]` of block `i` (lanes past `2N` zero), the values
/// [`dot_q4_1_q8_1_xn`] converts per row, converted once for all rows.
///
/// # Panics
/// If a row has fewer than `out.len()` blocks.
pub(super) fn q8_1_token_scales<const N: usize>(
    _: Token,
    x: [&[BlockQ8_1]; N],
    out: &mut [[f32; 8]],
) {
    const { assert!(N <= 4) };
    assert!(
        x.iter().all(|r| r.len() >= out.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { q8_1_token_scales_impl(x, out) }
}

/// See [`q8_1_token_scales`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `out.len()` blocks; `N <= 4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_token_scales_impl<const N: usize>(x: [&[BlockQ8_1]; N], out: &mut [[f32; 8]]) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut h = [0u16; 8];
        for t in 0..N {
            // SAFETY: i < out.len() <= x[t].len() (caller).
            let b = unsafe { x[t].get_unchecked(i) };
            h[2 * t] = u16::from_le_bytes(b.d);
            h[2 * t + 1] = u16::from_le_bytes(b.s);
        }
        // SAFETY: `h` is 16 readable bytes and `o` 8 writable f32; unaligned loads and stores
        // have no alignment requirement.
        unsafe {
            _mm256_storeu_ps(
                o.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())),
            )
        };
    }
}

/// [`dot_q4_1_q8_1_xn`] with the activation rows' scales from [`q8_1_token_scales`] (on AVX2
/// without AVX-512): bit-identical to it, the same products, `fma`s, lanes and sums, with the
/// tokens' f16 conversions done once per block for all rows instead of once per row. Zen 3,
/// 4 tokens, 256 rows of SmolLM2's `ffn_up` in cache (best of 7): 1.23 -> 1.11 ns per row,
/// block and token; two rows interleaved ([`dot_q4_1_q8_1_xn_scaled_rows2`]) 1.05.
///
/// # Panics
/// If an activation row or `xds` is shorter than `w`.
pub(super) fn dot_q4_1_q8_1_xn_scaled<const N: usize>(
    _: Token,
    w: &[BlockQ4_1],
    x: [&[BlockQ8_1]; N],
    xds: &[[f32; 8]],
) -> [f32; N] {
    const { assert!(N <= 4) };
    assert!(
        xds.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q4_1_q8_1_xn_scaled_impl(w, x, xds) }
}

/// See [`dot_q4_1_q8_1_xn_scaled`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `xds` have at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_xn_scaled_impl<const N: usize>(
    w: &[BlockQ4_1],
    x: [&[BlockQ8_1]; N],
    xds: &[[f32; 8]],
) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = _mm256_setzero_ps();
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(2 * t as i32));
    let ds = |a: [u8; 2], b: [u8; 2]| i32::from_le_bytes([a[0], a[1], b[0], b[1]]);
    for (i, bw) in w.iter().enumerate() {
        let q = nibbles(&bw.qs);
        let wdm = _mm256_cvtph_ps(_mm_set1_epi32(ds(bw.d, bw.m)));
        // SAFETY: i < w.len() <= xds.len() (caller); 8 readable f32; loadu needs no alignment.
        let xds = unsafe { _mm256_loadu_ps(xds.get_unchecked(i).as_ptr()) };
        // Lanes 2t, 2t + 1: d_w * d_x(t), m_w * s(t) (the lanes past 2N are zero products).
        let p = _mm256_mul_ps(wdm, xds);
        acc_m = _mm256_add_ps(acc_m, p);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load_q8(&bx.qs)), ones);
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut m = [0.0f32; 8];
    // SAFETY: `m` has 8 f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(m.as_mut_ptr(), acc_m) };
    let mut out = [0.0f32; N];
    for t in 0..N {
        out[t] = hsum(acc[t]) + m[2 * t + 1];
    }
    out
}

/// The 8 activation rows' block scales as f32 for [`dot_q4_1_q8_1_x8_scaled`]: `out[i]` =
/// `[d_0, s_0, d_1, s_1, .., d_7, s_7]` of block `i`.
///
/// # Panics
/// If a row has fewer than `out.len()` blocks.
pub(super) fn q8_1_token_scales8(_: Token, x: [&[BlockQ8_1]; 8], out: &mut [[f32; 16]]) {
    assert!(
        x.iter().all(|r| r.len() >= out.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { q8_1_token_scales8_impl(x, out) }
}

/// See [`q8_1_token_scales8`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `out.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_token_scales8_impl(x: [&[BlockQ8_1]; 8], out: &mut [[f32; 16]]) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut h = [0u16; 16];
        for t in 0..8 {
            // SAFETY: i < out.len() <= x[t].len() (caller).
            let b = unsafe { x[t].get_unchecked(i) };
            h[2 * t] = u16::from_le_bytes(b.d);
            h[2 * t + 1] = u16::from_le_bytes(b.s);
        }
        // SAFETY: `h` is 32 readable bytes and `o` 16 writable f32; unaligned loads and stores
        // have no alignment requirement.
        unsafe {
            let p = o.as_mut_ptr();
            _mm256_storeu_ps(p, _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())));
            _mm256_storeu_ps(
                p.add(8),
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(8).cast())),
            );
        }
    }
}

/// [`dot_q4_1_q8_1_xn_scaled`] for 8 activation rows (prefill's 8-token groups): each weight
/// block's nibbles and scales shared by twice the tokens. Bit-identical to one token at a
/// time: the same products, `fma`s, lanes and sums per token.
///
/// # Panics
/// If an activation row or `xds` is shorter than `w`.
pub(super) fn dot_q4_1_q8_1_x8_scaled(
    _: Token,
    w: &[BlockQ4_1],
    x: [&[BlockQ8_1]; 8],
    xds: &[[f32; 16]],
) -> [f32; 8] {
    assert!(
        xds.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q4_1_q8_1_x8_scaled_impl(w, x, xds) }
}

/// See [`dot_q4_1_q8_1_x8_scaled`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `xds` have at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_x8_scaled_impl(
    w: &[BlockQ4_1],
    x: [&[BlockQ8_1]; 8],
    xds: &[[f32; 16]],
) -> [f32; 8] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut acc_m = [_mm256_setzero_ps(); 2];
    let ds = |a: [u8; 2], b: [u8; 2]| i32::from_le_bytes([a[0], a[1], b[0], b[1]]);
    for (i, bw) in w.iter().enumerate() {
        let q = nibbles(&bw.qs);
        let wdm = _mm256_cvtph_ps(_mm_set1_epi32(ds(bw.d, bw.m)));
        // SAFETY: i < w.len() <= xds.len() (caller).
        let xs = unsafe { xds.get_unchecked(i) };
        // p[2t], p[2t + 1]: d_w * d_x(t), m_w * s(t), as the one-token kernel forms them.
        let mut p = [0f32; 16];
        for (h, am) in acc_m.iter_mut().enumerate() {
            // SAFETY: 8 readable f32 at 8h of `xs` and writable at 8h of `p`; unaligned
            // loads and stores need no alignment.
            unsafe {
                let ph = _mm256_mul_ps(wdm, _mm256_loadu_ps(xs.as_ptr().add(8 * h)));
                *am = _mm256_add_ps(*am, ph);
                _mm256_storeu_ps(p.as_mut_ptr().add(8 * h), ph);
            }
        }
        for t in 0..8 {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load_q8(&bx.qs)), ones);
            let d = _mm256_broadcast_ss(&p[2 * t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    let mut m = [0.0f32; 16];
    // SAFETY: `m` has 16 f32; storeu has no alignment requirement.
    unsafe {
        _mm256_storeu_ps(m.as_mut_ptr(), acc_m[0]);
        _mm256_storeu_ps(m.as_mut_ptr().add(8), acc_m[1]);
    }
    std::array::from_fn(|t| hsum(acc[t]) + m[2 * t + 1])
}

/// [`dot_q4_1_q8_1_xn_scaled`] of two weight rows at once (each row's bits unchanged: the two
/// rows' instructions interleaved give the CPU independent work while one row's products wait
/// on their multiplies).
///
/// # Panics
/// If the rows differ in length, or an activation row or `xds` is shorter than them.
pub(super) fn dot_q4_1_q8_1_xn_scaled_rows2<const N: usize>(
    _: Token,
    w: [&[BlockQ4_1]; 2],
    x: [&[BlockQ8_1]; N],
    xds: &[[f32; 8]],
) -> [[f32; N]; 2] {
    const { assert!(N <= 4) };
    assert!(
        w[0].len() == w[1].len()
            && xds.len() >= w[0].len()
            && x.iter().all(|r| r.len() >= w[0].len()),
        "row lengths differ"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q4_1_q8_1_xn_scaled_rows2_impl(w, x, xds) }
}

/// See [`dot_q4_1_q8_1_xn_scaled_rows2`].
///
/// # Safety
/// AVX2, FMA and F16C are present; both rows have the same length, and every `x[t]` and `xds`
/// at least as many blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_q8_1_xn_scaled_rows2_impl<const N: usize>(
    w: [&[BlockQ4_1]; 2],
    x: [&[BlockQ8_1]; N],
    xds: &[[f32; 8]],
) -> [[f32; N]; 2] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    let mut acc_m = [_mm256_setzero_ps(); 2];
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(2 * t as i32));
    let ds = |a: [u8; 2], b: [u8; 2]| i32::from_le_bytes([a[0], a[1], b[0], b[1]]);
    for i in 0..w[0].len() {
        // SAFETY: i < w[r].len() <= xds.len() (caller); 8 readable f32; loadu needs no
        // alignment.
        let (bw, xds) = unsafe {
            (
                [w[0].get_unchecked(i), w[1].get_unchecked(i)],
                _mm256_loadu_ps(xds.get_unchecked(i).as_ptr()),
            )
        };
        let q = bw.map(|b| nibbles(&b.qs));
        let p = bw.map(|b| _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi32(ds(b.d, b.m))), xds));
        for r in 0..2 {
            acc_m[r] = _mm256_add_ps(acc_m[r], p[r]);
        }
        for t in 0..N {
            // SAFETY: i < w[0].len() <= x[t].len() (caller).
            let y = load_q8(&unsafe { x[t].get_unchecked(i) }.qs);
            for r in 0..2 {
                let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), ones);
                let d = _mm256_permutevar8x32_ps(p[r], lanes[t]);
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[r][t]);
            }
        }
    }
    std::array::from_fn(|r| {
        let mut m = [0.0f32; 8];
        // SAFETY: `m` has 8 f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(m.as_mut_ptr(), acc_m[r]) };
        std::array::from_fn(|t| hsum(acc[r][t]) + m[2 * t + 1])
    })
}

/// See [`dot_q4_1_q8_1_xn`].
pub(super) fn dot_q4_0_q8_0_xn<const N: usize>(
    t: Token,
    w: &[BlockQ4_0],
    x: [&[BlockQ8_0]; N],
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    if t.avx512() && N == 4 {
        let x4: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| x[k]);
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        let r = unsafe { super::avx512::dot_q4_0_q8_0_x4(w, x4) };
        return std::array::from_fn(|k| r[k]);
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q4_0_q8_0_xn_impl(w, x) }
}

/// See [`dot_q4_1_q8_1_xn`]; `sign_ok` as in [`dot_q8_0_q8_0_with`], for every `x[t]`.
pub(super) fn dot_q8_0_q8_0_xn<const N: usize>(
    _: Token,
    w: &[BlockQ8_0],
    x: [&[BlockQ8_0]; N],
    sign_ok: bool,
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    const { assert!(N <= 8) };
    if sign_ok {
        // SAFETY: see above; lengths checked, N <= 8.
        return unsafe { dot_q8_0_q8_0_xn_sign_impl(w, x) };
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q8_0_q8_0_xn_impl(w, x) }
}

pub(super) fn quantize_row_q8_0(_: Token, src: &[f32], dst: &mut [BlockQ8_0], r: Q8Rounding) {
    // SAFETY: see above.
    unsafe { quantize_row_q8_0_impl(src, dst, r) }
}

pub(super) fn quantize_row_q8_1(_: Token, src: &[f32], dst: &mut [BlockQ8_1], r: Q8Rounding) {
    // SAFETY: see above.
    unsafe { quantize_row_q8_1_impl(src, dst, r) }
}
