//! Q4_0 · Q8_0 and IQ4_NL · Q8_0 for 8 (or 16) weight rows at once with row r in SIMD lane r
//! (llama.cpp's repacked order, `ggml_gemv/gemm_q4_0_8x8_q8_0` and `..._iq4_nl_8x8_q8_0`, see
//! `repack.rs`), without repacking the weights in memory and without horizontal sums.
//!
//! Per 32-element block, the 16 quant bytes of the 8 rows are loaded as 4 registers
//! `[row k | row k+4]` and transposed 4x4 by dwords inside the 128-bit halves, so that register
//! `j` holds bytes `4j..4j+3` of row r in lane r; its low nibbles are elements `4j..4j+3` and its
//! high nibbles elements `16+4j..16+4j+3` of every row. The activation's matching 4 bytes are
//! broadcast to all lanes, so one `maddubs` (AVX2) or `vpdpbusd` (VNNI) multiplies 4 elements of
//! all 8 rows, and the lane sums are the rows' block dots: no reduction across lanes. The
//! transpose and the nibble split are done once per block and shared by all tokens. With
//! AVX-512 the 4-token kernels hold 16 rows in 512-bit registers (`[row k | k+4 | k+8 | k+12]`,
//! the same transpose per 128-bit quarter).
//!
//! The integer work differs from llama.cpp's but its results are exact: the kernels multiply
//! unsigned weights `u` (Q4_0: the nibble q, value `q - 8`; IQ4_NL: `table[q] + 128`, looked up
//! with `pshufb`) by the i8 activations y, and per row and block `isum = sum u*y - bias * sum y`,
//! where `-bias * sum y` is the same for every row ([`ActBlock`]: prepared once per activation
//! row for one token, formed per block for 4 tokens together). The f32 operations per row are
//! exactly the portable order's: `acc = fma(isum as f32, d_w * d_x, acc)` per block, so results
//! are bit-identical to `repack::dot_q4_0_q8_0` / `repack::dot_iq4_nl_q8_0`.
//!
//! i16 bounds (AVX2): a `maddubs` pair sum of nibbles is at most `2 * 15 * 128 = 3840` in
//! magnitude, and the 8 results of a block are added in i16, so each i16 lane holds 16
//! products, at most `16 * 15 * 128 = 30720 < 32767`: nothing saturates. IQ4_NL's `u` (up to
//! 241) is split into two nibbles for that reason. VNNI accumulates in i32 directly.
//!
//! x86-64 only (the module is compiled there); the dispatch is in `Kernels::matvec` and
//! `Kernels::matvec_tokens` (repacked Q4_0 and IQ4_NL arms).

use std::arch::x86_64::*;

use super::block::blocks;
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
use super::q4_0::BlockQ4_0;
use super::q8_0::BlockQ8_0;
use super::x86::Token;

/// A 4-bit weight block these kernels read: an f16 scale, then 16 bytes whose low nibbles are
/// elements `0..16` and high nibbles elements `16..32` (Q4_0, IQ4_NL). The kernels multiply
/// unsigned weights `u = value + 2^BIAS_SHIFT`, so every block dot carries
/// `2^BIAS_SHIFT * sum(y)` too, which [`ActBlock::offset`] takes off.
pub(super) trait Nibbles {
    /// log2 of the bias added to the weight values: 3 for Q4_0 (`u = q`, value `q - 8`), 7 for
    /// IQ4_NL (`u = table[q] + 128`).
    const BIAS_SHIFT: i32;
    /// The scale's f16 bits.
    fn scale_bits(&self) -> i16;
    /// The 16 bytes of nibbles.
    fn quants(&self) -> &[u8; 16];
}

impl Nibbles for BlockQ4_0 {
    const BIAS_SHIFT: i32 = 3;
    #[inline(always)]
    fn scale_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
    #[inline(always)]
    fn quants(&self) -> &[u8; 16] {
        &self.qs
    }
}

impl Nibbles for BlockIq4Nl {
    const BIAS_SHIFT: i32 = 7;
    #[inline(always)]
    fn scale_bits(&self) -> i16 {
        i16::from_le_bytes(self.d)
    }
    #[inline(always)]
    fn quants(&self) -> &[u8; 16] {
        &self.qs
    }
}

/// What the kernels need of one Q8_0 activation block besides its quants, computed once per
/// activation row and shared by every group of 8 weight rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ActBlock {
    /// `-2^BIAS_SHIFT * sum(qs)` of the weight type ([`Nibbles`]): e.g. the `- 8` of Q4_0's
    /// `q - 8`, the same for every weight row.
    offset: i32,
    /// The block scale as f32.
    d: f32,
}

/// Activation blocks the callers keep on the stack per call (8 KiB): rows of up to 32,768
/// elements, beyond any feed-forward width of the models edge hardware runs (a 70B Llama's is
/// 28,672), so decoding allocates nothing; only longer rows fall back to the heap.
pub(super) const STACK_BLOCKS: usize = 1024;

/// Fills `out[i]` with block `x[i]`'s [`ActBlock`] for weights of type `B`.
///
/// # Panics
/// If `out` is shorter than `x`.
pub(super) fn prepare<B: Nibbles>(t: Token, x: &[BlockQ8_0], out: &mut [ActBlock]) {
    assert!(out.len() >= x.len(), "prepare: output too short");
    // SAFETY: the token proves AVX2, FMA and F16C; `out` checked.
    unsafe { prepare_impl::<B>(t, x, out) }
}

/// # Safety
/// AVX2, FMA and F16C are present; `out.len() >= x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prepare_impl<B: Nibbles>(_: Token, x: &[BlockQ8_0], out: &mut [ActBlock]) {
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    for (bx, o) in x.iter().zip(out.iter_mut()) {
        // SAFETY: `qs` is 32 readable bytes; loadu has no alignment requirement.
        let y = unsafe { _mm256_loadu_si256(bx.qs.as_ptr().cast()) };
        // Pair sums of at most 2 * 128 in magnitude, then 8 i32 partial sums: exact.
        let s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, y), ones16);
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
        *o = ActBlock {
            offset: -(_mm_cvtsi128_si32(s) << B::BIAS_SHIFT),
            d: bx.d(),
        };
    }
}

/// The [`ActBlock`]s of one block of 4 activation rows, the 4 sums reduced together: pair
/// sums (`maddubs` with ones, at most 2 * 128 in magnitude), three rounds of `hadd` (sums of at
/// most 8 bytes, within i16), then pairs to i32 and the two halves added: exact.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums_x4<B: Nibbles>(b: [&BlockQ8_0; 4]) -> [ActBlock; 4] {
    // (No closures or `array::map` here: they would not inherit the target features, and
    // then neither inline nor keep vectors in registers.)
    let ones8 = _mm256_set1_epi8(1);
    // SAFETY: every `qs` is 32 readable bytes; loadu has no alignment requirement.
    let (y0, y1, y2, y3) = unsafe {
        (
            _mm256_loadu_si256(b[0].qs.as_ptr().cast()),
            _mm256_loadu_si256(b[1].qs.as_ptr().cast()),
            _mm256_loadu_si256(b[2].qs.as_ptr().cast()),
            _mm256_loadu_si256(b[3].qs.as_ptr().cast()),
        )
    };
    let h01 = _mm256_hadd_epi16(
        _mm256_maddubs_epi16(ones8, y0),
        _mm256_maddubs_epi16(ones8, y1),
    );
    let h23 = _mm256_hadd_epi16(
        _mm256_maddubs_epi16(ones8, y2),
        _mm256_maddubs_epi16(ones8, y3),
    );
    // Each half: [token 0 (2 sums), token 1 (2), token 2 (2), token 3 (2)].
    let h = _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_set1_epi16(1));
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let shift = _mm_cvtsi32_si128(B::BIAS_SHIFT);
    let offsets = _mm_sub_epi32(_mm_setzero_si128(), _mm_sll_epi32(s, shift));
    let d = _mm_cvtph_ps(_mm_setr_epi16(
        i16::from_le_bytes(b[0].d),
        i16::from_le_bytes(b[1].d),
        i16::from_le_bytes(b[2].d),
        i16::from_le_bytes(b[3].d),
        0,
        0,
        0,
        0,
    ));
    let (mut o, mut df) = ([0i32; 4], [0f32; 4]);
    // SAFETY: both arrays are 16 writable bytes; storeu has no alignment requirement.
    unsafe {
        _mm_storeu_si128(o.as_mut_ptr().cast(), offsets);
        _mm_storeu_ps(df.as_mut_ptr(), d);
    }
    let a = |t: usize| ActBlock {
        offset: o[t],
        d: df[t],
    };
    [a(0), a(1), a(2), a(3)]
}

