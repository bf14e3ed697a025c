//! Static shares weighted by each thread's measured speed, for the matmuls that every thread
//! computes as one contiguous range of rows (a decode step's small matrices, and prefill's).
//!
//! A decode step's small matmuls (each thread's share under 1 MiB: a 135M model's every
//! matrix but the output head) give each thread one contiguous range of rows, computed in one
//! call so that the kernels' prefetching runs ahead without a break; stealing chunks of them
//! cost more than it evened out (see `edge_engine`'s matmul). Equal shares assume equal
//! threads, and on a virtual machine, a shared host or a CPU with cores of two kinds they are
//! not: on a 2-core cloud VM one vCPU ran a whole `bench` 15% slower than the other, and the
//! faster thread then waited at every matmul's barrier, 16% of its time.
//!
//! So each thread times its share of those matmuls and counts the weight bytes it streamed;
//! at each [`ShareBalance::update`] the shares are moved a quarter of the way towards each
//! thread's measured speed (bytes per nanosecond), within [`MIN_WEIGHT`]..[`MAX_WEIGHT`] of the
//! average. Results do not change: a row's dot product does not depend on which thread
//! computes it, and the share boundaries stay whole granules.
//!
//! The weights change only while no thread computes a share: between runs, by the thread that
//! started the run after every thread has left it (the thread pool's job end, and the next job
//! post publishes them), or inside a run by the last thread to reach a barrier before it
//! releases the others (`SpinBarrier::wait_then`). So all threads cut an op's rows at the same
//! places: every row is computed exactly once.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// The average weight: a thread at this weight gets `1 / n_threads` of the rows.
pub const UNIT_WEIGHT: u32 = 1 << 16;
/// The smallest weight a thread may get (a quarter of the average): a thread that was
/// descheduled for a whole run keeps some rows, and its speed is measured again.
pub const MIN_WEIGHT: u32 = UNIT_WEIGHT / 4;
/// The largest weight a thread may get (1.75 times the average).
pub const MAX_WEIGHT: u32 = UNIT_WEIGHT * 7 / 4;
/// Each update moves a weight `1 / STEP` of the way to the measured speed: a run's speed
/// varies (a page fault, an interrupt), what persists is the core's.
const STEP: u64 = 4;
/// Runs with less timed work per thread than this (ns) leave the weights alone: too short to
/// say which thread is faster.
const MIN_TIMED_NS: u64 = 20_000;

/// One thread's measurements of a run, alone on a cache line.
#[repr(align(128))]
#[derive(Default)]
struct Measured {
    /// Weight bytes streamed in the timed matmuls.
    bytes: AtomicU64,
    /// Nanoseconds spent in them.
    nanos: AtomicU64,
}

/// Per-thread share weights and the measurements that adapt them.
pub struct ShareBalance {
    weights: Box<[AtomicU32]>,
    measured: Box<[Measured]>,
    /// The weights were given ([`ShareBalance::pinned`]) and measurements leave them alone.
    pinned: bool,
}

impl ShareBalance {
    /// Equal weights for `n_threads` (at least 1).
    pub fn new(n_threads: usize) -> ShareBalance {
        let n = n_threads.max(1);
        ShareBalance {
            weights: (0..n).map(|_| AtomicU32::new(UNIT_WEIGHT)).collect(),
            measured: (0..n).map(|_| Measured::default()).collect(),
            pinned: false,
        }
    }

    /// Weights fixed at `relative` (relative to an equal share, clamped to
    /// [`MIN_WEIGHT`]..[`MAX_WEIGHT`]; repeated if shorter than `n_threads`), never adapted:
    /// for tests and comparisons (the executor's `EDGE_RUN_SHARE_WEIGHTS`).
    pub fn pinned(n_threads: usize, relative: &[f32]) -> ShareBalance {
        let b = ShareBalance {
            pinned: true,
            ..ShareBalance::new(n_threads)
        };
        for (w, r) in b.weights.iter().zip(relative.iter().cycle()) {
            let units = (r * UNIT_WEIGHT as f32) as i64;
            w.store(
                units.clamp(i64::from(MIN_WEIGHT), i64::from(MAX_WEIGHT)) as u32,
                Relaxed,
            );
        }
        b
    }

