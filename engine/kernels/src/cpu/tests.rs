//! Tests of the public entry points: dispatch by type, errors, SIMD variants against the scalar
//! references, and a matvec timing (`--ignored`).

use super::block::{f16_le, f16_le_bytes};
use super::*;
use crate::testutil::Rng;

const ALL: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
];

fn bytes_of(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).unwrap() as usize
}

/// A random, well-formed weight row of `n` elements of `ty` (quantized from random floats).
fn weight_row(r: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; bytes_of(ty, n)];
    quantize_row(ty, &r.vec(n, 0.1), &mut b).unwrap();
    b
}

#[test]
fn f16_conversion_exhaustive() {
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let got = f16_bits_to_f32(h);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}"
        );
    }
}

/// Every type the table says the CPU computes with has a dequantizer, its activation type
/// a quantizer, and the pair a dot product (every kernel set this CPU has) on whole blocks.
#[test]
fn the_type_table_and_the_kernels_agree() {
    let mut r = Rng::new(3);
    for ty in GgmlType::weight_types().filter(|t| t.backends().cpu) {
        let n = 256;
        let xt = ty.vec_dot_type();
        let w = r.bytes(bytes_of(ty, n));
        let mut out = vec![0.0f32; n];
        dequantize_row(ty, &w, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let mut x = vec![0u8; bytes_of(xt, n)];
        quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap_or_else(|e| panic!("{xt}: {e}"));
        for k in Kernels::available() {
            let _ = k.vec_dot(ty, n, &w, &x);
        }
    }
}

#[test]
fn errors() {
    let mut out = [0.0f32; 32];
    assert!(matches!(
        dequantize_row(GgmlType::Unsupported(12), &[0; 144], &mut out),
        Err(KernelError::Unsupported { .. })
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Q4_1, &[0; 20], &mut out[..31]),
        Err(KernelError::NotBlockMultiple {
            n: 31,
            block: 32,
            ..
        })
    ));
    assert_eq!(
        dequantize_row(GgmlType::Q4_1, &[0; 19], &mut out),
        Err(KernelError::BufferTooSmall {
            op: "dequantize_row",
            ty: GgmlType::Q4_1,
            n: 32,
            need: 20,
            have: 19
        })
    );
    let mut dst = [0u8; 33];
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut dst),
        Err(KernelError::BufferTooSmall {
            need: 34,
            have: 33,
            ..
        })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Unsupported(6), &[0.0; 32], &mut [0u8; 64]),
        Err(KernelError::Unsupported { .. })
    ));
    // Longer buffers are fine: only the front is used.
    assert!(dequantize_row(GgmlType::Q8_0, &[0; 40], &mut out).is_ok());
    let e = KernelError::NotBlockMultiple {
        op: "x",
        ty: GgmlType::Q4_0,
        n: 3,
        block: 32,
    };
    assert_eq!(
        e.to_string(),
        "x: 3 elements is not a multiple of the q4_0 block size 32"
    );
}

#[test]
fn byte_api_is_alignment_agnostic() {
    // The same Q4_1 row at offsets 0 and 1 of a buffer decodes and dots identically.
    let mut r = Rng::new(100);
    let row = weight_row(&mut r, GgmlType::Q4_1, 64);
    let mut buf = vec![0u8; row.len() + 1];
    buf[1..].copy_from_slice(&row);
    let (mut a, mut b) = ([0.0f32; 64], [0.0f32; 64]);
    dequantize_row(GgmlType::Q4_1, &row, &mut a).unwrap();
    dequantize_row(GgmlType::Q4_1, &buf[1..], &mut b).unwrap();
    assert_eq!(a, b);
    let mut x = vec![0u8; bytes_of(GgmlType::Q8_1, 64)];
    quantize_row(GgmlType::Q8_1, &r.vec(64, 1.0), &mut x).unwrap();
    let mut xbuf = vec![0u8; x.len() + 3];
    xbuf[3..].copy_from_slice(&x);
    assert_eq!(
        vec_dot(GgmlType::Q4_1, 64, &row, &x),
        vec_dot(GgmlType::Q4_1, 64, &buf[1..], &xbuf[3..])
    );
}

#[test]
fn vec_dot_every_type_matches_dequantized() {
    let mut r = Rng::new(101);
    for ty in ALL {
        for nb in [1usize, 3, 18] {
            let n = nb * 32;
            let w = weight_row(&mut r, ty, n);
            let xt = ty.vec_dot_type();
            let mut x = vec![0u8; bytes_of(xt, n)];
            quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap();
            let (mut wd, mut xd) = (vec![0.0; n], vec![0.0; n]);
            dequantize_row(ty, &w, &mut wd).unwrap();
            dequantize_row(xt, &x, &mut xd).unwrap();
            let want: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let mag: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            let got = f64::from(vec_dot(ty, n, &w, &x));
            // Q4_1's m*s term uses the f16 s: a little looser.
            let tol = if ty == GgmlType::Q4_1 { 2e-3 } else { 1e-5 };
            assert!(
                (got - want).abs() <= tol * (1e-3 + mag),
                "{ty} nb={nb}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn matvec_rows_relative_output() {
    let mut r = Rng::new(102);
    let k = Kernels::scalar();
    for ty in ALL {
        let (n, nrows) = (96, 7);
        let w: Vec<u8> = (0..nrows).flat_map(|_| weight_row(&mut r, ty, n)).collect();
        let xt = ty.vec_dot_type();
        let mut x = vec![0u8; bytes_of(xt, n)];
        quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap();
        let rb = bytes_of(ty, n);
        let mut y = vec![f32::NAN; 4];
        k.matvec(ty, n, &w, &x, 2..6, &mut y);
        for (i, yi) in y.iter().enumerate() {
            let row = &w[(2 + i) * rb..(3 + i) * rb];
            assert_eq!(*yi, vec_dot(ty, n, row, &x), "{ty} row {}", 2 + i);
        }
        let mut none: Vec<f32> = vec![];
        k.matvec(ty, n, &w, &x, 3..3, &mut none);
    }
}

/// What `k`'s 8-token kernels give for row `r` (of `rb` bytes) of the `ty` matrix `w` with
/// the activation `x`, given the one-token result `one`: the same bits, but for Q8_0 where the
/// set keeps rows in the lanes (`q8_0_rows.rs`) and no activation of the call (`all`) has a
/// -128 quant, the blockwise order.
fn multi_token_want(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    rb: usize,
    r: usize,
    (x, all): (&[u8], &[Vec<u8>]),
    one: f32,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q6_K && k.x86_set() {
        let row = &w[r * rb..(r + 1) * rb];
        return super::q6_k_rows::dot_q6_k_q8_k_tiled(blocks(row), &blocks(x)[..row.len() / 210]);
    }
    #[cfg(target_arch = "x86_64")]
    if (ty == GgmlType::Q8_0 && k.q8_0_tokens_blockwise() || ty == GgmlType::Q5_0 && k.x86_set())
        && !all
            .iter()
            .any(|x| x.chunks(34).any(|b| b[2..].contains(&0x80)))
    {
        let row = &w[r * rb..(r + 1) * rb];
        return if ty == GgmlType::Q8_0 {
            super::q8_0_rows::dot_q8_0_q8_0_blockwise(blocks(row), &blocks(x)[..row.len() / 34])
        } else {
            super::q8_0_rows::dot_q5_0_q8_0_blockwise(blocks(row), &blocks(x)[..row.len() / 22])
        };
    }
    let _ = (k, ty, w, rb, r, x, all);
    one
}

/// The tokens a batch's 8-token groups leave (`matvec_tokens_batched`, 1 to 4 at a time as the
/// executor asks): Q6_K on the x86 sets in llama.cpp's batched order, bit for bit against its
/// reference ([`super::q6_k_rows::dot_q6_k_q8_k_tiled`]), on 8-row groups and rows left over;
/// declined without writing for other types and sets.
#[test]
fn batch_tail_takes_the_batched_order() {
    fn check<const N: usize>(k: &Kernels, r: &mut Rng, ty: GgmlType) {
        let (n, rows, range) = (768usize, 13usize, 2..13usize);
        let w: Vec<u8> = (0..rows).flat_map(|_| any_weight_row(r, ty, n)).collect();
        let xt = ty.vec_dot_type();
        let xs: Vec<Vec<u8>> = (0..N)
            .map(|_| {
                let mut b = vec![0u8; bytes_of(xt, n)];
                k.quantize_row(xt, &r.vec(n, 1.0), &mut b).unwrap();
                b
            })
            .collect();
        let mut got = vec![vec![f32::NAN; range.len()]; N];
        let mut it = got.iter_mut();
        let ys: [&mut [f32]; N] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
        let xq: [&[u8]; N] = std::array::from_fn(|t| &xs[t][..]);
        let done = k.matvec_tokens_batched(ty, n, &w, xq, range.clone(), ys);
        let x86 = ["avx2", "avx512"].contains(&k.isa_name());
        assert_eq!(
            done,
            x86 && ty == GgmlType::Q6_K,
            "{} {ty} N={N}",
            k.isa_name()
        );
        if !done {
            assert!(
                got.iter().flatten().all(|v| v.is_nan()),
                "declined but wrote"
            );
        }
        #[cfg(target_arch = "x86_64")]
        for (t, x) in xs.iter().enumerate().filter(|_| done) {
            let rb = bytes_of(ty, n);
            for (i, row) in range.clone().enumerate() {
                let want = super::q6_k_rows::dot_q6_k_q8_k_tiled(
                    blocks(&w[row * rb..(row + 1) * rb]),
                    blocks(x),
                );
                assert_eq!(
                    got[t][i].to_bits(),
                    want.to_bits(),
                    "{} N={N} token {t} row {row}",
                    k.isa_name()
                );
            }
        }
    }
    let mut r = Rng::new(78);
    for k in all_kernels() {
        for ty in [GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q8_0] {
            check::<1>(&k, &mut r, ty);
            check::<2>(&k, &mut r, ty);
            check::<3>(&k, &mut r, ty);
            check::<4>(&k, &mut r, ty);
        }
    }
}

/// The multi-token kernels give, for every token, exactly the bits of the one-token matvec, on
/// random rows of several lengths (including one block) and row ranges; without such a kernel
/// the call declines.
#[test]
fn matvec_tokens_and_rows_equal_one_dot_bit_for_bit() {
    let mut r = Rng::new(41);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for k in all_kernels() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::F16,
        ] {
            // Up to 8192: the Q8_0 kernels keep the tokens' scales in buffers sized 32, 128
            // and 512 blocks.
            for n in [32usize, 96, 576, 2048, 8192] {
                let rows = 7;
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| any_weight_row(&mut r, ty, n))
                    .collect();
                let xt = ty.vec_dot_type();
                let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS)
                    .map(|_| {
                        let mut b = vec![0u8; bytes_of(xt, n)];
                        k.quantize_row(xt, &r.vec(n, 1.0), &mut b).unwrap();
                        b
                    })
                    .collect();
                // An even and an odd number of rows (kernels take rows in pairs or eights).
                for range in [1..rows, 0..rows] {
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
                    // Two and three tokens (sessions decoding together) give the same bits
                    // where a kernel takes them.
                    let mut few = vec![vec![f32::NAN; range.len()]; 3];
                    let [a, b, c] = &mut few[..] else {
                        unreachable!()
                    };
                    let x3: [&[u8]; 3] = std::array::from_fn(|t| &xs[t][..]);
                    if k.matvec_tokens(ty, n, &w, x3, range.clone(), [a, b, c]) {
                        assert!(done, "{} {ty}: 3 tokens taken, 4 declined", k.isa_name());
                        for (f, g) in few.iter().zip(&got) {
                            assert_eq!(bits(f), bits(g), "{} {ty} x3", k.isa_name());
                        }
                    }
                    let [a, b, _] = &mut few[..] else {
                        unreachable!()
                    };
                    a.fill(f32::NAN);
                    b.fill(f32::NAN);
                    let x2: [&[u8]; 2] = [&xs[2][..], &xs[3][..]];
                    if k.matvec_tokens(ty, n, &w, x2, range.clone(), [a, b]) {
                        for (f, g) in few.iter().zip(&got[2..]) {
                            assert_eq!(bits(f), bits(g), "{} {ty} x2", k.isa_name());
                        }
                    }
                    if !done {
                        assert!(
                            got.iter().flatten().all(|v| v.is_nan()),
                            "declined but wrote"
                        );
                        continue;
                    }
                    for (t, x) in xs.iter().enumerate() {
                        let mut want = vec![0.0f32; range.len()];
                        k.matvec(ty, n, &w, x, range.clone(), &mut want);
                        // matvec (several rows at once where a kernel exists) = one vec_dot per row.
                        let rb = bytes_of(ty, n);
                        for (i, r) in range.clone().enumerate() {
                            let one = k.vec_dot(ty, n, &w[r * rb..(r + 1) * rb], x);
                            assert_eq!(
                                one.to_bits(),
                                want[i].to_bits(),
                                "{} {ty} row {r}",
                                k.isa_name()
                            );
                        }
                        assert_eq!(
                            bits(&got[t]),
                            bits(&want),
                            "{} {ty} n={n} token {t}",
                            k.isa_name()
                        );
                    }
                }
            }
        }
    }
}

