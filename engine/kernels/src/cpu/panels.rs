//! Prefill through packed panels of 16 weight rows with AVX-512 VNNI (or AVX2), for the weight types
//! whose blocks are 32 int8 values and one scale once decoded (Q8_0, Q5_0, Q4_0, IQ4_NL) and
//! for IQ4_XS (super-blocks of 8 such sub-blocks with integer scales): one `vpdpbusd` adds 4
//! quants of one token to 16 rows' dot products at once, so that a block's integer dot product
//! for 16 rows costs 8 instructions and its scaling 3 (convert, scale product, `fma`), against
//! ~3.5 instructions per row, block and token in the kernels that keep ggml's 8 partial sums
//! per block (`avx512::dot_q8_0_q8_0_x8`, the tiles).
//!
//! The weights are decoded per chunk of rows into a buffer the caller owns (the executor's
//! planned per-thread scratch; the file's bytes are never copied elsewhere): per block, the
//! 16 rows' values biased by 128 (unsigned, `vpdpbusd`'s first operand) and interleaved by
//! groups of 4 (64 bytes per group: row `r`'s 4 values at bytes `4r..4r + 4`), then the 16
//! rows' scales. The activations are read where they are: each group of 4 quants is one
//! broadcast `u32` (the signed operand). Each lane's sum is `sum((w + 128) * x)`; the lane
//! starts at `-128 * sum(x)` (one value per token and block, shared by the 16 rows), so it
//! ends at `sum(w * x)` exactly, as ggml's integer sums are. IQ4_XS sub-block sums are then
//! multiplied by their scales and added in integers over the super-block, as ggml does.
//!
//! Each block's (super-block's) exact integer sum is scaled by `d_w * d_x` and added to the
//! row's f32 sum with one `fma`, block after block: the order of llama.cpp's repacked x86
//! kernels (`cpu/repack.rs`), so for Q4_0 and IQ4_NL matrices that llama.cpp repacks (rows a
//! multiple of 8) the results are **bit-identical** to edge-run's one-token kernels. For Q8_0,
//! Q5_0 and IQ4_XS they are **not**: ggml's one-token kernels keep 8 partial sums per block
//! (their lanes) and add them at the end. The difference is f32 rounding only (relative ~1e-6
//! of the dot product); issue 17's rule for batched prefill ("within the gap between
//! llama.cpp's own batched and token-by-token results; where exactness costs speed, speed
//! wins") allows it (README, "Speed").
//!
//! **AVX2 without AVX-512** (Zen 3 and older, most Intel client CPUs) runs the same panels:
//! [`pack_avx2`] writes the same bytes, and [`matmul8_avx2`] takes 16 rows (two registers)
//! with 4 tokens at a time through the sign trick (`maddubs(|w|, sign(x, w))`, each token's
//! broadcast serving both registers), in the same blockwise order, so the same bits as on
//! AVX-512 and as the 8-token kernel it replaces (`q8_0_rows.rs`). That kernel transposed each
//! block's 8 rows for every 8 tokens; here a matrix chunk is transposed once for all the
//! prompt's tokens. IQ4_XS ([`matmul8_k_avx2`]) applies the sub-block scales in the `madd`
//! that widens each group's pair sums, with the same super-blockwise bits as [`matmul8_k`]
//! (on AVX2 its 8-token kernel kept ggml's one-token lanes, a third slower per product).
//!
//! The portable packing is plain Rust (every target compiles it); the kernels are x86-64 only.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
use super::block::f16_le;
#[cfg(target_arch = "x86_64")]
use super::iq4_nl::{BlockIq4Nl, KVALUES_IQ4NL};
#[cfg(target_arch = "x86_64")]
use super::iq4_xs::BlockIq4Xs;
#[cfg(target_arch = "x86_64")]
use super::q4_0::BlockQ4_0;
#[cfg(target_arch = "x86_64")]
use super::q5_0::BlockQ5_0;
#[cfg(target_arch = "x86_64")]
use super::q8_0::BlockQ8_0;
#[cfg(target_arch = "x86_64")]
use super::q8_0_rows::{transpose8, SignedBlock};
#[cfg(target_arch = "x86_64")]
use super::q8_k::BlockQ8_K;
#[cfg(target_arch = "x86_64")]
use super::x86::{iq4_nl_values, load_q8, nibbles, prefetch_range, q5_quants, Token};

/// Weight rows per panel (the lanes of one 512-bit register of i32).
pub const PANEL_ROWS: usize = 16;
/// Panels one [`Panels`] holds at most: 64 rows, the executor's prefill chunk.
const MAX_PANELS: usize = 4;
/// Panel blocks one [`Panels`] holds (147 KiB): 4 panels of rows of up to 64 blocks (2,048
/// values), fewer panels of longer rows, down to one panel of 256 blocks (8,192 values).
const CAPACITY: usize = 256;
/// Blocks per row the panels take at most (256: 8,192 values; one panel of rows that long).
pub const PANEL_MAX_BLOCKS: usize = CAPACITY;

/// Rows one [`Panels`] holds for rows of `nb` blocks (0 for rows too long).
pub fn panel_rows(nb: usize) -> usize {
    PANEL_ROWS * MAX_PANELS.min(CAPACITY / nb.max(1))
}

/// `rows` of a matrix with rows of `n` values in the parts one [`Panels`] holds, in order.
pub fn panel_parts(
    n: usize,
    rows: std::ops::Range<usize>,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = panel_rows(n / 32).max(1);
    let end = rows.end;
    rows.step_by(step)
        .map(move |start| start..(start + step).min(end))
}

/// One block of 32 values of one panel: 16 rows' quants biased and interleaved, then their
/// scales.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelBlock {
    /// Group `g` (quants `4g..4g + 4` of the block): row `r`'s 4 quants `+ 128` at `4r..4r + 4`.
    q: [[u8; 64]; 8],
    /// The 16 rows' `d` as f32 (for a sub-block of a 256-value super-block: the super-block's).
    d: [f32; PANEL_ROWS],
    /// The 16 rows' integer sub-block scales (super-blocks; 0 for 32-value blocks).
    sc: [i32; PANEL_ROWS],
}

