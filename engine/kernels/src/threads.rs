//! A persistent pool of worker threads that all run the same job, each with its own index.
//!
//! The executor hands the pool one job per forward pass; inside it every thread walks the
//! same op list, takes its share of each op and meets the others at a [`SpinBarrier`]. Threads
//! are created once per session, so a token costs no thread creation and no allocation.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::wait::{Event, SpinBudget};

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Signalled by `run` to publish a new job (and by `drop` to stop the workers).
    job_posted: Event,
    /// Signalled by the last worker to finish the current job.
    job_done: Event,
    /// Workers still running the current job.
    remaining: AtomicUsize,
    /// The current job; written only while no worker runs (remaining == 0), read after
    /// `job_posted` is observed to change (acquire), so reads never race with writes.
    job: UnsafeCell<Option<Job>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// How long idle workers spin for the next job (the gap between two forward passes:
    /// sampling, streaming the text) before they sleep.
    idle_spin: SpinBudget,
    /// How long the caller spins for the workers to finish.
    done_spin: SpinBudget,
}

// SAFETY: `job` is the only non-Sync field; access is ordered by `job_posted` (release on
// publish, acquire before reading) and `remaining` (no write while a worker may read).
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced while `run` keeps its referent alive.
unsafe impl Send for Shared {}

/// A fixed set of threads that run jobs of the form `Fn(thread_index)`; the caller is thread 0.
///
/// Waiting threads spin only as long as spinning has been paying off, then sleep on a futex
/// ([`crate::wait`]), so a pool with more threads than free cores, or two pools on the same
/// cores, slows down in proportion instead of spinning away the cores it waits for.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl ThreadPool {
    /// A pool of `n_threads` (>= 1) threads in all, counting the caller of [`ThreadPool::run`].
    /// Fails if the OS refuses to start a thread.
    pub fn new(n_threads: usize) -> Result<ThreadPool, String> {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job_posted: Event::new(),
            job_done: Event::new(),
            remaining: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            idle_spin: SpinBudget::new(),
            done_spin: SpinBudget::new(),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            n_threads,
        };
        for index in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let worker = std::thread::Builder::new()
                .name(format!("edge-run-{index}"))
                .spawn(move || worker_loop(&shared, index))
                // Dropping `pool` stops the workers already started.
                .map_err(|e| format!("cannot start thread {index} of {n_threads}: {e}"))?;
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// Number of threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `job(i)` on every thread `i` in `0..n_threads` (0 on the caller) and returns when
    /// all have finished. Returns false if any thread panicked.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) -> bool {
        if self.n_threads == 1 {
            return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0))).is_ok();
        }
        let s = &*self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        // SAFETY: the lifetime is erased only for the duration of this call: we do not return
        // before `remaining` drops to 0, i.e. before every worker is done with the pointer.
        let ptr: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(job) };
        // SAFETY: no worker reads `job` now: the previous run ended with remaining == 0 and
        // workers only read it after seeing a new post, which we publish below.
        unsafe { *s.job.get() = Some(ptr) };
        s.remaining.store(self.n_threads - 1, Ordering::Relaxed);
        let done_before = s.job_done.current();
        s.job_posted.signal();
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0))).is_ok();
        // Always wait for the signal itself (not for `remaining`): the next run reads
        // `job_done` afresh, so this run's signal must have landed before we return.
        s.job_done.wait_past(done_before, &s.done_spin);
        ok && !s.panicked.load(Ordering::Relaxed)
    }
}

