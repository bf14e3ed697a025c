use alloc::vec::Vec;

use crate::bound::{lower_bound_quadratic, lower_bound_sweep};
use crate::checker::{collide, overlapping_pair_quadratic, overlapping_pair_sweep};
use crate::planner::align_up;
use crate::types::Buffer;

#[test]
fn align_up_rounds_and_reports_overflow() {
    assert_eq!(align_up(0, 8), Some(0));
    assert_eq!(align_up(1, 8), Some(8));
    assert_eq!(align_up(8, 8), Some(8));
    assert_eq!(align_up(9, 1), Some(9));
    assert_eq!(align_up(usize::MAX - 2, 4), None);
}

#[test]
fn overlap_sweep_agrees_with_quadratic() {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n) as usize
    };
    let mut found = 0;
    for _ in 0..2000 {
        let n = next(12);
        let bufs: Vec<Buffer> = (0..n)
            .map(|_| {
                let a = next(10);
                Buffer::new(next(20), 1, a, a + next(4))
            })
            .collect();
        let offs: Vec<usize> = (0..n).map(|_| next(60)).collect();
        let q = overlapping_pair_quadratic(&bufs, &offs, |_, _| false);
        let w = overlapping_pair_sweep(&bufs, &offs, |_, _| false);
        assert_eq!(q.is_some(), w.is_some(), "{bufs:?} {offs:?}");
        for (a, b) in q.into_iter().chain(w) {
            assert!(a < b && collide(&bufs[a], offs[a], &bufs[b], offs[b]));
            found += 1;
        }
    }
    assert!(
        found > 100,
        "too few overlapping instances to mean much: {found}"
    );
}

#[test]
fn lower_bound_sweep_matches_quadratic() {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..500 {
        let n = (next() % 40) as usize;
        let bufs: Vec<Buffer> = (0..n)
            .map(|_| {
                let a = (next() % 20) as usize;
                let b = (next() % 20) as usize;
                // Some reversed lifetimes on purpose: both must ignore them.
                Buffer::new((next() % 100) as usize, 1, a, b)
            })
            .collect();
        assert_eq!(lower_bound_sweep(&bufs), lower_bound_quadratic(&bufs));
    }
    let huge = [Buffer::new(usize::MAX, 1, 0, 1), Buffer::new(5, 1, 1, 2)];
    assert_eq!(lower_bound_sweep(&huge), usize::MAX);
    assert_eq!(lower_bound_quadratic(&huge), usize::MAX);
}