/// How a panel's blocks are scaled, which decides the activations it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PanelKind {
    /// Blocks of 32 values and one scale (Q8_0, Q5_0, Q4_0, IQ4_NL); Q8_0 activations.
    Blocks32,
    /// Super-blocks of 256 values: 8 sub-blocks of 32 with integer scales, one f32 scale
    /// (IQ4_XS); Q8_K activations. `nb` counts sub-blocks.
    SuperBlocks256,
}

/// Bytes of scratch a thread needs for [`Panels`] (147 KiB, and room to align it).
pub const PANELS_SCRATCH_BYTES: usize = CAPACITY * std::mem::size_of::<PanelBlock>() + 64;

/// Up to [`panel_rows`] weight rows decoded to int8 values and packed for `matmul8`, in a
/// buffer the caller owns (the executor's planned per-thread scratch).
pub struct Panels<'a> {
    blocks: &'a mut [MaybeUninit<PanelBlock>],
    kind: PanelKind,
    /// Blocks (of 32 values) per row.
    nb: usize,
    /// Rows packed (the last panel is padded with zero rows).
    n_rows: usize,
    /// Every packed value is within -16..=16 (Q5_0, Q4_0: [`SignedBlock::SMALL`], set by
    /// [`pack_avx2`]; `false` is exact for any values): the AVX2 kernel adds a block's pair sums
    /// in i16 (see [`matmul8_avx2`]).
    small: bool,
}

impl<'a> Panels<'a> {
    /// Panels in `buf`, which holds at least [`PANELS_SCRATCH_BYTES`] (any alignment: the
    /// panels start at its first 64-byte boundary). Nothing is packed yet.
    ///
    /// # Panics
    /// If `buf` is too small.
    pub fn new(buf: &'a mut [f32]) -> Panels<'a> {
        let off = buf
            .as_ptr()
            .align_offset(std::mem::align_of::<PanelBlock>());
        let need = CAPACITY * std::mem::size_of::<PanelBlock>() / 4;
        assert!(
            off <= 16 && buf.len() >= off + need,
            "panels: a buffer of {} bytes is too small",
            std::mem::size_of_val(buf)
        );
        let start = buf[off..].as_mut_ptr().cast::<MaybeUninit<PanelBlock>>();
        // SAFETY: `start` is aligned for `PanelBlock` (align_offset), the CAPACITY blocks lie
        // inside `buf` (checked above), `buf` is borrowed mutably for 'a so nothing else
        // touches them, and `MaybeUninit<PanelBlock>` is valid for any bytes (f32 included).
        let blocks = unsafe { std::slice::from_raw_parts_mut(start, CAPACITY) };
        Panels {
            blocks,
            kind: PanelKind::Blocks32,
            nb: 0,
            n_rows: 0,
            small: false,
        }
    }

    /// Rows packed.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// The packed blocks' bytes (tests compare two packings).
    #[cfg(test)]
    pub(super) fn packed_bytes(&self) -> Vec<u8> {
        let n = self.n_rows.div_ceil(PANEL_ROWS) * self.nb;
        self.blocks[..n]
            .iter()
            .flat_map(|b| {
                // SAFETY: `pack` wrote the first `n` blocks; a `PanelBlock` is plain bytes,
                // f32 and i32 without padding (512 + 64 + 64 bytes).
                let b = unsafe { b.assume_init_ref() };
                let bytes: &[u8; std::mem::size_of::<PanelBlock>()] =
                    unsafe { &*(b as *const PanelBlock).cast() };
                bytes.to_vec()
            })
            .collect()
    }

    /// Starts a packing of `n_rows` rows of `nb` blocks of 32 values (the checks and fields
    /// every packer shares); `small` as the field says.
    ///
    /// # Panics
    /// If there are too many rows for `nb`, or super-blocks with `nb` not a multiple of 8.
    fn begin(&mut self, kind: PanelKind, n_rows: usize, nb: usize, small: bool) {
        assert!(
            n_rows <= panel_rows(nb),
            "panels: {n_rows} rows of {nb} blocks do not fit"
        );
        assert!(kind == PanelKind::Blocks32 || nb.is_multiple_of(8));
        self.kind = kind;
        self.nb = nb;
        self.n_rows = n_rows;
        self.small = small;
    }

    /// How the packed blocks are scaled.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86-64 has the kernels
    pub(super) fn kind(&self) -> PanelKind {
        self.kind
    }

    /// Packs `n_rows` rows of `nb` blocks of 32 values (at most [`panel_rows`]`(nb)` rows):
    /// `block(r, i)` is row `r`'s block `i` as its scales (f32; integer, for a sub-block of a
    /// super-block) and 32 int8 values.
    ///
    /// # Panics
    /// If there are too many rows for `nb`, or super-blocks with `nb` not a multiple of 8.
    pub(super) fn pack(
        &mut self,
        kind: PanelKind,
        n_rows: usize,
        nb: usize,
        block: impl Fn(usize, usize) -> (f32, i32, [i8; 32]),
    ) {
        self.begin(kind, n_rows, nb, false);
        for p in 0..n_rows.div_ceil(PANEL_ROWS) {
            for i in 0..nb {
                let mut b = PanelBlock {
                    // A padding row: values 0 (biased: 128) and scales 0.
                    q: [[128; 64]; 8],
                    d: [0.0; PANEL_ROWS],
                    sc: [0; PANEL_ROWS],
                };
                for r in 0..PANEL_ROWS.min(n_rows - p * PANEL_ROWS) {
                    let (d, sc, v) = block(p * PANEL_ROWS + r, i);
                    b.d[r] = d;
                    b.sc[r] = sc;
                    for (g, q) in b.q.iter_mut().enumerate() {
                        let four = [v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]];
                        let biased = u32::from_ne_bytes(four.map(|x| x as u8)) ^ 0x8080_8080;
                        q[4 * r..4 * r + 4].copy_from_slice(&biased.to_ne_bytes());
                    }
                }
                self.blocks[p * nb + i].write(b);
            }
        }
    }
}

