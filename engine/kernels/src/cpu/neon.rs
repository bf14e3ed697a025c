//! aarch64 NEON kernels (Jetson Orin's Cortex-A78AE and any other ARMv8 CPU), with the
//! dot-product instruction `sdot` where the CPU has it.
//!
//! Every kernel here is an `unsafe fn` with `#[target_feature]`; the safe wrappers at the bottom
//! take a [`Token`], which exists only once the CPU features were detected. Stable Rust has no
//! `vdotq_s32` intrinsic, so `sdot` is emitted with `asm!` (in functions compiled with the
//! `dotprod` feature only); without it the same integers come from widening multiplies
//! (`vmull_s8` + pairwise adds).
//!
//! # Order of operations: ggml's ARM NEON kernels
//!
//! The dots add in the order of ggml-cpu's NEON code (`ggml/src/ggml-cpu/arch/arm/quants.c`,
//! the plain NEON branch: no SVE, no `i8mm`), so that results on Orin can match an ARM build of
//! llama.cpp:
//!
//! * Blocks go in pairs: the even block of each pair accumulates into one f32x4 accumulator, the
//!   odd block into a second one.
//! * Per block, the integer products are summed into 4 i32 lanes, lane `k` holding elements
//!   `4k..4k+3` and `16+4k..16+4k+3` (what two chained `sdot`s give). Integers are exact, so
//!   the widening-multiply variant produces the very same lanes, and the results of the two
//!   variants are bit-identical.
//! * Each lane is converted to f32 and accumulated as `acc + lane * (d_w * d_x)` — `vmlaq_n_f32`,
//!   a multiply then an add, each rounded ([`FUSED`] = false; see there).
//! * At the end: `hsum(acc0) + hsum(acc1)` where `hsum(v) = (v0 + v1) + (v2 + v3)` (`vaddvq_f32`);
//!   for Q4_1, `+ summs`, where `summs` accumulated `m_w0 * s_x0 + m_w1 * s_x1` per pair.
//! * An odd last block is added in scalar code, as ggml's tail loop writes it:
//!   Q4_0 `sumf += (sumi * d_w) * d_x`, Q4_1 `sumf += ((d_w * d_x) * sumi + m_w * s_x)`,
//!   Q8_0 `sumf += sumi * (d_w * d_x)`, each `a * b + c` in it fused as GCC compiles it
//!   ([`CONTRACT`]; Q4_1's `summs` too).
//!
//! The quantizers are ggml's NEON `quantize_row_q8_0/1` for the ARM rounding flavour (`1/d`,
//! round half to even) and bit-identical to the scalar references for every flavour.

use std::arch::aarch64::*;
use std::arch::asm;

use super::block::{f16_le_bytes, QK};
use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::rounding::Q8Rounding;

/// Whether `acc + lane * scale` is one fused multiply-add. ggml writes `vmlaq_n_f32`, which ACLE
/// defines as a multiply then an add (two roundings), and which GCC 12+ compiles that way
/// (`fmul` + `fadd` in ggml's aarch64 objects; `tests/data/neon-ggml/` agrees bit for bit);
/// clang (and older GCC with `-ffp-contract=fast`) fuse it into `fmla`. We follow the
/// unfused definition; a llama.cpp built with clang would differ in the last bits (flip this to
/// match it).
const FUSED: bool = false;

/// Whether the scalar C expressions of ggml's kernels (the odd last block, Q4_1's `m * s` sums,
/// the k-quants' per-block updates) are contracted into fused multiply-adds, as GCC compiles
/// them in GNU C mode (`-ffp-contract=fast`, the default; llama.cpp's CMake asks for C11 with
/// extensions, i.e. `-std=gnu11`). Measured: ggml's own `ggml_vec_dot_*` built for aarch64 with
/// GCC 12 (`tests/data/neon-ggml/`) contract every such `a * b + c`, and equal these kernels bit
/// for bit only with this on. Which product of `a * b + c * d` GCC fuses is read from its code:
/// see each use of [`fmadd`].
const CONTRACT: bool = true;

