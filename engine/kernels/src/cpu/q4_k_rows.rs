//! Q4_K · Q8_K in the order of llama.cpp's repacked kernels (`ggml_gemv_q4_K_8x8_q8_K` /
//! `ggml_gemm_q4_K_8x8_q8_K`, see `repack.rs`), eight weight rows at a time with AVX-512 VL +
//! VNNI on 256-bit registers: row r of the group lives in 32-bit lane r of every register, as
//! in llama.cpp's repacked layout, so no horizontal sum is needed anywhere. CPUs with AVX2 but
//! no AVX-512 VNNI run the same 8-row groups with `maddubs` and `madd` in place of `vpdpbusd`
//! and `vpmulld` ([`matvec_q4_k_avx2`], for prefill and sessions decoding together).
//!
//! The weights stay where they are (memory-mapped, one row after another): per 32-byte chunk
//! of `qs`, the 8 rows' dwords are transposed in registers (two 4x4 dword transposes within the
//! 128-bit halves, rows r and r + 4 sharing a register), so register `T_j` holds dword j of
//! every row; that work is shared by all tokens. Per token, `vpdpbusd` of `T_j`'s nibbles with
//! the token's 4 activations of dword j broadcast gives every row's exact sub-block dot; the
//! per-row sub-block scales are applied with `vpmulld` (the products and their sums are exact
//! in i32: at most 8 * 63 * 32 * 15 * 128 in magnitude), the mins with `vpdpwssd` of each row's
//! `(m_k, m_k)` against the token's `(bsum_2k, bsum_2k+1)` pair. The float work per lane is then
//! exactly `repack::q4_k_body`'s: `acc = fma(isum, d * dx, acc)`,
//! `acc_min = fma(mins, dmin * dx, acc_min)`, result `acc - acc_min`, so every (row, token)
//! result is bit-identical to the one-row kernels.
//!
//! Decode (one token) does not use the groups: [`dot_q4_k_q8_k_row`] computes the same bits one
//! row at a time, reading the matrix front to back with prefetches spread over its loop. The
//! weights then stream from memory as one sequential run per thread; the 16-row groups,
//! which need a burst of prefetches for the next group's 18 KiB, kept less in flight (on the
//! 1.1B Q4_K_M model, 28 tok/s with groups, 34 with rows).
//!
//! The one-row pieces this file shares with `repack.rs`'s AVX2 kernel (the prefetch ahead, the
//! scale and min unpacking, the per-block float step) live in `x86.rs`; this file uses
//! `repack.rs` (its portable order is the reference, and its AVX2 kernel computes the rows left
//! over after the groups), never the reverse.

use std::arch::x86_64::*;

use super::q4_k::BlockQ4_K;
use super::q8_k::BlockQ8_K;
use super::x86::{
    accumulate_block, min_pairs, prefetch_row_ahead, row_result, scales_mins_words, Token,
};

/// 16 bytes at `lo` in the low 128-bit half and 16 bytes at `hi` in the high half.
///
/// # Safety
/// 16 readable bytes at each pointer.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_2x16(lo: *const u8, hi: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at each (caller); `loadu` has no alignment requirement.
    let (l, h) = unsafe { (_mm_loadu_si128(lo.cast()), _mm_loadu_si128(hi.cast())) };
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l), h)
}

/// Within each 128-bit half, the 4x4 transpose of dwords: from `v[r]` = [row r | row r + 4]
/// (4 dwords each) to `out[j]` = [dword j of rows 0..3 | dword j of rows 4..7].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_4x4(v: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Dword j (0..4) of the 16 bytes at offset `o` of every block, rows 0..7 in the lanes.
///
/// # Safety
/// 16 readable bytes at offset `o` of each block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dwords8(b: &[*const u8; 8], o: usize) -> [__m256i; 4] {
    // SAFETY: as the caller's.
    unsafe {
        transpose_4x4([
            load_2x16(b[0].add(o), b[4].add(o)),
            load_2x16(b[1].add(o), b[5].add(o)),
            load_2x16(b[2].add(o), b[6].add(o)),
            load_2x16(b[3].add(o), b[7].add(o)),
        ])
    }
}

/// The dword at `p` in every lane.
///
/// # Safety
/// 4 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast_dword(p: *const u8) -> __m256i {
    // SAFETY: 4 readable bytes (caller); `read_unaligned` has no alignment requirement.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// `sum_k madd(m[k], bsums pair k)`: per lane, 8 pairs of i16 weights (lane r: row r's pair
/// `k` in `m[k]`) times the activation's 16 `bsums` taken in pairs (pair `k` = `bsums[2k]`,
/// `bsums[2k + 1]`, broadcast): the mins term of the AVX2 Q4_K rows, the bias correction of
/// the Q6_K rows (`q6_k_rows.rs`). Exact: integer products and sums.
///
/// # Safety
/// AVX2 is present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bsum_pairs_dot(m: &[__m256i; 8], bx: &BlockQ8_K) -> __m256i {
    let bs = bx.bsums.as_ptr().cast::<u8>();
    let mut sum = _mm256_setzero_si256();
    for (k, mk) in m.iter().enumerate() {
        // SAFETY: 4k + 4 <= 32 bytes of bsums (16 i16).
        let pair = unsafe { broadcast_dword(bs.add(4 * k)) };
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(*mk, pair));
    }
    sum
}

/// `pshufb` controls that take byte `k` of every dword: into byte 0 (zero-extended to the
/// dword) when `pair` is false, into bytes 0 and 2 (two zero-extended i16) when it is true.
fn byte_select(k: usize, pair: bool) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    for d in 0..8 {
        let src = (4 * (d % 4) + k) as u8;
        c[4 * d] = src;
        if pair {
            c[4 * d + 2] = src;
        }
    }
    c
}

/// ggml's unpacking of the 6-bit scales and mins (`get_scale_min_k4`, 4 at a time) for 8 rows
/// in the lanes: from the three scale u32s of each row (`u[i]` lane r = `scales[4i..4i + 4]`
/// of row r) to `[sc_lo, sc_hi, m_lo, m_hi]`, whose bytes are scales 0..3, scales 4..7, mins
/// 0..3 and mins 4..7 of each row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales_mins_lanes(u: [__m256i; 3]) -> [__m256i; 4] {
    let (k1, k2, k3) = (
        _mm256_set1_epi32(0x3f3f_3f3f),
        _mm256_set1_epi32(0x0f0f_0f0f),
        _mm256_set1_epi32(0x0303_0303),
    );
    let [u0, u1, u2] = u;
    // (Written out, not through a closure: a closure need not be inlined with the features.)
    let high0 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u0), k3));
    let high1 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), k3));
    [
        _mm256_and_si256(u0, k1),
        _mm256_or_si256(_mm256_and_si256(u2, k2), high0),
        _mm256_and_si256(u1, k1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), k2), high1),
    ]
}