/// Where [`pack_avx512`] reads the rows it packs (and [`pack_avx2`] their scales): row `r`'s block `i` (of 32 values) as the
/// values biased by 128 (unsigned bytes, element order) and its scales, exactly as the
/// closure given to [`Panels::pack`] decodes it.
#[cfg(target_arch = "x86_64")]
pub(super) trait PanelSource {
    /// Row `r`'s block `i`: its 32 values `+ 128`.
    ///
    /// # Safety
    /// The CPU has the features of [`super::x86::avx512_detected`]; `r` and `i` are inside the
    /// matrix.
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i;
    /// Row `r`'s block `i`: `d` (f32) and the integer sub-block scale (0 for 32-value blocks).
    fn scales(&self, r: usize, i: usize) -> (f32, i32);
}

/// Rows of a matrix of blocks `B` (`rb` bytes per row), in the layout of the file.
#[cfg(target_arch = "x86_64")]
pub(super) struct BlockRows<'a, B> {
    w: &'a [u8],
    rb: usize,
    _block: std::marker::PhantomData<B>,
}

#[cfg(target_arch = "x86_64")]
impl<'a, B: super::block::Block> BlockRows<'a, B> {
    /// Whole rows of `rb` bytes of `B` blocks.
    fn new(w: &'a [u8], rb: usize) -> Self {
        BlockRows {
            w,
            rb,
            _block: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    fn block(&self, r: usize, i: usize) -> &B {
        &super::block::blocks::<B>(&self.w[r * self.rb..(r + 1) * self.rb])[i]
    }
}

/// 16 table entries (i8) biased by 128, in both 128-bit lanes (a `vpshufb` table).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn biased_table(table: &[i8; 16]) -> __m256i {
    let t: [u8; 16] = table.map(|v| (v as u8) ^ 0x80);
    // SAFETY: `t` is 16 readable bytes; loadu has no alignment requirement.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
}

#[cfg(target_arch = "x86_64")]
impl PanelSource for BlockRows<'_, BlockQ8_0> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { load_q8(&self.block(r, i).qs) };
        _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
    }
    #[inline(always)]
    fn scales(&self, r: usize, i: usize) -> (f32, i32) {
        (self.block(r, i).d(), 0)
    }
}

#[cfg(target_arch = "x86_64")]
impl PanelSource for BlockRows<'_, BlockQ4_0> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i {
        // Value `q - 8`, biased: `q + 120`.
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(&self.block(r, i).qs) };
        _mm256_add_epi8(q, _mm256_set1_epi8(120))
    }
    #[inline(always)]
    fn scales(&self, r: usize, i: usize) -> (f32, i32) {
        (self.block(r, i).d(), 0)
    }
}

#[cfg(target_arch = "x86_64")]
impl PanelSource for BlockRows<'_, BlockQ5_0> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i {
        let b = self.block(r, i);
        // Value `q - 16`, biased: `q + 112`.
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { q5_quants(&b.qh, &b.qs) };
        _mm256_add_epi8(q, _mm256_set1_epi8(112))
    }
    #[inline(always)]
    fn scales(&self, r: usize, i: usize) -> (f32, i32) {
        (self.block(r, i).d(), 0)
    }
}

#[cfg(target_arch = "x86_64")]
impl PanelSource for BlockRows<'_, BlockIq4Nl> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i {
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(&self.block(r, i).qs) };
        _mm256_shuffle_epi8(biased_table(&KVALUES_IQ4NL), q)
    }
    #[inline(always)]
    fn scales(&self, r: usize, i: usize) -> (f32, i32) {
        (self.block(r, i).d(), 0)
    }
}

/// IQ4_XS rows as sub-blocks: block `i` is sub-block `i % 8` of super-block `i / 8`.
#[cfg(target_arch = "x86_64")]
impl PanelSource for BlockRows<'_, BlockIq4Xs> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn biased(&self, r: usize, i: usize) -> __m256i {
        let k = i % 8;
        let qs: &[u8; 16] = self.block(r, i / 8).qs[16 * k..16 * k + 16]
            .try_into()
            .expect("16 bytes");
        // SAFETY: AVX2 is among this function's features.
        let q = unsafe { nibbles(qs) };
        _mm256_shuffle_epi8(biased_table(&KVALUES_IQ4NL), q)
    }
    #[inline(always)]
    fn scales(&self, r: usize, i: usize) -> (f32, i32) {
        let b = self.block(r, i / 8);
        (f16_le(b.d), b.scale(i % 8))
    }
}