/// `a * b + c` as ggml's C source writes it, compiled as GCC does ([`CONTRACT`]): one rounding
/// (`fmadd`, always present on aarch64) or two.
#[inline(always)]
pub(super) fn fmadd(a: f32, b: f32, c: f32) -> f32 {
    if CONTRACT {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Proof that this CPU has NEON (and whether it has the dot-product instructions): only
/// [`Token::detect`] creates one, and every safe entry point of this file takes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Token {
    dotprod: bool,
}

impl Token {
    /// A token if this CPU runs the kernels in this file (every aarch64 CPU with NEON), using
    /// `sdot` if the CPU has the dot-product extension.
    pub(super) fn detect() -> Option<Token> {
        std::arch::is_aarch64_feature_detected!("neon").then(|| Token {
            dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
        })
    }

    /// Whether the dots use `sdot`.
    pub(super) fn dotprod(self) -> bool {
        self.dotprod
    }

    /// The same token with the widening-multiply dots (for tests and benchmarks).
    pub(super) fn without_dotprod(self) -> Token {
        Token { dotprod: false }
    }
}

/// `acc + sdot(a, b)`: lane `k` of the result adds the four products of bytes `4k..4k+3`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` only reads and writes the three vector registers named here (no memory,
    // no flags); the function is compiled with `dotprod`, and callers hold a `Token` proving
    // the CPU has it.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// The integer dot of one block pair, as ggml's 4 lanes: lane `k` sums the products of
/// elements `4k..4k+3` (`w_lo`/`x_lo`, elements 0..15) and `16+4k..16+4k+3` (`w_hi`/`x_hi`).
/// `SDOT` picks `sdot` (only in `dotprod` functions) or widening multiplies; the lanes are the
/// same integers either way.
#[inline(always)]
pub(super) unsafe fn block_idot<const SDOT: bool>(
    w_lo: int8x16_t,
    w_hi: int8x16_t,
    x_lo: int8x16_t,
    x_hi: int8x16_t,
) -> int32x4_t {
    if SDOT {
        // SAFETY: `SDOT` is true only when inlined into the `neon,dotprod` kernels below.
        unsafe { sdot(sdot(vdupq_n_s32(0), w_lo, x_lo), w_hi, x_hi) }
    } else {
        // i8 x i8 products fit i16 (|-128 * -128| = 16384); pair sums are widened to i32.
        // a: lanes {0,1}+{16,17}, {2,3}+{18,19}, ...; b: the same for elements 8..15, 24..31.
        let a = vpaddlq_s16(vmull_s8(vget_low_s8(w_lo), vget_low_s8(x_lo)));
        let a = vpadalq_s16(a, vmull_s8(vget_low_s8(w_hi), vget_low_s8(x_hi)));
        let b = vpaddlq_s16(vmull_high_s8(w_lo, x_lo));
        let b = vpadalq_s16(b, vmull_high_s8(w_hi, x_hi));
        // [a0+a1, a2+a3, b0+b1, b2+b3]: elements 0..3, 4..7, 8..11, 12..15 (+16 each).
        vpaddq_s32(a, b)
    }
}

/// `acc + lanes * scale` in ggml's rounding (see [`FUSED`]).
#[inline(always)]
pub(super) unsafe fn mla(acc: float32x4_t, lanes: int32x4_t, scale: f32) -> float32x4_t {
    let v = vcvtq_f32_s32(lanes); // exact: |lane| <= 8 * 128 * 128 < 2^24
    if FUSED {
        vfmaq_n_f32(acc, v, scale)
    } else {
        vaddq_f32(acc, vmulq_n_f32(v, scale))
    }
}

/// `(v0 + v1) + (v2 + v3)`, as `vaddvq_f32` (two pairwise adds) computes it.
#[inline(always)]
pub(super) unsafe fn hsum(v: float32x4_t) -> f32 {
    let p = vpaddq_f32(v, v);
    vpadds_f32(vget_low_f32(p))
}

/// The 32 nibbles of a Q4 block as two vectors of bytes 0..15: elements 0..15 (low nibbles)
/// and 16..31 (high nibbles).
#[inline(always)]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> (int8x16_t, int8x16_t) {
    // SAFETY: `qs` is 16 readable bytes; `vld1q_u8` has no alignment requirement.
    let q = unsafe { vld1q_u8(qs.as_ptr()) };
    let lo = vandq_u8(q, vdupq_n_u8(0x0F));
    let hi = vshrq_n_u8::<4>(q);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// The 32 quants of a Q8 block as elements 0..15 and 16..31.
#[inline(always)]
pub(super) unsafe fn load_q8(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
    // SAFETY: `qs` is 32 readable bytes; `vld1q_s8` has no alignment requirement.
    unsafe { (vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16))) }
}

