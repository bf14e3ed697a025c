//! In-place reuse: `plan_with_inplace` and `check_with_inplace`.
#![cfg(feature = "alloc")]

use edge_arena::{check, check_with_inplace, plan, plan_with_inplace, Buffer, PlanError};

fn b(size: usize, first_op: usize, last_op: usize) -> Buffer {
    Buffer::new(size, 1, first_op, last_op)
}

#[test]
fn elementwise_output_takes_its_dead_input() {
    // a -> (op 1: relu) -> b -> (op 2) -> c
    let bufs = [b(100, 0, 1), b(100, 1, 2), b(50, 2, 3)];
    assert_eq!(plan(&bufs).unwrap().size, 200);
    let p = plan_with_inplace(&bufs, &[(1, 0)]).unwrap();
    assert_eq!(p.offsets[0], p.offsets[1]);
    assert_eq!((p.size, p.lower_bound), (150, 150));
    check_with_inplace(&bufs, &p.offsets, p.size, &[(1, 0)]).unwrap();
    // Without the permission the same offsets are an overlap.
    assert!(matches!(
        check(&bufs, &p.offsets, p.size),
        Err(PlanError::Overlap { a: 0, b: 1, .. })
    ));
    // No pairs: exactly `plan`.
    assert_eq!(plan_with_inplace(&bufs, &[]), plan(&bufs));
}

#[test]
fn chains_share_one_offset() {
    // a -> b -> c, each elementwise in place; b lives two ops.
    let bufs = [b(64, 0, 1), b(64, 1, 3), b(32, 3, 4), b(64, 0, 4)];
    let pairs = [(1, 0), (2, 1)];
    let p = plan_with_inplace(&bufs, &pairs).unwrap();
    assert_eq!(p.offsets[0], p.offsets[1]);
    assert_eq!(p.offsets[1], p.offsets[2]);
    assert_eq!(p.size, 128);
    check_with_inplace(&bufs, &p.offsets, p.size, &pairs).unwrap();
}

#[test]
fn a_single_op_middle_of_a_chain_is_not_chained() {
    // b lives only at op 1, so a (0..=1) and c (1..=2) live together: only
    // the first pair is used.
    let bufs = [b(64, 0, 1), b(64, 1, 1), b(64, 1, 2)];
    let pairs = [(1, 0), (2, 1)];
    let p = plan_with_inplace(&bufs, &pairs).unwrap();
    assert_eq!(p.offsets[0], p.offsets[1]);
    assert_ne!(p.offsets[0], p.offsets[2]);
    check_with_inplace(&bufs, &p.offsets, p.size, &pairs).unwrap();
    // Forcing c onto a and b is caught: (2, 1) does not qualify.
    assert!(matches!(
        check_with_inplace(&bufs, &[0, 0, 0], 64, &pairs),
        Err(PlanError::Overlap { a: 0, b: 2, .. })
    ));
}

#[test]
fn pairs_that_do_not_qualify_are_ignored() {
    let bufs = [
        b(100, 0, 1),              // 0
        b(100, 2, 3),              // 1: starts after 0 died
        b(101, 1, 2),              // 2: bigger than 0
        Buffer::new(64, 64, 1, 2), // 3: stronger alignment than 0
        b(100, 1, 2),              // 4: fine
        b(0, 1, 2),                // 5: empty
    ];
    let bad = [(1, 0), (2, 0), (3, 0), (5, 0), (9, 0), (0, 9), (0, 0)];
    assert_eq!(plan_with_inplace(&bufs, &bad), plan(&bufs));
    // Each input is reused at most once: the first qualifying pair wins.
    let p = plan_with_inplace(&bufs, &[(4, 0), (2, 0)]).unwrap();
    assert_eq!(p.offsets[4], p.offsets[0]);
    check_with_inplace(&bufs, &p.offsets, p.size, &[(4, 0)]).unwrap();
}

#[test]
fn check_with_inplace_allows_only_exact_overlap_of_pairs() {
    let bufs = [b(100, 0, 1), b(60, 1, 2), b(10, 1, 1)];
    let pairs = [(1, 0)];
    check_with_inplace(&bufs, &[0, 0, 100], 110, &pairs).unwrap();
    // Shifted: a partial overlap is an error even for a pair.
    assert!(matches!(
        check_with_inplace(&bufs, &[0, 8, 100], 110, &pairs),
        Err(PlanError::Overlap { a: 0, b: 1, .. })
    ));
    // Other overlaps are still errors.
    assert!(matches!(
        check_with_inplace(&bufs, &[0, 0, 50], 110, &pairs),
        Err(PlanError::Overlap { a: 0, b: 2, .. })
    ));
    // And the usual checks still run.
    assert_eq!(
        check_with_inplace(&bufs, &[0, 0], 110, &pairs),
        Err(PlanError::LengthMismatch {
            buffers: 3,
            offsets: 2
        })
    );
    assert!(matches!(
        check_with_inplace(&bufs, &[0, 0, 105], 110, &pairs),
        Err(PlanError::OutOfArena { index: 2, .. })
    ));
}

#[test]
fn errors_name_original_buffers() {
    let half = usize::MAX / 2 + 1;
    let bufs = [b(half, 0, 1), b(8, 1, 2), b(half, 1, 2)];
    assert_eq!(
        plan_with_inplace(&bufs, &[(1, 0)]),
        Err(PlanError::Overflow { index: 2 })
    );
    assert_eq!(
        plan_with_inplace(&[b(1, 2, 1)], &[]),
        Err(PlanError::BadLifetime {
            index: 0,
            first_op: 2,
            last_op: 1
        })
    );
}

#[test]
fn random_instances_with_random_pairs_pass_the_checker() {
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    let mut below = move |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut used = 0;
    for _ in 0..1000 {
        let n = 1 + below(60);
        let ops = 1 + below(30);
        let bufs: Vec<Buffer> = (0..n)
            .map(|_| {
                let f = below(ops);
                Buffer::new(below(200), 1 << below(4), f, f + below(4))
            })
            .collect();
        // Mostly plausible pairs (an output starting where an input ends).
        let mut pairs = Vec::new();
        for _ in 0..below(2 * n) {
            let (o, i) = (below(n), below(n));
            if bufs[i].last_op == bufs[o].first_op || below(4) == 0 {
                pairs.push((o, i));
            }
        }
        let p = plan_with_inplace(&bufs, &pairs).unwrap();
        check_with_inplace(&bufs, &p.offsets, p.size, &pairs).unwrap();
        assert!(p.size >= p.lower_bound);
        used += pairs
            .iter()
            .filter(|&&(o, i)| o != i && bufs[o].size > 0 && p.offsets[o] == p.offsets[i])
            .count();
    }
    assert!(used > 200, "too few pairs used to mean much: {used}");
}