/// [`Panels::pack`] with AVX-512: per panel block, the 16 rows' biased values are decoded in
/// registers (row `k` and row `k + 8` in the two halves of one register) and transposed by
/// 4-byte groups (an 8 x 8 transpose of `u32` in each half: unpacks of 32 and 64 bits, then
/// one two-source permute per group), so each group is one 64-byte store. The same bytes as
/// [`Panels::pack`] (test `simd_packing_matches_the_portable_packing`), about 10x faster:
/// the portable packing decoded and wrote each row's values one group at a time, which was a
/// quarter of a 128-token prefill of Q4_0 weights and made short prompts slower through the
/// panels than without them.
///
/// `w` holds the `n_rows` rows to pack, whole rows of `rb` bytes of `B` blocks (`nb` blocks of
/// 32 values each, as [`PanelSource`] counts them).
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`].
///
/// # Panics
/// As [`Panels::pack`], or if `w` holds fewer than `n_rows` rows of `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pack_avx512<'a, B: super::block::Block>(
    p: &mut Panels<'_>,
    kind: PanelKind,
    w: &'a [u8],
    rb: usize,
    n_rows: usize,
    nb: usize,
) where
    BlockRows<'a, B>: PanelSource,
{
    let src = BlockRows::<B>::new(w, rb);
    p.begin(kind, n_rows, nb, false);
    // A padding row: values 0 (biased: 128) and scales 0.
    let pad = _mm256_set1_epi8(0x80u8 as i8);
    let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    // The rows are read from memory (a prompt's matmul packs each part once), 16 side by side,
    // which the hardware prefetchers follow badly: the first panel is prefetched at once, and
    // each block of a panel prefetches its share of the next panel's bytes (the panels' rows are
    // consecutive in the matrix).
    let panel_bytes = PANEL_ROWS * rb;
    let share = panel_bytes.div_ceil(nb.max(1)).next_multiple_of(64);
    prefetch_range(w, 0, panel_bytes);
    for panel in 0..n_rows.div_ceil(PANEL_ROWS) {
        let r0 = panel * PANEL_ROWS;
        let live = PANEL_ROWS.min(n_rows - r0);
        let next = (r0 + PANEL_ROWS) * rb;
        for i in 0..nb {
            prefetch_range(w, next + i * share, share);
            // Row k's biased values (no closure: closures do not take this function's target
            // features, and one that is not inlined passes every register through memory).
            let mut rows = [pad; PANEL_ROWS];
            for (k, row) in rows.iter_mut().enumerate().take(live) {
                // SAFETY: row r0 + k < n_rows and i < nb (caller); the features are this
                // function's.
                *row = unsafe { src.biased(r0 + k, i) };
            }
            // Register k: row k's 8 groups in the low half, row k + 8's in the high half.
            let mut z = [_mm512_setzero_si512(); 8];
            for k in 0..8 {
                z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(rows[k]), rows[k + 8], 1);
            }
            // Per 128-bit lane, t[2j] / t[2j + 1] interleave rows 2j and 2j + 1 by u32 ...
            let mut t = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                t[2 * j] = _mm512_unpacklo_epi32(z[2 * j], z[2 * j + 1]);
                t[2 * j + 1] = _mm512_unpackhi_epi32(z[2 * j], z[2 * j + 1]);
            }
            // ... u[4h + j]: group j (lanes 0, 2) and 4 + j (lanes 1, 3) of 4 rows (4h..4h + 4
            // in lanes 0, 1; 8 + 4h.. in lanes 2, 3) ...
            let mut u = [_mm512_setzero_si512(); 8];
            for h in 0..2 {
                let (t0, t1, t2, t3) = (t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]);
                u[4 * h] = _mm512_unpacklo_epi64(t0, t2);
                u[4 * h + 1] = _mm512_unpackhi_epi64(t0, t2);
                u[4 * h + 2] = _mm512_unpacklo_epi64(t1, t3);
                u[4 * h + 3] = _mm512_unpackhi_epi64(t1, t3);
            }
            // ... and group g of all 16 rows, row r at bytes 4r..4r + 4.
            let mut g = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                g[j] = _mm512_permutex2var_epi64(u[j], lo, u[4 + j]);
                g[4 + j] = _mm512_permutex2var_epi64(u[j], hi, u[4 + j]);
            }
            let mut d = [0f32; PANEL_ROWS];
            let mut sc = [0i32; PANEL_ROWS];
            for k in 0..live {
                (d[k], sc[k]) = src.scales(r0 + k, i);
            }
            let dst = p.blocks[panel * nb + i].as_mut_ptr();
            // SAFETY: `dst` points to a whole `PanelBlock` of `p` (aligned to 64, so is each
            // 64-byte group); the fields are written through raw pointers, never read, and
            // every byte of the block is written before the kernels read it.
            unsafe {
                for (k, gk) in g.iter().enumerate() {
                    _mm512_store_si512(std::ptr::addr_of_mut!((*dst).q[k]).cast(), *gk);
                }
                std::ptr::addr_of_mut!((*dst).d).write(d);
                std::ptr::addr_of_mut!((*dst).sc).write(sc);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// `y[t][r] = row r . x[t]` for the packed rows and 8 tokens (`y[t].len()` = rows packed),
/// each block's integer dot scaled once (see the module's docs).
///
/// # Safety
/// The CPU has the features of [`super::x86::avx512_detected`]; every `x[t]` has at least the
/// packed rows' blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul8(p: &Panels<'_>, x: [&[BlockQ8_0]; 8], y: [&mut [f32]; 8]) {
    const T: usize = 8;
    let nb = p.nb;
    assert!(p.kind == PanelKind::Blocks32);
    assert!(x.iter().all(|x| x.len() >= nb));
    assert!(y.iter().all(|y| y.len() == p.n_rows));
    // Per block and token: the lane's start, -128 * sum(x), and d_x.
    let mut start = [[0i32; T]; CAPACITY];
    let mut dx = [[0f32; T]; CAPACITY];
    let ones = _mm256_set1_epi8(1);
    for i in 0..nb {
        for t in 0..T {
            // SAFETY: i < nb <= x[t].len() (asserted).
            let b = unsafe { x[t].get_unchecked(i) };
            // SAFETY: AVX2 is among this function's features.
            let q = unsafe { load_q8(&b.qs) };
            // sum(x) of the 32 quants: vpdpbusd with 1s, then the 8 lanes.
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            start[i][t] = -128 * _mm_cvtsi128_si32(s);
            dx[i][t] = f16_le(b.d);
        }
    }
    let mut y = y;
    for panel in 0..p.n_rows.div_ceil(PANEL_ROWS) {
        let mut acc = [_mm512_setzero_ps(); T];
        for i in 0..nb {
            // SAFETY: i < nb.
            let b = unsafe { p.block(panel, i) };
            let w = groups(b);
            // SAFETY: `d` is 16 f32, 64-byte aligned (after 512 bytes of an aligned block).
            let dw = unsafe { _mm512_load_ps(b.d.as_ptr()) };
            for t in 0..T {
                // SAFETY: i < nb <= x[t].len() (asserted).
                let xb = unsafe { x[t].get_unchecked(i) };
                let mut s = _mm512_set1_epi32(start[i][t]);
                for (g, wg) in w.iter().enumerate() {
                    // SAFETY: bytes 4g..4g + 4 of the 32 quants; read_unaligned needs no
                    // alignment.
                    let q4 = unsafe {
                        std::ptr::read_unaligned(xb.qs.as_ptr().add(4 * g).cast::<i32>())
                    };
                    s = _mm512_dpbusd_epi32(s, *wg, _mm512_set1_epi32(q4));
                }
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(dx[i][t]));
                acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[t]);
            }
        }
        store(&mut y, p, panel, acc);
    }
}

