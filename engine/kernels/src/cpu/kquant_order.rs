//! Q2_K, Q3_K and IQ4_XS · Q8_K in the float order of ggml's x86 kernels
//! (`ggml_vec_dot_q2_K_q8_K`, `ggml_vec_dot_q3_K_q8_K`, `ggml_vec_dot_iq4_xs_q8_K` of
//! `arch/x86/quants.c`, the `__AVX2__` branch, which llama.cpp's AVX-512 build compiles too).
//! llama.cpp does not repack Q3_K and IQ4_XS (see `repack.rs`), so these are what it runs for
//! them on x86; Q2_K matrices of a multiple of 8 rows it repacks on AVX-512 CPUs
//! (`repack::dot_q2_k_q8_k`), the others run this order.
//!
//! Both have the shape of the other x86 k-quant dots (`avx2_quants.rs`): per super-block eight
//! exact i32 lanes, lane `i` holding, for every 32-element group `g`, the products of elements
//! `32g + 4i .. 32g + 4i + 4` times that element's sub-block scale (`maddubs` pairs, `madd`
//! with the scales); the lanes converted to f32 and fused-multiply-added with the block's scale
//! product into an 8-lane accumulator; at the end `hsum_float_8`. The scale products are
//! `d_x * d_w` for Q3_K and `d_w * d_x` for IQ4_XS (f32 products, so the order does not matter).
//! Q2_K's min term goes into the same accumulator first: lane `i` gets
//! `fma(-d_x * dmin_w, m_2i * bsum_2i + m_2i+1 * bsum_2i+1, acc)`, then the scaled quants' lane.
//!
//! As in `repack.rs`: a portable function (the scalar kernel set on x86-64) and an AVX2 one,
//! bit-identical (tested).

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::block::f16_le;
use super::iq4_nl::KVALUES_IQ4NL;
use super::iq4_xs::BlockIq4Xs;
use super::q2_k::BlockQ2_K;
use super::q3_k::BlockQ3_K;
use super::q8_k::{BlockQ8_K, QK_K};

/// ggml's `hsum_float_8`: `(lo + hi)`, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Adds `scale * (products of elements base + 4i .. base + 4i + 4)` to lane `i`, for a 32-element
/// group of weights `q` (already signed values) at activations `y`, where elements 0..16 of the
/// group take `scale_lo` and 16..32 `scale_hi` (Q3_K's 16-element sub-blocks; IQ4_XS passes
/// the same scale twice).
#[inline(always)]
fn group_lanes(lanes: &mut [i32; 8], q: &[i8], y: &[i8], scale_lo: i32, scale_hi: i32) {
    for i in 0..8 {
        let mut s = 0i32;
        for e in 4 * i..4 * i + 4 {
            s += i32::from(q[e]) * i32::from(y[e]);
        }
        lanes[i] += if i < 4 { scale_lo } else { scale_hi } * s;
    }
}