/// Block `i` of the 8 rows, transposed: for `j < 4`, lane r of `q[j]` holds the low nibbles of
/// bytes `4j..4j+3` of row r (elements `4j..4j+3`) and lane r of `q[4 + j]` their high nibbles
/// (elements `16+4j..16+4j+3`), one unsigned byte (0..15) per element; and the 8 rows' scales as
/// f32, row r in lane r.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transposed_block<B: Nibbles>(b: [&B; 8]) -> ([__m256i; 8], __m256) {
    // SAFETY: every `quants()` is 16 readable bytes; loadu2 has no alignment requirement.
    let r = unsafe {
        [
            _mm256_loadu2_m128i(b[4].quants().as_ptr().cast(), b[0].quants().as_ptr().cast()),
            _mm256_loadu2_m128i(b[5].quants().as_ptr().cast(), b[1].quants().as_ptr().cast()),
            _mm256_loadu2_m128i(b[6].quants().as_ptr().cast(), b[2].quants().as_ptr().cast()),
            _mm256_loadu2_m128i(b[7].quants().as_ptr().cast(), b[3].quants().as_ptr().cast()),
        ]
    };
    // 4x4 dword transpose in each 128-bit half: [rows 0..3 | rows 4..7] of dword j.
    let a0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let a1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let a2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let a3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t = [
        _mm256_unpacklo_epi64(a0, a2),
        _mm256_unpackhi_epi64(a0, a2),
        _mm256_unpacklo_epi64(a1, a3),
        _mm256_unpackhi_epi64(a1, a3),
    ];
    let m = _mm256_set1_epi8(0x0F);
    let q = [
        _mm256_and_si256(t[0], m),
        _mm256_and_si256(t[1], m),
        _mm256_and_si256(t[2], m),
        _mm256_and_si256(t[3], m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(t[0]), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(t[1]), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(t[2]), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(t[3]), m),
    ];
    let d = _mm256_cvtph_ps(_mm_setr_epi16(
        b[0].scale_bits(),
        b[1].scale_bits(),
        b[2].scale_bits(),
        b[3].scale_bits(),
        b[4].scale_bits(),
        b[5].scale_bits(),
        b[6].scale_bits(),
        b[7].scale_bits(),
    ));
    (q, d)
}

/// Block `i` of each of the 8 rows (written out: `array::map` would not inline into the kernels).
///
/// # Safety
/// `i < w[r].len()` for every r.
#[inline(always)]
unsafe fn block_of<'a, B>(w: &[&'a [B]; 8], i: usize) -> [&'a B; 8] {
    // SAFETY: i < w[r].len() (caller).
    unsafe {
        [
            w[0].get_unchecked(i),
            w[1].get_unchecked(i),
            w[2].get_unchecked(i),
            w[3].get_unchecked(i),
            w[4].get_unchecked(i),
            w[5].get_unchecked(i),
            w[6].get_unchecked(i),
            w[7].get_unchecked(i),
        ]
    }
}

/// Activation dword `j` (elements `4j..4j+3`) of `y` in every lane.
///
/// # Safety
/// AVX2 is present; `j < 8`.
#[inline(always)]
unsafe fn broadcast_dword(y: &[i8; 32], j: usize) -> __m256i {
    debug_assert!(j < 8);
    // SAFETY: `4j + 4 <= 32` (caller), so the 4 bytes are inside `y`; read_unaligned has no
    // alignment requirement.
    let v = unsafe { std::ptr::read_unaligned(y.as_ptr().add(4 * j).cast::<i32>()) };
    _mm256_set1_epi32(v)
}

/// `sum_j maddubs(u[o + j], b[j])` in i16 lanes: with `u` nibbles (0..15) and `b` i8, each
/// lane sums 16 products, at most `16 * 15 * 128 = 30720` in magnitude: no saturation.
///
/// # Safety
/// AVX2 is present; `o + 8 <= u.len()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn maddubs_sum8(u: &[__m256i], o: usize, b: &[__m256i; 8]) -> __m256i {
    let u = &u[o..o + 8];
    let s01 = _mm256_add_epi16(
        _mm256_maddubs_epi16(u[0], b[0]),
        _mm256_maddubs_epi16(u[1], b[1]),
    );
    let s23 = _mm256_add_epi16(
        _mm256_maddubs_epi16(u[2], b[2]),
        _mm256_maddubs_epi16(u[3], b[3]),
    );
    let s45 = _mm256_add_epi16(
        _mm256_maddubs_epi16(u[4], b[4]),
        _mm256_maddubs_epi16(u[5], b[5]),
    );
    let s67 = _mm256_add_epi16(
        _mm256_maddubs_epi16(u[6], b[6]),
        _mm256_maddubs_epi16(u[7], b[7]),
    );
    _mm256_add_epi16(_mm256_add_epi16(s01, s23), _mm256_add_epi16(s45, s67))
}

/// Lane r: the exact block dot `sum (q - 8) * y` of row r, with `maddubs` (see the module doc
/// for the i16 bounds).
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_dots_avx2(q: &[__m256i; 8], y: &[i8; 32], a: ActBlock) -> __m256i {
    // SAFETY (every `broadcast_dword`): j < 8 and AVX2 is present.
    // SAFETY (every `broadcast_dword`): j < 8 and AVX2 is present.
    let (b0, b1, b2, b3, b4, b5, b6, b7) = unsafe {
        (
            broadcast_dword(y, 0),
            broadcast_dword(y, 1),
            broadcast_dword(y, 2),
            broadcast_dword(y, 3),
            broadcast_dword(y, 4),
            broadcast_dword(y, 5),
            broadcast_dword(y, 6),
            broadcast_dword(y, 7),
        )
    };
    let s = maddubs_sum8(q, 0, &[b0, b1, b2, b3, b4, b5, b6, b7]);
    let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
    _mm256_add_epi32(s, _mm256_set1_epi32(a.offset))
}

/// [`block_dots_avx2`] with `vpdpbusd` (u8 nibble x i8 activation, 4 products per i32 lane),
/// in two chains to halve the dependency length.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 VL and VNNI are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn block_dots_vnni(q: &[__m256i; 8], y: &[i8; 32], a: ActBlock) -> __m256i {
    // SAFETY (every `broadcast_dword`): j < 8 and AVX2 is present.
    // SAFETY (every `broadcast_dword`): j < 8 and AVX2 is present.
    let (b0, b1, b2, b3, b4, b5, b6, b7) = unsafe {
        (
            broadcast_dword(y, 0),
            broadcast_dword(y, 1),
            broadcast_dword(y, 2),
            broadcast_dword(y, 3),
            broadcast_dword(y, 4),
            broadcast_dword(y, 5),
            broadcast_dword(y, 6),
            broadcast_dword(y, 7),
        )
    };
    let s0 = _mm256_dpbusd_epi32(_mm256_set1_epi32(a.offset), q[0], b0);
    let s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[1], b1);
    let s0 = _mm256_dpbusd_epi32(s0, q[2], b2);
    let s1 = _mm256_dpbusd_epi32(s1, q[3], b3);
    let s0 = _mm256_dpbusd_epi32(s0, q[4], b4);
    let s1 = _mm256_dpbusd_epi32(s1, q[5], b5);
    let s0 = _mm256_dpbusd_epi32(s0, q[6], b6);
    let s1 = _mm256_dpbusd_epi32(s1, q[7], b7);
    _mm256_add_epi32(s0, s1)
}