/// Rows 8 at a time, `N` tokens: `out[t][r]` = row r with token t, as [`super::repack`]'s
/// one-row order.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; every `x[t]` has `x[0].len()`
/// blocks and every `w[r]` at least that many.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows8_impl<const N: usize>(w: [&[BlockQ4_K]; 8], x: [&[BlockQ8_K]; N]) -> [[f32; 8]; N] {
    let nb = x[0].len();
    let m4 = _mm256_set1_epi8(0x0F);
    let load_ctrl = |c: [u8; 32]| {
        // SAFETY: `c` is 32 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
    };
    let sel: [__m256i; 4] = std::array::from_fn(|k| load_ctrl(byte_select(k, false)));
    let sel_pair: [__m256i; 4] = std::array::from_fn(|k| load_ctrl(byte_select(k, true)));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        // SAFETY: i < nb <= w[r].len() (caller): each pointer is a whole 144-byte block.
        let b: [*const u8; 8] = std::array::from_fn(|r| unsafe { w[r].as_ptr().add(i).cast() });
        // SAFETY: as above, for x[t].
        let bx: [&BlockQ8_K; N] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(i) });
        // Bytes 0..16 of each block: d, dmin, scales[0..12]. Lane r of h[0] = d | dmin << 16,
        // of h[1..4] = the scales' three u32.
        // SAFETY: each block has 144 readable bytes.
        // SAFETY: each block has 144 readable bytes.
        let h = unsafe { dwords8(&b, 0) };
        let dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(h[0]));
        let dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(h[0])));
        // ggml's unpacking of the 6-bit scales and mins (`get_scale_min_k4` for 4 at a time):
        // bytes of sc_lo = scales 0..3, sc_hi = 4..7, m_lo = mins 0..3, m_hi = 4..7.
        let [sc_lo, sc_hi, m_lo, m_hi] = k4_scales_mins_lanes([h[1], h[2], h[3]]);
        // Per sub-block k: each row's scale as i32, and its min as the i16 pair (m_k, m_k).
        let mut sc = [_mm256_setzero_si256(); 8];
        let mut mins_k = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            sc[k] = _mm256_shuffle_epi8(sc_lo, sel[k]);
            sc[k + 4] = _mm256_shuffle_epi8(sc_hi, sel[k]);
            mins_k[k] = _mm256_shuffle_epi8(m_lo, sel_pair[k]);
            mins_k[k + 4] = _mm256_shuffle_epi8(m_hi, sel_pair[k]);
        }
        let mut isum = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            // Dword j of the rows' chunk c: j < 4 from its first 16 bytes, j >= 4 the second.
            // SAFETY: 16 + 32c + 32 <= 144 bytes of each block.
            let (t0, t1) = unsafe { (dwords8(&b, 16 + 32 * c), dwords8(&b, 32 + 32 * c)) };
            let tj = [t0[0], t0[1], t0[2], t0[3], t1[0], t1[1], t1[2], t1[3]];
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            for j in 0..8 {
                lo[j] = _mm256_and_si256(tj[j], m4);
                hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(tj[j]), m4);
            }
            for t in 0..N {
                let y = bx[t].qs.as_ptr().cast::<u8>();
                let (mut s_lo, mut s_hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for j in 0..8 {
                    // SAFETY: 64c + 32 + 4j + 4 <= 256 quants.
                    let (y_lo, y_hi) = unsafe {
                        (
                            broadcast_dword(y.add(64 * c + 4 * j)),
                            broadcast_dword(y.add(64 * c + 32 + 4 * j)),
                        )
                    };
                    s_lo = _mm256_dpbusd_epi32(s_lo, lo[j], y_lo);
                    s_hi = _mm256_dpbusd_epi32(s_hi, hi[j], y_hi);
                }
                isum[t] = _mm256_add_epi32(
                    isum[t],
                    _mm256_add_epi32(
                        _mm256_mullo_epi32(s_lo, sc[2 * c]),
                        _mm256_mullo_epi32(s_hi, sc[2 * c + 1]),
                    ),
                );
            }
        }
        for t in 0..N {
            let bs = bx[t].bsums.as_ptr().cast::<u8>();
            let mut mins = _mm256_setzero_si256();
            for (k, mk) in mins_k.iter().enumerate() {
                // SAFETY: 4k + 4 <= 32 bytes of bsums.
                let pair = unsafe { broadcast_dword(bs.add(4 * k)) };
                mins = _mm256_dpwssd_epi32(mins, *mk, pair);
            }
            let dx = _mm256_set1_ps(bx[t].d());
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, dx), acc[t]);
            acc_min[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(mins),
                _mm256_mul_ps(dmin, dx),
                acc_min[t],
            );
        }
    }
    let mut out = [[0.0f32; 8]; N];
    for t in 0..N {
        // SAFETY: `out[t]` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], acc_min[t])) };
    }
    out
}

/// The f16 pairs `d | dmin << 16` in the 8 lanes as two vectors of 8 f32, `(d, dmin)` (AVX2
/// has no `vpmovdw`: the halves are packed within the 128-bit lanes and the quadwords put in
/// order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn d_dmin_f32(h: __m256i) -> (__m256, __m256) {
    let d = _mm256_and_si256(h, _mm256_set1_epi32(0xFFFF));
    let dmin = _mm256_srli_epi32::<16>(h);
    // [d0..d3 dmin0..dmin3 | d4..d7 dmin4..dmin7] (no saturation: all values < 2^16) ...
    let p = _mm256_packus_epi32(d, dmin);
    // ... then [d0..d7 | dmin0..dmin7].
    let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(p);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(p)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(p)),
    )
}

