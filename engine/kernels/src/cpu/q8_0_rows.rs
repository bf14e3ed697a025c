//! Q8_0 · Q8_0 and Q5_0 · Q8_0 for several tokens on AVX2 machines without AVX-512 (Zen 3 and
//! older, most Intel client CPUs), 8 weight rows at a time with row r in 32-bit lane r: the
//! kernel of prefill's 8-token groups (`Kernels::matvec_tokens8`). Since stop 40, prompts take
//! the packed panels (`panels.rs`, the same order and bits; each chunk of rows transposed once
//! for all tokens, not once per 8) where they apply; this kernel keeps the rest: rows longer
//! than the panels hold, `EDGE_RUN_PANELS=0`, fewer than 32 tokens of IQ4_NL, and the steps of
//! sessions decoding together.
//!
//! Why: ggml's order (`avx2::dot_q8_0_q8_0_x8_scaled`) keeps 8 partial sums per block, so every
//! (row, block, token) pays a convert, a scale product and an `fma` besides its integer dot. On
//! Zen 3 the integer multiplies (`vpsignb`, `vpmaddubsw`, `vpmaddwd`) and the float ones share
//! two pipes, so those 5 instructions took 0.95 ns per (row, block, token) (2.35 cycles by
//! llvm-mca's model; measured, 256 rows of SmolLM2's `ffn_up` in cache), and SmolLM2 Q8_0
//! prefilled at 0.97x llama.cpp. With rows in the lanes, a block's 8 dword groups add up inside
//! each lane, and the float work is one convert and one `fma` per 8 rows: 0.69 ns.
//!
//! How: per block, the 8 rows' 32 quants are loaded where they lie (the file's rows, memory
//! mapped: nothing is copied or repacked) and transposed by dwords (an 8x8 transpose, 24
//! shuffles shared by all tokens), so that register `j` holds quants `4j..4j + 4` of row r in
//! lane r. Per token and group, the activation's 4 matching quants are one broadcast, and
//! `maddubs(|w|, sign(x, w))` then `madd` with ones add 4 exact products to every lane: the
//! sign trick, exact for activations in -127..127 (the quantizer never writes -128; [`matvec`]
//! checks and declines). Each block's exact integer dot is scaled with one `fma`, block after
//! block: `acc = fma(d_w * d_x, isum as f32, acc)`, the order of the AVX-512 packed panels
//! (`panels.rs`) and of `dot_q8_0_q8_0_blockwise`, so prefill's 8-token groups give the same
//! bits on both x86 kernel sets. They differ from ggml's one-token order by f32 rounding only
//! (the rule for batched prefill: where matching llama.cpp's batched order costs
//! speed, speed wins; README, "Speed"). A prompt's tail of 2 to 4 tokens keeps ggml's order,
//! as on AVX-512: with it in this order too, 4 of the 8 greedy continuations of SmolLM2 Q8_0
//! after a batched prompt were llama.cpp's, against 6. The steps of 2 to 4 sessions decoding
//! together (`Kernels::matvec_steps`) take this kernel: SmolLM2's Q8_0 output head, 49,152
//! rows streamed from memory for 4 tokens, is a sixth of such a step.
//!
//! Decode streams the weights: each 8-row group prefetches the group 8 KiB on
//! ([`super::x86::ROWS8_AHEAD_BYTES`]), a slice per block. (The rows' own next blocks, prefetched
//! before, lie in the group itself for rows of a few hundred bytes; in cache, prefill's
//! timing is the same either way.)
//!
//! Q5_0 takes the same path ([`SignedBlock`]): each block's values `q - 16` are unpacked per
//! row before the transpose, and, being within -16..=16, their group products add up in i16
//! with one `madd` per block and token (0.80 -> 0.71 ns per row, block and token). 256 rows of
//! SmolLM2 Q4_K_M's `ffn_up` (Q5_0) in cache, Zen 3: 1.12 ns in ggml's order
//! (`avx2_quants::dot_q5_0_q8_0_x8_scaled`), 0.71 here. It is the packed panels' Q5_0 order
//! too, so both x86 sets prefill Q5_0 with the same bits.
//!
//! IQ4_NL's repacked matrices (8-row multiples) take it as well for prefill's 8-token groups:
//! the table's values are signed bytes (-127..=113), and the blockwise order is llama.cpp's
//! repacked one, so these give the one-token bits there (0.88 -> 0.75 ns per row, block and
//! token against `q4_0_rows`'s split-nibble kernel, 256 rows of SmolLM2 IQ4_XS's `ffn_up`).
//!
//! Tried: `vpmaddwd` of i16 pairs instead of the sign trick (two multiplies per 4 products
//! either way, but twice the broadcasts): 1.0 against 0.69 ns.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