#[cfg(target_arch = "x86_64")]
/// [`matmul8`] for super-block panels ([`PanelKind::SuperBlocks256`]) and Q8_K activations:
/// per super-block and row, `sum_j sc_j * dot_j` over the 8 sub-blocks in integers (exact, as
/// ggml's IQ4_XS sums), then one `fma` with `d_w * d_x`. Each sub-block's lane starts at
/// `-128 * sum(x)` of its 32 activations, from the two `bsums` of Q8_K.
///
/// # Safety
/// As [`matmul8`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul8_k(p: &Panels<'_>, x: [&[BlockQ8_K]; 8], y: [&mut [f32]; 8]) {
    const T: usize = 8;
    let nb = p.nb;
    let n_super = nb / 8;
    assert!(p.kind == PanelKind::SuperBlocks256);
    assert!(x.iter().all(|x| x.len() >= n_super));
    assert!(y.iter().all(|y| y.len() == p.n_rows));
    let mut y = y;
    for panel in 0..p.n_rows.div_ceil(PANEL_ROWS) {
        let mut acc = [_mm512_setzero_ps(); T];
        for s in 0..n_super {
            let mut isum = [_mm512_setzero_si512(); T];
            for j in 0..8 {
                let i = 8 * s + j;
                // SAFETY: i < 8 * n_super = nb.
                let b = unsafe { p.block(panel, i) };
                let w = groups(b);
                // SAFETY: `sc` is 16 i32 at a 64-byte boundary of the aligned block.
                let sc = unsafe { _mm512_load_si512(b.sc.as_ptr().cast()) };
                for t in 0..T {
                    // SAFETY: s < n_super <= x[t].len() (asserted).
                    let xb = unsafe { x[t].get_unchecked(s) };
                    let sum_x = xb.bsum(2 * j) + xb.bsum(2 * j + 1);
                    let mut d = _mm512_set1_epi32(-128 * sum_x);
                    for (g, wg) in w.iter().enumerate() {
                        // SAFETY: bytes 32j + 4g .. + 4 of the 256 quants; read_unaligned
                        // needs no alignment.
                        let q4 = unsafe {
                            std::ptr::read_unaligned(
                                xb.qs.as_ptr().add(32 * j + 4 * g).cast::<i32>(),
                            )
                        };
                        d = _mm512_dpbusd_epi32(d, *wg, _mm512_set1_epi32(q4));
                    }
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(d, sc));
                }
            }
            // SAFETY: 8s < nb; `d` is 16 f32 at a 64-byte boundary of the aligned block.
            let dw = unsafe { _mm512_load_ps(p.block(panel, 8 * s).d.as_ptr()) };
            for t in 0..T {
                // SAFETY: s < x[t].len() (asserted).
                let dx = unsafe { x[t].get_unchecked(s) }.d();
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(dx));
                acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[t]), acc[t]);
            }
        }
        store(&mut y, p, panel, acc);
    }
}

/// Where [`pack_avx2`] reads the rows it packs: row `r`'s block `i` (of 32 values) as its 32
/// values (i8), exactly as the closure given to [`Panels::pack`] decodes it, and its scales
/// ([`PanelSource::scales`], shared with the AVX-512 packing).
#[cfg(target_arch = "x86_64")]
pub(super) trait PanelRowsAvx2: PanelSource {
    /// How the packed blocks are scaled.
    const KIND: PanelKind;
    /// Every value is within -16..=16 ([`SignedBlock::SMALL`]).
    const SMALL: bool;
    /// Values per block of the file (32; IQ4_XS: 256).
    const BLOCK_VALUES: usize;
    /// Row `r`'s block `i`: its 32 values.
    ///
    /// # Safety
    /// AVX2 is present; `r` and `i` are inside the matrix.
    unsafe fn values(&self, r: usize, i: usize) -> __m256i;
}

#[cfg(target_arch = "x86_64")]
impl<W: SignedBlock> PanelRowsAvx2 for BlockRows<'_, W>
where
    Self: PanelSource,
{
    const KIND: PanelKind = PanelKind::Blocks32;
    const SMALL: bool = W::SMALL;
    const BLOCK_VALUES: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self, r: usize, i: usize) -> __m256i {
        // SAFETY: AVX2 is present (caller).
        unsafe { self.block(r, i).values() }
    }
}

/// IQ4_XS rows as sub-blocks, as for AVX-512 ([`PanelSource`]).
#[cfg(target_arch = "x86_64")]
impl PanelRowsAvx2 for BlockRows<'_, BlockIq4Xs> {
    const KIND: PanelKind = PanelKind::SuperBlocks256;
    const SMALL: bool = false;
    const BLOCK_VALUES: usize = 256;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self, r: usize, i: usize) -> __m256i {
        let k = i % 8;
        let qs: &[u8; 16] = self.block(r, i / 8).qs[16 * k..16 * k + 16]
            .try_into()
            .expect("16 bytes");
        // SAFETY: AVX2 is present (caller).
        unsafe { iq4_nl_values(qs) }
    }
}