/// [`rows8_impl`] for CPUs with AVX2 but no AVX-512 VNNI (Zen 3, Intel client cores), the same
/// bits: row r of the group in 32-bit lane r, the tokens' activations broadcast, so each weight
/// chunk is transposed and unpacked once for all `N` tokens and no horizontal sum is needed.
/// `vpdpbusd`'s work is done by `maddubs`, whose pair sums (at most 2 * 15 * 128 in magnitude)
/// are added over a sub-block's 8 dwords in i16 (at most 8 * 3840 = 30720 < 2^15: exact); one
/// `madd` by the rows' `(s_k, s_k)` pairs then gives each row's scaled sub-block sum in i32.
/// The mins are `madd`s of each row's `(m_k, m_k)` with the token's bsum pair.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; every `x[t]` has `x[0].len()` blocks and every `w[r]` at
/// least that many.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_avx2_impl<const N: usize>(
    w: [&[BlockQ4_K]; 8],
    x: [&[BlockQ8_K]; N],
) -> [[f32; 8]; N] {
    let nb = x[0].len();
    let m4 = _mm256_set1_epi8(0x0F);
    let sel_pair: [__m256i; 4] = std::array::from_fn(|k| {
        let c = byte_select(k, true);
        // SAFETY: `c` is 32 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
    });
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        // SAFETY: i < nb <= w[r].len() (caller): each pointer is a whole 144-byte block.
        let b: [*const u8; 8] = std::array::from_fn(|r| unsafe { w[r].as_ptr().add(i).cast() });
        // SAFETY: as above, for x[t].
        let bx: [&BlockQ8_K; N] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(i) });
        // As in `rows8_impl`: lane r of h[0] = d | dmin << 16, of h[1..4] the scales' u32s.
        // SAFETY: each block has 144 readable bytes.
        let h = unsafe { dwords8(&b, 0) };
        let (dw, dmin) = d_dmin_f32(h[0]);
        let [sc_lo, sc_hi, m_lo, m_hi] = k4_scales_mins_lanes([h[1], h[2], h[3]]);
        // Per sub-block k: each row's scale and min as the i16 pairs (s_k, s_k), (m_k, m_k).
        let mut sc = [_mm256_setzero_si256(); 8];
        let mut mins_k = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            sc[k] = _mm256_shuffle_epi8(sc_lo, sel_pair[k]);
            sc[k + 4] = _mm256_shuffle_epi8(sc_hi, sel_pair[k]);
            mins_k[k] = _mm256_shuffle_epi8(m_lo, sel_pair[k]);
            mins_k[k + 4] = _mm256_shuffle_epi8(m_hi, sel_pair[k]);
        }
        let mut isum = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            // Dword j of the rows' chunk c: j < 4 from its first 16 bytes, j >= 4 the second.
            // SAFETY: 16 + 32c + 32 <= 144 bytes of each block.
            let (t0, t1) = unsafe { (dwords8(&b, 16 + 32 * c), dwords8(&b, 32 + 32 * c)) };
            let tj = [t0[0], t0[1], t0[2], t0[3], t1[0], t1[1], t1[2], t1[3]];
            // Sub-block 2c (low nibbles, activations 64c..) for every token, then 2c + 1
            // (high nibbles, activations 64c + 32..): 8 weight registers live at a time.
            for half in 0..2 {
                let q: [__m256i; 8] = std::array::from_fn(|j| {
                    let v = if half == 0 {
                        tj[j]
                    } else {
                        _mm256_srli_epi16::<4>(tj[j])
                    };
                    _mm256_and_si256(v, m4)
                });
                for t in 0..N {
                    let y = bx[t].qs.as_ptr().cast::<u8>();
                    let o = 64 * c + 32 * half;
                    // SAFETY: o + 32 <= 256 quants; 4 readable bytes at each dword.
                    let s = unsafe {
                        let mut s = _mm256_maddubs_epi16(q[0], broadcast_dword(y.add(o)));
                        for (j, qj) in q.iter().enumerate().skip(1) {
                            let yj = broadcast_dword(y.add(o + 4 * j));
                            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*qj, yj));
                        }
                        s
                    };
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s, sc[2 * c + half]));
                }
            }
        }
        for t in 0..N {
            // SAFETY: AVX2 is present (this function's features).
            let mins = unsafe { bsum_pairs_dot(&mins_k, bx[t]) };
            let dx = _mm256_set1_ps(bx[t].d());
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, dx), acc[t]);
            acc_min[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(mins),
                _mm256_mul_ps(dmin, dx),
                acc_min[t],
            );
        }
    }
    let mut out = [[0.0f32; 8]; N];
    for t in 0..N {
        // SAFETY: `out[t]` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], acc_min[t])) };
    }
    out
}

/// [`dot_q4_k_q8_k_rows8`] with AVX2 alone (no AVX-512 needed), the same bits.
///
/// # Panics
/// If the activation rows differ in length, or a weight row is shorter than them.
pub(super) fn dot_q4_k_q8_k_rows8_avx2<const N: usize>(
    _: Token,
    w: [&[BlockQ4_K]; 8],
    x: [&[BlockQ8_K]; N],
) -> [[f32; 8]; N] {
    let n = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    if N == 0 {
        return [[0.0; 8]; N];
    }
    // SAFETY: a `Token` exists only after run-time detection of AVX2, FMA and F16C; lengths
    // checked above.
    unsafe { rows8_avx2_impl(w, x) }
}

/// `y[t][i]` = row i of `w` (whole rows of `rb` bytes) with token t, in the order of
/// [`super::repack::dot_q4_k_q8_k`], with AVX2 alone: 8-row groups ([`rows8_avx2_impl`]),
/// then the rows left one at a time through `one_row` (`repack`'s AVX2 kernels).
///
/// # Panics
/// If the activation rows differ in length or have fewer blocks than a weight row, or a `y[t]`
/// is shorter than the rows of `w`.
pub(super) fn matvec_q4_k_avx2<const N: usize>(
    t: Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_K]; N],
    y: &mut [&mut [f32]; N],
    one_row: impl Fn(&[BlockQ4_K]) -> [f32; N],
) {
    let rows = w.len().checked_div(rb).unwrap_or(0);
    assert!(y.iter().all(|y| y.len() >= rows), "y too short");
    let row = |i: usize| -> &[BlockQ4_K] { super::block::blocks(&w[i * rb..(i + 1) * rb]) };
    let mut i = 0;
    while i + 8 <= rows {
        let r = dot_q4_k_q8_k_rows8_avx2(t, std::array::from_fn(|k| row(i + k)), x);
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i..i + 8].copy_from_slice(&rt);
        }
        i += 8;
    }
    for i in i..rows {
        let r = one_row(row(i));
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i] = rt;
        }
    }
}

/// 16 bytes at offset `o` of blocks `b[r]`, `b[r + 4]`, `b[r + 8]` and `b[r + 12]`, in the four
/// 128-bit quarters in that order.
///
/// # Safety
/// 16 readable bytes at offset `o` of each of those blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load_4x16(b: &[*const u8; 16], r: usize, o: usize) -> __m512i {
    // SAFETY: 16 readable bytes at each (caller); `loadu` has no alignment requirement.
    let (q0, q1, q2, q3) = unsafe {
        (
            _mm_loadu_si128(b[r].add(o).cast()),
            _mm_loadu_si128(b[r + 4].add(o).cast()),
            _mm_loadu_si128(b[r + 8].add(o).cast()),
            _mm_loadu_si128(b[r + 12].add(o).cast()),
        )
    };
    let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q0), q1);
    let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q2), q3);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Dword j (0..4) of the 16 bytes at offset `o` of every block, rows 0..15 in the lanes.
///
/// # Safety
/// 16 readable bytes at offset `o` of each block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dwords16(b: &[*const u8; 16], o: usize) -> [__m512i; 4] {
    // SAFETY: as the caller's.
    unsafe {
        transpose_4x4_x4([
            load_4x16(b, 0, o),
            load_4x16(b, 1, o),
            load_4x16(b, 2, o),
            load_4x16(b, 3, o),
        ])
    }
}