/// One-token IQ4_NL matvec on matrices llama.cpp repacks equals its repacked order
/// (`repack::dot_iq4_nl_q8_0`) bit for bit, on every set: with activations from the quantizer
/// and with -128 quants written in; 8-row groups, rows left over, ranges not starting at 0,
/// and rows of all -127 against activations of all 127 (the largest sums).
#[cfg(target_arch = "x86_64")] // the repacked order's reference is x86-only
#[test]
fn iq4_nl_decode_equals_the_repacked_order() {
    let mut r = Rng::new(313);
    let ty = GgmlType::IQ4_NL;
    let mut tested = 0;
    for k in all_kernels() {
        for (n, rows, range) in [
            (32usize, 16usize, 0..16usize),
            (576, 40, 3..40),
            (2048, 24, 8..21),
        ] {
            let rb = bytes_of(ty, n);
            for extreme in [false, true] {
                let w: Vec<u8> = if extreme {
                    // Index 0 is -127 in the table; scale 1.0.
                    (0..rows * n / 32)
                        .flat_map(|_| {
                            let mut b = f16_le_bytes(1.0).to_vec();
                            b.extend([0u8; 16]);
                            b
                        })
                        .collect()
                } else {
                    (0..rows)
                        .flat_map(|_| any_weight_row(&mut r, ty, n))
                        .collect()
                };
                let mut x = vec![0u8; bytes_of(GgmlType::Q8_0, n)];
                if extreme {
                    for b in x.chunks_mut(34) {
                        b[..2].copy_from_slice(&f16_le_bytes(1.0));
                        b[2..].fill(127);
                    }
                } else {
                    k.quantize_row(GgmlType::Q8_0, &r.vec(n, 1.0), &mut x)
                        .unwrap();
                }
                for min_quant in [false, true] {
                    let mut x = x.clone();
                    if min_quant {
                        x[2] = 0x80;
                        let last = x.len() - 1;
                        x[last] = 0x80;
                    }
                    let mut got = vec![f32::NAN; range.len()];
                    k.matvec(ty, n, &w, &x, range.clone(), &mut got);
                    for (i, g) in got.iter().enumerate() {
                        let row = range.start + i;
                        let want = super::repack::dot_iq4_nl_q8_0(
                            blocks(&w[row * rb..(row + 1) * rb]),
                            blocks(&x),
                        );
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{} n {n} row {row} extreme {extreme} -128 {min_quant}: {g} vs {want}",
                            k.isa_name()
                        );
                    }
                    tested += 1;
                }
            }
        }
    }
    assert!(tested >= 12);
}

/// The 8-token entry equals one token at a time, bit for bit (but for Q8_0 on AVX2 without
/// AVX-512: its blockwise order), on matrices llama.cpp repacks (16-row groups, a leftover
/// group of 8 and single rows, ranges not starting at 0), and declines what it has no kernel
/// for.
#[test]
fn matvec_tokens8_equals_one_token_at_a_time() {
    use super::MATVEC_TOKENS8;
    let mut r = Rng::new(77);
    for k in all_kernels() {
        for (ty, rows, range) in [
            (GgmlType::Q4_0, 16usize, 0..16usize),
            (GgmlType::Q4_0, 40, 0..40),
            (GgmlType::Q4_0, 40, 3..40),
            (GgmlType::Q4_0, 24, 5..21),
            // IQ4_NL: 8-row groups on AVX2, 16-row ones on AVX-512, leftover rows.
            (GgmlType::IQ4_NL, 16, 0..16),
            (GgmlType::IQ4_NL, 40, 3..40),
            // Q4_K (repacked shapes): one row with 8 tokens on AVX2.
            (GgmlType::Q4_K, 16, 0..16),
            (GgmlType::Q4_K, 40, 3..40),
            (GgmlType::Q4_1, 7, 0..7),
            (GgmlType::Q4_1, 40, 3..40),
            // IQ4_XS: one row with 8 tokens on AVX2, any row count.
            (GgmlType::IQ4_XS, 7, 0..7),
            (GgmlType::IQ4_XS, 40, 3..40),
            (GgmlType::Q5_1, 7, 0..7),
            (GgmlType::Q5_1, 40, 3..40),
            // Q5_0 takes rows in pairs: odd and even counts, ranges not starting at 0.
            (GgmlType::Q5_0, 7, 0..7),
            (GgmlType::Q5_0, 16, 0..16),
            (GgmlType::Q5_0, 24, 0..24),
            (GgmlType::Q5_0, 24, 5..21),
            (GgmlType::Q5_0, 24, 3..24),
            (GgmlType::Q8_0, 7, 0..7),
            (GgmlType::Q8_0, 16, 0..16),
            (GgmlType::Q8_0, 24, 0..24),
            (GgmlType::Q8_0, 24, 5..21),
            // Q6_K: llama.cpp's batched order, 8-row groups and rows left over.
            (GgmlType::Q6_K, 7, 0..7),
            (GgmlType::Q6_K, 40, 3..40),
        ] {
            // 7 blocks (odd) for Q5_0, which llama.cpp never repacks; 256 for the others.
            let n = if matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0) {
                224
            } else if matches!(ty, GgmlType::Q4_K | GgmlType::IQ4_XS | GgmlType::Q6_K) {
                // Three super-blocks.
                768
            } else {
                256
            };
            let xt = ty.vec_dot_type();
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| any_weight_row(&mut r, ty, n))
                .collect();
            let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS8)
                .map(|_| {
                    let mut b = vec![0u8; bytes_of(xt, n)];
                    k.quantize_row(xt, &r.vec(n, 1.0), &mut b).unwrap();
                    b
                })
                .collect();
            let mut got = vec![vec![f32::NAN; range.len()]; MATVEC_TOKENS8];
            let ys: Vec<&mut [f32]> = got.iter_mut().map(|v| &mut v[..]).collect();
            let ys: [&mut [f32]; MATVEC_TOKENS8] = ys.try_into().unwrap();
            let done = k.matvec_tokens8(
                ty,
                n,
                &w,
                std::array::from_fn(|t| &xs[t][..]),
                range.clone(),
                ys,
            );
            // Q5_0 and Q8_0 have an 8-token kernel in the AVX2 and AVX-512 sets (so that this
            // test checks them: no -128 quant in these activations, rows of at most 512 blocks),
            // IQ4_XS in the AVX2 set.
            assert!(
                done || !["avx2", "avx512"].contains(&k.isa_name())
                    || !matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0),
                "{} declined {ty}",
                k.isa_name()
            );
            assert!(
                done || k.isa_name() != "avx2" || !matches!(ty, GgmlType::IQ4_XS | GgmlType::Q4_K),
                "avx2 declined {ty}"
            );
            assert!(
                done || !["avx2", "avx512"].contains(&k.isa_name()) || ty != GgmlType::Q6_K,
                "{} declined {ty}",
                k.isa_name()
            );
            if !done {
                assert!(
                    got.iter().flatten().all(|v| v.is_nan()),
                    "declined but wrote"
                );
                continue;
            }
            for (t, x) in xs.iter().enumerate() {
                let mut want = vec![0.0f32; range.len()];
                k.matvec(ty, n, &w, x, range.clone(), &mut want);
                let rb = bytes_of(ty, n);
                let want: Vec<f32> = range
                    .clone()
                    .zip(&want)
                    .map(|(r, &one)| multi_token_want(&k, ty, &w, rb, r, (x, &xs), one))
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[t]),
                    bits(&want),
                    "{} {ty} rows {rows} token {t}",
                    k.isa_name()
                );
            }
        }
        // Q2_K has no 8-token kernel.
        let w = vec![0u8; bytes_of(GgmlType::Q2_K, 256)];
        let x = vec![0u8; bytes_of(GgmlType::Q8_K, 256)];
        let mut ys = [[0.0f32; 1]; MATVEC_TOKENS8];
        let [a, b, c, d, e, f, g, h] = &mut ys;
        assert!(!k.matvec_tokens8(
            GgmlType::Q2_K,
            256,
            &w,
            [&x[..]; MATVEC_TOKENS8],
            0..1,
            [a, b, c, d, e, f, g, h]
        ));
    }
}

