//! x86_64 AVX-512 (F, BW, VL, VNNI) kernels for the most used weight types, on top of the AVX2
//! set: every result is bit-identical to the AVX2 kernel's (and so to llama.cpp's x86 order).
//!
//! Four tokens (prefill): a 512-bit register holds two tokens' 8 accumulator lanes side by side,
//! so one instruction does two tokens' work while each lane sees exactly the one-token kernel's
//! sequence of operations; `vpdpbusd` (VNNI) replaces `vpmaddubsw` + `vpmaddwd`, both giving the
//! exact integer sum of each group of four products (no i16 saturation is possible for 4-bit
//! weights), as llama.cpp's AVX-512 VNNI builds compute it. One token (decode): Q4_1 and Q8_0
//! form ggml's lanes with `vpdpbusd` too, two weight rows per call (independent `fma` chains);
//! repacked Q4_0 and Q4_K have their own files (`q4_0_rows.rs`, `q4_k_rows.rs`).
//!
//! Q6_K is laid out differently: one token's two 32-element chunks per register (its unpacking
//! is costly, so 64 elements per instruction pay for themselves), for one token too; decoding a
//! 54 MB Q6_K head measured 1.2x faster than the AVX2 kernel (2.6 against 3.1 ms). Two weight
//! rows per call sharing the activation loads measured slower (3.4 ms) and were dropped. Q5_K
//! likewise holds one token's sub-block pair (64 elements) per register, for prefill only (with
//! one token it measured 5% slower than AVX2 in cache, the same from memory). Q5_0 and Q5_1
//! have four-token kernels in the Q4_0 / Q4_1 layout (1.26x / 1.30x faster than AVX2's
//! `_xn::<4>` on a 1536 x 576 matrix); one token stays on AVX2 (decode is memory-bound).
//!
//! Q4_1 and Q5_0 with 2 to 4 tokens (sessions decoding together, and the ends of prompt
//! chunks), and Q5_0 with one, go through tiles of 4 weight rows by the tokens, 256 bits per
//! (row, token) as in the one-token kernel: each block's scale products for the whole tile are
//! one 512-bit multiply,
//! read back by the `fma`s as broadcast loads, and the activation blocks are loaded once for 4
//! rows, which leaves 3 vector operations per (row, token, block) (`vpdpbusd`, `vcvtdq2ps`,
//! `vfmadd`). On Zen 4 this measured 1.9x faster than one row by 4
//! tokens on SmolLM2's Q4_1 matrices in cache (`bench_matvec_tokens4`); with 8 tokens (prefill)
//! two tiles were no faster than the 8-token kernels in a whole prefill, so those stay.
//!
//! Only reachable through an [`super::x86::Token`] whose `avx512()` is true, which
//! [`super::x86::Token::detect_avx512`] grants after run-time detection: the AVX2 entry points
//! (`avx2.rs`, `avx2_quants.rs`) dispatch here. This file imports no other kernel file, only
//! the shared helpers of `x86.rs`.

use std::arch::x86_64::*;