/// [`transpose_4x4`] within each of the four 128-bit quarters: from `v[r]` = [row r | row r + 4
/// | row r + 8 | row r + 12] to `out[j]` = dword j of rows 0..15 in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn transpose_4x4_x4(v: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm512_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// [`rows8_impl`] for 16 rows in the 16 lanes of 512-bit registers. The high nibbles are
/// multiplied in place (`q & 0xF0` = 16 * nibble, saving the shift): their scaled sums are
/// accumulated apart and divided by 16 exactly (an arithmetic shift of a multiple of 16; at most
/// 4 * 16 * 63 * 32 * 15 * 128 in magnitude, within i32) before joining the low nibbles' sums.
///
/// # Safety
/// As [`rows8_impl`], for 16 weight rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows16_impl<const N: usize>(
    w: [&[BlockQ4_K]; 16],
    x: [&[BlockQ8_K]; N],
) -> [[f32; 16]; N] {
    let nb = x[0].len();
    let m4 = _mm512_set1_epi8(0x0F);
    let (k1, k2, k3) = (
        _mm512_set1_epi32(0x3f3f_3f3f),
        _mm512_set1_epi32(0x0f0f_0f0f),
        _mm512_set1_epi32(0x0303_0303),
    );
    let load_ctrl = |k: usize, pair: bool| {
        let c = byte_select(k, pair);
        // SAFETY: `c` is 32 readable bytes; `loadu` has no alignment requirement.
        let c = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(c), c)
    };
    let sel: [__m512i; 4] = std::array::from_fn(|k| load_ctrl(k, false));
    let sel_pair: [__m512i; 4] = std::array::from_fn(|k| load_ctrl(k, true));
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_min = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        // SAFETY: i < nb <= w[r].len() (caller): each pointer is a whole 144-byte block.
        let b: [*const u8; 16] = std::array::from_fn(|r| unsafe { w[r].as_ptr().add(i).cast() });
        // SAFETY: as above, for x[t].
        let bx: [&BlockQ8_K; N] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(i) });
        // SAFETY: each block has 144 readable bytes.
        let h = unsafe { dwords16(&b, 0) };
        let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h[0])));
        let (u0, u1, u2) = (h[1], h[2], h[3]);
        let sc_lo = _mm512_and_si512(u0, k1);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(u2, k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), k3)),
        );
        let m_lo = _mm512_and_si512(u1, k1);
        let m_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), k3)),
        );
        let mut sc = [_mm512_setzero_si512(); 8];
        let mut mins_k = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            sc[k] = _mm512_shuffle_epi8(sc_lo, sel[k]);
            sc[k + 4] = _mm512_shuffle_epi8(sc_hi, sel[k]);
            mins_k[k] = _mm512_shuffle_epi8(m_lo, sel_pair[k]);
            mins_k[k + 4] = _mm512_shuffle_epi8(m_hi, sel_pair[k]);
        }
        let mut isum = [_mm512_setzero_si512(); N];
        let mut isum_hi16 = [_mm512_setzero_si512(); N];
        for c in 0..4 {
            // SAFETY: 16 + 32c + 32 <= 144 bytes of each block.
            let (t0, t1) = unsafe { (dwords16(&b, 16 + 32 * c), dwords16(&b, 32 + 32 * c)) };
            let tj = [t0[0], t0[1], t0[2], t0[3], t1[0], t1[1], t1[2], t1[3]];
            let mut lo = [_mm512_setzero_si512(); 8];
            let mut hi16 = [_mm512_setzero_si512(); 8];
            for j in 0..8 {
                lo[j] = _mm512_and_si512(tj[j], m4);
                hi16[j] = _mm512_andnot_si512(m4, tj[j]);
            }
            for t in 0..N {
                let y = bx[t].qs.as_ptr().cast::<u8>();
                let (mut s_lo, mut s_hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for j in 0..8 {
                    // SAFETY: 64c + 32 + 4j + 4 <= 256 quants; 4 readable bytes.
                    let (y_lo, y_hi) = unsafe {
                        (
                            _mm512_set1_epi32(y.add(64 * c + 4 * j).cast::<i32>().read_unaligned()),
                            _mm512_set1_epi32(
                                y.add(64 * c + 32 + 4 * j).cast::<i32>().read_unaligned(),
                            ),
                        )
                    };
                    s_lo = _mm512_dpbusd_epi32(s_lo, lo[j], y_lo);
                    s_hi = _mm512_dpbusd_epi32(s_hi, hi16[j], y_hi);
                }
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s_lo, sc[2 * c]));
                isum_hi16[t] =
                    _mm512_add_epi32(isum_hi16[t], _mm512_mullo_epi32(s_hi, sc[2 * c + 1]));
            }
        }
        for t in 0..N {
            let bs = bx[t].bsums.as_ptr().cast::<u8>();
            let mut mins = _mm512_setzero_si512();
            for (k, mk) in mins_k.iter().enumerate() {
                // SAFETY: 4k + 4 <= 32 bytes of bsums.
                let pair = unsafe { bs.add(4 * k).cast::<i32>().read_unaligned() };
                mins = _mm512_dpwssd_epi32(mins, *mk, _mm512_set1_epi32(pair));
            }
            let isum = _mm512_add_epi32(isum[t], _mm512_srai_epi32::<4>(isum_hi16[t]));
            let dx = _mm512_set1_ps(bx[t].d());
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[t]);
            acc_min[t] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(mins),
                _mm512_mul_ps(dmin, dx),
                acc_min[t],
            );
        }
    }
    let mut out = [[0.0f32; 16]; N];
    for t in 0..N {
        // SAFETY: `out[t]` is 16 writable f32; storeu has no alignment requirement.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t], acc_min[t])) };
    }
    out
}

/// Q4_K · Q8_K of 16 weight rows with `N` activation rows, as [`dot_q4_k_q8_k_rows8`] (the
/// same bits) with 512-bit registers.
///
/// # Panics
/// As [`dot_q4_k_q8_k_rows8`].
pub(super) fn dot_q4_k_q8_k_rows16<const N: usize>(
    t: Token,
    w: [&[BlockQ4_K]; 16],
    x: [&[BlockQ8_K]; N],
) -> [[f32; 16]; N] {
    assert!(t.avx512(), "the AVX-512 kernels need an AVX-512 token");
    let n = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    if N == 0 {
        return [[0.0; 16]; N];
    }
    // SAFETY: as in `dot_q4_k_q8_k_rows8`.
    unsafe { rows16_impl(w, x) }
}

/// Q4_K · Q8_K of 8 weight rows with `N` activation rows in the order of
/// [`super::repack::dot_q4_k_q8_k`], bit-identical to `8 * N` calls of it: `out[t][r]` is row r
/// with token t.
///
/// # Panics
/// If `t` is not an AVX-512 token, the activation rows differ in length, or a weight row is
/// shorter than them.
pub(super) fn dot_q4_k_q8_k_rows8<const N: usize>(
    t: Token,
    w: [&[BlockQ4_K]; 8],
    x: [&[BlockQ8_K]; N],
) -> [[f32; 8]; N] {
    assert!(t.avx512(), "the AVX-512 kernels need an AVX-512 token");
    let n = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    if N == 0 {
        return [[0.0; 8]; N];
    }
    // SAFETY: an AVX-512 token exists only after run-time detection of every feature the
    // kernel is compiled for; lengths checked above.
    unsafe { rows8_impl(w, x) }
}