    /// Thread `i`'s share of `0..n`, cut in whole `granule`s in proportion to the weights.
    /// Consecutive threads' shares meet, and together they cover `0..n` once, whatever the
    /// weights (each boundary is one formula of the weights before it).
    pub fn share(&self, n: usize, i: usize, granule: usize) -> Range<usize> {
        let granule = granule.max(1);
        let units = n.div_ceil(granule) as u64;
        let mut before = 0u64;
        for w in &self.weights[..i.min(self.weights.len())] {
            before += u64::from(w.load(Relaxed));
        }
        let mine = self
            .weights
            .get(i)
            .map_or(0, |w| u64::from(w.load(Relaxed)));
        let total: u64 = self
            .weights
            .iter()
            .map(|w| u64::from(w.load(Relaxed)))
            .sum();
        let cut = |cum: u64| ((units * cum + total / 2) / total) as usize * granule;
        cut(before).min(n)..cut(before + mine).min(n)
    }

    /// Adds to thread `i`'s measurements of this run: `bytes` of weights streamed in `nanos`.
    pub fn record(&self, i: usize, bytes: u64, nanos: u64) {
        if let Some(m) = self.measured.get(i) {
            m.bytes.fetch_add(bytes, Relaxed);
            m.nanos.fetch_add(nanos, Relaxed);
        }
    }

    /// Moves the weights towards the speeds measured since the last update, and clears the
    /// measurements. Call from one thread while no other computes a share (see the module
    /// doc).
    pub fn update(&self) {
        // Without allocating: a decode step runs this once per token.
        let taken = |m: &Measured| (m.bytes.swap(0, Relaxed), m.nanos.swap(0, Relaxed));
        let speed = |(bytes, nanos): (u64, u64)| bytes as f64 / nanos as f64;
        let timed =
            |m: &Measured| m.bytes.load(Relaxed) > 0 && m.nanos.load(Relaxed) >= MIN_TIMED_NS;
        if self.pinned || !self.measured.iter().all(timed) {
            for m in self.measured.iter() {
                taken(m);
            }
            return;
        }
        let load = |m: &Measured| (m.bytes.load(Relaxed), m.nanos.load(Relaxed));
        let mean =
            self.measured.iter().map(|m| speed(load(m))).sum::<f64>() / self.measured.len() as f64;
        for (w, m) in self.weights.iter().zip(self.measured.iter()) {
            // The thread's speed relative to the average, in weight units.
            let target = (speed(taken(m)) / mean * f64::from(UNIT_WEIGHT)) as i64;
            let now = i64::from(w.load(Relaxed));
            let next = now + (target - now) / STEP as i64;
            w.store(
                next.clamp(i64::from(MIN_WEIGHT), i64::from(MAX_WEIGHT)) as u32,
                Relaxed,
            );
        }
    }

    /// Equal weights again (unless pinned), measurements cleared.
    pub fn reset(&self) {
        if self.pinned {
            return;
        }
        for (w, m) in self.weights.iter().zip(self.measured.iter()) {
            w.store(UNIT_WEIGHT, Relaxed);
            m.bytes.store(0, Relaxed);
            m.nanos.store(0, Relaxed);
        }
    }

