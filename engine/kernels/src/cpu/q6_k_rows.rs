//! Q6_K · Q8_K for the tokens of a batch (prefill: 8 tokens or more) on AVX2, 8 weight rows
//! at a time with row r in 32-bit lane r, in the order of llama.cpp's batched Q6_K kernel.
//!
//! Why: ggml's one-token order (`avx2_quants::dot_q6_k_q8_k_xn`) keeps 8 lane sums per
//! (row, token) and scales every 32-value chunk with its own `madd`, so a row, super-block and
//! token cost about 30 instructions (5.9 ns on Zen 3, 256 rows of SmolLM2's `ffn_down` in
//! cache), and sharing the unpacking among 8 tokens gained nothing. llama.cpp itself does not
//! use that order for batches: from 8 tokens on, its CPU backend runs Q6_K (and Q5_K, IQ4_XS
//! and the K-quants it does not repack) through its "tiled" kernels (`ggml-cpu/tiled/`), which
//! form each super-block's exact integer sum `isum = sum_s sc_s * sum (q - 32) * x` and then
//! `res = d_w * isum`, `acc = fma(res, d_x, acc)`, super-block after super-block from 0
//! (`tiled_run_microtile_avx2`). That order is [`dot_q6_k_q8_k_tiled`]; these kernels give
//! its bits, so prefill's Q6_K matrices follow llama.cpp's batched path instead of its
//! one-token path (its batches of fewer than 8 tokens, and decode, run ggml's order: so do
//! edge-run's).
//!
//! How: per super-block, the 8 rows' `ql`, `qh` and `scales` bytes are transposed by dwords
//! (`q4_k_rows`'s `dwords8`), so that after the 6-bit unpacking register j holds values
//! `4j..4j + 4` of a 32-value chunk of every row, unsigned (`q`, 0..63). Per token the
//! activation's matching 4 quants are one broadcast and `maddubs` gives each row's pair sums
//! (at most 2 * 63 * 128 in magnitude); two dwords' sums add in i16 (at most 32,256), and a
//! `madd` by the rows' `(sc, sc)` pairs takes them to i32. The `-32` is applied once per
//! super-block: `32 * sum_s sc_s * bsum_s`, `madd`s of the rows' `(sc_2p, sc_2p+1)` pairs with
//! the token's bsum pairs. Every integer is exact (at most 16 * 128 * 16 * 63 * 128 < 2^31).

use std::arch::x86_64::*;

use super::block::blocks;
#[cfg(test)]
use super::block::f16_le;
use super::q4_k_rows::{broadcast_dword, bsum_pairs_dot, dwords8};
use super::q6_k::BlockQ6_K;
use super::q8_k::BlockQ8_K;
use super::x86::Token;

/// One weight row with one activation row in llama.cpp's batched (tiled) order, the reference
/// the kernels are held to.
#[cfg(test)]
pub(super) fn dot_q6_k_q8_k_tiled(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = 0f32;
    for (bw, bx) in w.iter().zip(x) {
        let q = bw.quants();
        let mut isum = 0i32;
        for s in 0..16 {
            let sub: i32 = (16 * s..16 * s + 16)
                .map(|i| i32::from(q[i]) * i32::from(bx.qs[i]))
                .sum();
            isum += i32::from(bw.scales[s]) * sub;
        }
        let res = f16_le(bw.d) * isum as f32;
        acc = res.mul_add(bx.d(), acc);
    }
    acc
}

/// `pshufb` controls that put byte `k` (and, for a pair, byte `k + 1`) of every dword into the
/// high byte of both i16 halves, so that an arithmetic shift right by 8 sign-extends them:
/// `(b_k, b_k)`, or `(b_k, b_k+1)` for a pair.
fn high_bytes(k: usize, pair: bool) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    for d in 0..8 {
        let src = (4 * (d % 4) + k) as u8;
        c[4 * d + 1] = src;
        c[4 * d + 3] = if pair { src + 1 } else { src };
    }
    c
}

