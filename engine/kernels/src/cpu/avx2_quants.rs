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
//! IQ4_NL writes the integer parts as a plain loop (the compiler vectorizes it); Q5_0, Q5_1,
//! Q4_K, Q5_K and Q6_K, whose unpacking the compiler vectorized poorly, use ggml's intrinsics
//! (their plain-loop versions are the references in `avx2_quants/tests.rs`) and have `_xn`
//! variants that unpack each weight block once for several tokens (prefill); on AVX-512 VNNI
//! CPUs Q5_K and Q6_K run the kernels of `avx512.rs`. The integer lanes are exact whatever the
//! grouping; the float order is what matters and is explicit. The functions are compiled with
//! FMA, so `mul_add` is one fused instruction, as `_mm256_fmadd_ps` is.
//!
//! The unpacking helpers the AVX-512 kernels share with these (`q5_quants`, `k4_scales_mins_i16`,
//! `k4_min_sum`) live in `x86.rs`, so that `avx512.rs` does not import this file.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::block::{f16_le, QK};
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::q4_k::BlockQ4_K;
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5_K;
use super::q6_k::BlockQ6_K;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8_K;
use super::x86::{
    hsum, k4_min_sum, k4_scale, k4_scales_mins_i16, load_q8, min_pairs, q5_quants, Token,
};

/// ggml's `hsum_float_8`: `(lo + hi)`, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

// ---- Q5_0 and Q5_1 ----
//
// Lane `i` of a block: the exact sum of the products of elements `4i..4i + 4` (what ggml's
// `mul_sum_i8_pairs_float` / `mul_sum_us8_pairs_float` form). The quants are unpacked as
// unsigned bytes `q` (0..31): `maddubs` pairs `q * y` are at most 2 * 31 * 128 = 7936 and Q5_0's
// offset pairs `16 * y` at most 4096, so their i16 difference is exact for every i8 activation,
// -128 included (ggml's `sign` trick is not); `madd` with ones then sums the pairs into lanes.

/// Q5_0's 8 lanes of one block: `sum (q - 16) * y` per group of four, as `q * y - 16 * y`
/// pair sums (see above).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_lanes(q: __m256i, y: __m256i) -> __m256i {
    let qy = _mm256_maddubs_epi16(q, y);
    let oy = _mm256_maddubs_epi16(_mm256_set1_epi8(16), y);
    _mm256_madd_epi16(_mm256_sub_epi16(qy, oy), _mm256_set1_epi16(1))
}

/// Q5_0's 8 lanes of one block from the signed quants `s = q - 16` (-16..15) with ggml's
/// `sign` trick, `maddubs(|s|, sign(y, s))`: one `maddubs` instead of two. `sign(y, s)` is
/// `y * sign(s)` exactly unless `y` is -128 (its negation wraps), and a pair sum is at most
/// 2 * 16 * 128, within i16; so the lanes equal [`q5_0_lanes`]' whenever no activation quant is
/// -128, which `avx2::sign_trick_exact` checks once per activation row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_lanes_signed(s_abs: __m256i, s: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(
        _mm256_maddubs_epi16(s_abs, _mm256_sign_epi8(y, s)),
        _mm256_set1_epi16(1),
    )
}

/// Q5_1's 8 lanes of one block: `sum q * y` per group of four.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_lanes(q: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), _mm256_set1_epi16(1))
}

/// `[a0, a1, b0, b1]` as f32 from two f16 pairs (each as 4 little-endian bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair2(a: [u8; 4], b: [u8; 4]) -> __m128 {
    _mm_cvtph_ps(_mm_setr_epi32(
        i32::from_le_bytes(a),
        i32::from_le_bytes(b),
        0,
        0,
    ))
}

/// Q5_0 . Q8_0 as ggml's AVX2 `ggml_vec_dot_q5_0_q8_0`: per block `fma(d_w * d_x, lane, acc)`,
/// `hsum` at the end.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_impl(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        // [d_w, 0, d_x, 0]: lane 0 of the product is d_w * d_x.
        let h = f16_pair2([bw.d[0], bw.d[1], 0, 0], [bx.d[0], bx.d[1], 0, 0]);
        let d = _mm_mul_ss(h, _mm_movehl_ps(h, h));
        let lanes = q5_0_lanes(q5_quants(&bw.qh, &bw.qs), load_q8(&bx.qs));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    hsum(acc)
}