    /// The weights relative to the average (1.0), for logs and tests.
    pub fn relative_weights(&self) -> Vec<f32> {
        self.weights
            .iter()
            .map(|w| w.load(Relaxed) as f32 / UNIT_WEIGHT as f32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// Every row covered once, in order, shares starting on whole granules, for random weights,
    /// sizes, granules and thread counts.
    #[test]
    fn weighted_shares_cover_every_row_once() {
        let mut r = Rng::new(7);
        for _ in 0..2000 {
            let n_threads = 1 + (r.next_u64() % 6) as usize;
            let b = ShareBalance::new(n_threads);
            for w in b.weights.iter() {
                w.store(
                    MIN_WEIGHT + (r.next_u64() % u64::from(MAX_WEIGHT - MIN_WEIGHT)) as u32,
                    Relaxed,
                );
            }
            let n = (r.next_u64() % 5000) as usize;
            let granule = [1, 4, 8, 16][(r.next_u64() % 4) as usize];
            let mut next = 0;
            for i in 0..n_threads {
                let s = b.share(n, i, granule);
                assert_eq!(s.start, next, "shares must meet");
                assert!(s.start <= s.end && s.end <= n);
                assert!(s.start.is_multiple_of(granule) || s.start == n);
                next = s.end;
            }
            assert_eq!(next, n, "shares must cover every row");
        }
    }

    /// Equal weights cut as evenly as whole granules allow.
    #[test]
    fn equal_weights_give_equal_shares() {
        let b = ShareBalance::new(2);
        assert_eq!(b.share(576, 0, 16), 0..288);
        assert_eq!(b.share(576, 1, 16), 288..576);
        let b = ShareBalance::new(3);
        let lens: Vec<usize> = (0..3).map(|i| b.share(1536, i, 16).len()).collect();
        assert_eq!(lens, [512, 512, 512]);
    }

    /// A thread measured slower gets fewer rows, step by step, up to the clamp; a run too
    /// short to time changes nothing.
    #[test]
    fn a_slower_thread_gets_fewer_rows() {
        let b = ShareBalance::new(2);
        // Thread 0 streams 15% slower.
        let step = |b: &ShareBalance| {
            b.record(0, 1_000_000, 115_000);
            b.record(1, 1_000_000, 100_000);
            b.update();
        };
        step(&b);
        let w = b.relative_weights();
        assert!(w[0] < 1.0 && w[1] > 1.0, "{w:?}");
        for _ in 0..40 {
            step(&b);
        }
        // Converged on speeds 1/1.15 : 1, i.e. weights 0.93 : 1.07.
        let w = b.relative_weights();
        assert!(
            (w[0] - 0.930).abs() < 0.01 && (w[1] - 1.070).abs() < 0.01,
            "{w:?}"
        );
        let s0 = b.share(576, 0, 16);
        assert_eq!(s0, 0..272, "thread 0 gets 17 of 36 granules");

        b.record(0, 1000, 100);
        b.record(1, 1000, 10_000);
        b.update();
        assert_eq!(
            b.relative_weights(),
            w,
            "too short a run must not move the weights"
        );

        // A thread that barely ran is clamped, not starved.
        for _ in 0..100 {
            b.record(0, 1_000_000, 100_000);
            b.record(1, 1_000, 100_000);
            b.update();
        }
        let w = b.relative_weights();
        assert_eq!(w[1], MIN_WEIGHT as f32 / UNIT_WEIGHT as f32);
        assert!(!b.share(576, 1, 16).is_empty());

        b.reset();
        assert_eq!(b.relative_weights(), [1.0, 1.0]);
    }

    /// Pinned weights stay, clamped, whatever is measured.
    #[test]
    fn pinned_weights_do_not_adapt() {
        let b = ShareBalance::pinned(3, &[0.1, 1.5]);
        assert_eq!(b.relative_weights(), [0.25, 1.5, 0.25]);
        b.record(0, 1_000_000, 100_000);
        b.record(1, 1_000, 100_000);
        b.record(2, 1_000_000, 100_000);
        b.update();
        b.reset();
        assert_eq!(b.relative_weights(), [0.25, 1.5, 0.25]);
        assert_eq!(b.share(1000, 0, 1), 0..125);
        assert_eq!(b.share(1000, 1, 1), 125..875);
    }
}
