//! The intrinsics kernels of `avx2_quants.rs` against the plain-loop versions they replaced
//! (kept here as the references, compiled with the same target features so that the timing
//! comparison is fair), bit for bit, on random and extreme blocks, directly and through
//! `Kernels::vec_dot`, `matvec` and `matvec_tokens`.

// Indexing mirrors ggml's block layout (several arrays addressed by one element index).
#![allow(clippy::needless_range_loop)]

use super::super::avx2::sign_trick_exact;
use super::super::block::{blocks, f16_le_bytes};
use super::super::q4_k::scale_min_k4;
use super::super::x86::k4_scales_mins;
use super::super::{Kernels, MATVEC_TOKENS};
use super::*;
use crate::testutil::Rng;
use edge_gguf::GgmlType;

/// The plain-loop Q6_K kernel the intrinsics replaced: the lanes spelled out element by element.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reference_dot_q6_k_q8_k(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for c in 0..8 {
            for (i, l) in lanes.iter_mut().enumerate() {
                let base = 32 * c + 4 * i;
                let mut s = 0i32;
                for e in base..base + 4 {
                    s += (i32::from(q[e]) + 32) * i32::from(bx.qs[e]);
                }
                *l += i32::from(bw.scales[base / 16]) * s;
            }
        }
        for (i, l) in lanes.iter_mut().enumerate() {
            let sub = bx.bsum(2 * i) * i32::from(bw.scales[2 * i])
                + bx.bsum(2 * i + 1) * i32::from(bw.scales[2 * i + 1]);
            *l -= sub << 5;
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

/// The plain-loop Q5_K kernel the intrinsics replaced.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reference_dot_q5_k_q8_k(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let mut sc = [0i32; 8];
        let mut mins = 0i32;
        for k in 0..8 {
            let (s, m) = scale_min_k4(k, &bw.scales);
            sc[k] = i32::from(s);
            mins += i32::from(m) * (bx.bsum(2 * k) + bx.bsum(2 * k + 1));
        }
        summs = dmin.mul_add(mins as f32, summs);
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for c in 0..8 {
            for (i, l) in lanes.iter_mut().enumerate() {
                let base = 32 * c + 4 * i;
                let mut s = 0i32;
                for e in base..base + 4 {
                    s += i32::from(q[e]) * i32::from(bx.qs[e]);
                }
                *l += sc[c] * s;
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + summs
}

/// The plain-loop Q4_K kernel the intrinsics replaced.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reference_dot_q4_k_q8_k(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (bw, bx) in w.iter().zip(x) {
        let d = bx.d() * f16_le(bw.d);
        let dmin = -bx.d() * f16_le(bw.dmin);
        let mut sc = [0i32; 8];
        let mut mn = [0i32; 8];
        for k in 0..8 {
            let (s, m) = scale_min_k4(k, &bw.scales);
            sc[k] = i32::from(s);
            mn[k] = i32::from(m);
        }
        for (k, a) in acc_m.iter_mut().enumerate() {
            let q8s0 = bx.bsum(4 * k) + bx.bsum(4 * k + 1);
            let q8s1 = bx.bsum(4 * k + 2) + bx.bsum(4 * k + 3);
            let prod = mn[2 * k] * q8s0 + mn[2 * k + 1] * q8s1;
            *a = dmin.mul_add(prod as f32, *a);
        }
        let mut lanes = [0i32; 8];
        for c in 0..4 {
            let q = &bw.qs[32 * c..32 * c + 32];
            let y = &bx.qs[64 * c..64 * c + 64];
            for (i, l) in lanes.iter_mut().enumerate() {
                let (mut lo, mut hi) = (0i32, 0i32);
                for e in 4 * i..4 * i + 4 {
                    lo += i32::from(q[e] & 0x0F) * i32::from(y[e]);
                    hi += i32::from(q[e] >> 4) * i32::from(y[e + 32]);
                }
                *l += sc[2 * c] * lo + sc[2 * c + 1] * hi;
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// The plain-loop Q5_0 kernel the intrinsics replaced.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reference_dot_q5_0_q8_0(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (bw, bx) in w.iter().zip(x) {
        let d = bw.d() * bx.d();
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            for e in 4 * i..4 * i + 4 {
                *l += (i32::from(q[e]) - 16) * i32::from(bx.qs[e]);
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc)
}

/// The plain-loop Q5_1 kernel the intrinsics replaced.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reference_dot_q5_1_q8_1(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (bw, bx) in w.iter().zip(x) {
        summs += bw.m() * bx.s();
        let d = bw.d() * bx.d();
        let q = bw.quants();
        let mut lanes = [0i32; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            for e in 4 * i..4 * i + 4 {
                *l += i32::from(q[e]) * i32::from(bx.qs[e]);
            }
        }
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = (l as f32).mul_add(d, *a);
        }
    }
    hsum8(&acc) + summs
}

fn token() -> Option<Token> {
    let t = Token::detect();
    if t.is_none() {
        eprintln!("no AVX2 on this CPU: skipped");
    }
    t
}