/// `y[t][i]` = row i of `w` (whole rows of `rb` bytes) with token t, in the order of
/// [`super::repack::dot_q4_k_q8_k`]: 16-row groups in 512-bit lanes, then an 8-row group in
/// 256-bit lanes, then single rows (`repack`'s AVX2 kernel). (Decode's one token takes
/// [`dot_q4_k_q8_k_row`] instead, which streams a row better than groups do.)
///
/// # Panics
/// If `t` is not an AVX-512 token, the activation rows differ in length or have fewer blocks
/// than a weight row, or a `y[t]` is shorter than the rows of `w`.
pub(super) fn matvec_q4_k<const N: usize>(
    t: Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_K]; N],
    y: [&mut [f32]; N],
) {
    let rows = w.len().checked_div(rb).unwrap_or(0);
    assert!(y.iter().all(|y| y.len() >= rows), "y too short");
    let row = |i: usize| -> &[BlockQ4_K] { super::block::blocks(&w[i * rb..(i + 1) * rb]) };
    let mut y = y;
    let mut i = 0;
    while i + 16 <= rows {
        let r = dot_q4_k_q8_k_rows16(t, std::array::from_fn(|k| row(i + k)), x);
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i..i + 16].copy_from_slice(&rt);
        }
        i += 16;
    }
    if i + 8 <= rows {
        let r = dot_q4_k_q8_k_rows8(t, std::array::from_fn(|k| row(i + k)), x);
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i..i + 8].copy_from_slice(&rt);
        }
        i += 8;
    }
    for i in i..rows {
        let r = super::repack::avx2::dot_q4_k_q8_k_xn(t, row(i), x);
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i] = rt;
        }
    }
}

/// One row in the order of [`super::repack::dot_q4_k_q8_k`] with AVX-512 (bit-identical):
/// per 32-byte chunk `c` of quants, the low nibbles in the low half of a register and the high
/// nibbles in the high half line up with the 64 activations `64c..64c + 64` as they lie in
/// memory; `maddubs` gives the pair sums (at most 2 * 15 * 128 in magnitude) and `vpdpwssd`
/// multiplies them by the two sub-block scales and accumulates, exactly in i32. The block's
/// integer sum and its min term are reduced together, and the two float accumulators advance
/// as one 2-lane `fma`: `acc = fma(isum, d * dx, acc)`, `acc_min = fma(mins, dmin * dx,
/// acc_min)`, the portable order ([`accumulate_block`]). It reads the row front to back and
/// prefetches ahead ([`prefetch_row_ahead`]).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; `x.len() >= w.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row1_impl(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let m4 = _mm512_set1_epi8(0x0F);
    // Shift counts per 16-bit word: 0 in the low half (low nibbles), 4 in the high half.
    let nibble_shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
    // Word indices: sub-block scale 2c in the low half, 2c + 1 in the high half.
    let sc_idx: [__m512i; 4] = std::array::from_fn(|c| {
        let c = c as i16;
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(2 * c)),
            _mm256_set1_epi16(2 * c + 1),
        )
    });
    let mut acc = _mm_setzero_ps();
    for (bw, bx) in w.iter().zip(x) {
        prefetch_row_ahead(bw);
        let (sc16, m16) = scales_mins_words(bw);
        let sc512 = _mm512_castsi128_si512(sc16);
        let mut isum = _mm512_setzero_si512();
        for (c, idx) in sc_idx.iter().enumerate() {
            // SAFETY: c < 4: `qs[32c..32c + 32]` and `qs[64c..64c + 64]` of the activation are
            // inside their blocks; unaligned loads.
            let (q, y) = unsafe {
                (
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(bw.qs.as_ptr().add(32 * c).cast())),
                    _mm512_loadu_si512(bx.qs.as_ptr().add(64 * c).cast()),
                )
            };
            let z = _mm512_and_si512(_mm512_srlv_epi16(q, nibble_shift), m4);
            let sc = _mm512_permutexvar_epi16(*idx, sc512);
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(z, y), sc);
        }
        let v = _mm256_add_epi32(
            _mm512_castsi512_si256(isum),
            _mm512_extracti64x4_epi64::<1>(isum),
        );
        acc = accumulate_block(v, m16, bw, bx, acc);
    }
    row_result(acc)
}

/// Iterations ahead of the one being computed whose bytes [`rows2_impl`] prefetches.
const PAIR_PREFETCH_ITERATIONS: usize = 24;

/// Prefetches the bytes [`rows2_impl`] reads [`PAIR_PREFETCH_ITERATIONS`] iterations after
/// iteration `i` of a pair of adjacent rows starting at `pair`, as one sequential stream: the
/// two rows are one run of memory (and the next pairs follow), read at 288 bytes an iteration,
/// so the stream walks it at that pace, 5 lines an iteration.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch_pair_ahead(pair: *const BlockQ4_K, i: usize) {
    let ahead = pair
        .cast::<u8>()
        .wrapping_add((i + PAIR_PREFETCH_ITERATIONS) * 2 * 144);
    for line in 0..5 {
        // A prefetch reads nothing architecturally and never faults, whatever the address.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
    }
}

/// Two rows at once in the order of [`super::repack::dot_q4_k_q8_k`] (bit-identical), row 0 in
/// the low 256-bit half of each 512-bit register and row 1 in the high half: one instruction
/// does the nibble split, the `maddubs` and the scaled `vpdpwssd` of both rows, each activation
/// chunk is loaded once (broadcast to both halves), and the two rows' block sums and min terms
/// are reduced together into `[isum_0, mins_0, isum_1, mins_1]`, which one 4-lane `fma`
/// accumulates: per lane the portable order's `acc = fma(isum, d * dx, acc)`,
/// `acc_min = fma(mins, dmin * dx, acc_min)` ([`accumulate_block`] for two rows). On Zen 4 a
/// decode step's Q4_K rows take 0.9x the time of the one-row kernels this way (in cache, 23.7
/// against 21.5 GB/s per core). The matvec passes adjacent rows, so the pair is one run of
/// memory: it is prefetched as one sequential stream ([`prefetch_pair_ahead`]; from memory 23.6
/// against 20.4 GB/s per core, where a prefetch ahead in each row reached 10.7).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI; `x.len() >= w0.len()` and
/// `w1.len() >= w0.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows2_impl(w0: &[BlockQ4_K], w1: &[BlockQ4_K], x: &[BlockQ8_K]) -> [f32; 2] {
    let m4 = _mm512_set1_epi8(0x0F);
    // Word indices: sub-block scale j of row 0 (words 0..8) in the low half, of row 1 (words
    // 16..24) in the high half.
    let sel: [__m512i; 8] = std::array::from_fn(|j| {
        let j = j as i16;
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(j)),
            _mm256_set1_epi16(16 + j),
        )
    });
    let mut acc = _mm_setzero_ps();
    for (i, ((b0, b1), bx)) in w0.iter().zip(w1).zip(x).enumerate() {
        prefetch_pair_ahead(w0.as_ptr(), i);
        let (sc0, m0) = scales_mins_words(b0);
        let (sc1, m1) = scales_mins_words(b1);
        let sc = _mm512_inserti32x4::<2>(_mm512_castsi128_si512(sc0), sc1);
        // Two chains: `vpdpwssd`'s latency would otherwise bound the block.
        let mut a = _mm512_setzero_si512();
        let mut b = _mm512_setzero_si512();
        for c in 0..4 {
            // SAFETY: c < 4: `qs[32c..32c + 32]` of both weight blocks and `qs[64c..64c + 64]`
            // of the activation are inside their blocks; unaligned loads.
            let (q, y_lo, y_hi) = unsafe {
                (
                    _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_loadu_si256(
                            b0.qs.as_ptr().add(32 * c).cast(),
                        )),
                        _mm256_loadu_si256(b1.qs.as_ptr().add(32 * c).cast()),
                    ),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(bx.qs.as_ptr().add(64 * c).cast())),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        bx.qs.as_ptr().add(64 * c + 32).cast(),
                    )),
                )
            };
            let lo = _mm512_maddubs_epi16(_mm512_and_si512(q, m4), y_lo);
            let hi = _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4), y_hi);
            a = _mm512_dpwssd_epi32(a, lo, _mm512_permutexvar_epi16(sel[2 * c], sc));
            b = _mm512_dpwssd_epi32(b, hi, _mm512_permutexvar_epi16(sel[2 * c + 1], sc));
        }
        let lanes = _mm512_add_epi32(a, b);
        // SAFETY: `bsums` is 16 little-endian i16 (32 bytes); unaligned load.
        let bsums = unsafe { _mm256_loadu_si256(bx.bsums.as_ptr().cast()) };
        let mins0 = _mm256_madd_epi16(bsums, min_pairs(m0));
        let mins1 = _mm256_madd_epi16(bsums, min_pairs(m1));
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(_mm512_castsi512_si256(lanes), mins0),
            _mm256_hadd_epi32(_mm512_extracti64x4_epi64::<1>(lanes), mins1),
        );
        // [isum_0, mins_0, isum_1, mins_1].
        let sums = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // [d_0, dmin_0, d_1, dmin_1].
        let dm = u64::from(u32::from_le_bytes([
            b0.d[0], b0.d[1], b0.dmin[0], b0.dmin[1],
        ])) | (u64::from(u32::from_le_bytes([
            b1.d[0], b1.d[1], b1.dmin[0], b1.dmin[1],
        ])) << 32);
        let dm = _mm_cvtph_ps(_mm_cvtsi64_si128(dm as i64));
        let scale = _mm_mul_ps(dm, _mm_set1_ps(bx.d()));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale, acc);
    }
    let mut out = [0.0f32; 4];
    // SAFETY: 4 writable f32; storeu has no alignment requirement.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    [out[0] - out[1], out[2] - out[3]]
}