/// Scalar integer dot of a Q4 block (nibbles minus `offset`) with a Q8 block (the tail block).
#[inline(always)]
fn q4_sumi(qs: &[u8; 16], x: &[i8; 32], offset: i32) -> i32 {
    let mut sumi = 0i32;
    for j in 0..QK / 2 {
        sumi += (i32::from(qs[j] & 0x0F) - offset) * i32::from(x[j])
            + (i32::from(qs[j] >> 4) - offset) * i32::from(x[j + QK / 2]);
    }
    sumi
}

/// Q4_1 . Q8_1 in ggml's NEON order (module docs).
#[inline(always)]
unsafe fn dot_q4_1_q8_1_body<const SDOT: bool>(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let nb = w.len().min(x.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut summs = 0.0f32;
    let mut ib = 0;
    while ib + 1 < nb {
        let (w0, w1, x0, x1) = (&w[ib], &w[ib + 1], &x[ib], &x[ib + 1]);
        // `m0 * s0 + m1 * s1`: GCC fuses the first product (m and s are f16 values, so each
        // product is exact in f32 and fusing changes no bits here).
        summs += fmadd(w0.m(), x0.s(), w1.m() * x1.s());
        for (a, (bw, bx)) in acc.iter_mut().zip([(w0, x0), (w1, x1)]) {
            // SAFETY: plain NEON on in-bounds block references; see `block_idot` for SDOT.
            unsafe {
                let (wl, wh) = nibbles(&bw.qs);
                let (xl, xh) = load_q8(&bx.qs);
                *a = mla(*a, block_idot::<SDOT>(wl, wh, xl, xh), bw.d() * bx.d());
            }
        }
        ib += 2;
    }
    // SAFETY: plain NEON arithmetic on registers.
    let mut sumf = unsafe { hsum(acc[0]) + hsum(acc[1]) } + summs;
    if ib < nb {
        let sumi = q4_sumi(&w[ib].qs, &x[ib].qs, 0);
        sumf += fmadd(w[ib].d() * x[ib].d(), sumi as f32, w[ib].m() * x[ib].s());
    }
    sumf
}

/// Q4_0 . Q8_0 in ggml's NEON order: nibbles minus 8 as signed bytes.
#[inline(always)]
unsafe fn dot_q4_0_q8_0_body<const SDOT: bool>(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len().min(x.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut ib = 0;
    while ib + 1 < nb {
        let pairs = [(&w[ib], &x[ib]), (&w[ib + 1], &x[ib + 1])];
        for (a, (bw, bx)) in acc.iter_mut().zip(pairs) {
            // SAFETY: plain NEON on in-bounds block references; see `block_idot` for SDOT.
            unsafe {
                let (wl, wh) = nibbles(&bw.qs);
                let eight = vdupq_n_s8(8);
                let (wl, wh) = (vsubq_s8(wl, eight), vsubq_s8(wh, eight));
                let (xl, xh) = load_q8(&bx.qs);
                *a = mla(*a, block_idot::<SDOT>(wl, wh, xl, xh), bw.d() * bx.d());
            }
        }
        ib += 2;
    }
    // SAFETY: plain NEON arithmetic on registers.
    let mut sumf = unsafe { hsum(acc[0]) + hsum(acc[1]) };
    if ib < nb {
        let sumi = q4_sumi(&w[ib].qs, &x[ib].qs, 8);
        sumf = fmadd(sumi as f32 * w[ib].d(), x[ib].d(), sumf);
    }
    sumf
}

/// Q8_0 . Q8_0 in ggml's NEON order (exact for every i8, -128 included).
#[inline(always)]
unsafe fn dot_q8_0_q8_0_body<const SDOT: bool>(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let nb = w.len().min(x.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let mut ib = 0;
    while ib + 1 < nb {
        let pairs = [(&w[ib], &x[ib]), (&w[ib + 1], &x[ib + 1])];
        for (a, (bw, bx)) in acc.iter_mut().zip(pairs) {
            // SAFETY: plain NEON on in-bounds block references; see `block_idot` for SDOT.
            unsafe {
                let (wl, wh) = load_q8(&bw.qs);
                let (xl, xh) = load_q8(&bx.qs);
                *a = mla(*a, block_idot::<SDOT>(wl, wh, xl, xh), bw.d() * bx.d());
            }
        }
        ib += 2;
    }
    // SAFETY: plain NEON arithmetic on registers.
    let mut sumf = unsafe { hsum(acc[0]) + hsum(acc[1]) };
    if ib < nb {
        let sumi: i32 = w[ib]
            .qs
            .iter()
            .zip(&x[ib].qs)
            .map(|(a, b)| i32::from(*a) * i32::from(*b))
            .sum();
        sumf = fmadd(sumi as f32, w[ib].d() * x[ib].d(), sumf);
    }
    sumf
}

// The compiled kernels: each body once with `sdot` (neon + dotprod) and once with widening
// multiplies (neon only).

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_q4_1_q8_1_sdot(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    // SAFETY: this function has the features the SDOT body needs.
    unsafe { dot_q4_1_q8_1_body::<true>(w, x) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_1_q8_1_widen(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    // SAFETY: the widening body needs NEON only.
    unsafe { dot_q4_1_q8_1_body::<false>(w, x) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_q4_0_q8_0_sdot(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    // SAFETY: this function has the features the SDOT body needs.
    unsafe { dot_q4_0_q8_0_body::<true>(w, x) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_0_q8_0_widen(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    // SAFETY: the widening body needs NEON only.
    unsafe { dot_q4_0_q8_0_body::<false>(w, x) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_q8_0_q8_0_sdot(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    // SAFETY: this function has the features the SDOT body needs.
    unsafe { dot_q8_0_q8_0_body::<true>(w, x) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_q8_0_q8_0_widen(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    // SAFETY: the widening body needs NEON only.
    unsafe { dot_q8_0_q8_0_body::<false>(w, x) }
}

/// Quantizes one block of 32 floats exactly as the scalar `quantize_row_with` does for the same
/// flavour: returns the f32 `d` and the quants as i32, 4 per vector, in element order.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn quantize_block(x: &[f32], r: Q8Rounding) -> (f32, [int32x4_t; 8]) {
    assert_eq!(x.len(), QK);
    let mut v = [vdupq_n_f32(0.0); 8];
    for (k, vk) in v.iter_mut().enumerate() {
        // SAFETY: `x` has 32 floats (asserted), so `4k..4k+4` is in bounds; no alignment needed.
        *vk = unsafe { vld1q_f32(x.as_ptr().add(4 * k)) };
    }
    // max is exact and order-free for non-NaN inputs, so any tree gives the scalar amax.
    let mut m = vabsq_f32(v[0]);
    for vk in &v[1..] {
        m = vmaxq_f32(m, vabsq_f32(*vk));
    }
    let amax = vmaxvq_f32(m);
    // The same f32 operations as the scalar code, so the same d and id.
    let (d, id) = super::q8_0::scale(amax, r);
    let mut q = [vdupq_n_s32(0); 8];
    for (qk, vk) in q.iter_mut().zip(v) {
        let s = vmulq_n_f32(vk, id);
        *qk = if r == Q8Rounding::GgmlRef {
            vcvtaq_s32_f32(s) // roundf: to nearest, ties away from zero
        } else {
            vcvtnq_s32_f32(s) // to nearest, ties to even
        };
    }
    (d, q)
}

/// Packs 32 i32 quants (saturating, as the scalar `as i8` cast saturates) into 32 bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn pack_store(q: [int32x4_t; 8], out: &mut [i8; 32]) {
    let h0 = vqmovn_high_s32(vqmovn_s32(q[0]), q[1]);
    let h1 = vqmovn_high_s32(vqmovn_s32(q[2]), q[3]);
    let h2 = vqmovn_high_s32(vqmovn_s32(q[4]), q[5]);
    let h3 = vqmovn_high_s32(vqmovn_s32(q[6]), q[7]);
    let lo = vqmovn_high_s16(vqmovn_s16(h0), h1);
    let hi = vqmovn_high_s16(vqmovn_s16(h2), h3);
    // SAFETY: `out` is 32 writable bytes; `vst1q_s8` has no alignment requirement.
    unsafe {
        vst1q_s8(out.as_mut_ptr(), lo);
        vst1q_s8(out.as_mut_ptr().add(16), hi);
    }
}

#[target_feature(enable = "neon")]
unsafe fn quantize_row_q8_0_impl(src: &[f32], dst: &mut [BlockQ8_0], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        // SAFETY: NEON is enabled in this function; `x` is a whole block.
        unsafe {
            let (d, q) = quantize_block(x, r);
            y.d = f16_le_bytes(d);
            pack_store(q, &mut y.qs);
        }
    }
}

#[target_feature(enable = "neon")]
unsafe fn quantize_row_q8_1_impl(src: &[f32], dst: &mut [BlockQ8_1], r: Q8Rounding) {
    for (x, y) in src.chunks_exact(QK).zip(dst) {
        // SAFETY: NEON is enabled in this function; `x` is a whole block.
        unsafe {
            let (d, q) = quantize_block(x, r);
            y.d = f16_le_bytes(d);
            let mut s = q[0];
            for qk in &q[1..] {
                s = vaddq_s32(s, *qk);
            }
            // Integer sum: exact in any order.
            y.s = f16_le_bytes(vaddvq_s32(s) as f32 * d);
            pack_store(q, &mut y.qs);
        }
    }
}

// Safe wrappers. SAFETY (all of them): a `Token` exists only after `Token::detect` confirmed NEON
// on this CPU, and one with `dotprod() == true` only after it confirmed the dot-product
// extension, so the target features the kernels are compiled for are present.

pub(super) fn dot_q4_1_q8_1(t: Token, w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe {
        if t.dotprod {
            dot_q4_1_q8_1_sdot(w, x)
        } else {
            dot_q4_1_q8_1_widen(w, x)
        }
    }
}

pub(super) fn dot_q4_0_q8_0(t: Token, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe {
        if t.dotprod {
            dot_q4_0_q8_0_sdot(w, x)
        } else {
            dot_q4_0_q8_0_widen(w, x)
        }
    }
}

pub(super) fn dot_q8_0_q8_0(t: Token, w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    // SAFETY: see above.
    unsafe {
        if t.dotprod {
            dot_q8_0_q8_0_sdot(w, x)
        } else {
            dot_q8_0_q8_0_widen(w, x)
        }
    }
}

pub(super) fn quantize_row_q8_0(_: Token, src: &[f32], dst: &mut [BlockQ8_0], r: Q8Rounding) {
    // SAFETY: see above.
    unsafe { quantize_row_q8_0_impl(src, dst, r) }
}

pub(super) fn quantize_row_q8_1(_: Token, src: &[f32], dst: &mut [BlockQ8_1], r: Q8Rounding) {
    // SAFETY: see above.
    unsafe { quantize_row_q8_1_impl(src, dst, r) }
}

/// Scalar emulation of ggml's NEON order (module docs), for the tests: the NEON kernels must
/// equal it bit for bit.
#[cfg(test)]
pub(super) mod arm_order;