/// [`Panels::pack`] with AVX2 (machines without AVX-512): per panel block and half (8 rows),
/// the rows' values decoded in registers ([`PanelRowsAvx2::values`]), transposed by 4-byte
/// groups ([`transpose8`]: group `j`'s 8 rows in one register) and biased, so that each half
/// group is one 32-byte store. The same bytes as [`Panels::pack`] (test
/// `simd_packing_matches_the_portable_packing`).
///
/// `w` holds the `n_rows` rows to pack, whole rows of `rb` bytes of `B` blocks; `nb` counts
/// blocks of 32 values (IQ4_XS: sub-blocks).
///
/// # Safety
/// AVX2, FMA and F16C are present.
///
/// # Panics
/// As [`Panels::pack`], or if `w` holds fewer than `n_rows` rows of `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_avx2<B: super::block::Block>(
    p: &mut Panels<'_>,
    w: &[u8],
    rb: usize,
    n_rows: usize,
    nb: usize,
) where
    for<'r> BlockRows<'r, B>: PanelRowsAvx2,
{
    type Rows<'r, B> = BlockRows<'r, B>;
    let file_blocks = nb * 32 / <Rows<'_, B> as PanelRowsAvx2>::BLOCK_VALUES;
    assert!(w.len() >= n_rows * rb && rb >= file_blocks * std::mem::size_of::<B>());
    let src = BlockRows::<B>::new(w, rb);
    p.begin(
        <Rows<'_, B> as PanelRowsAvx2>::KIND,
        n_rows,
        nb,
        <Rows<'_, B> as PanelRowsAvx2>::SMALL,
    );
    let bias = _mm256_set1_epi8(0x80u8 as i8);
    // As in `pack_avx512`: rows read 16 side by side, each block prefetching its share of the
    // next panel's bytes.
    let panel_bytes = PANEL_ROWS * rb;
    let share = panel_bytes.div_ceil(nb.max(1)).next_multiple_of(64);
    prefetch_range(w, 0, panel_bytes);
    for panel in 0..n_rows.div_ceil(PANEL_ROWS) {
        let r0 = panel * PANEL_ROWS;
        let live = PANEL_ROWS.min(n_rows - r0);
        let next = (r0 + PANEL_ROWS) * rb;
        for i in 0..nb {
            prefetch_range(w, next + i * share, share);
            let dst = p.blocks[panel * nb + i].as_mut_ptr();
            let mut d = [0f32; PANEL_ROWS];
            let mut sc = [0i32; PANEL_ROWS];
            for half in 0..2 {
                // A padding row: values 0 (its scales are 0 too).
                let mut q = [_mm256_setzero_si256(); 8];
                for (k, qk) in q.iter_mut().enumerate() {
                    let r = 8 * half + k;
                    if r < live {
                        // SAFETY: AVX2 is present (caller); the row and block are inside `w`.
                        *qk = unsafe { src.values(r0 + r, i) };
                        (d[r], sc[r]) = src.scales(r0 + r, i);
                    }
                }
                // SAFETY: AVX2 is present (caller).
                let g = unsafe { transpose8(q) };
                for (j, gj) in g.iter().enumerate() {
                    // SAFETY: `dst` points to a whole `PanelBlock` of `p`; bytes 32 * half ..
                    // + 32 of its 64-byte group `j` are inside it (aligned to 32); written
                    // through a raw pointer, never read before every byte is written.
                    unsafe {
                        let at = std::ptr::addr_of_mut!((*dst).q[j]).cast::<u8>();
                        _mm256_store_si256(at.add(32 * half).cast(), _mm256_xor_si256(*gj, bias));
                    }
                }
            }
            // SAFETY: as above, for the scale fields.
            unsafe {
                std::ptr::addr_of_mut!((*dst).d).write(d);
                std::ptr::addr_of_mut!((*dst).sc).write(sc);
            }
        }
    }
}

/// [`matmul8`] with AVX2 (machines without AVX-512), in the same order (so the same bits as
/// the AVX-512 panels, `q8_0_rows` and `dot_q8_0_q8_0_blockwise`): per block and row, the exact
/// integer dot, then `acc = fma(d_w * d_x, isum, acc)`. Returns `false` (and writes nothing)
/// where an activation holds a -128 quant (the sign trick below would wrap; the quantizer never
/// writes one), for the caller's other kernels.
///
/// Per block, 16 rows (one 64-byte group of the panel: two registers of 8 rows) with 4 tokens
/// at a time: each broadcast of a token's 4 quants serves both registers, and
/// `maddubs(|w|, sign(x, w))` then `madd` with ones add 4 exact products to each lane. For
/// small values ([`Panels`]' `small`, from [`SignedBlock::SMALL`]) a block's 8 group products add up in i16 (each pair at
/// most `2 * 16 * 127`, the 8 at most 32,512 < 2^15), so one `madd` per block and token
/// suffices.
///
/// Why panels on AVX2 too: `q8_0_rows` transposes each block's 8 rows for every 8 tokens, and
/// with its scale gathering that was a third of its time in prefill. Zen 3, in cache, rows of 48
/// blocks, ns per row, block and token: 0.69 in `q8_0_rows`, 0.52 here (0.57 with 8 rows and 8
/// tokens per pass, without the shared broadcasts).
///
/// # Panics
/// If the panels are not [`PanelKind::Blocks32`], an activation row is shorter than the packed
/// rows or a `y[t]` is not as long as the rows packed.
#[cfg(target_arch = "x86_64")]
pub(super) fn matmul8_avx2(
    t: Token,
    p: &Panels<'_>,
    x: [&[BlockQ8_0]; 8],
    y: [&mut [f32]; 8],
) -> bool {
    let nb = p.nb;
    assert!(p.kind == PanelKind::Blocks32);
    assert!(x.iter().all(|x| x.len() >= nb));
    assert!(y.iter().all(|y| y.len() == p.n_rows));
    if !x.iter().all(|x| super::avx2::sign_trick_exact(t, &x[..nb])) {
        return false;
    }
    let mut y = y;
    // The tokens' block scales converted once for all panels, in a stack buffer sized to the
    // row (a fixed one of CAPACITY blocks was 8 KiB zeroed per call).
    super::avx2::with_block_scales(nb, |dx: &mut [[f32; 8]]| {
        super::avx2::q8_0_token_scales(t, x, dx);
        let dx = &*dx;
        for panel in 0..p.n_rows.div_ceil(PANEL_ROWS) {
            // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; `panel`
            // holds packed rows and `dx` has the `nb` blocks each `x[t]` has at least
            // (asserted); no activation quant is -128 (checked).
            let acc = unsafe {
                if p.small {
                    panel16_avx2::<true>(p, panel, x, dx)
                } else {
                    panel16_avx2::<false>(p, panel, x, dx)
                }
            };
            store_panel(&mut y, p, panel, &acc);
        }
    })
    .expect("panels hold at most CAPACITY (256) blocks per row");
    true
}

