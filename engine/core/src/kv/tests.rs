//! The KV cache against what it must hold: rows at their positions, rings that keep the last
//! rows, and context shifts that equal roping the keys at their new positions.

use super::*;
use edge_kernels::cpu::rope::{rope_row, RopeOrdering};
use edge_kernels::testutil::Rng;

const HEAD_DIM: usize = 64;
const KV_DIM: usize = 2 * HEAD_DIM;

fn ropes() -> [Rope; 3] {
    let r = |ordering, n_rot, freq_scale| Rope {
        ordering,
        n_rot,
        freq_base: 10000.0,
        freq_scale,
    };
    [
        r(RopeOrdering::Normal, HEAD_DIM, 1.0),
        r(RopeOrdering::NeoX, HEAD_DIM, 1.0),
        // partial rotary with linear scaling
        r(RopeOrdering::NeoX, HEAD_DIM / 2, 0.25),
    ]
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The math the shift relies on, in f32: roping at p then at -d is roping at p - d.
#[test]
fn rotating_by_minus_d_equals_roping_at_p_minus_d() {
    let mut rng = Rng::new(7);
    for rope in ropes() {
        for (p, d) in [(10usize, 3usize), (100, 50), (3000, 1500), (4095, 2047)] {
            let x = rng.vec(KV_DIM, 1.0);
            let (mut at_p, mut shifted, mut direct) =
                (vec![0.0; KV_DIM], vec![0.0; KV_DIM], vec![0.0; KV_DIM]);
            rope_row(&x, &mut at_p, p, HEAD_DIM, rope);
            rope_row_at(&at_p, &mut shifted, -(d as f32), HEAD_DIM, rope);
            rope_row(&x, &mut direct, p - d, HEAD_DIM, rope);
            // f32 angles of a few thousand radians carry ~1e-4 of absolute error.
            let err = max_diff(&shifted, &direct);
            assert!(err < 2e-3, "{rope:?} p {p} d {d}: {err}");
        }
    }
}

/// A shifted cache holds, at each new position, the key roped directly at that position
/// (within the rounding of the cache type), the values moved unchanged, and the kept
/// positions untouched.
#[test]
fn shifted_keys_equal_keys_roped_at_their_new_position() {
    let kernels = Kernels::detect();
    let (ctx, n_past, keep, n_discard) = (24usize, 20usize, 3usize, 8usize);
    for (ty, tol) in [(KvType::F16, 2e-3f32), (KvType::Q8_0, 2.5e-2)] {
        for rope in ropes() {
            let mut rng = Rng::new(11);
            let mut kv = KvCache::new(2, ctx, KV_DIM, ty).unwrap();
            // Unroped keys (|x| < 1) and values, per layer and position.
            let xs: Vec<Vec<Vec<f32>>> = (0..2)
                .map(|_| (0..n_past).map(|_| rng.vec(KV_DIM, 1.0)).collect())
                .collect();
            let vs: Vec<Vec<Vec<f32>>> = (0..2)
                .map(|_| (0..n_past).map(|_| rng.vec(KV_DIM, 1.0)).collect())
                .collect();
            let mut k = vec![0.0; KV_DIM];
            for l in 0..2 {
                for p in 0..n_past {
                    rope_row(&xs[l][p], &mut k, p, HEAD_DIM, rope);
                    kv.write_row(l, false, p, &k, &kernels).unwrap();
                    kv.write_row(l, true, p, &vs[l][p], &kernels).unwrap();
                }
            }
            let snapshot = |kv: &mut KvCache, l: usize, v: bool, p: usize| {
                let mut out = vec![0.0; KV_DIM];
                kv.read_row(l, v, p, &mut out).unwrap();
                out
            };
            let before: Vec<Vec<f32>> = (0..2)
                .flat_map(|l| [false, true].map(|v| (l, v)))
                .flat_map(|(l, v)| (0..n_past).map(move |p| (l, v, p)))
                .map(|(l, v, p)| snapshot(&mut kv, l, v, p))
                .collect();
            let idx = |l: usize, v: bool, p: usize| (l * 2 + usize::from(v)) * n_past + p;
            let mut tmp = vec![0.0; 2 * KV_DIM];
            kv.shift(n_past, keep, n_discard, HEAD_DIM, rope, &kernels, &mut tmp)
                .unwrap();
            for l in 0..2 {
                for p in 0..keep {
                    for v in [false, true] {
                        assert_eq!(snapshot(&mut kv, l, v, p), before[idx(l, v, p)]);
                    }
                }
                for new in keep..n_past - n_discard {
                    let old = new + n_discard;
                    // Values move bit for bit.
                    assert_eq!(snapshot(&mut kv, l, true, new), before[idx(l, true, old)]);
                    // Keys: compared with RoPE computed directly at the new position.
                    let mut direct = vec![0.0; KV_DIM];
                    rope_row(&xs[l][old], &mut direct, new, HEAD_DIM, rope);
                    let got = snapshot(&mut kv, l, false, new);
                    let err = max_diff(&got, &direct);
                    assert!(
                        err < tol,
                        "{ty:?} {rope:?} layer {l} pos {old}->{new}: {err}"
                    );
                    // Not trivially equal to the unshifted key (the rotation happened).
                    if n_discard > 0 && rope.n_rot > 0 {
                        assert!(max_diff(&got, &before[idx(l, false, old)]) > tol);
                    }
                }
            }
        }
    }
}

/// A layer with fewer rows than the context is a ring: position p lands in row p % rows,
/// overwriting p - rows; full layers keep every position; the bytes are the sum of the
/// layers'.
#[test]
fn ring_layers_keep_the_last_rows() {
    let kernels = Kernels::detect();
    let (ctx, ring) = (16usize, 5usize);
    let mut kv = KvCache::with_layer_rows(&[ctx, ring], ctx, KV_DIM, KvType::F16).unwrap();
    assert_eq!(kv.bytes(), 2 * (ctx + ring) * KV_DIM * 2);
    assert_eq!(
        KvCache::bytes_for_rows(&[ctx, ring], KV_DIM, KvType::F16),
        Some(kv.bytes())
    );
    assert!(!kv.is_full());
    let row = |p: usize, v: bool| vec![p as f32 + if v { 0.5 } else { 0.0 }; KV_DIM];
    for p in 0..ctx {
        for l in 0..2 {
            for v in [false, true] {
                kv.write_row(l, v, p, &row(p, v), &kernels).unwrap();
            }
        }
    }
    let mut out = vec![0.0; KV_DIM];
    for p in 0..ctx {
        for v in [false, true] {
            kv.read_row(0, v, p, &mut out).unwrap();
            assert_eq!(out, row(p, v), "full layer, position {p}");
            kv.read_row(1, v, p, &mut out).unwrap();
            // The ring holds the last `ring` positions; row p % ring holds the latest of them.
            let latest = ctx - 1 - (ctx - 1 - p) % ring;
            let want = if p + ring >= ctx { p } else { latest };
            assert_eq!(out, row(want, v), "ring layer, position {p}");
        }
    }
    let mut tmp = vec![0.0; 2 * KV_DIM];
    let e = kv
        .shift(ctx, 0, 2, HEAD_DIM, ropes()[0], &kernels, &mut tmp)
        .unwrap_err();
    assert!(e.contains("sliding-window"), "{e}");
    assert!(KvCache::with_layer_rows(&[0], ctx, KV_DIM, KvType::F16).is_err());
    assert!(KvCache::with_layer_rows(&[ctx + 1], ctx, KV_DIM, KvType::F16).is_err());
}

#[test]
fn impossible_shifts_are_errors() {
    let kernels = Kernels::detect();
    let mut kv = KvCache::new(1, 8, KV_DIM, KvType::F16).unwrap();
    let mut tmp = vec![0.0; 2 * KV_DIM];
    let rope = ropes()[0];
    assert!(kv
        .shift(9, 0, 1, HEAD_DIM, rope, &kernels, &mut tmp)
        .is_err());
    assert!(kv
        .shift(4, 3, 2, HEAD_DIM, rope, &kernels, &mut tmp)
        .is_err());
    assert!(kv
        .shift(4, 0, 2, HEAD_DIM, rope, &kernels, &mut tmp[..3])
        .is_err());
    assert!(kv
        .shift(4, 0, 2, HEAD_DIM, rope, &kernels, &mut tmp)
        .is_ok());
}

/// The runs list exactly the rows `ring_slot` gives, position by position.
#[test]
fn ring_runs_cover_the_slots_in_order() {
    for rows in [1usize, 3, 8, 13] {
        for first in 0..3 * rows {
            for n in 0..=rows {
                let want: Vec<usize> = (first..first + n).map(|p| ring_slot(p, rows)).collect();
                let got: Vec<usize> = ring_runs(first, n, rows)
                    .iter()
                    .flat_map(|&(s, len)| s..s + len)
                    .collect();
                assert_eq!(got, want, "rows {rows} first {first} n {n}");
            }
        }
    }
}