#[test]
fn detect_honours_env_and_names() {
    assert_eq!(Kernels::scalar().isa_name(), "scalar");
    let k = Kernels::detect();
    assert!(["scalar", "avx2", "avx512", "neon", "neon+dotprod"].contains(&k.isa_name()));
    if std::env::var("EDGE_RUN_ISA").is_err() {
        assert_eq!(k.isa_name(), Kernels::best().isa_name());
    }
    if std::env::var("EDGE_RUN_Q8_ROUNDING").is_err() {
        assert_eq!(k.q8_rounding(), Q8Rounding::host());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let want = if Kernels::avx512().is_some() {
            "avx512"
        } else if Kernels::avx2().is_some() {
            "avx2"
        } else {
            "scalar"
        };
        assert_eq!(Kernels::best().isa_name(), want);
        assert_eq!(
            Kernels::avx512().is_some(),
            is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        let dot = std::arch::is_aarch64_feature_detected!("dotprod");
        let want = if dot { "neon+dotprod" } else { "neon" };
        assert_eq!(Kernels::best().isa_name(), want);
        assert_eq!(Kernels::by_name("neon").unwrap().isa_name(), want);
        assert_eq!(Kernels::neon_without_dotprod().unwrap().isa_name(), "neon");
        assert!(Kernels::by_name("avx2").is_none());
    }
    // Every name is accepted; a path this build or CPU lacks is None, an unknown name too.
    for name in ISA_NAMES {
        if let Some(k) = Kernels::by_name(name) {
            assert!(k.isa_name().starts_with(name), "{name}: {}", k.isa_name());
        }
    }
    assert_eq!(Kernels::by_name("scalar"), Some(Kernels::scalar()));
    assert!(Kernels::by_name("sse9").is_none());
    let names: Vec<&str> = Kernels::available().iter().map(|k| k.isa_name()).collect();
    assert_eq!(names[0], "scalar");
    assert!(names.contains(&Kernels::best().isa_name()));
}

/// Every available instruction set (on aarch64 with `dotprod`: both NEON variants).
fn all_kernels() -> Vec<Kernels> {
    Kernels::available()
}

#[test]
fn simd_quantize_bit_identical() {
    let mut r = Rng::new(103);
    for k in all_kernels() {
        for nb in [1usize, 2, 3, 5, 7, 17, 33, 48] {
            let n = nb * 32;
            let mut x = r.vec(n, 4.0);
            // Exact ties and special values: with amax = 127 per block, d = 1 and the inputs are
            // already the scaled values.
            for (i, b) in x.chunks_mut(32).enumerate() {
                b[0] = if i % 2 == 0 { 127.0 } else { -127.0 };
                b[1] = 0.5;
                b[2] = -0.5;
                b[3] = 2.5;
                b[4] = -3.5;
                b[5] = 0.49999997;
                b[6] = -0.0;
                b[7] = 126.5;
            }
            if nb > 3 {
                x[64..96].fill(0.0); // an all-zero block
                for v in &mut x[96..128] {
                    *v *= 1e-30; // d underflows f16 (stored 0) but quants use the f32 d
                }
            }
            for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
                let mut a = vec![0u8; bytes_of(ty, n)];
                let mut b = vec![0xAAu8; bytes_of(ty, n)];
                quantize_row(ty, &x, &mut a).unwrap();
                k.quantize_row(ty, &x, &mut b).unwrap();
                assert_eq!(a, b, "{} {ty} nb={nb}", k.isa_name());
                for r in FLAVOURS {
                    let s = Kernels::scalar().with_q8_rounding(r);
                    s.quantize_row(ty, &x, &mut a).unwrap();
                    k.with_q8_rounding(r).quantize_row(ty, &x, &mut b).unwrap();
                    assert_eq!(a, b, "{} {ty} nb={nb} {r:?}", k.isa_name());
                }
            }
            // Random scales (no forced ties).
            let y: Vec<f32> = r
                .vec(n, 1.0)
                .iter()
                .map(|v| v * 10f32.powi((v * 8.0) as i32))
                .collect();
            for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
                let mut a = vec![0u8; bytes_of(ty, n)];
                let mut b = vec![0u8; bytes_of(ty, n)];
                quantize_row(ty, &y, &mut a).unwrap();
                k.quantize_row(ty, &y, &mut b).unwrap();
                assert_eq!(a, b, "{} {ty} nb={nb} random", k.isa_name());
                for r in FLAVOURS {
                    let s = Kernels::scalar().with_q8_rounding(r);
                    s.quantize_row(ty, &y, &mut a).unwrap();
                    k.with_q8_rounding(r).quantize_row(ty, &y, &mut b).unwrap();
                    assert_eq!(a, b, "{} {ty} nb={nb} random {r:?}", k.isa_name());
                }
            }
        }
        // Non-quantized activation types go through the same entry point.
        let mut f = [0u8; 8];
        k.quantize_row(GgmlType::F16, &[1.0, 2.0, 3.0, 4.0], &mut f)
            .unwrap();
        assert_eq!(f, [0x00, 0x3C, 0x00, 0x40, 0x00, 0x42, 0x00, 0x44]);
    }
}

const FLAVOURS: [Q8Rounding; 3] = [
    Q8Rounding::GgmlRef,
    Q8Rounding::GgmlArm,
    Q8Rounding::GgmlX86,
];

#[test]
fn q8_rounding_flavours_hand() {
    // Block 0: amax = 0.3. 1/d = 423.33334 but 127/amax = 423.3333, so x86 scales 0.003543307 to
    // 1.4999999 (-> 1) where the others get the exact tie 1.5 (-> 2 away from zero, 2 to even).
    // Block 1: amax = 127, d = 1: exact ties 0.5, 2.5, -1.5, -0.5.
    let mut x = [0.0f32; 64];
    x[..3].copy_from_slice(&[0.3, 0.003543307, 0.0082677165]);
    x[32..37].copy_from_slice(&[127.0, 0.5, 2.5, -1.5, -0.5]);
    let want: [(Q8Rounding, [i8; 3], [i8; 5]); 3] = [
        (Q8Rounding::GgmlRef, [127, 2, 4], [127, 1, 3, -2, -1]),
        (Q8Rounding::GgmlArm, [127, 2, 4], [127, 0, 2, -2, 0]),
        (Q8Rounding::GgmlX86, [127, 1, 3], [127, 0, 2, -2, 0]),
    ];
    for k in all_kernels() {
        for (r, b0, b1) in want {
            let mut q0 = [0u8; 68];
            k.with_q8_rounding(r)
                .quantize_row(GgmlType::Q8_0, &x, &mut q0)
                .unwrap();
            let q: Vec<i8> = q0.iter().map(|&b| b as i8).collect();
            assert_eq!(&q[2..5], &b0, "{} {r:?}", k.isa_name());
            assert_eq!(&q[36..41], &b1, "{} {r:?}", k.isa_name());
            let mut q1 = [0u8; 72];
            k.with_q8_rounding(r)
                .quantize_row(GgmlType::Q8_1, &x, &mut q1)
                .unwrap();
            let q: Vec<i8> = q1.iter().map(|&b| b as i8).collect();
            assert_eq!(&q[4..7], &b0, "{} {r:?}", k.isa_name());
            assert_eq!(&q[40..45], &b1, "{} {r:?}", k.isa_name());
            // s = f16(sum(q) * d) for the second block, d = 1.
            let s: i32 = b1.iter().map(|&v| i32::from(v)).sum();
            assert_eq!(f16_le([q1[38], q1[39]]), s as f32, "{r:?}");
        }
    }
    assert_eq!(Q8Rounding::from_name("x86"), Some(Q8Rounding::GgmlX86));
    assert_eq!(Q8Rounding::from_name("even"), None);
    assert_eq!(Kernels::scalar().q8_rounding(), Q8Rounding::GgmlRef);
}

