//! Decode (one token) of ggml's 32-weight "legacy" quants with a minimum or a fifth bit —
//! Q4_1 · Q8_1, Q5_0 · Q8_0 and Q5_1 · Q8_1 — with AVX-512 VL + VNNI on 256-bit registers, four
//! weight rows per call, each row in ggml's one-token order: per block, 8 lanes of exact
//! integer dots of 4 weights each, `acc = fma(d_w * d_x, lane, acc)`, one horizontal sum at the
//! end (Q4_1 and Q5_1 add the `m_w * s_x` products, summed in block order). Every result is
//! bit-identical to the AVX2 one-row kernels (`avx2.rs`, `avx2_quants.rs`), which compute the
//! rows left over after the groups of four.
//!
//! Q5_0 and Q5_1 are most of the weights of the Q4_K_M and Q5_K_M files of models whose width
//! is not a multiple of 256 (SmolLM2's, Gemma-3's); Q4_1 is SmolLM2's own file. Decode reads
//! these matrices once per token, so the kernel is built around loads and unpacking rather than
//! products:
//! - The activation's per-block pieces are formed once per call for all rows ([`ActBlock`]):
//!   Q5_0's `-16 * sum(y)` per lane (the weights enter `vpdpbusd` unsigned, `q` in 0..31, and the
//!   lane starts at the offset `q - 16` would have added) and the scales as f32.
//! - A row's 16 nibble bytes are loaded once into both 128-bit halves; GFNI's
//!   `gf2p8affineqb`, with a bit matrix per half, takes the low nibbles in one half and the high
//!   ones in the other in one instruction (without GFNI: a masked shift and an `and`), and the
//!   fifth bits are added under the 32-bit mask `qh` itself.
//! - The four rows' `d` (and Q5_1's `m`) are converted and multiplied by the activation's scale
//!   in one 128-bit operation per block.
//! - The four rows are adjacent in the matrix, so they are prefetched as one sequential stream
//!   4 KiB ahead: per block, the two cache lines the group will read there.
//!
//! On one Zen 4 core (SmolLM2's 1536 x 576 Q5_0 matrix in cache): 3.4 cycles per row and block
//! against 4.8 for the earlier 4-row tile, 3.8 without GFNI; from memory 21 against 12 GB/s.
//!
//! [`dot_rows4_avx2`] is the same four-row walk with AVX2 alone (Zen 1–3, Intel client cores):
//! the nibbles split by one 64-bit shift of the twice-loaded bytes, the fifth bits spread by a
//! shuffle and a compare, the four rows' scale products one 128-bit multiply per block. Its
//! loop takes 12 vector operations per row and block where the two-row kernel it replaces
//! took 18 (and built each pair's f16 scales in scalar registers). Scale products formed in a
//! pass of their own and read back by broadcast loads were slower (0.6 ns per row and block
//! more on Zen 3), as was prefetching in that pass.
//!
//! On one Zen 3 core, alternating with the build before it on a noisy host (3 runs, the best
//! of 4 in each): SmolLM2's 1536 x 576 `ffn_gate` in cache, ns per row and block, Q5_0 2.1–2.9
//! against 2.5–3.7, Q5_1 2.1–2.8 against 2.5–3.3, Q4_1 1.6–2.2 against 1.9–2.7 (the one-row
//! kernel); every `ffn_gate` and `ffn_up` of the file from memory (36–41 MB), GB/s, Q5_0
//! 8.3–10.4 against 5.3–8.8, Q5_1 8.5–11.8 against 8.9–9.0, Q4_1 8.8–12.9 against 9.1–9.7.

use std::arch::x86_64::*;

use super::q4_1::BlockQ4_1;
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::x86::{broadcast_each, fifth_bits, hsum, nibbles, Token};

/// How far ahead of the group's current block the kernels prefetch (measured on Zen 4 from
/// memory: 12 GB/s with none, 19 at 1 KiB, 21 at 4 and 8 KiB).
const PREFETCH_AHEAD: usize = 4096;

/// One activation block's pieces shared by every weight row of a call.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct ActBlock {
    /// Q5_0: `-16 * (y[4l] + .. + y[4l + 3])` for lane `l`; Q5_1: zero.
    start: [i32; 8],
    /// The activation's `d` as f32.
    d: f32,
    /// Q5_1: the activation's `s` (`d * sum(y)`) as f32.
    s: f32,
}

