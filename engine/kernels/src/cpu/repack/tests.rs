//! The repacked orders against the f64 dot and the AVX2 kernels against the portable ones, and
//! the random blocks and activation rows the other x86 row kernels' tests build on.

use super::super::block::{blocks, f16_le_bytes};
use super::super::q8_k::BlockQ8_K;
use super::*;
use crate::testutil::Rng;

/// `n` random blocks of `size` bytes; `fix` then sets each block's scale fields.
pub(in crate::cpu) fn random_blocks(
    r: &mut Rng,
    n: usize,
    size: usize,
    mut fix: impl FnMut(&mut Rng, &mut [u8]),
) -> Vec<u8> {
    let mut b = r.bytes(n * size);
    for blk in b.chunks_exact_mut(size) {
        fix(r, blk);
    }
    b
}

/// A finite f16 scale: random in magnitude (2^-14 .. 2^2) and sign, or the largest f16.
pub(in crate::cpu) fn scale(r: &mut Rng, extreme: bool) -> [u8; 2] {
    if extreme {
        return f16_le_bytes(65504.0);
    }
    let e = (r.next_u64() % 17) as i32 - 14;
    f16_le_bytes(r.f32(1.0) * 2f32.powi(e))
}

/// Q8_0 activations: random quants (-128 included) or all -128 / 127 (extreme).
pub(in crate::cpu) fn q8_0_row(r: &mut Rng, n: usize, extreme: bool) -> Vec<u8> {
    random_blocks(r, n, 34, |r, b| {
        b[..2].copy_from_slice(&scale(r, extreme));
        if extreme {
            let v = if r.next_u64() % 2 == 0 { 0x80 } else { 0x7F };
            b[2..].fill(v);
        }
    })
}

