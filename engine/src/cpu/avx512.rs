//! x86_64 AVX-512 (F, BW, VL, VNNI) kernels for the most used weight types, on top of the AVX2
//! set: every result is bit-identical to the AVX2 kernel's (and so to llama.cpp's x86 order).
//!
//! Four tokens (prefill): a 512-bit register holds two tokens' 8 accumulator lanes side by side,
//! so one instruction does two tokens' work while each lane sees exactly the one-token kernel's
//! sequence of operations; `vpdpbusd` (VNNI) replaces `vpmaddubsw` + `vpmaddwd`, both giving the
//! exact integer sum of each group of four products (no i16 saturation is possible for 4-bit
//! weights), as llama.cpp's AVX-512 VNNI builds compute it. One token (decode) stays on the AVX2
//! kernels: a `vpdpbusd` version measured slower on the memory-bound decode path (1.6 against
//! 3.0 GB/s streaming 700 MB of Q4_0 on one thread).
//!
//! Only reachable through an [`super::avx2::Token`] whose `avx512()` is true, which
//! [`super::avx2::Token::detect_avx512`] grants after run-time detection.

use std::arch::x86_64::*;

use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
// AVX2 helpers: their features are a subset of this file's, so they inline here.
use super::avx2::{hsum, load_q8, nibbles, prefetch_stream};

/// Whether this CPU runs the kernels in this file.
pub(super) fn detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Two tokens' 32 quants: `a` in the low half, `b` in the high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn load_q8_pair(a: &[i8; 32], b: &[i8; 32]) -> __m512i {
    // SAFETY: AVX2 is among this function's features; `load_q8` reads only its arrays.
    let (a, b) = unsafe { (load_q8(a), load_q8(b)) };
    _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
}

/// Four f16 pairs (each as 4 little-endian bytes) as 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f16_pairs(p: [[u8; 4]; 4]) -> __m256 {
    let v = p.map(i32::from_le_bytes);
    _mm256_cvtph_ps(_mm_setr_epi32(v[0], v[1], v[2], v[3]))
}

/// The two halves of a 512-bit accumulator (token a, token b), each reduced as `hsum`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum_pair(v: __m512) -> (f32, f32) {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    // SAFETY: AVX2 is among this function's features.
    unsafe { (hsum(_mm512_castps512_ps256(v)), hsum(hi)) }
}

/// Q8_0 . Q8_0 of one row (decode): ggml's lanes (lane k: the exact sum of elements 4k..4k+3),
/// which `vpdpbusd` forms directly, without the AVX2 kernel's widening, `hadd` and permute.
/// `vpdpbusd` takes an unsigned left operand, so the weights are biased by 128 (`xor 0x80`) and
/// `128 * sum(y)` of the same four elements is subtracted: exact for every i8 pair (each i32 lane
/// is at most 4 * 255 * 128 in magnitude).
///
/// # Safety
/// The CPU has the features of [`detected`]; `x.len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q8_0_q8_0(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let zero = _mm256_setzero_si256();
    let bias = _mm256_set1_epi8(i8::MIN);
    let mut acc = _mm256_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let d = _mm_cvtph_ps(_mm_setr_epi16(
            i16::from_le_bytes(bw.d),
            i16::from_le_bytes(bx.d),
            0,
            0,
            0,
            0,
            0,
            0,
        ));
        let d = _mm_mul_ss(d, _mm_movehdup_ps(d));
        // SAFETY: AVX2 is among this function's features.
        let (a, y) = unsafe { (load_q8(&bw.qs), load_q8(&bx.qs)) };
        let biased = _mm256_dpbusd_epi32(zero, _mm256_xor_si256(a, bias), y);
        let prod = _mm256_sub_epi32(biased, _mm256_dpbusd_epi32(zero, bias, y));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(prod), acc);
    }
    // SAFETY: AVX2 is among this function's features.
    unsafe { hsum(acc) }
}

/// Q4_1 . Q8_1 of one row (decode), in the AVX2 kernel's order: `vpdpbusd` of the nibbles with
/// the activations gives its 4-element lanes in one instruction (instead of `maddubs` + `madd`).
///
/// # Safety
/// The CPU has the features of [`detected`]; `x.len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_1_q8_1(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_stream(bw);
        let h = _mm_cvtph_ps(_mm_setr_epi16(
            i16::from_le_bytes(bw.d),
            i16::from_le_bytes(bw.m),
            i16::from_le_bytes(bx.d),
            i16::from_le_bytes(bx.s),
            0,
            0,
            0,
            0,
        ));
        // [d_w*d_x, m_w*s_x, ..], as the AVX2 kernel forms them.
        let p = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        acc_m = _mm_add_ps(acc_m, p);
        // SAFETY: AVX2 is among this function's features.
        let prod = unsafe { _mm256_dpbusd_epi32(zero, nibbles(&bw.qs), load_q8(&bx.qs)) };
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(prod), acc);
    }
    let m = _mm_cvtss_f32(_mm_shuffle_ps(acc_m, acc_m, 1));
    // SAFETY: AVX2 is among this function's features.
    unsafe { hsum(acc) + m }
}