/// [`dot_q5_0_q8_0_impl`] of two weight rows, each row's lanes and f32 operations the one-row
/// kernel's (the same bits): the rows' `fma` chains interleave (a decode step's short rows
/// waited on one), and they share the activation's load, its scale and its offset products
/// (`maddubs(16, y)` depends on the activation alone).
///
/// # Safety
/// AVX2, FMA and F16C are present; `n` is at most the length of both rows and of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_rows2_impl(w: [&[BlockQ5_0]; 2], x: &[BlockQ8_0], n: usize) -> [f32; 2] {
    let mut acc = [_mm256_setzero_ps(); 2];
    let (sixteen, ones) = (_mm256_set1_epi8(16), _mm256_set1_epi16(1));
    for i in 0..n {
        // SAFETY: i < n <= every row's length (caller).
        let (b0, b1, bx) = unsafe {
            (
                w[0].get_unchecked(i),
                w[1].get_unchecked(i),
                x.get_unchecked(i),
            )
        };
        // [d_w0, d_w1, d_x, d_x] -> lanes 0, 1: d_w0 * d_x, d_w1 * d_x.
        let h = f16_pair2(
            [b0.d[0], b0.d[1], b1.d[0], b1.d[1]],
            [bx.d[0], bx.d[1], bx.d[0], bx.d[1]],
        );
        let d = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        let y = load_q8(&bx.qs);
        let oy = _mm256_maddubs_epi16(sixteen, y);
        let (q0, q1) = (q5_quants(&b0.qh, &b0.qs), q5_quants(&b1.qh, &b1.qs));
        let l0 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q0, y), oy), ones);
        let l1 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q1, y), oy), ones);
        acc[0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(l0), acc[0]);
        acc[1] = _mm256_fmadd_ps(
            _mm256_broadcastss_ps(_mm_movehdup_ps(d)),
            _mm256_cvtepi32_ps(l1),
            acc[1],
        );
    }
    [hsum(acc[0]), hsum(acc[1])]
}

/// [`dot_q5_0_q8_0`] of two weight rows, bit-identical to two calls.
///
/// # Panics
/// If the rows differ in length or the activation is shorter.
pub(super) fn dot_q5_0_q8_0_rows2(_: Token, w: [&[BlockQ5_0]; 2], x: &[BlockQ8_0]) -> [f32; 2] {
    let n = w[0].len();
    assert!(w[1].len() == n && x.len() >= n, "row lengths differ");
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q5_0_q8_0_rows2_impl(w, x, n) }
}

/// [`dot_q5_0_q8_0_impl`] of one weight row with `N` activation rows: each weight block is
/// unpacked once for all tokens; every token's lanes and f32 operations are the one-row
/// kernel's.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_xn_impl<const N: usize>(w: &[BlockQ5_0], x: [&[BlockQ8_0]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        let q = q5_quants(&bw.qh, &bw.qs);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let h = f16_pair2([bw.d[0], bw.d[1], 0, 0], [bx.d[0], bx.d[1], 0, 0]);
            let d = _mm_mul_ss(h, _mm_movehl_ps(h, h));
            let lanes = q5_0_lanes(q, load_q8(&bx.qs));
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    acc.map(|a| hsum(a))
}

/// [`dot_q5_0_q8_0_xn_impl`] with the products of [`q5_0_lanes_signed`]; the `N` tokens'
/// scale products `d_w * d_x` are formed in one register, each lane the same single f32
/// product the one-row kernel forms.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks; `N <= 8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_xn_sign_impl<const N: usize>(
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; N],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    let sixteen = _mm256_set1_epi8(16);
    let mut xd = [0u16; 8];
    for (i, bw) in w.iter().enumerate() {
        let s = _mm256_sub_epi8(q5_quants(&bw.qh, &bw.qs), sixteen);
        let s_abs = _mm256_abs_epi8(s);
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
            let prod = q5_0_lanes_signed(s_abs, s, load_q8(&bx.qs));
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    acc.map(|a| hsum(a))
}