/// Q4_K · Q8_K of two rows with AVX-512, bit-identical to two calls of
/// [`super::repack::dot_q4_k_q8_k`] (see [`rows2_impl`]); for decode.
///
/// # Panics
/// If `t` is not an AVX-512 token or `x` or the second row has fewer blocks than the first.
pub(super) fn dot_q4_k_q8_k_rows2(t: Token, w: [&[BlockQ4_K]; 2], x: &[BlockQ8_K]) -> [f32; 2] {
    assert!(t.avx512(), "the AVX-512 kernels need an AVX-512 token");
    assert!(
        x.len() >= w[0].len(),
        "activation shorter than the weight row"
    );
    assert!(
        w[1].len() >= w[0].len(),
        "second weight row shorter than the first"
    );
    // SAFETY: an AVX-512 token exists only after run-time detection of every feature the
    // kernel is compiled for; lengths checked above.
    unsafe { rows2_impl(w[0], w[1], x) }
}

/// Q4_K · Q8_K of one row with AVX-512, bit-identical to [`super::repack::dot_q4_k_q8_k`]
/// (see [`row1_impl`]); for decode, where it streams its row and prefetches ahead.
///
/// # Panics
/// If `t` is not an AVX-512 token or `x` has fewer blocks than `w`.
pub(super) fn dot_q4_k_q8_k_row(t: Token, w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    assert!(t.avx512(), "the AVX-512 kernels need an AVX-512 token");
    assert!(x.len() >= w.len(), "activation shorter than the weight row");
    // SAFETY: an AVX-512 token exists only after run-time detection of every feature the
    // kernel is compiled for; lengths checked above.
    unsafe { row1_impl(w, x) }
}

#[cfg(test)]
mod tests {
    use super::super::block::blocks;
    use super::super::repack;
    use super::super::repack::tests::{q8_k_row, random_blocks, scale};
    use super::*;
    use crate::testutil::Rng;

    /// `rows` Q4_K rows of `nb` super-blocks: random quants, scales and mins; with `extreme`,
    /// each block randomly all-zero or all-max (63) scales and mins and quants all 0 or all 15,
    /// with the largest f16 `d` / `dmin`.
    fn q4_k_rows(r: &mut Rng, rows: usize, nb: usize, extreme: bool) -> Vec<u8> {
        random_blocks(r, rows * nb, 144, |r, b| {
            let pick = r.next_u64();
            // Half the extreme blocks keep finite-result scales (the integer extremes alone).
            let huge = extreme && pick & 8 != 0;
            b[..2].copy_from_slice(&scale(r, huge));
            b[2..4].copy_from_slice(&scale(r, huge));
            if extreme {
                b[4..16].fill(if pick & 1 == 0 { 0x00 } else { 0xFF });
                b[16..].fill(if pick & 2 == 0 { 0x00 } else { 0xFF });
                if pick & 4 != 0 {
                    // Scales 63, mins 0 (and the reverse below) besides all-equal.
                    b[4..8].fill(0x3F);
                    b[8..12].fill(0x00);
                }
            }
        })
    }