/// Byte offsets in a Q6_K block: `ql`, `qh`, `scales`, `d`.
const QH: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;

/// Rows 8 at a time (lane r: row r), `T` tokens: `out[t][r]`, in [`dot_q6_k_q8_k_tiled`]'s order.
///
/// # Safety
/// AVX2, FMA and F16C are present; every `x[t]` has `x[0].len()` blocks and every `w[r]` at
/// least that many.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8_impl<const T: usize>(w: [&[BlockQ6_K]; 8], x: [&[BlockQ8_K]; T]) -> [[f32; 8]; T] {
    let nb = x[0].len();
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let load_ctrl = |c: [u8; 32]| {
        // SAFETY: `c` is 32 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
    };
    let dup: [__m256i; 4] = std::array::from_fn(|k| load_ctrl(high_bytes(k, false)));
    let pair: [__m256i; 2] = std::array::from_fn(|k| load_ctrl(high_bytes(2 * k, true)));
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        // SAFETY: i < nb <= w[r].len() (caller): each pointer is a whole 210-byte block.
        let b: [*const u8; 8] = std::array::from_fn(|r| unsafe { w[r].as_ptr().add(i).cast() });
        // SAFETY: as above, for x[t].
        let bx: [&BlockQ8_K; T] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(i) });
        // Lane r of sc4[m]: scales 4m..4m + 4 of row r.
        // SAFETY: SCALES + 16 <= 210 bytes of each block.
        let sc4 = unsafe { dwords8(&b, SCALES) };
        // Per sub-block s: every row's (sc_s, sc_s); per pair p: (sc_2p, sc_2p+1).
        let mut sc = [_mm256_setzero_si256(); 16];
        for s in 0..16 {
            sc[s] = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sc4[s / 4], dup[s % 4]));
        }
        let mut sc_pairs = [_mm256_setzero_si256(); 8];
        for p in 0..8 {
            sc_pairs[p] = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sc4[p / 2], pair[p % 2]));
        }
        // SAFETY: D + 2 <= 210 bytes of each block.
        let d = b.map(|p| unsafe { p.add(D).cast::<i16>().read_unaligned() });
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ));
        let mut raw = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            // Dword j of ql[64h..64h + 32] (a), ql[64h + 32..64h + 64] (q) and
            // qh[32h..32h + 32] (hb) of every row.
            // SAFETY: 64h + 48 + 16 <= 128 and QH + 32h + 32 <= 192: inside each block.
            let (a, q, hb) = unsafe {
                let (a0, a1) = (dwords8(&b, 64 * h), dwords8(&b, 64 * h + 16));
                let (q0, q1) = (dwords8(&b, 64 * h + 32), dwords8(&b, 64 * h + 48));
                let (h0, h1) = (dwords8(&b, QH + 32 * h), dwords8(&b, QH + 32 * h + 16));
                (
                    [a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]],
                    [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]],
                    [h0[0], h0[1], h0[2], h0[3], h1[0], h1[1], h1[2], h1[3]],
                )
            };
            for k in 0..4 {
                // Values 128h + 32k + 4j.. of every row (the top bits from bit pair 2k of qh;
                // 16-bit shifts, the masks drop what crossed from the neighbouring byte).
                // (Loops, not `array::from_fn`: its closure was not inlined here.)
                let mut v = [_mm256_setzero_si256(); 8];
                for j in 0..8 {
                    let (low, top) = match k {
                        0 => (a[j], _mm256_slli_epi16::<4>(hb[j])),
                        1 => (q[j], _mm256_slli_epi16::<2>(hb[j])),
                        2 => (_mm256_srli_epi16::<4>(a[j]), hb[j]),
                        _ => (_mm256_srli_epi16::<4>(q[j]), _mm256_srli_epi16::<2>(hb[j])),
                    };
                    v[j] = _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_and_si256(top, m30));
                }
                // Sub-blocks s0 (dwords 0..4) and s0 + 1 (dwords 4..8).
                let s0 = 8 * h + 2 * k;
                let o = 128 * h + 32 * k;
                for t in 0..T {
                    let y = bx[t].qs.as_ptr().cast::<u8>();
                    // SAFETY: o + 32 <= 256 quants; 4 readable bytes at each dword.
                    let mut p = [_mm256_setzero_si256(); 8];
                    for j in 0..8 {
                        p[j] = _mm256_maddubs_epi16(v[j], unsafe {
                            broadcast_dword(y.add(o + 4 * j))
                        });
                    }
                    let s_lo = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), sc[s0]),
                        _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), sc[s0]),
                    );
                    let s_hi = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_add_epi16(p[4], p[5]), sc[s0 + 1]),
                        _mm256_madd_epi16(_mm256_add_epi16(p[6], p[7]), sc[s0 + 1]),
                    );
                    raw[t] = _mm256_add_epi32(raw[t], _mm256_add_epi32(s_lo, s_hi));
                }
            }
        }
        for t in 0..T {
            // SAFETY: AVX2 is present (this function's features).
            let corr = unsafe { bsum_pairs_dot(&sc_pairs, bx[t]) };
            let isum = _mm256_sub_epi32(raw[t], _mm256_slli_epi32::<5>(corr));
            let res = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(isum));
            acc[t] = _mm256_fmadd_ps(res, _mm256_set1_ps(bx[t].d()), acc[t]);
        }
    }
    std::array::from_fn(|t| {
        let mut o = [0f32; 8];
        // SAFETY: `o` has 8 f32; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc[t]) };
        o
    })
}