fn worker_loop(s: &Shared, index: usize) {
    // The count the pool was created with (not the current one: `run` may already have posted
    // the first job before this thread started).
    let mut seen = 0;
    loop {
        s.job_posted.wait_past(seen, &s.idle_spin);
        seen = s.job_posted.current();
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: a new job was posted with the job written before it (release / acquire),
        // and `run` keeps the job alive until we decrement `remaining`.
        let job = unsafe { (*s.job.get()).expect("job posted before it is signalled") };
        // SAFETY: see above: the referent outlives this call.
        let job = unsafe { &*job };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        if s.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            s.job_done.signal();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.job_posted.signal();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A barrier for the threads of one pool job: all `n` threads call [`SpinBarrier::wait`]
/// between ops. Spins while spinning pays off (ops of a small model last microseconds), then
/// sleeps on a futex, so an oversubscribed machine (other processes, more threads than cores)
/// does not spend the cores on waiting for a thread that cannot run (see [`crate::wait`]).
pub struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    released: Event,
    spin: SpinBudget,
}

impl SpinBarrier {
    /// A barrier for `n` threads.
    pub fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            released: Event::new(),
            spin: SpinBudget::new(),
        }
    }

    /// The current spin budget in nanoseconds (for diagnostics and tests).
    pub fn spin_nanos(&self) -> u32 {
        self.spin.nanos()
    }

    /// Starts the spin budget afresh (after a stretch of runs that did not use the barrier).
    pub fn reset_spin(&self) {
        self.spin.reset();
    }

    /// Blocks until all `n` threads have called `wait` for this round. Writes made before
    /// `wait` by any thread are visible to all threads after it.
    pub fn wait(&self) {
        self.wait_then(|| {});
    }

    /// [`SpinBarrier::wait`], where the last thread to arrive runs `last` before it releases
    /// the others: what `last` writes, every thread sees after the barrier, and no thread runs
    /// while it does (e.g. adapting the next op's shares to the one just measured).
    pub fn wait_then(&self, last: impl FnOnce()) {
        if self.n == 1 {
            last();
            return;
        }
        // Read before arriving: the round cannot end (and the count move on) before we arrive.
        let round = self.released.current();
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            last();
            self.count.store(0, Ordering::Relaxed);
            self.released.signal();
            return;
        }
        self.released.wait_past(round, &self.spin);
    }
}

/// The part `[start, end)` of `0..n` that thread `i` of `n_threads` takes, in chunks that are
/// multiples of `granule` (the last thread takes the remainder).
pub fn split_range(n: usize, i: usize, n_threads: usize, granule: usize) -> std::ops::Range<usize> {
    let granule = granule.max(1);
    let units = n.div_ceil(granule);
    let per = units / n_threads;
    let extra = units % n_threads;
    let start_u = i * per + i.min(extra);
    let end_u = start_u + per + usize::from(i < extra);
    (start_u * granule).min(n)..(end_u * granule).min(n)
}

/// How many threads to run when none are asked for, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadChoice {
    /// The threads to run.
    pub threads: usize,
    /// The CPUs this process may run on (affinity mask and cgroup quota).
    pub allowed: usize,
    /// CPUs other processes kept busy when we looked (0 where that cannot be read).
    pub busy: usize,
}

/// The threads to use when none are asked for: the CPUs this process may run on, less those
/// other processes keep busy right now, at least 1.
///
/// A static split of every op over more threads than there are free cores waits at each
/// barrier for the thread that is not running, so on a shared machine (a robot's other nodes,
/// a second model) fewer threads decode faster. "Busy" is the number of runnable tasks in
/// `/proc/loadavg` (Linux), the median of a few samples over ~8 ms, less the one that is
/// reading it; elsewhere nothing is subtracted.
pub fn default_thread_count() -> ThreadChoice {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy = busy_cpus().unwrap_or(0).min(allowed);
    ThreadChoice {
        threads: (allowed - busy).max(1),
        allowed,
        busy,
    }
}

/// Runnable tasks of other processes, from the 4th field of `/proc/loadavg` ("running/total").
fn busy_cpus() -> Option<usize> {
    let mut samples = [0usize; 7];
    for (i, s) in samples.iter_mut().enumerate() {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        *s = runnable_tasks(&std::fs::read_to_string("/proc/loadavg").ok()?)?;
    }
    samples.sort_unstable();
    // Less ourselves: the thread reading the file is running.
    Some(samples[samples.len() / 2].saturating_sub(1))
}