/// Group `j` of a panel block for the AVX2 kernels: the 16 rows' 4 values each with the bias
/// taken off (signed), and their magnitudes, each as two registers of 8 rows.
///
/// # Safety
/// AVX2 is present; `j < 8`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_values(b: &PanelBlock, j: usize) -> ([__m256i; 2], [__m256i; 2]) {
    let bias = _mm256_set1_epi8(0x80u8 as i8);
    // SAFETY: `q[j]` is 64 bytes aligned to 64 (the block's alignment).
    let w = unsafe {
        let at = b.q.get_unchecked(j).as_ptr();
        [
            _mm256_xor_si256(_mm256_load_si256(at.cast()), bias),
            _mm256_xor_si256(_mm256_load_si256(at.add(32).cast()), bias),
        ]
    };
    (w, [_mm256_abs_epi8(w[0]), _mm256_abs_epi8(w[1])])
}

/// The 4 quants `qs[at..at + 4]` broadcast to every 32-bit lane.
///
/// # Safety
/// AVX2 is present; `at + 4 <= qs.len()`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn broadcast_quad(qs: &[i8], at: usize) -> __m256i {
    debug_assert!(at + 4 <= qs.len());
    // SAFETY: 4 readable bytes at `at` (the contract); read_unaligned needs no alignment.
    _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(qs.as_ptr().add(at).cast::<i32>()) })
}

/// The AVX2 kernels' accumulators (`acc[t]`: token `t`'s 16 rows in two registers) as floats,
/// which cross to the callers without AVX2's calling convention.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel_lanes(acc: &[[__m256; 2]; 8]) -> [[f32; PANEL_ROWS]; 8] {
    let mut out = [[0f32; PANEL_ROWS]; 8];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` is 16 f32; storeu needs no alignment.
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }
    out
}

/// Writes one panel's results (`acc[t]`: 16 rows of token `t`) to the rows of `y` it covers,
/// for the AVX2 kernels. A whole panel is a copy of a constant length (two vector moves); a
/// run-time length was a call to `memcpy` per token and panel (1-2% of a prefill).
#[cfg(target_arch = "x86_64")]
#[inline]
fn store_panel(
    y: &mut [&mut [f32]; 8],
    p: &Panels<'_>,
    panel: usize,
    acc: &[[f32; PANEL_ROWS]; 8],
) {
    let r0 = panel * PANEL_ROWS;
    let n = PANEL_ROWS.min(p.n_rows - r0);
    for (yt, a) in y.iter_mut().zip(acc) {
        if n == PANEL_ROWS {
            let out: &mut [f32; PANEL_ROWS] = (&mut yt[r0..r0 + PANEL_ROWS])
                .try_into()
                .expect("a whole panel of rows");
            *out = *a;
        } else {
            yt[r0..r0 + n].copy_from_slice(&a[..n]);
        }
    }
}

/// One panel's 16 rows with 8 tokens: `out[t][r]` (see [`matmul8_avx2`]).
///
/// # Safety
/// AVX2, FMA and F16C are present; `panel` holds packed rows; every `x[t]` has `dx.len() ==
/// p.nb` blocks; no activation quant is -128 (else the lanes are wrong, though still defined).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel16_avx2<const SMALL: bool>(
    p: &Panels<'_>,
    panel: usize,
    x: [&[BlockQ8_0]; 8],
    dx: &[[f32; 8]],
) -> [[f32; PANEL_ROWS]; 8] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; 8];
    for (i, dxi) in dx.iter().enumerate() {
        // SAFETY: i < nb (the caller's `dx`); `panel` holds packed rows.
        let b = unsafe { p.block(panel, i) };
        // SAFETY: `d` is 16 f32 at a 64-byte boundary of the aligned block.
        let dw = unsafe {
            [
                _mm256_load_ps(b.d.as_ptr()),
                _mm256_load_ps(b.d.as_ptr().add(8)),
            ]
        };
        // Two passes of 4 tokens: 8 integer sums in registers, and the block's values
        // (reloaded from L1 for the second pass) beside them.
        for h in 0..2 {
            let mut isum = [[_mm256_setzero_si256(); 2]; 4];
            for j in 0..8 {
                // SAFETY: AVX2 is present (this function's features).
                let (g, a) = unsafe { group_values(b, j) };
                for (k, s) in isum.iter_mut().enumerate() {
                    // SAFETY: i < x[t].len() (caller); 4 readable bytes at 4j < 32.
                    let xb = unsafe { broadcast_quad(&x[4 * h + k].get_unchecked(i).qs, 4 * j) };
                    for half in 0..2 {
                        let pr = _mm256_maddubs_epi16(a[half], _mm256_sign_epi8(xb, g[half]));
                        s[half] = if SMALL {
                            _mm256_add_epi16(s[half], pr)
                        } else {
                            _mm256_add_epi32(s[half], _mm256_madd_epi16(pr, ones))
                        };
                    }
                }
            }
            for (k, s) in isum.iter().enumerate() {
                let t = 4 * h + k;
                let sx = _mm256_set1_ps(dxi[t]);
                for half in 0..2 {
                    let s = if SMALL {
                        _mm256_madd_epi16(s[half], ones)
                    } else {
                        s[half]
                    };
                    let d = _mm256_mul_ps(dw[half], sx);
                    acc[t][half] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][half]);
                }
            }
        }
    }
    panel_lanes(&acc)
}