/// [`dot_q5_0_q8_0_xn_sign_impl`] with the tokens' block scales already converted (`dx[i][t]`,
/// from `avx2::q8_0_token_scales`), as `avx2::dot_q8_0_q8_0_xn_scaled`: same bits.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `dx` have at least `w.len()` blocks;
/// `N <= 4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_xn_scaled_impl<const N: usize>(
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; N],
    dx: &[[f32; 4]],
) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let lanes: [__m256i; N] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    let sixteen = _mm256_set1_epi8(16);
    for (i, bw) in w.iter().enumerate() {
        let s = _mm256_sub_epi8(q5_quants(&bw.qh, &bw.qs), sixteen);
        let s_abs = _mm256_abs_epi8(s);
        // SAFETY: i < w.len() <= dx.len() (caller); 4 readable f32; loadu needs no alignment.
        let xd4 = unsafe { _mm_loadu_ps(dx.get_unchecked(i).as_ptr()) };
        let dw = _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        // Lanes 0..4 hold the products; the permute below reads only lanes t < N <= 4.
        let p = _mm256_castps128_ps256(_mm_mul_ps(dw, xd4));
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = q5_0_lanes_signed(s_abs, s, load_q8(&bx.qs));
            let d = _mm256_permutevar8x32_ps(p, lanes[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[t]);
        }
    }
    acc.map(|a| hsum(a))
}

/// [`dot_q5_0_q8_0_xn_scaled`] for 8 activation rows: each weight block's unpacking (about a
/// fifth of the 4-token kernel's work) shared by twice the tokens (AVX2 has the registers: 8
/// accumulators). `dx[i][t]` from `avx2::q8_0_token_scales`; no activation quant is -128.
/// Bit-identical to one [`dot_q5_0_q8_0_xn_scaled`] per token.
///
/// # Panics
/// If an activation row or `dx` is shorter than `w`.
pub(super) fn dot_q5_0_q8_0_x8_scaled(
    _: Token,
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; 8],
    dx: &[[f32; 8]],
) -> [f32; 8] {
    assert!(
        dx.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q5_0_q8_0_x8_scaled_impl(w, x, dx) }
}

/// See [`dot_q5_0_q8_0_x8_scaled`].
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` and `dx` have at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_q8_0_x8_scaled_impl(
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; 8],
    dx: &[[f32; 8]],
) -> [f32; 8] {
    let mut acc = [_mm256_setzero_ps(); 8];
    let sixteen = _mm256_set1_epi8(16);
    for (i, bw) in w.iter().enumerate() {
        let s = _mm256_sub_epi8(q5_quants(&bw.qh, &bw.qs), sixteen);
        let s_abs = _mm256_abs_epi8(s);
        let dw = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        // SAFETY: i < w.len() <= dx.len() (caller).
        let dxi = unsafe { dx.get_unchecked(i) };
        for t in 0..8 {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let prod = q5_0_lanes_signed(s_abs, s, load_q8(&bx.qs));
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

/// Q5_1 . Q8_1 as ggml's AVX2 `ggml_vec_dot_q5_1_q8_1`: lanes as Q5_0 (no offset) with
/// `fma(d_w * d_x, lane, acc)`, and the `m_w * s_x` products summed in one f32 in block order,
/// added after the lanes' `hsum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1_q8_1_impl(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // Lane 1 is the running sum of m_w * s_x (lane 0 sums the d products, unused).
    let mut acc_m = _mm_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        // [d_w, m_w, d_x, s_x] -> [d_w * d_x, m_w * s_x, ..].
        let h = f16_pair2(
            [bw.d[0], bw.d[1], bw.m[0], bw.m[1]],
            [bx.d[0], bx.d[1], bx.s[0], bx.s[1]],
        );
        let p = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        acc_m = _mm_add_ps(acc_m, p);
        let lanes = q5_1_lanes(q5_quants(&bw.qh, &bw.qs), load_q8(&bx.qs));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(lanes), acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(acc_m))
}