#[test]
fn simd_dots_match_scalar() {
    let mut r = Rng::new(104);
    for k in all_kernels() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for nb in [1usize, 2, 3, 5, 7, 18, 33, 48, 49] {
                let n = nb * 32;
                let xt = ty.vec_dot_type();
                // Random raw weight bytes (any nibble / any i8, incl. -128) with sane scales.
                let mut w = r.bytes(bytes_of(ty, n));
                let bb = ty.block_bytes();
                for blk in w.chunks_mut(bb) {
                    blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                    if ty == GgmlType::Q4_1 {
                        blk[2..4].copy_from_slice(&f16_le_bytes(r.f32(0.2)));
                    }
                }
                let mut x = vec![0u8; bytes_of(xt, n)];
                quantize_row(xt, &r.vec(n, 2.0), &mut x).unwrap();
                let want = vec_dot(ty, n, &w, &x);
                let got = k.vec_dot(ty, n, &w, &x);
                // Same exact per-block integers; only the f32 summation order differs.
                let (mut wd, mut xd) = (vec![0.0; n], vec![0.0; n]);
                dequantize_row(ty, &w, &mut wd).unwrap();
                dequantize_row(xt, &x, &mut xd).unwrap();
                let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                let ms: f32 = if ty == GgmlType::Q4_1 {
                    let (wb, xb): (&[BlockQ4_1], &[BlockQ8_1]) = (blocks(&w), blocks(&x));
                    wb.iter().zip(xb).map(|(a, b)| (a.m() * b.s()).abs()).sum()
                } else {
                    0.0
                };
                let tol = 1e-5 * (mag + ms) + 1e-6;
                assert!(
                    (got - want).abs() <= tol,
                    "{} {ty} nb={nb}: {got} vs {want}",
                    k.isa_name()
                );
                // And through matvec (2 rows).
                let w2 = [w.clone(), w.clone()].concat();
                let mut y = [0.0f32; 2];
                k.matvec(ty, n, &w2, &x, 0..2, &mut y);
                assert_eq!(y, [got, got]);
            }
        }
    }
}

/// On x86-64 the scalar set adds in ggml's AVX2 order (`ggml_order::dot_*_x86`), so it equals
/// the avx2 set bit for bit: every instruction-set path gives llama.cpp's tokens.
#[cfg(target_arch = "x86_64")]
#[test]
fn scalar_dots_follow_the_avx2_order_bit_for_bit() {
    let simd: Vec<Kernels> = ["avx2", "avx512"]
        .iter()
        .filter_map(|n| Kernels::by_name(n))
        .collect();
    if simd.is_empty() {
        eprintln!("no AVX2 on this CPU: skipped");
        return;
    }
    let scalar = Kernels::by_name("scalar").unwrap();
    let mut r = Rng::new(105);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for nb in [1usize, 2, 3, 7, 33, 48] {
            let n = nb * 32;
            let xt = ty.vec_dot_type();
            let mut w = r.bytes(bytes_of(ty, n));
            for blk in w.chunks_mut(ty.block_bytes()) {
                blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                if ty == GgmlType::Q4_1 {
                    blk[2..4].copy_from_slice(&f16_le_bytes(r.f32(0.2)));
                }
            }
            let mut x = vec![0u8; bytes_of(xt, n)];
            quantize_row(xt, &r.vec(n, 2.0), &mut x).unwrap();
            let a = scalar.vec_dot(ty, n, &w, &x);
            for k in &simd {
                let b = k.vec_dot(ty, n, &w, &x);
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} {ty} nb={nb}: {a} vs {b}",
                    k.isa_name()
                );
            }
        }
    }
}

#[test]
fn q8_0_extremes_exact() {
    // -128 * -128 and 127 * -128 in every lane: the SIMD path must not use the sign trick.
    let mut w = vec![0u8; 34 * 3];
    let mut x = vec![0u8; 34 * 3];
    for (i, (bw, bx)) in w.chunks_mut(34).zip(x.chunks_mut(34)).enumerate() {
        bw[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        bx[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        for j in 2..34 {
            bw[j] = if i == 1 { 127 } else { 0x80 };
            bx[j] = 0x80;
        }
    }
    let want = 2.0 * 32.0 * 16384.0 - 32.0 * 127.0 * 128.0;
    for k in all_kernels() {
        assert_eq!(
            k.vec_dot(GgmlType::Q8_0, 96, &w, &x),
            want,
            "{}",
            k.isa_name()
        );
    }
}

/// The AVX2 Q8_0 kernels take ggml's `sign`/`maddubs` products where no activation quant is
/// -128 and the exact ones where one is: with random weight bytes (-128 among them) and
/// activations quantized (never -128) or with a -128 put in, every path (one row, many rows,
/// 1-4 tokens) equals the scalar set bit for bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_0_sign_trick_paths_equal_scalar() {
    let scalar = Kernels::scalar();
    let mut r = Rng::new(77);
    let (n, rows) = (224usize, 11usize);
    let rb = bytes_of(GgmlType::Q8_0, n);
    let mut w = r.bytes(rb * rows);
    for blk in w.chunks_mut(34) {
        blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
    }
    assert!(
        w.chunks(34).any(|b| b[2..].contains(&0x80)),
        "no -128 weight"
    );
    for with_min in [false, true] {
        let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS)
            .map(|t| {
                let mut b = vec![0u8; rb];
                quantize_row(GgmlType::Q8_0, &r.vec(n, 2.0), &mut b).unwrap();
                assert!(!b.chunks(34).any(|q| q[2..].contains(&0x80)));
                if with_min && t == 2 {
                    b[34 * 3 + 7] = 0x80;
                }
                b
            })
            .collect();
        let want: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| {
                let mut y = vec![0.0; rows];
                scalar.matvec(GgmlType::Q8_0, n, &w, x, 0..rows, &mut y);
                y
            })
            .collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for k in all_kernels() {
            for (t, x) in xs.iter().enumerate() {
                let mut y = vec![0.0; rows];
                k.matvec(GgmlType::Q8_0, n, &w, x, 0..rows, &mut y);
                assert_eq!(
                    bits(&y),
                    bits(&want[t]),
                    "{} matvec token {t}",
                    k.isa_name()
                );
                let one = k.vec_dot(GgmlType::Q8_0, n, &w[rb..2 * rb], x);
                assert_eq!(
                    one.to_bits(),
                    want[t][1].to_bits(),
                    "{} vec_dot",
                    k.isa_name()
                );
            }
            let mut got = vec![vec![f32::NAN; rows]; MATVEC_TOKENS];
            let [a, b, c, d] = &mut got[..] else {
                unreachable!()
            };
            let x4 = std::array::from_fn(|t| &xs[t][..]);
            if k.matvec_tokens(GgmlType::Q8_0, n, &w, x4, 0..rows, [a, b, c, d]) {
                for t in 0..MATVEC_TOKENS {
                    assert_eq!(
                        bits(&got[t]),
                        bits(&want[t]),
                        "{} matvec_tokens token {t} (a -128 activation: {with_min})",
                        k.isa_name()
                    );
                }
            }
        }
    }
}

/// Seconds of the fastest and the mean of `reps` calls of `f`, after one untimed warm-up call.
fn time_calls(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    use std::time::Instant;
    f();
    let (mut best, mut total) = (f64::MAX, 0.0);
    for _ in 0..reps {
        let t = Instant::now();
        f();
        let s = t.elapsed().as_secs_f64();
        best = best.min(s);
        total += s;
    }
    (best, total / reps as f64)
}

/// `cargo test --release -p edge-kernels --lib cpu::tests::bench -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_matvec_q4_1() {
    use std::time::Instant;
    let mut r = Rng::new(105);
    // SmolLM2's matrices, and its Q8_0 output head.
    for (ty, rows, n) in [
        (GgmlType::Q4_1, 576usize, 1536usize),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 49152, 576),
        (GgmlType::Q8_0, 49152, 576),
    ] {
        let xt = ty.vec_dot_type();
        let mut w = r.bytes(bytes_of(ty, n) * rows);
        for blk in w.chunks_mut(ty.block_bytes()) {
            blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
        }
        let mut x = vec![0u8; bytes_of(xt, n)];
        quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap();
        let mut y = vec![0.0f32; rows];
        for k in all_kernels() {
            // The machine is shared: report the fastest call (least disturbed) and the mean.
            let reps = (200_000_000 / w.len()).max(5);
            let (best, mean) = time_calls(reps, || {
                k.matvec(ty, n, &w, &x, 0..rows, &mut y);
                std::hint::black_box(&mut y);
            });
            println!(
                "{ty} matvec {rows}x{n} ({:.2} MB) {:>6}: best {:8.1} us {:6.2} GB/s, mean {:6.2} GB/s",
                w.len() as f64 / 1e6,
                k.isa_name(),
                best * 1e6,
                w.len() as f64 / best / 1e9,
                w.len() as f64 / mean / 1e9
            );
        }
        for k in all_kernels() {
            let xf = r.vec(n, 1.0);
            let reps = 20_000;
            let t = Instant::now();
            for _ in 0..reps {
                k.quantize_row(xt, &xf, &mut x).unwrap();
                std::hint::black_box(&mut x);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!("{xt} quantize {n} {:>6}: {:8.2} us", k.isa_name(), s * 1e6);
        }
    }
}

/// The NEON kernels: both variants (`sdot` where the CPU has it, widening multiplies always)
/// equal the scalar emulation of ggml's NEON order bit for bit, on random and extreme blocks.
#[cfg(target_arch = "aarch64")]
mod neon_order {
    use super::super::neon::arm_order;
    use super::*;

    fn neon_kernels() -> Vec<Kernels> {
        let v: Vec<Kernels> = Kernels::available()
            .into_iter()
            .filter(|k| k.isa_name().starts_with("neon"))
            .collect();
        // qemu-aarch64 (`-cpu max`, its user-mode default) and Orin both have dotprod; a
        // machine without it still tests the widening variant.
        eprintln!(
            "NEON variants tested: {:?} (dotprod detected: {})",
            v.iter().map(|k| k.isa_name()).collect::<Vec<_>>(),
            std::arch::is_aarch64_feature_detected!("dotprod")
        );
        assert!(!v.is_empty());
        v
    }

