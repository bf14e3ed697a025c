//! The float evaluation order of llama.cpp's x86-64 CPU backend (AVX-512 build), reproduced in
//! portable code.
//!
//! Why: llama.cpp's outputs define correct, and a 30-layer model amplifies last-bit differences
//! (an activation that lands on the other side of a q8 rounding boundary, an attention
//! probability that rounds to a different f16) into logit differences of tenths, enough to flip
//! greedy choices at near-ties. Products are exact in both engines; what differs is the order in
//! which floats are added and where they are rounded. So the kernels here add in the same order
//! as ggml's SIMD code on the machine the reference data was made on:
//!
//! * `ggml_vec_dot_f16` (single-token attention): four 16-lane FMA accumulators over steps of 64
//!   elements, folded `(a0 + a2) + (a1 + a3)`, then a 16-lane tree reduction.
//! * llamafile's `tinyBLAS` f16 GEMM (attention over a batch of two or more tokens): one 16-lane
//!   FMA chain over the inner dimension, then the same tree reduction.
//! * `ggml_v_expf` (softmax and SiLU): the ARM optimized-routines polynomial llama.cpp uses,
//!   evaluated with the same fused operations; it differs from a correctly rounded `expf` in
//!   the last bit for some inputs.
//!
//! The order is reproduced, not the instructions: these are scalar loops (the compiler may
//! vectorize them; fused multiply-adds are exact whatever unit runs them).

use half::f16;

use super::block::f16_bits_to_f32;
use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;

/// f16 -> f32 without `half`'s per-call CPU feature check (exact).
#[inline(always)]
fn h(x: f16) -> f32 {
    f16_bits_to_f32(x.to_bits())
}

/// Lanes of an AVX-512 float vector.
pub const LANES: usize = 16;

/// `_mm512_reduce_add_ps` as GCC implements it: halves added pairwise down to 4 lanes, then
/// `(t0 + t2) + (t1 + t3)`.
#[inline(always)]
pub fn reduce16(a: &[f32; LANES]) -> f32 {
    let mut t3 = [0.0f32; 8];
    for i in 0..8 {
        t3[i] = a[i + 8] + a[i];
    }
    let mut t6 = [0.0f32; 4];
    for i in 0..4 {
        t6[i] = t3[i + 4] + t3[i];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// `ggml_vec_dot_f16(n, a, b)` of the AVX-512 build: sum of `a[i] * b[i]` in ggml's order.
/// `b` holds f16 values widened to f32 (ggml converts that operand to f16 first).
#[inline(always)]
pub fn dot_f16_ggml(a: &[f16], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::dot_f16_ggml(a, b) };
    }
    dot_f16_ggml_portable(a, b)
}

/// [`dot_f16_ggml`] in portable code (the reference of the SIMD version).
#[inline(always)]
fn dot_f16_ggml_portable(a: &[f16], b: &[f32]) -> f32 {
    const STEP: usize = 4 * LANES;
    let n = a.len().min(b.len());
    let np = n - n % STEP;
    let mut acc = [[0.0f32; LANES]; 4];
    let mut i = 0;
    while i < np {
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let base = i + j * LANES;
            for (l, s) in acc_j.iter_mut().enumerate() {
                *s = h(a[base + l]).mul_add(b[base + l], *s);
            }
        }
        i += STEP;
    }
    let mut folded = [0.0f32; LANES];
    for l in 0..LANES {
        folded[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut sum = f64::from(reduce16(&folded));
    for k in np..n {
        sum += f64::from(h(a[k]) * b[k]);
    }
    sum as f32
}

/// One element of llamafile's tinyBLAS f16 GEMM of the AVX-512 build: a single 16-lane FMA
/// chain over `k` (a multiple of 16 there; a shorter tail is folded into the lanes it would
/// occupy), then the tree reduction.
#[inline(always)]
pub fn dot_f16_tinyblas(a: &[f16], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::dot_f16_tinyblas(a, b) };
    }
    dot_f16_tinyblas_portable(a, b)
}

/// `acc[i] = fma(v[i], p, acc[i])` for every i: one position's term of attention's `V·p`, each
/// element with one fused multiply-add, whichever instruction set runs it.
#[inline]
pub fn axpy_f16(acc: &mut [f32], v: &[f16], p: f32) {
    debug_assert_eq!(acc.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::axpy_f16(acc, v, p) };
    }
    axpy_f16_portable(acc, v, p)
}

/// Attention's scores over consecutive cache rows: `out[i]` is the dot of `q` with
/// `rows[i * stride + off..][..q.len()]`, in tinyBLAS's order (`batch`, [`dot_f16_tinyblas`])
/// or ggml's one-token order ([`dot_f16_ggml`]). One call per run of rows, so that the
/// instruction-set check and the call are paid once, not per row.
///
/// # Panics
/// If `rows` is too short for `out.len()` rows.
#[inline]
pub fn dot_f16_rows(
    rows: &[f16],
    stride: usize,
    off: usize,
    q: &[f32],
    out: &mut [f32],
    batch: bool,
) {
    if let Some(last) = out.len().checked_sub(1) {
        assert!(
            rows.len() >= last * stride + off + q.len(),
            "rows too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::dot_f16_rows(rows, stride, off, q, out, batch) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        let a = &rows[i * stride + off..][..q.len()];
        *o = if batch {
            dot_f16_tinyblas_portable(a, q)
        } else {
            dot_f16_ggml_portable(a, q)
        };
    }
}

/// Attention's `V·p` over consecutive cache rows: term `first_term + i` adds
/// `rows[i * stride + off..][..n] * probs[i]` ([`axpy_f16`]) to accumulator slot
/// `(first_term + i) % slots` of `accs`, which holds `slots` rows of `n` values, slot-major.
///
/// # Panics
/// If `rows` is too short for `probs.len()` rows or `accs` is not whole slots.
#[inline]
pub fn axpy_f16_rows(
    accs: &mut [f32],
    slots: usize,
    first_term: usize,
    rows: &[f16],
    stride: usize,
    off: usize,
    probs: &[f32],
) {
    let n = accs.len() / slots.max(1);
    assert_eq!(accs.len(), n * slots, "accumulators not whole slots");
    if let Some(last) = probs.len().checked_sub(1) {
        assert!(rows.len() >= last * stride + off + n, "rows too short");
    }
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::axpy_f16_rows(accs, slots, first_term, rows, stride, off, probs) };
    }
    for (i, p) in probs.iter().enumerate() {
        let slot = (first_term + i) % slots;
        axpy_f16_portable(
            &mut accs[slot * n..(slot + 1) * n],
            &rows[i * stride + off..][..n],
            *p,
        );
    }
}

/// [`dot_f16_rows`] in tinyBLAS order (`batch`) for several query heads that read the same
/// rows, the heads of one grouped-query KV head: `q` holds the heads' queries of `n` values
/// each, and `out[h * out_stride + i]` becomes the dot of head h's query with
/// `rows[i * stride + off..][..n]` for `i < len`. Each score has the bits of one
/// [`dot_f16_rows`] call per head; the SIMD path widens each row from f16 once for all heads,
/// which is most of a one-head pass's work on CPUs with a slow `vcvtph2ps`.
///
/// # Panics
/// If `q` is not whole heads of `n`, `out` is too short for its heads, or `rows` too short.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn dot_f16_rows_heads(
    rows: &[f16],
    stride: usize,
    off: usize,
    q: &[f32],
    n: usize,
    out: &mut [f32],
    out_stride: usize,
    len: usize,
) {
    let heads = q.len().checked_div(n).unwrap_or(0);
    assert_eq!(heads * n, q.len(), "queries not whole heads");
    if heads == 0 || len == 0 {
        return;
    }
    assert!(len <= out_stride || heads == 1, "score rows overlap");
    assert!(
        out.len() >= (heads - 1) * out_stride + len,
        "scores too short"
    );
    assert!(rows.len() >= (len - 1) * stride + off + n, "rows too short");
    #[cfg(target_arch = "x86_64")]
    if simd::available() && n.is_multiple_of(LANES) {
        // SAFETY: AVX2, FMA and F16C are present (checked); lengths checked above.
        return unsafe { simd::dot_f16_rows_heads(rows, stride, off, q, n, out, out_stride, len) };
    }
    for h in 0..heads {
        let o = &mut out[h * out_stride..h * out_stride + len];
        dot_f16_rows(rows, stride, off, &q[h * n..(h + 1) * n], o, true);
    }
}