/// Q8_K activations with consistent `bsums`.
pub(in crate::cpu) fn q8_k_row(r: &mut Rng, n: usize, extreme: bool) -> Vec<u8> {
    random_blocks(r, n, 292, |r, b| {
        let d = if extreme { 3.0e38 } else { r.f32(0.05) };
        b[..4].copy_from_slice(&d.to_le_bytes());
        if extreme {
            b[4..260].fill(0x80);
        }
        for k in 0..16 {
            let s: i32 = b[4 + 16 * k..4 + 16 * k + 16]
                .iter()
                .map(|&v| i32::from(v as i8))
                .sum();
            b[260 + 2 * k..262 + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
        }
    })
}

/// The f64 dot of dequantized weights and activations, and the sum of |terms|.
pub(in crate::cpu) fn exact(
    w_ty: edge_gguf::GgmlType,
    w: &[u8],
    x_ty: edge_gguf::GgmlType,
    x: &[u8],
    n: usize,
) -> (f64, f64) {
    let (mut wf, mut xf) = (vec![0f32; n], vec![0f32; n]);
    super::super::dequantize_row(w_ty, w, &mut wf).unwrap();
    super::super::dequantize_row(x_ty, x, &mut xf).unwrap();
    let dot = wf
        .iter()
        .zip(&xf)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let mag = wf
        .iter()
        .zip(&xf)
        .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
        .sum();
    (dot, mag)
}

/// The repacked orders equal the f64 dot within rounding, and (where the CPU has AVX2) the
/// AVX2 kernels equal the portable ones bit for bit: random blocks with random scales, odd
/// block counts, extreme values (largest f16 scales, activations all -128 or 127).
#[test]
fn repacked_orders_exact_and_avx2_bit_identical() {
    use edge_gguf::GgmlType as T;
    let mut r = Rng::new(7);
    #[cfg(target_arch = "x86_64")]
    let token = super::super::x86::Token::detect();
    for nb in [1usize, 3, 7, 18] {
        for extreme in [false, true] {
            // Q4_0 and IQ4_NL (18-byte blocks, f16 scale first).
            for ty in [T::Q4_0, T::IQ4_NL] {
                let w = random_blocks(&mut r, nb, 18, |r, b| {
                    b[..2].copy_from_slice(&scale(r, extreme))
                });
                let x = q8_0_row(&mut r, nb, extreme);
                let got = if ty == T::Q4_0 {
                    dot_q4_0_q8_0(blocks(&w), blocks(&x))
                } else {
                    dot_iq4_nl_q8_0(blocks(&w), blocks(&x))
                };
                let (want, mag) = exact(ty, &w, T::Q8_0, &x, nb * 32);
                if want.is_finite() && mag.is_finite() && mag < 1e37 {
                    assert!((f64::from(got) - want).abs() <= 1e-6 * mag, "{ty} {nb}");
                }
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = token {
                    let simd = if ty == T::Q4_0 {
                        avx2::dot_q4_0_q8_0(t, blocks(&w), blocks(&x))
                    } else {
                        avx2::dot_iq4_nl_q8_0(t, blocks(&w), blocks(&x))
                    };
                    assert_eq!(simd.to_bits(), got.to_bits(), "{ty} nb={nb} {extreme}");
                    if ty == T::Q4_0 {
                        let x2 = q8_0_row(&mut r, nb, !extreme);
                        let [a, b] =
                            avx2::dot_q4_0_q8_0_xn(t, blocks(&w), [blocks(&x), blocks(&x2)]);
                        assert_eq!(a.to_bits(), got.to_bits());
                        let want2 = dot_q4_0_q8_0(blocks(&w), blocks(&x2));
                        assert_eq!(b.to_bits(), want2.to_bits());
                    }
                }
            }
            // Q2_K (f16 d and dmin last).
            let x = q8_k_row(&mut r, nb, extreme);
            let w = random_blocks(&mut r, nb, 84, |r, b| {
                b[80..82].copy_from_slice(&scale(r, extreme));
                b[82..].copy_from_slice(&scale(r, extreme));
            });
            let got = dot_q2_k_q8_k(blocks(&w), blocks(&x));
            let (want, mag) = exact(T::Q2_K, &w, T::Q8_K, &x, nb * 256);
            if !extreme {
                assert!((f64::from(got) - want).abs() <= 1e-6 * mag, "Q2_K {nb}");
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = token {
                let simd = avx2::dot_q2_k_q8_k(t, blocks(&w), blocks(&x));
                assert_eq!(simd.to_bits(), got.to_bits(), "Q2_K nb={nb} {extreme}");
            }
            // Q4_K (f16 d and dmin first).
            let w = random_blocks(&mut r, nb, 144, |r, b| {
                b[..2].copy_from_slice(&scale(r, extreme));
                b[2..4].copy_from_slice(&scale(r, extreme));
            });
            let xb: &[BlockQ8_K] = blocks(&x);
            let got = dot_q4_k_q8_k(blocks(&w), xb);
            let (want, mag) = exact(T::Q4_K, &w, T::Q8_K, &x, nb * 256);
            if !extreme {
                assert!((f64::from(got) - want).abs() <= 1e-6 * mag, "Q4_K {nb}");
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = token {
                let simd = avx2::dot_q4_k_q8_k(t, blocks(&w), xb);
                assert_eq!(simd.to_bits(), got.to_bits(), "Q4_K nb={nb} {extreme}");
            }
        }
    }
}

/// `Kernels::matvec` on x86-64 takes the repacked order for matrices of a multiple of 8 rows and
/// the `vec_dot` order otherwise, in every kernel set.
#[test]
fn matvec_picks_the_order_by_the_matrix_row_count() {
    use super::super::{Kernels, MATVEC_TOKENS};
    use edge_gguf::GgmlType as T;
    let mut r = Rng::new(11);
    let nb = 5;
    for (ty, size) in [
        (T::Q4_0, 18),
        (T::IQ4_NL, 18),
        (T::Q4_K, 144),
        (T::Q2_K, 84),
    ] {
        let (n, x) = if matches!(ty, T::Q4_K | T::Q2_K) {
            (nb * 256, q8_k_row(&mut r, nb, false))
        } else {
            (nb * 32, q8_0_row(&mut r, nb, false))
        };
        let row_bytes = nb * size;
        for rows in [7usize, 8, 16] {
            let w = random_blocks(&mut r, rows * nb, size, |r, b| {
                if size == 84 {
                    b[80..82].copy_from_slice(&scale(r, false));
                    b[82..].copy_from_slice(&scale(r, false));
                } else {
                    b[..2].copy_from_slice(&scale(r, false));
                }
                if size == 144 {
                    b[2..4].copy_from_slice(&scale(r, false));
                }
            });
            for k in Kernels::available() {
                let mut y = vec![0f32; rows - 1];
                k.matvec(ty, n, &w, &x, 1..rows, &mut y);
                // The multi-token kernel (where there is one) gives the same bits.
                let mut ys = vec![vec![f32::NAN; rows - 1]; MATVEC_TOKENS];
                let [a, b, c, d] = &mut ys[..] else {
                    unreachable!()
                };
                let xs = [&x[..]; MATVEC_TOKENS];
                if k.matvec_tokens(ty, n, &w, xs, 1..rows, [a, b, c, d]) {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for yt in &ys {
                        assert_eq!(bits(yt), bits(&y), "{} {ty} rows={rows}", k.isa_name());
                    }
                }
                for (i, got) in y.iter().enumerate() {
                    let wr = &w[(i + 1) * row_bytes..(i + 2) * row_bytes];
                    let want = if rows % 8 != 0 {
                        k.vec_dot(ty, n, wr, &x)
                    } else {
                        match ty {
                            T::Q4_0 => dot_q4_0_q8_0(blocks(wr), blocks(&x)),
                            T::IQ4_NL => dot_iq4_nl_q8_0(blocks(wr), blocks(&x)),
                            T::Q2_K => dot_q2_k_q8_k(blocks(wr), blocks(&x)),
                            _ => dot_q4_k_q8_k(blocks(wr), blocks(&x)),
                        }
                    };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} {ty} rows={rows} row {i}",
                        k.isa_name()
                    );
                }
            }
        }
    }
}