/// `y[t][i]` = row i of the Q6_K matrix `w` (whole rows of `rb` bytes) with token t, for `T`
/// tokens (1 to 8), in the order of [`dot_q6_k_q8_k_tiled`]: 8-row groups, the last one
/// repeating the last row where fewer than 8 are left (its extra lanes are not stored).
///
/// # Panics
/// If an activation row has fewer blocks than a weight row, or a `y[t]` has fewer slots than
/// `w` has rows.
pub(super) fn matvec<const T: usize>(
    _: Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_K]; T],
    y: &mut [&mut [f32]; T],
) {
    const { assert!(T >= 1 && T <= 8) };
    let rows = w.len().checked_div(rb).unwrap_or(0);
    if rows == 0 {
        return;
    }
    let nb = rb / size_of::<BlockQ6_K>();
    assert!(x.iter().all(|x| x.len() >= nb), "activation row too short");
    assert!(y.iter().all(|y| y.len() >= rows), "y too short");
    let x = x.map(|x| &x[..nb]);
    let row = |i: usize| -> &[BlockQ6_K] { blocks(&w[i * rb..(i + 1) * rb]) };
    let mut i = 0;
    while i < rows {
        let group: [&[BlockQ6_K]; 8] = std::array::from_fn(|k| row((i + k).min(rows - 1)));
        let n = (rows - i).min(8);
        // SAFETY: a `Token` exists only once AVX2, FMA and F16C were detected; every group row
        // and every `x[t]` has `nb` blocks.
        let r = unsafe { rows8_impl::<T>(group, x) };
        for (yt, rt) in y.iter_mut().zip(&r) {
            yt[i..i + n].copy_from_slice(&rt[..n]);
        }
        i += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::super::repack::tests::q8_k_row;
    use super::*;
    use crate::testutil::Rng;

    /// Random Q6_K rows; with `extreme`, blocks of all-63 or all-0 values, scales -128 or 127
    /// and the largest f16 scale.
    fn q6_k_rows(r: &mut Rng, rows: usize, nb: usize, extreme: bool) -> Vec<u8> {
        let mut v = Vec::with_capacity(rows * nb * 210);
        for _ in 0..rows * nb {
            let mut b = r.bytes(210);
            let pick = r.next_u64();
            if extreme {
                b[..SCALES].fill(if pick & 1 == 0 { 0x00 } else { 0xFF });
                b[SCALES..D].fill(if pick & 2 == 0 { 0x80 } else { 0x7F });
                b[D..].copy_from_slice(&half::f16::MAX.to_bits().to_le_bytes());
            } else {
                let d = half::f16::from_f32(0.001 + (pick % 1000) as f32 * 1e-5);
                b[D..].copy_from_slice(&d.to_bits().to_le_bytes());
            }
            v.extend(b);
        }
        v
    }

    /// The kernels against their portable order, bit for bit: 1, 3 and 8 tokens; 1 to 21 rows
    /// (whole 8-row groups and groups with rows left over); rows of 1 to 9 super-blocks;
    /// extreme blocks against all -128 activations (the i16 pair sums at their bound).
    #[test]
    fn rows_match_the_tiled_order() {
        let Some(t) = Token::detect() else {
            assert!(std::env::var_os("CI").is_none(), "CI machines have AVX2");
            return;
        };
        fn check<const T: usize>(t: Token, w: &[u8], xs: &[Vec<u8>], rows: usize, nb: usize) {
            let rb = nb * 210;
            let x: [&[BlockQ8_K]; T] = std::array::from_fn(|k| blocks(&xs[k]));
            let mut ys = vec![vec![f32::NAN; rows]; T];
            let mut it = ys.iter_mut();
            let mut y: [&mut [f32]; T] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
            matvec::<T>(t, &w[..rows * rb], rb, x, &mut y);
            for (k, y) in ys.iter().enumerate() {
                for (row, got) in y.iter().enumerate() {
                    let want = dot_q6_k_q8_k_tiled(blocks(&w[row * rb..(row + 1) * rb]), x[k]);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{T} tokens, {rows} rows of {nb} blocks: token {k} row {row}"
                    );
                }
            }
        }
        let mut r = Rng::new(606);
        for nb in [1usize, 2, 6, 9] {
            for extreme in [false, true] {
                let w = q6_k_rows(&mut r, 21, nb, extreme);
                let xs: Vec<Vec<u8>> = (0..8)
                    .map(|k| q8_k_row(&mut r, nb, extreme && k % 2 == 0))
                    .collect();
                for rows in [1usize, 8, 13, 21] {
                    check::<1>(t, &w, &xs, rows, nb);
                    check::<3>(t, &w, &xs, rows, nb);
                    check::<8>(t, &w, &xs, rows, nb);
                }
            }
        }
    }

    /// The tiled order and ggml's one-token order add the same exact integers in another f32
    /// order: relative differences of f32 rounding only (a wrong value, scale or offset would
    /// be off by whole products). Bound: per super-block two roundings against ggml's 8 lane
    /// products and tree, then `nb` additions either way.
    #[test]
    fn tiled_order_is_the_one_token_dot_up_to_rounding() {
        let mut r = Rng::new(607);
        for nb in [1usize, 6] {
            let w = q6_k_rows(&mut r, 4, nb, false);
            for row in w.chunks_exact(nb * 210) {
                let x = q8_k_row(&mut r, nb, false);
                let wb: &[BlockQ6_K] = blocks(row);
                let xb: &[BlockQ8_K] = blocks(&x);
                let tiled = dot_q6_k_q8_k_tiled(wb, xb);
                let one = super::super::q6_k::vec_dot(wb, xb);
                let mag: f32 = wb
                    .iter()
                    .zip(xb)
                    .map(|(bw, bx)| {
                        let q = bw.quants();
                        (0..256)
                            .map(|i| {
                                (f16_le(bw.d)
                                    * bx.d()
                                    * f32::from(bw.scales[i / 16])
                                    * f32::from(q[i])
                                    * f32::from(bx.qs[i]))
                                .abs()
                            })
                            .sum::<f32>()
                    })
                    .sum();
                let bound = 4.0 * (nb as f32 + 8.0) * f32::EPSILON * mag;
                assert!(
                    (tiled - one).abs() <= bound,
                    "nb={nb}: {tiled} vs {one} (bound {bound})"
                );
            }
        }
    }
}
