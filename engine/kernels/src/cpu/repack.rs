//! The per-row float order of llama.cpp's *repacked* x86 kernels, for the single-token case.
//!
//! llama.cpp's CPU backend (`ggml/src/ggml-cpu/repack.cpp`, `ggml_repack_get_optimal_repack_type`)
//! stores some weight types in an extra "CPU_REPACK" buffer at load, interleaving 8 rows, and
//! multiplies them with its own kernels (`arch/x86/repack.cpp`). On an x86 CPU with AVX2 (the
//! reference machine: AVX2 + AVX-512 incl. VNNI/BW/VL, the peer built with `-mavx2 ... -mavx512f
//! -mavx512vnni`, `GGML_USE_CPU_REPACK`), a 2-D weight of `ne[1]` rows gets:
//!
//! | type   | repacked when        | layout / activation  | one token (`gemv`)            |
//! |--------|----------------------|----------------------|-------------------------------|
//! | Q4_0   | AVX2, rows % 8 == 0  | `q4_0x8`, Q8_0       | `ggml_gemv_q4_0_8x8_q8_0`     |
//! | IQ4_NL | AVX2, rows % 8 == 0  | `iq4_nlx8`, Q8_0     | `ggml_gemv_iq4_nl_8x8_q8_0`   |
//! | Q4_K   | AVX2, rows % 8 == 0  | `q4_Kx8`, Q8_K       | `ggml_gemv_q4_K_8x8_q8_K`     |
//! | Q2_K   | AVX-512, rows % 8 == 0 | `q2_Kx8`, Q8_K     | `ggml_gemv_q2_K_8x8_q8_K`     |
//!
//! Q5_K, Q6_K and Q8_0 are repacked only on ARM (NEON i8mm/dotprod); Q3_K, Q5_0, Q5_1, Q4_1 and
//! IQ4_XS never: those run ggml's `ggml_vec_dot_*` of `arch/x86/quants.c` (AVX2 branch; see
//! `avx2_quants.rs` and `kquant_order.rs`). One token is one activation row, which the repacked
//! `forward_mul_mat` quantizes with the type's ordinary `from_float` (`quantize_row_q8_0` /
//! `quantize_row_q8_K`, the same as the unrepacked path) and multiplies with `gemv`. Batches of
//! four or more tokens use `gemm`, which by ggml's code adds each output in the same per-block
//! order as `gemv`, with activations from `ggml_quantize_mat_q8_*_4x8`, which give the same
//! quants and scales as `from_float` (Q8_K: negated quants and scale where a block holds both
//! `+max` and `-max`, the same products); so this order serves prefill too.
//!
//! The `gemv` kernels keep one f32 accumulator lane per weight row (8 rows in a register), so a
//! row's result depends only on that row: per block, the exact integer dot of the block (with the
//! sub-block scales applied in integers for Q4_K) converted to f32 and fused-multiply-added with
//! `d_w * d_x`; no horizontal reduction. Q4_K also accumulates the min term `sum m_k * bsum_k`
//! per super-block in a second lane (`fma(mins, dmin_w * d_x, acc_min)`) and returns
//! `acc - acc_min`. The functions here are that order for one row; the integer sums are exact in
//! both engines (ggml's i16 partial sums cannot overflow for valid blocks: at most 16 * 15 * 128).
//!
//! Each has a portable body (the scalar kernel set on x86-64 runs it, so every instruction-set
//! path gives the same bits) and the same body compiled with AVX2 + FMA, where the integer dots
//! are vectorized. [`super::Kernels::matvec`] picks these for matrices whose row count is a
//! multiple of 8, as llama.cpp does.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::{f16_le, QK};
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::q2_k::BlockQ2_K;
use super::q4_0::BlockQ4_0;
use super::q4_k::{scale_min_k4, BlockQ4_K};
use super::q8_0::BlockQ8_0;
use super::q8_k::BlockQ8_K;