    /// Raw random blocks of `ty` (any nibble / any i8) with random scales; `extreme` makes every
    /// weight quant the most negative value (-128 for q8_0, nibble 0 = -8 for q4_0), puts
    /// -128 in the activations and zeroes some scales.
    fn rows(r: &mut Rng, ty: GgmlType, nb: usize, extreme: bool) -> (Vec<u8>, Vec<u8>) {
        let n = nb * 32;
        let xt = ty.vec_dot_type();
        let mut w = r.bytes(bytes_of(ty, n));
        for (i, blk) in w.chunks_mut(ty.block_bytes()).enumerate() {
            let d = if extreme && i % 3 == 1 {
                0.0
            } else {
                r.f32(0.05)
            };
            blk[..2].copy_from_slice(&f16_le_bytes(d));
            let q = if ty == GgmlType::Q4_1 {
                blk[2..4].copy_from_slice(&f16_le_bytes(r.f32(0.2)));
                4
            } else {
                2
            };
            if extreme {
                let v = if ty == GgmlType::Q8_0 { 0x80 } else { 0x00 };
                blk[q..].fill(v);
            }
        }
        let mut x = vec![0u8; bytes_of(xt, n)];
        quantize_row(xt, &r.vec(n, 2.0), &mut x).unwrap();
        if extreme {
            let q = if xt == GgmlType::Q8_1 { 4 } else { 2 };
            for (i, blk) in x.chunks_mut(xt.block_bytes()).enumerate() {
                blk[q..].fill(0x80); // -128 everywhere
                if i % 4 == 2 {
                    blk[..2].fill(0); // d_x = 0
                }
            }
        }
        (w, x)
    }

    fn emulated(ty: GgmlType, w: &[u8], x: &[u8]) -> f32 {
        match ty {
            GgmlType::Q4_1 => arm_order::dot_q4_1(blocks(w), blocks(x)),
            GgmlType::Q4_0 => arm_order::dot_q4_0(blocks(w), blocks(x)),
            _ => arm_order::dot_q8_0(blocks(w), blocks(x)),
        }
    }

    #[test]
    fn dots_follow_ggml_neon_order_bit_for_bit() {
        let mut r = Rng::new(200);
        let ks = neon_kernels();
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for nb in [1usize, 2, 3, 4, 7, 33, 48] {
                for extreme in [false, true] {
                    let (w, x) = rows(&mut r, ty, nb, extreme);
                    let n = nb * 32;
                    let want = emulated(ty, &w, &x);
                    for k in &ks {
                        let got = k.vec_dot(ty, n, &w, &x);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {ty} nb={nb} extreme={extreme}: {got} vs {want}",
                            k.isa_name()
                        );
                    }
                    // And close to the scalar reference (another order).
                    let s = vec_dot(ty, n, &w, &x);
                    let (mut wd, mut xd) = (vec![0.0; n], vec![0.0; n]);
                    dequantize_row(ty, &w, &mut wd).unwrap();
                    dequantize_row(ty.vec_dot_type(), &x, &mut xd).unwrap();
                    let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                    let ms: f32 = if ty == GgmlType::Q4_1 {
                        let (wb, xb): (&[BlockQ4_1], &[BlockQ8_1]) = (blocks(&w), blocks(&x));
                        wb.iter().zip(xb).map(|(a, b)| (a.m() * b.s()).abs()).sum()
                    } else {
                        0.0
                    };
                    assert!(
                        (want - s).abs() <= 1e-5 * (mag + ms) + 1e-6,
                        "{ty} nb={nb} extreme={extreme}: {want} vs scalar {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn extreme_integers_are_exact() {
        // Q8_0 weights and activations all -128 with d = 1: every lane of every block is
        // 8 * 16384; 33 blocks sum exactly to 33 * 32 * 16384. Q4_0 nibble 0 (-8) times -128.
        let nb = 33;
        let mut w = vec![0u8; 34 * nb];
        let mut x = vec![0u8; 34 * nb];
        for (bw, bx) in w.chunks_mut(34).zip(x.chunks_mut(34)) {
            bw[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
            bx[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
            bw[2..].fill(0x80);
            bx[2..].fill(0x80);
        }
        let mut w4 = vec![0u8; 18 * nb];
        for b in w4.chunks_mut(18) {
            b[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        }
        for k in neon_kernels() {
            assert_eq!(
                k.vec_dot(GgmlType::Q8_0, 32 * nb, &w, &x),
                (nb * 32 * 16384) as f32,
                "{}",
                k.isa_name()
            );
            assert_eq!(
                k.vec_dot(GgmlType::Q4_0, 32 * nb, &w4, &x),
                (nb * 32 * 8 * 128) as f32,
                "{}",
                k.isa_name()
            );
        }
    }

    #[test]
    fn default_rounding_is_arm() {
        assert_eq!(Q8Rounding::host(), Q8Rounding::GgmlArm);
        if std::env::var("EDGE_RUN_Q8_ROUNDING").is_err() {
            assert_eq!(Kernels::detect().q8_rounding(), Q8Rounding::GgmlArm);
        }
    }
}

/// Decode-like streaming of a weight matrix larger than the caches (700 MB of Q4_0): the
/// bandwidth each kernel set reaches on one thread (`--ignored`, prints only).
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_matvec_q4_0_dram() {
    use std::time::Instant;
    let n = 2048;
    let rows = 700_000_000 / bytes_of(GgmlType::Q4_0, n);
    let mut r = Rng::new(7);
    let row = weight_row(&mut r, GgmlType::Q4_0, n);
    let w: Vec<u8> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let mut x = vec![0u8; bytes_of(GgmlType::Q8_0, n)];
    quantize_row(GgmlType::Q8_0, &r.vec(n, 1.0), &mut x).unwrap();
    let mut y = vec![0.0f32; rows];
    for k in all_kernels() {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            k.matvec(GgmlType::Q4_0, n, &w, &x, 0..rows, &mut y);
            std::hint::black_box(&mut y);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "q4_0 matvec {rows}x{n} ({:.0} MB) {:>6}: {:6.2} GB/s",
            w.len() as f64 / 1e6,
            k.isa_name(),
            w.len() as f64 / best / 1e9
        );
    }
}

/// A per-type choice of the 256-bit kernels inside an AVX-512 set (what the engine's kernel
/// tuning picks by measurement) gives the same bits as the AVX-512 kernels, in both phases, on
/// matrices llama.cpp repacks (16 and 24 rows) and on ones it does not (7 rows). Every set this
/// CPU runs is checked: one without AVX-512 has no choice, so asking for the 256-bit kernels
/// must leave it exactly as it is (CI's machines vary; some have no AVX-512).
#[test]
fn choosing_256_bit_kernels_per_type_keeps_the_bits() {
    let sets = Kernels::available();
    assert!(!sets.is_empty());
    for k in sets {
        if k.has_256_bit_alternative() {
            check_256_bit_choice_keeps_the_bits(k);
            continue;
        }
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::F16,
        ] {
            for phase in [Phase::Decode, Phase::Prefill] {
                let asked = k.with_256_bit(ty, phase, true);
                assert_eq!(
                    asked,
                    k,
                    "{}: {ty} {phase:?} changed a set without AVX-512",
                    k.isa_name()
                );
                assert_eq!(asked.isa_name_for(ty, phase), k.isa_name());
            }
        }
    }
}

fn check_256_bit_choice_keeps_the_bits(wide: Kernels) {
    let mut r = Rng::new(77);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        let narrow =
            wide.with_256_bit(ty, Phase::Decode, true)
                .with_256_bit(ty, Phase::Prefill, true);
        assert_eq!(narrow.isa_name_for(ty, Phase::Decode), "avx2");
        assert_eq!(narrow.isa_name_for(ty, Phase::Prefill), "avx2");
        assert_eq!(narrow.isa_name_for(GgmlType::F16, Phase::Decode), "avx512");
        assert_eq!(
            narrow.with_256_bit(ty, Phase::Decode, false),
            wide.with_256_bit(ty, Phase::Prefill, true)
        );
        let n = 512;
        for rows in [7usize, 16, 24] {
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| any_weight_row(&mut r, ty, n))
                .collect();
            let xt = ty.vec_dot_type();
            let xs: Vec<Vec<u8>> = (0..MATVEC_TOKENS8)
                .map(|_| {
                    let mut b = vec![0u8; bytes_of(xt, n)];
                    wide.quantize_row(xt, &r.vec(n, 1.0), &mut b).unwrap();
                    b
                })
                .collect();
            let run = |k: &Kernels| {
                let mut one = vec![0f32; rows];
                k.matvec(ty, n, &w, &xs[0], 0..rows, &mut one);
                let mut four = vec![vec![f32::NAN; rows]; MATVEC_TOKENS];
                let [a, b, c, d] = &mut four[..] else {
                    unreachable!()
                };
                let x4 = std::array::from_fn(|t| &xs[t][..]);
                let did4 = k.matvec_tokens(ty, n, &w, x4, 0..rows, [a, b, c, d]);
                let mut eight = vec![vec![f32::NAN; rows]; MATVEC_TOKENS8];
                let [a, b, c, d, e, f, g, h] = &mut eight[..] else {
                    unreachable!()
                };
                let x8 = std::array::from_fn(|t| &xs[t][..]);
                let did8 = k.matvec_tokens8(ty, n, &w, x8, 0..rows, [a, b, c, d, e, f, g, h]);
                (
                    bits(&one),
                    did4.then(|| four.concat()),
                    did8.then(|| eight.concat()),
                )
            };
            let (w1, w4, w8) = run(&wide);
            let (n1, n4, n8) = run(&narrow);
            assert_eq!(w1, n1, "{ty} {rows} rows: one token");
            if let (Some(a), Some(b)) = (&w4, &n4) {
                assert_eq!(bits(a), bits(b), "{ty} {rows} rows: 4 tokens");
            }
            // The 256-bit choice has 8-token kernels for Q5_0 and Q8_0 only (the AVX2 set's);
            // the others it declines, and the caller's 4-token path gives the same bits.
            assert!(
                n8.is_none() || matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0),
                "{ty}: 8-token kernel on the 256-bit choice"
            );
            if let (Some(a), Some(b)) = (&n8, &w8) {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "{ty} {rows} rows: 8 tokens, 256 vs 512 bits"
                );
            }
            if let (Some(a), Some(b)) = (&w8, &n4) {
                assert_eq!(
                    bits(&a[..4 * rows]),
                    bits(b),
                    "{ty} {rows} rows: 8 vs 4 tokens"
                );
            }
        }
    }
}