/// [`dot_q5_1_q8_1_impl`] of one weight row with `N` activation rows (each token's operations
/// the one-row kernel's).
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1_q8_1_xn_impl<const N: usize>(w: &[BlockQ5_1], x: [&[BlockQ8_1]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        let q = q5_quants(&bw.qh, &bw.qs);
        for t in 0..N {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = unsafe { x[t].get_unchecked(i) };
            let h = f16_pair2(
                [bw.d[0], bw.d[1], bw.m[0], bw.m[1]],
                [bx.d[0], bx.d[1], bx.s[0], bx.s[1]],
            );
            let p = _mm_mul_ps(h, _mm_movehl_ps(h, h));
            acc_m[t] = _mm_add_ps(acc_m[t], p);
            let lanes = q5_1_lanes(q, load_q8(&bx.qs));
            acc[t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) + _mm_cvtss_f32(_mm_movehdup_ps(acc_m[t])))
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

// ---- Q5_K ----
//
// Lane `i` of a block: `sum_k sc[k] * sum(q * y)` over elements `4i..4i + 4` of every 32-element
// sub-block `k`, q in 0..31 (`maddubs` pairs at most 2 * 31 * 128, no i16 saturation; a lane at
// most 8 * 4 * 31 * 128 * 63). The min term per block: `sum_k m[k] * (bsum(2k) + bsum(2k + 1))`,
// formed with `madd` in i32 (exact even for arbitrary i16 bsums, whose pair sums could wrap
// in i16).

/// Sub-blocks `2c` and `2c + 1` of a Q5_K block as unsigned bytes (0..31): nibbles of
/// `qs[32c..32c + 32]`, with bits `2c` and `2c + 1` of `qh` (`qh_c` = `qh` shifted right by `2c`
/// within each byte, so the bits are 0 and 1) as bit 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k_pair(bw: &BlockQ5_K, c: usize, qh_c: __m256i) -> [__m256i; 2] {
    assert!(c < 4);
    let m4 = _mm256_set1_epi8(0x0F);
    let m1 = _mm256_set1_epi8(1);
    // SAFETY: c < 4, so `qs[32c..32c + 32]` is inside the block; loadu has no alignment
    // requirement.
    let q = _mm256_loadu_si256(bw.qs.as_ptr().add(32 * c).cast());
    let h0 = _mm256_slli_epi16(_mm256_and_si256(qh_c, m1), 4);
    let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh_c, 1), m1), 4);
    [
        _mm256_or_si256(_mm256_and_si256(q, m4), h0),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1),
    ]
}

/// Q5_K . Q8_K as ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`: the 8 lanes above with
/// `fma(d_x * d_w, lane, acc)`; the min term `fma(-d_x * dmin, it, summs)` in block order,
/// added after the `hsum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k_q8_k_impl(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let sm = k4_scales_mins_i16(&bw.scales);
        summs = dmin.mul_add(k4_min_sum(bx, sm) as f32, summs);
        let scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        // SAFETY: `qh` is 32 readable bytes; loadu has no alignment requirement.
        let mut qh = _mm256_loadu_si256(bw.qh.as_ptr().cast());
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = q5k_pair(bw, c, qh);
            qh = _mm256_srli_epi16(qh, 2);
            for (j, qj) in q.into_iter().enumerate() {
                let k = 2 * c + j;
                let p = _mm256_maddubs_epi16(qj, q8k_chunk(bx, k));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, k4_scale(scales, k)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + summs
}

/// [`dot_q5_k_q8_k_impl`] of one weight row with `N` activation rows: each block's quants and
/// scales are unpacked once for all tokens; every token's lanes and f32 operations are the
/// one-row kernel's.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k_q8_k_xn_impl<const N: usize>(w: &[BlockQ5_K], x: [&[BlockQ8_K]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = [0.0f32; N];
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let (dw, mw) = (f16_le(bw.d), f16_le(bw.dmin));
        let sm = k4_scales_mins_i16(&bw.scales);
        for t in 0..N {
            let dmin = -bx[t].d() * mw;
            summs[t] = dmin.mul_add(k4_min_sum(bx[t], sm) as f32, summs[t]);
        }
        let scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        // SAFETY: `qh` is 32 readable bytes; loadu has no alignment requirement.
        let mut qh = _mm256_loadu_si256(bw.qh.as_ptr().cast());
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let q = q5k_pair(bw, c, qh);
            qh = _mm256_srli_epi16(qh, 2);
            for (j, qj) in q.into_iter().enumerate() {
                let k = 2 * c + j;
                let sc = k4_scale(scales, k);
                for t in 0..N {
                    let p = _mm256_maddubs_epi16(qj, q8k_chunk(bx[t], k));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc));
                }
            }
        }
        for t in 0..N {
            let d = bx[t].d() * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) + summs[t])
}

// ---- Q4_K (matrices llama.cpp does not repack) ----
//
// Lanes as Q5_K's without the fifth bit (`maddubs` pairs at most 2 * 15 * 128). The min term
// keeps 4 f32 lanes: lane `k` gets `fma(-d_x * dmin, m[2k] * (bsum(4k) + bsum(4k + 1)) +
// m[2k + 1] * (bsum(4k + 2) + bsum(4k + 3)), ..)` per block, folded `(a0 + a2) + (a1 + a3)` and
// added after the `hsum` (ggml's `ggml_vec_dot_q4_K_q8_K`).