/// The running count of a `/proc/loadavg` line: `0.52 0.58 0.59 3/467 12345` -> 3.
fn runnable_tasks(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_every_job() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicUsize::new(0);
        for _ in 0..100 {
            assert!(pool.run(&|i| {
                hits.fetch_add(1 << (8 * i), Ordering::Relaxed);
            }));
        }
        assert_eq!(hits.load(Ordering::Relaxed), 100 + (100 << 8) + (100 << 16));
    }

    #[test]
    fn barrier_orders_phases() {
        let pool = ThreadPool::new(4).unwrap();
        let barrier = SpinBarrier::new(4);
        let data: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let ok = AtomicBool::new(true);
        pool.run(&|i| {
            for round in 1..50 {
                data[i].store(round, Ordering::Relaxed);
                barrier.wait();
                if data.iter().any(|d| d.load(Ordering::Relaxed) != round) {
                    ok.store(false, Ordering::Relaxed);
                }
                barrier.wait();
            }
        });
        assert!(ok.load(Ordering::Relaxed));
    }

    /// The last thread to arrive runs the closure once per round, after every thread's
    /// writes of the round and before any thread goes on.
    #[test]
    fn wait_then_runs_once_between_the_rounds() {
        let pool = ThreadPool::new(4).unwrap();
        let barrier = SpinBarrier::new(4);
        let arrived = AtomicUsize::new(0);
        let rounds = AtomicUsize::new(0);
        let ok = AtomicBool::new(true);
        pool.run(&|_| {
            for round in 1..50 {
                arrived.fetch_add(1, Ordering::Relaxed);
                barrier.wait_then(|| {
                    if arrived.load(Ordering::Relaxed) != 4 * round {
                        ok.store(false, Ordering::Relaxed);
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                });
                if rounds.load(Ordering::Relaxed) != round {
                    ok.store(false, Ordering::Relaxed);
                }
                barrier.wait();
            }
        });
        assert!(ok.load(Ordering::Relaxed));
        assert_eq!(rounds.load(Ordering::Relaxed), 49);
    }

    #[test]
    fn panics_are_reported() {
        let pool = ThreadPool::new(2).unwrap();
        assert!(!pool.run(&|i| assert!(i != 1, "worker panics")));
        assert!(pool.run(&|_| {}));
    }

    #[test]
    fn more_threads_than_cores_still_meet() {
        // Four times the CPUs: every barrier round has threads that are not running.
        let n = 4 * std::thread::available_parallelism().map_or(1, |n| n.get()) + 1;
        let pool = ThreadPool::new(n).unwrap();
        let barrier = SpinBarrier::new(n);
        let sum = AtomicUsize::new(0);
        for _ in 0..20 {
            assert!(pool.run(&|_| {
                for _ in 0..25 {
                    sum.fetch_add(1, Ordering::Relaxed);
                    barrier.wait();
                }
            }));
        }
        assert_eq!(sum.load(Ordering::Relaxed), 20 * 25 * n);
    }

    #[test]
    fn loadavg_running_field() {
        assert_eq!(runnable_tasks("0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(runnable_tasks("0.52 0.58"), None);
        assert_eq!(runnable_tasks("a b c x/4 5"), None);
        let c = default_thread_count();
        assert!(c.threads >= 1 && c.threads <= c.allowed && c.busy <= c.allowed);
    }

    #[test]
    fn split_covers_range() {
        for n in 0..50 {
            for t in 1..5 {
                for g in [1, 4, 32] {
                    let mut next = 0;
                    for i in 0..t {
                        let r = split_range(n, i, t, g);
                        assert_eq!(r.start, next.min(n));
                        next = r.end;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }
}