/// Q4_0's unsigned weights are its nibbles.
#[inline(always)]
fn operands_q4_0(q: [__m256i; 8]) -> [__m256i; 8] {
    q
}

/// IQ4_NL's table shifted to unsigned bytes (`value + 128`, 1..=241), both 128-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_table(shift: i32, mask: i8) -> __m256i {
    let mut t = [0u8; 16];
    for (u, v) in t.iter_mut().zip(KVALUES_IQ4NL) {
        // value + 128 in 1..=241, then its high (shift 4) or low nibble (mask 15) or all of it.
        *u = (((i32::from(v) + 128) >> shift) & i32::from(mask as u8)) as u8;
    }
    // SAFETY: `t` is 16 readable bytes; loadu has no alignment requirement.
    let t = unsafe { _mm_loadu_si128(t.as_ptr().cast()) };
    _mm256_set_m128i(t, t)
}

/// IQ4_NL's unsigned weights `table[q] + 128` (for `vpdpbusd`, which sums in i32: no bound).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn operands_iq4_nl(q: [__m256i; 8]) -> [__m256i; 8] {
    let t = iq4_nl_table(0, -1);
    [
        _mm256_shuffle_epi8(t, q[0]),
        _mm256_shuffle_epi8(t, q[1]),
        _mm256_shuffle_epi8(t, q[2]),
        _mm256_shuffle_epi8(t, q[3]),
        _mm256_shuffle_epi8(t, q[4]),
        _mm256_shuffle_epi8(t, q[5]),
        _mm256_shuffle_epi8(t, q[6]),
        _mm256_shuffle_epi8(t, q[7]),
    ]
}

/// IQ4_NL's unsigned weights `u = table[q] + 128` split as `16 * hi + lo` (both 0..15), for
/// `maddubs`: a whole `u` (up to 241) against -128 would saturate the i16 pair sums.
/// `[hi of j = 0..8, lo of j = 0..8]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn operands_iq4_nl_split(q: [__m256i; 8]) -> [__m256i; 16] {
    let hi = iq4_nl_table(4, 0x0F);
    let lo = iq4_nl_table(0, 0x0F);
    [
        _mm256_shuffle_epi8(hi, q[0]),
        _mm256_shuffle_epi8(hi, q[1]),
        _mm256_shuffle_epi8(hi, q[2]),
        _mm256_shuffle_epi8(hi, q[3]),
        _mm256_shuffle_epi8(hi, q[4]),
        _mm256_shuffle_epi8(hi, q[5]),
        _mm256_shuffle_epi8(hi, q[6]),
        _mm256_shuffle_epi8(hi, q[7]),
        _mm256_shuffle_epi8(lo, q[0]),
        _mm256_shuffle_epi8(lo, q[1]),
        _mm256_shuffle_epi8(lo, q[2]),
        _mm256_shuffle_epi8(lo, q[3]),
        _mm256_shuffle_epi8(lo, q[4]),
        _mm256_shuffle_epi8(lo, q[5]),
        _mm256_shuffle_epi8(lo, q[6]),
        _mm256_shuffle_epi8(lo, q[7]),
    ]
}

/// [`block_dots_avx2`] for split weights ([`operands_iq4_nl_split`]): `16 * sum hi*y + sum
/// lo*y + offset`, each half with [`block_dots_avx2`]'s i16 bounds (nibbles 0..15), the factor
/// 16 applied by `madd` into i32.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_dots_split_avx2(u: &[__m256i; 16], y: &[i8; 32], a: ActBlock) -> __m256i {
    // SAFETY (every `broadcast_dword`): j < 8 and AVX2 is present.
    let (b0, b1, b2, b3, b4, b5, b6, b7) = unsafe {
        (
            broadcast_dword(y, 0),
            broadcast_dword(y, 1),
            broadcast_dword(y, 2),
            broadcast_dword(y, 3),
            broadcast_dword(y, 4),
            broadcast_dword(y, 5),
            broadcast_dword(y, 6),
            broadcast_dword(y, 7),
        )
    };
    let b = [b0, b1, b2, b3, b4, b5, b6, b7];
    let hi = _mm256_madd_epi16(maddubs_sum8(u, 0, &b), _mm256_set1_epi16(16));
    let lo = _mm256_madd_epi16(maddubs_sum8(u, 8, &b), _mm256_set1_epi16(1));
    _mm256_add_epi32(_mm256_add_epi32(hi, lo), _mm256_set1_epi32(a.offset))
}

/// Cache lines of the next weights the one-token kernel asks for per block: 3 lines (192
/// bytes) per block of 8 rows (144 bytes) covers the next 8 rows within this call's blocks.
const PREFETCH_PER_BLOCK: usize = 3;

/// Next groups of 8 rows longer than this are prefetched into L2 only, shorter ones into L1.
/// The prefetch runs a whole group ahead: for long rows (the 1.1B model's 2,048- and
/// 5,632-value rows: 9 and 25 KiB per group) that much data requested into a 48 KiB L1 evicts
/// lines before they are used, and the L1's few miss buffers cap the requests in flight; the
/// L2 takes more of them. Zen 4, 2 threads, alternating: the 1.1B Q4_0 file tg32 48 -> 62
/// tok/s with L2 hints, while SmolLM2 IQ4_NL (576-value rows: 2.6 KiB per group) fell 303 ->
/// 245 with them, its short distance being what L1 hints are for.
const FAR_AHEAD_BYTES: usize = 8 << 10;

/// Hints the CPU to fetch cache lines `first..first + PREFETCH_PER_BLOCK` of `ahead`, those
/// that exist, into L2 if `far`, else into L1. Decode streams every weight from memory once;
/// spreading the requests over the loop keeps the memory busy without the stall of a burst.
#[inline(always)]
fn prefetch_lines(ahead: &[u8], first: usize, far: bool) {
    for line in first..first + PREFETCH_PER_BLOCK {
        if let Some(b) = ahead.get(64 * line) {
            let p = (b as *const u8).cast();
            // SAFETY: `p` is inside `ahead`; a prefetch reads nothing architecturally and
            // cannot fault.
            unsafe {
                if far {
                    _mm_prefetch::<_MM_HINT_T1>(p)
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(p)
                }
            };
        }
    }
}