/// [`axpy_f16_rows`] for several query heads that read the same rows: `accs` holds each head's
/// `slots` rows of `n` accumulators (head after head), and head h's term `first_term + i`
/// adds `rows[i * stride + off..][..n] * probs[h * probs_stride + i]` for `i < len`. Each
/// accumulator takes its terms in the order (and with the bits) of one [`axpy_f16_rows`] call
/// per head; the SIMD path widens each row from f16 once for all heads.
///
/// # Panics
/// If `accs` is not whole heads of `slots` rows of `n`, `probs` is too short for its heads, or
/// `rows` too short.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn axpy_f16_rows_heads(
    accs: &mut [f32],
    n: usize,
    slots: usize,
    first_term: usize,
    rows: &[f16],
    stride: usize,
    off: usize,
    probs: &[f32],
    probs_stride: usize,
    len: usize,
) {
    let per_head = slots * n;
    let heads = accs.len().checked_div(per_head).unwrap_or(0);
    assert_eq!(heads * per_head, accs.len(), "accumulators not whole heads");
    if heads == 0 || len == 0 {
        return;
    }
    assert!(
        probs.len() >= (heads - 1) * probs_stride + len,
        "probabilities too short"
    );
    assert!(rows.len() >= (len - 1) * stride + off + n, "rows too short");
    #[cfg(target_arch = "x86_64")]
    if simd::available() && slots == LANES {
        // SAFETY: AVX2, FMA and F16C are present (checked); lengths checked above.
        return unsafe {
            simd::axpy_f16_rows_heads(
                accs,
                n,
                first_term,
                rows,
                stride,
                off,
                probs,
                probs_stride,
                len,
            )
        };
    }
    for (h, acc) in accs.chunks_exact_mut(per_head).enumerate() {
        let p = &probs[h * probs_stride..h * probs_stride + len];
        axpy_f16_rows(acc, slots, first_term, rows, stride, off, p);
    }
}

/// [`axpy_f16`] in portable code (the reference of the SIMD version).
#[inline(always)]
fn axpy_f16_portable(acc: &mut [f32], v: &[f16], p: f32) {
    for (a, x) in acc.iter_mut().zip(v) {
        *a = h(*x).mul_add(p, *a);
    }
}

/// [`dot_f16_tinyblas`] in portable code (the reference of the SIMD version).
#[inline(always)]
fn dot_f16_tinyblas_portable(a: &[f16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; LANES];
    let full = n - n % LANES;
    // Whole 16-lane steps (written so the compiler keeps the 16 lanes as vector lanes).
    for (ca, cb) in a[..full]
        .chunks_exact(LANES)
        .zip(b[..full].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] = h(ca[l]).mul_add(cb[l], acc[l]);
        }
    }
    for k in full..n {
        let l = k % LANES;
        acc[l] = h(a[k]).mul_add(b[k], acc[l]);
    }
    reduce16(&acc)
}

/// Width of the accumulator of a dot product built one term at a time: term `k` goes to slot
/// `k % width`. tinyBLAS order uses one 16-lane vector ([`LANES`]); `ggml_vec_dot_f16` order
/// uses four ([`STEP_LANES`], valid when the full length is a multiple of 64, as llama.cpp's
/// padded KV length is: the missing terms are zeros, which change nothing).
pub const STEP_LANES: usize = 4 * LANES;

/// Adds `a * b` as term number `k` of an ordered dot product accumulating in `acc` (16 or 64
/// slots).
#[inline(always)]
pub fn accumulate(acc: &mut [f32], k: usize, a: f32, b: f32) {
    let slot = k % acc.len();
    acc[slot] = a.mul_add(b, acc[slot]);
}

/// The sum of an accumulator filled by [`accumulate`]: 64 slots are folded as
/// `ggml_vec_dot_f16` folds its four vectors, then the 16 lanes are tree-reduced.
#[inline(always)]
pub fn accumulated_sum(acc: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    if acc.len() == STEP_LANES {
        for (l, x) in lanes.iter_mut().enumerate() {
            *x = (acc[l] + acc[2 * LANES + l]) + (acc[LANES + l] + acc[3 * LANES + l]);
        }
    } else {
        lanes.copy_from_slice(&acc[..LANES]);
    }
    reduce16(&lanes)
}

/// [`accumulated_sum`] of every column of `accs`, which holds 16 or 64 slots of `out.len()`
/// values each, stored slot-major (`accs[slot * out.len() + d]`): `out[d]` is the sum of column
/// `d`. The same operations per column, done 8 columns at a time so that they vectorize.
#[inline(always)]
pub fn accumulated_sums(accs: &[f32], out: &mut [f32]) {
    let n = out.len();
    let width = accs.len().checked_div(n).unwrap_or(0);
    debug_assert!(n == 0 || width == LANES || width == STEP_LANES);
    #[allow(unused_mut)] // no SIMD path off x86-64
    let mut c_start = 0;
    #[cfg(target_arch = "x86_64")]
    if simd::available() && (width == LANES || width == STEP_LANES) {
        // SAFETY: AVX2, FMA and F16C are present (checked); `accs` holds `width` slots of n.
        c_start = unsafe { simd::accumulated_sums(&accs[..width * n], width, out) };
    }
    let at = |slot: usize, d: usize| accs[slot * n + d];
    for c0 in (c_start..n).step_by(8) {
        let m = (n - c0).min(8);
        let mut lanes = [[0.0f32; 8]; LANES];
        for (l, lane) in lanes.iter_mut().enumerate() {
            for (j, x) in lane[..m].iter_mut().enumerate() {
                let d = c0 + j;
                *x = if width == STEP_LANES {
                    (at(l, d) + at(2 * LANES + l, d)) + (at(LANES + l, d) + at(3 * LANES + l, d))
                } else {
                    at(l, d)
                };
            }
        }
        // reduce16, column by column.
        let mut t3 = [[0.0f32; 8]; 8];
        for i in 0..8 {
            for j in 0..8 {
                t3[i][j] = lanes[i + 8][j] + lanes[i][j];
            }
        }
        let mut t6 = [[0.0f32; 8]; 4];
        for i in 0..4 {
            for j in 0..8 {
                t6[i][j] = t3[i + 4][j] + t3[i][j];
            }
        }
        for (j, o) in out[c0..c0 + m].iter_mut().enumerate() {
            *o = (t6[0][j] + t6[2][j]) + (t6[1][j] + t6[3][j]);
        }
    }
}

/// `xs[i] = f16(xs[i] * scale)` widened back to f32 (round to nearest even): softmax's
/// probabilities as the f16 operand of `V·p`, 8 at a time with F16C where the CPU has it.
#[inline]
pub fn scale_round_f16(xs: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::scale_round_f16(xs, scale) };
    }
    for x in xs {
        *x = f16::from_f32(*x * scale).to_f32();
    }
}

/// `ggml_v_expf`: e^x with llama.cpp's polynomial (max error about 1.5 ulp), operation for
/// operation.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    // fnmadd(a, b, c) = c - a*b, fused.
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // _mm512_scalef_ps: j * 2^n, rounded once (the f64 product is exact).
    // 2^n for |n| <= 192 is a normal f64, built from its exponent bits.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (f64::from(j) * two_n) as f32
}

/// `xs[i] = expf(xs[i] - sub)` for every i: softmax's exponentials, 8 lanes at a time where
/// the CPU has AVX2 and FMA, with [`expf`]'s operations in every lane (the same bits).
#[inline]
pub fn expf_shifted(xs: &mut [f32], sub: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::expf_shifted(xs, sub) };
    }
    for x in xs {
        *x = expf(*x - sub);
    }
}

/// The largest of `xs` ignoring NaNs (`f32::NEG_INFINITY` for none): softmax's maximum, the
/// value of a serial fold of `f32::max` (a zero's sign may differ, which changes no `s - max`).
/// 8 lanes at a time where the CPU has AVX2: the serial fold is one long dependency chain.
#[inline]
pub fn max_ignoring_nan(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::max_ignoring_nan(xs) };
    }
    xs.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b))
}

/// `ggml_vec_soft_max_f32`'s sum: `xs` in chunks of 16 (the last one padded with zeros), each
/// reduced by [`reduce16`] and added to an f64 sum in order.
#[inline]
pub fn sum16_f64(xs: &[f32]) -> f64 {
    #[allow(unused_mut)] // no SIMD path off x86-64
    let mut done = (0, 0.0f64);
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        done = unsafe { simd::sum16_f64(xs) };
    }
    let (start, mut sum) = done;
    for chunk in xs[start..].chunks(LANES) {
        let mut lanes = [0.0f32; LANES];
        lanes[..chunk.len()].copy_from_slice(chunk);
        sum += f64::from(reduce16(&lanes));
    }
    sum
}