use super::block::f16_le;
use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5_K;
use super::q6_k::BlockQ6_K;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8_K;
// AVX2 helpers: their features are a subset of this file's, so they inline here.
use super::legacy_rows::WeightBlock;
use super::x86::{
    hsum, k4_min_sum, k4_scale, k4_scales_mins_i16, load_q8, nibbles, prefetch_stream, q5_quants,
};

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
/// The CPU has the features of [`super::x86::avx512_detected`]; `x.len() >= w.len()`.
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
/// The CPU has the features of [`super::x86::avx512_detected`]; `x.len() >= w.len()`.
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
/// The CPU has the features of [`super::x86::avx512_detected`];
/// `w[0].len() == w[1].len() <= x.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_1_q8_1_rows2(w: [&[BlockQ4_1]; 2], x: &[BlockQ8_1]) -> [f32; 2] {
    let zero = _mm256_setzero_si256();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut acc_m = _mm256_setzero_ps();
    for (i, bx) in x.iter().enumerate().take(w[0].len()) {
        // SAFETY: i < w[0].len() == w[1].len() (caller).
        let bw = w.map(|r| unsafe { r.get_unchecked(i) });
        prefetch_pair(w[0], i);
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
/// The CPU has the features of [`super::x86::avx512_detected`];
/// `w[0].len() == w[1].len() <= x.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q8_0_q8_0_rows2(w: [&[BlockQ8_0]; 2], x: &[BlockQ8_0]) -> [f32; 2] {
    let zero = _mm256_setzero_si256();
    let bias = _mm256_set1_epi8(i8::MIN);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (i, bx) in x.iter().enumerate().take(w[0].len()) {
        // SAFETY: i < w[0].len() == w[1].len() (caller).
        let bw = w.map(|r| unsafe { r.get_unchecked(i) });
        prefetch_pair(w[0], i);
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

/// Q5_K · Q8_K of `R` weight rows (1 or 2) with one activation (decode), in ggml's AVX2 order
/// (`avx2_quants::dot_q5_k_q8_k`: per block 8 lanes of `scale_k * (q · y)` summed over the 8
/// sub-blocks in integers, `fma(d_x * d_w, lanes, acc)`, the min term `fma(-d_x * dmin, it,
/// summs)` in block order, `hsum(acc) + summs` at the end), with AVX-512's help where the AVX2
/// kernel spends most: the fifth bits added under a byte mask tested out of `qh` (two
/// instructions per sub-block instead of four), and the scaled pair sums accumulated by one
/// `vpdpwssd` instead of `madd` and `add`. The same integers, so the same bits. Two rows share
/// the activation's loads.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; the rows have one length and
/// `x` at least that many blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q5_k_q8_k_rows<const R: usize>(
    w: [&[BlockQ5_K]; R],
    x: &[BlockQ8_K],
) -> [f32; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0.0f32; R];
    let nb = w[0].len();
    for i in 0..nb {
        // SAFETY: i < nb <= x.len() and every w[r].len() (caller).
        let (bx, b) = unsafe { (x.get_unchecked(i), w.map(|r| r.get_unchecked(i))) };
        // The rows are adjacent in the matrix: one stream, the lines of R blocks 4 KiB ahead.
        let ahead = w[0].as_ptr().cast::<i8>().wrapping_add(4096 + R * 176 * i);
        for line in 0..(R * 176).div_ceil(64) {
            // A prefetch reads nothing architecturally and cannot fault, whatever the address
            // (`wrapping_add` keeps the pointer arithmetic itself defined).
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
        }
        let mut scales = [_mm256_setzero_si256(); R];
        let mut qh = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let dmin = -bx.d() * f16_le(b[r].dmin);
            // SAFETY: AVX2 is among this function's features.
            let sm = unsafe { k4_scales_mins_i16(&b[r].scales) };
            // SAFETY: as above.
            summs[r] = dmin.mul_add(unsafe { k4_min_sum(bx, sm) } as f32, summs[r]);
            scales[r] = _mm256_permute2x128_si256(sm, sm, 0x00);
            // SAFETY: `qh` is 32 readable bytes; unaligned load.
            qh[r] = unsafe { _mm256_loadu_si256(b[r].qh.as_ptr().cast()) };
        }
        let mut sumi = [_mm256_setzero_si256(); R];
        for c in 0..4 {
            // SAFETY: c < 4: `qs[64c..64c + 64]` is inside the 256 quants; unaligned loads.
            let (y_lo, y_hi) = unsafe {
                (
                    _mm256_loadu_si256(bx.qs.as_ptr().add(64 * c).cast()),
                    _mm256_loadu_si256(bx.qs.as_ptr().add(64 * c + 32).cast()),
                )
            };
            for r in 0..R {
                // SAFETY: c < 4: `qs[32c..32c + 32]` is inside the block; unaligned load.
                let q = unsafe { _mm256_loadu_si256(b[r].qs.as_ptr().add(32 * c).cast()) };
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                let bit_lo = _mm256_test_epi8_mask(qh[r], _mm256_set1_epi8(1 << (2 * c)));
                let bit_hi = _mm256_test_epi8_mask(qh[r], _mm256_set1_epi8(1 << (2 * c + 1)));
                let lo = _mm256_mask_add_epi8(lo, bit_lo, lo, sixteen);
                let hi = _mm256_mask_add_epi8(hi, bit_hi, hi, sixteen);
                // SAFETY: AVX2 is among this function's features.
                let (sc_lo, sc_hi) =
                    unsafe { (k4_scale(scales[r], 2 * c), k4_scale(scales[r], 2 * c + 1)) };
                // Pair sums at most 2 * 31 * 127 (i16, no saturation: the quantizer's
                // activations are -127..127, and 128 would give 7,936 too).
                let p_lo = _mm256_maddubs_epi16(lo, y_lo);
                let p_hi = _mm256_maddubs_epi16(hi, y_hi);
                sumi[r] = _mm256_dpwssd_epi32(sumi[r], p_lo, sc_lo);
                sumi[r] = _mm256_dpwssd_epi32(sumi[r], p_hi, sc_hi);
            }
        }
        for r in 0..R {
            let d = bx.d() * f16_le(b[r].d);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    // SAFETY: AVX2 is among this function's features.
    std::array::from_fn(|r| unsafe { hsum(acc[r]) } + summs[r])
}

/// How far ahead of a pair of rows' current block [`prefetch_pair`] asks for weight bytes.
const PAIR_PREFETCH_DISTANCE: usize = 4096;

/// Hints the CPU to fetch the two cache lines `PAIR_PREFETCH_DISTANCE` bytes after the bytes a
/// pair of adjacent rows (the first `row0`) has read by block `i`: the pair streams as one
/// sequential run, where a prefetch per row (two runs 1 row apart) halved the speed from
/// memory (Q8_0 on Zen 4: 11 against 25 GB/s). A block pair of at most 128 bytes is covered.
#[inline(always)]
fn prefetch_pair<T>(row0: &[T], i: usize) {
    let ahead = row0
        .as_ptr()
        .cast::<i8>()
        .wrapping_add(PAIR_PREFETCH_DISTANCE + 2 * std::mem::size_of::<T>() * i);
    // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the address
    // (`wrapping_add` keeps the pointer arithmetic itself defined).
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        if 2 * std::mem::size_of::<T>() > 64 {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        }
    }
}

/// How far ahead of a tile's current block [`prefetch_group`] asks for weight bytes.
const GROUP_PREFETCH_DISTANCE: usize = 4096;

/// Hints the CPU to fetch the bytes of block `i` of a group of `R` adjacent weight rows
/// starting at `row0`, [`GROUP_PREFETCH_DISTANCE`] ahead of the group's position in one
/// sequential stream: the tile reads the `R` rows side by side, which the hardware prefetchers
/// follow badly, while the group's bytes (and the next group's) are one contiguous range that
/// the tile crosses at `R` blocks per step. Rows that are not adjacent only waste the hint.
#[inline(always)]
fn prefetch_group<B, const R: usize>(row0: &[B], i: usize) {
    let step = R * std::mem::size_of::<B>();
    let ahead = row0
        .as_ptr()
        .cast::<i8>()
        .wrapping_add(GROUP_PREFETCH_DISTANCE + step * i);
    let mut at = 0;
    while at < step + 63 {
        // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the
        // address (`wrapping_add` keeps the pointer arithmetic itself defined).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at)) };
        at += 64;
    }
}

