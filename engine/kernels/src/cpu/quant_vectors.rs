//! The quantized types against test vectors made independently of this crate:
//! `tests/data/make-quant-vectors.py` builds random blocks of each type and dequantizes them with
//! gguf-py's numpy code (`gguf.quants.dequantize`), and quantizes random activations into Q8_K
//! with a numpy transcription of ggml's `quantize_row_q8_K_ref` (see the script's header).
//!
//! * dequantization must equal gguf-py's bit for bit (both compute each value as ggml does, in
//!   f32, with the same operation order);
//! * the Q8_K quantizer must produce the same bytes;
//! * every `vec_dot` (scalar reference, and the SIMD variants where they exist) must equal the
//!   f64 sum of gguf-py's dequantized weights times the dequantized activations, to a relative
//!   1e-5 of the sum of |terms| (the kernels sum in integers per block and in f32 across blocks;
//!   Q5_1's min term uses Q8_1's f16 `s`, whose rounding gets its own allowance), for rows of
//!   1, 3 and 7 blocks.

use super::block::f16_le;
use super::{dequantize_row, quantize_row, GgmlType, Kernels, QK_K};

struct Vectors {
    n_blocks: usize,
    block_elems: usize,
    raw: Vec<u8>,
    want: Vec<f32>,
}

fn data_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/quant-vectors")
}

fn u32_at(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn load(ty: GgmlType) -> Vectors {
    let path = data_dir().join(format!("{}.bin", ty.name()));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (n_blocks, block_elems, block_bytes) = (u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8));
    assert_eq!(
        (block_elems, block_bytes),
        (ty.block_size(), ty.block_bytes()),
        "{ty}: layout in the vector file"
    );
    let raw_end = 12 + n_blocks * block_bytes;
    assert_eq!(b.len(), raw_end + 4 * n_blocks * block_elems);
    Vectors {
        n_blocks,
        block_elems,
        raw: b[12..raw_end].to_vec(),
        want: f32s(&b[raw_end..]),
    }
}

/// (inputs, their Q8_K bytes as numpy made them).
fn activations() -> (Vec<f32>, Vec<u8>) {
    let b = std::fs::read(data_dir().join("q8_k-act.bin")).unwrap();
    let n = u32_at(&b, 0);
    (f32s(&b[4..4 + 4 * n]), b[4 + 4 * n..].to_vec())
}

pub(super) const WEIGHT_TYPES: [GgmlType; 9] = [
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

#[test]
fn dequantize_equals_gguf_py() {
    for ty in WEIGHT_TYPES {
        let v = load(ty);
        let mut got = vec![0.0f32; v.n_blocks * v.block_elems];
        dequantize_row(ty, &v.raw, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&v.want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {i}: {g} vs gguf-py {w}"
            );
        }
    }
}

#[test]
fn q8_k_quantizer_equals_numpy_reference() {
    let (x, want) = activations();
    let mut got = vec![0u8; want.len()];
    quantize_row(GgmlType::Q8_K, &x, &mut got).unwrap();
    for (b, (g, w)) in got.chunks(292).zip(want.chunks(292)).enumerate() {
        assert_eq!(g, w, "Q8_K block {b}");
    }
    let mut back = vec![0.0f32; x.len()];
    dequantize_row(GgmlType::Q8_K, &got, &mut back).unwrap();
    for (xb, bb) in x.chunks(QK_K).zip(back.chunks(QK_K)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, c) in xb.iter().zip(bb) {
            assert!((a - c).abs() <= amax / 127.0 * 0.5001 + 1e-12, "{a} vs {c}");
        }
    }
}

/// The activation row for `n` weights of `ty`: the first `n` test inputs quantized into
/// `ty.vec_dot_type()`, and its dequantized values.
fn activation_row(k: &Kernels, ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let xt = ty.vec_dot_type();
    let mut xq = vec![0u8; xt.row_bytes(x.len() as u64).unwrap() as usize];
    k.quantize_row(xt, x, &mut xq).unwrap();
    let mut xd = vec![0.0f32; x.len()];
    dequantize_row(xt, &xq, &mut xd).unwrap();
    (xq, xd)
}