/// A weight row of any type: quantized from random floats where a quantizer exists, else
/// (k-quants, Q5_0, Q5_1, IQ4_NL, IQ4_XS) random bytes with finite f16 scales where the block
/// keeps them.
fn any_weight_row(r: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        _ => return weight_row(r, ty, n),
    };
    let mut b = r.bytes(bytes_of(ty, n));
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &o in scale_offsets {
            blk[o..o + 2].copy_from_slice(&f16_le_bytes(r.f32(0.01)));
        }
    }
    b
}

/// Four activation rows at once (a prompt chunk of 4, or 4 sessions decoding together) on
/// SmolLM2's matrices (1536 x 576 stays in cache, 49152 x 576 is read from memory), against
/// four one-row calls (`--ignored`, prints only).
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_matvec_tokens4() {
    use std::time::Instant;
    let mut r = Rng::new(106);
    for (ty, rows, n) in [
        (GgmlType::Q4_1, 1536usize, 576usize),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q4_1, 49152, 576),
        (GgmlType::Q5_0, 1536, 576),
        (GgmlType::Q5_0, 49152, 576),
        (GgmlType::Q8_0, 1536, 576),
        (GgmlType::Q8_0, 49152, 576),
    ] {
        let xt = ty.vec_dot_type();
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| any_weight_row(&mut r, ty, n))
            .collect();
        let xs: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                let mut x = vec![0u8; bytes_of(xt, n)];
                quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap();
                x
            })
            .collect();
        let mut ys = vec![vec![0.0f32; rows]; 4];
        for k in all_kernels() {
            let reps = (100_000_000 / w.len()).max(5);
            let time = |f: &mut dyn FnMut()| {
                f();
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t = Instant::now();
                    f();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                best
            };
            let one = time(&mut || {
                for (x, y) in xs.iter().zip(ys.iter_mut()) {
                    k.matvec(ty, n, &w, x, 0..rows, y);
                }
            });
            let four = time(&mut || {
                let [a, b, c, d] = &mut ys[..] else {
                    unreachable!()
                };
                let x4 = [&xs[0][..], &xs[1][..], &xs[2][..], &xs[3][..]];
                if !k.matvec_tokens::<4>(ty, n, &w, x4, 0..rows, [a, b, c, d]) {
                    for (x, y) in xs.iter().zip(ys.iter_mut()) {
                        k.matvec(ty, n, &w, x, 0..rows, y);
                    }
                }
            });
            // Eight tokens (prefill): the 8-token kernel where there is one, else two groups
            // of four (the results are the same bits; this is only the time).
            let mut ys8 = vec![vec![0.0f32; rows]; 8];
            let eight = time(&mut || {
                let x8: [&[u8]; 8] = std::array::from_fn(|t| &xs[t % 4][..]);
                let [a, b, c, d, e, f, g, h] = &mut ys8[..] else {
                    unreachable!()
                };
                if !k.matvec_tokens8(ty, n, &w, x8, 0..rows, [a, b, c, d, e, f, g, h]) {
                    for half in ys8.chunks_mut(4) {
                        let [a, b, c, d] = half else { unreachable!() };
                        let x4 = [&xs[0][..], &xs[1][..], &xs[2][..], &xs[3][..]];
                        k.matvec_tokens::<4>(ty, n, &w, x4, 0..rows, [a, b, c, d]);
                    }
                }
            });
            println!(
                "{ty} {rows}x{n} {:>6}: 4 x matvec {:8.1} us, matvec_tokens::<4> {:8.1} us ({:.2} ns per row-block-token), matvec_tokens8 {:8.1} us ({:.2})",
                k.isa_name(),
                one * 1e6,
                four * 1e6,
                four * 1e9 / (rows * n / 32 * 4) as f64,
                eight * 1e6,
                eight * 1e9 / (rows * n / 32 * 8) as f64
            );
        }
    }
}

/// Random Q8_0 rows with every quant value -128..=127 (files may hold -128; ggml's quantizer
/// never writes it) and random positive scales.
fn raw_q8_0(r: &mut Rng, n_rows: usize, nb: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n_rows * nb * 34);
    for _ in 0..n_rows * nb {
        v.extend_from_slice(&f16_le_bytes(0.001 + r.f32(1.0).abs() * 0.02));
        v.extend(r.bytes(32));
    }
    v
}

/// The packed-panel prefill kernel against one token at a time. Q4_0 and IQ4_NL matrices with
/// rows a multiple of 8 (llama.cpp's repacked order, which the one-token kernels reproduce
/// there): bit for bit. Q8_0 and Q5_0 (ggml's 8-lane order one token at a time): the same
/// integer products, so the results differ by f32 rounding only. Bound: ggml's order rounds 8
/// lane products per block and adds them in a tree, the panels round one product per block;
/// both then add `nb` terms, so |a - b| <= 4 * (nb + 8) * 2^-24 * sum(|d_w * d_x * w * x|)
/// over every element (a wrong lane, row or bias is off by whole products). Rows: full panels,
/// a partial last panel, one row, ranges that do not start at row 0; blocks: 1, 7, 18
/// (SmolLM2), 64, 176 (one panel of a 5,632-wide row) and 256 (the most they hold).
#[test]
fn panels_match_one_token() {
    let mut r = Rng::new(211);
    let mut tested = 0;
    let mut worst = 0f64;
    for k in all_kernels() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
        ] {
            let exact = matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL);
            for (first, n_pack, nb) in [
                (0usize, 1usize, 1usize),
                (0, 16, 18),
                (3, 37, 64),
                (8, 64, 48),
                (1, 5, 7),
                (2, 16, 176),
                (0, 16, 256),
            ] {
                let n = nb * QK;
                // The whole matrix: rows a multiple of 8, past the packed ones.
                let n_rows = (first + n_pack).next_multiple_of(8) + 8;
                let w: Vec<u8> = if ty == GgmlType::Q8_0 {
                    raw_q8_0(&mut r, n_rows, nb)
                } else if ty == GgmlType::IQ4_XS {
                    // Any bytes are a valid IQ4_XS block, given a finite scale.
                    (0..n_rows * nb / 8)
                        .flat_map(|_| {
                            let mut b = f16_le_bytes(0.001 + r.f32(1.0).abs() * 0.01).to_vec();
                            b.extend(r.bytes(134));
                            b
                        })
                        .collect()
                } else {
                    (0..n_rows)
                        .flat_map(|_| any_weight_row(&mut r, ty, n))
                        .collect()
                };
                if !k.panels_for(ty, n, &w) {
                    continue;
                }
                assert!(n_pack <= panel_rows(nb));
                tested += 1;
                let xs: Vec<Vec<u8>> = (0..8)
                    .map(|_| {
                        if ty == GgmlType::IQ4_XS {
                            let mut x = vec![0u8; bytes_of(GgmlType::Q8_K, n)];
                            quantize_row(GgmlType::Q8_K, &r.vec(n, 1.0), &mut x).unwrap();
                            x
                        } else {
                            // Quants -127..=127, as the quantizer writes them (the AVX2
                            // kernel declines a -128: `avx2_panels_decline_a_min_quant`).
                            let mut x = raw_q8_0(&mut r, 1, nb);
                            for b in x.chunks_mut(34) {
                                for q in &mut b[2..] {
                                    *q = (*q as i8).max(-127) as u8;
                                }
                            }
                            x
                        }
                    })
                    .collect();
                let mut buf = vec![0f32; PANELS_SCRATCH_BYTES / 4];
                let mut p = Panels::new(&mut buf);
                k.pack_panels(ty, n, &w, first..first + n_pack, &mut p);
                assert_eq!(p.n_rows(), n_pack);
                let mut ys = vec![vec![f32::NAN; n_pack]; 8];
                {
                    let mut it = ys.iter_mut();
                    let y8: [&mut [f32]; 8] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
                    let x8: [&[u8]; 8] = std::array::from_fn(|t| &xs[t][..]);
                    assert!(k.matmul_panels8(&p, x8, y8));
                }
                let rb = bytes_of(ty, n);
                for (t, x) in xs.iter().enumerate() {
                    let mut want = vec![0f32; n_pack];
                    k.matvec(ty, n, &w, x, first..first + n_pack, &mut want);
                    // Activation j as a number.
                    let act = |j: usize| -> f64 {
                        if ty == GgmlType::IQ4_XS {
                            let xb: &[BlockQ8_K] = blocks(x);
                            xb[j / QK_K].d() as f64 * xb[j / QK_K].qs[j % QK_K] as f64
                        } else {
                            let xb: &[BlockQ8_0] = blocks(x);
                            f16_le(xb[j / QK].d) as f64 * xb[j / QK].qs[j % QK] as f64
                        }
                    };
                    for (row, (&got, &want)) in ys[t].iter().zip(&want).enumerate() {
                        let what = format!(
                            "{} {ty}: rows {first}+{n_pack} of {n_rows}, {nb} blocks, token {t}, \
                             row {row}: panels {got} one token {want}",
                            k.isa_name()
                        );
                        if exact {
                            assert_eq!(got.to_bits(), want.to_bits(), "{what}");
                            continue;
                        }
                        // IQ4_XS: the super-blockwise order exactly, on every set.
                        if ty == GgmlType::IQ4_XS {
                            let wr = &w[(first + row) * rb..(first + row + 1) * rb];
                            let exact = dot_iq4_xs_q8_k_superblockwise(blocks(wr), blocks(x));
                            assert_eq!(got.to_bits(), exact.to_bits(), "{what} (super-blockwise)");
                        }
                        // Q8_0 and Q5_0: the blockwise order exactly, on every set.
                        #[cfg(target_arch = "x86_64")]
                        if ty != GgmlType::IQ4_XS {
                            use super::q8_0_rows::{
                                dot_q5_0_q8_0_blockwise, dot_q8_0_q8_0_blockwise,
                            };
                            let wr = &w[(first + row) * rb..(first + row + 1) * rb];
                            let blockwise = if ty == GgmlType::Q5_0 {
                                dot_q5_0_q8_0_blockwise(blocks(wr), blocks(x))
                            } else {
                                dot_q8_0_q8_0_blockwise(blocks(wr), blocks(x))
                            };
                            assert_eq!(got.to_bits(), blockwise.to_bits(), "{what} (blockwise)");
                        }
                        let mut wf = vec![0f32; n];
                        let wr = &w[(first + row) * rb..(first + row + 1) * rb];
                        dequantize_row(ty, wr, &mut wf).unwrap();
                        let scale: f64 = (0..n).map(|j| (wf[j] as f64 * act(j)).abs()).sum();
                        let err = (got as f64 - want as f64).abs();
                        let bound = 4.0 * (nb + 8) as f64 * 2f64.powi(-24) * scale + 1e-30;
                        assert!(err <= bound, "{what} (bound {bound:e})");
                        worst = worst.max(err / bound);
                    }
                }
            }
        }
    }
    eprintln!(
        "panels: {tested} shapes tested, worst Q8_0/Q5_0/IQ4_XS error {worst:.3} of the bound"
    );
}

