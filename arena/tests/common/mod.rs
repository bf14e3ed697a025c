//! Shared by the planner's integration tests: a tiny PRNG and random instances.
#![allow(dead_code)] // each test file uses its own subset

use edge_arena::Buffer;

/// Tiny xorshift64 PRNG, so the tests need no `rand`.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` random buffers over `ops` ops: sizes `1..=max_size` (5% zero), alignments
/// `1 << 0..aligns`, mostly short lifetimes (like graph values) and some long ones.
pub fn random_buffers(
    rng: &mut Rng,
    n: usize,
    ops: usize,
    max_size: usize,
    aligns: usize,
) -> Vec<Buffer> {
    (0..n)
        .map(|_| {
            let first = rng.below(ops);
            let len = if rng.below(8) == 0 {
                rng.below(ops)
            } else {
                rng.below(4)
            };
            let size = if rng.below(20) == 0 {
                0
            } else {
                1 + rng.below(max_size)
            };
            Buffer::new(size, 1 << rng.below(aligns), first, first + len)
        })
        .collect()
}
