//! IQ4_XS · Q8_K decode (one token) with AVX-512 VL + VNNI on 256-bit registers, up to four
//! weight rows per call, each row in the order of the AVX2 kernel (`kquant_order::avx2`,
//! ggml's): per super-block, 8 integer lanes summing `scale_k * (q · y)` over the 8 sub-blocks
//! (each lane 4 consecutive elements), then `acc = fma(d_w * d_x, lanes, acc)`, one horizontal
//! sum at the end. The lanes are exact integers whichever way they are formed, so every result
//! is bit-identical to the AVX2 kernel for every activation the Q8_K quantizer produces (quants
//! -127..=127, ggml's choice for these kernels: at -128 the AVX2 kernel's `sign` trick wraps,
//! where this one stays exact).
//!
//! Where the AVX2 kernel spends ten instructions per sub-block (nibble split, two 128-bit table
//! lookups, the sign trick for `maddubs`, `madd` with the scale), this one spends five:
//! - the 16 index bytes are loaded once into both 128-bit halves and split into nibbles by one
//!   GFNI `gf2p8affineqb` (a masked shift and an `and` without GFNI), then one `vpshufb` looks
//!   up the table biased by +128 (unsigned, as `vpdpbusd` wants its left operand);
//! - `vpdpbusd` starts each lane at `-128 * (y[4l] + .. + y[4l + 3])`, formed once per call for
//!   all rows ([`ActBlock`]), so it yields the exact `q · y` of the lane;
//! - `vpmulld` by the sub-block's scale, `vpaddd` into the super-block's lanes.
//!
//! Rows are adjacent in the matrix and prefetched as one stream 4 KiB ahead.

use std::arch::x86_64::*;

use super::iq4_nl::KVALUES_IQ4NL;
use super::iq4_xs::BlockIq4Xs;
use super::q8_k::{BlockQ8_K, QK_K};
use super::x86::{hsum, Token};

/// How far ahead of the group's current super-block the kernel prefetches.
const PREFETCH_AHEAD: usize = 4096;

/// Sub-blocks of 32 weights per super-block.
const SUB: usize = QK_K / 32;

/// One Q8_K activation super-block's pieces shared by every weight row of a call.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(super) struct ActBlock {
    /// Per sub-block and lane `l`: `-128 * (y[4l] + .. + y[4l + 3])`.
    start: [[i32; 8]; SUB],
    /// The activation's `d`.
    d: f32,
}

impl Default for ActBlock {
    fn default() -> ActBlock {
        ActBlock {
            start: [[0; 8]; SUB],
            d: 0.0,
        }
    }
}

/// The activation's [`ActBlock`]s (`out.len()` super-blocks).
///
/// # Panics
/// If the token is not an AVX-512 one or `x` is shorter than `out`.
pub(super) fn prepare(t: Token, x: &[BlockQ8_K], out: &mut [ActBlock]) {
    assert!(t.avx512(), "iq4_xs_rows::prepare: an AVX-512 token");
    assert!(
        x.len() >= out.len(),
        "iq4_xs_rows::prepare: activation too short"
    );
    // SAFETY: the token's AVX-512 features were detected; lengths checked.
    unsafe { prepare_impl(x, out) }
}