fn reference_q6_k(w: &[BlockQ6_K], x: &[BlockQ8_K]) -> f32 {
    assert!(token().is_some());
    // SAFETY: AVX2, FMA and F16C were detected just above.
    unsafe { reference_dot_q6_k_q8_k(w, x) }
}

fn reference_q4_k(w: &[BlockQ4_K], x: &[BlockQ8_K]) -> f32 {
    assert!(token().is_some());
    // SAFETY: AVX2, FMA and F16C were detected just above.
    unsafe { reference_dot_q4_k_q8_k(w, x) }
}

fn reference_q5_k(w: &[BlockQ5_K], x: &[BlockQ8_K]) -> f32 {
    assert!(token().is_some());
    // SAFETY: AVX2, FMA and F16C were detected just above.
    unsafe { reference_dot_q5_k_q8_k(w, x) }
}

fn reference_q5_0(w: &[BlockQ5_0], x: &[BlockQ8_0]) -> f32 {
    assert!(token().is_some());
    // SAFETY: AVX2, FMA and F16C were detected just above.
    unsafe { reference_dot_q5_0_q8_0(w, x) }
}

fn reference_q5_1(w: &[BlockQ5_1], x: &[BlockQ8_1]) -> f32 {
    assert!(token().is_some());
    // SAFETY: AVX2, FMA and F16C were detected just above.
    unsafe { reference_dot_q5_1_q8_1(w, x) }
}

/// How a test block is filled: random bytes, or every field at one end of its range.
#[derive(Clone, Copy, Debug)]
enum Fill {
    Random,
    /// Quants 63 (`q = 31`), scales 127, activations 127.
    Max,
    /// Quants 0 (`q = -32`), scales -128, activations -128.
    Min,
    /// Quants 63, scales -128, activations -128 (the largest products).
    Mixed,
}

fn q6_k_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    let mut w = r.bytes(nb * 210);
    for b in w.chunks_mut(210) {
        match fill {
            Fill::Random => {}
            Fill::Max | Fill::Mixed => b[..192].fill(0xFF),
            Fill::Min => b[..192].fill(0),
        }
        match fill {
            Fill::Random => {}
            Fill::Max => b[192..208].fill(127),
            Fill::Min | Fill::Mixed => b[192..208].fill(0x80),
        }
        let d = match fill {
            Fill::Random => r.f32(0.05),
            // Near the f16 maximum: large, still finite products with the activation scales.
            _ => 60000.0,
        };
        b[208..210].copy_from_slice(&f16_le_bytes(d));
    }
    w
}

/// Q5_K blocks: random bytes, or quants 31 / 0 with scales and mins 63 / 0, and extreme f16
/// scales.
fn q5_k_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    let mut w = r.bytes(nb * 176);
    for b in w.chunks_mut(176) {
        match fill {
            Fill::Random => {}
            Fill::Max | Fill::Mixed => b[4..].fill(0xFF),
            Fill::Min => b[4..].fill(0),
        }
        let (d, m) = match fill {
            Fill::Random => (r.f32(0.05), r.f32(0.05)),
            _ => (60000.0, -60000.0),
        };
        b[..2].copy_from_slice(&f16_le_bytes(d));
        b[2..4].copy_from_slice(&f16_le_bytes(m));
    }
    w
}

/// Q4_K blocks, filled as [`q5_k_row`].
fn q4_k_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    let mut w = r.bytes(nb * 144);
    for b in w.chunks_mut(144) {
        match fill {
            Fill::Random => {}
            Fill::Max | Fill::Mixed => b[4..].fill(0xFF),
            Fill::Min => b[4..].fill(0),
        }
        let (d, m) = match fill {
            Fill::Random => (r.f32(0.05), r.f32(0.05)),
            _ => (60000.0, -60000.0),
        };
        b[..2].copy_from_slice(&f16_le_bytes(d));
        b[2..4].copy_from_slice(&f16_le_bytes(m));
    }
    w
}

/// A Q8_K row: random quants (including -128) with consistent or (every other block) random
/// i16 bsums, or every quant at one end of the range.
fn q8_k_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    let mut x = r.bytes(nb * 292);
    for (j, b) in x.chunks_mut(292).enumerate() {
        let d = match fill {
            Fill::Random => r.f32(0.02),
            _ => 1.0e-3,
        };
        b[..4].copy_from_slice(&d.to_le_bytes());
        match fill {
            Fill::Random => {}
            Fill::Max => b[4..260].fill(127),
            Fill::Min | Fill::Mixed => b[4..260].fill(0x80),
        }
        if matches!(fill, Fill::Random) && j % 2 == 1 {
            continue; // keep the random bsums: the kernel must not assume they match the quants
        }
        for k in 0..16 {
            let s: i32 = b[4 + 16 * k..4 + 16 * k + 16]
                .iter()
                .map(|&q| i32::from(q as i8))
                .sum();
            b[260 + 2 * k..262 + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
    x
}

/// Q5_0 (`with_min` false, 22-byte blocks) or Q5_1 (24-byte blocks with `m`) weights: random
/// bytes, or every quant 31 (`Max`, `Mixed`) / 0 (`Min`) with extreme f16 scales.
fn q5_row(r: &mut Rng, nb: usize, fill: Fill, with_min: bool) -> Vec<u8> {
    let bb = if with_min { 24 } else { 22 };
    let mut w = r.bytes(nb * bb);
    for b in w.chunks_mut(bb) {
        let head = if with_min { 4 } else { 2 };
        match fill {
            Fill::Random => {}
            Fill::Max | Fill::Mixed => b[head..].fill(0xFF),
            Fill::Min => b[head..].fill(0),
        }
        let (d, m) = match fill {
            Fill::Random => (r.f32(0.05), r.f32(0.05)),
            Fill::Max => (60000.0, 60000.0),
            _ => (-60000.0, -60000.0),
        };
        b[..2].copy_from_slice(&f16_le_bytes(d));
        if with_min {
            b[2..4].copy_from_slice(&f16_le_bytes(m));
        }
    }
    w
}

fn q5_0_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    q5_row(r, nb, fill, false)
}

fn q5_1_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    q5_row(r, nb, fill, true)
}