/// Checks `k`'s vec_dot for every weight type and rows of 1, 3, 7 blocks; returns the largest
/// error relative to the sum of |terms|.
pub(super) fn check_vec_dot(k: &Kernels) -> f64 {
    let (x, _) = activations();
    let mut worst = 0.0f64;
    for ty in WEIGHT_TYPES {
        let v = load(ty);
        for nb in [1, 3, 7] {
            let n = nb * v.block_elems;
            let (xq, xd) = activation_row(k, ty, &x[..n]);
            let wd = &v.want[..n];
            let want: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let scale: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            // Q5_1 . Q8_1: the m * s term uses s = f16(d * sum q) (relative error <= 2^-11).
            let ms: f64 = if ty == GgmlType::Q5_1 {
                v.raw
                    .chunks(24)
                    .take(nb)
                    .zip(xq.chunks(36))
                    .map(|(w, a)| {
                        let m = f16_le([w[2], w[3]]);
                        let s = f16_le([a[2], a[3]]);
                        f64::from((m * s).abs())
                    })
                    .sum()
            } else {
                0.0
            };
            let got = f64::from(k.vec_dot(ty, n, &v.raw, &xq));
            let err = (got - want).abs();
            assert!(
                err <= 1e-5 * (1.0 + scale) + 1e-3 * ms,
                "{ty} x {} blocks ({}): {got} vs {want} (scale {scale})",
                nb,
                k.isa_name()
            );
            worst = worst.max(err / (1.0 + scale));
            // matvec over two identical rows gives the same numbers.
            let rb = ty.row_bytes(n as u64).unwrap() as usize;
            let mut w2 = v.raw[..rb].to_vec();
            w2.extend_from_slice(&v.raw[..rb]);
            let mut y = [0.0f32; 2];
            k.matvec(ty, n, &w2, &xq, 0..2, &mut y);
            assert_eq!(y, [got as f32, got as f32], "{ty} matvec");
        }
    }
    worst
}

#[test]
fn scalar_vec_dot_matches_f64_of_gguf_py_values() {
    let worst = check_vec_dot(&Kernels::scalar());
    eprintln!("scalar vec_dot: worst relative error {worst:.2e}");
}

#[test]
fn detected_vec_dot_matches_f64_of_gguf_py_values() {
    check_vec_dot(&Kernels::detect());
}

#[test]
fn new_types_reject_quantize_and_short_rows() {
    let mut out = vec![0u8; 210];
    assert!(quantize_row(GgmlType::Q6_K, &[0.0; 256], &mut out).is_err());
    let mut y = vec![0.0f32; 256];
    assert!(dequantize_row(GgmlType::Q6_K, &out[..209], &mut y).is_err());
    assert!(dequantize_row(GgmlType::Q4_K, &out, &mut y[..32]).is_err());
}

/// The detected kernels (AVX2 on x86-64 where present) against the scalar references on the same
/// random blocks: equal up to summation order (relative 1e-5 of the sum of |terms|).
#[test]
fn detected_vec_dot_matches_scalar_reference() {
    let (x, _) = activations();
    let (k, s) = (Kernels::detect(), Kernels::scalar());
    for ty in WEIGHT_TYPES {
        let v = load(ty);
        for nb in [1, 3, 7] {
            let n = nb * v.block_elems;
            let (xq, xd) = activation_row(&s, ty, &x[..n]);
            let scale: f64 = v.want[..n]
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            let a = f64::from(k.vec_dot(ty, n, &v.raw, &xq));
            let b = f64::from(s.vec_dot(ty, n, &v.raw, &xq));
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + scale),
                "{ty} x {nb}: {a} vs scalar {b}"
            );
        }
    }
}