/// Generates the one-token (`$rows8`) and four-token (`$rows8_x4`) kernels for weight blocks
/// `$block`, whose transposed nibbles `$operands` maps to unsigned weights and `$dots`
/// multiplies with an activation block, under the target features `$feat`.
macro_rules! kernels {
    ($feat:literal, $block:ty, $operands:ident, $dots:ident, $rows8:ident, $rows8_x4:ident) => {
        /// 8 weight rows with one activation row: lane r accumulates row r.
        ///
        /// # Safety
        /// The CPU has the features this function is compiled for; every `w[r]` and `a` have
        /// at least `x.len()` blocks.
        #[target_feature(enable = $feat)]
        unsafe fn $rows8(
            w: [&[$block]; 8],
            x: &[BlockQ8_0],
            a: &[ActBlock],
            ahead: &[u8],
        ) -> [f32; 8] {
            let mut acc = _mm256_setzero_ps();
            let far = ahead.len() > FAR_AHEAD_BYTES;
            for (i, bx) in x.iter().enumerate() {
                prefetch_lines(ahead, PREFETCH_PER_BLOCK * i, far);
                // SAFETY: i < x.len() <= w[r].len(), a.len() (caller); the features are
                // this function's.
                unsafe {
                    let (q, dw) = transposed_block(block_of(&w, i));
                    let u = $operands(q);
                    let ai = *a.get_unchecked(i);
                    let isum = $dots(&u, &bx.qs, ai);
                    // Lane r: d_w(r) * d_x, then fma(isum, that, acc): the portable order.
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(ai.d));
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc);
                }
            }
            let mut out = [0.0f32; 8];
            // SAFETY: `out` is 8 writable f32; storeu has no alignment requirement.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
            out
        }

        /// 8 weight rows with 4 activation rows: the transposed block is shared by the tokens,
        /// token t accumulates in its own register, lane r = row r. The activations' block sums
        /// and scales are formed here for the 4 tokens together ([`block_sums_x4`]): a call
        /// covers few rows (the executor's chunks), too few to amortize a separate pass.
        ///
        /// # Safety
        /// The CPU has the features this function is compiled for; every `w[r]` has at least
        /// `x[0].len()` blocks, and every `x[t]` as many.
        #[target_feature(enable = $feat)]
        unsafe fn $rows8_x4(w: [&[$block]; 8], x: [&[BlockQ8_0]; 4]) -> [[f32; 8]; 4] {
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..x[0].len() {
                // SAFETY: i < x[t].len() <= w[r].len() (caller); the features are this
                // function's.
                unsafe {
                    let (q, dw) = transposed_block(block_of(&w, i));
                    let u = $operands(q);
                    let bx = [
                        x[0].get_unchecked(i),
                        x[1].get_unchecked(i),
                        x[2].get_unchecked(i),
                        x[3].get_unchecked(i),
                    ];
                    let a = block_sums_x4::<$block>(bx);
                    for t in 0..4 {
                        let isum = $dots(&u, &bx[t].qs, a[t]);
                        let d = _mm256_mul_ps(dw, _mm256_set1_ps(a[t].d));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc[t]);
                    }
                }
            }
            let mut out = [[0.0f32; 8]; 4];
            for t in 0..4 {
                // SAFETY: `out[t]` is 8 writable f32; storeu has no alignment requirement.
                unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
            }
            out
        }
    };
    ($feat:literal, $block:ty, $operands:ident, $dots:ident, $rows8:ident, $rows8_x4:ident,
     $rows8_x8:ident) => {
        kernels!($feat, $block, $operands, $dots, $rows8, $rows8_x4);

        /// [`$rows8_x4`] with 8 activation rows: each block's transpose and unpacking shared
        /// by twice the tokens (prefill's 8-token groups). Written out rather than one kernel
        /// generic over the token count as `kernels16!`'s: that version (block sums in groups
        /// of 4) was 4-6% slower for IQ4_NL here (Zen 3: 0.91 against 0.87 ns per row, block
        /// and token).
        ///
        /// # Safety
        /// As [`$rows8_x4`].
        #[target_feature(enable = $feat)]
        unsafe fn $rows8_x8(w: [&[$block]; 8], x: [&[BlockQ8_0]; 8]) -> [[f32; 8]; 8] {
            let mut acc = [_mm256_setzero_ps(); 8];
            for i in 0..x[0].len() {
                // SAFETY: i < x[t].len() <= w[r].len() (caller); the features are this
                // function's.
                unsafe {
                    let (q, dw) = transposed_block(block_of(&w, i));
                    let u = $operands(q);
                    let bx = [
                        x[0].get_unchecked(i),
                        x[1].get_unchecked(i),
                        x[2].get_unchecked(i),
                        x[3].get_unchecked(i),
                        x[4].get_unchecked(i),
                        x[5].get_unchecked(i),
                        x[6].get_unchecked(i),
                        x[7].get_unchecked(i),
                    ];
                    let lo = block_sums_x4::<$block>([bx[0], bx[1], bx[2], bx[3]]);
                    let hi = block_sums_x4::<$block>([bx[4], bx[5], bx[6], bx[7]]);
                    let a = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
                    for t in 0..8 {
                        let isum = $dots(&u, &bx[t].qs, a[t]);
                        let d = _mm256_mul_ps(dw, _mm256_set1_ps(a[t].d));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc[t]);
                    }
                }
            }
            let mut out = [[0.0f32; 8]; 8];
            for t in 0..8 {
                // SAFETY: `out[t]` is 8 writable f32; storeu has no alignment requirement.
                unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
            }
            out
        }
    };
}

kernels!(
    "avx2,fma,f16c",
    BlockQ4_0,
    operands_q4_0,
    block_dots_avx2,
    rows8_avx2,
    rows8_x4_avx2,
    rows8_x8_avx2
);
kernels!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    BlockQ4_0,
    operands_q4_0,
    block_dots_vnni,
    rows8_vnni,
    rows8_x4_vnni
);
kernels!(
    "avx2,fma,f16c",
    BlockIq4Nl,
    operands_iq4_nl_split,
    block_dots_split_avx2,
    iq4_nl_rows8_avx2,
    iq4_nl_rows8_x4_avx2,
    iq4_nl_rows8_x8_avx2
);
kernels!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    BlockIq4Nl,
    operands_iq4_nl,
    block_dots_vnni,
    iq4_nl_rows8_vnni,
    iq4_nl_rows8_x4_vnni
);

// ---- 16 rows in 512-bit registers (AVX-512 VNNI, prefill) ----
//
// The same scheme with rows 0..16 in the 16 lanes of a 512-bit register: each activation dword
// is still one broadcast load, and one `vpdpbusd` does 16 rows' work; per row, the operations
// and their order are those of the 8-row kernels.

/// [`transposed_block`] for 16 rows: 4 registers `[row k | row k+4 | row k+8 | row k+12]`,
/// transposed by dwords inside each 128-bit quarter, give lane r = row r.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C) are present; `i < w[r].len()` for every r.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transposed_block16<B: Nibbles>(w: &[&[B]; 16], i: usize) -> ([__m512i; 8], __m512) {
    // SAFETY: i < w[r].len() (caller); every `quants()` is 16 readable bytes and loadu has no
    // alignment requirement.
    // (Macros, not closures: closures do not inherit the target features.)
    macro_rules! q {
        ($r:expr) => {
            w[$r].get_unchecked(i).quants().as_ptr().cast::<__m128i>()
        };
    }
    macro_rules! row {
        ($k:expr) => {{
            let v = _mm512_castsi128_si512(_mm_loadu_si128(q!($k)));
            let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(q!($k + 4)));
            let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(q!($k + 8)));
            _mm512_inserti32x4::<3>(v, _mm_loadu_si128(q!($k + 12)))
        }};
    }
    macro_rules! s {
        ($r:expr) => {
            w[$r].get_unchecked(i).scale_bits()
        };
    }
    // SAFETY: i < w[r].len() (caller); every `quants()` is 16 readable bytes and loadu has no
    // alignment requirement.
    let (r, d) = unsafe {
        let d = _mm256_setr_epi16(
            s!(0),
            s!(1),
            s!(2),
            s!(3),
            s!(4),
            s!(5),
            s!(6),
            s!(7),
            s!(8),
            s!(9),
            s!(10),
            s!(11),
            s!(12),
            s!(13),
            s!(14),
            s!(15),
        );
        ([row!(0), row!(1), row!(2), row!(3)], d)
    };
    let a0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let a1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let a2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let a3 = _mm512_unpackhi_epi32(r[2], r[3]);
    let t = [
        _mm512_unpacklo_epi64(a0, a2),
        _mm512_unpackhi_epi64(a0, a2),
        _mm512_unpacklo_epi64(a1, a3),
        _mm512_unpackhi_epi64(a1, a3),
    ];
    let m = _mm512_set1_epi8(0x0F);
    let q = [
        _mm512_and_si512(t[0], m),
        _mm512_and_si512(t[1], m),
        _mm512_and_si512(t[2], m),
        _mm512_and_si512(t[3], m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(t[0]), m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(t[1]), m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(t[2]), m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(t[3]), m),
    ];
    (q, _mm512_cvtph_ps(d))
}

/// [`operands_q4_0`] for 16 rows.
#[inline(always)]
fn operands16_q4_0(q: [__m512i; 8]) -> [__m512i; 8] {
    q
}

/// [`operands_iq4_nl`] for 16 rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn operands16_iq4_nl(q: [__m512i; 8]) -> [__m512i; 8] {
    let t = _mm512_broadcast_i64x4(iq4_nl_table(0, -1));
    [
        _mm512_shuffle_epi8(t, q[0]),
        _mm512_shuffle_epi8(t, q[1]),
        _mm512_shuffle_epi8(t, q[2]),
        _mm512_shuffle_epi8(t, q[3]),
        _mm512_shuffle_epi8(t, q[4]),
        _mm512_shuffle_epi8(t, q[5]),
        _mm512_shuffle_epi8(t, q[6]),
        _mm512_shuffle_epi8(t, q[7]),
    ]
}