/// A Q8_0 (`with_sum` false, 34-byte blocks) or Q8_1 (36 bytes, with an arbitrary `s`, which
/// the kernels take as given) row: random quants (including -128), or every quant 127 / -128.
fn q8_row(r: &mut Rng, nb: usize, fill: Fill, with_sum: bool) -> Vec<u8> {
    let bb = if with_sum { 36 } else { 34 };
    let head = bb - 32;
    let mut x = r.bytes(nb * bb);
    for b in x.chunks_mut(bb) {
        let (d, s) = match fill {
            Fill::Random => (r.f32(0.02), r.f32(50.0)),
            _ => (1.0e-3, -60000.0),
        };
        b[..2].copy_from_slice(&f16_le_bytes(d));
        if with_sum {
            b[2..4].copy_from_slice(&f16_le_bytes(s));
        }
        match fill {
            Fill::Random => {}
            Fill::Max => b[head..].fill(127),
            Fill::Min | Fill::Mixed => b[head..].fill(0x80),
        }
    }
    x
}

fn q8_0_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    q8_row(r, nb, fill, false)
}

fn q8_1_row(r: &mut Rng, nb: usize, fill: Fill) -> Vec<u8> {
    q8_row(r, nb, fill, true)
}

const FILLS: [Fill; 4] = [Fill::Random, Fill::Max, Fill::Min, Fill::Mixed];
const BLOCK_COUNTS: [usize; 7] = [1, 2, 3, 7, 8, 9, 16];

#[test]
fn q6_k_kernels_equal_the_reference_bit_for_bit() {
    if token().is_none() {
        return;
    }
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(61);
    for fill in FILLS {
        for nb in BLOCK_COUNTS {
            for _ in 0..8 {
                let w = q6_k_row(&mut r, nb, fill);
                let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, fill)).collect();
                let wb: &[BlockQ6_K] = blocks(&w);
                let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let want = xb.map(|x| reference_q6_k(wb, x));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for &t in &tokens {
                    let a = t.avx512();
                    let one = xb.map(|x| dot_q6_k_q8_k(t, wb, x));
                    let one_n = xb.map(|x| dot_q6_k_q8_k_xn(t, wb, [x])[0]);
                    let four = dot_q6_k_q8_k_xn(t, wb, xb);
                    let two = dot_q6_k_q8_k_xn(t, wb, [xb[0], xb[1]]);
                    assert_eq!(bits(&one), bits(&want), "one token {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&one_n), bits(&want), "xn::<1> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&four), bits(&want), "xn::<4> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&two), bits(&want[..2]), "xn::<2> {fill:?} nb={nb} {a}");
                }
            }
        }
    }
}

/// The 32 bytes [`q5_quants`] unpacks equal the block's `quants()`.
#[test]
fn q5_quants_unpack_as_quants() {
    if token().is_none() {
        return;
    }
    let mut r = Rng::new(71);
    for _ in 0..2000 {
        let w = q5_0_row(&mut r, 1, Fill::Random);
        let b: &BlockQ5_0 = &blocks(&w)[0];
        let mut got = [0u8; 32];
        // SAFETY: AVX2 was detected above; `got` has 32 bytes, storeu has no alignment
        // requirement.
        unsafe { _mm256_storeu_si256(got.as_mut_ptr().cast(), q5_quants(&b.qh, &b.qs)) };
        assert_eq!(got, b.quants(), "{b:?}");
    }
}