/// The 4 integer min products of one block (`sm` from [`k4_scales_mins_i16`]), as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_min_products(bx: &BlockQ8_K, sm: __m256i) -> __m128 {
    let m2 = min_pairs(_mm256_extracti128_si256(sm, 1));
    // SAFETY: `bsums` is 16 little-endian i16 (32 bytes); loadu has no alignment requirement.
    let bsums = _mm256_loadu_si256(bx.bsums.as_ptr().cast());
    // Lane j: m[j] * (bsum(2j) + bsum(2j + 1)); adjacent lanes summed: [p0+p1, p2+p3 | p4+p5, ..].
    let p = _mm256_madd_epi16(bsums, m2);
    let h = _mm256_hadd_epi32(p, p);
    let prod = _mm_unpacklo_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_cvtepi32_ps(prod)
}

/// The 4 min lanes folded `(a0 + a2) + (a1 + a3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold4(a: __m128) -> f32 {
    let s = _mm_add_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sub-blocks `2c` and `2c + 1` of a Q4_K block (the nibbles of `qs[32c..32c + 32]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_pair(bw: &BlockQ4_K, c: usize) -> [__m256i; 2] {
    assert!(c < 4);
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: c < 4, so `qs[32c..32c + 32]` is inside the block; loadu has no alignment
    // requirement.
    let q = _mm256_loadu_si256(bw.qs.as_ptr().add(32 * c).cast());
    [
        _mm256_and_si256(q, m4),
        _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
    ]
}

/// Q4_K . Q8_K as ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` (see above).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_q8_k_impl(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let sm = k4_scales_mins_i16(&bw.scales);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), q4k_min_products(bx, sm), acc_m);
        let scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            for (j, qj) in q4k_pair(bw, c).into_iter().enumerate() {
                let k = 2 * c + j;
                let p = _mm256_maddubs_epi16(qj, q8k_chunk(bx, k));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, k4_scale(scales, k)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + fold4(acc_m)
}

/// [`dot_q4_k_q8_k_impl`] of one weight row with `N` activation rows (each token's operations
/// the one-row kernel's).
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_q8_k_xn_impl<const N: usize>(w: &[BlockQ4_K], x: [&[BlockQ8_K]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_m = [_mm_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let (dw, mw) = (f16_le(bw.d), f16_le(bw.dmin));
        let sm = k4_scales_mins_i16(&bw.scales);
        for t in 0..N {
            let dmin = -bx[t].d() * mw;
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), q4k_min_products(bx[t], sm), acc_m[t]);
        }
        let scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            for (j, qj) in q4k_pair(bw, c).into_iter().enumerate() {
                let k = 2 * c + j;
                let sc = k4_scale(scales, k);
                for t in 0..N {
                    let p = _mm256_maddubs_epi16(qj, q8k_chunk(bx[t], k));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc));
                }
            }
        }
        for t in 0..N {
            let d = bx[t].d() * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) + fold4(acc_m[t]))
}

// ---- Q6_K ----
//
// Lane `i` of a block (what ggml's AVX2 `ggml_vec_dot_q6_K_q8_K` forms): the unsigned quants
// `q + 32` (0..63) times the activations, elements `4i..4i + 4` of each 32-element chunk `c`
// scaled by the chunk's sub-block scale (`2c` for `i < 4`, `2c + 1` for `i >= 4`), summed over
// the 8 chunks; minus `32 * (bsum(2i) * sc[2i] + bsum(2i + 1) * sc[2i + 1])`. The lanes differ
// from a signed sum's, but each is an exact integer, so any grouping of the integer work gives
// the same lanes (the offset is where each block's lanes start). Bounds: `maddubs` pairs are at
// most 2 * 63 * 128 = 16128 (no i16 saturation), `madd` with an i8 scale at most
// 2 * 16128 * 128 per pair of pairs, a lane at most 8 * 4 * 63 * 128 * 128 plus the offset's
// 32 * 2 * 32768 * 128 (even for arbitrary i16 bsums): far inside i32.

/// The block's 16 scales as i16: `[sc0..8, sc0..8]` and `[sc8..16, sc8..16]` (each 128-bit half
/// the same 8 scales, for [`q6k_chunk_scales`]), and the offset multipliers `-32 * sc` in
/// element order (at most 4096: fits i16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_scales(bw: &BlockQ6_K) -> ([__m256i; 2], __m256i) {
    // SAFETY: `scales` is 16 readable bytes; loadu has no alignment requirement.
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bw.scales.as_ptr().cast()));
    let halves = [
        _mm256_permute2x128_si256(sc16, sc16, 0x00),
        _mm256_permute2x128_si256(sc16, sc16, 0x11),
    ];
    let neg_sc32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    (halves, neg_sc32)
}

