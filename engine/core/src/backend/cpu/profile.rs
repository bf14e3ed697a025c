//! `EDGE_RUN_PROFILE=1`: where each thread's time goes, per kind of op, in decode and in
//! prefill runs — running its share of the op, and waiting at the barrier after it — logged
//! (`-v`) when the executor is dropped.
//!
//! A decode step of a small model is hundreds of ops of a few microseconds, and a sampling
//! profiler shows the waiting only as time in the barrier: this says after which ops, and
//! which thread waits for which. It is how stop 43 found one core of a VM running 10–15%
//! slower than the other for a whole run (see `edge_kernels::balance`). Off, it costs one
//! branch per op; on, two clock reads per op and thread. Runs that take shared parts (a
//! contended machine) are not counted.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::shares::run_phase as phase;
use crate::graph::OP_KINDS;

/// One kind of op's tally in one phase on one thread.
#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    run_ns: AtomicU64,
    wait_ns: AtomicU64,
}

/// One thread's tallies, `[decode, prefill][kind]`, alone on its cache lines.
#[repr(align(128))]
struct ThreadTallies {
    by_kind: [[Tally; OP_KINDS.len()]; 2],
}

/// Per-thread, per-kind time of the barrier runs of one executor.
pub(super) struct OpProfile {
    threads: Box<[ThreadTallies]>,
    /// Runs counted, `[decode, prefill]`.
    runs: [AtomicU64; 2],
}

impl OpProfile {
    /// A profile if `EDGE_RUN_PROFILE=1`, else `None`.
    pub(super) fn from_env(n_threads: usize) -> Option<OpProfile> {
        (std::env::var("EDGE_RUN_PROFILE").as_deref() == Ok("1")).then(|| OpProfile {
            threads: (0..n_threads.max(1))
                .map(|_| ThreadTallies {
                    by_kind: std::array::from_fn(|_| std::array::from_fn(|_| Tally::default())),
                })
                .collect(),
            runs: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// Counts one run of `tokens` (call once per run).
    pub(super) fn count_run(&self, tokens: usize) {
        self.runs[phase(tokens)].fetch_add(1, Relaxed);
    }

    /// Adds one op of kind `kind` to `thread`'s tally: `run` spent on its share, `wait` at
    /// the barrier after it.
    pub(super) fn add(
        &self,
        thread: usize,
        tokens: usize,
        kind: usize,
        run: Duration,
        wait: Duration,
    ) {
        if let Some(t) = self.threads.get(thread) {
            let tally = &t.by_kind[phase(tokens)][kind];
            tally.ops.fetch_add(1, Relaxed);
            tally.run_ns.fetch_add(run.as_nanos() as u64, Relaxed);
            tally.wait_ns.fetch_add(wait.as_nanos() as u64, Relaxed);
        }
    }

    /// The tallies as log lines: per phase that ran, a line per kind of op with each thread's
    /// microseconds per run spent running and waiting, and the totals.
    pub(super) fn report(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (p, name) in ["decode", "prefill"].into_iter().enumerate() {
            let runs = self.runs[p].load(Relaxed);
            if runs == 0 {
                continue;
            }
            let per_run = |ns: u64| ns as f64 / runs as f64 / 1e3;
            lines.push(format!(
                "profile: {name}, {runs} runs; per run, each thread's µs running its share / \
                 waiting at the barrier after it"
            ));
            let mut total = vec![(0u64, 0u64); self.threads.len()];
            for (k, kind) in OP_KINDS.iter().enumerate() {
                let ops = self.threads[0].by_kind[p][k].ops.load(Relaxed);
                if ops == 0 {
                    continue;
                }
                let mut cells = Vec::new();
                for (t, th) in self.threads.iter().enumerate() {
                    let tally = &th.by_kind[p][k];
                    let (run, wait) = (tally.run_ns.load(Relaxed), tally.wait_ns.load(Relaxed));
                    total[t].0 += run;
                    total[t].1 += wait;
                    cells.push(format!("{:.1} / {:.1}", per_run(run), per_run(wait)));
                }
                lines.push(format!(
                    "profile:   {kind:<17} {:>5.0} per run: {}",
                    ops as f64 / runs as f64,
                    cells.join(", ")
                ));
            }
            let cells: Vec<String> = total
                .iter()
                .map(|&(run, wait)| format!("{:.1} / {:.1}", per_run(run), per_run(wait)))
                .collect();
            lines.push(format!(
                "profile:   {:<17}      all: {}",
                "total",
                cells.join(", ")
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report puts each thread's time per run under its op kind and phase.
    #[test]
    fn report_averages_per_run_and_sums_the_threads_columns() {
        let p = OpProfile {
            threads: (0..2)
                .map(|_| ThreadTallies {
                    by_kind: std::array::from_fn(|_| std::array::from_fn(|_| Tally::default())),
                })
                .collect(),
            runs: [AtomicU64::new(0), AtomicU64::new(0)],
        };
        let us = Duration::from_micros;
        for _ in 0..2 {
            p.count_run(1);
            p.add(0, 1, 3, us(10), us(2));
            p.add(1, 1, 3, us(12), us(0));
            p.add(0, 1, 1, us(1), us(1));
            p.add(1, 1, 1, us(1), us(1));
        }
        let r = p.report();
        assert_eq!(r.len(), 4, "{r:#?}");
        assert!(r[0].starts_with("profile: decode, 2 runs"));
        assert!(r[1].contains("rms_norm") && r[1].contains("1 per run: 1.0 / 1.0, 1.0 / 1.0"));
        assert!(
            r[2].contains("matmul") && r[2].contains("10.0 / 2.0, 12.0 / 0.0"),
            "{r:#?}"
        );
        assert!(r[3].contains("all: 11.0 / 3.0, 13.0 / 1.0"), "{r:#?}");
    }
}