/// The Q8_0 activation's [`ActBlock`]s (`out.len()` blocks), for the AVX-512 and the AVX2
/// four-row kernels alike: `-16 * sum` of each lane's 4 quants, exact in `maddubs`' i16 pairs
/// (within +-4096) and `madd`'s i32 lanes.
///
/// # Panics
/// If `x` is shorter than `out`.
pub(super) fn prepare_q8_0(_: Token, x: &[BlockQ8_0], out: &mut [ActBlock]) {
    assert!(x.len() >= out.len(), "prepare_q8_0: activation too short");
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { prepare_q8_0_impl(x, out) }
}

/// # Safety
/// AVX2, FMA and F16C are present; `x.len() >= out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prepare_q8_0_impl(x: &[BlockQ8_0], out: &mut [ActBlock]) {
    let (zero, sixteen, ones) = (
        _mm256_setzero_si256(),
        _mm256_set1_epi8(16),
        _mm256_set1_epi16(1),
    );
    for (o, b) in out.iter_mut().zip(x) {
        // SAFETY: `qs` is 32 readable bytes; `loadu` has no alignment requirement.
        let y = unsafe { _mm256_loadu_si256(b.qs.as_ptr().cast()) };
        let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(sixteen, y), ones);
        // SAFETY: `start` is 32 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm256_storeu_si256(o.start.as_mut_ptr().cast(), _mm256_sub_epi32(zero, sums)) };
        o.d = super::block::f16_le(b.d);
        o.s = 0.0;
    }
}

/// The Q8_1 activation's [`ActBlock`]s (`out.len()` blocks).
///
/// # Panics
/// If `x` is shorter than `out`.
pub(super) fn prepare_q8_1(x: &[BlockQ8_1], out: &mut [ActBlock]) {
    assert!(x.len() >= out.len(), "prepare_q8_1: activation too short");
    for (o, b) in out.iter_mut().zip(x) {
        *o = ActBlock {
            start: [0; 8],
            d: super::block::f16_le(b.d),
            s: super::block::f16_le(b.s),
        };
    }
}

/// A Q4_1, Q5_0 or Q5_1 block as the kernel reads it.
pub(super) trait WeightBlock {
    /// The activation blocks it pairs with (ggml's `vec_dot_type`).
    type Act: Q8Block;
    /// Whether the quants have a fifth bit (`qh`).
    const FIFTH_BITS: bool;
    /// Whether the block has a minimum `m`, whose `m * s` products the dot adds (Q4_1, Q5_1;
    /// Q5_0's `-16` offset is in [`ActBlock::start`] instead).
    const MINS: bool;
    /// `d` (and `m`; zero for Q5_0) as f16 bits.
    fn dm(&self) -> (u16, u16);
    /// The fifth bits (zero for Q4_1).
    fn qh(&self) -> u32;
    /// The nibbles.
    fn qs(&self) -> &[u8; 16];
}