#[test]
fn q5_0_kernels_equal_the_reference_bit_for_bit() {
    if token().is_none() {
        return;
    }
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(72);
    let mut paths = [0usize; 2];
    for fill in FILLS {
        for nb in BLOCK_COUNTS {
            for _ in 0..8 {
                let w = q5_0_row(&mut r, nb, fill);
                let mut xs: Vec<Vec<u8>> = (0..4).map(|_| q8_0_row(&mut r, nb, fill)).collect();
                // Random rows nearly always hold a -128 quant somewhere (the exact products'
                // path); the same rows without it take the `sign` path.
                if matches!(fill, Fill::Random) {
                    let mut clean = xs.clone();
                    for row in &mut clean {
                        for b in row.chunks_mut(34) {
                            b[2..]
                                .iter_mut()
                                .filter(|q| **q == 0x80)
                                .for_each(|q| *q = 0x81);
                        }
                    }
                    xs.extend(clean);
                }
                let wb: &[BlockQ5_0] = blocks(&w);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for xs in xs.chunks_exact(4) {
                    let xb: [&[BlockQ8_0]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                    let want = xb.map(|x| reference_q5_0(wb, x));
                    let sign_ok = xb.iter().all(|x| sign_trick_exact(token().unwrap(), x));
                    paths[usize::from(sign_ok)] += 1;
                    for &t in &tokens {
                        let a = (t.avx512(), sign_ok);
                        let one = xb.map(|x| dot_q5_0_q8_0(t, wb, x));
                        let one_n = xb.map(|x| dot_q5_0_q8_0_xn(t, wb, [x])[0]);
                        let four = dot_q5_0_q8_0_xn(t, wb, xb);
                        let three = dot_q5_0_q8_0_xn(t, wb, [xb[0], xb[1], xb[2]]);
                        let exact4 = dot_q5_0_q8_0_xn_with(t, wb, xb, false);
                        assert_eq!(bits(&one), bits(&want), "one token {fill:?} nb={nb} {a:?}");
                        assert_eq!(bits(&one_n), bits(&want), "xn::<1> {fill:?} nb={nb} {a:?}");
                        assert_eq!(bits(&four), bits(&want), "xn::<4> {fill:?} nb={nb} {a:?}");
                        assert_eq!(bits(&three), bits(&want[..3]), "xn::<3> {fill:?} nb={nb}");
                        assert_eq!(bits(&exact4), bits(&want), "exact xn {fill:?} nb={nb}");
                    }
                }
            }
        }
    }
    assert!(
        paths[0] > 50 && paths[1] > 50,
        "both product paths tested: {paths:?}"
    );
}

#[test]
fn q5_1_kernels_equal_the_reference_bit_for_bit() {
    if token().is_none() {
        return;
    }
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(73);
    for fill in FILLS {
        for nb in BLOCK_COUNTS {
            for _ in 0..8 {
                let w = q5_1_row(&mut r, nb, fill);
                let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_1_row(&mut r, nb, fill)).collect();
                let wb: &[BlockQ5_1] = blocks(&w);
                let xb: [&[BlockQ8_1]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let want = xb.map(|x| reference_q5_1(wb, x));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for &t in &tokens {
                    let a = t.avx512();
                    let one = xb.map(|x| dot_q5_1_q8_1(t, wb, x));
                    let one_n = xb.map(|x| dot_q5_1_q8_1_xn(t, wb, [x])[0]);
                    let four = dot_q5_1_q8_1_xn(t, wb, xb);
                    let two = dot_q5_1_q8_1_xn(t, wb, [xb[0], xb[1]]);
                    assert_eq!(bits(&one), bits(&want), "one token {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&one_n), bits(&want), "xn::<1> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&four), bits(&want), "xn::<4> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&two), bits(&want[..2]), "xn::<2> {fill:?} nb={nb} {a}");
                }
            }
        }
    }
}

#[test]
fn k4_scales_mins_unpacks_as_scale_min_k4() {
    let mut r = Rng::new(64);
    for _ in 0..2000 {
        let packed: [u8; 12] = r.bytes(12).try_into().unwrap();
        let u = k4_scales_mins(&packed);
        let bytes: Vec<u8> = u.iter().flat_map(|w| w.to_le_bytes()).collect();
        for j in 0..8 {
            assert_eq!(
                (bytes[j], bytes[8 + j]),
                scale_min_k4(j, &packed),
                "{packed:?} {j}"
            );
        }
    }
}

#[test]
fn q5_k_kernels_equal_the_reference_bit_for_bit() {
    if token().is_none() {
        return;
    }
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(65);
    for fill in FILLS {
        for nb in BLOCK_COUNTS {
            for _ in 0..8 {
                let w = q5_k_row(&mut r, nb, fill);
                let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, fill)).collect();
                let wb: &[BlockQ5_K] = blocks(&w);
                let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let want = xb.map(|x| reference_q5_k(wb, x));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for &t in &tokens {
                    let a = t.avx512();
                    let one = xb.map(|x| dot_q5_k_q8_k(t, wb, x));
                    let one_n = xb.map(|x| dot_q5_k_q8_k_xn(t, wb, [x])[0]);
                    let four = dot_q5_k_q8_k_xn(t, wb, xb);
                    let two = dot_q5_k_q8_k_xn(t, wb, [xb[0], xb[1]]);
                    assert_eq!(bits(&one), bits(&want), "one token {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&one_n), bits(&want), "xn::<1> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&four), bits(&want), "xn::<4> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&two), bits(&want[..2]), "xn::<2> {fill:?} nb={nb} {a}");
                }
            }
        }
    }
}