#[cfg(test)]
use super::block::f16_le;
use super::block::Block;
use super::iq4_nl::BlockIq4Nl;
use super::q4_0::BlockQ4_0;
use super::q5_0::BlockQ5_0;
use super::q8_0::BlockQ8_0;
use super::x86::{iq4_nl_values, nibbles, q5_quants, Token};

/// A weight block these kernels take: 32 signed values (`|v| <= 128`) and an f16 scale, with
/// Q8_0 activations: Q8_0 (the values as stored) and Q5_0 (`q - 16`, unpacked per block).
pub(super) trait SignedBlock: Block {
    /// Every value is within -16..=16: the 8 dword groups' pair sums of a block (each at most
    /// `2 * 16 * 127` in magnitude) add up in i16 (at most 32,512 < 2^15), so one `madd` per
    /// block and token turns them into i32 instead of one per group.
    const SMALL: bool;
    /// The 32 values as i8.
    ///
    /// # Safety
    /// AVX2 is present.
    unsafe fn values(&self) -> __m256i;
    /// The scale's f16 bits.
    fn d_bits(&self) -> i16;
}

impl SignedBlock for BlockQ8_0 {
    const SMALL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: `qs` is 32 readable bytes; loadu needs no alignment.
        unsafe { _mm256_loadu_si256(self.qs.as_ptr().cast()) }
    }
    #[inline(always)]
    fn d_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
}

/// IQ4_NL: the table's values (-127..=113). For matrices llama.cpp repacks (8-row multiples)
/// this order is its repacked one (`repack::dot_iq4_nl_q8_0`: per block the exact integer dot,
/// then one `fma` with `d_w * d_x`), so these rows give the one-token bits there.
impl SignedBlock for BlockIq4Nl {
    const SMALL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: AVX2 is present (caller).
        unsafe { iq4_nl_values(&self.qs) }
    }
    #[inline(always)]
    fn d_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
}

/// Q4_0 (`q - 8`): only the packed panels take it here (`panels.rs`).
impl SignedBlock for BlockQ4_0 {
    const SMALL: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: AVX2 is present (caller).
        let q = unsafe { nibbles(&self.qs) };
        _mm256_sub_epi8(q, _mm256_set1_epi8(8))
    }
    #[inline(always)]
    fn d_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
}

impl SignedBlock for BlockQ5_0 {
    const SMALL: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: AVX2 is present (caller).
        let q = unsafe { q5_quants(&self.qh, &self.qs) };
        _mm256_sub_epi8(q, _mm256_set1_epi8(16))
    }
    #[inline(always)]
    fn d_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
}

/// One weight row with one activation row in the order of these kernels (the reference the
/// tests hold them to): per block, the exact integer dot, then `acc = fma(d_w * d_x, isum, acc)`.
#[cfg(test)]
pub(super) fn dot_q8_0_q8_0_blockwise(w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
    let values = w.iter().map(|b| b.qs.map(i32::from));
    dot_blockwise(values, w.iter().map(|b| b.d), x)
}

/// [`dot_q8_0_q8_0_blockwise`] of a Q5_0 row (values `q - 16`).
#[cfg(test)]
pub(super) fn dot_q5_0_q8_0_blockwise(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let values = w.iter().map(|b| {
        let qh = u32::from_le_bytes(b.qh);
        std::array::from_fn::<i32, 32, _>(|j| {
            let nib = if j < 16 {
                b.qs[j] & 0x0F
            } else {
                b.qs[j - 16] >> 4
            };
            i32::from(nib | (((qh >> j) & 1) as u8) << 4) - 16
        })
    });
    dot_blockwise(values, w.iter().map(|b| b.d), x)
}

