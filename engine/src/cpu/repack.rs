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
//! `quantize_row_q8_K`, the same as the unrepacked path) and multiplies with `gemv` (batches of
//! four or more tokens use `gemm` with `quantize_mat`, a different order, not reproduced here).
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

use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::q4_0::BlockQ4_0;
use super::q4_k::{scale_min_k4, BlockQ4_K};
use super::q8_0::BlockQ8_0;
use super::q8_k::BlockQ8_K;
use super::{f16_le, QK};

/// Whether llama.cpp repacks a matrix of `rows` rows of a type that it repacks on AVX2 (Q4_0,
/// IQ4_NL, Q4_K): `ne[1] % 8 == 0`.
#[inline]
pub(super) fn repacked_shape(rows: usize) -> bool {
    rows % 8 == 0
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

/// The same functions compiled for AVX2 + FMA (the integer dots vectorized; `mul_add` one
/// `vfmadd`), bit-identical to the portable ones: same integer results, same float operations.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::avx2::Token;
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_0_impl(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        q4_0_body(w, x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_nl_impl(w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
        iq4_nl_body(w, x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k_impl(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
        q4_k_body(w, x)
    }

    // SAFETY (all wrappers): a `Token` exists only after `Token::detect` confirmed AVX2, FMA and
    // F16C on this CPU, the features the implementations are compiled for.

    /// [`super::dot_q4_0_q8_0`] with AVX2.
    pub(in super::super) fn dot_q4_0_q8_0(_: Token, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q4_0_impl(w, x) }
    }

    /// [`super::dot_iq4_nl_q8_0`] with AVX2.
    pub(in super::super) fn dot_iq4_nl_q8_0(_: Token, w: &[BlockIq4Nl], x: &[BlockQ8_0]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { iq4_nl_impl(w, x) }
    }

    /// [`super::dot_q4_k_q8_k`] with AVX2.
    pub(in super::super) fn dot_q4_k_q8_k(_: Token, w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q4_k_impl(w, x) }
    }
}