/// Whether llama.cpp repacks a matrix of `rows` rows of a type that it repacks on the reference
/// CPU (Q4_0, IQ4_NL, Q4_K with AVX2; Q2_K with AVX-512): `ne[1] % 8 == 0`.
#[inline]
pub(super) fn repacked_shape(rows: usize) -> bool {
    rows.is_multiple_of(8)
}

/// Exact integer dot of a 32-element block of 4-bit indices (low nibble = element `j`, high =
/// element `j + 16`) mapped through `table`, with 32 activations.
#[inline(always)]
fn block_dot_lut(qs: &[u8; QK / 2], table: &[i8; 16], x: &[i8; QK]) -> i32 {
    let mut s = 0i32;
    for j in 0..QK / 2 {
        s += i32::from(table[usize::from(qs[j] & 0x0F)]) * i32::from(x[j])
            + i32::from(table[usize::from(qs[j] >> 4)]) * i32::from(x[j + 16]);
    }
    s
}

/// Q4_0's nibble values as ggml's repacked kernel maps them (`q - 8`).
const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

#[inline(always)]
fn q4_0_body(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let isum = block_dot_lut(&bw.qs, &Q4_0_VALUES, &bx.qs);
        acc = (isum as f32).mul_add(bw.d() * bx.d(), acc);
    }
    acc
}

#[inline(always)]
fn iq4_nl_body(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let isum = block_dot_lut(&bw.qs, &KVALUES_IQ4NL, &bx.qs);
        acc = (isum as f32).mul_add(bw.d() * bx.d(), acc);
    }
    acc
}

#[inline(always)]
fn q4_k_body(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = 0.0f32;
    let mut acc_min = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let (mut isum, mut mins) = (0i32, 0i32);
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
            mins += i32::from(m1) * (bx.bsum(4 * c) + bx.bsum(4 * c + 1))
                + i32::from(m2) * (bx.bsum(4 * c + 2) + bx.bsum(4 * c + 3));
        }
        let dx = bx.d();
        acc = (isum as f32).mul_add(f16_le(bw.d) * dx, acc);
        acc_min = (mins as f32).mul_add(f16_le(bw.dmin) * dx, acc_min);
    }
    acc - acc_min
}

/// `ggml_gemv_q2_K_8x8_q8_K` (AVX-512 CPUs): Q4_K's shape, with sixteen 16-element sub-blocks
/// whose 4-bit scale and min are the nibbles of `scales[k]`, and the mins against `bsums[k]`.
#[inline(always)]
fn q2_k_body(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = 0.0f32;
    let mut acc_min = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let q = bw.quants();
        let (mut isum, mut mins) = (0i32, 0i32);
        for k in 0..16 {
            let mut s = 0i32;
            for l in 16 * k..16 * k + 16 {
                s += i32::from(q[l]) * i32::from(bx.qs[l]);
            }
            isum += i32::from(bw.scales[k] & 0x0F) * s;
            mins += i32::from(bw.scales[k] >> 4) * bx.bsum(k);
        }
        let dx = bx.d();
        acc = (isum as f32).mul_add(f16_le(bw.d) * dx, acc);
        acc_min = (mins as f32).mul_add(f16_le(bw.dmin) * dx, acc_min);
    }
    acc - acc_min
}

/// Q2_K · Q8_K in the order of `ggml_gemv_q2_K_8x8_q8_K` (portable).
pub(super) fn dot_q2_k_q8_k(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    q2_k_body(w, x)
}

/// Q4_0 · Q8_0 in the order of `ggml_gemv_q4_0_8x8_q8_0` (portable).
pub(super) fn dot_q4_0_q8_0(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    q4_0_body(w, x)
}

/// IQ4_NL · Q8_0 in the order of `ggml_gemv_iq4_nl_8x8_q8_0` (portable).
pub(super) fn dot_iq4_nl_q8_0(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    iq4_nl_body(w, x)
}

/// Q4_K · Q8_K in the order of `ggml_gemv_q4_K_8x8_q8_K` (portable).
pub(super) fn dot_q4_k_q8_k(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    q4_k_body(w, x)
}

