//! Ops split into parts that any thread may run, and phases that end when their work is done
//! rather than when every thread has arrived: what keeps a run going when one of its threads
//! is descheduled.
//!
//! A run's ops are grouped into phases (the ops between two barriers). In the usual executor
//! every thread runs its own share of every op and the threads meet at a barrier after each
//! phase, so a phase lasts until the *slowest thread arrives*. With more threads than free
//! cores (`-t` above the core count, another process decoding, a CPU-bound neighbour) one of
//! them is always off its core, and every barrier waits for the scheduler to run it again:
//! decode fell to 7% of its speed at one thread more than cores.
//!
//! Here each op is cut into parts (as many as threads, the same cuts as the shares), each
//! part is claimed by exactly one thread, and a phase ends when all its parts are *done*:
//! a thread that is off its core holds up the phase only if it was preempted in the middle of
//! a part, and when it runs again it finds the ops it missed already claimed and catches up
//! without doing anything. Results do not change: every part computes what the same share
//! computes in the usual executor.
//!
//! Counters are indexed by the op's place in the run and set to zero before each run (by the
//! one thread that starts it, before the pool's job is posted, which publishes the stores):
//! a run starts only after every thread has left the previous one (the thread pool's job
//! end), so no thread ever sees another run's counts.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::wait::{Event, SpinBudget};

/// Claim and completion counts of the ops of one run, and the event completions signal.
pub struct PhaseCounters {
    /// Parts of op `i` claimed so far (may overshoot the parts: claiming is one fetch-add).
    claimed: Box<[AtomicU32]>,
    /// Parts done so far of the phase whose last op is `i`.
    done: Box<[AtomicU32]>,
    /// Signalled whenever a phase's last part is done.
    progress: Event,
    spin: SpinBudget,
}

impl PhaseCounters {
    /// The most ops one run may have (graphs with more run with the usual barriers).
    pub const MAX_OPS: usize = 4096;

    /// Counters for runs of up to [`PhaseCounters::MAX_OPS`] ops.
    pub fn new() -> PhaseCounters {
        let zeros = || (0..Self::MAX_OPS).map(|_| AtomicU32::new(0)).collect();
        PhaseCounters {
            claimed: zeros(),
            done: zeros(),
            progress: Event::new(),
            spin: SpinBudget::new(),
        }
    }

    /// Zeroes the counts of ops `0..n_ops` for a new run. Call from one thread while no run
    /// is in progress, and publish to the others (the pool's job post does).
    ///
    /// # Panics
    /// If `n_ops` exceeds [`PhaseCounters::MAX_OPS`].
    pub fn reset(&self, n_ops: usize) {
        for i in 0..n_ops {
            self.claimed[i].store(0, Ordering::Relaxed);
            self.done[i].store(0, Ordering::Relaxed);
        }
    }

    /// Claims the next unclaimed part of op `op` (of `n_parts`), or `None` once all are
    /// claimed. Every thread of the op must ask with the same `n_parts`.
    pub fn claim(&self, op: usize, n_parts: usize) -> Option<usize> {
        // Relaxed: the part's inputs were published by the phase wait before this op (or
        // are the run's own inputs, published by the job post).
        let p = self.claimed[op].fetch_add(1, Ordering::Relaxed) as usize;
        (p < n_parts).then_some(p)
    }

    /// Counts one part of the phase whose last op is `last` done, of `total`; the thread that
    /// completes the phase wakes whoever waits for it. Release: what the part wrote is visible
    /// to a thread that sees the phase complete.
    pub fn finish(&self, last: usize, total: usize) {
        if self.done[last].fetch_add(1, Ordering::AcqRel) as usize + 1 >= total {
            self.progress.signal();
        }
    }

    fn complete(&self, last: usize, total: usize) -> bool {
        self.done[last].load(Ordering::Acquire) as usize >= total
    }

    /// Returns once all `total` parts of the phase whose last op is `last` are done (Acquire:
    /// their writes are visible). Returns whether the wait outlasted the spin (a part's
    /// thread was off its core, or the parts were uneven).
    pub fn wait(&self, last: usize, total: usize) -> bool {
        let mut long = false;
        loop {
            let seen = self.progress.current();
            if self.complete(last, total) {
                return long;
            }
            long |= self.progress.wait_past(seen, &self.spin);
        }
    }
}

impl Default for PhaseCounters {
    fn default() -> Self {
        PhaseCounters::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Threads (more than cores, one of them slow) run phases of ops cut into parts, over
    /// several runs: every part runs exactly once per run, and no thread passes a phase's end
    /// before all its parts (those of every op of the phase) are done.
    #[test]
    fn every_part_runs_once_and_phases_end_when_done() {
        let n_threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()) + 1;
        let n_parts = n_threads;
        // Phases of 1, 2 and 3 ops, repeated.
        let phase_len = [1usize, 2, 3];
        let n_ops = 300;
        let c = PhaseCounters::new();
        for _run in 0..3 {
            c.reset(n_ops);
            let hits: Vec<AtomicUsize> =
                (0..n_ops * n_parts).map(|_| AtomicUsize::new(0)).collect();
            let done_parts = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for tid in 0..n_threads {
                    let (c, hits, done_parts) = (&c, &hits, &done_parts);
                    s.spawn(move || {
                        let mut op = 0;
                        let mut k = 0;
                        while op < n_ops {
                            let len = phase_len[k % 3].min(n_ops - op);
                            let last = op + len - 1;
                            for o in op..op + len {
                                while let Some(p) = c.claim(o, n_parts) {
                                    hits[o * n_parts + p].fetch_add(1, Ordering::Relaxed);
                                    if tid == 0 {
                                        std::thread::yield_now();
                                    }
                                    done_parts.fetch_add(1, Ordering::Relaxed);
                                    c.finish(last, len * n_parts);
                                }
                            }
                            c.wait(last, len * n_parts);
                            assert!(done_parts.load(Ordering::Relaxed) >= (op + len) * n_parts);
                            op += len;
                            k += 1;
                        }
                    });
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
