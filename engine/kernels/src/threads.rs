//! A persistent pool of worker threads that all run the same job, each with its own index.
//!
//! The executor hands the pool one job per forward pass; inside it every thread walks the
//! same op list, takes its share of each op and meets the others at a [`SpinBarrier`]. Threads
//! are created once per session, so a token costs no thread creation and no allocation.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spins this many times before yielding the core: an op of a small model lasts microseconds,
/// so a waiting thread usually gets its turn within the spin.
const SPINS_BEFORE_YIELD: u32 = 2_000;
/// Idle workers go to sleep after this many yields, so a pool between requests costs no CPU.
const YIELDS_BEFORE_SLEEP: u32 = 20;

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped by `run` to publish a new job.
    generation: AtomicUsize,
    /// Workers still running the current job.
    remaining: AtomicUsize,
    /// The current job; written only while no worker runs (remaining == 0), read after
    /// `generation` is observed to change (acquire), so reads never race with writes.
    job: UnsafeCell<Option<Job>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field; access is ordered by `generation` (release on
// publish, acquire before reading) and `remaining` (no write while a worker may read).
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced while `run` keeps its referent alive.
unsafe impl Send for Shared {}

/// A fixed set of threads that run jobs of the form `Fn(thread_index)`; the caller is thread 0.
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
            generation: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
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
        // workers only read it after seeing a new generation, which we publish below.
        unsafe { *s.job.get() = Some(ptr) };
        s.remaining.store(self.n_threads - 1, Ordering::Relaxed);
        {
            let _guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.generation.fetch_add(1, Ordering::Release);
            s.wake.notify_all();
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0))).is_ok();
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            backoff(&mut spins);
        }
        ok && !s.panicked.load(Ordering::Relaxed)
    }
}

fn backoff(spins: &mut u32) {
    if *spins < SPINS_BEFORE_YIELD {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *spins = spins.saturating_add(1);
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            if spins < SPINS_BEFORE_YIELD + YIELDS_BEFORE_SLEEP {
                backoff(&mut spins);
            } else {
                let guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                if s.generation.load(Ordering::Acquire) == seen
                    && !s.shutdown.load(Ordering::Acquire)
                {
                    drop(s.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        seen = s.generation.load(Ordering::Acquire);
        // SAFETY: a new generation was published with the job written before it (release /
        // acquire), and `run` keeps the job alive until we decrement `remaining`.
        let job = unsafe { (*s.job.get()).expect("job published with generation") };
        // SAFETY: see above: the referent outlives this call.
        let job = unsafe { &*job };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(index))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _guard = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A barrier for the threads of one pool job: all `n` threads call [`SpinBarrier::wait`]
/// between ops. Spins briefly (ops of a small model last microseconds), then sleeps on a
/// condition variable, so an oversubscribed machine (other processes, parallel tests) does not
/// turn every barrier into a scheduler time slice.
pub struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Spins at a barrier before sleeping.
const BARRIER_SPINS: u32 = 20_000;

impl SpinBarrier {
    /// A barrier for `n` threads.
    pub fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Blocks until all `n` threads have called `wait` for this round. Writes made before
    /// `wait` by any thread are visible to all threads after it.
    pub fn wait(&self) {
        if self.n == 1 {
            return;
        }
        let gen = self.generation.load(Ordering::SeqCst);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::SeqCst);
            // SeqCst on `generation` and `sleepers` on both sides: either we see the sleeper
            // and wake it, or it sees the new generation before it sleeps.
            if self.sleepers.load(Ordering::SeqCst) > 0 {
                let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.wake.notify_all();
            }
            return;
        }
        for _ in 0..BARRIER_SPINS {
            if self.generation.load(Ordering::Acquire) != gen {
                return;
            }
            std::hint::spin_loop();
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.generation.load(Ordering::SeqCst) == gen {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
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

    #[test]
    fn panics_are_reported() {
        let pool = ThreadPool::new(2).unwrap();
        assert!(!pool.run(&|i| assert!(i != 1, "worker panics")));
        assert!(pool.run(&|_| {}));
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