#[test]
fn q4_k_kernels_equal_the_reference_bit_for_bit() {
    if token().is_none() {
        return;
    }
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(68);
    for fill in FILLS {
        for nb in BLOCK_COUNTS {
            for _ in 0..8 {
                let w = q4_k_row(&mut r, nb, fill);
                let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, fill)).collect();
                let wb: &[BlockQ4_K] = blocks(&w);
                let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
                let want = xb.map(|x| reference_q4_k(wb, x));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for &t in &tokens {
                    let a = t.avx512();
                    let one = xb.map(|x| dot_q4_k_q8_k(t, wb, x));
                    let one_n = xb.map(|x| dot_q4_k_q8_k_xn(t, wb, [x])[0]);
                    let four = dot_q4_k_q8_k_xn(t, wb, xb);
                    let two = dot_q4_k_q8_k_xn(t, wb, [xb[0], xb[1]]);
                    assert_eq!(bits(&one), bits(&want), "one token {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&one_n), bits(&want), "xn::<1> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&four), bits(&want), "xn::<4> {fill:?} nb={nb} {a}");
                    assert_eq!(bits(&two), bits(&want[..2]), "xn::<2> {fill:?} nb={nb} {a}");
                }
            }
        }
    }
}

/// `Kernels::vec_dot`, `matvec` (row counts that are not multiples of 8 or 16, row ranges not
/// starting at 0) and `matvec_tokens` of every x86 SIMD set equal the reference per row.
#[test]
fn q6_k_dispatch_equals_the_reference_bit_for_bit() {
    dispatch_equals_the_reference(GgmlType::Q6_K, 62, q6_k_row, q8_k_row, |w, x| {
        reference_q6_k(blocks(w), blocks(x))
    });
}

/// Row counts that are not multiples of 8 only: llama.cpp repacks the others (`repack.rs`).
#[test]
fn q4_k_dispatch_equals_the_reference_bit_for_bit() {
    dispatch_equals_the_reference(GgmlType::Q4_K, 69, q4_k_row, q8_k_row, |w, x| {
        reference_q4_k(blocks(w), blocks(x))
    });
}

#[test]
fn q5_k_dispatch_equals_the_reference_bit_for_bit() {
    dispatch_equals_the_reference(GgmlType::Q5_K, 66, q5_k_row, q8_k_row, |w, x| {
        reference_q5_k(blocks(w), blocks(x))
    });
}

#[test]
fn q5_0_dispatch_equals_the_reference_bit_for_bit() {
    dispatch_equals_the_reference(GgmlType::Q5_0, 74, q5_0_row, q8_0_row, |w, x| {
        reference_q5_0(blocks(w), blocks(x))
    });
}

#[test]
fn q5_1_dispatch_equals_the_reference_bit_for_bit() {
    dispatch_equals_the_reference(GgmlType::Q5_1, 75, q5_1_row, q8_1_row, |w, x| {
        reference_q5_1(blocks(w), blocks(x))
    });
}

/// The body of the `*_dispatch_*` tests: `row(rng, blocks, fill)` makes weight rows of `ty`,
/// `x_row` activation rows of its `vec_dot_type`, `reference(w_row, x_row)` is the dot they
/// must equal.
fn dispatch_equals_the_reference(
    ty: GgmlType,
    seed: u64,
    row: fn(&mut Rng, usize, Fill) -> Vec<u8>,
    x_row: fn(&mut Rng, usize, Fill) -> Vec<u8>,
    reference: fn(&[u8], &[u8]) -> f32,
) {
    if token().is_none() {
        return;
    }
    let simd: Vec<Kernels> = ["avx2", "avx512"]
        .iter()
        .filter_map(|n| Kernels::by_name(n))
        .collect();
    let mut r = Rng::new(seed);
    for fill in FILLS {
        for (nb, rows) in [(1usize, 3usize), (2, 17), (3, 9), (7, 21), (9, 33)] {
            let n = nb * ty.block_size();
            let rb = nb * ty.block_bytes();
            let w: Vec<u8> = (0..rows).flat_map(|_| row(&mut r, nb, fill)).collect();
            let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS)
                .map(|_| x_row(&mut r, nb, fill))
                .collect();
            let range = 1..rows;
            let want: Vec<Vec<u32>> = xs
                .iter()
                .map(|x| {
                    range
                        .clone()
                        .map(|i| reference(&w[i * rb..(i + 1) * rb], x))
                        .map(f32::to_bits)
                        .collect()
                })
                .collect();
            for k in &simd {
                let name = k.isa_name();
                for (t, x) in xs.iter().enumerate() {
                    for (j, i) in range.clone().enumerate() {
                        let one = k.vec_dot(ty, n, &w[i * rb..(i + 1) * rb], x);
                        assert_eq!(
                            one.to_bits(),
                            want[t][j],
                            "{name} {ty} vec_dot {fill:?} nb={nb}"
                        );
                    }
                    let mut y = vec![f32::NAN; range.len()];
                    k.matvec(ty, n, &w, x, range.clone(), &mut y);
                    let got: Vec<u32> = y.iter().map(|f| f.to_bits()).collect();
                    assert_eq!(
                        got, want[t],
                        "{name} {ty} matvec {fill:?} nb={nb} rows={rows}"
                    );
                }
                let mut got = vec![vec![f32::NAN; range.len()]; MATVEC_TOKENS];
                let [a, b, c, d] = &mut got[..] else {
                    unreachable!()
                };
                let done = k.matvec_tokens(
                    ty,
                    n,
                    &w,
                    std::array::from_fn(|t| &xs[t][..]),
                    range.clone(),
                    [a, b, c, d],
                );
                assert!(done, "{name}: matvec_tokens declined {ty}");
                for t in 0..MATVEC_TOKENS {
                    let g: Vec<u32> = got[t].iter().map(|f| f.to_bits()).collect();
                    assert_eq!(
                        g, want[t],
                        "{name} {ty} matvec_tokens {fill:?} nb={nb} token {t}"
                    );
                }
            }
        }
    }
}