    #[test]
    fn one_and_two_row_kernels_bit_identical_to_the_portable_order() {
        let Some(t) = Token::detect_avx512() else {
            return;
        };
        let mut r = Rng::new(43);
        for nb in [1usize, 2, 3, 8, 22] {
            for extreme in [false, true] {
                let w = q4_k_rows(&mut r, 5, nb, extreme);
                for k in 0..3 {
                    let mut x = q8_k_row(&mut r, nb, extreme && k != 1);
                    if k == 0 {
                        for blk in x.chunks_exact_mut(292) {
                            blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
                        }
                    }
                    let xb: &[BlockQ8_K] = blocks(&x);
                    for row in w.chunks_exact(nb * 144) {
                        let wr: &[BlockQ4_K] = blocks(row);
                        let want = repack::dot_q4_k_q8_k(wr, xb);
                        let got = dot_q4_k_q8_k_row(t, wr, xb);
                        assert_eq!(got.to_bits(), want.to_bits(), "nb={nb} {extreme} {k}");
                    }
                    // Two rows at once: every ordered pair of the 5 rows (the same row twice
                    // too), each half against the portable order.
                    let rows: Vec<&[BlockQ4_K]> = w.chunks_exact(nb * 144).map(blocks).collect();
                    for a in 0..rows.len() {
                        for b in 0..rows.len() {
                            let got = dot_q4_k_q8_k_rows2(t, [rows[a], rows[b]], xb);
                            for (g, r) in got.into_iter().zip([a, b]) {
                                let want = repack::dot_q4_k_q8_k(rows[r], xb);
                                assert_eq!(
                                    g.to_bits(),
                                    want.to_bits(),
                                    "pair nb={nb} {extreme} {k}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows8_bit_identical_to_the_one_row_order() {
        let Some(t) = Token::detect_avx512() else {
            return;
        };
        let mut r = Rng::new(41);
        for nb in [1usize, 2, 3, 7, 9] {
            for extreme in [false, true] {
                let w = q4_k_rows(&mut r, 8, nb, extreme);
                // Tokens 0 and 2 extreme with extreme activations: token 0 with all -128 (or
                // 127) quants and a finite scale, token 2 also with the huge scale.
                let xs: Vec<Vec<u8>> = (0..4)
                    .map(|k| {
                        let mut x = q8_k_row(&mut r, nb, extreme && k % 2 == 0);
                        if k == 0 {
                            for blk in x.chunks_exact_mut(292) {
                                blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
                            }
                        }
                        x
                    })
                    .collect();
                let rb = nb * 144;
                let rows8 = std::array::from_fn(|k| blocks(&w[k * rb..(k + 1) * rb]));
                let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let got4 = dot_q4_k_q8_k_rows8(t, rows8, xb);
                // 16 rows: these 8 and 8 more.
                let w2 = q4_k_rows(&mut r, 8, nb, extreme);
                let rows16: [&[BlockQ4_K]; 16] = std::array::from_fn(|k| {
                    let src = if k < 8 { &w } else { &w2 };
                    blocks(&src[(k % 8) * rb..(k % 8 + 1) * rb])
                });
                let got16 = dot_q4_k_q8_k_rows16(t, rows16, xb);
                for (tok, x) in xb.iter().enumerate() {
                    for row in 0..16 {
                        let want = repack::dot_q4_k_q8_k(rows16[row], x);
                        assert_eq!(
                            got16[tok][row].to_bits(),
                            want.to_bits(),
                            "16 nb={nb} {extreme}"
                        );
                    }
                }
                for (tok, x) in xb.iter().enumerate() {
                    let [got1] = dot_q4_k_q8_k_rows8(t, rows8, [*x]);
                    for row in 0..8 {
                        let want = repack::dot_q4_k_q8_k(rows8[row], x);
                        assert_eq!(
                            got4[tok][row].to_bits(),
                            want.to_bits(),
                            "nb={nb} {extreme}"
                        );
                        assert_eq!(got1[row].to_bits(), want.to_bits(), "nb={nb} {extreme}");
                    }
                }
            }
        }
    }

    /// The AVX2 8-row kernel against the one-row order, bit for bit: 1, 3 and 8 tokens; rows
    /// of 1 to 9 super-blocks; extreme blocks (all-15 quants against all -128 activations: the
    /// i16 pair sums at their bound of 8 * 2 * 15 * 128, scales and mins 63, the largest f16
    /// scales); then through `matvec_q4_k_avx2` on 8, 13 and 21 rows (groups and rows left).
    #[test]
    fn rows8_avx2_bit_identical_to_the_one_row_order() {
        let Some(t) = Token::detect() else {
            assert!(std::env::var_os("CI").is_none(), "CI machines have AVX2");
            return;
        };
        fn check<const N: usize>(t: Token, w: &[u8], xs: &[Vec<u8>], nb: usize, what: &str) {
            let rb = nb * 144;
            let rows8: [&[BlockQ4_K]; 8] =
                std::array::from_fn(|k| blocks(&w[k * rb..(k + 1) * rb]));
            let xb: [&[BlockQ8_K]; N] = std::array::from_fn(|k| blocks(&xs[k]));
            let got = dot_q4_k_q8_k_rows8_avx2(t, rows8, xb);
            for (tok, x) in xb.iter().enumerate() {
                for (row, wr) in rows8.iter().enumerate() {
                    let want = repack::dot_q4_k_q8_k(wr, x);
                    assert_eq!(
                        got[tok][row].to_bits(),
                        want.to_bits(),
                        "{what} N={N} token {tok} row {row}"
                    );
                }
            }
        }
        let mut r = Rng::new(47);
        for nb in [1usize, 2, 3, 7, 9] {
            for extreme in [false, true] {
                let w = q4_k_rows(&mut r, 21, nb, extreme);
                let xs: Vec<Vec<u8>> = (0..8)
                    .map(|k| {
                        let mut x = q8_k_row(&mut r, nb, extreme && k % 2 == 0);
                        if k == 0 {
                            for blk in x.chunks_exact_mut(292) {
                                blk[..4].copy_from_slice(&0.01f32.to_le_bytes());
                            }
                        }
                        x
                    })
                    .collect();
                let what = format!("nb={nb} extreme={extreme}");
                check::<1>(t, &w, &xs, nb, &what);
                check::<3>(t, &w, &xs, nb, &what);
                check::<8>(t, &w, &xs, nb, &what);
                let rb = nb * 144;
                for rows in [8usize, 13, 21] {
                    let xb: [&[BlockQ8_K]; 8] = std::array::from_fn(|k| blocks(&xs[k]));
                    let mut ys = vec![vec![f32::NAN; rows]; 8];
                    let mut it = ys.iter_mut();
                    let mut y: [&mut [f32]; 8] =
                        std::array::from_fn(|_| it.next().unwrap().as_mut_slice());
                    matvec_q4_k_avx2(t, &w[..rows * rb], rb, xb, &mut y, |wr| {
                        repack::avx2::dot_q4_k_q8_k_x8(t, wr, xb)
                    });
                    for (tok, x) in xb.iter().enumerate() {
                        for row in 0..rows {
                            let wr: &[BlockQ4_K] = blocks(&w[row * rb..(row + 1) * rb]);
                            let want = repack::dot_q4_k_q8_k(wr, x);
                            assert_eq!(
                                ys[tok][row].to_bits(),
                                want.to_bits(),
                                "{what} rows={rows} token {tok} row {row}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Through `Kernels::matvec` / `matvec_tokens`: 8, 16 and 24 rows (all in 8-row groups) and
    /// row ranges whose length is not a multiple of 8 (the rest one row at a time), against the
    /// one-row order; 20 rows (not repacked) against `vec_dot`.
    #[test]
    fn kernels_dispatch_bit_identical() {
        use super::super::{Kernels, MATVEC_TOKENS};
        use edge_gguf::GgmlType as T;
        let mut r = Rng::new(43);
        for nb in [1usize, 3] {
            let n = nb * 256;
            let rb = nb * 144;
            let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS)
                .map(|_| q8_k_row(&mut r, nb, false))
                .collect();
            for (rows, range) in [
                (8usize, 0..8),
                (16, 0..16),
                (24, 0..24),
                (24, 3..24),
                (20, 0..20),
            ] {
                let w = q4_k_rows(&mut r, rows, nb, false);
                for k in Kernels::available() {
                    let want = |row: usize, x: &[u8]| {
                        let wr = &w[row * rb..(row + 1) * rb];
                        if rows % 8 == 0 {
                            repack::dot_q4_k_q8_k(blocks(wr), blocks(x))
                        } else {
                            k.vec_dot(T::Q4_K, n, wr, x)
                        }
                    };
                    let mut ys = vec![vec![f32::NAN; range.len()]; MATVEC_TOKENS];
                    let [a, b, c, d] = &mut ys[..] else {
                        unreachable!()
                    };
                    let xq: [&[u8]; MATVEC_TOKENS] = std::array::from_fn(|t| &xs[t][..]);
                    let multi = k.matvec_tokens(T::Q4_K, n, &w, xq, range.clone(), [a, b, c, d]);
                    for (t, x) in xs.iter().enumerate() {
                        let mut y = vec![f32::NAN; range.len()];
                        k.matvec(T::Q4_K, n, &w, x, range.clone(), &mut y);
                        for (i, row) in range.clone().enumerate() {
                            let e = want(row, x).to_bits();
                            let what = format!("{} rows={rows} {range:?} row {row}", k.isa_name());
                            assert_eq!(y[i].to_bits(), e, "{what}");
                            if multi {
                                assert_eq!(ys[t][i].to_bits(), e, "{what} tokens");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Old (AVX2 set) against new (AVX-512 set) on the same data in one process: prefill
    /// (`matvec_tokens` over 16-row chunks, 64 tokens, as the executor calls it) and decode
    /// (`matvec` over a whole 5632 x 2048 matrix, one token). Best of several runs.
    /// `cargo test --release -p edge-kernels --lib bench_q4_k_rows -- --ignored --nocapture`
    #[test]
    #[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
    fn bench_q4_k_rows() {
        use super::super::{Kernels, MATVEC_TOKENS};
        use edge_gguf::GgmlType as T;
        use std::time::Instant;
        let (Some(old), Some(new)) = (Kernels::avx2(), Kernels::avx512()) else {
            return;
        };
        let mut r = Rng::new(5);
        let (nb, rows, n_tok) = (8usize, 5632usize, 64usize);
        let n = nb * 256;
        let w = q4_k_rows(&mut r, rows, nb, false);
        let xs: Vec<Vec<u8>> = (0..n_tok).map(|_| q8_k_row(&mut r, nb, false)).collect();
        let (w, xs) = (&w[..], &xs[..]);
        let best = |f: &mut dyn FnMut()| {
            (0..7)
                .map(|_| {
                    let t0 = Instant::now();
                    f();
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        // Prefill on 512 rows (the executor's chunk loop), all tokens.
        let prefill = |k: Kernels| {
            let mut y = vec![vec![0f32; 16]; MATVEC_TOKENS];
            move || {
                for start in (0..512).step_by(16) {
                    for g in xs.chunks_exact(MATVEC_TOKENS) {
                        let [a, b, c, d] = &mut y[..] else {
                            unreachable!()
                        };
                        let xq: [&[u8]; MATVEC_TOKENS] = std::array::from_fn(|t| &g[t][..]);
                        assert!(k.matvec_tokens(
                            T::Q4_K,
                            n,
                            w,
                            xq,
                            start..start + 16,
                            [a, b, c, d]
                        ));
                    }
                }
                std::hint::black_box(&y);
            }
        };
        let (po, pn) = (best(&mut prefill(old)), best(&mut prefill(new)));
        let macs = 512.0 * n as f64 * n_tok as f64;
        println!(
            "prefill 512x{n} x {n_tok} tokens: old {:.2} ms ({:.1} GMAC/s), new {:.2} ms ({:.1} GMAC/s), old/new {:.2}",
            po * 1e3,
            macs / po / 1e9,
            pn * 1e3,
            macs / pn / 1e9,
            po / pn
        );
        // The kernels directly: 8-row groups x 4 tokens, 16-row groups x 4 and x 8 tokens.
        let t = Token::detect_avx512().unwrap();
        let rb = nb * 144;
        let wrows = |r0: usize| -> &[BlockQ4_K] { blocks(&w[r0 * rb..(r0 + 1) * rb]) };
        let direct = |rows_per: usize, toks: usize| {
            move || {
                let mut sink = 0f32;
                for start in (0..512).step_by(rows_per) {
                    for g in xs.chunks_exact(toks) {
                        if rows_per == 8 && toks == 4 {
                            let xq: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&g[k]));
                            let r = dot_q4_k_q8_k_rows8(
                                t,
                                std::array::from_fn(|k| wrows(start + k)),
                                xq,
                            );
                            sink += r[0][0];
                        } else if toks == 4 {
                            let xq: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&g[k]));
                            let r = dot_q4_k_q8_k_rows16(
                                t,
                                std::array::from_fn(|k| wrows(start + k)),
                                xq,
                            );
                            sink += r[0][0];
                        } else {
                            let xq: [&[BlockQ8_K]; 8] = std::array::from_fn(|k| blocks(&g[k]));
                            let r = dot_q4_k_q8_k_rows16(
                                t,
                                std::array::from_fn(|k| wrows(start + k)),
                                xq,
                            );
                            sink += r[0][0];
                        }
                    }
                }
                std::hint::black_box(sink);
            }
        };
        let r8x4 = best(&mut direct(8, 4));
        let r16x4 = best(&mut direct(16, 4));
        let r16x8 = best(&mut direct(16, 8));
        println!(
            "direct: rows8 x4 {:.2} ms, rows16 x4 {:.2} ms, rows16 x8 {:.2} ms",
            r8x4 * 1e3,
            r16x4 * 1e3,
            r16x8 * 1e3
        );
        // One token (decode), directly: 8-row against 16-row groups, whole matrix and in cache.
        let x0: &[BlockQ8_K] = blocks(&xs[0]);
        let one = |rows_per: usize, total: usize, reps: usize| {
            move || {
                let mut sink = 0f32;
                for _ in 0..reps {
                    for start in (0..total).step_by(rows_per) {
                        if rows_per == 8 {
                            let [r] = dot_q4_k_q8_k_rows8(
                                t,
                                std::array::from_fn(|k| wrows(start + k)),
                                [x0],
                            );
                            sink += r[0];
                        } else {
                            let [r] = dot_q4_k_q8_k_rows16(
                                t,
                                std::array::from_fn(|k| wrows(start + k)),
                                [x0],
                            );
                            sink += r[0];
                        }
                    }
                }
                std::hint::black_box(sink);
            }
        };
        let (a, b) = (best(&mut one(8, rows, 1)), best(&mut one(16, rows, 1)));
        let (c, d) = (best(&mut one(8, 256, 50)), best(&mut one(16, 256, 50)));
        println!(
            "direct decode: rows8 {:.2} ms, rows16 {:.2} ms; in cache rows8 {:.2} ms, rows16 {:.2} ms",
            a * 1e3,
            b * 1e3,
            c * 1e3,
            d * 1e3
        );
        let decode = |k: Kernels| {
            let mut y = vec![0f32; rows];
            let x = &xs[0];
            move || {
                k.matvec(T::Q4_K, n, w, x, 0..rows, &mut y);
                std::hint::black_box(&y);
            }
        };
        let (d_o, d_n) = (best(&mut decode(old)), best(&mut decode(new)));
        println!(
            "decode {rows}x{n}: old {:.2} ms, new {:.2} ms, old/new {:.2}",
            d_o * 1e3,
            d_n * 1e3,
            d_o / d_n
        );
        // Small matrix (in cache): the compute side of decode.
        let decode_small = |k: Kernels| {
            let mut y = vec![0f32; 256];
            let x = &xs[0];
            let w = &w[..256 * nb * 144];
            move || {
                for _ in 0..50 {
                    k.matvec(T::Q4_K, n, w, x, 0..256, &mut y);
                }
                std::hint::black_box(&y);
            }
        };
        let (so, sn) = (best(&mut decode_small(old)), best(&mut decode_small(new)));
        println!(
            "decode in cache 256x{n} x50: old {:.2} ms, new {:.2} ms, old/new {:.2}",
            so * 1e3,
            sn * 1e3,
            so / sn
        );
    }
}