/// The same orders with AVX2 intrinsics, bit-identical to the portable functions (same exact
/// integer block dots, same float operations). The one-row Q4_K pieces it shares with
/// `q4_k_rows.rs` (which uses this module for the rows its groups leave over) are in `x86.rs`.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    // The enclosing file by its absolute path: `scripts/check-layers.py` resolves paths per file
    // and would take `super::` here for `cpu/mod.rs`.
    use crate::cpu::repack::*;
    use crate::cpu::x86::{
        accumulate_block, load_q8, min_pairs, nibbles, prefetch_row_ahead, row_result,
        scales_mins_words, Token,
    };
    use std::arch::x86_64::*;

    /// Sum of the 8 i32 lanes (block dots are at most 32 * 128 * 128 in magnitude: no overflow).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }

    /// `sum (q - 8) * y` of one Q4_0 block: `maddubs(q, y) - maddubs(8, y)` (unsigned left
    /// operands, pair sums within i16 for every i8 activation, -128 included), then pairs to i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_block(q: __m256i, y: __m256i) -> i32 {
        let qy = _mm256_maddubs_epi16(q, y);
        let ey = _mm256_maddubs_epi16(_mm256_set1_epi8(8), y);
        hsum_i32(_mm256_madd_epi16(
            _mm256_sub_epi16(qy, ey),
            _mm256_set1_epi16(1),
        ))
    }

    /// `sum table[q] * y` of one block whose indices are `q`: the table lookup with `pshufb`,
    /// then both sides widened to i16 and multiplied with `madd` (exact for all i8 values).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lut_block(table: __m256i, q: __m256i, y: __m256i) -> i32 {
        let v = _mm256_shuffle_epi8(table, q);
        let lo = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(y)),
        );
        let hi = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(y, 1)),
        );
        hsum_i32(_mm256_add_epi32(lo, hi))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_impl(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        let mut acc = 0.0f32;
        for (bw, bx) in w.iter().zip(x) {
            let isum = q4_0_block(nibbles(&bw.qs), load_q8(&bx.qs));
            acc = (isum as f32).mul_add(bw.d() * bx.d(), acc);
        }
        acc
    }

    /// [`q4_0_impl`] of one weight row with `N` activation rows (the nibbles unpacked once).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_xn_impl<const N: usize>(w: &[BlockQ4_0], x: [&[BlockQ8_0]; N]) -> [f32; N] {
        let mut acc = [0.0f32; N];
        for (i, bw) in w.iter().enumerate() {
            let q = nibbles(&bw.qs);
            let dw = bw.d();
            for t in 0..N {
                // SAFETY: i < w.len() <= x[t].len() (caller).
                let bx = unsafe { x[t].get_unchecked(i) };
                let isum = q4_0_block(q, load_q8(&bx.qs));
                acc[t] = (isum as f32).mul_add(dw * bx.d(), acc[t]);
            }
        }
        acc
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_nl_impl(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
        // SAFETY: the table is 16 readable bytes; `loadu` has no alignment requirement.
        let t = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
        let table = _mm256_set_m128i(t, t);
        let mut acc = 0.0f32;
        for (bw, bx) in w.iter().zip(x) {
            let isum = lut_block(table, nibbles(&bw.qs), load_q8(&bx.qs));
            acc = (isum as f32).mul_add(bw.d() * bx.d(), acc);
        }
        acc
    }

    /// 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32<T>(b: &[T]) -> __m256i {
        assert!(std::mem::size_of_val(b) >= 32);
        // SAFETY: at least 32 readable bytes (asserted); `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    /// Q2_K: per 32-element group, `maddubs` of the 2-bit quants (unsigned, pair sums within
    /// i16) with the activations, `madd` with the two 16-element sub-blocks' scales.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q2_k_impl(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = 0.0f32;
        let mut acc_min = 0.0f32;
        for (bw, bx) in w.iter().zip(x) {
            let mut lanes = _mm256_setzero_si256();
            let mut mins = 0i32;
            for k in 0..16 {
                mins += i32::from(bw.scales[k] >> 4) * bx.bsum(k);
            }
            for j in 0..2 {
                let q2 = load32(&bw.qs[32 * j..]);
                for k in 0..4 {
                    let g = 4 * j + k;
                    let shift = _mm_cvtsi32_si128(2 * k as i32);
                    let q = _mm256_and_si256(_mm256_srl_epi16(q2, shift), m3);
                    let p = _mm256_maddubs_epi16(q, load32(&bx.qs[32 * g..]));
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(bw.scales[2 * g + 1] & 0x0F)),
                        _mm_set1_epi16(i16::from(bw.scales[2 * g] & 0x0F)),
                    );
                    lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, sc));
                }
            }
            let isum = hsum_i32(lanes);
            let dx = bx.d();
            acc = (isum as f32).mul_add(f16_le(bw.d) * dx, acc);
            acc_min = (mins as f32).mul_add(f16_le(bw.dmin) * dx, acc_min);
        }
        acc - acc_min
    }

    /// `pshufb` controls that copy word `k` of each 128-bit lane into all of its 8 words.
    const WORD_SELECT: [[u8; 32]; 8] = {
        let mut t = [[0u8; 32]; 8];
        let mut k = 0;
        while k < 8 {
            let mut b = 0;
            while b < 32 {
                t[k][b] = (2 * k + b % 2) as u8;
                b += 1;
            }
            k += 1;
        }
        t
    };

    /// Q4_K: per 64 elements, `maddubs` of the low / high nibbles (pair sums at most
    /// 2 * 15 * 128) with the activations, `madd` with the sub-block's scale. The scales and mins
    /// are unpacked for all 8 sub-blocks at once (ggml's `utmp` masks), the min term is one
    /// `madd` of the activation's `bsums` with the mins in pairs, and the block's integer sum and
    /// min term are reduced together; the two float accumulators advance as one 2-lane `fma`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k_impl(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        // The selectors are read from a constant table: built in registers with
        // `array::from_fn`, LLVM folded them to constants in one build and in the next (an
        // unrelated change to the crate) filled a stack table with `vpinsrb` on every call and
        // copied it around the loop, 1.4x the decode time of the Qwen3-class file.
        // SAFETY: `k < 8`: 32 readable bytes of the table; unaligned load.
        let sel = |k: usize| unsafe { _mm256_loadu_si256(WORD_SELECT[k].as_ptr().cast()) };
        let mut acc = _mm_setzero_ps();
        for (bw, bx) in w.iter().zip(x) {
            // Decode streams the matrix through here one row after another (the AVX2 set has
            // no group kernel for Q4_K).
            prefetch_row_ahead(bw);
            let (sc16, m16) = scales_mins_words(bw);
            let sc16 = _mm256_broadcastsi128_si256(sc16);
            let mut lanes = _mm256_setzero_si256();
            for c in 0..4 {
                // SAFETY: c < 4: `qs[32c..32c + 32]` of the weights and `qs[64c..64c + 64]` of
                // the activation are inside their blocks; unaligned loads.
                let (q, y_lo, y_hi) = unsafe {
                    (
                        _mm256_loadu_si256(bw.qs.as_ptr().add(32 * c).cast()),
                        _mm256_loadu_si256(bx.qs.as_ptr().add(64 * c).cast()),
                        _mm256_loadu_si256(bx.qs.as_ptr().add(64 * c + 32).cast()),
                    )
                };
                let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), y_lo);
                let hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), y_hi);
                let lo = _mm256_madd_epi16(lo, _mm256_shuffle_epi8(sc16, sel(2 * c)));
                let hi = _mm256_madd_epi16(hi, _mm256_shuffle_epi8(sc16, sel(2 * c + 1)));
                lanes = _mm256_add_epi32(lanes, _mm256_add_epi32(lo, hi));
            }
            acc = accumulate_block(lanes, m16, bw, bx, acc);
        }
        row_result(acc)
    }

    /// The 8 lanes of `p[r]` summed per register: lane r of the result is the sum of `p[r]`
    /// (integer adds, exact in any order).
    // Superseded by `q4_0_rows`; kept as the baseline its tests and benchmark compare with.
    #[cfg(test)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32_x8(p: [__m256i; 8]) -> __m256i {
        let s01 = _mm256_hadd_epi32(p[0], p[1]);
        let s23 = _mm256_hadd_epi32(p[2], p[3]);
        let s45 = _mm256_hadd_epi32(p[4], p[5]);
        let s67 = _mm256_hadd_epi32(p[6], p[7]);
        // [r0 r1 r2 r3 | r0 r1 r2 r3] halves of rows 0..3, and of rows 4..7.
        let s0123 = _mm256_hadd_epi32(s01, s23);
        let s4567 = _mm256_hadd_epi32(s45, s67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(s0123, s4567, 0x20),
            _mm256_permute2x128_si256(s0123, s4567, 0x31),
        )
    }

    /// [`q4_0_impl`] of 8 weight rows with one activation row, row r in lane r of the float
    /// accumulator: each lane is the one-row kernel's `fma(isum, d_w * d_x, acc)` sequence (the
    /// way llama.cpp's repacked gemv holds 8 rows), so the bits are the same, without a
    /// horizontal sum per block and row.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `w[r]` has at least `x.len()` blocks.
    // Superseded by `q4_0_rows`; kept as the baseline its tests and benchmark compare with.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_rows8_impl(w: [&[BlockQ4_0]; 8], x: &[BlockQ8_0]) -> [f32; 8] {
        let ones = _mm256_set1_epi16(1);
        let eights = _mm256_set1_epi8(8);
        let mut acc = _mm256_setzero_ps();
        for (i, bx) in x.iter().enumerate() {
            let y = load_q8(&bx.qs);
            let ey = _mm256_maddubs_epi16(eights, y);
            let dx = bx.d();
            let mut p = [_mm256_setzero_si256(); 8];
            let mut d = [0.0f32; 8];
            for r in 0..8 {
                // SAFETY: i < x.len() <= w[r].len() (caller).
                let bw = unsafe { w[r].get_unchecked(i) };
                let qy = _mm256_maddubs_epi16(nibbles(&bw.qs), y);
                p[r] = _mm256_madd_epi16(_mm256_sub_epi16(qy, ey), ones);
                d[r] = bw.d() * dx;
            }
            let isum = _mm256_cvtepi32_ps(hsum_i32_x8(p));
            // SAFETY: `d` is 8 readable f32; loadu has no alignment requirement.
            let dv = unsafe { _mm256_loadu_ps(d.as_ptr()) };
            acc = _mm256_fmadd_ps(isum, dv, acc);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` is 8 writable f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
        out
    }

    /// [`q4_0_rows8_impl`] for 4 activation rows (prefill): 8 weight rows in the lanes, the
    /// 4 tokens in 4 accumulators; every lane is the one-row kernel's sequence for its (row,
    /// token), so the bits are the same.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `w[r]` has at least `x[t].len()` blocks and every
    /// `x[t]` the same length.
    // Superseded by `q4_0_rows`; kept as the baseline its tests and benchmark compare with.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_rows8_x4_impl(w: [&[BlockQ4_0]; 8], x: [&[BlockQ8_0]; 4]) -> [[f32; 8]; 4] {
        let ones = _mm256_set1_epi16(1);
        let eights = _mm256_set1_epi8(8);
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in 0..x[0].len() {
            // SAFETY: i < x[t].len() <= w[r].len() (caller).
            let bw: [&BlockQ4_0; 8] = std::array::from_fn(|r| unsafe { w[r].get_unchecked(i) });
            let dw: [f32; 8] = std::array::from_fn(|r| bw[r].d());
            // SAFETY: `dw` is 8 readable f32.
            let dwv = unsafe { _mm256_loadu_ps(dw.as_ptr()) };
            let q: [__m256i; 8] = std::array::from_fn(|r| nibbles(&bw[r].qs));
            for t in 0..4 {
                // SAFETY: as above.
                let bx = unsafe { x[t].get_unchecked(i) };
                let y = load_q8(&bx.qs);
                let ey = _mm256_maddubs_epi16(eights, y);
                let p: [__m256i; 8] = std::array::from_fn(|r| {
                    _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q[r], y), ey), ones)
                });
                let isum = _mm256_cvtepi32_ps(hsum_i32_x8(p));
                // Lane r: d_w(r) * d_x, the one-row kernel's product.
                let d = _mm256_mul_ps(dwv, _mm256_set1_ps(bx.d()));
                acc[t] = _mm256_fmadd_ps(isum, d, acc[t]);
            }
        }
        let mut out = [[0.0f32; 8]; 4];
        for t in 0..4 {
            // SAFETY: `out[t]` is 8 writable f32.
            unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
        }
        out
    }

    /// [`dot_q4_0_q8_0`] of 8 weight rows with 4 activation rows, bit-identical to 32 calls:
    /// `out[t][r]` is row r with token t.
    ///
    /// # Panics
    /// If the activation rows differ in length or a weight row is shorter than them.
    // Superseded by `q4_0_rows`; kept as the baseline its tests and benchmark compare with.
    #[cfg(test)]
    pub(crate) fn dot_q4_0_q8_0_rows8_x4(
        _: Token,
        w: [&[BlockQ4_0]; 8],
        x: [&[BlockQ8_0]; 4],
    ) -> [[f32; 8]; 4] {
        let n = x[0].len();
        assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
        assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
        // SAFETY: see below (the token); lengths checked.
        unsafe { q4_0_rows8_x4_impl(w, x) }
    }

    /// [`dot_q4_0_q8_0`] of 8 weight rows with one activation row, bit-identical to 8 calls.
    ///
    /// # Panics
    /// If a weight row has fewer blocks than `x`.
    // Superseded by `q4_0_rows`; kept as the baseline its tests and benchmark compare with.
    #[cfg(test)]
    pub(crate) fn dot_q4_0_q8_0_rows8(_: Token, w: [&[BlockQ4_0]; 8], x: &[BlockQ8_0]) -> [f32; 8] {
        assert!(w.iter().all(|r| r.len() >= x.len()), "weight row too short");
        // SAFETY: see below (the token); lengths checked.
        unsafe { q4_0_rows8_impl(w, x) }
    }

    /// Lane t of the result, for t < N, is the sum of the 8 lanes of `v[t]` (exact integer
    /// adds); lanes N..4 are zero.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum_i32_x4<const N: usize>(v: &[__m256i; N]) -> __m128i {
        const { assert!(N <= 4) };
        let mut p = [_mm256_setzero_si256(); 4];
        p[..N].copy_from_slice(v);
        // [a01 a23 b01 b23 | a45 a67 b45 b67], then [A_lo B_lo C_lo D_lo | A_hi B_hi C_hi D_hi].
        let s = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))
    }

    /// [`q4_k_impl`] of one weight row with `N` activation rows: the nibbles and scales are
    /// unpacked once per block. Each token's block sums and mins are integers (exact in any
    /// order: the mins are `madd`s of the activation's 16 block sums by the duplicated mins);
    /// the float steps per block, `fma(isum, d_w * d_x, acc)` and `fma(msum, dmin * d_x,
    /// acc_min)`, run for the N tokens in the lanes of one register, each lane the one-token
    /// operations in order, so the bits are those of N one-token calls.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k_xn_impl<const N: usize>(w: &[BlockQ4_K], x: [&[BlockQ8_K]; N]) -> [f32; N] {
        const { assert!(N <= 4) };
        let m4 = _mm256_set1_epi8(0x0F);
        // A constant table, as in `q4_k_impl`.
        // SAFETY: `k < 8`: 32 readable bytes of the table; unaligned load.
        let sel = |k: usize| unsafe { _mm256_loadu_si256(WORD_SELECT[k].as_ptr().cast()) };
        let mut acc = _mm_setzero_ps();
        let mut acc_min = _mm_setzero_ps();
        for (i, bw) in w.iter().enumerate() {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx = x.map(|r| unsafe { r.get_unchecked(i) });
            let (sc16, m16) = scales_mins_words(bw);
            let sc16 = _mm256_broadcastsi128_si256(sc16);
            let m_pairs = min_pairs(m16);
            let mut lanes = [_mm256_setzero_si256(); N];
            let mut mins = [_mm256_setzero_si256(); N];
            for t in 0..N {
                mins[t] = _mm256_madd_epi16(load32(&bx[t].bsums), m_pairs);
            }
            for c in 0..4 {
                let q = load32(&bw.qs[32 * c..]);
                let q_lo = _mm256_and_si256(q, m4);
                let q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s1 = _mm256_shuffle_epi8(sc16, sel(2 * c));
                let s2 = _mm256_shuffle_epi8(sc16, sel(2 * c + 1));
                for t in 0..N {
                    let lo = _mm256_maddubs_epi16(q_lo, load32(&bx[t].qs[64 * c..]));
                    let hi = _mm256_maddubs_epi16(q_hi, load32(&bx[t].qs[64 * c + 32..]));
                    let lo = _mm256_madd_epi16(lo, s1);
                    let hi = _mm256_madd_epi16(hi, s2);
                    lanes[t] = _mm256_add_epi32(lanes[t], _mm256_add_epi32(lo, hi));
                }
            }
            let mut dx = [0.0f32; 4];
            for t in 0..N {
                dx[t] = bx[t].d();
            }
            // SAFETY: `dx` is 4 readable f32; loadu has no alignment requirement.
            let dx = unsafe { _mm_loadu_ps(dx.as_ptr()) };
            let d = _mm_mul_ps(_mm_set1_ps(f16_le(bw.d)), dx);
            let dmin = _mm_mul_ps(_mm_set1_ps(f16_le(bw.dmin)), dx);
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum_i32_x4(&lanes)), d, acc);
            acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum_i32_x4(&mins)), dmin, acc_min);
        }
        let mut out = [0.0f32; 4];
        // SAFETY: `out` is 4 writable f32.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_sub_ps(acc, acc_min)) };
        std::array::from_fn(|t| out[t])
    }

    /// [`q4_k_xn_impl`] with 8 activation rows (prefill's 8-token groups): each block's
    /// nibbles and scales unpacked once for twice the tokens; the float steps of the 8 tokens
    /// run in the lanes of one 256-bit register, each lane the one-token operations in order.
    /// The mins are summed before the quants, so that their 8 registers are free again.
    /// Written out rather than `q4_k_xn_impl` widened to 8 tokens: that version gave the same
    /// bits but 0.72-0.78 against 0.59 ns per row, block and token (Zen 3).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k_x8_impl(w: &[BlockQ4_K], x: [&[BlockQ8_K]; 8]) -> [f32; 8] {
        let m4 = _mm256_set1_epi8(0x0F);
        // A constant table, as in `q4_k_impl`.
        // SAFETY: `k < 8`: 32 readable bytes of the table; unaligned load.
        let sel = |k: usize| unsafe { _mm256_loadu_si256(WORD_SELECT[k].as_ptr().cast()) };
        let mut acc = _mm256_setzero_ps();
        let mut acc_min = _mm256_setzero_ps();
        for (i, bw) in w.iter().enumerate() {
            // SAFETY: i < w.len() <= x[t].len() (caller).
            let bx: [&BlockQ8_K; 8] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(i) });
            let (sc16, m16) = scales_mins_words(bw);
            let sc16 = _mm256_broadcastsi128_si256(sc16);
            let m_pairs = min_pairs(m16);
            let mins = |t: usize| _mm256_madd_epi16(load32(&bx[t].bsums), m_pairs);
            let msum = _mm256_set_m128i(
                hsum_i32_x4(&[mins(4), mins(5), mins(6), mins(7)]),
                hsum_i32_x4(&[mins(0), mins(1), mins(2), mins(3)]),
            );
            let mut lanes = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = load32(&bw.qs[32 * c..]);
                let q_lo = _mm256_and_si256(q, m4);
                let q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s1 = _mm256_shuffle_epi8(sc16, sel(2 * c));
                let s2 = _mm256_shuffle_epi8(sc16, sel(2 * c + 1));
                for t in 0..8 {
                    let lo = _mm256_maddubs_epi16(q_lo, load32(&bx[t].qs[64 * c..]));
                    let hi = _mm256_maddubs_epi16(q_hi, load32(&bx[t].qs[64 * c + 32..]));
                    let lo = _mm256_madd_epi16(lo, s1);
                    let hi = _mm256_madd_epi16(hi, s2);
                    lanes[t] = _mm256_add_epi32(lanes[t], _mm256_add_epi32(lo, hi));
                }
            }
            let isum = _mm256_set_m128i(
                hsum_i32_x4(&[lanes[4], lanes[5], lanes[6], lanes[7]]),
                hsum_i32_x4(&[lanes[0], lanes[1], lanes[2], lanes[3]]),
            );
            let dx = _mm256_setr_ps(
                bx[0].d(),
                bx[1].d(),
                bx[2].d(),
                bx[3].d(),
                bx[4].d(),
                bx[5].d(),
                bx[6].d(),
                bx[7].d(),
            );
            let d = _mm256_mul_ps(_mm256_set1_ps(f16_le(bw.d)), dx);
            let dmin = _mm256_mul_ps(_mm256_set1_ps(f16_le(bw.dmin)), dx);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), dmin, acc_min);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` is 8 writable f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
        out
    }

    /// [`dot_q4_k_q8_k`] of one weight row with 8 activation rows, bit-identical to 8 calls.
    ///
    /// # Panics
    /// If an activation row has fewer blocks than `w`.
    pub(crate) fn dot_q4_k_q8_k_x8(_: Token, w: &[BlockQ4_K], x: [&[BlockQ8_K]; 8]) -> [f32; 8] {
        assert!(
            x.iter().all(|r| r.len() >= w.len()),
            "activation row too short"
        );
        // SAFETY: see below (the token); lengths checked.
        unsafe { q4_k_x8_impl(w, x) }
    }

    /// [`dot_q4_k_q8_k`] of one weight row with `N` activation rows, bit-identical to `N` calls.
    ///
    /// # Panics
    /// If an activation row has fewer blocks than `w`.
    pub(crate) fn dot_q4_k_q8_k_xn<const N: usize>(
        _: Token,
        w: &[BlockQ4_K],
        x: [&[BlockQ8_K]; N],
    ) -> [f32; N] {
        assert!(
            x.iter().all(|r| r.len() >= w.len()),
            "activation row too short"
        );
        // SAFETY: see below (the token); lengths checked.
        unsafe { q4_k_xn_impl(w, x) }
    }

    // SAFETY (all wrappers): a `Token` exists only after `Token::detect` confirmed AVX2, FMA and
    // F16C on this CPU, the features the implementations are compiled for.

    /// [`super::dot_q4_0_q8_0`] with AVX2.
    pub(crate) fn dot_q4_0_q8_0(_: Token, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q4_0_impl(w, x) }
    }

    /// [`dot_q4_0_q8_0`] of one weight row with `N` activation rows, bit-identical to `N` calls.
    ///
    /// # Panics
    /// If an activation row has fewer blocks than `w`.
    pub(crate) fn dot_q4_0_q8_0_xn<const N: usize>(
        _: Token,
        w: &[BlockQ4_0],
        x: [&[BlockQ8_0]; N],
    ) -> [f32; N] {
        assert!(
            x.iter().all(|r| r.len() >= w.len()),
            "activation row too short"
        );
        // SAFETY: see above; lengths checked.
        unsafe { q4_0_xn_impl(w, x) }
    }

    /// [`super::dot_iq4_nl_q8_0`] with AVX2.
    pub(crate) fn dot_iq4_nl_q8_0(_: Token, w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { iq4_nl_impl(w, x) }
    }

    /// [`super::dot_q2_k_q8_k`] with AVX2.
    pub(crate) fn dot_q2_k_q8_k(_: Token, w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q2_k_impl(w, x) }
    }

    /// [`super::dot_q4_k_q8_k`] with AVX2.
    pub(crate) fn dot_q4_k_q8_k(_: Token, w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q4_k_impl(w, x) }
    }
}

#[cfg(test)]
pub(super) mod tests;