/// [`dot_q4_1_q8_1`] of two rows with one activation (decode): each row's lanes see exactly the
/// one-row sequence, but the two accumulation chains are independent, so the `fma` latency of
/// one overlaps the other's work (one row alone waits on it every block), and the activation
/// blocks are loaded once.
///
/// # Safety
/// The CPU has the features of [`detected`]; `w[0].len() == w[1].len() <= x.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_1_q8_1_rows2(w: [&[BlockQ4_1]; 2], x: &[BlockQ8_1]) -> [f32; 2] {
    let zero = _mm256_setzero_si256();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut acc_m = _mm256_setzero_ps();
    for (i, bx) in x.iter().enumerate().take(w[0].len()) {
        // SAFETY: i < w[0].len() == w[1].len() (caller).
        let bw = w.map(|r| unsafe { r.get_unchecked(i) });
        prefetch_stream(bw[0]);
        prefetch_stream(bw[1]);
        let (dx, sx) = (i16::from_le_bytes(bx.d), i16::from_le_bytes(bx.s));
        let h = _mm256_cvtph_ps(_mm_setr_epi16(
            i16::from_le_bytes(bw[0].d),
            i16::from_le_bytes(bw[0].m),
            dx,
            sx,
            i16::from_le_bytes(bw[1].d),
            i16::from_le_bytes(bw[1].m),
            dx,
            sx,
        ));
        // [d_w0*d_x, m_w0*s_x, .. | d_w1*d_x, m_w1*s_x, ..]: the one-row products.
        let p = _mm256_mul_ps(h, _mm256_permute_ps::<0b11_10_11_10>(h));
        acc_m = _mm256_add_ps(acc_m, p);
        // SAFETY: AVX2 is among this function's features.
        let y = unsafe { load_q8(&bx.qs) };
        // SAFETY: as above.
        let (q0, q1) = unsafe { (nibbles(&bw[0].qs), nibbles(&bw[1].qs)) };
        let prod0 = _mm256_dpbusd_epi32(zero, q0, y);
        let prod1 = _mm256_dpbusd_epi32(zero, q1, y);
        let d0 = _mm256_broadcastss_ps(_mm256_castps256_ps128(p));
        let d1 = _mm256_broadcastss_ps(_mm256_extractf128_ps::<1>(p));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(prod0), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(prod1), acc1);
    }
    let mut m = [0.0f32; 8];
    // SAFETY: `m` has 8 f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(m.as_mut_ptr(), acc_m) };
    // SAFETY: AVX2 is among this function's features.
    unsafe { [hsum(acc0) + m[1], hsum(acc1) + m[5]] }
}

/// [`dot_q8_0_q8_0`] of two rows with one activation (decode), for the reasons of
/// [`dot_q4_1_q8_1_rows2`].
///
/// # Safety
/// The CPU has the features of [`detected`]; `w[0].len() == w[1].len() <= x.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q8_0_q8_0_rows2(w: [&[BlockQ8_0]; 2], x: &[BlockQ8_0]) -> [f32; 2] {
    let zero = _mm256_setzero_si256();
    let bias = _mm256_set1_epi8(i8::MIN);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (i, bx) in x.iter().enumerate().take(w[0].len()) {
        // SAFETY: i < w[0].len() == w[1].len() (caller).
        let bw = w.map(|r| unsafe { r.get_unchecked(i) });
        prefetch_stream(bw[0]);
        prefetch_stream(bw[1]);
        let dx = i16::from_le_bytes(bx.d);
        let h = _mm_cvtph_ps(_mm_setr_epi16(
            i16::from_le_bytes(bw[0].d),
            dx,
            i16::from_le_bytes(bw[1].d),
            dx,
            0,
            0,
            0,
            0,
        ));
        // [d_w0*d_x, _, d_w1*d_x, _]: the one-row products.
        let d = _mm_mul_ps(h, _mm_movehdup_ps(h));
        // SAFETY: AVX2 is among this function's features.
        let (a0, a1, y) = unsafe { (load_q8(&bw[0].qs), load_q8(&bw[1].qs), load_q8(&bx.qs)) };
        let ybias = _mm256_dpbusd_epi32(zero, bias, y);
        let prod0 = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, _mm256_xor_si256(a0, bias), y),
            ybias,
        );
        let prod1 = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, _mm256_xor_si256(a1, bias), y),
            ybias,
        );
        let d0 = _mm256_broadcastss_ps(d);
        let d1 = _mm256_broadcastss_ps(_mm_movehl_ps(d, d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(prod0), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(prod1), acc1);
    }
    // SAFETY: AVX2 is among this function's features.
    unsafe { [hsum(acc0), hsum(acc1)] }
}

