//! What `GET /metrics` shows, in Prometheus' text format: requests by endpoint and status,
//! prompt and generated tokens, time-to-first-token and per-token latency histograms, slots
//! busy, requests waiting, and the memory planned at start-up. Counters are atomics, updated by
//! the handlers and the slot workers without a lock (the per-status table takes one, once per
//! request).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A histogram with fixed buckets (upper bounds in seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const TOKEN_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];

/// The memory plan shown as gauges (bytes; per slot unless named a total).
#[derive(Debug, Clone, Copy, Default)]
pub struct PlannedMemory {
    /// Slots.
    pub slots: usize,
    /// Context of each slot, in tokens.
    pub ctx: usize,
    /// Mapped weights (shared by the slots).
    pub weights: u64,
    /// One slot's KV cache.
    pub kv: u64,
    /// The slots decode together (CPU): one arena and one scratch serve them all.
    pub together: bool,
    /// The arena: the group's one (together), or one slot's.
    pub arena: u64,
    /// The scratch (with the slots' logits rows, together), or one slot's.
    pub scratch: u64,
    /// The budget, if one was given.
    pub budget: Option<u64>,
}

impl PlannedMemory {
    /// What the slots own together: the KV caches, and the one arena and scratch (together)
    /// or each slot's.
    pub fn owned_total(&self) -> u64 {
        let n = self.slots as u64;
        if self.together {
            self.kv * n + self.arena + self.scratch
        } else {
            (self.kv + self.arena + self.scratch) * n
        }
    }
}

/// The server's counters.
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Prompt tokens processed.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV rows came from a slot's cache.
    pub cached_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Request arrival to first generated token.
    pub ttft: Histogram,
    /// Time between consecutive generated tokens.
    pub token_latency: Histogram,
    /// Slots generating now.
    pub slots_busy: AtomicU64,
    /// Requests waiting for a slot.
    pub queued: AtomicU64,
    /// Generations stopped because the client went away.
    pub disconnects: AtomicU64,
    plan: PlannedMemory,
}

impl Metrics {
    /// Counters at zero, with the plan to show.
    pub fn new(plan: PlannedMemory) -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            token_latency: Histogram::new(TOKEN_BUCKETS),
            slots_busy: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            plan,
        }
    }

    /// Counts a response of `status` to `endpoint`.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint, status)).or_default() += 1;
        }
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP edge_run_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE edge_run_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((endpoint, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "edge_run_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        counter(
            &mut out,
            "edge_run_prompt_tokens_total",
            "Prompt tokens processed.",
            &self.prompt_tokens,
        );
        counter(
            &mut out,
            "edge_run_prompt_tokens_cached_total",
            "Prompt tokens found in a slot's cache (the prompt cache), not processed again.",
            &self.cached_tokens,
        );
        counter(
            &mut out,
            "edge_run_generated_tokens_total",
            "Tokens generated.",
            &self.generated_tokens,
        );
        counter(
            &mut out,
            "edge_run_client_disconnects_total",
            "Generations stopped because the client went away.",
            &self.disconnects,
        );
        self.ttft.render(
            &mut out,
            "edge_run_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
        );
        self.token_latency.render(
            &mut out,
            "edge_run_token_latency_seconds",
            "Time between consecutive generated tokens of one request.",
        );
        let p = &self.plan;
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "edge_run_slots",
            "Slots planned at start-up.",
            p.slots as u64,
        );
        gauge(
            &mut out,
            "edge_run_slots_busy",
            "Slots generating now.",
            self.slots_busy.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "edge_run_requests_queued",
            "Requests waiting for a slot.",
            self.queued.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "edge_run_slot_context_tokens",
            "Context of each slot.",
            p.ctx as u64,
        );
        let _ = writeln!(
            out,
            "# HELP edge_run_memory_planned_bytes Memory planned at start-up: each slot's KV cache, the arena and scratch (shared by slots that decode together, else per slot), the weights (mapped, shared) and what the slots own in total.\n# TYPE edge_run_memory_planned_bytes gauge"
        );
        let (arena, scratch) = if p.together {
            ("arena_shared", "scratch_shared")
        } else {
            ("arena_per_slot", "scratch_per_slot")
        };
        for (part, v) in [
            ("kv_per_slot", p.kv),
            (arena, p.arena),
            (scratch, p.scratch),
            ("weights", p.weights),
            ("owned_total", p.owned_total()),
        ] {
            let _ = writeln!(out, "edge_run_memory_planned_bytes{{part=\"{part}\"}} {v}");
        }
        if let Some(b) = p.budget {
            gauge(
                &mut out,
                "edge_run_memory_budget_bytes",
                "The memory budget (--mem-budget / --target).",
                b,
            );
        }
        out
    }
}