/// The i16 multipliers of chunk `c`'s 16 `maddubs` pair sums: `[sc[2c]; 8]` then
/// `[sc[2c + 1]; 8]`; one in-lane `pshufb` of the half of [`q6k_scales`] holding them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_chunk_scales(halves: &[__m256i; 2], c: usize) -> __m256i {
    // i16 element `e` (sub-block 2c within its half of 8) in the low lane, `e + 1` in the high.
    let e = ((2 * c) % 8) as i16;
    let pick = |e: i16| _mm_set1_epi16(((2 * e + 1) << 8) | (2 * e));
    _mm256_shuffle_epi8(halves[c / 4], _mm256_setr_m128i(pick(e), pick(e + 1)))
}

/// The four 32-quant chunks of half `h` (0 or 1) of a Q6_K block, elements `128h + 32k..` in
/// chunk `k`, as unsigned bytes `q + 32` (0..63): low nibbles of `ql[64h..64h + 32]`, of
/// `ql[64h + 32..64h + 64]`, then their high nibbles, with bit pairs 0, 2, 4, 6 of
/// `qh[32h..32h + 32]` on top.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_half_quants(bw: &BlockQ6_K, h: usize) -> [__m256i; 4] {
    assert!(h < 2);
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    // SAFETY: h < 2, so `ql[64h..64h + 64]` and `qh[32h..32h + 32]` are inside the block's
    // arrays; loadu has no alignment requirement.
    let (l0, l1, hb) = (
        _mm256_loadu_si256(bw.ql.as_ptr().add(64 * h).cast()),
        _mm256_loadu_si256(bw.ql.as_ptr().add(64 * h + 32).cast()),
        _mm256_loadu_si256(bw.qh.as_ptr().add(32 * h).cast()),
    );
    // Bit pair `2k` of each qh byte moved to bits 4..6: 16-bit shifts, and the mask drops
    // whatever crossed from the neighbouring byte.
    let h0 = _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30);
    let h1 = _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30);
    let h2 = _mm256_and_si256(hb, m30);
    let h3 = _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30);
    [
        _mm256_or_si256(_mm256_and_si256(l0, m4), h0),
        _mm256_or_si256(_mm256_and_si256(l1, m4), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3),
    ]
}

/// Activations `32c..32c + 32` of a Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_chunk(bx: &BlockQ8_K, c: usize) -> __m256i {
    assert!(c < 8);
    // SAFETY: c < 8, so `qs[32c..32c + 32]` is inside the 256 quants; loadu has no alignment
    // requirement.
    _mm256_loadu_si256(bx.qs.as_ptr().add(32 * c).cast())
}

/// The unsigned quants' offset per lane, `-32 * (bsum(2i) * sc[2i] + bsum(2i + 1) * sc[2i + 1])`
/// (`neg_sc32` from [`q6k_scales`]; the pair sums at most 2 * 32768 * 4096 fit i32): where each
/// block's lanes start.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_offset(bx: &BlockQ8_K, neg_sc32: __m256i) -> __m256i {
    // SAFETY: `bsums` is 16 little-endian i16 (32 bytes), as x86 loads them; loadu has no
    // alignment requirement.
    let bsums = _mm256_loadu_si256(bx.bsums.as_ptr().cast());
    _mm256_madd_epi16(bsums, neg_sc32)
}