/// Q4_1 . Q8_1 of one weight row with 4 tokens, two per 512-bit register.
///
/// # Safety
/// The CPU has the features of [`detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_1_q8_1_x4(w: &[BlockQ4_1], x: [&[BlockQ8_1]; 4]) -> [f32; 4] {
    let zero = _mm512_setzero_si512();
    let (mut acc01, mut acc23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut acc_m = _mm256_setzero_ps();
    // Lanes of `p` holding d_w*d_x of tokens (0, 1) and (2, 3), each spread over 8 lanes.
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    let idx23 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(&bw.qs) };
        let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
        let dm = [bw.d[0], bw.d[1], bw.m[0], bw.m[1]];
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let ds = bx.map(|b| [b.d[0], b.d[1], b.s[0], b.s[1]]);
        // [d_w*d_x0, m_w*s_x0, d_w*d_x1, m_w*s_x1, ..]: each lane the one-token product.
        let p = _mm256_mul_ps(f16_pairs([dm; 4]), f16_pairs(ds));
        acc_m = _mm256_add_ps(acc_m, p);
        let p512 = _mm512_castps256_ps512(p);
        let prod01 = _mm512_dpbusd_epi32(zero, qq, load_q8_pair(&bx[0].qs, &bx[1].qs));
        let prod23 = _mm512_dpbusd_epi32(zero, qq, load_q8_pair(&bx[2].qs, &bx[3].qs));
        acc01 = _mm512_fmadd_ps(
            _mm512_permutexvar_ps(idx01, p512),
            _mm512_cvtepi32_ps(prod01),
            acc01,
        );
        acc23 = _mm512_fmadd_ps(
            _mm512_permutexvar_ps(idx23, p512),
            _mm512_cvtepi32_ps(prod23),
            acc23,
        );
    }
    let mut m = [0.0f32; 8];
    // SAFETY: `m` has 8 f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(m.as_mut_ptr(), acc_m) };
    let (s0, s1) = hsum_pair(acc01);
    let (s2, s3) = hsum_pair(acc23);
    [s0 + m[1], s1 + m[3], s2 + m[5], s3 + m[7]]
}

/// Q4_0 . Q8_0 of one weight row with 4 tokens, two per 512-bit register.
///
/// # Safety
/// The CPU has the features of [`detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_0_q8_0_x4(w: &[BlockQ4_0], x: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    let zero = _mm512_setzero_si512();
    let eights = _mm512_set1_epi8(8);
    let (mut acc01, mut acc23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let idx23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(&bw.qs) };
        let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let dw = _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        let xd = bx.map(|b| i16::from_le_bytes(b.d));
        let dx = _mm_cvtph_ps(_mm_setr_epi16(xd[0], xd[1], xd[2], xd[3], 0, 0, 0, 0));
        // [d_w*d_x0, .., d_w*d_x3]: each lane the one-token product.
        let d = _mm512_castps128_ps512(_mm_mul_ps(dw, dx));
        let y01 = load_q8_pair(&bx[0].qs, &bx[1].qs);
        let y23 = load_q8_pair(&bx[2].qs, &bx[3].qs);
        let prod01 = _mm512_sub_epi32(
            _mm512_dpbusd_epi32(zero, qq, y01),
            _mm512_dpbusd_epi32(zero, eights, y01),
        );
        let prod23 = _mm512_sub_epi32(
            _mm512_dpbusd_epi32(zero, qq, y23),
            _mm512_dpbusd_epi32(zero, eights, y23),
        );
        acc01 = _mm512_fmadd_ps(
            _mm512_permutexvar_ps(idx01, d),
            _mm512_cvtepi32_ps(prod01),
            acc01,
        );
        acc23 = _mm512_fmadd_ps(
            _mm512_permutexvar_ps(idx23, d),
            _mm512_cvtepi32_ps(prod23),
            acc23,
        );
    }
    let (s0, s1) = hsum_pair(acc01);
    let (s2, s3) = hsum_pair(acc23);
    [s0, s1, s2, s3]
}