/// `x[i] = silu(x[i]) * up[i]` for the first whole groups of 8 (`min(x.len(), up.len())`
/// rounded down) where the CPU has AVX2 and FMA, with [`silu`]'s operations in every lane (the
/// same bits); returns how many it did (0 without those features): the caller does the rest.
#[inline]
pub fn silu_mul_inplace_simd(x: &mut [f32], up: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::silu_mul_inplace(x, up) };
    }
    let _ = (x, up);
    0
}

/// [`silu_mul_inplace_simd`] into `out`: `out[i] = silu(gate[i]) * up[i]` (the gate copied
/// into `out` first, then in place: a copy is small beside the exponentials).
#[inline]
pub fn silu_mul_simd(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        let n = out.len().min(gate.len()).min(up.len());
        out[..n].copy_from_slice(&gate[..n]);
        // SAFETY: AVX2, FMA and F16C are present (checked).
        return unsafe { simd::silu_mul_inplace(&mut out[..n], up) };
    }
    let _ = (gate, up, out);
    0
}

/// `ggml_v_silu`: x / (1 + e^-x) with [`expf`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// The f16 dots above with AVX2 + FMA + F16C: the same lanes, the same fused operations in the
/// same order (16 lanes as two 8-lane registers; `vcvtph2ps` is exact like [`h`]), so the
/// results are bit-identical to the portable loops, which the compiler cannot vectorize with
/// hardware f16 conversion.
#[cfg(target_arch = "x86_64")]
mod simd {
    // The enclosing file by its absolute path: `scripts/check-layers.py` resolves paths per file
    // and would take `super::` here for `cpu/mod.rs`.
    use crate::cpu::ggml_order::{expf, h, h as h_, reduce16, LANES};
    use half::f16;
    use std::arch::x86_64::*;

    /// Whether this CPU runs these kernels (cached by std after the first call).
    #[inline(always)]
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Whether the attention passes may take 8 heads at a time: AVX-512 (VL gives 32 vector
    /// registers to the same 256-bit operations, so 8 heads' accumulators fit) on a CPU that
    /// runs the AVX-512 kernels, unless `EDGE_RUN_ISA` forces a narrower set. Same bits
    /// either way.
    pub(super) fn wide() -> bool {
        static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *WIDE.get_or_init(|| {
            crate::cpu::x86::avx512_detected()
                && !matches!(
                    std::env::var("EDGE_RUN_ISA").as_deref(),
                    Ok("avx2" | "scalar")
                )
        })
    }

    /// [`dot_rows_heads`] of `H` (6 or 8) heads, compiled with AVX-512 VL for its 32 registers.
    ///
    /// # Safety
    /// As [`dot_rows_heads`], and the CPU has AVX-512 F and VL.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn dot_rows_heads_wide<const H: usize>(
        rows: &[f16],
        stride: usize,
        off: usize,
        q: &[f32],
        n: usize,
        out: &mut [f32],
        out_stride: usize,
        len: usize,
    ) {
        // SAFETY: the contract.
        unsafe { dot_rows_heads::<H, 0>(rows, stride, off, q, n, out, out_stride, len) }
    }