/// One IQ4_XS row with one Q8_K row in the panels' order (the reference both the AVX-512 and
/// the AVX2 panels are held to): per super-block, `sum_j sc_j * dot_j` over its 8 sub-blocks
/// in integers, then `acc = fma(d_w * d_x, isum, acc)`.
fn dot_iq4_xs_q8_k_superblockwise(w: &[iq4_xs::BlockIq4Xs], x: &[BlockQ8_K]) -> f32 {
    let mut acc = 0f32;
    for (bw, bx) in w.iter().zip(x) {
        let mut isum = 0i32;
        for j in 0..8 {
            let qs = &bw.qs[16 * j..16 * j + 16];
            let mut dot = 0i32;
            for (k, &q) in qs.iter().enumerate() {
                let lo = i32::from(iq4_nl::KVALUES_IQ4NL[usize::from(q & 0x0F)]);
                let hi = i32::from(iq4_nl::KVALUES_IQ4NL[usize::from(q >> 4)]);
                dot += lo * i32::from(bx.qs[32 * j + k]) + hi * i32::from(bx.qs[32 * j + 16 + k]);
            }
            isum += bw.scale(j) * dot;
        }
        acc = (f16_le(bw.d) * bx.d()).mul_add(isum as f32, acc);
    }
    acc
}

/// The AVX2 panels' sign trick needs activation quants other than -128 (the quantizer never
/// writes one): given one, the kernel declines and writes nothing, and the executor's other
/// kernels take the tokens.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_panels_decline_a_min_quant() {
    let mut r = Rng::new(5);
    let mut tested = 0;
    for k in all_kernels() {
        for ty in [GgmlType::Q8_0, GgmlType::IQ4_XS] {
            let (nb, n_rows) = (24, 32);
            let n = nb * QK;
            let w: Vec<u8> = if ty == GgmlType::Q8_0 {
                raw_q8_0(&mut r, n_rows, nb)
            } else {
                // Any bytes after a finite scale (a NaN one would write NaN).
                (0..n_rows * nb / 8)
                    .flat_map(|_| {
                        let mut b = f16_le_bytes(0.01).to_vec();
                        b.extend(r.bytes(134));
                        b
                    })
                    .collect()
            };
            if !k.panels_for(ty, n, &w) || k.panels_avx512(ty) {
                continue;
            }
            tested += 1;
            let x_ty = if ty == GgmlType::Q8_0 {
                GgmlType::Q8_0
            } else {
                GgmlType::Q8_K
            };
            let mut xs = vec![vec![0u8; bytes_of(x_ty, n)]; 8];
            for x in &mut xs {
                quantize_row(x_ty, &r.vec(n, 1.0), x).unwrap();
            }
            let mut buf = vec![0f32; PANELS_SCRATCH_BYTES / 4];
            let mut p = Panels::new(&mut buf);
            k.pack_panels(ty, n, &w, 0..n_rows, &mut p);
            // A quant byte of the first block, and one of the last (Q8_0: 34-byte blocks, the
            // quants after a 2-byte scale; Q8_K: a 4-byte scale, then 256 quants).
            let last = if ty == GgmlType::Q8_0 {
                34 * (nb - 1) + 33
            } else {
                bytes_of(x_ty, n) - bytes_of(x_ty, QK_K) + 4 + 255
            };
            for min_at in [None, Some((0, 4)), Some((7, last))] {
                let mut xs = xs.clone();
                if let Some((t, byte)) = min_at {
                    xs[t][byte] = 0x80;
                }
                let mut ys = vec![vec![f32::NAN; n_rows]; 8];
                let mut it = ys.iter_mut();
                let y8: [&mut [f32]; 8] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
                let x8: [&[u8]; 8] = std::array::from_fn(|t| &xs[t][..]);
                assert_eq!(
                    k.matmul_panels8(&p, x8, y8),
                    min_at.is_none(),
                    "{ty} {min_at:?}"
                );
                let written = ys.iter().flatten().filter(|y| !y.is_nan()).count();
                assert_eq!(written, if min_at.is_none() { 8 * n_rows } else { 0 });
            }
        }
    }
    if all_kernels().iter().any(|k| k.isa_name() == "avx2") {
        assert!(tested >= 2, "no AVX2 set ran the panels of both kinds");
    }
}

#[test]
fn simd_packing_matches_the_portable_packing() {
    // Any bytes are blocks of these types (a NaN or infinite scale is packed as it is); the
    // two packings must write the same bytes, padding rows included.
    let mut r = Rng::new(877);
    let mut tested = 0;
    for k in all_kernels() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
        ] {
            for (first, n_pack, nb) in [
                (0usize, 1usize, 8usize),
                (0, 16, 16),
                (3, 37, 64),
                (8, 64, 48),
                (1, 5, 24),
                (2, 16, 176),
                (2, 29, 100),
                (0, 16, 256),
                (5, 31, 8),
            ] {
                if ty == GgmlType::IQ4_XS && !nb.is_multiple_of(8) {
                    continue; // rows of whole super-blocks only
                }
                let n = nb * QK;
                let n_rows = (first + n_pack).next_multiple_of(8) + 8;
                let w = r.bytes(n_rows * bytes_of(ty, n));
                if !k.panels_for(ty, n, &w) {
                    continue;
                }
                tested += 1;
                let mut buf_a = vec![0f32; PANELS_SCRATCH_BYTES / 4];
                let mut buf_b = vec![1f32; PANELS_SCRATCH_BYTES / 4];
                let mut a = Panels::new(&mut buf_a);
                let mut b = Panels::new(&mut buf_b);
                k.pack_panels(ty, n, &w, first..first + n_pack, &mut a);
                k.pack_panels_portable(ty, n, &w, first..first + n_pack, &mut b);
                assert_eq!(a.n_rows(), n_pack);
                assert!(
                    a.packed_bytes() == b.packed_bytes(),
                    "{} {ty}: rows {first}+{n_pack}, {nb} blocks: the packings differ",
                    k.isa_name()
                );
            }
        }
    }
    if crate::cpu::panels_possible() {
        assert!(tested >= 30, "only {tested} shapes ran through the panels");
    }
}

/// One-token matvec speed per kernel set, one thread, in cache (0.15-1.3 MB) and from memory
/// (14-80 MB): what decode's kernels cost for the types of the benchmark matrix's files (Q4_K,
/// Q6_K, Q5_K; SmolLM2's shapes for Q5_0, Q5_1, Q4_1, Q8_0, IQ4_NL, IQ4_XS).
/// `cargo test --release -p edge-kernels --lib bench_decode_kquants -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_decode_kquants() {
    let mut r = Rng::new(7);
    for (ty, rows, n) in [
        (GgmlType::Q4_K, 256usize, 1024usize),
        (GgmlType::Q4_K, 32usize, 8192usize),
        (GgmlType::Q4_K, 3072 * 8, 1024),
        (GgmlType::Q4_K, 65536, 2048),
        (GgmlType::Q6_K, 256, 1024),
        (GgmlType::Q6_K, 3072 * 8, 1024),
        (GgmlType::Q5_K, 256, 1024),
        (GgmlType::Q5_K, 3072 * 8, 1024),
        (GgmlType::Q5_0, 1536, 576),
        (GgmlType::Q5_0, 131072, 576),
        (GgmlType::Q5_1, 1536, 576),
        (GgmlType::Q5_1, 131072, 576),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 131072, 576),
        (GgmlType::Q8_0, 1536, 576),
        (GgmlType::Q8_0, 131072, 576),
        (GgmlType::IQ4_NL, 1536, 576),
        (GgmlType::IQ4_NL, 131072, 576),
        (GgmlType::IQ4_XS, 1536, 1536),
        (GgmlType::IQ4_XS, 49152, 1536),
    ] {
        let xt = ty.vec_dot_type();
        let mut w = r.bytes(bytes_of(ty, n) * rows);
        for blk in w.chunks_mut(ty.block_bytes()) {
            match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                    blk[2..4].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                }
                GgmlType::Q6_K => {
                    let l = blk.len();
                    blk[l - 2..].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                }
                GgmlType::Q5_1 | GgmlType::Q4_1 => {
                    blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                    blk[2..4].copy_from_slice(&f16_le_bytes(r.f32(0.05)));
                }
                _ => blk[..2].copy_from_slice(&f16_le_bytes(r.f32(0.05))),
            }
        }
        let mut x = vec![0u8; bytes_of(xt, n)];
        quantize_row(xt, &r.vec(n, 1.0), &mut x).unwrap();
        let mut y = vec![0.0f32; rows];
        for k in all_kernels()
            .into_iter()
            .filter(|k| k.isa_name() != "scalar")
        {
            let reps = (400_000_000 / w.len()).max(8);
            let (best, _) = time_calls(reps, || {
                k.matvec(ty, n, &w, &x, 0..rows, &mut y);
                std::hint::black_box(&mut y);
            });
            println!(
                "{ty} {rows}x{n} ({:.2} MB) {:>6}: best {:8.1} us {:6.2} GB/s",
                w.len() as f64 / 1e6,
                k.isa_name(),
                best * 1e6,
                w.len() as f64 / best / 1e9,
            );
        }
    }
}