/// Old (plain loop) against new kernels on the same data in one process: prefill-shaped (4
/// tokens, a matrix that stays in L2) and decode-shaped (one token, a matrix larger than the
/// caches). Prints best-of-several times and the ratios.
/// `cargo test --release -p edge-kernels --lib avx2_quants::tests::bench -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_q6_k() {
    use std::time::Instant;
    let Some(t) = token() else { return };
    let mut r = Rng::new(63);
    let best_of = |reps: usize, f: &mut dyn FnMut()| {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = Instant::now();
            f();
            best = best.min(s.elapsed().as_secs_f64());
        }
        best
    };
    // Prefill: 4 tokens x 256 rows of 2048 (430 KB of weights).
    let (rows, nb) = (256usize, 8usize);
    let rb = nb * 210;
    let w = q6_k_row(&mut r, rows * nb, Fill::Random);
    let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, Fill::Random)).collect();
    let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
    let mut y = vec![0.0f32; 4 * rows];
    let old = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            for k in 0..4 {
                y[k * rows + i] = reference_q6_k(blocks(wr), xb[k]);
            }
        }
        std::hint::black_box(&mut y);
    });
    let one = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            for k in 0..4 {
                y[k * rows + i] = dot_q6_k_q8_k(t, blocks(wr), xb[k]);
            }
        }
        std::hint::black_box(&mut y);
    });
    let four = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            let v = dot_q6_k_q8_k_xn(t, blocks(wr), xb);
            for k in 0..4 {
                y[k * rows + i] = v[k];
            }
        }
        std::hint::black_box(&mut y);
    });
    println!(
        "q6_k prefill 4 tok x {rows}x{}: old {:.1} us, new 1-token {:.1} us ({:.2}x), xn::<4> {:.1} us ({:.2}x)",
        nb * 256,
        old * 1e6,
        one * 1e6,
        old / one,
        four * 1e6,
        old / four
    );
    if let Some(t5) = Token::detect_avx512() {
        let four5 = best_of(20, &mut || {
            for (i, wr) in w.chunks_exact(rb).enumerate() {
                let v = dot_q6_k_q8_k_xn(t5, blocks(wr), xb);
                for k in 0..4 {
                    y[k * rows + i] = v[k];
                }
            }
            std::hint::black_box(&mut y);
        });
        let one5 = best_of(20, &mut || {
            for (i, wr) in w.chunks_exact(rb).enumerate() {
                for k in 0..4 {
                    y[k * rows + i] = dot_q6_k_q8_k_xn(t5, blocks(wr), [xb[k]])[0];
                }
            }
            std::hint::black_box(&mut y);
        });
        println!(
            "  avx512: xn::<4> {:.1} us ({:.2}x old, {:.2}x avx2 xn::<4>), xn::<1> {:.1} us ({:.2}x avx2 1-token)",
            four5 * 1e6,
            old / four5,
            four / four5,
            one5 * 1e6,
            one / one5
        );
    }
    // Decode: one token through a 32000 x 2048 output head (54 MB) via Kernels::matvec.
    let rows = 32000usize;
    let w = q6_k_row(&mut r, rows * nb, Fill::Random);
    let mut y = vec![0.0f32; rows];
    for k in [Kernels::avx2(), Kernels::avx512()].into_iter().flatten() {
        for _ in 0..2 {
            let s = best_of(5, &mut || {
                k.matvec(GgmlType::Q6_K, nb * 256, &w, &xs[0], 0..rows, &mut y);
                std::hint::black_box(&mut y);
            });
            println!("  decode matvec {}: {:.2} ms", k.isa_name(), s * 1e3);
        }
    }
    let k = Kernels::avx2().unwrap();
    let old = best_of(5, &mut || {
        for (yi, wr) in y.iter_mut().zip(w.chunks_exact(rb)) {
            *yi = reference_q6_k(blocks(wr), xb[0]);
        }
        std::hint::black_box(&mut y);
    });
    let new = best_of(5, &mut || {
        k.matvec(GgmlType::Q6_K, nb * 256, &w, &xs[0], 0..rows, &mut y);
        std::hint::black_box(&mut y);
    });
    if let Some(t5) = Token::detect_avx512() {
        let new5 = best_of(5, &mut || {
            for (yi, wr) in y.iter_mut().zip(w.chunks_exact(rb)) {
                *yi = dot_q6_k_q8_k_xn(t5, blocks(wr), [xb[0]])[0];
            }
            std::hint::black_box(&mut y);
        });
        let new2 = best_of(5, &mut || {
            for (yi, wr) in y.iter_mut().zip(w.chunks_exact(rb)) {
                *yi = dot_q6_k_q8_k(t, blocks(wr), xb[0]);
            }
            std::hint::black_box(&mut y);
        });
        println!(
            "  decode without matvec's prefetch: avx2 {:.2} ms, avx512 xn::<1> {:.2} ms",
            new2 * 1e3,
            new5 * 1e3
        );
    }
    println!(
        "q6_k decode {rows}x{} ({:.1} MB): old {:.2} ms ({:.2} GB/s), new matvec {:.2} ms ({:.2} GB/s), {:.2}x",
        nb * 256,
        w.len() as f64 / 1e6,
        old * 1e3,
        w.len() as f64 / old / 1e9,
        new * 1e3,
        w.len() as f64 / new / 1e9,
        old / new
    );
}