#[cfg(test)]
fn dot_blockwise(
    values: impl Iterator<Item = [i32; 32]>,
    d: impl Iterator<Item = [u8; 2]>,
    x: &[BlockQ8_0],
) -> f32 {
    let mut acc = 0f32;
    for ((v, d), bx) in values.zip(d).zip(x) {
        let isum: i32 = v.iter().zip(&bx.qs).map(|(&a, &b)| a * i32::from(b)).sum();
        acc = (f16_le(d) * f16_le(bx.d)).mul_add(isum as f32, acc);
    }
    acc
}

/// `y[t][i]` = row i of the Q8_0 or Q5_0 matrix `w` (whole rows of `rb` bytes) with token t,
/// for `T` tokens (1 to 8), in the order of [`dot_q8_0_q8_0_blockwise`]; returns `false` (and writes
/// nothing) where an activation holds a -128 quant (the sign trick would wrap; the quantizer
/// never writes one), for the caller's other kernels.
///
/// # Panics
/// If an activation row has fewer blocks than a weight row, or a `y[t]` has fewer slots than
/// `w` has rows.
pub(super) fn matvec<W: SignedBlock, const T: usize>(
    t: Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_0]; T],
    y: &mut [&mut [f32]; T],
) -> bool {
    const { assert!(T >= 1 && T <= 8) };
    let rows = w.len().checked_div(rb).unwrap_or(0);
    let nb = rb / std::mem::size_of::<W>();
    if rows == 0 {
        return true;
    }
    assert!(x.iter().all(|x| x.len() >= nb), "activation row too short");
    if !x.iter().all(|x| super::avx2::sign_trick_exact(t, &x[..nb])) {
        return false;
    }
    assert!(y.iter().all(|y| y.len() >= rows), "y too short");
    let row = |i: usize| -> &[W] { super::block::blocks(&w[i * rb..(i + 1) * rb]) };
    // The activations' scales as f32 (`avx2::q8_0_token_scales`), once per chunk of blocks for
    // all rows, on the stack (only the chunk's entries initialized: zeroing the whole buffer
    // per call would cost more than a narrow matrix's work). A row's blocks go chunk after
    // chunk, its sums carried in `y`, so the order is the same as in one pass.
    let mut dx_buf = [MaybeUninit::<[f32; 8]>::uninit(); CHUNK];
    for c0 in (0..nb).step_by(CHUNK) {
        let c1 = nb.min(c0 + CHUNK);
        let xc = x.map(|x| &x[c0..c1]);
        let dx = &mut dx_buf[..c1 - c0];
        dx.fill(MaybeUninit::new([0.0; 8]));
        // SAFETY: every entry of `dx` was written just above; `[f32; 8]` is plain data with
        // the layout of `MaybeUninit<[f32; 8]>`.
        let dx = unsafe { &mut *(dx as *mut [MaybeUninit<[f32; 8]>] as *mut [[f32; 8]]) };
        super::avx2::q8_0_token_scales(t, xc, dx);
        let dx: &[[f32; 8]] = dx;
        // Decode streams the weights from memory: each group asks for the bytes of a group
        // `groups_ahead` on (within this call's rows), spread over its blocks.
        let groups_ahead = (super::x86::ROWS8_AHEAD_BYTES / (8 * rb)).max(1);
        let mut i = 0;
        while i < rows {
            let next = ((i + 8 * groups_ahead) * rb).min(w.len());
            let ahead = &w[next..(next + 8 * rb).min(w.len())];
            // The last group repeats the last row where fewer than 8 are left (its extra
            // lanes are not stored).
            let group: [&[W]; 8] = std::array::from_fn(|k| &row((i + k).min(rows - 1))[c0..c1]);
            let n = (rows - i).min(8);
            let init: [[f32; 8]; T] = std::array::from_fn(|k| {
                let mut a = [0f32; 8];
                if c0 > 0 {
                    a[..n].copy_from_slice(&y[k][i..i + n]);
                }
                a
            });
            // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; every
            // group row and every `xc[t]` has `c1 - c0` blocks, as `dx` has, and no
            // activation quant is -128 (checked above).
            let r = unsafe { rows8_impl::<W, T>(group, xc, ahead, dx, init) };
            for (yt, rt) in y.iter_mut().zip(&r) {
                yt[i..i + n].copy_from_slice(&rt[..n]);
            }
            i += 8;
        }
    }
    true
}