/// [`block_dots_vnni`] for 16 rows.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C) are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_dots16_vnni(q: &[__m512i; 8], y: &[i8; 32], a: ActBlock) -> __m512i {
    // SAFETY: `4j + 4 <= 32` for j < 8, so each dword is inside `y`; read_unaligned has no
    // alignment requirement.
    macro_rules! b {
        ($j:expr) => {
            _mm512_set1_epi32(unsafe {
                std::ptr::read_unaligned(y.as_ptr().add(4 * $j).cast::<i32>())
            })
        };
    }
    let s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(a.offset), q[0], b!(0));
    let s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1], b!(1));
    let s0 = _mm512_dpbusd_epi32(s0, q[2], b!(2));
    let s1 = _mm512_dpbusd_epi32(s1, q[3], b!(3));
    let s0 = _mm512_dpbusd_epi32(s0, q[4], b!(4));
    let s1 = _mm512_dpbusd_epi32(s1, q[5], b!(5));
    let s0 = _mm512_dpbusd_epi32(s0, q[6], b!(6));
    let s1 = _mm512_dpbusd_epi32(s1, q[7], b!(7));
    _mm512_add_epi32(s0, s1)
}

/// Generates the 16-row kernel `$rows16_xn` for `N` (4 or 8) tokens and weight blocks
/// `$block` (see [`kernels`]).
macro_rules! kernels16 {
    ($block:ty, $operands:ident, $rows16_xn:ident) => {
        /// 16 weight rows with `N` activation rows (`N` a multiple of 4): lane r = row r of
        /// token t's register. The transpose of each block is shared by the `N` tokens.
        ///
        /// # Safety
        /// AVX-512 F/BW/VL/VNNI (and AVX2, FMA, F16C) are present; every `w[r]` has at least
        /// `x[0].len()` blocks, and every `x[t]` as many.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $rows16_xn<const N: usize>(
            w: [&[$block]; 16],
            x: [&[BlockQ8_0]; N],
        ) -> [[f32; 16]; N] {
            debug_assert!(N % 4 == 0);
            let mut acc = [_mm512_setzero_ps(); N];
            for i in 0..x[0].len() {
                // SAFETY: i < x[t].len() <= w[r].len() (caller); the features are this
                // function's.
                unsafe {
                    let (q, dw) = transposed_block16(&w, i);
                    let u = $operands(q);
                    let mut g = 0;
                    while g < N {
                        let bx = [
                            x[g].get_unchecked(i),
                            x[g + 1].get_unchecked(i),
                            x[g + 2].get_unchecked(i),
                            x[g + 3].get_unchecked(i),
                        ];
                        let a = block_sums_x4::<$block>(bx);
                        for k in 0..4 {
                            let isum = block_dots16_vnni(&u, &bx[k].qs, a[k]);
                            let d = _mm512_mul_ps(dw, _mm512_set1_ps(a[k].d));
                            acc[g + k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[g + k]);
                        }
                        g += 4;
                    }
                }
            }
            let mut out = [[0.0f32; 16]; N];
            for t in 0..N {
                // SAFETY: `out[t]` is 16 writable f32; storeu has no alignment requirement.
                unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
            }
            out
        }
    };
}

kernels16!(BlockQ4_0, operands16_q4_0, rows16_xn_vnni);
kernels16!(BlockIq4Nl, operands16_iq4_nl, iq4_nl_rows16_xn_vnni);

/// A 16-row AVX-512 kernel for `N` tokens (see [`kernels16`]).
type Rows16Kernel<B, const N: usize> = unsafe fn([&[B]; 16], [&[BlockQ8_0]; N]) -> [[f32; 16]; N];

/// The whole 16-row groups of `w` (rows of `rb` bytes) with `N` tokens through the AVX-512
/// kernel `rows16`: `y[t][i..i + 16]` for each group; returns the number of rows done.
///
/// # Panics
/// If `t` is not an AVX-512 token, the activation rows differ in length or are longer than a
/// weight row, or a `y[t]` is too short.
fn rows16_groups<B: super::block::Block, const N: usize>(
    t: Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_0]; N],
    y: &mut [&mut [f32]; N],
    rows16: Rows16Kernel<B, N>,
) -> usize {
    assert!(t.avx512(), "the 16-row kernels need an AVX-512 token");
    let n_rows = w.len() / rb;
    let n = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(rb >= n * std::mem::size_of::<B>(), "weight row too short");
    let row = |i: usize| -> &[B] { blocks(&w[i * rb..(i + 1) * rb]) };
    let mut i = 0;
    while i + 16 <= n_rows {
        let rows = std::array::from_fn(|k| row(i + k));
        // SAFETY: the token's AVX-512 features were detected (asserted); every weight row
        // holds at least the activation's blocks (asserted).
        let r = unsafe { rows16(rows, x) };
        for (yt, rt) in y.iter_mut().zip(r) {
            yt[i..i + 16].copy_from_slice(&rt);
        }
        i += 16;
    }
    i
}

/// Generates `$name`: the 4-token product of all rows of a repacked matrix slice, 16 rows at a
/// time (AVX-512 tokens), then 8, then row by row with `$one` (`|token, row, x| -> [f32; 4]`).
macro_rules! matvec_x4 {
    ($name:ident, $block:ty, $rows16:ident, $rows8:ident, $one:expr) => {
        /// `y[t][i]` = row i of `w` (whole rows of `rb` bytes) with token t, bit-identical to
        /// the one-token kernels: groups of 16 rows (AVX-512) or 8 in the SIMD lanes, leftover
        /// rows one by one.
        ///
        /// # Panics
        /// If `rb` is 0, a `y[t]` has fewer slots than `w` rows, or an `x[t]` is shorter than
        /// a row.
        pub(super) fn $name(
            t: Token,
            w: &[u8],
            rb: usize,
            x: [&[BlockQ8_0]; 4],
            y: &mut [&mut [f32]; 4],
        ) {
            let n_rows = w.len() / rb;
            let row = |i: usize| -> &[$block] { blocks(&w[i * rb..(i + 1) * rb]) };
            let mut i = 0;
            if t.avx512() {
                i = rows16_groups::<$block, 4>(t, w, rb, x, y, $rows16);
            }
            while i + 8 <= n_rows {
                let r = $rows8(t, std::array::from_fn(|k| row(i + k)), x);
                for (yt, rt) in y.iter_mut().zip(r) {
                    yt[i..i + 8].copy_from_slice(&rt);
                }
                i += 8;
            }
            for i in i..n_rows {
                let r: [f32; 4] = $one(t, row(i), x);
                for (yt, rt) in y.iter_mut().zip(r) {
                    yt[i] = rt;
                }
            }
        }
    };
}

/// Generates `$name`: the 8-token product of all rows of a repacked matrix slice: groups of 16
/// rows with the 8 tokens per call (AVX-512: `$rows16`), or of 8 rows (AVX2: `$rows8_x8`); each
/// block's transpose shared by the 8 tokens; the rows left over as two 4-token halves (`$x4`).
macro_rules! matvec_x8 {
    ($name:ident, $block:ty, $rows16:ident, $rows8_x8:ident, $x4:ident) => {
        /// `y[t][i]` = row i of `w` (whole rows of `rb` bytes) with token t, for 8 tokens,
        /// bit-identical to the one-token kernels (see [`matvec_x8`]).
        ///
        /// # Panics
        /// If `rb` is 0, a `y[t]` has fewer slots than `w` rows, or the `x[t]` differ in length
        /// or are shorter than a row.
        pub(super) fn $name(
            t: Token,
            w: &[u8],
            rb: usize,
            x: [&[BlockQ8_0]; 8],
            y: &mut [&mut [f32]; 8],
        ) {
            let n_rows = w.len() / rb;
            let mut i = 0;
            if t.avx512() {
                i = rows16_groups::<$block, 8>(t, w, rb, x, y, $rows16::<8>);
            } else {
                let row = |i: usize| -> &[$block] { blocks(&w[i * rb..(i + 1) * rb]) };
                let n = x[0].len();
                assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
                assert!(
                    rb / std::mem::size_of::<$block>() >= n,
                    "weight row too short"
                );
                while i + 8 <= n_rows {
                    // SAFETY: the token proves AVX2, FMA and F16C; every row has at least `n`
                    // blocks and every `x[t]` exactly `n` (checked above).
                    let r = unsafe { $rows8_x8(std::array::from_fn(|k| row(i + k)), x) };
                    for (yt, rt) in y.iter_mut().zip(r) {
                        yt[i..i + 8].copy_from_slice(&rt);
                    }
                    i += 8;
                }
            }
            if i < n_rows {
                let rest = &w[i * rb..];
                let (lo, hi) = y.split_at_mut(4);
                for (half, ys) in [(0usize, lo), (4, hi)] {
                    let mut yh: [&mut [f32]; 4] = {
                        let [a, b, c, d] = ys else { unreachable!() };
                        [&mut a[i..], &mut b[i..], &mut c[i..], &mut d[i..]]
                    };
                    let xh = [x[half], x[half + 1], x[half + 2], x[half + 3]];
                    $x4(t, rest, rb, xh, &mut yh);
                }
            }
        }
    };
}