/// Q5_K: old (plain loop) against new kernels on the same data, as [`bench_q6_k`].
/// `cargo test --release -p edge-kernels --lib avx2_quants::tests::bench -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_q5_k() {
    use std::time::Instant;
    if token().is_none() {
        return;
    }
    let mut r = Rng::new(67);
    let best_of = |reps: usize, f: &mut dyn FnMut()| {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = Instant::now();
            f();
            best = best.min(s.elapsed().as_secs_f64());
        }
        best
    };
    let nb = 8usize;
    let rb = nb * 176;
    let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, Fill::Random)).collect();
    let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
    // Prefill: 4 tokens x 256 rows of 2048 (360 KB of weights).
    let rows = 256usize;
    let w = q5_k_row(&mut r, rows * nb, Fill::Random);
    let mut y = vec![0.0f32; 4 * rows];
    let old = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            for k in 0..4 {
                y[k * rows + i] = reference_q5_k(blocks(wr), xb[k]);
            }
        }
        std::hint::black_box(&mut y);
    });
    print!(
        "q5_k prefill 4 tok x {rows}x{}: old {:.1} us",
        nb * 256,
        old * 1e6
    );
    for t in [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
    {
        let one = best_of(20, &mut || {
            for (i, wr) in w.chunks_exact(rb).enumerate() {
                for k in 0..4 {
                    y[k * rows + i] = dot_q5_k_q8_k(t, blocks(wr), xb[k]);
                }
            }
            std::hint::black_box(&mut y);
        });
        let four = best_of(20, &mut || {
            for (i, wr) in w.chunks_exact(rb).enumerate() {
                let v = dot_q5_k_q8_k_xn(t, blocks(wr), xb);
                for k in 0..4 {
                    y[k * rows + i] = v[k];
                }
            }
            std::hint::black_box(&mut y);
        });
        print!(
            "; {}: 1-token {:.1} us ({:.2}x), xn::<4> {:.1} us ({:.2}x)",
            if t.avx512() { "avx512" } else { "avx2" },
            one * 1e6,
            old / one,
            four * 1e6,
            old / four
        );
    }
    println!();
    // Decode: one token through 16000 x 2048 (22.5 MB) via Kernels::matvec.
    let rows = 16000usize;
    let w = q5_k_row(&mut r, rows * nb, Fill::Random);
    let mut y = vec![0.0f32; rows];
    let old = best_of(5, &mut || {
        for (yi, wr) in y.iter_mut().zip(w.chunks_exact(rb)) {
            *yi = reference_q5_k(blocks(wr), xb[0]);
        }
        std::hint::black_box(&mut y);
    });
    print!("q5_k decode {rows}x{}: old {:.2} ms", nb * 256, old * 1e3);
    for k in [Kernels::avx2(), Kernels::avx512()].into_iter().flatten() {
        let new = best_of(5, &mut || {
            k.matvec(GgmlType::Q5_K, nb * 256, &w, &xs[0], 0..rows, &mut y);
            std::hint::black_box(&mut y);
        });
        print!(
            "; {} matvec {:.2} ms ({:.2}x)",
            k.isa_name(),
            new * 1e3,
            old / new
        );
    }
    println!();
}

/// Q4_K (the kernels for matrices llama.cpp does not repack): old against new, prefill-shaped.
/// `cargo test --release -p edge-kernels --lib avx2_quants::tests::bench -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_q4_k() {
    use std::time::Instant;
    let Some(t) = token() else { return };
    let mut r = Rng::new(70);
    let best_of = |reps: usize, f: &mut dyn FnMut()| {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = Instant::now();
            f();
            best = best.min(s.elapsed().as_secs_f64());
        }
        best
    };
    let (rows, nb) = (255usize, 8usize);
    let rb = nb * 144;
    let xs: Vec<Vec<u8>> = (0..4).map(|_| q8_k_row(&mut r, nb, Fill::Random)).collect();
    let xb: [&[BlockQ8_K]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
    let w = q4_k_row(&mut r, rows * nb, Fill::Random);
    let mut y = vec![0.0f32; 4 * rows];
    let old = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            for k in 0..4 {
                y[k * rows + i] = reference_q4_k(blocks(wr), xb[k]);
            }
        }
        std::hint::black_box(&mut y);
    });
    let one = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            for k in 0..4 {
                y[k * rows + i] = dot_q4_k_q8_k(t, blocks(wr), xb[k]);
            }
        }
        std::hint::black_box(&mut y);
    });
    let four = best_of(20, &mut || {
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            let v = dot_q4_k_q8_k_xn(t, blocks(wr), xb);
            for k in 0..4 {
                y[k * rows + i] = v[k];
            }
        }
        std::hint::black_box(&mut y);
    });
    println!(
        "q4_k prefill 4 tok x {rows}x{}: old {:.1} us, 1-token {:.1} us ({:.2}x), xn::<4> {:.1} us ({:.2}x)",
        nb * 256,
        old * 1e6,
        one * 1e6,
        old / one,
        four * 1e6,
        old / four
    );
}