/// `T` (at most 4) Q8_1 activation rows' block scales as f32, for [`dot_q8_1_tile`]:
/// `out[i] = [d_0, d_1, d_2, d_3, s_0, s_1, s_2, s_3]` of block `i` (the f16 values converted
/// exactly; zero for tokens `T..4`), formed once per matrix call instead of once per weight row.
///
/// # Panics
/// If a row has fewer than `out.len()` blocks.
pub(super) fn q8_1_token_scales<const T: usize>(
    _: super::x86::Token,
    x: [&[BlockQ8_1]; T],
    out: &mut [[f32; 8]],
) {
    const { assert!(T <= 4) };
    assert!(
        x.iter().all(|r| r.len() >= out.len()),
        "activation row too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { q8_1_token_scales_impl(x, out) }
}

/// [`q8_1_token_scales`]: each block's 8 f16 scales gathered and widened by one F16C
/// conversion (exact, as the scalar one).
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has at least `out.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_token_scales_impl<const T: usize>(x: [&[BlockQ8_1]; T], out: &mut [[f32; 8]]) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut h = [0u16; 8];
        for t in 0..T {
            // SAFETY: i < out.len() <= x[t].len() (caller).
            let b = unsafe { x[t].get_unchecked(i) };
            h[t] = u16::from_le_bytes(b.d);
            h[4 + t] = u16::from_le_bytes(b.s);
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

/// Q4_1 . Q8_1 or Q5_1 . Q8_1 (`B`) of `R` weight rows (1 to 4) with `T` tokens (1 to 4):
/// `out[r][t]`, each bit-identical to the one-token AVX2 kernel's dot of row `r` with token `t`
/// (`avx2::dot_q4_1_q8_1`, `avx2_quants::dot_q5_1_q8_1`: the same f32 steps, Q5_1's quants with
/// their fifth bits added under the `qh` mask).
///
/// The one-token kernel keeps 8 lanes per (row, token), each `fma(d_w * d_x, sum, acc)` per
/// block, and `m_w * s_x` summed apart; both products are exact in f32 (two f16 significands
/// fit in 24 bits), so they may be formed anywhere. Here a block's `R x 4` products of each
/// kind are one 512-bit multiply (the tokens' scales come converted from
/// [`q8_1_token_scales`]); the `d` products go through a small stack buffer so that each
/// (row, token) `fma` takes its scale as a broadcast load (a load port, not a shuffle), and the
/// 4 activation blocks are loaded once for the `R` rows. Measured on SmolLM2's matrices (Zen 4)
/// against [`dot_q4_1_q8_1_x4`], one row at a time with the scales gathered per row: see
/// `bench_matvec_tokens4`.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `w[r].len()` equals
/// `w[0].len()`, and `x[t].len()` and `scales.len()` are at least that.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q8_1_tile<B, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8_1]; T],
    scales: &[[f32; 8]],
) -> [[f32; T]; R]
where
    B: WeightBlock<Act = BlockQ8_1>,
{
    // SAFETY: as this function's (the features are enabled here).
    unsafe { q8_1_tile_body::<B, R, T, false>(w, x, scales) }
}

/// [`dot_q8_1_tile`] splitting the nibbles with one GFNI `gf2p8affineqb` (the same bits).
///
/// # Safety
/// As [`dot_q8_1_tile`], and the CPU has GFNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
pub(super) unsafe fn dot_q8_1_tile_gfni<B, const R: usize, const T: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8_1]; T],
    scales: &[[f32; 8]],
) -> [[f32; T]; R]
where
    B: WeightBlock<Act = BlockQ8_1>,
{
    // SAFETY: as this function's (the features are enabled here).
    unsafe { q8_1_tile_body::<B, R, T, true>(w, x, scales) }
}

/// The 32 nibbles of a Q4 block as 32 unsigned bytes in element order, as [`nibbles`], from one
/// broadcast load: by GFNI's `gf2p8affineqb` with a bit matrix per half (`GFNI`), else by a
/// shift of the upper half under a mask and one `and`.
///
/// # Safety
/// AVX2 and AVX-512 BW and VL are present, and GFNI where `GFNI`.
#[inline(always)]
unsafe fn nibbles_split<const GFNI: bool>(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; `loadu` has no alignment requirement.
    let q = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(qs.as_ptr().cast()) });
    if GFNI {
        let matrix = _mm256_setr_epi64x(
            super::legacy_rows::LOW_NIBBLE,
            super::legacy_rows::LOW_NIBBLE,
            super::legacy_rows::HIGH_NIBBLE,
            super::legacy_rows::HIGH_NIBBLE,
        );
        _mm256_gf2p8affine_epi64_epi8::<0>(q, matrix)
    } else {
        _mm256_and_si256(
            _mm256_mask_srli_epi16::<4>(q, 0xFF00, q),
            _mm256_set1_epi8(0x0F),
        )
    }
}

/// The body of [`dot_q8_1_tile`]; `GFNI` picks the nibble split.
///
/// # Safety
/// As [`dot_q8_1_tile`] (and GFNI where `GFNI`).
#[inline(always)]
unsafe fn q8_1_tile_body<B, const R: usize, const T: usize, const GFNI: bool>(
    w: [&[B]; R],
    x: [&[BlockQ8_1]; T],
    scales: &[[f32; 8]],
) -> [[f32; T]; R]
where
    B: WeightBlock<Act = BlockQ8_1>,
{
    const { assert!(R >= 1 && R <= 4 && T >= 1 && T <= 4) };
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut acc_m = _mm512_setzero_ps();
    // Lane 4r + t of the products: row r's d (or m) times token t's.
    let idx_d = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    let idx_m = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    let nb = w[0].len();
    // The `d` products of a chunk of blocks, formed first: read back by a variable index, the
    // buffer stays in memory, so each `fma` takes its scale as a broadcast load (a load port)
    // instead of a shuffle, and the 16 accumulators keep their registers.
    const CHUNK: usize = 16;
    // Entry i - c0 is written before it is read (uninitialized: zeroing 1 KiB per call costs
    // more than a short row's work is worth).
    let mut pd = [std::mem::MaybeUninit::<[f32; 16]>::uninit(); CHUNK];
    for c0 in (0..nb).step_by(CHUNK) {
        let c1 = nb.min(c0 + CHUNK);
        for i in c0..c1 {
            prefetch_group::<B, R>(w[0], i);
            let dm: [i32; 4] = std::array::from_fn(|r| {
                if r < R {
                    // SAFETY: i < w[r].len() (caller).
                    let b = unsafe { w[r].get_unchecked(i) };
                    let (d, m) = b.dm();
                    (u32::from(d) | u32::from(m) << 16) as i32
                } else {
                    0
                }
            });
            // [d_0, m_0, d_1, m_1, ..] of the rows.
            let wdm =
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_setr_epi32(dm[0], dm[1], dm[2], dm[3])));
            // SAFETY: i < scales.len() (caller); each entry is 8 f32; loadu has no alignment
            // requirement.
            let (xd, xs) = unsafe {
                let sc = scales.get_unchecked(i).as_ptr();
                (
                    _mm512_broadcast_f32x4(_mm_loadu_ps(sc)),
                    _mm512_broadcast_f32x4(_mm_loadu_ps(sc.add(4))),
                )
            };
            let p = _mm512_mul_ps(_mm512_permutexvar_ps(idx_d, wdm), xd);
            acc_m = _mm512_add_ps(acc_m, _mm512_mul_ps(_mm512_permutexvar_ps(idx_m, wdm), xs));
            // SAFETY: i - c0 < CHUNK; each entry is 16 f32; storeu has no alignment requirement.
            unsafe { _mm512_storeu_ps(pd.get_unchecked_mut(i - c0).as_mut_ptr().cast(), p) };
        }
        for i in c0..c1 {
            // SAFETY: i < x[t].len() (caller).
            let y = x.map(|r| unsafe { load_q8(&r.get_unchecked(i).qs) });
            // SAFETY: i - c0 < CHUNK, and entry i - c0 was written by the loop above.
            let p = unsafe { pd.get_unchecked(i - c0).assume_init_ref() };
            for r in 0..R {
                // SAFETY: i < w[r].len() (caller).
                let b = unsafe { w[r].get_unchecked(i) };
                // SAFETY: the features are the caller's.
                let n = unsafe { nibbles_split::<GFNI>(b.qs()) };
                let q = if B::FIFTH_BITS {
                    _mm256_mask_add_epi8(n, b.qh(), n, _mm256_set1_epi8(16))
                } else {
                    n
                };
                for t in 0..T {
                    let prod = _mm256_dpbusd_epi32(zero, q, y[t]);
                    // SAFETY: 4r + t < 16.
                    let d = unsafe { _mm256_broadcast_ss(p.get_unchecked(4 * r + t)) };
                    acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[r][t]);
                }
            }
        }
    }
    let mut m = [0.0f32; 16];
    // SAFETY: `m` has 16 f32; storeu has no alignment requirement.
    unsafe { _mm512_storeu_ps(m.as_mut_ptr(), acc_m) };
    // SAFETY: AVX2 is among this function's features.
    std::array::from_fn(|r| std::array::from_fn(|t| unsafe { hsum(acc[r][t]) } + m[4 * r + t]))
}

/// The tile kernels of weights whose quants are `u - B` for unsigned bytes `u` (Q5_0: its 5-bit
/// quants with B = 16; Q8_0 would be `q ^ 0x80` with B = 128), times Q8_0 activations, as
/// [`dot_q8_1_tile`]: `vpdpbusd` takes the unsigned `u`, and each (row, token) sum starts
/// from `-B * sum(y)` of its four elements, formed once per token and block for all rows (exact:
/// every i32 lane stays within 4 * 255 * 128). `dx[i][t]` is token `t`'s scale of block `i`
/// (`avx2::q8_0_token_scales`).
///
/// The tiles prefetch their group of rows as one stream ([`prefetch_group`]): with a hint per
/// row and block instead, the Q8_0 tile was 1.4x faster than the AVX2 kernels in cache but
/// 1.2x slower streamed from memory; with the group's stream it is 1.6x faster both ways (4
/// tokens on SmolLM2's 30 MB output head, Zen 4: 0.54 against 0.86 ns per row, block and
/// token).
macro_rules! biased_tile {
    ($(#[$doc:meta])* $name:ident, $block:ty, $bias:expr, |$b:ident| $unsigned:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the features of [`super::x86::avx512_detected`]; every `w[r].len()`
        /// equals `w[0].len()`, and `x[t].len()` and `dx.len()` are at least that.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(super) unsafe fn $name<const R: usize, const T: usize>(
            w: [&[$block]; R],
            x: [&[BlockQ8_0]; T],
            dx: &[[f32; 4]],
        ) -> [[f32; T]; R] {
            const { assert!(R >= 1 && R <= 4 && T >= 1 && T <= 4) };
            let zero = _mm256_setzero_si256();
            let bias = _mm256_set1_epi8($bias);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            // Lane 4r + t of the products: row r's d times token t's.
            let idx_d = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            let nb = w[0].len();
            // As in `dot_q8_1_tile`: the products of a chunk of blocks first, read back
            // as broadcast loads.
            const CHUNK: usize = 16;
            let mut pd = [std::mem::MaybeUninit::<[f32; 16]>::uninit(); CHUNK];
            for c0 in (0..nb).step_by(CHUNK) {
                let c1 = nb.min(c0 + CHUNK);
                for i in c0..c1 {
                    prefetch_group::<$block, R>(w[0], i);
                    let d: [i16; 4] = std::array::from_fn(|r| {
                        if r < R {
                            // SAFETY: i < w[r].len() (caller).
                            let b = unsafe { w[r].get_unchecked(i) };
                            i16::from_le_bytes(b.d)
                        } else {
                            0
                        }
                    });
                    let wd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_setr_epi16(
                        d[0], d[1], d[2], d[3], 0, 0, 0, 0,
                    )));
                    // SAFETY: i < dx.len() (caller); 4 readable f32; loadu needs no alignment.
                    let xd = unsafe {
                        _mm512_broadcast_f32x4(_mm_loadu_ps(dx.get_unchecked(i).as_ptr()))
                    };
                    let p = _mm512_mul_ps(_mm512_permutexvar_ps(idx_d, wd), xd);
                    // SAFETY: i - c0 < CHUNK; each entry is 16 f32; storeu has no alignment
                    // requirement.
                    unsafe {
                        _mm512_storeu_ps(pd.get_unchecked_mut(i - c0).as_mut_ptr().cast(), p)
                    };
                }
                for i in c0..c1 {
                    // SAFETY: i < x[t].len() (caller); AVX2 is among this function's features.
                    let y = x.map(|r| unsafe { load_q8(&r.get_unchecked(i).qs) });
                    let start =
                        y.map(|y| _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, y)));
                    // SAFETY: i - c0 < CHUNK, and entry i - c0 was written by the loop above.
                    let p = unsafe { pd.get_unchecked(i - c0).assume_init_ref() };
                    for r in 0..R {
                        // SAFETY: i < w[r].len() (caller).
                        let $b = unsafe { w[r].get_unchecked(i) };
                        // SAFETY: AVX2 is among this function's features.
                        let u = unsafe { $unsigned };
                        for t in 0..T {
                            let prod = _mm256_dpbusd_epi32(start[t], u, y[t]);
                            // SAFETY: 4r + t < 16.
                            let d = unsafe { _mm256_broadcast_ss(p.get_unchecked(4 * r + t)) };
                            acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod), acc[r][t]);
                        }
                    }
                }
            }
            // SAFETY: AVX2 is among this function's features.
            std::array::from_fn(|r| std::array::from_fn(|t| unsafe { hsum(acc[r][t]) }))
        }
    };
}

biased_tile!(
    /// Q5_0 . Q8_0 of `R` weight rows (1 to 4) with `T` tokens (1 to 4) (see `biased_tile`):
    /// `out[r][t]` bit-identical to the one-token AVX2 kernel's dot (its lanes are exact for
    /// every activation).
    dot_q5_0_q8_0_tile,
    BlockQ5_0,
    16,
    |b| q5_quants_masked(&b.qh, &b.qs)
);

biased_tile!(
    /// Q8_0 . Q8_0 of `R` weight rows (1 to 4) with `T` tokens (1 to 4) (see `biased_tile`):
    /// the weight quants as `(q ^ 0x80) - 128`. `out[r][t]` bit-identical to the one-token AVX2
    /// kernel's dot where that kernel's sign trick is exact (no activation quant is -128).
    dot_q8_0_q8_0_tile,
    BlockQ8_0,
    -128i8,
    |b| _mm256_xor_si256(load_q8(&b.qs), _mm256_set1_epi8(-128i8))
);

/// [`q5_quants`] with the fifth bits added under a mask (`qh` as the byte mask): two
/// instructions instead of six.
#[inline(always)]
unsafe fn q5_quants_masked(qh: &[u8; 4], qs: &[u8; 16]) -> __m256i {
    // SAFETY: AVX2 is among the caller's features.
    let n = unsafe { nibbles(qs) };
    _mm256_mask_add_epi8(n, u32::from_le_bytes(*qh), n, _mm256_set1_epi8(16))
}

/// Q4_1 . Q8_1 of one weight row with 4 tokens, two per 512-bit register.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
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

/// Q5_1 . Q8_1 of one weight row with 4 tokens, two per 512-bit register: as
/// [`dot_q4_1_q8_1_x4`] with the 5-bit quants (0..31; `vpdpbusd` sums four `q * y` products
/// exactly). Each token's f32 operations are the AVX2 one-token kernel's.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q5_1_q8_1_x4(w: &[BlockQ5_1], x: [&[BlockQ8_1]; 4]) -> [f32; 4] {
    let zero = _mm512_setzero_si512();
    let (mut acc01, mut acc23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut acc_m = _mm256_setzero_ps();
    // Lanes of `p` holding d_w*d_x of tokens (0, 1) and (2, 3), each spread over 8 lanes.
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    let idx23 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { q5_quants(&bw.qh, &bw.qs) };
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

/// Q5_0 . Q8_0 of one weight row with 4 tokens, two per 512-bit register. `vpdpbusd` takes an
/// unsigned left operand, so the activations are biased instead of the weights: `(y + 128)`
/// (`xor 0x80`) times the signed `q - 16`, each lane starting at `-128 * sum(q - 16)` of its
/// four weights, which depends on the weights only and is formed once per block for all tokens.
/// Every lane is the exact `sum (q - 16) * y` (at most 4 * 255 * 16 in magnitude before the
/// offset), so each token's f32 operations are the AVX2 one-token kernel's.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q5_0_q8_0_x4(w: &[BlockQ5_0], x: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    let zero = _mm512_setzero_si512();
    let sixteen = _mm512_set1_epi8(16);
    let bias = _mm512_set1_epi8(-128);
    let (mut acc01, mut acc23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let idx23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { q5_quants(&bw.qh, &bw.qs) };
        let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
        let signed = _mm512_sub_epi8(qq, sixteen);
        // 128 * sum(16 - q) per lane (`bias` read as unsigned 128).
        let start = _mm512_dpbusd_epi32(zero, bias, _mm512_sub_epi8(sixteen, qq));
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let dw = _mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
        let xd = bx.map(|b| i16::from_le_bytes(b.d));
        let dx = _mm_cvtph_ps(_mm_setr_epi16(xd[0], xd[1], xd[2], xd[3], 0, 0, 0, 0));
        // [d_w*d_x0, .., d_w*d_x3]: each lane the one-token product.
        let d = _mm512_castps128_ps512(_mm_mul_ps(dw, dx));
        let y01 = _mm512_xor_si512(load_q8_pair(&bx[0].qs, &bx[1].qs), bias);
        let y23 = _mm512_xor_si512(load_q8_pair(&bx[2].qs, &bx[3].qs), bias);
        let prod01 = _mm512_dpbusd_epi32(start, y01, signed);
        let prod23 = _mm512_dpbusd_epi32(start, y23, signed);
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

/// [`dot_q5_0_q8_0_x4`] for `R` weight rows (1 or 2) and 8 tokens (prefill): each weight block
/// is unpacked (quants, `q - 16`, the lanes' starting offsets, `d_w`) once for 8 tokens, and each
/// token's biased activation block is loaded once for the `R` rows, so that per pair of tokens
/// and row only the `vpdpbusd`, the conversion, the scale's broadcast and the `fma` remain.
/// Every lane sees the one-token kernel's sequence of operations: results are bit-identical
/// to [`dot_q5_0_q8_0_x4`] and to the AVX2 one-token kernel.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len()` is at least
/// every `w[r].len()`, and the `w[r]` have one length.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q5_0_q8_0_x8<const R: usize>(
    w: [&[BlockQ5_0]; R],
    x: [&[BlockQ8_0]; 8],
) -> [[f32; 8]; R] {
    let zero = _mm512_setzero_si512();
    let sixteen = _mm512_set1_epi8(16);
    let bias = _mm512_set1_epi8(-128);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    // Lanes of the 8 scale products holding tokens (2p, 2p + 1), each spread over 8 lanes.
    let idx = [
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
        _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7),
    ];
    let nb = if R == 0 { 0 } else { w[0].len() };
    for i in 0..nb {
        let mut xd = [0i16; 8];
        let mut y = [zero; 4];
        for p in 0..4 {
            // SAFETY: i < nb <= x[t].len() (caller).
            let (a, b) = unsafe { (x[2 * p].get_unchecked(i), x[2 * p + 1].get_unchecked(i)) };
            xd[2 * p] = i16::from_le_bytes(a.d);
            xd[2 * p + 1] = i16::from_le_bytes(b.d);
            y[p] = _mm512_xor_si512(load_q8_pair(&a.qs, &b.qs), bias);
        }
        let dx = _mm256_cvtph_ps(_mm_setr_epi16(
            xd[0], xd[1], xd[2], xd[3], xd[4], xd[5], xd[6], xd[7],
        ));
        for r in 0..R {
            // SAFETY: i < nb = w[r].len() (caller: the rows have one length).
            let bw = unsafe { w[r].get_unchecked(i) };
            // SAFETY: AVX2 is among this function's features.
            let q = unsafe { q5_quants(&bw.qh, &bw.qs) };
            let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
            let signed = _mm512_sub_epi8(qq, sixteen);
            // 128 * sum(16 - q) per lane (`bias` read as unsigned 128).
            let start = _mm512_dpbusd_epi32(zero, bias, _mm512_sub_epi8(sixteen, qq));
            let dw = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
            // [d_w*d_x0, .., d_w*d_x7]: each lane the one-token product.
            let d = _mm512_castps256_ps512(_mm256_mul_ps(dw, dx));
            for p in 0..4 {
                let prod = _mm512_dpbusd_epi32(start, y[p], signed);
                acc[r][p] = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(idx[p], d),
                    _mm512_cvtepi32_ps(prod),
                    acc[r][p],
                );
            }
        }
    }
    let mut out = [[0.0f32; 8]; R];
    for r in 0..R {
        for p in 0..4 {
            let (a, b) = hsum_pair(acc[r][p]);
            out[r][2 * p] = a;
            out[r][2 * p + 1] = b;
        }
    }
    out
}