#[inline(always)]
fn q2_k_body(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        for (i, a) in acc.iter_mut().enumerate() {
            let prod = i32::from(bw.scales[2 * i] >> 4) * bx.bsum(2 * i)
                + i32::from(bw.scales[2 * i + 1] >> 4) * bx.bsum(2 * i + 1);
            *a = dmin.mul_add(prod as f32, *a);
        }
        let q = bw.quants().map(|v| v as i8);
        let mut lanes = [0i32; 8];
        for g in 0..QK_K / 32 {
            let r = 32 * g..32 * g + 32;
            let (lo, hi) = (bw.scales[2 * g] & 0x0F, bw.scales[2 * g + 1] & 0x0F);
            group_lanes(&mut lanes, &q[r.clone()], &bx.qs[r], lo.into(), hi.into());
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

#[inline(always)]
fn q3_k_body(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let sc = bw.scales();
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for g in 0..QK_K / 32 {
            let r = 32 * g..32 * g + 32;
            group_lanes(
                &mut lanes,
                &q[r.clone()],
                &bx.qs[r],
                sc[2 * g],
                sc[2 * g + 1],
            );
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

/// ggml's `mul_add_epi8` product of a weight value `q` and an activation `y`:
/// `|q| * sign(y, q)`, the sign flip wrapping in i8 as `_mm256_sign_epi8` does. It equals
/// `q * y` except for `y = -128` with `q < 0` (then `|q| * -128`), which a Q8_K quantizer never
/// writes (its quants are at most 127 in magnitude); this keeps hand-made rows bit-identical too.
#[inline(always)]
fn sign_product(q: i8, y: i8) -> i32 {
    let sy = match q {
        0 => 0,
        q if q < 0 => y.wrapping_neg(),
        _ => y,
    };
    i32::from(q.unsigned_abs()) * i32::from(sy)
}

#[inline(always)]
fn iq4_xs_body(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = f16_le(bw.d) * bx.d();
        let mut lanes = [0i32; 8];
        for k in 0..QK_K / 32 {
            let qs = &bw.qs[16 * k..16 * k + 16];
            let mut q = [0i8; 32];
            for j in 0..16 {
                q[j] = KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)];
                q[j + 16] = KVALUES_IQ4NL[usize::from(qs[j] >> 4)];
            }
            let y = &bx.qs[32 * k..32 * k + 32];
            let ls = bw.scale(k);
            for (i, lane) in lanes.iter_mut().enumerate() {
                let s: i32 = (4 * i..4 * i + 4).map(|e| sign_product(q[e], y[e])).sum();
                *lane += ls * s;
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

/// Q2_K · Q8_K in the order of ggml's x86 `ggml_vec_dot_q2_K_q8_K` (portable).
pub(super) fn dot_q2_k_q8_k(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    q2_k_body(w, x)
}

/// Q3_K · Q8_K in the order of ggml's x86 `ggml_vec_dot_q3_K_q8_K` (portable).
pub(super) fn dot_q3_k_q8_k(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    q3_k_body(w, x)
}

/// IQ4_XS · Q8_K in the order of ggml's x86 `ggml_vec_dot_iq4_xs_q8_K` (portable).
pub(super) fn dot_iq4_xs_q8_k(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    iq4_xs_body(w, x)
}

/// The same orders with AVX2 intrinsics, bit-identical to the portable functions: the lanes'
/// integer sums are exact either way (Q2_K / Q3_K widen the products to i16 and sum them with
/// `madd`, exact for every i8 value, -128 included; IQ4_XS takes ggml's `sign` / `maddubs`
/// products, which the portable [`sign_product`] spells out), the float operations are the same.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    // The enclosing file by its absolute path: `scripts/check-layers.py` resolves paths per file
    // and would take `super::` here for `cpu/mod.rs`.
    use crate::cpu::kquant_order::*;
    use crate::cpu::x86::{hsum, iq4_nl_values, Token};
    use std::arch::x86_64::*;

    /// 16 i16 pair sums of a 32-element group (`maddubs` order: pair `j` = elements `2j, 2j + 1`)
    /// -> 8 i32 lanes, lane `i` the sum of elements `4i .. 4i + 4` times `lo` for `i < 4` (the
    /// first 16-element sub-block) and `hi` after: one `madd`. Exact: the scales are 6-bit
    /// (Q3_K, biased) or 4-bit (Q2_K), the pairs at most 2 * 7 * 128 in magnitude.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scaled_pairs(pairs: __m256i, lo: i32, hi: i32) -> __m256i {
        // Both scales fit i16 (|scale| <= 32).
        let sc = _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16));
        _mm256_madd_epi16(pairs, sc)
    }

    /// 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load32<T>(b: &[T]) -> __m256i {
        assert!(std::mem::size_of_val(b) >= 32);
        // SAFETY: at least 32 readable bytes (asserted); `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q2_k_impl(w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for (bw, bx) in w.iter().zip(x) {
            let d = bx.d() * f16_le(bw.d);
            let dmin = -bx.d() * f16_le(bw.dmin);
            // SAFETY: `scales` is 16 readable bytes; `loadu` has no alignment requirement.
            let sc = unsafe { _mm_loadu_si128(bw.scales.as_ptr().cast()) };
            let mins =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
            let prod = _mm256_madd_epi16(mins, load32(&bx.bsums));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
            let mut lanes = _mm256_setzero_si256();
            for j in 0..2 {
                let q2 = load32(&bw.qs[32 * j..]);
                for k in 0..4 {
                    let g = 4 * j + k;
                    let shift = _mm_cvtsi32_si128(2 * k as i32);
                    let q = _mm256_and_si256(_mm256_srl_epi16(q2, shift), m3);
                    let (lo, hi) = (bw.scales[2 * g] & 0x0F, bw.scales[2 * g + 1] & 0x0F);
                    // Unsigned quants 0..3: `maddubs` pairs at most 2 * 3 * 128, exact.
                    let p = _mm256_maddubs_epi16(q, load32(&bx.qs[32 * g..]));
                    lanes = _mm256_add_epi32(lanes, scaled_pairs(p, lo.into(), hi.into()));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q3_k_impl(w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let mut acc = _mm256_setzero_ps();
        for (bw, bx) in w.iter().zip(x) {
            let d = bx.d() * f16_le(bw.d);
            let sc = bw.scales();
            let hm = load32(&bw.hmask);
            let mut lanes = _mm256_setzero_si256();
            for j in 0..2 {
                let q3 = load32(&bw.qs[32 * j..]);
                for k in 0..4 {
                    let g = 4 * j + k;
                    let shift = _mm_cvtsi32_si128(2 * k as i32);
                    let low = _mm256_and_si256(_mm256_srl_epi16(q3, shift), m3);
                    // A clear high bit subtracts 4: `low * y - 4 * y` where it is clear, two
                    // `maddubs` of unsigned operands (pairs at most 2 * 4 * 128, exact).
                    let bit = _mm256_set1_epi8((1u8 << g) as i8);
                    let clear =
                        _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                    let y = load32(&bx.qs[32 * g..]);
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(low, y),
                        _mm256_maddubs_epi16(_mm256_and_si256(clear, four), y),
                    );
                    lanes = _mm256_add_epi32(lanes, scaled_pairs(p, sc[2 * g], sc[2 * g + 1]));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
        }
        hsum(acc)
    }

    /// Sub-block `k` of an IQ4_XS block as 32 signed values (the table entries of the low
    /// nibbles, then of the high ones).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_values(bw: &BlockIq4Xs, k: usize) -> __m256i {
        let qs: &[u8; 16] = bw.qs[16 * k..16 * k + 16].try_into().expect("k < 8");
        // SAFETY: AVX2 is present (this function's features).
        unsafe { iq4_nl_values(qs) }
    }

    /// The eight sub-block scales ([`x86::iq4_xs_scales`](crate::cpu::x86::iq4_xs_scales)) as
    /// i16 lanes 0..8 of both 128-bit halves; [`iq4_xs_scale`] broadcasts one.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_scales(bw: &BlockIq4Xs) -> __m256i {
        let scales = crate::cpu::x86::iq4_xs_scales(bw);
        // Packed: [s0..s3, s0..s3 | s4..s7, s4..s7]; quads 0 and 2 in both halves: s0..s7.
        _mm256_permute4x64_epi64::<0x88>(_mm256_packs_epi32(scales, scales))
    }

    /// Scale `k` of [`iq4_xs_scales`] in every i16 lane: one in-lane shuffle.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_scale(scales: __m256i, k: usize) -> __m256i {
        let pick = (((2 * k + 1) << 8) | (2 * k)) as i16;
        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pick))
    }

    /// ggml's `mul_add_epi8` then `madd` with the sub-block scale (`ls`, in every i16 lane):
    /// lane `i` the scale times the [`sign_product`]s of elements `4i .. 4i + 4`. `abs_q` is
    /// `sign(q, q)`. Exact: a `maddubs` pair is at most 2 * 127 * 128 in magnitude (IQ4_NL's
    /// values are -127..=113), no i16 saturation.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_lanes(abs_q: __m256i, q: __m256i, y: __m256i, ls: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(abs_q, _mm256_sign_epi8(y, q));
        _mm256_madd_epi16(p, ls)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_impl(w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (bw, bx) in w.iter().zip(x) {
            // Decode streams the weights once: the lines of the block 16 blocks ahead, as the
            // other one-row k-quant kernels do. A prefetch never faults, whatever the address.
            let ahead = (bw as *const BlockIq4Xs)
                .cast::<u8>()
                .wrapping_add(16 * 136);
            for line in 0..3 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
            let d = f16_le(bw.d) * bx.d();
            let ls = iq4_xs_scales(bw);
            // Two integer sums (independent chains); integer addition is exact in any order.
            let mut lanes = [_mm256_setzero_si256(); 2];
            for k in 0..QK_K / 32 {
                let q = iq4_xs_values(bw, k);
                let y = load32(&bx.qs[32 * k..]);
                let p = iq4_xs_lanes(_mm256_sign_epi8(q, q), q, y, iq4_xs_scale(ls, k));
                lanes[k % 2] = _mm256_add_epi32(lanes[k % 2], p);
            }
            let sum = _mm256_add_epi32(lanes[0], lanes[1]);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), acc);
        }
        hsum(acc)
    }

    /// [`iq4_xs_impl`] of one weight row with `N` activation rows: each sub-block's values,
    /// their magnitudes and scale are unpacked once for all tokens; every token's lanes and f32
    /// operations are the one-row kernel's.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; every `x[t]` has at least `w.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs_xn_impl<const N: usize>(w: &[BlockIq4Xs], x: [&[BlockQ8_K]; N]) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        // Loops, not `array::map`: a closure does not take this function's target features,
        // and was not inlined here (3% of a prefill of SmolLM2 IQ4_XS on Zen 3).
        for (i, bw) in w.iter().enumerate() {
            let ls = iq4_xs_scales(bw);
            let mut lanes = [_mm256_setzero_si256(); N];
            for k in 0..QK_K / 32 {
                let q = iq4_xs_values(bw, k);
                let abs_q = _mm256_sign_epi8(q, q);
                let ls = iq4_xs_scale(ls, k);
                for t in 0..N {
                    // SAFETY: i < w.len() <= x[t].len() (caller).
                    let bx = unsafe { x[t].get_unchecked(i) };
                    let p = iq4_xs_lanes(abs_q, q, load32(&bx.qs[32 * k..]), ls);
                    lanes[t] = _mm256_add_epi32(lanes[t], p);
                }
            }
            let dw = f16_le(bw.d);
            for (t, lanes) in lanes.into_iter().enumerate() {
                // SAFETY: as above.
                let d = dw * unsafe { x[t].get_unchecked(i) }.d();
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
            }
        }
        let mut out = [0f32; N];
        for (o, a) in out.iter_mut().zip(acc) {
            // SAFETY: AVX2 is present (this function's features).
            *o = unsafe { hsum(a) };
        }
        out
    }

    // SAFETY (all wrappers): a `Token` exists only after `Token::detect` confirmed AVX2, FMA
    // and F16C on this CPU, the features the implementations are compiled for.

    /// [`super::dot_q2_k_q8_k`] with AVX2.
    pub(crate) fn dot_q2_k_q8_k(_: Token, w: &[BlockQ2_K], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q2_k_impl(w, x) }
    }

    /// [`super::dot_q3_k_q8_k`] with AVX2.
    pub(crate) fn dot_q3_k_q8_k(_: Token, w: &[BlockQ3_K], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { q3_k_impl(w, x) }
    }

    /// [`super::dot_iq4_xs_q8_k`] with AVX2.
    pub(crate) fn dot_iq4_xs_q8_k(_: Token, w: &[BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        // SAFETY: see above.
        unsafe { iq4_xs_impl(w, x) }
    }

    /// [`dot_iq4_xs_q8_k`] of one weight row with `N` activation rows at once (bit-identical
    /// to `N` calls).
    ///
    /// # Panics
    /// If an activation row is shorter than `w`.
    pub(crate) fn dot_iq4_xs_q8_k_xn<const N: usize>(
        _: Token,
        w: &[BlockIq4Xs],
        x: [&[BlockQ8_K]; N],
    ) -> [f32; N] {
        assert!(
            x.iter().all(|x| x.len() >= w.len()),
            "activation row too short"
        );
        // SAFETY: see above; the rows are long enough (asserted).
        unsafe { iq4_xs_xn_impl(w, x) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::blocks;
    use super::super::repack::tests::{exact, q8_k_row, random_blocks, scale};
    use super::*;
    use crate::testutil::Rng;
    use edge_gguf::GgmlType as T;

    /// The x86 orders equal the f64 dot within rounding, the AVX2 kernels equal the portable
    /// ones bit for bit, and both kernel sets dispatch to them: random blocks with random scales,
    /// odd block counts, extreme values (largest f16 scales, activations all -128).
    #[test]
    fn x86_orders_exact_and_avx2_bit_identical() {
        let mut r = Rng::new(5);
        #[cfg(target_arch = "x86_64")]
        let token = super::super::x86::Token::detect();
        for nb in [1usize, 2, 3, 7] {
            for extreme in [false, true] {
                // Q3_K: f16 d last (bytes 108..110); IQ4_XS: f16 d first.
                let q3 = random_blocks(&mut r, nb, 110, |r, b| {
                    b[108..].copy_from_slice(&scale(r, extreme))
                });
                let iq = random_blocks(&mut r, nb, 136, |r, b| {
                    b[..2].copy_from_slice(&scale(r, extreme))
                });
                // Q2_K: f16 d and dmin last (bytes 80..84).
                let q2 = random_blocks(&mut r, nb, 84, |r, b| {
                    b[80..82].copy_from_slice(&scale(r, extreme));
                    b[82..].copy_from_slice(&scale(r, extreme));
                });
                let x = q8_k_row(&mut r, nb, extreme);
                let got_q2 = dot_q2_k_q8_k(blocks(&q2), blocks(&x));
                let got_q3 = dot_q3_k_q8_k(blocks(&q3), blocks(&x));
                let got_iq = dot_iq4_xs_q8_k(blocks(&iq), blocks(&x));
                if !extreme {
                    // IQ4_XS takes ggml's sign products, exact where no activation is -128 (a
                    // quantizer never writes it): that row has -127 in its place.
                    let clean = without_min_quants(&x);
                    let got_iq_clean = dot_iq4_xs_q8_k(blocks(&iq), blocks(&clean));
                    for (ty, w, x, got) in [
                        (T::Q2_K, &q2, &x, got_q2),
                        (T::Q3_K, &q3, &x, got_q3),
                        (T::IQ4_XS, &iq, &clean, got_iq_clean),
                    ] {
                        let (want, mag) = exact(ty, w, T::Q8_K, x, nb * QK_K);
                        assert!((f64::from(got) - want).abs() <= 1e-6 * mag, "{ty} {nb}");
                    }
                }
                let scalar = super::super::Kernels::scalar();
                assert_eq!(
                    scalar.vec_dot(T::Q2_K, nb * QK_K, &q2, &x).to_bits(),
                    got_q2.to_bits()
                );
                assert_eq!(
                    scalar.vec_dot(T::Q3_K, nb * QK_K, &q3, &x).to_bits(),
                    got_q3.to_bits()
                );
                assert_eq!(
                    scalar.vec_dot(T::IQ4_XS, nb * QK_K, &iq, &x).to_bits(),
                    got_iq.to_bits()
                );
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = token {
                    let c = avx2::dot_q2_k_q8_k(t, blocks(&q2), blocks(&x));
                    assert_eq!(c.to_bits(), got_q2.to_bits(), "Q2_K nb={nb} {extreme}");
                    let a = avx2::dot_q3_k_q8_k(t, blocks(&q3), blocks(&x));
                    let b = avx2::dot_iq4_xs_q8_k(t, blocks(&iq), blocks(&x));
                    assert_eq!(a.to_bits(), got_q3.to_bits(), "Q3_K nb={nb} {extreme}");
                    assert_eq!(b.to_bits(), got_iq.to_bits(), "IQ4_XS nb={nb} {extreme}");
                    let k = super::super::Kernels::avx2().unwrap();
                    assert_eq!(
                        k.vec_dot(T::Q2_K, nb * QK_K, &q2, &x).to_bits(),
                        c.to_bits()
                    );
                    assert_eq!(
                        k.vec_dot(T::Q3_K, nb * QK_K, &q3, &x).to_bits(),
                        a.to_bits()
                    );
                    assert_eq!(
                        k.vec_dot(T::IQ4_XS, nb * QK_K, &iq, &x).to_bits(),
                        b.to_bits()
                    );
                }
            }
        }
    }

    /// A Q8_K row with every quant -128 changed to -127 (the sums are not read by IQ4_XS).
    fn without_min_quants(x: &[u8]) -> Vec<u8> {
        let mut x = x.to_vec();
        for b in x.chunks_exact_mut(292) {
            b[4..260]
                .iter_mut()
                .filter(|v| **v == 0x80)
                .for_each(|v| *v = 0x81);
        }
        x
    }

    /// The N-token IQ4_XS kernel equals N one-token dots bit for bit (1 to 4 tokens, odd block
    /// counts, -128 activations and extreme scales), and `matvec_tokens` takes it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn iq4_xs_tokens_equal_one_token_bit_for_bit() {
        let Some(t) = super::super::x86::Token::detect() else {
            return;
        };
        let mut r = Rng::new(19);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for nb in [1usize, 2, 5] {
            for extreme in [false, true] {
                let rows = 5;
                let iq = random_blocks(&mut r, rows * nb, 136, |r, b| {
                    b[..2].copy_from_slice(&scale(r, extreme))
                });
                let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, extreme)).collect();
                let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let rb = 136 * nb;
                for row in iq.chunks_exact(rb) {
                    let w = blocks(row);
                    let want = xb.map(|x| dot_iq4_xs_q8_k(w, x));
                    let one = xb.map(|x| avx2::dot_iq4_xs_q8_k(t, w, x));
                    assert_eq!(bits(&one), bits(&want), "one token nb={nb} {extreme}");
                    let four = avx2::dot_iq4_xs_q8_k_xn(t, w, xb);
                    let three = avx2::dot_iq4_xs_q8_k_xn(t, w, [xb[0], xb[1], xb[2]]);
                    let two = avx2::dot_iq4_xs_q8_k_xn(t, w, [xb[2], xb[3]]);
                    let single = avx2::dot_iq4_xs_q8_k_xn(t, w, [xb[1]]);
                    assert_eq!(bits(&four), bits(&want), "xn::<4> nb={nb} {extreme}");
                    assert_eq!(bits(&three), bits(&want[..3]), "xn::<3> nb={nb}");
                    assert_eq!(bits(&two), bits(&want[2..]), "xn::<2> nb={nb}");
                    assert_eq!(bits(&single), bits(&want[1..2]), "xn::<1> nb={nb}");
                }
                let k = super::super::Kernels::avx2().unwrap();
                let mut got = vec![vec![f32::NAN; rows]; 4];
                let [a, b, c, d] = &mut got[..] else {
                    unreachable!()
                };
                let x4: [&[u8]; 4] = std::array::from_fn(|k| &xs[k][..]);
                assert!(k.matvec_tokens(T::IQ4_XS, nb * QK_K, &iq, x4, 0..rows, [a, b, c, d]));
                for (tok, x) in xs.iter().enumerate() {
                    for (i, row) in iq.chunks_exact(rb).enumerate() {
                        let want = dot_iq4_xs_q8_k(blocks(row), blocks(x));
                        assert_eq!(got[tok][i].to_bits(), want.to_bits(), "matvec_tokens");
                    }
                }
            }
        }
    }
}