/// The 8x8 transpose by dwords of 8 rows' values: `g[j]` lane r = values `4j..4j + 4` of
/// `q[r]` (24 shuffles).
///
/// # Safety
/// AVX2 is present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose8(q: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(q[0], q[1]);
    let t1 = _mm256_unpackhi_epi32(q[0], q[1]);
    let t2 = _mm256_unpacklo_epi32(q[2], q[3]);
    let t3 = _mm256_unpackhi_epi32(q[2], q[3]);
    let t4 = _mm256_unpacklo_epi32(q[4], q[5]);
    let t5 = _mm256_unpackhi_epi32(q[4], q[5]);
    let t6 = _mm256_unpacklo_epi32(q[6], q[7]);
    let t7 = _mm256_unpackhi_epi32(q[6], q[7]);
    // [rows 0-3 | rows 0-3] (or 4-7) of dwords (j | j + 4).
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// Blocks per chunk of the activations' scales (16 KiB of stack).
const CHUNK: usize = 512;

/// 8 rows (lane r: row r) with `T` tokens, starting from `init`: `out[t][r]`.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `w[r]` and `x[t]` has `dx.len()` blocks; no
/// activation quant is -128 (else the lanes are wrong, though still defined).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_impl<W: SignedBlock, const T: usize>(
    w: [&[W]; 8],
    x: [&[BlockQ8_0]; T],
    ahead: &[u8],
    dx: &[[f32; 8]],
    init: [[f32; 8]; T],
) -> [[f32; 8]; T] {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: `init[t]` is 8 f32; loadu needs no alignment.
    let mut acc: [__m256; T] =
        std::array::from_fn(|t| unsafe { _mm256_loadu_ps(init[t].as_ptr()) });
    for (i, dxi) in dx.iter().enumerate() {
        // SAFETY: i < dx.len() == every w[r].len() (caller).
        let b: [&W; 8] = std::array::from_fn(|r| unsafe { w[r].get_unchecked(i) });
        super::x86::prefetch_range(ahead, i * 8 * size_of::<W>(), 8 * size_of::<W>());
        // SAFETY: AVX2 is present (caller).
        let q: [__m256i; 8] = std::array::from_fn(|r| unsafe { b[r].values() });
        // SAFETY: AVX2 is present (caller).
        let g = unsafe { transpose8(q) };
        let d = b.map(|b| b.d_bits());
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ));
        // Per token: the group products' pair sums added in i32 (or, for small values, in
        // i16 with one `madd` at the end; see `SignedBlock::SMALL`).
        let mut isum = [_mm256_setzero_si256(); T];
        for (j, gj) in g.iter().enumerate() {
            let a = _mm256_abs_epi8(*gj);
            for (t, s) in isum.iter_mut().enumerate() {
                // SAFETY: i < x[t].len() (caller); 4 readable bytes at 4j < 32.
                let xq = unsafe {
                    std::ptr::read_unaligned(
                        x[t].get_unchecked(i).qs.as_ptr().add(4 * j).cast::<i32>(),
                    )
                };
                let p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(_mm256_set1_epi32(xq), *gj));
                *s = if W::SMALL {
                    _mm256_add_epi16(*s, p)
                } else {
                    _mm256_add_epi32(*s, _mm256_madd_epi16(p, ones))
                };
            }
        }
        if W::SMALL {
            for s in isum.iter_mut() {
                *s = _mm256_madd_epi16(*s, ones);
            }
        }
        for t in 0..T {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(dxi[t]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    std::array::from_fn(|t| {
        let mut o = [0f32; 8];
        // SAFETY: `o` has 8 f32; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc[t]) };
        o
    })
}