/// Q8_0 . Q8_0 of `R` weight rows and 8 tokens (prefill), in the layout of
/// [`dot_q5_0_q8_0_x8`]: the weights biased by 128 (`xor 0x80`, unsigned for `vpdpbusd`) once
/// per block for 8 tokens, each lane starting at `-128 * sum(y)` of its four activations, formed
/// once per block and token for all `R` rows. Every lane is the exact sum of its four `w * y`
/// (each biased product at most 255 * 128 in magnitude), ggml's lane, so each token's f32
/// operations are the AVX2 one-token kernel's: bit-identical to it.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len()` is at least
/// every `w[r].len()`, and the `w[r]` have one length.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q8_0_q8_0_x8<const R: usize>(
    w: [&[BlockQ8_0]; R],
    x: [&[BlockQ8_0]; 8],
) -> [[f32; 8]; R] {
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(i8::MIN);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    // Lanes of the 8 scale products holding tokens (2p, 2p + 1), each spread over 8 lanes.
    let idx = [
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
        _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7),
    ];
    let nb = if R == 0 { 0 } else { w[0].len() };
    for i in 0..nb {
        let mut xd = [0i16; 8];
        let mut y = [zero; 4];
        let mut start = [zero; 4];
        for p in 0..4 {
            // SAFETY: i < nb <= x[t].len() (caller).
            let (a, b) = unsafe { (x[2 * p].get_unchecked(i), x[2 * p + 1].get_unchecked(i)) };
            xd[2 * p] = i16::from_le_bytes(a.d);
            xd[2 * p + 1] = i16::from_le_bytes(b.d);
            y[p] = load_q8_pair(&a.qs, &b.qs);
            // -128 * sum(y) per lane (`bias` read as unsigned 128; at most 4 * 128 * 128).
            start[p] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, y[p]));
        }
        let dx = _mm256_cvtph_ps(_mm_setr_epi16(
            xd[0], xd[1], xd[2], xd[3], xd[4], xd[5], xd[6], xd[7],
        ));
        for r in 0..R {
            // SAFETY: i < nb = w[r].len() (caller: the rows have one length).
            let bw = unsafe { w[r].get_unchecked(i) };
            let ww = _mm512_xor_si512(load_q8_pair(&bw.qs, &bw.qs), bias);
            let dw = _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bw.d)));
            // [d_w*d_x0, .., d_w*d_x7]: each lane the one-token product.
            let d = _mm512_castps256_ps512(_mm256_mul_ps(dw, dx));
            for p in 0..4 {
                let prod = _mm512_dpbusd_epi32(start[p], ww, y[p]);
                acc[r][p] = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(idx[p], d),
                    _mm512_cvtepi32_ps(prod),
                    acc[r][p],
                );
            }
        }
    }
    let mut out = [[0.0f32; 8]; R];
    for r in 0..R {
        for p in 0..4 {
            let (a, b) = hsum_pair(acc[r][p]);
            out[r][2 * p] = a;
            out[r][2 * p + 1] = b;
        }
    }
    out
}