matvec_x8!(
    matvec_x8_q4_0,
    BlockQ4_0,
    rows16_xn_vnni,
    rows8_x8_avx2,
    matvec_x4_q4_0
);
matvec_x8!(
    matvec_x8_iq4_nl,
    BlockIq4Nl,
    iq4_nl_rows16_xn_vnni,
    iq4_nl_rows8_x8_avx2,
    matvec_x4_iq4_nl
);

matvec_x4!(
    matvec_x4_q4_0,
    BlockQ4_0,
    rows16_xn_vnni,
    dot_q4_0_q8_0_rows8_x4,
    super::repack::avx2::dot_q4_0_q8_0_xn
);
matvec_x4!(
    matvec_x4_iq4_nl,
    BlockIq4Nl,
    iq4_nl_rows16_xn_vnni,
    dot_iq4_nl_q8_0_rows8_x4,
    |t, w: &[BlockIq4Nl], x: [&[BlockQ8_0]; 4]| x
        .map(|x| super::repack::avx2::dot_iq4_nl_q8_0(t, w, x))
);

/// Q4_0 · Q8_0 of 8 weight rows with one activation row in llama.cpp's repacked order,
/// bit-identical to `repack::dot_q4_0_q8_0` per row; `a` is `x`'s [`prepare`]d blocks. Uses
/// VNNI where the token has AVX-512. Spread over the blocks, it prefetches the first
/// `3 * 64 * x.len()` bytes of `ahead` (the weights the next call will read; may be empty).
///
/// # Panics
/// If a weight row or `a` has fewer blocks than `x`.
pub(super) fn dot_q4_0_q8_0_rows8(
    t: Token,
    w: [&[BlockQ4_0]; 8],
    x: &[BlockQ8_0],
    a: &[ActBlock],
    ahead: &[u8],
) -> [f32; 8] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    assert!(a.len() >= n, "prepared activation too short");
    // SAFETY: the token proves AVX2, FMA and F16C, and with `avx512()` AVX-512 F/BW/VL/VNNI;
    // lengths checked.
    unsafe {
        if t.avx512() {
            rows8_vnni(w, x, a, ahead)
        } else {
            rows8_avx2(w, x, a, ahead)
        }
    }
}

/// [`dot_q4_0_q8_0_rows8`] with 4 activation rows: `out[t][r]` is row r with token t (the
/// activations' block sums are formed inside).
///
/// # Panics
/// If the activation rows differ in length, or a weight row is shorter.
pub(super) fn dot_q4_0_q8_0_rows8_x4(
    t: Token,
    w: [&[BlockQ4_0]; 8],
    x: [&[BlockQ8_0]; 4],
) -> [[f32; 8]; 4] {
    let n = x[0].len();
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    // SAFETY: as in `dot_q4_0_q8_0_rows8`; lengths checked.
    unsafe {
        if t.avx512() {
            rows8_x4_vnni(w, x)
        } else {
            rows8_x4_avx2(w, x)
        }
    }
}

/// IQ4_NL · Q8_0 of 8 weight rows with one activation row in llama.cpp's repacked order,
/// bit-identical to `repack::dot_iq4_nl_q8_0` per row; otherwise as [`dot_q4_0_q8_0_rows8`]
/// (`a` prepared for `BlockIq4Nl`).
///
/// # Panics
/// If a weight row or `a` has fewer blocks than `x`.
pub(super) fn dot_iq4_nl_q8_0_rows8(
    t: Token,
    w: [&[BlockIq4Nl]; 8],
    x: &[BlockQ8_0],
    a: &[ActBlock],
    ahead: &[u8],
) -> [f32; 8] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    assert!(a.len() >= n, "prepared activation too short");
    // SAFETY: as in `dot_q4_0_q8_0_rows8`; lengths checked.
    unsafe {
        if t.avx512() {
            iq4_nl_rows8_vnni(w, x, a, ahead)
        } else {
            iq4_nl_rows8_avx2(w, x, a, ahead)
        }
    }
}

/// [`dot_iq4_nl_q8_0_rows8`] with 4 activation rows: `out[t][r]` is row r with token t.
///
/// # Panics
/// If the activation rows differ in length, or a weight row is shorter.
pub(super) fn dot_iq4_nl_q8_0_rows8_x4(
    t: Token,
    w: [&[BlockIq4Nl]; 8],
    x: [&[BlockQ8_0]; 4],
) -> [[f32; 8]; 4] {
    let n = x[0].len();
    assert!(x.iter().all(|r| r.len() == n), "activation rows differ");
    assert!(w.iter().all(|r| r.len() >= n), "weight row too short");
    // SAFETY: as in `dot_q4_0_q8_0_rows8`; lengths checked.
    unsafe {
        if t.avx512() {
            iq4_nl_rows8_x4_vnni(w, x)
        } else {
            iq4_nl_rows8_x4_avx2(w, x)
        }
    }
}