/// Q6_K . Q8_K as ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`: per block the 8 lanes above, then
/// `fma(d_x * d_w, lane, acc)`, and `hsum` at the end.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_q8_k_impl(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        // Decode streams the weights once: the lines of the block 16 blocks ahead (about 3.3
        // KiB), spread over the loop, as the AVX-512 kernel does.
        let ahead = (bw as *const BlockQ6_K).cast::<u8>().wrapping_add(16 * 210);
        for line in 0..4 {
            // A prefetch never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
        }
        let d = bx.d() * f16_le(bw.d);
        let (scales, neg_sc32) = q6k_scales(bw);
        let mut lanes = q6k_offset(bx, neg_sc32);
        for h in 0..2 {
            let q = q6k_half_quants(bw, h);
            for (k, qk) in q.into_iter().enumerate() {
                let c = 4 * h + k;
                let p = _mm256_maddubs_epi16(qk, q8k_chunk(bx, c));
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, q6k_chunk_scales(&scales, c)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    hsum(acc)
}

/// [`dot_q6_k_q8_k_impl`] of one weight row with `N` activation rows: each block's quants and
/// scales are unpacked once for all tokens; every token's lanes and f32 operations are the
/// one-row kernel's.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_q8_k_xn_impl<const N: usize>(w: &[BlockQ6_K], x: [&[BlockQ8_K]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let dw = f16_le(bw.d);
        let (scales, neg_sc32) = q6k_scales(bw);
        let mut lanes = bx.map(|b| q6k_offset(b, neg_sc32));
        for h in 0..2 {
            let q = q6k_half_quants(bw, h);
            for (k, qk) in q.into_iter().enumerate() {
                let c = 4 * h + k;
                let sc = q6k_chunk_scales(&scales, c);
                for t in 0..N {
                    let p = _mm256_maddubs_epi16(qk, q8k_chunk(bx[t], c));
                    lanes[t] = _mm256_add_epi32(lanes[t], _mm256_madd_epi16(p, sc));
                }
            }
        }
        for (t, lanes) in lanes.into_iter().enumerate() {
            let d = bx[t].d() * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    acc.map(|a| hsum(a))
}

// Safe wrappers. SAFETY (all of them): a `Token` exists only after `Token::detect` confirmed AVX2,
// FMA and F16C on this CPU, so the target features the kernels are compiled for are present.

pub(super) fn dot_q5_0_q8_0(_: Token, w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    debug_assert_eq!(QK, 32);
    // The `sign` products of the prefill kernel measured 3% slower here: one token does not
    // amortize the signed unpacking over several products.
    // SAFETY: see above.
    unsafe { dot_q5_0_q8_0_impl(w, x) }
}

pub(super) fn dot_q5_1_q8_1(_: Token, w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q5_1_q8_1_impl(w, x) }
}

/// [`dot_q5_0_q8_0`] of one weight row with `N` activation rows at once (bit-identical to `N`
/// calls of it). Panics if an activation row is shorter than the weight row. The tests' form:
/// `matvec_tokens` checks the activations once per matrix and calls [`dot_q5_0_q8_0_xn_with`].
#[cfg(test)]
pub(super) fn dot_q5_0_q8_0_xn<const N: usize>(
    t: Token,
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; N],
) -> [f32; N] {
    let sign_ok = x
        .iter()
        .all(|x| super::avx2::sign_trick_exact(t, &x[..w.len().min(x.len())]));
    dot_q5_0_q8_0_xn_with(t, w, x, sign_ok)
}

/// [`dot_q5_0_q8_0_xn_with`] where no activation quant is -128, with the rows' block scales
/// from `avx2::q8_0_token_scales` (the AVX-512 4-token kernel still wins where it exists).
/// Bit-identical to it.
///
/// # Panics
/// If an activation row or `dx` is shorter than `w`.
pub(super) fn dot_q5_0_q8_0_xn_scaled<const N: usize>(
    t: Token,
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; N],
    dx: &[[f32; 4]],
) -> [f32; N] {
    const { assert!(N <= 4) };
    if N == 4 && t.avx512() {
        return dot_q5_0_q8_0_xn_with(t, w, x, true);
    }
    assert!(
        dx.len() >= w.len() && x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { dot_q5_0_q8_0_xn_scaled_impl(w, x, dx) }
}

/// [`dot_q5_0_q8_0_xn`] where the caller has checked the activation rows once for many weight
/// rows: `sign_ok` is `avx2::sign_trick_exact` of every `x[t]` (with `false` the exact products
/// run). The `sign` products measured 2% faster in prefill on a Zen 1 CPU.
pub(super) fn dot_q5_0_q8_0_xn_with<const N: usize>(
    t: Token,
    w: &[BlockQ5_0],
    x: [&[BlockQ8_0]; N],
    sign_ok: bool,
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    const { assert!(N <= 8) };
    if N == 4 && t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        let r = unsafe { super::avx512::dot_q5_0_q8_0_x4(w, std::array::from_fn(|k| x[k])) };
        return std::array::from_fn(|k| r[k]);
    }
    if sign_ok {
        // SAFETY: see above; lengths checked, N <= 8.
        return unsafe { dot_q5_0_q8_0_xn_sign_impl(w, x) };
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q5_0_q8_0_xn_impl(w, x) }
}

/// [`dot_q5_0_q8_0`] of `R` weight rows (1 or 2) with 8 activation rows at once, with the
/// AVX-512 VNNI kernel (bit-identical to `8 * R` calls of it).
///
/// # Panics
/// If `t` is not an AVX-512 token, the rows differ in length or an activation row is shorter.
pub(super) fn dot_q5_0_q8_0_x8<const R: usize>(
    t: Token,
    w: [&[BlockQ5_0]; R],
    x: [&[BlockQ8_0]; 8],
) -> [[f32; 8]; R] {
    super::avx2::check_rows_x8(t, &w, &x);
    // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
    unsafe { super::avx512::dot_q5_0_q8_0_x8(w, x) }
}