    /// [`axpy_heads_by_slot`] of `H` (6 or 8) heads, compiled with AVX-512 VL for its 32
    /// registers.
    ///
    /// # Safety
    /// As [`axpy_heads_by_slot`], and the CPU has AVX-512 F and VL.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn axpy_heads_by_slot_wide<const H: usize>(
        accs: &mut [f32],
        n: usize,
        first_term: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
        probs_stride: usize,
        len: usize,
    ) {
        // SAFETY: the contract.
        unsafe {
            axpy_heads_by_slot::<H, 2>(
                accs,
                n,
                first_term,
                rows,
                stride,
                off,
                probs,
                probs_stride,
                len,
            )
        }
    }

    /// 8 f16 at `a[i..i + 8]` as f32.
    ///
    /// # Safety
    /// `i + 8 <= a.len()`; the CPU has F16C.
    #[inline(always)]
    unsafe fn load8(a: &[f16], i: usize) -> __m256 {
        debug_assert!(i + 8 <= a.len());
        // SAFETY: 16 readable bytes at a[i] (caller); loadu has no alignment requirement.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i).cast())) }
    }

    /// Rows ahead of the one read that the one-token score kernel asks for: a row costs about
    /// 15 cycles in cache, and 16 rows ahead were too few to hide the memory's latency when
    /// the cache no longer fits in L3 (SmolLM2 Q8_0 decode at 2,048 tokens of context:
    /// 97-100 -> 102-104 tok/s with 48, alternating).
    const ROWS_AHEAD: usize = 48;

    /// Asks for the cache lines of `a[i..i + n]` ahead of their use ([`prefetch_range`]; past
    /// the end, nothing). Attention reads cache rows a whole KV row apart (kilobytes), two or
    /// fewer per 4 KiB page, where the hardware prefetchers do not follow.
    ///
    /// [`prefetch_range`]: crate::cpu::x86::prefetch_range
    #[inline(always)]
    fn prefetch_f16(a: &[f16], i: usize, n: usize) {
        // SAFETY: an f16 is two plain bytes; the view covers exactly `a`'s memory.
        let bytes = unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), 2 * a.len()) };
        crate::cpu::x86::prefetch_range(bytes, 2 * i, 2 * n);
    }

    /// 8 f32 at `b[i..i + 8]`.
    ///
    /// # Safety
    /// `i + 8 <= b.len()`.
    #[inline(always)]
    unsafe fn loadf(b: &[f32], i: usize) -> __m256 {
        debug_assert!(i + 8 <= b.len());
        // SAFETY: 32 readable bytes at b[i] (caller).
        unsafe { _mm256_loadu_ps(b.as_ptr().add(i)) }
    }

    /// The 16 lanes of two registers, `lo` first.
    ///
    /// # Safety
    /// The CPU has AVX2 (as every caller here checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes(lo: __m256, hi: __m256) -> [f32; LANES] {
        let mut out = [0.0f32; LANES];
        // SAFETY: `out` has 16 f32; storeu has no alignment requirement.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), lo);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), hi);
        }
        out
    }

    /// [`super::dot_f16_tinyblas`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16_tinyblas(a: &[f16], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let full = n - n % LANES;
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= both lengths.
            unsafe {
                lo = _mm256_fmadd_ps(load8(a, i), loadf(b, i), lo);
                hi = _mm256_fmadd_ps(load8(a, i + 8), loadf(b, i + 8), hi);
            }
            i += LANES;
        }
        if full == n {
            // SAFETY: AVX2 present (this function's contract).
            return unsafe { reduce16_regs(lo, hi) };
        }
        // SAFETY: AVX2 present (this function's contract).
        let mut acc = unsafe { lanes(lo, hi) };
        for k in full..n {
            let l = k % LANES;
            acc[l] = h(a[k]).mul_add(b[k], acc[l]);
        }
        reduce16(&acc)
    }

    /// [`super::reduce16`] of the 16 lanes `lo` (0..8) and `hi` (8..16), in registers: the same
    /// additions of the same pairs.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce16_regs(lo: __m256, hi: __m256) -> f32 {
        // t3[i] = a[i + 8] + a[i]; t6[i] = t3[i + 4] + t3[i].
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        // [t6[0] + t6[2], t6[1] + t6[3], ..], then their sum.
        let u = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }

    /// [`super::expf`] on 8 lanes: the same fused and plain operations in the same order;
    /// `scalef` as an f64 product rounded once to f32, as the scalar version computes it.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn expf8(x: __m256) -> __m256 {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        // fma(-n, a, fma(-n, b, x)) = fnmadd(n, a, fnmadd(n, b, x)): -(n*a) is exact.
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        let ni = _mm256_cvttps_epi32(n);
        // Where every lane's 2^n is a normal f32 (-126 <= n <= 127; softmax's common case, n
        // an integer), j * 2^n in f32 is the exact product rounded once, as below: a third of
        // the instructions. (NaN lanes fail the ordered compares.)
        let normal = _mm256_and_ps(
            _mm256_cmp_ps(n, _mm256_set1_ps(-126.0), _CMP_GE_OQ),
            _mm256_cmp_ps(n, _mm256_set1_ps(127.0), _CMP_LE_OQ),
        );
        if _mm256_movemask_ps(normal) == 0xFF {
            let two_n = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23);
            return _mm256_mul_ps(j, _mm256_castsi256_ps(two_n));
        }
        // j * 2^n, in f64 (exact product), rounded once; 2^n from its exponent bits.
        let scale = |half: __m128i, jj: __m128| {
            let e = _mm256_slli_epi64(
                _mm256_add_epi64(_mm256_cvtepi32_epi64(half), _mm256_set1_epi64x(1023)),
                52,
            );
            _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(jj), _mm256_castsi256_pd(e)))
        };
        let lo = scale(_mm256_castsi256_si128(ni), _mm256_castps256_ps128(j));
        let hi = scale(_mm256_extracti128_si256(ni, 1), _mm256_extractf128_ps(j, 1));
        let v = _mm256_set_m128(hi, lo);
        // |n| > 192: 0 for n <= 0, +inf otherwise (NaN compares false, as in the scalar code).
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0), _CMP_GT_OQ);
        let neg = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ);
        let over = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), neg);
        _mm256_blendv_ps(v, over, big)
    }

    /// `silu(g) * u` on 8 lanes: [`super::silu`]'s operations (`0 - x`, [`expf8`], `1 + e`,
    /// the division) then the product, each correctly rounded as in the scalar code.
    #[inline(always)]
    unsafe fn silu_mul8(g: __m256, u: __m256) -> __m256 {
        // SAFETY: the caller's features (AVX2, FMA).
        let e = unsafe { expf8(_mm256_sub_ps(_mm256_setzero_ps(), g)) };
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
    }

    /// [`super::silu_mul_inplace_simd`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn silu_mul_inplace(x: &mut [f32], up: &[f32]) -> usize {
        let n = x.len().min(up.len());
        let full = n - n % 8;
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= both lengths; loadu/storeu need no alignment.
            unsafe {
                let v = silu_mul8(loadf(x, i), loadf(up, i));
                _mm256_storeu_ps(x.as_mut_ptr().add(i), v);
            }
            i += 8;
        }
        full
    }

    /// [`super::max_ignoring_nan`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn max_ignoring_nan(xs: &[f32]) -> f32 {
        let full = xs.len() - xs.len() % 16;
        // Two chains; `max_ps(x, m)` returns `m` where `x` is NaN, and `m` is never NaN.
        let (mut m0, mut m1) = (
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_set1_ps(f32::NEG_INFINITY),
        );
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= xs.len().
            unsafe {
                m0 = _mm256_max_ps(loadf(xs, i), m0);
                m1 = _mm256_max_ps(loadf(xs, i + 8), m1);
            }
            i += 16;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: 8 f32 of room; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_max_ps(m1, m0)) };
        let m = lanes.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
        xs[full..].iter().fold(m, |a, b| a.max(*b))
    }

    /// [`super::sum16_f64`] over the whole chunks of 16: how many values it took, and their sum.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn sum16_f64(xs: &[f32]) -> (usize, f64) {
        let full = xs.len() - xs.len() % LANES;
        let mut sum = 0f64;
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= xs.len(); AVX2 present.
            sum += f64::from(unsafe { reduce16_regs(loadf(xs, i), loadf(xs, i + 8)) });
            i += LANES;
        }
        (full, sum)
    }

    /// [`super::expf_shifted`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn expf_shifted(xs: &mut [f32], sub: f32) {
        let full = xs.len() - xs.len() % 8;
        let s = _mm256_set1_ps(sub);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= xs.len(); loadu/storeu need no alignment.
            unsafe {
                let v = _mm256_sub_ps(_mm256_loadu_ps(xs.as_ptr().add(i)), s);
                _mm256_storeu_ps(xs.as_mut_ptr().add(i), expf8(v));
            }
            i += 8;
        }
        for x in &mut xs[full..] {
            *x = expf(*x - sub);
        }
    }

    /// [`super::dot_f16_rows`] (lengths checked by it).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16_rows(
        rows: &[f16],
        stride: usize,
        off: usize,
        q: &[f32],
        out: &mut [f32],
        batch: bool,
    ) {
        let n = q.len();
        let mut i = 0;
        if batch && n.is_multiple_of(LANES) {
            // Four rows at a time: each step's query lanes are loaded once for the four rows,
            // and the four rows' FMA chains interleave (one row's chain is latency-bound).
            // Each row's lanes take the one-row kernel's operations in its order.
            while i + 4 <= out.len() {
                let base = [0, 1, 2, 3].map(|r| (i + r) * stride + off);
                for b in base {
                    prefetch_f16(rows, b + ROWS_AHEAD * stride, n);
                }
                let mut lo = [_mm256_setzero_ps(); 4];
                let mut hi = [_mm256_setzero_ps(); 4];
                let mut k = 0;
                while k < n {
                    // SAFETY: k + 16 <= n = q.len(), and row i + r's n values lie in `rows`
                    // (the caller checked the last row's bound).
                    unsafe {
                        let (ql, qh) = (loadf(q, k), loadf(q, k + 8));
                        for r in 0..4 {
                            lo[r] = _mm256_fmadd_ps(load8(rows, base[r] + k), ql, lo[r]);
                            hi[r] = _mm256_fmadd_ps(load8(rows, base[r] + k + 8), qh, hi[r]);
                        }
                    }
                    k += LANES;
                }
                for r in 0..4 {
                    // SAFETY: AVX2 present (this function's contract).
                    out[i + r] = unsafe { reduce16_regs(lo[r], hi[r]) };
                }
                i += 4;
            }
        }
        for (i, o) in out.iter_mut().enumerate().skip(i) {
            let a = &rows[i * stride + off..][..n];
            prefetch_f16(rows, (i + ROWS_AHEAD) * stride + off, n);
            // SAFETY: this function's features are theirs.
            *o = unsafe {
                if batch {
                    dot_f16_tinyblas(a, q)
                } else {
                    dot_f16_ggml(a, q)
                }
            };
        }
    }

    /// [`super::dot_f16_rows_heads`] (lengths checked by it; `n` a multiple of 16): heads in
    /// passes of up to 4 (6 where 6 are left: their 12 accumulators and the row's two halves
    /// fit AVX2's 16 registers, and the row is widened once for all of them), each row widened
    /// once per pass; head sizes 64 and 128 with the size known to the compiler (the chains
    /// unrolled). Zen 3, 6 heads of 64 over 252 rows in cache, cycles per (head, row): 9.3-11.9
    /// in passes of 3 with the size known at run time, 8.6-9.9 known, 6.9-8.9 one pass of 6.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the lengths are those the caller checked.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16_rows_heads(
        rows: &[f16],
        stride: usize,
        off: usize,
        q: &[f32],
        n: usize,
        out: &mut [f32],
        out_stride: usize,
        len: usize,
    ) {
        // SAFETY (all): the contract.
        unsafe {
            match n {
                64 => dot_heads_passes::<64>(rows, stride, off, q, n, out, out_stride, len),
                128 => dot_heads_passes::<128>(rows, stride, off, q, n, out, out_stride, len),
                _ => dot_heads_passes::<0>(rows, stride, off, q, n, out, out_stride, len),
            }
        }
    }

    /// [`dot_f16_rows_heads`] for heads of `N` values (0: `n`, known at run time).
    ///
    /// # Safety
    /// As [`dot_f16_rows_heads`], and `N` is 0 or `n`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_heads_passes<const N: usize>(
        rows: &[f16],
        stride: usize,
        off: usize,
        q: &[f32],
        n: usize,
        out: &mut [f32],
        out_stride: usize,
        len: usize,
    ) {
        let heads = q.len() / n;
        let mut h0 = 0;
        let wide = wide();
        while h0 < heads {
            // (A last single head takes the 4-row one-head kernel.)
            let take = match heads_per_pass(heads - h0, wide) {
                3 if heads - h0 == 6 => 6,
                take => take,
            };
            let qh = &q[h0 * n..(h0 + take) * n];
            let o = &mut out[h0 * out_stride..];
            // SAFETY: this function's features and lengths are the pass kernels'; passes of 8
            // and wide passes of 6 are taken only where the CPU has the wide kernels' features.
            unsafe {
                match take {
                    8 => dot_rows_heads_wide::<8>(rows, stride, off, qh, n, o, out_stride, len),
                    6 if wide => {
                        dot_rows_heads_wide::<6>(rows, stride, off, qh, n, o, out_stride, len)
                    }
                    6 => dot_rows_heads::<6, N>(rows, stride, off, qh, n, o, out_stride, len),
                    1 => dot_f16_rows(rows, stride, off, qh, &mut o[..len], true),
                    2 => dot_rows_heads::<2, N>(rows, stride, off, qh, n, o, out_stride, len),
                    3 => dot_rows_heads::<3, N>(rows, stride, off, qh, n, o, out_stride, len),
                    _ => dot_rows_heads::<4, N>(rows, stride, off, qh, n, o, out_stride, len),
                }
            }
            h0 += take;
        }
    }

    /// One pass of [`dot_f16_rows_heads`] over `H` heads of `N` values (0: `n`): per row, the
    /// 16-lane FMA chains of [`dot_f16_tinyblas`] for each head (queries read from memory, so
    /// that 2H accumulators and the row's two widened halves fit in the registers), then its
    /// tree reduction.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `q` holds `H` heads of `n` (a multiple of 16; equal to
    /// `N` unless `N` is 0) values, `out` at least `(H - 1) * out_stride + len` and `rows` at
    /// least `(len - 1) * stride + off + n`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows_heads<const H: usize, const N: usize>(
        rows: &[f16],
        stride: usize,
        off: usize,
        q: &[f32],
        n: usize,
        out: &mut [f32],
        out_stride: usize,
        len: usize,
    ) {
        let n = if N == 0 { n } else { N };
        debug_assert!(q.len() == H * n && n.is_multiple_of(LANES));
        debug_assert!(out.len() >= (H - 1) * out_stride + len);
        for i in 0..len {
            let base = i * stride + off;
            prefetch_f16(rows, base + ROWS_AHEAD * stride, n);
            let mut lo = [_mm256_setzero_ps(); H];
            let mut hi = [_mm256_setzero_ps(); H];
            let mut k = 0;
            while k < n {
                // SAFETY: k + 16 <= n; row i's n values lie in `rows` and head h's in `q`
                // (the contract).
                unsafe {
                    let (kl, kh) = (load8(rows, base + k), load8(rows, base + k + 8));
                    for h in 0..H {
                        lo[h] = _mm256_fmadd_ps(kl, loadf(q, h * n + k), lo[h]);
                        hi[h] = _mm256_fmadd_ps(kh, loadf(q, h * n + k + 8), hi[h]);
                    }
                }
                k += LANES;
            }
            for h in 0..H {
                // SAFETY: AVX2 present; h * out_stride + i < out.len() (the contract).
                unsafe { *out.get_unchecked_mut(h * out_stride + i) = reduce16_regs(lo[h], hi[h]) };
            }
        }
    }

    /// [`super::axpy_f16_rows_heads`] with 16 slots (lengths checked by it): heads in passes
    /// of up to 4.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the lengths are those the caller checked.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy_f16_rows_heads(
        accs: &mut [f32],
        n: usize,
        first_term: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
        probs_stride: usize,
        len: usize,
    ) {
        let per_head = LANES * n;
        let heads = accs.len() / per_head;
        let mut h0 = 0;
        let wide = wide();
        while h0 < heads {
            let take = heads_per_pass(heads - h0, wide);
            let a = &mut accs[h0 * per_head..(h0 + take) * per_head];
            let p = &probs[h0 * probs_stride..];
            // The pass kernel of `take` heads (one head: the one-head kernel).
            let pass: HeadsPass = match take {
                1 => {
                    // SAFETY: this function's features and lengths are that kernel's.
                    unsafe {
                        axpy_f16_rows_by_slot(a, LANES, first_term, rows, stride, off, &p[..len])
                    };
                    h0 += 1;
                    continue;
                }
                2 => axpy_heads_by_slot::<2, 4>,
                3 => axpy_heads_by_slot::<3, 4>,
                6 => axpy_heads_by_slot_wide::<6>,
                8 => axpy_heads_by_slot_wide::<8>,
                _ => axpy_heads_by_slot::<4, 2>,
            };
            // SAFETY: this function's features and lengths are the pass kernels'; passes of 6
            // and 8 are taken only where the CPU has the wide kernels' features.
            unsafe { pass(a, n, first_term, rows, stride, off, p, probs_stride, len) };
            h0 += take;
        }
    }

    /// A pass kernel of [`axpy_f16_rows_heads`]: `(accs, n, first_term, rows, stride, off,
    /// probs, probs_stride, len)`.
    type HeadsPass =
        unsafe fn(&mut [f32], usize, usize, &[f16], usize, usize, &[f32], usize, usize);

    /// Heads the next pass of the multi-head attention kernels takes, `left` heads to go: 8 (or
    /// a last 6) where the `wide` kernels run, else 4, 3 (of 5 or 6) or 2; a last single head
    /// alone.
    fn heads_per_pass(left: usize, wide: bool) -> usize {
        match left {
            8.. if wide => 8,
            6 if wide => 6,
            1 => 1,
            5 | 6 => 3,
            _ => left.min(4),
        }
    }

    /// One pass of [`axpy_f16_rows_heads`] over `H` heads, as [`axpy_f16_rows_by_slot`] for one
    /// head: slot by slot, columns in blocks of `8 * C` whose accumulators (C registers per
    /// head) stay in registers while the slot's terms are added; each row block is widened
    /// once and added to every head's accumulators with that head's probability. Every
    /// accumulator takes its terms in order, one fused multiply-add each.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `accs` holds `H` heads of 16 rows of `n`, `probs` at
    /// least `(H - 1) * probs_stride + len` values and `rows` at least
    /// `(len - 1) * stride + off + n`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_heads_by_slot<const H: usize, const C: usize>(
        accs: &mut [f32],
        n: usize,
        first_term: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
        probs_stride: usize,
        len: usize,
    ) {
        let slots = LANES;
        let per_head = slots * n;
        debug_assert_eq!(accs.len(), H * per_head);
        debug_assert!(probs.len() >= (H - 1) * probs_stride + len);
        let f = first_term % slots;
        let block = 8 * C;
        let full_blocks = n - n % block;
        let full8 = n - n % 8;
        let a = accs.as_mut_ptr();
        let prob = |h: usize, i: usize| {
            // SAFETY: i < len, so h * probs_stride + i < probs.len() (the contract).
            unsafe { *probs.get_unchecked(h * probs_stride + i) }
        };
        for s in 0..slots {
            // Term i goes to slot (first_term + i) % slots.
            let i0 = (s + slots - f) % slots;
            if i0 >= len {
                continue;
            }
            // Whole blocks of C registers per head, then 8-column chunks: each with a constant
            // register count, so that the accumulators stay in registers (a count known only
            // at run time kept them on the stack, each store a call to `memcpy`).
            let mut c = 0;
            while c < full_blocks {
                // SAFETY: the contract, and c + 8C <= n.
                unsafe {
                    axpy_heads_slot_block::<H, C>(
                        a,
                        per_head,
                        s * n + c,
                        rows,
                        stride,
                        off + c,
                        probs,
                        probs_stride,
                        i0,
                        len,
                    )
                };
                c += block;
            }
            while c < full8 {
                // SAFETY: the contract, and c + 8 <= n.
                unsafe {
                    axpy_heads_slot_block::<H, 1>(
                        a,
                        per_head,
                        s * n + c,
                        rows,
                        stride,
                        off + c,
                        probs,
                        probs_stride,
                        i0,
                        len,
                    )
                };
                c += 8;
            }
            for h in 0..H {
                for d in full8..n {
                    let mut i = i0;
                    // SAFETY: d < n: inside head h's slot s row.
                    let x = unsafe { &mut *a.add(h * per_head + s * n + d) };
                    while i < len {
                        *x = h_(rows[i * stride + off + d]).mul_add(prob(h, i), *x);
                        i += slots;
                    }
                }
            }
        }
    }

    /// One slot's terms `i0, i0 + 16, ..` (below `len`) added to `R` registers of columns of
    /// every one of `H` heads: head h's accumulators at `a + h * per_head + at`, its
    /// probabilities at `probs[h * probs_stride + i]`, the rows' values at
    /// `rows[i * stride + off..][..8R]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; those accumulators, probabilities and row values are
    /// inside their buffers for every term.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_heads_slot_block<const H: usize, const R: usize>(
        a: *mut f32,
        per_head: usize,
        at: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
        probs_stride: usize,
        i0: usize,
        len: usize,
    ) {
        let slots = LANES;
        let mut acc = [[_mm256_setzero_ps(); R]; H];
        for (h, acc_h) in acc.iter_mut().enumerate() {
            for (k, v) in acc_h.iter_mut().enumerate() {
                // SAFETY: inside head h's accumulators (the contract).
                *v = unsafe { _mm256_loadu_ps(a.add(h * per_head + at + 8 * k)) };
            }
        }
        let mut i = i0;
        while i < len {
            // (A loop, not `array::from_fn`: closures do not inherit target features.)
            let mut p = [_mm256_setzero_ps(); H];
            for (h, ph) in p.iter_mut().enumerate() {
                // SAFETY: i < len: inside `probs` (the contract).
                *ph = _mm256_set1_ps(unsafe { *probs.get_unchecked(h * probs_stride + i) });
            }
            let base = i * stride + off;
            // The next row's same columns: the next slot's pass reads them (the rows of a
            // slot are 16 apart, so its own next terms were the previous slot's next rows).
            prefetch_f16(rows, base + stride, 8 * R);
            #[allow(clippy::needless_range_loop)] // acc[h][k]: two indices
            for k in 0..R {
                // SAFETY: base + 8k + 8 <= rows.len() (the contract).
                let v = unsafe { load8(rows, base + 8 * k) };
                for h in 0..H {
                    acc[h][k] = _mm256_fmadd_ps(v, p[h], acc[h][k]);
                }
            }
            i += slots;
        }
        for (h, acc_h) in acc.iter().enumerate() {
            for (k, v) in acc_h.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(a.add(h * per_head + at + 8 * k), *v) };
            }
        }
    }

    /// [`super::axpy_f16_rows`] (lengths checked by it): slot by slot, whatever the number of
    /// slots. (Eight slots x 8 columns in registers, the one-token kernel before, read each row
    /// in 16-byte pieces, one per pass over all the rows: 1.6x slower on a whole decode step
    /// of a 0.6B model at 2,048 tokens of context, head size 128, Zen 4.)
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy_f16_rows(
        accs: &mut [f32],
        slots: usize,
        first_term: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
    ) {
        // SAFETY: this function's features and lengths are the slot-major kernel's.
        unsafe { axpy_f16_rows_by_slot(accs, slots, first_term, rows, stride, off, probs) }
    }

    /// [`super::axpy_f16_rows`] slot by slot: for each slot, its terms (every `slots`-th) in
    /// order, into 64 columns of accumulators held in 8 registers. Each row's columns are read
    /// exactly once (the 8-column passes of the other kernel re-read a row's cache line once
    /// per chunk, and rows a power of two apart share few L1 sets: a head of 256 f16 columns
    /// missed L1 on nearly every load). Each accumulator still takes its terms in order, one
    /// fused multiply-add each: the bits of one `axpy_f16` per term.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `accs` holds `slots` rows of `n` accumulators and `rows`
    /// at least `(probs.len() - 1) * stride + off + n` values (checked by the caller).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_f16_rows_by_slot(
        accs: &mut [f32],
        slots: usize,
        first_term: usize,
        rows: &[f16],
        stride: usize,
        off: usize,
        probs: &[f32],
    ) {
        const BLOCK: usize = 64;
        let n = accs.len() / slots;
        let len = probs.len();
        let f = first_term % slots;
        let full8 = n - n % 8;
        for s in 0..slots {
            // Term i goes to slot (first_term + i) % slots.
            let i0 = (s + slots - f) % slots;
            if i0 >= len {
                continue;
            }
            let acc_row = &mut accs[s * n..(s + 1) * n];
            let mut c = 0;
            while c + BLOCK <= n {
                let mut acc = [_mm256_setzero_ps(); BLOCK / 8];
                for (k, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c + 8k + 8 <= c + BLOCK <= n = acc_row.len().
                    *a = unsafe { _mm256_loadu_ps(acc_row.as_ptr().add(c + 8 * k)) };
                }
                let mut i = i0;
                while i < len {
                    // SAFETY: i < len = probs.len().
                    let p = _mm256_set1_ps(unsafe { *probs.get_unchecked(i) });
                    let base = i * stride + off + c;
                    // The next row's same columns, which the next slot's pass reads.
                    prefetch_f16(rows, base + stride, BLOCK);
                    for (k, a) in acc.iter_mut().enumerate() {
                        // SAFETY: base + 8k + 8 <= i * stride + off + n <= rows.len() (caller).
                        *a = _mm256_fmadd_ps(unsafe { load8(rows, base + 8 * k) }, p, *a);
                    }
                    i += slots;
                }
                for (k, a) in acc.iter().enumerate() {
                    // SAFETY: as for the loads.
                    unsafe { _mm256_storeu_ps(acc_row.as_mut_ptr().add(c + 8 * k), *a) };
                }
                c += BLOCK;
            }
            while c < full8 {
                // SAFETY: c + 8 <= full8 <= n.
                let mut a = unsafe { _mm256_loadu_ps(acc_row.as_ptr().add(c)) };
                let mut i = i0;
                while i < len {
                    let p = _mm256_set1_ps(probs[i]);
                    // SAFETY: as above.
                    a = _mm256_fmadd_ps(unsafe { load8(rows, i * stride + off + c) }, p, a);
                    i += slots;
                }
                // SAFETY: as for the load.
                unsafe { _mm256_storeu_ps(acc_row.as_mut_ptr().add(c), a) };
                c += 8;
            }
            for (d, x) in acc_row.iter_mut().enumerate().skip(full8) {
                let mut i = i0;
                while i < len {
                    *x = h(rows[i * stride + off + d]).mul_add(probs[i], *x);
                    i += slots;
                }
            }
        }
    }

    /// [`super::accumulated_sums`] of the whole 8-column chunks, in registers: the same
    /// additions of the same pairs per column. Returns the columns done.
    ///
    /// # Safety
    /// The CPU has AVX2; `accs.len() == width * out.len()`, `width` is 16 or 64.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn accumulated_sums(accs: &[f32], width: usize, out: &mut [f32]) -> usize {
        let n = out.len();
        debug_assert_eq!(accs.len(), width * n);
        let full = n - n % 8;
        // (Loops, not closures: closures do not inherit the target features.)
        let p = accs.as_ptr();
        let mut c = 0;
        while c < full {
            let mut lanes = [_mm256_setzero_ps(); LANES];
            for (l, v) in lanes.iter_mut().enumerate() {
                // SAFETY: every slot read is < width and c + 8 <= full <= n: inside `accs`
                // (the contract).
                *v = unsafe {
                    if width == LANES {
                        _mm256_loadu_ps(p.add(l * n + c))
                    } else {
                        _mm256_add_ps(
                            _mm256_add_ps(
                                _mm256_loadu_ps(p.add(l * n + c)),
                                _mm256_loadu_ps(p.add((2 * LANES + l) * n + c)),
                            ),
                            _mm256_add_ps(
                                _mm256_loadu_ps(p.add((LANES + l) * n + c)),
                                _mm256_loadu_ps(p.add((3 * LANES + l) * n + c)),
                            ),
                        )
                    }
                };
            }
            // reduce16 on every column: t3[i] = a[i + 8] + a[i]; t6[i] = t3[i + 4] + t3[i].
            let mut t3 = [_mm256_setzero_ps(); 8];
            for i in 0..8 {
                t3[i] = _mm256_add_ps(lanes[i + 8], lanes[i]);
            }
            let mut t6 = [_mm256_setzero_ps(); 4];
            for i in 0..4 {
                t6[i] = _mm256_add_ps(t3[i + 4], t3[i]);
            }
            let r = _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]), _mm256_add_ps(t6[1], t6[3]));
            // SAFETY: c + 8 <= full <= out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c), r) };
            c += 8;
        }
        full
    }

    /// [`super::scale_round_f16`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scale_round_f16(xs: &mut [f32], scale: f32) {
        let full = xs.len() - xs.len() % 8;
        let s = _mm256_set1_ps(scale);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= xs.len(); loadu/storeu need no alignment.
            unsafe {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xs.as_ptr().add(i)), s);
                let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
                _mm256_storeu_ps(xs.as_mut_ptr().add(i), r);
            }
            i += 8;
        }
        for x in &mut xs[full..] {
            *x = f16::from_f32(*x * scale).to_f32();
        }
    }

    /// [`super::axpy_f16`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy_f16(acc: &mut [f32], v: &[f16], p: f32) {
        let n = acc.len().min(v.len());
        let full = n - n % 8;
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= both lengths; loadu/storeu need no alignment.
            unsafe {
                let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(load8(v, i), pv, a));
            }
            i += 8;
        }
        for k in full..n {
            acc[k] = h(v[k]).mul_add(p, acc[k]);
        }
    }

    /// [`super::dot_f16_ggml`].
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16_ggml(a: &[f16], b: &[f32]) -> f32 {
        const STEP: usize = 4 * LANES;
        let n = a.len().min(b.len());
        let np = n - n % STEP;
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < np {
            for (r, v) in acc.iter_mut().enumerate() {
                // Register r holds lanes 8*(r%2).. of accumulator r/2: elements i + 8r.
                // SAFETY: i + 8r + 8 <= i + 64 <= np <= both lengths.
                unsafe { *v = _mm256_fmadd_ps(load8(a, i + 8 * r), loadf(b, i + 8 * r), *v) };
            }
            i += STEP;
        }
        // folded[l] = (acc0[l] + acc2[l]) + (acc1[l] + acc3[l]), in registers (lo and hi halves).
        // (No closure: closures do not inherit the target features.)
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        // SAFETY: AVX2 present (this function's contract).
        let mut sum = f64::from(unsafe { reduce16_regs(lo, hi) });
        for k in np..n {
            sum += f64::from(h(a[k]) * b[k]);
        }
        sum as f32
    }
}