/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; `x.len() >= out.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prepare_impl(x: &[BlockQ8_K], out: &mut [ActBlock]) {
    let zero = _mm256_setzero_si256();
    let bias = _mm256_set1_epi8(i8::MIN);
    for (o, b) in out.iter_mut().zip(x) {
        for (k, s) in o.start.iter_mut().enumerate() {
            // SAFETY: `qs[32k..32k + 32]` is inside the block (k < 8); unaligned load.
            let y = unsafe { _mm256_loadu_si256(b.qs.as_ptr().add(32 * k).cast()) };
            // `bias` read as unsigned: 128 * the lane's 4-sum, exact in i32.
            let st = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, y));
            // SAFETY: `s` is 32 writable bytes; unaligned store.
            unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), st) };
        }
        o.d = b.d();
    }
}

/// GFNI bit matrices (as in `legacy_rows.rs`): the low nibble of each byte in one 64-bit lane,
/// the high nibble in the other.
const LOW_NIBBLE: i64 = 0x0102_0408_0000_0000;
const HIGH_NIBBLE: i64 = 0x1020_4080_0000_0000;

/// `R` rows' dots with the activation (`x`, `a`). `GFNI` selects the nibble split.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI are present (and GFNI where `GFNI`); the rows
/// have one length and `x` and `a` at least that many super-blocks.
#[inline(always)]
unsafe fn rows_body<const R: usize, const GFNI: bool>(
    w: [&[BlockIq4Xs]; R],
    x: &[BlockQ8_K],
    a: &[ActBlock],
) -> [f32; R] {
    let low4 = _mm256_set1_epi8(0x0F);
    let nibble_matrix = _mm256_setr_epi64x(LOW_NIBBLE, LOW_NIBBLE, HIGH_NIBBLE, HIGH_NIBBLE);
    // The table biased to unsigned: KVALUES_IQ4NL[j] + 128 (1..=241), in both halves.
    let table = {
        let t: [u8; 16] = std::array::from_fn(|j| (i16::from(KVALUES_IQ4NL[j]) + 128) as u8);
        // SAFETY: 16 readable bytes; unaligned load.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
    };
    let mut acc = [_mm256_setzero_ps(); R];
    let stride = R * std::mem::size_of::<BlockIq4Xs>();
    let nb = w[0].len();
    for i in 0..nb {
        // SAFETY: i < nb <= x.len(), a.len() and every w[r].len() (caller).
        let (bx, ab, b) = unsafe {
            (
                x.get_unchecked(i),
                a.get_unchecked(i),
                w.map(|r| r.get_unchecked(i)),
            )
        };
        let ahead = w[0]
            .as_ptr()
            .cast::<i8>()
            .wrapping_add(PREFETCH_AHEAD + stride * i);
        for line in 0..stride.div_ceil(64) {
            // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the
            // address (`wrapping_add` keeps the pointer arithmetic itself defined).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line)) };
        }
        let mut ls = [_mm256_setzero_si256(); R];
        for (l, b) in ls.iter_mut().zip(b) {
            // SAFETY: AVX2 is present (caller).
            *l = unsafe { super::x86::iq4_xs_scales(b) };
        }
        let mut lanes = [_mm256_setzero_si256(); R];
        for k in 0..SUB {
            // SAFETY: `qs[32k..32k + 32]` is inside the block; `start[k]` is 32 bytes;
            // unaligned loads.
            let (y, start) = unsafe {
                (
                    _mm256_loadu_si256(bx.qs.as_ptr().add(32 * k).cast()),
                    _mm256_loadu_si256(ab.start[k].as_ptr().cast()),
                )
            };
            for r in 0..R {
                // SAFETY: `qs[16k..16k + 16]` is inside the block (k < 8); unaligned load.
                let q = _mm256_broadcastsi128_si256(unsafe {
                    _mm_loadu_si128(b[r].qs.as_ptr().add(16 * k).cast())
                });
                let n = if GFNI {
                    _mm256_gf2p8affine_epi64_epi8::<0>(q, nibble_matrix)
                } else {
                    _mm256_and_si256(_mm256_mask_srli_epi16::<4>(q, 0xFF00, q), low4)
                };
                let u = _mm256_shuffle_epi8(table, n);
                let dot = _mm256_dpbusd_epi32(start, u, y);
                let scale = _mm256_permutevar8x32_epi32(ls[r], _mm256_set1_epi32(k as i32));
                let scaled = _mm256_mullo_epi32(dot, scale);
                lanes[r] = _mm256_add_epi32(lanes[r], scaled);
            }
        }
        let dx = ab.d;
        for r in 0..R {
            // The AVX2 kernel's f32 product and `fma`.
            let d = super::block::f16_le(b[r].d) * dx;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes[r]), acc[r]);
        }
    }
    // SAFETY: AVX2 is present (caller).
    std::array::from_fn(|r| unsafe { hsum(acc[r]) })
}

macro_rules! rows {
    ($(#[$doc:meta])* $name:ident, $gfni:literal, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has `
        #[doc = $features]
        /// `; the rows have one length and `x` and `a` at least that many super-blocks.
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>(
            w: [&[BlockIq4Xs]; R],
            x: &[BlockQ8_K],
            a: &[ActBlock],
        ) -> [f32; R] {
            // SAFETY: as this function's (the features are enabled here).
            unsafe { rows_body::<R, $gfni>(w, x, a) }
        }
    };
}