impl WeightBlock for BlockQ4_1 {
    type Act = BlockQ8_1;
    const FIFTH_BITS: bool = false;
    const MINS: bool = true;
    #[inline(always)]
    fn dm(&self) -> (u16, u16) {
        (u16::from_le_bytes(self.d), u16::from_le_bytes(self.m))
    }
    #[inline(always)]
    fn qh(&self) -> u32 {
        0
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
}

impl WeightBlock for BlockQ5_0 {
    type Act = BlockQ8_0;
    const FIFTH_BITS: bool = true;
    const MINS: bool = false;
    #[inline(always)]
    fn dm(&self) -> (u16, u16) {
        (u16::from_le_bytes(self.d), 0)
    }
    #[inline(always)]
    fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
}

impl WeightBlock for BlockQ5_1 {
    type Act = BlockQ8_1;
    const FIFTH_BITS: bool = true;
    const MINS: bool = true;
    #[inline(always)]
    fn dm(&self) -> (u16, u16) {
        (u16::from_le_bytes(self.d), u16::from_le_bytes(self.m))
    }
    #[inline(always)]
    fn qh(&self) -> u32 {
        u32::from_le_bytes(self.qh)
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
}

/// An activation block's quants.
pub(super) trait Q8Block {
    /// The 32 quants.
    fn qs(&self) -> &[i8; 32];
}

impl Q8Block for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

impl Q8Block for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// GFNI bit matrices (one per 64-bit lane): `gf2p8affineqb` sets bit `i` of each output byte to
/// the parity of matrix byte `7 - i` AND the input byte, so byte `7 - i` = `1 << i` keeps bit
/// `i` (the low nibble) and `1 << (i + 4)` moves bit `i + 4` down (the high nibble).
pub(super) const LOW_NIBBLE: i64 = 0x0102_0408_0000_0000;
pub(super) const HIGH_NIBBLE: i64 = 0x1020_4080_0000_0000;

/// The four rows' dots with the activation (`x`, `a`), in ggml's one-token order. `GFNI`
/// selects the nibble split.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI are present (and GFNI where `GFNI`); the rows
/// have one length and `x` and `a` at least that many blocks.
#[inline(always)]
unsafe fn rows4_body<B: WeightBlock, const GFNI: bool>(
    w: [&[B]; 4],
    x: &[B::Act],
    a: &[ActBlock],
) -> [f32; 4] {
    let sixteen = _mm256_set1_epi8(16);
    let low4 = _mm256_set1_epi8(0x0F);
    let nibble_matrix = _mm256_setr_epi64x(LOW_NIBBLE, LOW_NIBBLE, HIGH_NIBBLE, HIGH_NIBBLE);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_m = _mm_setzero_ps();
    let stride = 4 * std::mem::size_of::<B>();
    let nb = w[0].len();
    for i in 0..nb {
        // SAFETY: i < nb <= x.len(), a.len() and every w[r].len() (caller).
        let (y, ab, b) = unsafe {
            (
                _mm256_loadu_si256(x.get_unchecked(i).qs().as_ptr().cast()),
                a.get_unchecked(i),
                [0, 1, 2, 3].map(|r| w[r].get_unchecked(i)),
            )
        };
        let ahead = w[0]
            .as_ptr()
            .cast::<i8>()
            .wrapping_add(PREFETCH_AHEAD + stride * i);
        // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the
        // address (`wrapping_add` keeps the pointer arithmetic itself defined).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        }
        // SAFETY: `start` is 32 readable bytes; `loadu` has no alignment requirement.
        let start = unsafe { _mm256_loadu_si256(ab.start.as_ptr().cast()) };
        let dm = b.map(|b| b.dm());
        let half4 = |v: [u16; 4]| {
            let bits = v
                .iter()
                .enumerate()
                .fold(0u64, |s, (r, &h)| s | (u64::from(h) << (16 * r)));
            _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
        };
        // [d_w r * d_x] for rows r = 0..3: each the one-token kernel's f32 product.
        let d = _mm_mul_ps(half4(dm.map(|p| p.0)), _mm_set1_ps(ab.d));
        if B::MINS {
            acc_m = _mm_add_ps(acc_m, _mm_mul_ps(half4(dm.map(|p| p.1)), _mm_set1_ps(ab.s)));
        }
        // SAFETY: AVX2 is present (caller).
        let ds = unsafe { broadcast_each(d) };
        for r in 0..4 {
            // SAFETY: `qs` is 16 readable bytes; `loadu` has no alignment requirement.
            let q =
                _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(b[r].qs().as_ptr().cast()) });
            let n = if GFNI {
                _mm256_gf2p8affine_epi64_epi8::<0>(q, nibble_matrix)
            } else {
                _mm256_and_si256(_mm256_mask_srli_epi16::<4>(q, 0xFF00, q), low4)
            };
            let u = if B::FIFTH_BITS {
                _mm256_mask_add_epi8(n, b[r].qh(), n, sixteen)
            } else {
                n
            };
            let lanes = _mm256_dpbusd_epi32(start, u, y);
            acc[r] = _mm256_fmadd_ps(ds[r], _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    let mut m = [0.0f32; 4];
    // SAFETY: `m` is 4 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m) };
    // SAFETY: AVX2 is present (caller).
    std::array::from_fn(|r| unsafe { hsum(acc[r]) } + if B::MINS { m[r] } else { 0.0 })
}

/// [`rows4_body`] with GFNI.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`] and GFNI; the rows have one
/// length and `x` and `a` at least that many blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn rows4_gfni<B: WeightBlock>(w: [&[B]; 4], x: &[B::Act], a: &[ActBlock]) -> [f32; 4] {
    // SAFETY: as this function's (the features are enabled here).
    unsafe { rows4_body::<B, true>(w, x, a) }
}

/// [`rows4_body`] without GFNI.
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; the rows have one length and
/// `x` and `a` at least that many blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows4_shift<B: WeightBlock>(w: [&[B]; 4], x: &[B::Act], a: &[ActBlock]) -> [f32; 4] {
    // SAFETY: as this function's (the features are enabled here).
    unsafe { rows4_body::<B, false>(w, x, a) }
}

/// Q4_1 · Q8_1, Q5_0 · Q8_0 or Q5_1 · Q8_1 of four weight rows (adjacent in the matrix for the
/// prefetch to help) with one activation `x` and its pieces `a` ([`prepare_q8_0`] for Q5_0,
/// [`prepare_q8_1`] for the others): bit-identical to the AVX2 one-row kernel of each row
/// (`avx2::dot_q4_1_q8_1`, `avx2_quants::dot_q5_0_q8_0`, `avx2_quants::dot_q5_1_q8_1`).
/// `use_gfni` (tests only: false) picks the kernel without GFNI on a CPU that has it.
///
/// # Panics
/// If the token is not an AVX-512 one, the rows' lengths differ, or `x` or `a` is shorter.
pub(super) fn dot_rows4<B: WeightBlock>(
    t: Token,
    w: [&[B]; 4],
    x: &[B::Act],
    a: &[ActBlock],
    use_gfni: bool,
) -> [f32; 4] {
    assert!(t.avx512(), "legacy_rows::dot_rows4: an AVX-512 token");
    let nb = w[0].len();
    assert!(
        w.iter().all(|r| r.len() == nb) && x.len() >= nb && a.len() >= nb,
        "legacy_rows::dot_rows4: rows of unequal length or activation too short"
    );
    if t.gfni() && use_gfni {
        // SAFETY: the token's AVX-512 features and GFNI were detected; lengths checked.
        unsafe { rows4_gfni(w, x, a) }
    } else {
        // SAFETY: the token's AVX-512 features were detected; lengths checked.
        unsafe { rows4_shift(w, x, a) }
    }
}

/// [`dot_rows4`] with AVX2 alone (for CPUs without AVX-512: Zen 1–3, Intel client cores):
/// per row and block the nibbles split by one 64-bit shift of a twice-loaded 16 bytes, the fifth
/// bits spread by a shuffle and a compare, and the lane sums of `maddubs` and `madd`; the
/// four rows' `d_w * d_x` (and `m_w * s_x`) in one 128-bit product per block. Bit-identical to
/// the AVX2 one-row kernels.
///
/// # Panics
/// If the rows' lengths differ, or `x` or `a` is shorter.
pub(super) fn dot_rows4_avx2<B: WeightBlock>(
    _: Token,
    w: [&[B]; 4],
    x: &[B::Act],
    a: &[ActBlock],
) -> [f32; 4] {
    let nb = w[0].len();
    assert!(
        w.iter().all(|r| r.len() == nb) && x.len() >= nb && a.len() >= nb,
        "legacy_rows::dot_rows4_avx2: rows of unequal length or activation too short"
    );
    // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; lengths checked.
    unsafe { rows4_avx2_impl(w, x, a) }
}

/// # Safety
/// AVX2, FMA and F16C are present; the rows have one length and `x` and `a` at least that
/// many blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows4_avx2_impl<B: WeightBlock>(w: [&[B]; 4], x: &[B::Act], a: &[ActBlock]) -> [f32; 4] {
    // Closures and `array::map` stay calls inside a `target_feature` function: plain loops.
    let mut acc_m = _mm_setzero_ps();
    let sixteen = _mm256_set1_epi8(16);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let stride = 4 * std::mem::size_of::<B>();
    for i in 0..w[0].len() {
        // SAFETY: i < w[0].len() = every w[r].len() <= x.len(), a.len() (caller).
        let (y, ab, b) = unsafe {
            (
                _mm256_loadu_si256(x.get_unchecked(i).qs().as_ptr().cast()),
                a.get_unchecked(i),
                [
                    w[0].get_unchecked(i),
                    w[1].get_unchecked(i),
                    w[2].get_unchecked(i),
                    w[3].get_unchecked(i),
                ],
            )
        };
        // The group's four rows are adjacent: one stream, prefetched 4 KiB ahead (Zen 3, one
        // thread, SmolLM2's Q5_0 matrices from memory: 8.8 GB/s without, 10.1–10.5 with 2,
        // 4 or 8 KiB).
        let ahead = w[0]
            .as_ptr()
            .cast::<i8>()
            .wrapping_add(PREFETCH_AHEAD + stride * i);
        // A prefetch reads nothing architecturally and cannot fault, whatever the address
        // (`wrapping_add` keeps the pointer arithmetic itself defined).
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        let start = if B::FIFTH_BITS && !B::MINS {
            // SAFETY: `start` is 32 readable bytes; `loadu` has no alignment requirement.
            unsafe { _mm256_loadu_si256(ab.start.as_ptr().cast()) }
        } else {
            _mm256_setzero_si256()
        };
        let (mut d_bits, mut m_bits) = (0u64, 0u64);
        for (r, row) in b.iter().enumerate() {
            let (d, m) = row.dm();
            d_bits |= u64::from(d) << (16 * r);
            m_bits |= u64::from(m) << (16 * r);
        }
        // [d_w r * d_x] for rows r = 0..3: each the one-row kernel's f32 product.
        let d = _mm_mul_ps(
            _mm_cvtph_ps(_mm_cvtsi64_si128(d_bits as i64)),
            _mm_set1_ps(ab.d),
        );
        if B::MINS {
            let m = _mm_cvtph_ps(_mm_cvtsi64_si128(m_bits as i64));
            acc_m = _mm_add_ps(acc_m, _mm_mul_ps(m, _mm_set1_ps(ab.s)));
        }
        let ds = broadcast_each(d);
        for r in 0..4 {
            // SAFETY: AVX2 is present (this function's features).
            let n = unsafe { nibbles(b[r].qs()) };
            let u = if B::FIFTH_BITS {
                // SAFETY: as above.
                let set = unsafe { fifth_bits(b[r].qh()) };
                _mm256_or_si256(n, _mm256_and_si256(set, sixteen))
            } else {
                n
            };
            // Pairs |u * y| <= 2 * 31 * 128 fit i16; each lane the exact dot of its 4 quants.
            let mut lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), ones);
            if B::FIFTH_BITS && !B::MINS {
                lanes = _mm256_add_epi32(lanes, start);
            }
            acc[r] = _mm256_fmadd_ps(ds[r], _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    let mut m = [0.0f32; 4];
    // SAFETY: `m` is 4 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m) };
    // SAFETY: AVX2 is present (caller).
    std::array::from_fn(|r| unsafe { hsum(acc[r]) } + if B::MINS { m[r] } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::super::block::blocks;
    use super::super::repack::tests::{q8_0_row, random_blocks, scale};
    use super::super::{avx2, avx2_quants};
    use super::*;
    use crate::testutil::Rng;

    /// `rows` Q4_1 (20-byte), Q5_0 (22-byte) or Q5_1 (24-byte) rows of `nb` blocks: random
    /// quants (and fifth bits) with finite scales; with `extreme`, blocks of all-0 or all-max
    /// quants, the largest f16 `d` (and `m`) in half of them.
    fn q5_rows(r: &mut Rng, rows: usize, nb: usize, size: usize, extreme: bool) -> Vec<u8> {
        random_blocks(r, rows * nb, size, |r, b| {
            let pick = r.next_u64();
            let huge = extreme && pick & 4 != 0;
            b[..2].copy_from_slice(&scale(r, huge));
            let quants = if size != 22 {
                b[2..4].copy_from_slice(&scale(r, huge));
                4
            } else {
                2
            };
            if extreme {
                b[quants..].fill(if pick & 1 == 0 { 0x00 } else { 0xFF });
            }
        })
    }

    /// Q8_1 activations: as `q8_0_row`, with a finite `s` (random or the largest f16).
    fn q8_1_row(r: &mut Rng, nb: usize, extreme: bool) -> Vec<u8> {
        let q8_0 = q8_0_row(r, nb, extreme);
        q8_0.chunks_exact(34)
            .flat_map(|b| {
                let huge = extreme && r.next_u64().is_multiple_of(2);
                let s = scale(r, huge);
                [&b[..2], &s[..], &b[2..]].concat()
            })
            .collect()
    }

    /// Every group of four of 6 rows (rows repeated too, unequal neighbours), with and without
    /// GFNI, against the AVX2 one-row kernels, bit for bit, on random and extreme blocks and
    /// activations (all -128 or 127 quants, the largest scales).
    #[test]
    fn four_row_kernels_bit_identical_to_the_one_row_kernels() {
        let Some(t) = Token::detect_avx512() else {
            return;
        };
        let mut r = Rng::new(45);
        for nb in [1usize, 2, 3, 7, 18, 48] {
            for extreme in [false, true] {
                for k in 0..2 {
                    let x_extreme = extreme && k == 1;
                    // Q5_0 . Q8_0.
                    let w = q5_rows(&mut r, 6, nb, 22, extreme);
                    let x = q8_0_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_0] = blocks(&x);
                    let mut a = vec![ActBlock::default(); nb];
                    prepare_q8_0(t, xb, &mut a);
                    let rows: Vec<&[BlockQ5_0]> = w.chunks_exact(nb * 22).map(blocks).collect();
                    for g in 0..6 * 6 {
                        let pick = [g % 6, g / 6, (g + 1) % 6, (g * 5 + 2) % 6];
                        for gfni in [true, false] {
                            let got = dot_rows4(t, pick.map(|p| rows[p]), xb, &a, gfni);
                            for (v, p) in got.into_iter().zip(pick) {
                                let want = avx2_quants::dot_q5_0_q8_0(t, rows[p], xb);
                                assert_eq!(
                                    v.to_bits(),
                                    want.to_bits(),
                                    "Q5_0 nb={nb} extreme={extreme} {k} gfni={gfni}"
                                );
                            }
                        }
                    }
                    // Q4_1 . Q8_1.
                    let w = q5_rows(&mut r, 6, nb, 20, extreme);
                    let x = q8_1_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_1] = blocks(&x);
                    prepare_q8_1(xb, &mut a);
                    let rows: Vec<&[BlockQ4_1]> = w.chunks_exact(nb * 20).map(blocks).collect();
                    for g in 0..6 * 6 {
                        let pick = [g % 6, g / 6, (g + 1) % 6, (g * 5 + 2) % 6];
                        for gfni in [true, false] {
                            let got = dot_rows4(t, pick.map(|p| rows[p]), xb, &a, gfni);
                            for (v, p) in got.into_iter().zip(pick) {
                                let want = avx2::dot_q4_1_q8_1(t, rows[p], xb);
                                assert_eq!(
                                    v.to_bits(),
                                    want.to_bits(),
                                    "Q4_1 nb={nb} extreme={extreme} {k} gfni={gfni}"
                                );
                            }
                        }
                    }
                    // Q5_1 . Q8_1.
                    let w = q5_rows(&mut r, 6, nb, 24, extreme);
                    let x = q8_1_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_1] = blocks(&x);
                    prepare_q8_1(xb, &mut a);
                    let rows: Vec<&[BlockQ5_1]> = w.chunks_exact(nb * 24).map(blocks).collect();
                    for g in 0..6 * 6 {
                        let pick = [g % 6, g / 6, (g + 1) % 6, (g * 5 + 2) % 6];
                        for gfni in [true, false] {
                            let got = dot_rows4(t, pick.map(|p| rows[p]), xb, &a, gfni);
                            for (v, p) in got.into_iter().zip(pick) {
                                let want = avx2_quants::dot_q5_1_q8_1(t, rows[p], xb);
                                assert_eq!(
                                    v.to_bits(),
                                    want.to_bits(),
                                    "Q5_1 nb={nb} extreme={extreme} {k} gfni={gfni}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// [`dot_rows4_avx2`] of every group of four of 6 rows against the AVX2 one-row kernels,
    /// bit for bit, as the AVX-512 test above (random and extreme blocks and activations, odd
    /// block counts).
    #[test]
    fn avx2_four_row_kernels_bit_identical_to_the_one_row_kernels() {
        let Some(t) = Token::detect() else {
            return;
        };
        let mut r = Rng::new(46);
        for nb in [1usize, 2, 3, 7, 18, 48, 161] {
            for extreme in [false, true] {
                for k in 0..2 {
                    let x_extreme = extreme && k == 1;
                    let picks = (0..6 * 6).map(|g| [g % 6, g / 6, (g + 1) % 6, (g * 5 + 2) % 6]);
                    // Q5_0 . Q8_0.
                    let w = q5_rows(&mut r, 6, nb, 22, extreme);
                    let x = q8_0_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_0] = blocks(&x);
                    let mut a = vec![ActBlock::default(); nb];
                    prepare_q8_0(t, xb, &mut a);
                    let rows: Vec<&[BlockQ5_0]> = w.chunks_exact(nb * 22).map(blocks).collect();
                    for pick in picks.clone() {
                        let got = dot_rows4_avx2(t, pick.map(|p| rows[p]), xb, &a);
                        for (v, p) in got.into_iter().zip(pick) {
                            let want = avx2_quants::dot_q5_0_q8_0(t, rows[p], xb);
                            assert_eq!(v.to_bits(), want.to_bits(), "Q5_0 nb={nb} {extreme} {k}");
                        }
                    }
                    // Q4_1 . Q8_1.
                    let w = q5_rows(&mut r, 6, nb, 20, extreme);
                    let x = q8_1_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_1] = blocks(&x);
                    prepare_q8_1(xb, &mut a);
                    let rows: Vec<&[BlockQ4_1]> = w.chunks_exact(nb * 20).map(blocks).collect();
                    for pick in picks.clone() {
                        let got = dot_rows4_avx2(t, pick.map(|p| rows[p]), xb, &a);
                        for (v, p) in got.into_iter().zip(pick) {
                            let want = avx2::dot_q4_1_q8_1(t, rows[p], xb);
                            assert_eq!(v.to_bits(), want.to_bits(), "Q4_1 nb={nb} {extreme} {k}");
                        }
                    }
                    // Q5_1 . Q8_1.
                    let w = q5_rows(&mut r, 6, nb, 24, extreme);
                    let x = q8_1_row(&mut r, nb, x_extreme);
                    let xb: &[BlockQ8_1] = blocks(&x);
                    prepare_q8_1(xb, &mut a);
                    let rows: Vec<&[BlockQ5_1]> = w.chunks_exact(nb * 24).map(blocks).collect();
                    for pick in picks {
                        let got = dot_rows4_avx2(t, pick.map(|p| rows[p]), xb, &a);
                        for (v, p) in got.into_iter().zip(pick) {
                            let want = avx2_quants::dot_q5_1_q8_1(t, rows[p], xb);
                            assert_eq!(v.to_bits(), want.to_bits(), "Q5_1 nb={nb} {extreme} {k}");
                        }
                    }
                }
            }
        }
    }

    /// The GFNI matrices split a byte into its nibbles (every byte value, both halves).
    #[test]
    fn gfni_nibble_matrices_split_every_byte() {
        let Some(t) = Token::detect_avx512() else {
            return;
        };
        if !t.gfni() {
            return;
        }
        #[target_feature(enable = "avx2,avx512f,avx512vl,gfni")]
        fn split(v: u8) -> (u8, u8) {
            let m = _mm256_setr_epi64x(LOW_NIBBLE, LOW_NIBBLE, HIGH_NIBBLE, HIGH_NIBBLE);
            let out = _mm256_gf2p8affine_epi64_epi8::<0>(_mm256_set1_epi8(v as i8), m);
            let mut b = [0u8; 32];
            // SAFETY: `b` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_si256(b.as_mut_ptr().cast(), out) };
            assert!(b[..16].iter().all(|&x| x == b[0]) && b[16..].iter().all(|&x| x == b[16]));
            (b[0], b[16])
        }
        for v in 0..=255u8 {
            // SAFETY: the features were detected (the token, `t.gfni()`).
            let (lo, hi) = unsafe { split(v) };
            assert_eq!((lo, hi), (v & 0x0F, v >> 4), "byte {v:#04x}");
        }
    }
}