// ---- quantized dot products in the order of ggml's x86 AVX2 kernels ----
//
// ggml's `ggml_vec_dot_q4_1_q8_1`, `_q4_0_q8_0` and `_q8_0_q8_0` on x86 (the AVX2 branch, which
// its AVX-512 builds use too) keep one 8-lane f32 accumulator: per block, lane j gets the exact
// integer sum of the products of elements 4j..4j+3, converted to f32 and fused-multiply-added
// with the block's scale product `d_w * d_x`; at the end the lanes are reduced as
// `hsum_float_8` does (halves added lane-wise, then `(t0 + t2) + (t1 + t3)`). Q4_1 adds the
// `m_w * s_x` terms in a separate running f32 sum, added last. These functions are that order in
// portable code: the scalar kernel set on x86-64 uses them, so that every instruction-set path
// gives llama.cpp's tokens (the `avx2` module computes the same in registers).

/// Lanes of ggml's AVX2 float accumulator.
const Q_LANES: usize = 8;

/// `hsum_float_8`: the 8 lanes folded in ggml's order.
#[inline(always)]
fn hsum8(acc: &[f32; Q_LANES]) -> f32 {
    let t: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    (t[0] + t[2]) + (t[1] + t[3])
}

/// Folds one block into the accumulator: lane j += d * (sum of `prod(k)` for k in 4j..4j+3).
#[inline(always)]
fn block_fma(acc: &mut [f32; Q_LANES], d: f32, prod: impl Fn(usize) -> i32) {
    for (j, a) in acc.iter_mut().enumerate() {
        let s: i32 = (4 * j..4 * j + 4).map(&prod).sum();
        *a = d.mul_add(s as f32, *a);
    }
}