rows!(
    /// IQ4_XS rows with GFNI.
    rows_gfni,
    true,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni"
);
rows!(
    /// IQ4_XS rows without GFNI.
    rows_shift,
    false,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// IQ4_XS · Q8_K of `R` (1 to 4) weight rows (adjacent in the matrix for the prefetch to help)
/// with one activation `x` and its [`prepare`]d pieces `a`: bit-identical to
/// `kquant_order::avx2::dot_iq4_xs_q8_k` of each row. `use_gfni` (tests only: false) picks the
/// kernel without GFNI on a CPU that has it.
///
/// # Panics
/// If the token is not an AVX-512 one, the rows' lengths differ, or `x` or `a` is shorter.
pub(super) fn dot_iq4_xs_q8_k_rows<const R: usize>(
    t: Token,
    w: [&[BlockIq4Xs]; R],
    x: &[BlockQ8_K],
    a: &[ActBlock],
    use_gfni: bool,
) -> [f32; R] {
    const { assert!(R >= 1 && R <= 4) };
    assert!(t.avx512(), "dot_iq4_xs_q8_k_rows: an AVX-512 token");
    let nb = w[0].len();
    assert!(
        w.iter().all(|r| r.len() == nb) && x.len() >= nb && a.len() >= nb,
        "dot_iq4_xs_q8_k_rows: rows of unequal length or activation too short"
    );
    if t.gfni() && use_gfni {
        // SAFETY: the token's AVX-512 features and GFNI were detected; lengths checked.
        unsafe { rows_gfni(w, x, a) }
    } else {
        // SAFETY: the token's AVX-512 features were detected; lengths checked.
        unsafe { rows_shift(w, x, a) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::blocks;
    use super::super::kquant_order;
    use super::super::repack::tests::{q8_k_row, random_blocks, scale};
    use super::*;
    use crate::testutil::Rng;

    /// `rows` IQ4_XS rows of `nb` super-blocks: random indices and scales with a finite `d`;
    /// with `extreme`, all indices 0 (-127) or 15 (113), every scale -32 or 31, and the
    /// largest f16 `d` in half of the blocks.
    fn iq4_xs_rows(r: &mut Rng, rows: usize, nb: usize, extreme: bool) -> Vec<u8> {
        random_blocks(r, rows * nb, 136, |r, b| {
            let pick = r.next_u64();
            b[..2].copy_from_slice(&scale(r, extreme && pick & 4 != 0));
            if extreme {
                let s = if pick & 2 == 0 { 0x00 } else { 0xFF };
                b[2..8].fill(s);
                b[8..].fill(if pick & 1 == 0 { 0x00 } else { 0xFF });
            }
        })
    }

    /// One to four rows at a time, with and without GFNI, against the AVX2 kernel bit for bit,
    /// on random and extreme blocks and activations; rows repeated and out of order too.
    #[test]
    fn rows_bit_identical_to_the_avx2_kernel() {
        let Some(t) = Token::detect_avx512() else {
            return;
        };
        let avx2 = t.without_avx512();
        let mut r = Rng::new(47);
        for nb in [1usize, 2, 3, 6] {
            for extreme in [false, true] {
                for k in 0..2 {
                    let w = iq4_xs_rows(&mut r, 5, nb, extreme);
                    // The quantizer's range: -128 never occurs (see the module doc).
                    let mut x = q8_k_row(&mut r, nb, extreme && k == 1);
                    for b in x.chunks_exact_mut(292) {
                        for q in &mut b[4..260] {
                            if *q == 0x80 {
                                *q = 0x81;
                            }
                        }
                    }
                    let xb: &[BlockQ8_K] = blocks(&x);
                    let mut a = vec![ActBlock::default(); nb];
                    prepare(t, xb, &mut a);
                    let rows: Vec<&[BlockIq4Xs]> = w.chunks_exact(nb * 136).map(blocks).collect();
                    let want: Vec<u32> = rows
                        .iter()
                        .map(|row| kquant_order::avx2::dot_iq4_xs_q8_k(avx2, row, xb).to_bits())
                        .collect();
                    for g in 0..25 {
                        let pick = [g % 5, g / 5, (g + 2) % 5, (3 * g + 1) % 5];
                        for gfni in [true, false] {
                            let msg = format!("nb={nb} extreme={extreme} {k} gfni={gfni}");
                            let got4 = dot_iq4_xs_q8_k_rows(t, pick.map(|p| rows[p]), xb, &a, gfni);
                            let got2 = dot_iq4_xs_q8_k_rows(
                                t,
                                [rows[pick[0]], rows[pick[1]]],
                                xb,
                                &a,
                                gfni,
                            );
                            let got1 = dot_iq4_xs_q8_k_rows(t, [rows[pick[2]]], xb, &a, gfni);
                            for (v, p) in got4.into_iter().zip(pick) {
                                assert_eq!(v.to_bits(), want[p], "4 rows {msg}");
                            }
                            for (v, p) in got2.into_iter().zip(pick) {
                                assert_eq!(v.to_bits(), want[p], "2 rows {msg}");
                            }
                            assert_eq!(got1[0].to_bits(), want[pick[2]], "1 row {msg}");
                        }
                    }
                }
            }
        }
    }
}