/// The AVX-512 Q5_K decode kernel (one and two rows) against the AVX2 one, bit for bit, on
/// random and extreme blocks (quants all 0 or all 31, scales and mins all 0 or 63, the largest
/// f16 `d` / `dmin`) and activations (all -128 or 127, the largest scale), every ordered pair.
#[cfg(target_arch = "x86_64")]
#[test]
fn q5_k_decode_rows_bit_identical_to_the_avx2_kernel() {
    use super::repack::tests::{q8_k_row, random_blocks, scale};
    let Some(t) = x86::Token::detect_avx512() else {
        return;
    };
    let mut r = Rng::new(49);
    for nb in [1usize, 2, 3, 5] {
        for extreme in [false, true] {
            let w = random_blocks(&mut r, 4 * nb, 176, |r, b| {
                let pick = r.next_u64();
                let huge = extreme && pick & 8 != 0;
                b[..2].copy_from_slice(&scale(r, huge));
                b[2..4].copy_from_slice(&scale(r, huge));
                if extreme {
                    b[4..16].fill(if pick & 1 == 0 { 0x00 } else { 0xFF });
                    b[16..48].fill(if pick & 2 == 0 { 0x00 } else { 0xFF });
                    b[48..].fill(if pick & 4 == 0 { 0x00 } else { 0xFF });
                }
            });
            let rows: Vec<&[q5_k::BlockQ5_K]> = w.chunks_exact(nb * 176).map(blocks).collect();
            for k in 0..2 {
                let x = q8_k_row(&mut r, nb, extreme && k == 1);
                let xb: &[BlockQ8_K] = blocks(&x);
                let want: Vec<u32> = rows
                    .iter()
                    .map(|row| avx2_quants::dot_q5_k_q8_k(t, row, xb).to_bits())
                    .collect();
                for a in 0..4 {
                    let [one] = avx2_quants::dot_q5_k_q8_k_rows(t, [rows[a]], xb);
                    assert_eq!(one.to_bits(), want[a], "nb={nb} {extreme} {k}");
                    for b in 0..4 {
                        let two = avx2_quants::dot_q5_k_q8_k_rows(t, [rows[a], rows[b]], xb);
                        assert_eq!(two.map(f32::to_bits), [want[a], want[b]], "pair nb={nb}");
                    }
                }
            }
        }
    }
}

/// Decode attention's f16 row kernels (one query head of 64 against 2,048 cached rows of 192
/// values, ggml's one-token order), per row: `cargo test --release -p edge-kernels --lib
/// bench_attention_rows -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark (prints timings): run with --ignored --nocapture"]
fn bench_attention_rows() {
    use super::ggml_order::{axpy_f16_rows, dot_f16_rows, STEP_LANES};
    use half::f16;
    let mut r = Rng::new(9);
    let (rows, stride, n) = (2048usize, 192usize, 64usize);
    let kv: Vec<f16> = (0..rows * stride)
        .map(|_| f16::from_f32(r.f32(1.0)))
        .collect();
    let q = r.vec(n, 1.0);
    let mut out = vec![0f32; rows];
    let (best, _) = time_calls(2000, || {
        dot_f16_rows(&kv, stride, 64, &q, &mut out, false);
        std::hint::black_box(&mut out);
    });
    println!(
        "dot_f16_rows: {:.1} ns per row ({:.1} cycles at 3.67 GHz)",
        best * 1e9 / rows as f64,
        best * 3.67e9 / rows as f64
    );
    let probs = r.vec(rows, 1.0);
    let mut accs = vec![0f32; STEP_LANES * n];
    let (best, _) = time_calls(2000, || {
        axpy_f16_rows(&mut accs, STEP_LANES, 0, &kv, stride, 64, &probs);
        std::hint::black_box(&mut accs);
    });
    println!(
        "axpy_f16_rows: {:.1} ns per row ({:.1} cycles at 3.67 GHz)",
        best * 1e9 / rows as f64,
        best * 3.67e9 / rows as f64
    );
}

/// The AVX2 Q8_0 / Q5_0 / IQ4_NL kernel with rows in the lanes (`q8_0_rows.rs`) against its
/// portable order (IQ4_NL: llama.cpp's repacked one, `repack::dot_iq4_nl_q8_0`), bit for bit: 1 to 8 tokens; row counts that fill 8-row groups and ones that leave 1
/// to 7 rows over; rows of 1 to 600 blocks (past the 512-block chunk whose sums carry over);
/// Q8_0 weights with -128 quants (exact: only the activations' sign matters), Q5_0 rows whose
/// values are all -16 and IQ4_NL rows of all -127 against activations of all 127 (Q5_0's i16
/// sums at their bound, 32,512), and random scales. A -128 activation quant is declined (the sign trick would wrap) without
/// writing.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_0_rows_match_their_portable_order() {
    use super::iq4_nl::BlockIq4Nl;
    use super::q5_0::BlockQ5_0;
    use super::q8_0_rows::{dot_q5_0_q8_0_blockwise, dot_q8_0_q8_0_blockwise, matvec};
    let Some(t) = x86::Token::detect() else {
        assert!(std::env::var_os("CI").is_none(), "CI machines have AVX2");
        return;
    };
    let t = t.without_avx512();
    let mut r = Rng::new(808);
    // kind: 0 Q8_0, 1 Q5_0, 2 IQ4_NL.
    fn check<const T: usize>(t: x86::Token, r: &mut Rng, rows: usize, nb: usize, kind: u8) {
        let q5 = kind == 1;
        let bb = [34, 22, 18][kind as usize];
        let w = if kind == 2 {
            let mut w = r.bytes(rows * nb * 18);
            for b in w.chunks_exact_mut(18) {
                b[..2].copy_from_slice(&f16_le_bytes(0.001 + r.f32(1.0).abs() * 0.02));
            }
            // Row 0 all -127 (index 0) against token 0's all 127 below.
            for b in w[..nb * 18].chunks_exact_mut(18) {
                b[2..].fill(0);
            }
            w
        } else if q5 {
            let mut w = raw_q5_0(r, rows, nb);
            // Row 0 all -16 (q = 0: no high bits, zero nibbles).
            for b in w[..nb * 22].chunks_exact_mut(22) {
                b[2..].fill(0);
            }
            w
        } else {
            let mut w = raw_q8_0(r, rows, nb);
            // Some -128 weight quants.
            w[2] = 0x80;
            let last = w.len() - 1;
            w[last] = 0x80;
            w
        };
        let xs: Vec<Vec<u8>> = (0..T)
            .map(|k| {
                let mut x = raw_q8_0(r, 1, nb);
                // Activations as the quantizer writes them: -127..=127; token 0 all 127.
                x.iter_mut()
                    .enumerate()
                    .filter(|(i, _)| i % 34 >= 2)
                    .for_each(|(_, q)| {
                        if k == 0 && kind != 0 {
                            *q = 0x7F
                        } else if *q == 0x80 {
                            *q = 0x81
                        }
                    });
                x
            })
            .collect();
        let run = |xs: &[Vec<u8>], ys: &mut Vec<Vec<f32>>| {
            let mut it = ys.iter_mut();
            let mut y: [&mut [f32]; T] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
            let x: [&[BlockQ8_0]; T] = std::array::from_fn(|k| blocks(&xs[k]));
            if kind == 2 {
                matvec::<BlockIq4Nl, T>(t, &w, nb * bb, x, &mut y)
            } else if q5 {
                matvec::<BlockQ5_0, T>(t, &w, nb * bb, x, &mut y)
            } else {
                matvec::<BlockQ8_0, T>(t, &w, nb * bb, x, &mut y)
            }
        };
        let mut ys = vec![vec![f32::NAN; rows]; T];
        assert!(run(&xs, &mut ys));
        for (k, y) in ys.iter().enumerate() {
            for (row, got) in y.iter().enumerate() {
                let wr = &w[row * nb * bb..(row + 1) * nb * bb];
                let want = if kind == 2 {
                    super::repack::dot_iq4_nl_q8_0(blocks(wr), blocks(&xs[k]))
                } else if q5 {
                    dot_q5_0_q8_0_blockwise(blocks(wr), blocks(&xs[k]))
                } else {
                    dot_q8_0_q8_0_blockwise(blocks(wr), blocks(&xs[k]))
                };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "kind {kind}: {T} tokens, {rows} rows of {nb} blocks: token {k} row {row}: {got} against {want}"
                );
            }
        }
        // One -128 activation quant: declined, nothing written.
        let mut bad = xs.clone();
        bad[T - 1][2 + 34 * (nb - 1) + 31] = 0x80;
        let mut ys = vec![vec![f32::NAN; rows]; T];
        assert!(!run(&bad, &mut ys));
        assert!(ys.iter().flatten().all(|v| v.is_nan()));
    }
    for kind in 0..3 {
        for (rows, nb) in [(1, 1), (8, 18), (13, 7), (37, 64), (16, 600), (5, 2)] {
            check::<1>(t, &mut r, rows, nb, kind);
            check::<2>(t, &mut r, rows, nb, kind);
            check::<3>(t, &mut r, rows, nb, kind);
            check::<4>(t, &mut r, rows, nb, kind);
            check::<8>(t, &mut r, rows, nb, kind);
        }
    }
}

/// `n_rows` rows of `nb` Q5_0 blocks: random quants, small positive scales.
#[cfg(target_arch = "x86_64")]
fn raw_q5_0(r: &mut Rng, n_rows: usize, nb: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n_rows * nb * 22);
    for _ in 0..n_rows * nb {
        v.extend_from_slice(&f16_le_bytes(0.001 + r.f32(1.0).abs() * 0.02));
        v.extend(r.bytes(20));
    }
    v
}
