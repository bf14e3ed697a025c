//! x86_64 pieces shared by the x86 kernel files: the [`Token`] that proves the CPU features were
//! detected, and the small helpers that both the AVX2 files (`avx2.rs`, `avx2_quants.rs`,
//! `repack.rs`, `kquant_order.rs`) and the AVX-512 files (`avx512.rs`, `q4_0_rows.rs`,
//! `q4_k_rows.rs`) use.
//!
//! This file is a leaf: it imports only the block types, so the dependencies between the kernel
//! files point one way (the AVX2 entry points dispatch to the AVX-512 kernels; those, and every
//! other kernel file, take their shared pieces from here). The helpers are compiled for AVX2, FMA
//! and F16C, a subset of every x86 kernel's features, so they inline into the AVX2 and AVX-512
//! kernels alike.

use std::arch::x86_64::*;

use super::iq4_nl::KVALUES_IQ4NL;
use super::iq4_xs::BlockIq4Xs;
use super::q4_k::BlockQ4_K;
use super::q8_k::BlockQ8_K;

// ---- CPU features ----

/// Proof that this CPU has AVX2, FMA and F16C (and, where `avx512()` is true, AVX-512 F, BW, VL
/// and VNNI): only [`Token::detect`] and [`Token::detect_avx512`] create one, and every safe entry
/// point of the x86 kernel files takes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Token {
    avx512: bool,
    /// GFNI as well (only with `avx512`): Ice Lake and Zen 4 have it, Cascade Lake does not.
    gfni: bool,
}

impl Token {
    /// A token if this CPU runs the AVX2 kernels (`avx2.rs`, `avx2_quants.rs`, ...).
    pub(super) fn detect() -> Option<Token> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Token {
            avx512: false,
            gfni: false,
        })
    }

    /// A token that also runs the AVX-512 kernels (`avx512.rs`, `q4_0_rows.rs`, `q4_k_rows.rs`)
    /// where the AVX2 files have a faster equivalent, if this CPU has them.
    pub(super) fn detect_avx512() -> Option<Token> {
        avx512_detected().then(|| Token {
            avx512: true,
            gfni: is_x86_feature_detected!("gfni"),
        })
    }

    /// Whether the AVX-512 kernels are used.
    pub(super) fn avx512(self) -> bool {
        self.avx512
    }

    /// Whether the AVX-512 kernels may also use GFNI (`gf2p8affineqb`); only where
    /// [`Token::avx512`] is true.
    pub(super) fn gfni(self) -> bool {
        self.gfni
    }

    /// The same CPU's AVX2 kernels only (an AVX-512 token proves AVX2, FMA and F16C too).
    pub(super) fn without_avx512(self) -> Token {
        Token {
            avx512: false,
            gfni: false,
        }
    }
}

/// Whether this CPU runs the AVX-512 kernels: AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI
/// (what `avx512.rs`, `q4_0_rows.rs` and `q4_k_rows.rs` are compiled for).
pub(super) fn avx512_detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

// ---- loads, sums and prefetches of the one-token kernels ----

/// How far ahead of the block being read the one-token kernels ask for weight bytes. Decode
/// streams every weight from memory once and the hardware prefetchers alone keep too few cache
/// lines in flight (they restart at every 4 KiB page); one prefetch per block, spread through the
/// loop, keeps the memory busy without a separate burst of prefetch instructions.
pub(super) const PREFETCH_DISTANCE: usize = 2048;

/// Hints the CPU to fetch the cache line `PREFETCH_DISTANCE` bytes after `block`.
#[inline(always)]
pub(super) fn prefetch_stream<T>(block: &T) {
    let ahead = (block as *const T)
        .cast::<i8>()
        .wrapping_add(PREFETCH_DISTANCE);
    // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the address
    // (`wrapping_add` keeps the pointer arithmetic itself defined).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead) };
}

/// How far ahead the 8-row decode groups (Q4_0, IQ4_NL; Q8_0 in `q8_0_rows.rs`) prefetch:
/// the group as many groups on as fit in this (at least the next). SmolLM2's 576-value rows make 2.6 KiB groups, and one
/// group ahead left the memory idle (IQ4_NL 131072 x 576 from memory on one Zen 4 core: 16.2
/// GB/s one group ahead, 19.3 two, 21.4 three, 17.9 four); long rows (the 1.1B model's 9 KiB
/// groups and more) keep the next group.
pub(super) const ROWS8_AHEAD_BYTES: usize = 8 << 10;

/// Hints the CPU to load `w[start..start + len]` into cache, a prefetch per cache line; ranges
/// past the end are clipped.
#[inline(always)]
pub(super) fn prefetch_range(w: &[u8], start: usize, len: usize) {
    let end = start.saturating_add(len).min(w.len());
    let mut at = start;
    while at < end {
        // SAFETY: `at < w.len()`, so the pointer is inside `w`; a prefetch reads nothing
        // architecturally and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at).cast()) };
        at += 64;
    }
}

