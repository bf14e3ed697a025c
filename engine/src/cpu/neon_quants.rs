//! aarch64 NEON kernels for the quant types beyond Q4_0 / Q4_1 / Q8_0 (those are in `neon.rs`):
//! the k-quants Q4_K, Q5_K, Q6_K against Q8_K activations.
//!
//! Each kernel is one `#[inline(always)]` body, generic over `SDOT`, compiled twice by
//! [`kernel!`]: with `sdot` (`neon,dotprod`) and with widening multiplies (`neon` only). The
//! integer parts are exact either way, so the two variants are bit-identical.
//!
//! # Order of operations: ggml's ARM NEON kernels
//!
//! The float arithmetic follows the plain NEON branch of ggml-cpu's
//! `ggml/src/ggml-cpu/arch/arm/quants.c` (no SVE, no `i8mm`), so that results on Orin can match
//! an ARM build of llama.cpp. For the k-quants every sub-block sum is an exact integer, and the
//! floats are touched once per super-block:
//!
//! * Q4_K: `sumf -= dmin * mins; sumf += d * isum` (two separate updates; the scalar reference
//!   does `sumf += d * isum - dmin * mins`, so the two differ in the last bits),
//! * Q5_K: `sumf += d * isum - dmin * mins` (the scalar reference's order: bit-identical),
//! * Q6_K: `sumf += (d_w * d_x) * isum` (ggml adds the `-32` offset in integers through the
//!   `bsums`; the scalar reference's order: bit-identical),
//!
//! where `d = d_x * d_w`, `dmin = d_x * dmin_w` and `mins = sum_k m_k * (bsum_2k + bsum_2k+1)`.
//! Scalar C expressions are followed as written, each operation rounded (as `neon.rs` does with
//! its `FUSED = false`): a compiler that contracts `a + b * c` into one fused multiply-add (GCC
//! in GNU C mode, clang's `-ffp-contract=on`) would give last-bit differences.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::f16_le;
use super::neon::{block_idot, sdot, Token};
use super::q4_k::{scale_min_k4, BlockQ4_K};
use super::q5_k::BlockQ5_K;
use super::q6_k::BlockQ6_K;
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
/// are i8 on both sides; the callers' weights are small non-negative values (below 64).
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
        sumf -= dmin * mins as f32;
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
        sumf += d * isum as f32;
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
        sumf += d * isum as f32 - dmin * mins as f32;
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
        sumf += f16_le(bw.d) * bx.d() * (isum - 32 * isum_mins) as f32;
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

/// Both NEON variants against the scalar references (bit for bit where ggml's NEON order is the
/// reference's order) and against scalar emulations of ggml's NEON order (bit for bit where it
/// is not), on random and extreme blocks, for several block counts.
#[cfg(test)]
mod tests {
    use super::super::testutil::Rng;
    use super::super::{blocks, dequantize_row, f16_le_bytes, quantize_row, GgmlType, Kernels};
    use super::*;

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
            _ => unreachable!("{ty}"),
        }
    }

    /// `nb` raw random blocks of `ty` with sane f16 scales. `extreme`: every quant and 6-bit
    /// scale at its maximum (Q6_K's i8 scales at -128), and every third block's scales zero.
    fn weights(r: &mut Rng, ty: GgmlType, nb: usize, extreme: bool) -> Vec<u8> {
        let bb = ty.block_bytes();
        let mut w = r.bytes(bb * nb);
        for (i, blk) in w.chunks_mut(bb).enumerate() {
            if extreme {
                blk.fill(0xFF);
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

    /// Q8_K activations of `nb` blocks, quantized from random floats; `extreme`: every quant
    /// -128 (bsums -2048), and every fourth block's `d` zero.
    fn activations(r: &mut Rng, nb: usize, extreme: bool) -> Vec<u8> {
        let n = nb * QK_K;
        let mut x = vec![0u8; nb * std::mem::size_of::<BlockQ8_K>()];
        quantize_row(GgmlType::Q8_K, &r.vec(n, 2.0), &mut x).unwrap();
        if extreme {
            for (i, blk) in x.chunks_mut(std::mem::size_of::<BlockQ8_K>()).enumerate() {
                blk[4..4 + QK_K].fill(0x80);
                for s in blk[4 + QK_K..].chunks_mut(2) {
                    s.copy_from_slice(&(-2048i16).to_le_bytes());
                }
                if i % 4 == 2 {
                    blk[..4].fill(0);
                }
            }
        }
        x
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
            sumf -= dmin * mins as f32;
            sumf += d * isum as f32;
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

    #[test]
    fn k_quants_follow_ggml_neon_order_bit_for_bit() {
        let mut r = Rng::new(300);
        let ks = neon_kernels();
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            for nb in [1usize, 2, 3, 7, 9, 16] {
                for extreme in [false, true] {
                    let (w, x) = (
                        weights(&mut r, ty, nb, extreme),
                        activations(&mut r, nb, extreme),
                    );
                    let n = nb * QK_K;
                    let scalar = Kernels::scalar().vec_dot(ty, n, &w, &x);
                    let want = if ty == GgmlType::Q4_K {
                        // Another order than the scalar reference: close to it, and the
                        // emulation of ggml's is what must hold bit for bit.
                        let (arm, mag) = arm_q4_k(blocks(&w), blocks(&x));
                        let tol = 1e-6 * mag + 1e-6;
                        assert!(
                            (arm - scalar).abs() <= tol,
                            "{ty} nb={nb} extreme={extreme}: {arm} vs scalar {scalar}"
                        );
                        arm
                    } else {
                        scalar
                    };
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