/// [`dot_q4_1_q8_1_x4`] for 8 tokens: the nibbles and the weight scales of each block are
/// unpacked once for 8 tokens instead of 4; every lane sees the one-token sequence.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q4_1_q8_1_x8(w: &[BlockQ4_1], x: [&[BlockQ8_1]; 8]) -> [f32; 8] {
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); 4];
    let (mut acc_m_lo, mut acc_m_hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    let idx23 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(&bw.qs) };
        let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
        let dm = f16_pairs([[bw.d[0], bw.d[1], bw.m[0], bw.m[1]]; 4]);
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx: [&BlockQ8_1; 8] = [
            unsafe { x[0].get_unchecked(i) },
            unsafe { x[1].get_unchecked(i) },
            unsafe { x[2].get_unchecked(i) },
            unsafe { x[3].get_unchecked(i) },
            unsafe { x[4].get_unchecked(i) },
            unsafe { x[5].get_unchecked(i) },
            unsafe { x[6].get_unchecked(i) },
            unsafe { x[7].get_unchecked(i) },
        ];
        let ds = |b: &BlockQ8_1| [b.d[0], b.d[1], b.s[0], b.s[1]];
        // [d_w*d_x, m_w*s_x] per token, tokens 0..4 and 4..8: the one-token products.
        let p_lo = _mm256_mul_ps(dm, f16_pairs([ds(bx[0]), ds(bx[1]), ds(bx[2]), ds(bx[3])]));
        let p_hi = _mm256_mul_ps(dm, f16_pairs([ds(bx[4]), ds(bx[5]), ds(bx[6]), ds(bx[7])]));
        acc_m_lo = _mm256_add_ps(acc_m_lo, p_lo);
        acc_m_hi = _mm256_add_ps(acc_m_hi, p_hi);
        for (h, p) in [(0usize, p_lo), (2, p_hi)] {
            let p512 = _mm512_castps256_ps512(p);
            let t = 2 * h;
            let prod01 = _mm512_dpbusd_epi32(zero, qq, load_q8_pair(&bx[t].qs, &bx[t + 1].qs));
            let prod23 = _mm512_dpbusd_epi32(zero, qq, load_q8_pair(&bx[t + 2].qs, &bx[t + 3].qs));
            acc[h] = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(idx01, p512),
                _mm512_cvtepi32_ps(prod01),
                acc[h],
            );
            acc[h + 1] = _mm512_fmadd_ps(
                _mm512_permutexvar_ps(idx23, p512),
                _mm512_cvtepi32_ps(prod23),
                acc[h + 1],
            );
        }
    }
    let (mut m_lo, mut m_hi) = ([0.0f32; 8], [0.0f32; 8]);
    // SAFETY: both have 8 f32; storeu has no alignment requirement.
    unsafe {
        _mm256_storeu_ps(m_lo.as_mut_ptr(), acc_m_lo);
        _mm256_storeu_ps(m_hi.as_mut_ptr(), acc_m_hi);
    }
    let (s0, s1) = hsum_pair(acc[0]);
    let (s2, s3) = hsum_pair(acc[1]);
    let (s4, s5) = hsum_pair(acc[2]);
    let (s6, s7) = hsum_pair(acc[3]);
    [
        s0 + m_lo[1],
        s1 + m_lo[3],
        s2 + m_lo[5],
        s3 + m_lo[7],
        s4 + m_hi[1],
        s5 + m_hi[3],
        s6 + m_hi[5],
        s7 + m_hi[7],
    ]
}