/// Horizontal sum of 8 f32 lanes, in ggml's `hsum_float_8` order (halves added lane-wise,
/// then `(t0 + t2) + (t1 + t3)`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The 32 nibbles of a Q4 block as 32 unsigned bytes, in element order (low nibbles = 0..15,
/// high nibbles = 16..31).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // The 16 bytes loaded into both halves (a load alone), the high half shifted down by one
    // 64-bit shift: one instruction fewer than a shift and an insert of the 128-bit halves.
    // SAFETY: `qs` is 16 readable bytes; `loadu` has no alignment requirement.
    let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr().cast()));
    let both = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Each of `d`'s four lanes broadcast to a 256-bit register (the four-row kernels' per-row
/// scale products), by in-lane shuffles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn broadcast_each(d: __m128) -> [__m256; 4] {
    [
        _mm256_broadcastss_ps(d),
        _mm256_broadcastss_ps(_mm_movehdup_ps(d)),
        _mm256_broadcastss_ps(_mm_movehl_ps(d, d)),
        _mm256_broadcastss_ps(_mm_shuffle_ps::<0xFF>(d, d)),
    ]
}

/// The 8 sub-block scales of an IQ4_XS block, unbiased (-32..=31), in the i32 lanes of a
/// register: scalar code for them (`BlockIq4Xs::scale`) takes some 60 integer instructions per
/// super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs_scales(b: &BlockIq4Xs) -> __m256i {
    let low = _mm256_set1_epi32(i32::from_le_bytes(b.scales_l));
    let high = _mm256_set1_epi32(i32::from(u16::from_le_bytes(b.scales_h)));
    // Sub-block k: nibble k of `scales_l` (as a u32) and bits 2k, 2k + 1 of `scales_h`.
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(low, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(0x0F),
    );
    let high = _mm256_and_si256(
        _mm256_srlv_epi32(high, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3),
    );
    _mm256_sub_epi32(
        _mm256_or_si256(low, _mm256_slli_epi32::<4>(high)),
        _mm256_set1_epi32(32),
    )
}

/// The 32 values of 16 bytes of IQ4_NL nibbles (an IQ4_NL block, or an IQ4_XS sub-block):
/// [`nibbles`] looked up in [`KVALUES_IQ4NL`], as i8 in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl_values(qs: &[u8; 16]) -> __m256i {
    // SAFETY: the table is 16 readable bytes; loadu needs no alignment; AVX2 is present.
    unsafe {
        let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nibbles(qs))
    }
}

/// Loads 32 signed quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load_q8(qs: &[i8; 32]) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes; `loadu` has no alignment requirement.
    _mm256_loadu_si256(qs.as_ptr().cast())
}

// ---- Q5_0 / Q5_1 and Q4_K / Q5_K unpacking (`avx2_quants.rs`, `avx512.rs`) ----

/// The 32 quants of a Q5_0 / Q5_1 block as unsigned bytes (0..31), in element order: the
/// nibbles, with bit `j` of `qh` (a little-endian u32) as bit 4 of byte `j` (ggml's
/// `bytes_from_bits_32`: byte `j` gets `qh` byte `j / 8`, and bit `j % 8` of it is tested).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_quants(qh: &[u8; 4], qs: &[u8; 16]) -> __m256i {
    let set = fifth_bits(u32::from_le_bytes(*qh));
    _mm256_or_si256(nibbles(qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// Byte `j` all ones where bit `j` of `qh` (a Q5_0 / Q5_1 block's fifth bits) is set, else
/// zero: byte `j` gets `qh` byte `j / 8` by a shuffle, and bit `j % 8` of it is tested.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fifth_bits(qh: u32) -> __m256i {
    let spread = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit)
}

/// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K / Q5_K block, unpacked from
/// the 12 packed bytes with ggml's `utmp` word operations (= `q4_k::scale_min_k4` for each `j`).
#[inline(always)]
pub(super) fn k4_scales_mins(packed: &[u8; 12]) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word = |k: usize| {
        u32::from_le_bytes([
            packed[4 * k],
            packed[4 * k + 1],
            packed[4 * k + 2],
            packed[4 * k + 3],
        ])
    };
    let (u0, u1, u2) = (word(0), word(1), word(2));
    [
        u0 & KMASK1,
        (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4),
        u1 & KMASK1,
        ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4),
    ]
}

/// [`k4_scales_mins`] as 16 i16: scales 0..8 in the low 128 bits, mins 0..8 in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_scales_mins_i16(packed: &[u8; 12]) -> __m256i {
    let u = k4_scales_mins(packed).map(|v| v as i32);
    _mm256_cvtepu8_epi16(_mm_setr_epi32(u[0], u[1], u[2], u[3]))
}