/// The weight nibble of element `k` of a Q4 block (low nibbles are elements 0..15).
#[inline(always)]
fn nibble(qs: &[u8; 16], k: usize) -> i32 {
    i32::from(if k < 16 {
        qs[k] & 0x0F
    } else {
        qs[k - 16] >> 4
    })
}

#[inline(always)]
fn f16_from(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

/// Q4_1 · Q8_1 in ggml's x86 order.
pub fn dot_q4_1_q8_1_x86(w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; Q_LANES];
    let mut m = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = f16_from(bw.d) * f16_from(bx.d);
        m += f16_from(bw.m) * f16_from(bx.s);
        block_fma(&mut acc, d, |k| nibble(&bw.qs, k) * i32::from(bx.qs[k]));
    }
    hsum8(&acc) + m
}

/// Q4_0 · Q8_0 in ggml's x86 order.
pub fn dot_q4_0_q8_0_x86(w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = [0.0f32; Q_LANES];
    for (bw, bx) in w.iter().zip(x) {
        let d = f16_from(bw.d) * f16_from(bx.d);
        block_fma(&mut acc, d, |k| {
            (nibble(&bw.qs, k) - 8) * i32::from(bx.qs[k])
        });
    }
    hsum8(&acc)
}

/// Q8_0 · Q8_0 in ggml's x86 order.
pub fn dot_q8_0_q8_0_x86(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = [0.0f32; Q_LANES];
    for (bw, bx) in w.iter().zip(x) {
        let d = f16_from(bw.d) * f16_from(bx.d);
        block_fma(&mut acc, d, |k| i32::from(bw.qs[k]) * i32::from(bx.qs[k]));
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {

    /// The SIMD f16 dots equal the portable ones bit for bit (same lanes, same fused operations),
    /// on random data of every length class (whole steps, tails, shorter than one step).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_f16_kernels_equal_the_portable_order_bit_for_bit() {
        if !super::simd::available() {
            eprintln!("no AVX2/FMA/F16C: skipped");
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        for n in [
            1usize, 7, 15, 16, 17, 33, 63, 64, 65, 127, 128, 200, 2048, 2049,
        ] {
            let a: Vec<half::f16> = (0..n).map(|_| half::f16::from_f32(next())).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            // SAFETY: features checked above.
            let (s1, s2) = unsafe {
                (
                    super::simd::dot_f16_tinyblas(&a, &b),
                    super::simd::dot_f16_ggml(&a, &b),
                )
            };
            assert_eq!(
                s1.to_bits(),
                dot_f16_tinyblas_portable(&a, &b).to_bits(),
                "tinyblas n={n}"
            );
            assert_eq!(
                s2.to_bits(),
                dot_f16_ggml_portable(&a, &b).to_bits(),
                "ggml n={n}"
            );
            let (mut acc_simd, mut acc_portable) = (b.clone(), b.clone());
            let p = next();
            // SAFETY: features checked above.
            unsafe { super::simd::axpy_f16(&mut acc_simd, &a, p) };
            axpy_f16_portable(&mut acc_portable, &a, p);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&acc_simd), bits(&acc_portable), "axpy n={n}");
            // Probabilities rounded to f16: tiny (subnormal f16), ties and large values too.
            let mut xs: Vec<f32> = b.iter().map(|v| v * 1e-3).collect();
            xs.extend([6.1e-5, 1e-7, 0.0, 1.0 + 1.0 / 2048.0, 65504.0, 7e4]);
            let mut portable = xs.clone();
            for x in &mut portable {
                *x = half::f16::from_f32(*x * 0.75).to_f32();
            }
            scale_round_f16(&mut xs, 0.75);
            assert_eq!(bits(&xs), bits(&portable), "scale_round_f16 n={n}");
        }
    }
    use super::*;

    /// The several-heads run kernels equal the portable order of each head on its own: every
    /// head count a pass split can produce (1 to 14: passes of 8 and 6 where AVX-512 runs), head sizes with and without whole 16-lane
    /// steps and 8-column chunks, runs shorter and longer than the slot count, several first
    /// terms, score and probability rows with gaps between heads.
    #[test]
    fn head_runs_equal_each_head_alone() {
        let mut seed = 0x0bad_cafe_f00d_1234u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (stride, off, n, n_rows) in [
            (192usize, 64usize, 64usize, 37usize),
            (64, 0, 64, 3),
            (256, 0, 256, 21),
            (260, 4, 128, 18),
            (50, 3, 44, 19),
            (100, 10, 80, 33),
        ] {
            let rows: Vec<f16> = (0..stride * n_rows)
                .map(|_| f16::from_f32(next()))
                .collect();
            for heads in 1..=14usize {
                let q: Vec<f32> = (0..heads * n).map(|_| next()).collect();
                let out_stride = n_rows + 3;
                let mut out = vec![-7.0f32; heads * out_stride];
                dot_f16_rows_heads(&rows, stride, off, &q, n, &mut out, out_stride, n_rows);
                for h in 0..heads {
                    let qh = &q[h * n..(h + 1) * n];
                    for i in 0..n_rows {
                        let want = dot_f16_tinyblas_portable(&rows[i * stride + off..][..n], qh);
                        let got = out[h * out_stride + i];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "n {n} heads {heads} h {h} row {i}"
                        );
                    }
                    // The gap between heads' rows is left alone.
                    assert!(out[h * out_stride + n_rows..(h + 1) * out_stride]
                        .iter()
                        .all(|x| *x == -7.0));
                }
                let probs: Vec<f32> = (0..heads * out_stride).map(|_| next()).collect();
                for first_term in [0usize, 5, 70] {
                    let init: Vec<f32> = (0..heads * LANES * n).map(|_| next()).collect();
                    let mut accs = init.clone();
                    axpy_f16_rows_heads(
                        &mut accs, n, LANES, first_term, &rows, stride, off, &probs, out_stride,
                        n_rows,
                    );
                    let mut want = init;
                    for h in 0..heads {
                        let w = &mut want[h * LANES * n..(h + 1) * LANES * n];
                        for i in 0..n_rows {
                            let s = (first_term + i) % LANES;
                            axpy_f16_portable(
                                &mut w[s * n..(s + 1) * n],
                                &rows[i * stride + off..][..n],
                                probs[h * out_stride + i],
                            );
                        }
                    }
                    assert_eq!(
                        bits(&accs),
                        bits(&want),
                        "n {n} heads {heads} first {first_term}"
                    );
                }
            }
        }
    }

    /// The run kernels equal one call per row (scores) and one `axpy_f16` per term in its slot.
    #[test]
    fn row_runs_equal_one_call_per_row() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        // Head sizes that are and are not whole 8-column chunks; runs shorter and longer than
        // the slot count; several first terms.
        for (stride, off, n, n_rows) in [
            (96usize, 32usize, 64usize, 37usize),
            (50, 3, 44, 5),
            (64, 0, 64, 130),
            // Gemma-3-class heads (256 columns, several 64-column blocks, one KV head) and a
            // 128-column head in a two-head row; row counts around multiples of 4 and 16.
            (256, 0, 256, 70),
            (256, 128, 128, 33),
            (200, 8, 192, 17),
            // A long run: several terms per slot of both counts, prefetches past the last row.
            (1024, 384, 128, 301),
        ] {
            let rows: Vec<f16> = (0..stride * n_rows)
                .map(|_| f16::from_f32(next()))
                .collect();
            let q: Vec<f32> = (0..n).map(|_| next()).collect();
            for batch in [false, true] {
                let mut out = vec![0.0f32; n_rows];
                dot_f16_rows(&rows, stride, off, &q, &mut out, batch);
                for (i, o) in out.iter().enumerate() {
                    let a = &rows[i * stride + off..][..n];
                    let want = if batch {
                        dot_f16_tinyblas_portable(a, &q)
                    } else {
                        dot_f16_ggml_portable(a, &q)
                    };
                    assert_eq!(o.to_bits(), want.to_bits(), "row {i} batch {batch}");
                }
            }
            let probs: Vec<f32> = (0..n_rows).map(|_| next()).collect();
            for slots in [LANES, STEP_LANES] {
                for first_term in [0usize, 5, 70] {
                    // Start from non-zero accumulators (a second run adds to the first's).
                    let init: Vec<f32> = (0..slots * n).map(|_| next()).collect();
                    let mut accs = init.clone();
                    axpy_f16_rows(&mut accs, slots, first_term, &rows, stride, off, &probs);
                    let mut want = init;
                    for (i, p) in probs.iter().enumerate() {
                        let s = (first_term + i) % slots;
                        axpy_f16_portable(
                            &mut want[s * n..(s + 1) * n],
                            &rows[i * stride + off..][..n],
                            *p,
                        );
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&accs),
                        bits(&want),
                        "n {n} slots {slots} first {first_term}"
                    );
                }
            }
        }
    }

    /// The column sums equal [`accumulated_sum`] of each column gathered by hand, bit for bit,
    /// for both slot counts and column counts that are not multiples of 8.
    #[test]
    fn accumulated_sums_equal_the_per_column_sum() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mixed magnitudes, so that the order of the additions shows in the bits.
            let m = (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            m * [1.0, 1e4, 1e-3][(seed % 3) as usize]
        };
        for width in [LANES, STEP_LANES] {
            for n in [1usize, 5, 8, 13, 64, 80, 128] {
                let accs: Vec<f32> = (0..width * n).map(|_| next()).collect();
                let mut out = vec![0.0f32; n];
                accumulated_sums(&accs, &mut out);
                for (d, o) in out.iter().enumerate() {
                    let col: Vec<f32> = (0..width).map(|k| accs[k * n + d]).collect();
                    assert_eq!(
                        o.to_bits(),
                        accumulated_sum(&col).to_bits(),
                        "width {width} n {n} column {d}"
                    );
                }
            }
        }
    }

    /// The 8-lane exp equals the scalar one bit for bit, over a sweep of arguments including
    /// the extremes (underflow to 0 and subnormals, overflow to inf, -inf, 0).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_expf_equals_scalar_bit_for_bit() {
        if !super::simd::available() {
            eprintln!("no AVX2/FMA/F16C: skipped");
            return;
        }
        let mut xs: Vec<f32> = (0..200_000).map(|i| -140.0 + i as f32 * 0.00123).collect();
        xs.extend([
            f32::NEG_INFINITY,
            -1e30,
            -200.0,
            -150.0,
            -133.5,
            -103.97,
            -87.3,
            -0.0,
            0.0,
            1e-30,
            88.7,
            88.8,
            150.0,
            1e30,
        ]);
        for sub in [0.0f32, 3.25, -7.5] {
            let mut got = xs.clone();
            // SAFETY: features checked above.
            unsafe { super::simd::expf_shifted(&mut got, sub) };
            for (x, g) in xs.iter().zip(&got) {
                let want = expf(*x - sub);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "x={x} sub={sub}: {g} vs {want}"
                );
            }
        }
    }

    /// The softmax maximum and sum with AVX2 against serial loops, on odd lengths, with NaNs
    /// and infinities: the same values (the sum bit for bit).
    #[test]
    fn simd_softmax_max_and_sum_equal_the_serial_loops() {
        let mut rng = crate::testutil::Rng::new(61);
        for len in [0usize, 1, 7, 15, 16, 17, 31, 64, 100, 513] {
            for special in [None, Some(f32::NAN), Some(f32::INFINITY), Some(-1e30)] {
                let mut xs = rng.vec(len, 30.0);
                if let (Some(v), true) = (special, len > 0) {
                    xs[len / 2] = v;
                    xs[len - 1] = v;
                }
                let want_max = xs.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
                let got_max = max_ignoring_nan(&xs);
                assert!(
                    got_max == want_max || (got_max.is_nan() && want_max.is_nan()),
                    "len {len} {special:?}: max {got_max} vs {want_max}"
                );
                let mut want = 0.0f64;
                for chunk in xs.chunks(LANES) {
                    let mut lanes = [0.0f32; LANES];
                    lanes[..chunk.len()].copy_from_slice(chunk);
                    want += f64::from(reduce16(&lanes));
                }
                let got = sum16_f64(&xs);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "len {len} {special:?}: sum {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn expf_is_close_to_exp_and_handles_extremes() {
        let mut x = -80.0f32;
        while x < 80.0 {
            let (want, got) = (x.exp(), expf(x));
            assert!(((got - want) / want).abs() < 4e-7, "x={x}: {got} vs {want}");
            x += 0.37;
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(200.0), f32::INFINITY);
        assert_eq!(expf(-200.0), 0.0);
    }

    #[test]
    fn reduce16_order() {
        // 2^24 + 1 + 1 loses both ones when added in a bad order; the tree pairs lanes
        // (0, 8), (4, 12), then (0, 4): lanes 0 and 8 hold the ones, lane 4 the big value.
        let mut a = [0.0f32; LANES];
        a[0] = 1.0;
        a[8] = 1.0;
        a[4] = 16_777_216.0;
        assert_eq!(reduce16(&a), 16_777_218.0);
        let mut b = [0.0f32; LANES];
        b[0] = 1.0;
        b[1] = 1.0;
        b[4] = 16_777_216.0;
        // lane 1 meets the big value only at the last add, lane 0 before: 2^24 + 1 rounds to
        // 2^24 (ties to even), then + 1 again.
        assert_eq!(reduce16(&b), 16_777_216.0);
    }

    #[test]
    fn dots_agree_with_exact_sums_on_small_integers() {
        let a: Vec<f16> = (0..256)
            .map(|i| f16::from_f32((i % 7) as f32 - 3.0))
            .collect();
        let b: Vec<f32> = (0..256).map(|i| (i % 5) as f32 - 2.0).collect();
        let exact: f32 = a.iter().zip(&b).map(|(x, y)| x.to_f32() * y).sum();
        assert_eq!(dot_f16_ggml(&a, &b), exact);
        assert_eq!(dot_f16_tinyblas(&a, &b), exact);
        let mut lane = [0.0f32; LANES];
        let mut step = [0.0f32; STEP_LANES];
        for k in 0..256 {
            accumulate(&mut lane, k, a[k].to_f32(), b[k]);
            accumulate(&mut step, k, a[k].to_f32(), b[k]);
        }
        assert_eq!(accumulated_sum(&lane), exact);
        assert_eq!(accumulated_sum(&step), exact);
        assert_eq!(
            dot_f16_ggml(&a[..70], &b[..70]),
            a[..70]
                .iter()
                .zip(&b[..70])
                .map(|(x, y)| x.to_f32() * y)
                .sum::<f32>()
        );
    }
}