/// Q4_0 . Q8_0 of one weight row with 4 tokens, two per 512-bit register.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
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

/// Q6_K . Q8_K of one weight row with `N` tokens, each token's lanes computed over 64 elements
/// (two 32-element chunks) per 512-bit register: the even chunk's 8 lanes in the low half, the
/// odd chunk's in the high half, added at the end of the block. `vpdpwssd` multiplies the
/// `maddubs` pair sums by the sub-block scales and accumulates in one instruction. The lanes are
/// the AVX2 kernel's exact integers (see `avx2_quants.rs` for the bounds: nothing saturates),
/// and the f32 operations per token are its `fma(d_x * d_w, lane, acc)` and `hsum`, so the
/// results are its bits.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q6_k_q8_k_xn<const N: usize>(
    w: &[BlockQ6_K],
    x: [&[BlockQ8_K]; N],
) -> [f32; N] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // qh bit pairs 0 / 1 (chunks 4h, 4h + 1) to bits 4..6 of each byte, and 2 / 3.
    let shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    let shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    // Word indices picking sub-block scales 4j..4j + 4, 8 copies each, from the 16 scales.
    let sc_idx: [__m512i; 4] = std::array::from_fn(|j| {
        let j = j as i16;
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_setr_m128i(
                _mm_set1_epi16(4 * j),
                _mm_set1_epi16(4 * j + 1),
            )),
            _mm256_setr_m128i(_mm_set1_epi16(4 * j + 2), _mm_set1_epi16(4 * j + 3)),
            1,
        )
    });
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, bw) in w.iter().enumerate() {
        if N == 1 {
            // Decode streams the weights once: the lines of the block 16 blocks ahead (Q6_K
            // blocks are 210 bytes, so about 3.3 lines each), spread over the loop.
            let ahead = (bw as *const BlockQ6_K).cast::<u8>().wrapping_add(16 * 210);
            for line in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
        }
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let dw = f16_le(bw.d);
        // SAFETY: `scales` is 16 readable bytes; loadu has no alignment requirement.
        let sc16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(bw.scales.as_ptr().cast()) });
        let sc512 = _mm512_castsi256_si512(sc16);
        // The offset `-32 * (bsum(2i) * sc[2i] + bsum(2i + 1) * sc[2i + 1])` starts lane `i`
        // of the even chunks' accumulator: one `madd` with `-32 * sc` (at most 4096: fits i16;
        // the pair sum at most 2 * 32768 * 4096 fits i32).
        let neg_sc32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
        // Chunk pairs (4h, 4h + 1) and (4h + 2, 4h + 3) accumulate apart: two short
        // `vpdpwssd` dependency chains instead of one long one.
        let mut sumi01 = bx.map(|b| {
            // SAFETY: `bsums` is 16 little-endian i16 (32 bytes), as x86 loads them; loadu has
            // no alignment requirement.
            let bsums = unsafe { _mm256_loadu_si256(b.bsums.as_ptr().cast()) };
            _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, neg_sc32))
        });
        let mut sumi23 = [_mm512_setzero_si512(); N];
        for h in 0..2 {
            // SAFETY: h < 2, so `ql[64h..64h + 64]` and `qh[32h..32h + 32]` are inside the
            // block; loadu has no alignment requirement.
            let (ql, qh) = unsafe {
                (
                    _mm512_loadu_si512(bw.ql.as_ptr().add(64 * h).cast()),
                    _mm256_loadu_si256(bw.qh.as_ptr().add(32 * h).cast()),
                )
            };
            let qhh = _mm512_broadcast_i64x4(qh);
            // Chunks (4h, 4h + 1) and (4h + 2, 4h + 3) as unsigned `q + 32`.
            let q01 = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_and_si512(_mm512_sllv_epi16(qhh, shl01), m30),
            );
            let q23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                _mm512_and_si512(_mm512_srlv_epi16(qhh, shr23), m30),
            );
            let sc01 = _mm512_permutexvar_epi16(sc_idx[2 * h], sc512);
            let sc23 = _mm512_permutexvar_epi16(sc_idx[2 * h + 1], sc512);
            for t in 0..N {
                // SAFETY: h < 2, so `qs[128h..128h + 128]` is inside the 256 quants; loadu has
                // no alignment requirement.
                let (y01, y23) = unsafe {
                    let p = bx[t].qs.as_ptr().add(128 * h);
                    (
                        _mm512_loadu_si512(p.cast()),
                        _mm512_loadu_si512(p.add(64).cast()),
                    )
                };
                sumi01[t] = _mm512_dpwssd_epi32(sumi01[t], _mm512_maddubs_epi16(q01, y01), sc01);
                sumi23[t] = _mm512_dpwssd_epi32(sumi23[t], _mm512_maddubs_epi16(q23, y23), sc23);
            }
        }
        for t in 0..N {
            let s = _mm512_add_epi32(sumi01[t], sumi23[t]);
            let lanes =
                _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            let d = bx[t].d() * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    // SAFETY: AVX2 is among this function's features.
    acc.map(|a| unsafe { hsum(a) })
}