/// Sub-block `k`'s scale in all 16 i16 lanes (`scales` = the 8 scales as i16 in both halves).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_scale(scales: __m256i, k: usize) -> __m256i {
    let ctrl = (((2 * k + 1) << 8) | (2 * k)) as i16;
    _mm256_shuffle_epi8(scales, _mm256_set1_epi16(ctrl))
}

/// Each of the 8 mins `m` twice, `[m0, m0, m1, m1, .., m7, m7]`: min k weighs the activation
/// block sums 2k and 2k + 1 (its sub-block's 32 quants), so one `madd` with `bsums` gives the
/// min products in pairs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn min_pairs(m: __m128i) -> __m256i {
    _mm256_setr_m128i(_mm_unpacklo_epi16(m, m), _mm_unpackhi_epi16(m, m))
}

/// `sum_k m[k] * (bsum(2k) + bsum(2k + 1))` of one block (`sm` from [`k4_scales_mins_i16`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_min_sum(bx: &BlockQ8_K, sm: __m256i) -> i32 {
    let m2 = min_pairs(_mm256_extracti128_si256(sm, 1));
    // SAFETY: `bsums` is 16 little-endian i16 (32 bytes); loadu has no alignment requirement.
    let bsums = _mm256_loadu_si256(bx.bsums.as_ptr().cast());
    let p = _mm256_madd_epi16(bsums, m2);
    let s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

// ---- the one-row Q4_K kernels in the repacked order (`repack.rs`, `q4_k_rows.rs`) ----

/// Blocks ahead of the one being computed that the one-row Q4_K kernels (`q4_k_rows.rs`'s
/// `dot_q4_k_q8_k_row`, `repack.rs`'s AVX2 one) prefetch (about 3.4 KiB: decode streams the
/// weights once, and the lines must be on their way early enough).
const ROW_PREFETCH_BLOCKS: usize = 24;

/// Prefetches the lines of the block [`ROW_PREFETCH_BLOCKS`] after `bw` (past the row: the next
/// rows of a matrix follow), for a kernel that reads its row front to back.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_row_ahead(bw: &BlockQ4_K) {
    let ahead = (bw as *const BlockQ4_K)
        .cast::<u8>()
        .wrapping_add(ROW_PREFETCH_BLOCKS * 144);
    for line in 0..3 {
        // A prefetch reads nothing architecturally and never faults, whatever the address.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
    }
}

/// The 6-bit scales and mins of the 8 sub-blocks of `bw` as two vectors of 8 words, what
/// `scale_min_k4` gives sub-block by sub-block (ggml's `utmp` masks, all at once).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_mins_words(bw: &BlockQ4_K) -> (__m128i, __m128i) {
    let u = |k: usize| {
        u32::from_le_bytes([
            bw.scales[4 * k],
            bw.scales[4 * k + 1],
            bw.scales[4 * k + 2],
            bw.scales[4 * k + 3],
        ])
    };
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc_lo = u0 & 0x3f3f_3f3f;
    let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
    let m_lo = u1 & 0x3f3f_3f3f;
    let m_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
    let words = |lo: u32, hi: u32| {
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            ((u64::from(hi) << 32) | u64::from(lo)) as i64,
        ))
    };
    (words(sc_lo, sc_hi), words(m_lo, m_hi))
}

/// One block's float step of the one-row kernels: the min term (`madd` of the activation's
/// `bsums` with the mins `m16` in pairs), reduced together with the 8 lanes of the integer sum
/// into exact `[isum, mins]`, then the portable order's `acc = fma(isum, d * dx, acc)` and
/// `acc_min = fma(mins, dmin * dx, acc_min)` as one 2-lane `fma` on `acc = [acc, acc_min, ..]`.
/// Bounds: each lane's sum and the min term fit i32 (at most 8 * 2 * 15 * 128 * 63 and
/// 16 * 2048 * 63 in magnitude).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn accumulate_block(
    lanes: __m256i,
    m16: __m128i,
    bw: &BlockQ4_K,
    bx: &BlockQ8_K,
    acc: __m128,
) -> __m128 {
    // SAFETY: `bsums` is 16 little-endian i16 (32 bytes); unaligned load.
    let bsums = unsafe { _mm256_loadu_si256(bx.bsums.as_ptr().cast()) };
    let mins = _mm256_madd_epi16(bsums, min_pairs(m16));
    let h = _mm256_hadd_epi32(lanes, mins);
    let h = _mm256_hadd_epi32(h, h);
    // [isum, mins, isum, mins].
    let sums = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
        bw.d[0], bw.d[1], bw.dmin[0], bw.dmin[1],
    ])));
    let scale = _mm_mul_ps(dm, _mm_set1_ps(bx.d()));
    _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale, acc)
}

/// The result of [`accumulate_block`]'s accumulators: `acc - acc_min`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn row_result(acc: __m128) -> f32 {
    let mut out = [0.0f32; 4];
    // SAFETY: 4 writable f32; storeu has no alignment requirement.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out[0] - out[1]
}