/// Q5_0 and Q5_1: old (plain loop) against new kernels on the same data, prefill-shaped (4
/// tokens through SmolLM2-135M's 1536 x 576 matrix, in L2) and decode-shaped (one token
/// through 16000 x 2048 via `Kernels::matvec`).
/// `cargo test --release -p edge-kernels --lib avx2_quants::tests::bench_q5_ -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_q5_0_and_q5_1() {
    use std::time::Instant;
    if token().is_none() {
        return;
    }
    let best_of = |reps: usize, f: &mut dyn FnMut()| {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = Instant::now();
            f();
            best = best.min(s.elapsed().as_secs_f64());
        }
        best
    };
    let tokens: Vec<Token> = [Token::detect(), Token::detect_avx512()]
        .into_iter()
        .flatten()
        .collect();
    let mut r = Rng::new(76);
    macro_rules! bench {
        ($name:literal, $ty:expr, $row:ident, $xrow:ident, $wt:ty, $xt:ty, $reference:ident, $one:ident, $xn:ident) => {{
            let (rows, nb) = (1536usize, 18usize);
            let rb = nb * $ty.block_bytes();
            let w = $row(&mut r, rows * nb, Fill::Random);
            let xs: Vec<Vec<u8>> = (0..4).map(|_| $xrow(&mut r, nb, Fill::Random)).collect();
            let xb: [&[$xt]; 4] = std::array::from_fn(|k| blocks(&xs[k]));
            let mut y = vec![0.0f32; 4 * rows];
            let old = best_of(20, &mut || {
                for (i, wr) in w.chunks_exact(rb).enumerate() {
                    for k in 0..4 {
                        y[k * rows + i] = $reference(blocks::<$wt>(wr), xb[k]);
                    }
                }
                std::hint::black_box(&mut y);
            });
            print!(
                "{} prefill 4 tok x {rows}x{}: old {:.1} us",
                $name,
                nb * 32,
                old * 1e6
            );
            for &t in &tokens {
                let one = best_of(20, &mut || {
                    for (i, wr) in w.chunks_exact(rb).enumerate() {
                        for k in 0..4 {
                            y[k * rows + i] = $one(t, blocks(wr), xb[k]);
                        }
                    }
                    std::hint::black_box(&mut y);
                });
                let four = best_of(20, &mut || {
                    for (i, wr) in w.chunks_exact(rb).enumerate() {
                        let v = $xn(t, blocks(wr), xb);
                        for k in 0..4 {
                            y[k * rows + i] = v[k];
                        }
                    }
                    std::hint::black_box(&mut y);
                });
                print!(
                    "; {}: 1-token {:.1} us ({:.2}x), xn::<4> {:.1} us ({:.2}x)",
                    if t.avx512() { "avx512" } else { "avx2" },
                    one * 1e6,
                    old / one,
                    four * 1e6,
                    old / four
                );
            }
            println!();
            let (rows, nb) = (16000usize, 64usize);
            let rb = nb * $ty.block_bytes();
            let w = $row(&mut r, rows * nb, Fill::Random);
            let x = $xrow(&mut r, nb, Fill::Random);
            let xb: &[$xt] = blocks(&x);
            let mut y = vec![0.0f32; rows];
            let old = best_of(5, &mut || {
                for (yi, wr) in y.iter_mut().zip(w.chunks_exact(rb)) {
                    *yi = $reference(blocks(wr), xb);
                }
                std::hint::black_box(&mut y);
            });
            print!(
                "{} decode {rows}x{}: old {:.2} ms",
                $name,
                nb * 32,
                old * 1e3
            );
            for k in [Kernels::avx2(), Kernels::avx512()].into_iter().flatten() {
                let new = best_of(5, &mut || {
                    k.matvec($ty, nb * 32, &w, &x, 0..rows, &mut y);
                    std::hint::black_box(&mut y);
                });
                print!(
                    "; {} matvec {:.2} ms ({:.2}x)",
                    k.isa_name(),
                    new * 1e3,
                    old / new
                );
            }
            println!();
        }};
    }
    bench!(
        "q5_0",
        GgmlType::Q5_0,
        q5_0_row,
        q8_0_row,
        BlockQ5_0,
        BlockQ8_0,
        reference_q5_0,
        dot_q5_0_q8_0,
        dot_q5_0_q8_0_xn
    );
    bench!(
        "q5_1",
        GgmlType::Q5_1,
        q5_1_row,
        q8_1_row,
        BlockQ5_1,
        BlockQ8_1,
        reference_q5_1,
        dot_q5_1_q8_1,
        dot_q5_1_q8_1_xn
    );
}