/// Q5_K . Q8_K of one weight row with `N` tokens, each token's sub-blocks `2c` and `2c + 1`
/// (64 consecutive elements) in one 512-bit register: the nibbles of `qs[32c..32c + 32]` in
/// both halves (low, high), the fifth bit added under a byte mask from `qh`, `vpdpwssd` with the
/// two sub-block scales. The lanes are the AVX2 kernel's exact integers and the f32 operations
/// per token its `fma`s, `hsum` and min sum, so the results are its bits.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t].len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_q5_k_q8_k_xn<const N: usize>(
    w: &[BlockQ5_K],
    x: [&[BlockQ8_K]; N],
) -> [f32; N] {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    // Low half: low nibbles (sub-block 2c); high half: high nibbles (2c + 1).
    let nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = [0.0f32; N];
    for (i, bw) in w.iter().enumerate() {
        // SAFETY: i < w.len() <= x[t].len() (caller).
        let bx = x.map(|r| unsafe { r.get_unchecked(i) });
        let (dw, mw) = (f16_le(bw.d), f16_le(bw.dmin));
        // SAFETY: AVX2 is among this function's features.
        let sm = unsafe { k4_scales_mins_i16(&bw.scales) };
        for t in 0..N {
            let dmin = -bx[t].d() * mw;
            // SAFETY: AVX2 is among this function's features.
            summs[t] = dmin.mul_add(unsafe { k4_min_sum(bx[t], sm) } as f32, summs[t]);
        }
        let sm512 = _mm512_castsi256_si512(sm);
        // SAFETY: `qh` is 32 readable bytes; loadu has no alignment requirement.
        let qhh = _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(bw.qh.as_ptr().cast()) });
        let mut sumi = [[_mm512_setzero_si512(); N]; 2];
        for c in 0..4 {
            // SAFETY: c < 4, so `qs[32c..32c + 32]` is inside the block; loadu has no alignment
            // requirement.
            let qs = _mm512_broadcast_i64x4(unsafe {
                _mm256_loadu_si256(bw.qs.as_ptr().add(32 * c).cast())
            });
            let nib = _mm512_and_si512(_mm512_srlv_epi16(qs, nibble_shift), m4);
            let bits = _mm512_inserti64x4(
                _mm512_set1_epi8(1 << (2 * c)),
                _mm256_set1_epi8(1 << (2 * c + 1)),
                1,
            );
            let q = _mm512_mask_add_epi8(nib, _mm512_test_epi8_mask(qhh, bits), nib, sixteen);
            let c16 = 2 * c as i16;
            let idx = _mm512_inserti64x4(_mm512_set1_epi16(c16), _mm256_set1_epi16(c16 + 1), 1);
            let sc = _mm512_permutexvar_epi16(idx, sm512);
            for t in 0..N {
                // SAFETY: c < 4, so `qs[64c..64c + 64]` is inside the 256 quants; loadu has no
                // alignment requirement.
                let y = unsafe { _mm512_loadu_si512(bx[t].qs.as_ptr().add(64 * c).cast()) };
                let s = &mut sumi[c % 2][t];
                *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(q, y), sc);
            }
        }
        for t in 0..N {
            let s = _mm512_add_epi32(sumi[0][t], sumi[1][t]);
            let lanes =
                _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            let d = bx[t].d() * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    // SAFETY: AVX2 is among this function's features.
    std::array::from_fn(|t| unsafe { hsum(acc[t]) } + summs[t])
}
