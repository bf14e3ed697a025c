//! Waiting for other threads without owning the machine: spin for as long as spinning has been
//! paying off, then sleep on a futex.
//!
//! A decode step of a small model meets its threads at a barrier several hundred times, each
//! wait lasting microseconds, so the waits must spin: a futex sleep and wake-up costs tens of
//! microseconds. But a robot's cores are shared: when a thread of ours is descheduled (more
//! threads than free cores, another process decoding, a CPU-bound neighbour), the others would
//! spin for the scheduler's whole time slice while the thread they wait for cannot run. So the
//! spin is bounded by a budget in nanoseconds that adapts to what the waits turned out to be:
//! a wait that outlasted the spin but ended soon after ([`SpinBudget::MAX_NS`]) while the
//! partner ran elsewhere doubles it (a longer spin would have caught it); a wait much longer
//! than that, or one that a yield of our core ended, halves it (a descheduled partner:
//! spinning only kept it off the core). After the spin a waiter yields its core for up to
//! [`YIELD_PHASE_NS`] (a partner in the same run queue gets it at once), then sleeps on a futex
//! (`atomic-wait`: futex on Linux, `WaitOnAddress` on Windows, `ulock` on macOS), so a
//! sleeping thread costs no CPU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// How long the threads of one pool spin before they sleep, adapted to the waits they see.
pub struct SpinBudget {
    nanos: AtomicU32,
}

impl SpinBudget {
    /// The shortest spin: a few hundred nanoseconds still catches a partner that is about to
    /// arrive, at the price of one clock read.
    pub const MIN_NS: u32 = 500;
    /// The longest spin; a wait longer than this is a partner that is not running.
    pub const MAX_NS: u32 = 200_000;
    /// Where a new pool starts: long enough for the op imbalance of a small model.
    pub const START_NS: u32 = 50_000;

    /// A budget at [`SpinBudget::START_NS`].
    pub fn new() -> SpinBudget {
        SpinBudget::starting_at(Self::START_NS)
    }

    /// A budget starting at `nanos` (clamped to the allowed range).
    pub fn starting_at(nanos: u32) -> SpinBudget {
        SpinBudget {
            nanos: AtomicU32::new(nanos.clamp(Self::MIN_NS, Self::MAX_NS)),
        }
    }

    /// Starts adapting afresh from [`SpinBudget::START_NS`].
    pub fn reset(&self) {
        self.nanos.store(Self::START_NS, Ordering::Relaxed);
    }

    /// The current spin, in nanoseconds.
    pub fn nanos(&self) -> u32 {
        self.nanos.load(Ordering::Relaxed)
    }

    /// Learns from a wait that did not end within the spin and took `waited_ns` in all;
    /// `gave_core`: a yield on the way handed this core to another thread (the partner, or
    /// another process), so spinning only delayed that.
    fn after_wait(&self, waited_ns: u64, gave_core: bool) {
        let now = self.nanos();
        let next = if !gave_core && waited_ns <= u64::from(Self::MAX_NS) {
            // The partner was running elsewhere and a slightly longer spin would have caught
            // it: spin up to twice that long.
            now.saturating_mul(2)
                .max((waited_ns as u32).saturating_mul(2))
        } else {
            now / 2
        };
        // Relaxed: the budget is a hint; a lost update between threads only delays adapting.
        self.nanos
            .store(next.clamp(Self::MIN_NS, Self::MAX_NS), Ordering::Relaxed);
    }
}

impl Default for SpinBudget {
    fn default() -> Self {
        SpinBudget::new()
    }
}

/// A counter that threads wait on to change: [`Event::signal`] bumps it and wakes the sleepers.
pub struct Event {
    word: AtomicU32,
    sleepers: AtomicU32,
}