/// `x`'s [`prepare`]d blocks (for weights `B`) in `stack` if they fit, else in `heap`.
pub(super) fn prepared<'a, B: Nibbles>(
    t: Token,
    x: &[BlockQ8_0],
    stack: &'a mut [ActBlock; STACK_BLOCKS],
    heap: &'a mut Vec<ActBlock>,
) -> &'a [ActBlock] {
    let out = if x.len() <= STACK_BLOCKS {
        &mut stack[..x.len()]
    } else {
        heap.resize(x.len(), ActBlock::default());
        &mut heap[..]
    };
    prepare::<B>(t, x, out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::block::blocks;
    use super::super::repack::tests::{q8_0_row, random_blocks, scale};
    use super::super::repack::{self, avx2 as old};
    use super::super::{Kernels, MATVEC_TOKENS};
    use super::*;
    use crate::testutil::Rng;
    use edge_gguf::GgmlType;

    /// How the weight blocks of a test are filled.
    #[derive(Clone, Copy, Debug)]
    enum Fill {
        Random,
        /// Largest f16 scales.
        ExtremeScales,
        /// Every nibble 0 (the most negative weight, -8).
        AllMin,
        /// Every nibble 15.
        AllMax,
    }

    const FILLS: [Fill; 4] = [
        Fill::Random,
        Fill::ExtremeScales,
        Fill::AllMin,
        Fill::AllMax,
    ];

    /// `rows` Q4_0 rows of `nb` blocks.
    fn weights(r: &mut Rng, rows: usize, nb: usize, fill: Fill) -> Vec<u8> {
        random_blocks(r, rows * nb, 18, |r, b| {
            b[..2].copy_from_slice(&scale(r, matches!(fill, Fill::ExtremeScales)));
            match fill {
                Fill::AllMin => b[2..].fill(0x00),
                Fill::AllMax => b[2..].fill(0xFF),
                _ => {}
            }
        })
    }

    /// Every token this CPU has: AVX2, and the AVX-512 (VNNI) one where present.
    fn tokens() -> Vec<Token> {
        Token::detect()
            .into_iter()
            .chain(Token::detect_avx512())
            .collect()
    }

    fn prep<B: Nibbles>(t: Token, x: &[BlockQ8_0]) -> Vec<ActBlock> {
        let mut a = vec![ActBlock::default(); x.len()];
        prepare::<B>(t, x, &mut a);
        a
    }

    /// The prepared offsets and scales are the exact `-8 * sum` (Q4_0) or `-128 * sum` (IQ4_NL)
    /// and the f16 scale, for activations -128 and 127 too; the 4-token version gives the same.
    #[test]
    fn prepare_is_exact() {
        let mut r = Rng::new(5);
        for t in tokens() {
            for extreme in [false, true] {
                let xs: Vec<Vec<u8>> = (0..4)
                    .map(|k| q8_0_row(&mut r, 9, extreme && k != 2))
                    .collect();
                let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                for (bias, a) in [
                    (8, prep::<BlockQ4_0>(t, xb[0])),
                    (128, prep::<BlockIq4Nl>(t, xb[0])),
                ] {
                    for (b, a) in xb[0].iter().zip(a) {
                        let s: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
                        assert_eq!(a.offset, -bias * s);
                        assert_eq!(a.d.to_bits(), b.d().to_bits());
                    }
                }
                for i in 0..9 {
                    let bx = [&xb[0][i], &xb[1][i], &xb[2][i], &xb[3][i]];
                    // SAFETY: the token proves AVX2, FMA and F16C.
                    let (q4, iq4) = unsafe {
                        (
                            block_sums_x4::<BlockQ4_0>(bx),
                            block_sums_x4::<BlockIq4Nl>(bx),
                        )
                    };
                    for k in 0..4 {
                        assert_eq!(q4[k], prep::<BlockQ4_0>(t, xb[k])[i]);
                        assert_eq!(iq4[k], prep::<BlockIq4Nl>(t, xb[k])[i]);
                    }
                }
            }
        }
    }

    /// The IQ4_NL kernels, in both variants, equal the portable repacked order (and the per-row
    /// AVX2 kernel) bit for bit: random and extreme blocks (indices all 0 = -127, all 15 = 113),
    /// activations all -128 / 127, odd block counts.
    #[test]
    fn iq4_nl_rows8_bit_identical_to_the_portable_order() {
        let mut r = Rng::new(19);
        for t in tokens() {
            for nb in [1usize, 2, 3, 7, 9] {
                for fill in FILLS {
                    for extreme_x in [false, true] {
                        let w = weights(&mut r, 8, nb, fill);
                        let rb = nb * 18;
                        let rows: [&[BlockIq4Nl]; 8] =
                            std::array::from_fn(|k| blocks(&w[k * rb..(k + 1) * rb]));
                        let xs: Vec<Vec<u8>> = (0..4)
                            .map(|k| q8_0_row(&mut r, nb, extreme_x && k != 1))
                            .collect();
                        let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                        let got4 = dot_iq4_nl_q8_0_rows8_x4(t, rows, xb);
                        for tok in 0..4 {
                            let a = prep::<BlockIq4Nl>(t, xb[tok]);
                            let got1 = dot_iq4_nl_q8_0_rows8(t, rows, xb[tok], &a, &w);
                            for k in 0..8 {
                                let want = repack::dot_iq4_nl_q8_0(rows[k], xb[tok]);
                                let per_row = old::dot_iq4_nl_q8_0(t, rows[k], xb[tok]);
                                let ctx = format!(
                                    "avx512={} nb={nb} {fill:?} x_extreme={extreme_x} token {tok} row {k}",
                                    t.avx512()
                                );
                                assert_eq!(got1[k].to_bits(), want.to_bits(), "rows8 {ctx}");
                                assert_eq!(got4[tok][k].to_bits(), want.to_bits(), "x4 {ctx}");
                                assert_eq!(per_row.to_bits(), want.to_bits(), "per row {ctx}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Both kernels, in both variants, equal the portable repacked order (and the previous AVX2
    /// kernels) bit for bit: random and extreme blocks, activations all -128 / 127, odd block
    /// counts.
    #[test]
    fn rows8_bit_identical_to_the_portable_order() {
        let mut r = Rng::new(17);
        for t in tokens() {
            for nb in [1usize, 2, 3, 7, 9] {
                for fill in FILLS {
                    for extreme_x in [false, true] {
                        let w = weights(&mut r, 8, nb, fill);
                        let rb = nb * 18;
                        let rows: [&[BlockQ4_0]; 8] =
                            std::array::from_fn(|k| blocks(&w[k * rb..(k + 1) * rb]));
                        let xs: Vec<Vec<u8>> = (0..4)
                            .map(|k| q8_0_row(&mut r, nb, extreme_x && k != 1))
                            .collect();
                        let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                        let a: Vec<Vec<ActBlock>> =
                            xb.iter().map(|x| prep::<BlockQ4_0>(t, x)).collect();
                        let ab: [&[ActBlock]; 4] = std::array::from_fn(|k| &a[k][..]);
                        let got4 = dot_q4_0_q8_0_rows8_x4(t, rows, xb);
                        let old4 = old::dot_q4_0_q8_0_rows8_x4(t, rows, xb);
                        for tok in 0..4 {
                            let got1 = dot_q4_0_q8_0_rows8(t, rows, xb[tok], ab[tok], &w);
                            let old1 = old::dot_q4_0_q8_0_rows8(t, rows, xb[tok]);
                            for k in 0..8 {
                                let want = repack::dot_q4_0_q8_0(rows[k], xb[tok]);
                                let ctx = format!(
                                    "avx512={} nb={nb} {fill:?} x_extreme={extreme_x} token {tok} row {k}",
                                    t.avx512()
                                );
                                assert_eq!(got1[k].to_bits(), want.to_bits(), "rows8 {ctx}");
                                assert_eq!(got4[tok][k].to_bits(), want.to_bits(), "x4 {ctx}");
                                assert_eq!(old1[k].to_bits(), want.to_bits(), "old {ctx}");
                                assert_eq!(old4[tok][k].to_bits(), want.to_bits(), "old4 {ctx}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// `matvec_x4_*` (16-row groups with AVX-512, then 8, then single rows) equal the portable
    /// repacked order bit for bit, Q4_0 and IQ4_NL, every token: random and extreme blocks,
    /// activations all -128 / 127, odd block counts, row counts 16, 24, 39, 40.
    #[test]
    fn matvec_x4_bit_identical_to_the_portable_order() {
        let mut r = Rng::new(29);
        for t in tokens() {
            for nb in [1usize, 2, 3, 7, 9] {
                for (fill, n_rows) in FILLS.into_iter().zip([16usize, 24, 39, 40]) {
                    let w = weights(&mut r, n_rows, nb, fill);
                    let rb = nb * 18;
                    for extreme_x in [false, true] {
                        let xs: Vec<Vec<u8>> = (0..4)
                            .map(|k| q8_0_row(&mut r, nb, extreme_x && k != 3))
                            .collect();
                        let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                        for iq4 in [false, true] {
                            let mut ys = vec![vec![f32::NAN; n_rows]; 4];
                            let [a, b, c, d] = &mut ys[..] else {
                                unreachable!()
                            };
                            let mut y = [&mut a[..], &mut b[..], &mut c[..], &mut d[..]];
                            if iq4 {
                                matvec_x4_iq4_nl(t, &w, rb, xb, &mut y);
                            } else {
                                matvec_x4_q4_0(t, &w, rb, xb, &mut y);
                            }
                            for (tok, yt) in ys.iter().enumerate() {
                                for (i, got) in yt.iter().enumerate() {
                                    let wr = &w[i * rb..(i + 1) * rb];
                                    let want = if iq4 {
                                        repack::dot_iq4_nl_q8_0(blocks(wr), xb[tok])
                                    } else {
                                        repack::dot_q4_0_q8_0(blocks(wr), xb[tok])
                                    };
                                    assert_eq!(
                                        got.to_bits(),
                                        want.to_bits(),
                                        "avx512={} iq4={iq4} nb={nb} {fill:?} rows={n_rows} \
                                         x_extreme={extreme_x} token {tok} row {i}",
                                        t.avx512()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Through `Kernels::matvec` / `matvec_tokens`, every x86 kernel set, Q4_0 and IQ4_NL:
    /// matrices of 8, 16 and 24 rows (whole and partial row ranges, so that groups of 8 and leftover rows both occur)
    /// take the repacked order; a 12-row matrix takes `vec_dot`'s.
    #[test]
    fn matvec_groups_of_8_bit_identical() {
        let mut r = Rng::new(23);
        for (ty, nb) in [GgmlType::Q4_0, GgmlType::IQ4_NL]
            .into_iter()
            .flat_map(|ty| [1usize, 3, 9].map(|nb| (ty, nb)))
        {
            let n = nb * 32;
            let rb = nb * 18;
            for n_rows in [8usize, 12, 16, 24] {
                let w = weights(&mut r, n_rows, nb, Fill::Random);
                let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS)
                    .map(|k| q8_0_row(&mut r, nb, k == 2))
                    .collect();
                for range in [0..n_rows, 1..n_rows, 0..8, 3..n_rows - 1] {
                    for k in Kernels::available() {
                        let want = |x: &[u8], row: usize| {
                            let wr = &w[row * rb..(row + 1) * rb];
                            match (n_rows % 8 == 0, ty) {
                                (true, GgmlType::Q4_0) => {
                                    repack::dot_q4_0_q8_0(blocks(wr), blocks(x))
                                }
                                (true, _) => repack::dot_iq4_nl_q8_0(blocks(wr), blocks(x)),
                                (false, _) => k.vec_dot(ty, n, wr, x),
                            }
                        };
                        let ctx = format!("{} {ty} nb={nb} rows={n_rows} {range:?}", k.isa_name());
                        let mut ys = vec![vec![f32::NAN; range.len()]; MATVEC_TOKENS];
                        for (x, y) in xs.iter().zip(&mut ys) {
                            k.matvec(ty, n, &w, x, range.clone(), y);
                            for (i, row) in range.clone().enumerate() {
                                assert_eq!(y[i].to_bits(), want(x, row).to_bits(), "{ctx}");
                            }
                        }
                        let mut ys4 = vec![vec![f32::NAN; range.len()]; MATVEC_TOKENS];
                        let [a, b, c, d] = &mut ys4[..] else {
                            unreachable!()
                        };
                        let x4 = std::array::from_fn(|t| &xs[t][..]);
                        if k.matvec_tokens(ty, n, &w, x4, range.clone(), [a, b, c, d]) {
                            assert_eq!(ys4, ys, "tokens {ctx}");
                        }
                    }
                }
            }
        }
    }

    /// The bytes of Q4_0 blocks (the same layout as IQ4_NL's).
    fn bytes_of(b: &[BlockQ4_0]) -> &[u8] {
        // SAFETY: `BlockQ4_0` is 18 bytes of alignment 1, every byte initialized.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), std::mem::size_of_val(b)) }
    }

    /// Old (one register per row, then horizontal sums) against new (rows in the lanes) in the
    /// same process, runs interleaved, best of 15 each (`--ignored --nocapture`, prints only).
    #[test]
    #[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
    fn bench_q4_0_rows8() {
        use std::hint::black_box;
        use std::time::Instant;
        fn compare(what: &str, old: &mut dyn FnMut(), new: &mut dyn FnMut()) {
            let (mut t_old, mut t_new) = (f64::MAX, f64::MAX);
            for _ in 0..15 {
                let s = Instant::now();
                old();
                t_old = t_old.min(s.elapsed().as_secs_f64());
                let s = Instant::now();
                new();
                t_new = t_new.min(s.elapsed().as_secs_f64());
            }
            println!(
                "{what}: old {:.2} ms, new {:.2} ms: {:.2}x",
                t_old * 1e3,
                t_new * 1e3,
                t_old / t_new
            );
        }
        let mut r = Rng::new(3);
        let nb = 64;
        let rb = nb * 18;
        let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_0_row(&mut r, nb, false)).collect();
        let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
        // Prefill: 64 rows of 2048 (cache-resident); decode: the same, and 20000 rows (streamed).
        for (n_rows, passes) in [(64usize, 1000), (20000, 4)] {
            let w = weights(&mut r, n_rows, nb, Fill::Random);
            let groups: Vec<[&[BlockQ4_0]; 8]> = (0..n_rows / 8)
                .map(|g| {
                    std::array::from_fn(|k| blocks(&w[(8 * g + k) * rb..(8 * g + k + 1) * rb]))
                })
                .collect();
            for t in tokens() {
                let v = if t.avx512() { "vnni" } else { "avx2" };
                if n_rows == 64 {
                    compare(
                        &format!("prefill {v} 8 rows x 4 tokens"),
                        &mut || {
                            for _ in 0..passes {
                                for g in &groups {
                                    black_box(old::dot_q4_0_q8_0_rows8_x4(t, *g, xb));
                                }
                            }
                        },
                        &mut || {
                            for _ in 0..passes {
                                for g in &groups {
                                    black_box(dot_q4_0_q8_0_rows8_x4(t, *g, xb));
                                }
                            }
                        },
                    );
                }
                if n_rows == 64 && t.avx512() {
                    let mut ys = vec![vec![0f32; n_rows]; 4];
                    compare(
                        &format!("prefill {v} 64 rows x 4 tokens: 8-row groups vs 16-row"),
                        &mut || {
                            for _ in 0..passes {
                                for g in &groups {
                                    black_box(dot_q4_0_q8_0_rows8_x4(t, *g, xb));
                                }
                            }
                        },
                        &mut || {
                            for _ in 0..passes {
                                let [a, b, c, d] = &mut ys[..] else {
                                    unreachable!()
                                };
                                let mut y = [&mut a[..], &mut b[..], &mut c[..], &mut d[..]];
                                matvec_x4_q4_0(t, &w, rb, xb, &mut y);
                                black_box(&mut y);
                            }
                        },
                    );
                }
                if n_rows == 64 {
                    // IQ4_NL: before, 8 rows x 4 tokens were 32 one-row dots (no multi-token
                    // kernel), and decode one row at a time.
                    let gi: Vec<[&[BlockIq4Nl]; 8]> = groups
                        .iter()
                        .map(|g| std::array::from_fn(|k| blocks(bytes_of(g[k]))))
                        .collect();
                    compare(
                        &format!("prefill {v} IQ4_NL 8 rows x 4 tokens"),
                        &mut || {
                            for _ in 0..passes {
                                for g in &gi {
                                    for x in xb {
                                        for row in g {
                                            black_box(old::dot_iq4_nl_q8_0(t, row, x));
                                        }
                                    }
                                }
                            }
                        },
                        &mut || {
                            for _ in 0..passes {
                                for g in &gi {
                                    black_box(dot_iq4_nl_q8_0_rows8_x4(t, *g, xb));
                                }
                            }
                        },
                    );
                    compare(
                        &format!("decode {v} IQ4_NL {n_rows} rows"),
                        &mut || {
                            for _ in 0..4 * passes {
                                for g in &gi {
                                    for row in g {
                                        black_box(old::dot_iq4_nl_q8_0(t, row, xb[0]));
                                    }
                                }
                            }
                        },
                        &mut || {
                            for _ in 0..4 * passes {
                                let a = prep::<BlockIq4Nl>(t, xb[0]);
                                for g in &gi {
                                    black_box(dot_iq4_nl_q8_0_rows8(t, *g, xb[0], &a, &[]));
                                }
                            }
                        },
                    );
                }
                compare(
                    &format!("decode {v} {n_rows} rows"),
                    &mut || {
                        for _ in 0..4 * passes {
                            for g in &groups {
                                black_box(old::dot_q4_0_q8_0_rows8(t, *g, xb[0]));
                            }
                        }
                    },
                    &mut || {
                        for _ in 0..4 * passes {
                            let a = prep::<BlockQ4_0>(t, xb[0]);
                            for g in &groups {
                                black_box(dot_q4_0_q8_0_rows8(t, *g, xb[0], &a, &[]));
                            }
                        }
                    },
                );
            }
        }
    }
}