/// [`dot_q5_1_q8_1`] of one weight row with `N` activation rows at once (bit-identical to `N`
/// calls of it). Panics if an activation row is shorter than the weight row.
pub(super) fn dot_q5_1_q8_1_xn<const N: usize>(
    t: Token,
    w: &[BlockQ5_1],
    x: [&[BlockQ8_1]; N],
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    if N == 4 && t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        let r = unsafe { super::avx512::dot_q5_1_q8_1_x4(w, std::array::from_fn(|k| x[k])) };
        return std::array::from_fn(|k| r[k]);
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q5_1_q8_1_xn_impl(w, x) }
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

/// [`dot_q4_k_q8_k`] of one weight row with `N` activation rows at once (bit-identical to `N`
/// calls of it). Panics if an activation row is shorter than the weight row.
pub(super) fn dot_q4_k_q8_k_xn<const N: usize>(
    _: Token,
    w: &[BlockQ4_K],
    x: [&[BlockQ8_K]; N],
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    // SAFETY: see above; lengths checked.
    unsafe { dot_q4_k_q8_k_xn_impl(w, x) }
}

/// One token stays on AVX2 even where the token has `avx512()`: the AVX-512 kernel with `N = 1`
/// measured 5% slower in cache and the same from memory.
pub(super) fn dot_q5_k_q8_k(_: Token, w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe { dot_q5_k_q8_k_impl(w, x) }
}

/// [`dot_q5_k_q8_k`] of `R` (1 or 2) weight rows with the AVX-512 kernel (decode; the same
/// bits).
///
/// # Panics
/// If the token is not an AVX-512 one, the rows differ in length or `x` is shorter.
pub(super) fn dot_q5_k_q8_k_rows<const R: usize>(
    t: Token,
    w: [&[BlockQ5_K]; R],
    x: &[BlockQ8_K],
) -> [f32; R] {
    const { assert!(R == 1 || R == 2) };
    assert!(t.avx512(), "dot_q5_k_q8_k_rows: an AVX-512 token");
    let nb = w[0].len();
    assert!(
        w.iter().all(|r| r.len() == nb) && x.len() >= nb,
        "dot_q5_k_q8_k_rows: rows of unequal length or activation too short"
    );
    // SAFETY: the token's AVX-512 features were detected; lengths checked.
    unsafe { super::avx512::dot_q5_k_q8_k_rows(w, x) }
}

/// [`dot_q5_k_q8_k`] of one weight row with `N` activation rows at once (bit-identical to `N`
/// calls of it). Panics if an activation row is shorter than the weight row.
pub(super) fn dot_q5_k_q8_k_xn<const N: usize>(
    t: Token,
    w: &[BlockQ5_K],
    x: [&[BlockQ8_K]; N],
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    if t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        return unsafe { super::avx512::dot_q5_k_q8_k_xn(w, x) };
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q5_k_q8_k_xn_impl(w, x) }
}

pub(super) fn dot_q6_k_q8_k(t: Token, w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    if t.avx512() {
        let x = &x[..w.len()];
        // SAFETY: see above (the token's AVX-512 features were detected); `x` has exactly
        // `w.len()` blocks (the slice above panics otherwise).
        return unsafe { super::avx512::dot_q6_k_q8_k_xn(w, [x])[0] };
    }
    // SAFETY: see above.
    unsafe { dot_q6_k_q8_k_impl(w, x) }
}

/// [`dot_q6_k_q8_k`] of one weight row with `N` activation rows at once (bit-identical to `N`
/// calls of it). Panics if an activation row is shorter than the weight row.
pub(super) fn dot_q6_k_q8_k_xn<const N: usize>(
    t: Token,
    w: &[BlockQ6_K],
    x: [&[BlockQ8_K]; N],
) -> [f32; N] {
    assert!(
        x.iter().all(|r| r.len() >= w.len()),
        "activation row too short"
    );
    if t.avx512() {
        // SAFETY: see above (the token's AVX-512 features were detected); lengths checked.
        return unsafe { super::avx512::dot_q6_k_q8_k_xn(w, x) };
    }
    // SAFETY: see above; lengths checked.
    unsafe { dot_q6_k_q8_k_xn_impl(w, x) }
}

#[cfg(test)]
mod tests;