/// [`matmul8_k`] with AVX2 (machines without AVX-512), in the same order, so the same bits:
/// per super-block and row, `sum_j sc_j * dot_j` over the 8 sub-blocks in integers (exact),
/// then `acc = fma(d_w * d_x, isum, acc)`. Returns `false` (and writes nothing) where an
/// activation holds a -128 quant, as [`matmul8_avx2`].
///
/// As [`matmul8_avx2`], 16 rows with 4 tokens at a time through the sign trick; each group's
/// pair sums (at most `2 * 127 * 127`, IQ4_NL's values reach -127) go to i32 through one
/// `madd` with the rows' sub-block scales (each scale in both i16 halves of its row's lane),
/// so the scaling costs nothing beyond the `madd` the group needs anyway. The sums stay
/// exact: at most `8 * 32 * 127 * 127 * 32` < 2^31 per super-block.
///
/// # Panics
/// If the panels are not [`PanelKind::SuperBlocks256`], an activation row is shorter than the
/// packed rows or a `y[t]` is not as long as the rows packed.
#[cfg(target_arch = "x86_64")]
pub(super) fn matmul8_k_avx2(
    t: Token,
    p: &Panels<'_>,
    x: [&[BlockQ8_K]; 8],
    y: [&mut [f32]; 8],
) -> bool {
    let n_super = p.nb / 8;
    assert!(p.kind == PanelKind::SuperBlocks256);
    assert!(x.iter().all(|x| x.len() >= n_super));
    assert!(y.iter().all(|y| y.len() == p.n_rows));
    if !x
        .iter()
        .all(|x| super::avx2::sign_trick_exact(t, &x[..n_super]))
    {
        return false;
    }
    let mut y = y;
    for panel in 0..p.n_rows.div_ceil(PANEL_ROWS) {
        // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; `panel` holds
        // packed rows and every `x[t]` has the `n_super` super-blocks (asserted); no
        // activation quant is -128 (checked).
        let acc = unsafe { panel16_k_avx2(p, panel, &x) };
        store_panel(&mut y, p, panel, &acc);
    }
    true
}

/// One super-block panel's 16 rows with 8 tokens: `out[t][r]` (see [`matmul8_k_avx2`]).
///
/// # Safety
/// AVX2, FMA and F16C are present; `panel` holds packed super-block rows; every `x[t]` has at
/// least `p.nb / 8` blocks; no activation quant is -128 (else the lanes are wrong, though
/// still defined).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel16_k_avx2(
    p: &Panels<'_>,
    panel: usize,
    x: &[&[BlockQ8_K]; 8],
) -> [[f32; PANEL_ROWS]; 8] {
    let low16 = _mm256_set1_epi32(0xFFFF);
    let mut acc = [[_mm256_setzero_ps(); 2]; 8];
    for s in 0..p.nb / 8 {
        // SAFETY: 8s < nb; `d` is 16 f32 at a 64-byte boundary of the aligned block (every
        // sub-block holds its super-block's `d`).
        let dw = unsafe {
            let b = p.block(panel, 8 * s);
            [
                _mm256_load_ps(b.d.as_ptr()),
                _mm256_load_ps(b.d.as_ptr().add(8)),
            ]
        };
        // Two passes of 4 tokens, as in `panel16_avx2`.
        for h in 0..2 {
            let mut isum = [[_mm256_setzero_si256(); 2]; 4];
            for j in 0..8 {
                // SAFETY: 8s + j < nb; `panel` holds packed rows.
                let b = unsafe { p.block(panel, 8 * s + j) };
                // Row r's scale in both i16 halves of lane r (-32..=31).
                // SAFETY: `sc` is 16 i32 at a 64-byte boundary of the aligned block.
                let mut sc = unsafe {
                    [
                        _mm256_load_si256(b.sc.as_ptr().cast()),
                        _mm256_load_si256(b.sc.as_ptr().add(8).cast()),
                    ]
                };
                // (A loop, not `map`: closures do not inherit target features.)
                for v in &mut sc {
                    *v = _mm256_or_si256(_mm256_slli_epi32(*v, 16), _mm256_and_si256(*v, low16));
                }
                for g in 0..8 {
                    // SAFETY: AVX2 is present (this function's features).
                    let (w, a) = unsafe { group_values(b, g) };
                    for (k, sk) in isum.iter_mut().enumerate() {
                        // SAFETY: s < x[t].len() (caller); 4 readable bytes at 32j + 4g < 256.
                        let xq = &x[4 * h + k].get_unchecked(s).qs;
                        let xb = unsafe { broadcast_quad(xq, 32 * j + 4 * g) };
                        for half in 0..2 {
                            let pr = _mm256_maddubs_epi16(a[half], _mm256_sign_epi8(xb, w[half]));
                            sk[half] = _mm256_add_epi32(sk[half], _mm256_madd_epi16(pr, sc[half]));
                        }
                    }
                }
            }
            for (k, sk) in isum.iter().enumerate() {
                let t = 4 * h + k;
                // SAFETY: s < x[t].len() (caller).
                let dx = _mm256_set1_ps(unsafe { x[t].get_unchecked(s) }.d());
                for half in 0..2 {
                    let d = _mm256_mul_ps(dw[half], dx);
                    acc[t][half] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sk[half]), acc[t][half]);
                }
            }
        }
    }
    panel_lanes(&acc)
}

#[cfg(target_arch = "x86_64")]
impl Panels<'_> {
    /// Block `i` of panel `panel`.
    ///
    /// # Safety
    /// `panel` holds packed rows and `i < self.nb` (so `pack` wrote the block).
    #[inline]
    unsafe fn block(&self, panel: usize, i: usize) -> &PanelBlock {
        // SAFETY: the caller's conditions; `pack` wrote blocks panel * nb + i for i < nb of
        // every panel it packed.
        unsafe {
            self.blocks
                .get_unchecked(panel * self.nb + i)
                .assume_init_ref()
        }
    }
}

/// A panel block's 8 groups of 16 rows' biased values, one register each.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn groups(b: &PanelBlock) -> [__m512i; 8] {
    // SAFETY: `q[g]` is 64 bytes, aligned to 64 with the block.
    std::array::from_fn(|g| unsafe { _mm512_load_si512(b.q[g].as_ptr().cast()) })
}

/// Writes one panel's results (`acc[t]`: 16 rows of token `t`) to the rows of `y` it covers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn store(y: &mut [&mut [f32]; 8], p: &Panels<'_>, panel: usize, acc: [__m512; 8]) {
    let r0 = panel * PANEL_ROWS;
    let n = PANEL_ROWS.min(p.n_rows - r0);
    // A masked store of the panel's rows (a copy of a run-time length is a call to `memcpy`
    // per token and panel).
    let mask = (((1u32 << n) - 1) & 0xFFFF) as __mmask16;
    for (yt, a) in y.iter_mut().zip(acc) {
        let out = &mut yt[r0..r0 + n];
        // SAFETY: lanes 0..n are stored (the mask), all inside `out`; masked-off lanes touch
        // no memory, and storeu has no alignment requirement.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, a) };
    }
}