impl Event {
    /// An event at count 0.
    pub fn new() -> Event {
        Event {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    /// The current count. Writes made before a [`Event::signal`] are visible to a thread that
    /// reads the count it set.
    pub fn current(&self) -> u32 {
        self.word.load(Ordering::Acquire)
    }

    /// Bumps the count and wakes every thread waiting for it to change.
    pub fn signal(&self) {
        // SeqCst on the count and on `sleepers`, here and in `wait_past`: either we see the
        // sleeper and wake it, or it sees the new count before it sleeps.
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            atomic_wait::wake_all(&self.word);
        }
    }

    /// Returns once the count differs from `seen`: spins within `budget`, then yields the core
    /// for up to [`YIELD_PHASE_NS`], then sleeps. Returns whether the wait outlasted the spin.
    ///
    /// The yields are what make an oversubscribed machine work: when the thread we wait for
    /// shares our core's run queue (more threads than cores, another process's threads), a
    /// yield hands it the core in a microsecond or two, where a futex sleep and wake-up costs
    /// tens of microseconds and an interrupt to another core.
    pub fn wait_past(&self, seen: u32, budget: &SpinBudget) -> bool {
        let start = Instant::now();
        let spin_ns = u128::from(budget.nanos());
        loop {
            for _ in 0..32 {
                if self.word.load(Ordering::Acquire) != seen {
                    return false;
                }
                std::hint::spin_loop();
            }
            if start.elapsed().as_nanos() >= spin_ns {
                break;
            }
        }
        let mut gave_core = false;
        while start.elapsed().as_nanos() < u128::from(YIELD_PHASE_NS) {
            if self.word.load(Ordering::Acquire) != seen {
                budget.after_wait(elapsed_ns(start), gave_core);
                return true;
            }
            let t = Instant::now();
            std::thread::yield_now();
            // A yield that took this long ran another thread on this core.
            gave_core |= t.elapsed().as_nanos() > u128::from(GAVE_CORE_NS);
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.word.load(Ordering::SeqCst) == seen {
            // Returns at once if the word no longer holds `seen` (checked by the kernel
            // atomically with going to sleep), and may return spuriously: hence the loop.
            atomic_wait::wait(&self.word, seen);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        // Acquire what the signalling thread wrote before it signalled.
        std::sync::atomic::fence(Ordering::Acquire);
        budget.after_wait(elapsed_ns(start), true);
        true
    }
}

/// How long a waiter keeps yielding before it sleeps: past this, whoever it waits for is not
/// about to arrive (the caller is idle between requests, or the machine is overloaded).
pub const YIELD_PHASE_NS: u64 = 1_000_000;
/// A yield that returns after this long has run another thread.
const GAVE_CORE_NS: u64 = 5_000;

fn elapsed_ns(start: Instant) -> u64 {
    start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Default for Event {
    fn default() -> Self {
        Event::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn budget_grows_for_short_waits_and_shrinks_for_long_ones() {
        let b = SpinBudget::starting_at(10_000);
        b.after_wait(15_000, false);
        assert_eq!(
            b.nanos(),
            30_000,
            "a wait just past the spin: spin twice as long"
        );
        b.after_wait(5_000_000, false);
        assert_eq!(b.nanos(), 15_000, "a time slice: halve");
        b.after_wait(10_000, true);
        assert_eq!(
            b.nanos(),
            7_500,
            "a yield ran the partner: spinning only delayed it"
        );
        for _ in 0..40 {
            b.after_wait(5_000_000, true);
        }
        assert_eq!(b.nanos(), SpinBudget::MIN_NS);
        for _ in 0..40 {
            b.after_wait(150_000, false);
        }
        assert_eq!(b.nanos(), SpinBudget::MAX_NS);
    }

    #[test]
    fn a_sleeper_is_woken() {
        // A budget at the minimum makes the waiter sleep almost at once.
        let event = Arc::new(Event::new());
        let budget = Arc::new(SpinBudget::starting_at(0));
        let seen = event.current();
        let waiter = {
            let (event, budget) = (Arc::clone(&event), Arc::clone(&budget));
            std::thread::spawn(move || event.wait_past(seen, &budget))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        event.signal();
        assert!(waiter.join().unwrap(), "a 20 ms wait outlasts any spin");
        assert_ne!(event.current(), seen);
    }
}
