use crate::bound::lower_bound;
use crate::checker::check;
use crate::planner::{plan_into, scratch_len};
use crate::types::Buffer;

#[test]
fn plan_into_without_a_heap() {
    const N: usize = 5;
    let bufs = [
        Buffer::new(10, 1, 0, 1),
        Buffer::new(20, 1, 1, 2),
        Buffer::new(30, 1, 2, 3),
        Buffer::new(40, 1, 3, 4),
        Buffer::new(50, 1, 0, 1),
    ];
    let mut offsets = [0usize; N];
    let mut scratch = [0usize; scratch_len(N)];
    let size = plan_into(&bufs, &mut offsets, &mut scratch).unwrap();
    check(&bufs, &offsets, size).unwrap();
    // Greedy by size needs 90 bytes; execution order reaches the bound.
    assert_eq!((size, lower_bound(&bufs)), (80, 80));
    assert_eq!(offsets, [50, 60, 0, 30, 0]);
}

#[test]
fn plan_into_random_instances_are_valid() {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut bufs = [Buffer::new(0, 1, 0, 0); 40];
    let mut offsets = [0usize; 40];
    let mut scratch = [0usize; scratch_len(40)];
    for _ in 0..300 {
        let n = next(41);
        for b in &mut bufs[..n] {
            let f = next(20);
            *b = Buffer::new(next(500), 1 << next(5), f, f + next(5));
        }
        let size = plan_into(&bufs[..n], &mut offsets[..n], &mut scratch).unwrap();
        check(&bufs[..n], &offsets[..n], size).unwrap();
        assert!(size >= lower_bound(&bufs[..n]));
    }
}
