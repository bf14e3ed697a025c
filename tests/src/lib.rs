//! Helpers shared by the end-to-end tests in `tests/tests/`: where the reference data and the
//! real model are, what a test does when something it needs is missing ([`missing`]),
//! JSON-lines reading, greedy decoding as the reference does it, and a counting global
//! allocator.

pub mod synth;
pub mod tiny;

use std::path::PathBuf;

/// Whether this run is CI's: the environment variable `CI` is `true` or `1` (CI services set it).
pub fn in_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

/// What a test does when something it needs is missing (`what`, and `how` to get it): outside
/// CI it says so on stderr and the caller returns (a local run without, say, llama.cpp's
/// quantizer still runs the rest); under `CI=true` it fails, naming both, because CI provides
/// everything and a skip there would pass as a test that ran. Call it as
/// `return missing(...)` or `missing(...); return`.
pub fn missing(what: impl std::fmt::Display, how: impl std::fmt::Display) {
    if in_ci() {
        panic!("{what} is missing: {how} (CI=true: a test that cannot run fails)");
    }
    eprintln!("skipped: {what} is missing: {how}");
}

/// `../shared` beside the repository (override with `EDGE_RUN_SHARED`).
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("EDGE_RUN_SHARED") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// The SmolLM2-135M-Instruct Q4_1 model (override with `EDGE_RUN_MODEL`). Panics with the fix
/// if it is missing: tests need the real model.
pub fn smollm2_path() -> PathBuf {
    let p = match std::env::var_os("EDGE_RUN_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh first (the README's test command does)",
        p.display()
    );
    p
}

/// Reads a JSON-lines file into values.
pub fn read_jsonl(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// A JSON array of integers as token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Resident bytes of the mappings of `file` (from /proc/self/smaps).
pub fn mapped_rss(file: &str) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_file = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            in_file = line.ends_with(file);
        } else if in_file {
            if let Some(v) = line.strip_prefix("Rss:") {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib * 1024
}

/// Greedy decoding as the reference does it: argmax over raw logits, stop after EOS.
pub fn greedy(session: &mut edge_engine::session::Session, prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_seeing(session, prompt, n, |_| {})
}

/// [`greedy`], handing `see` the logits of the prompt and of every decode step, in order.
pub fn greedy_seeing(
    session: &mut edge_engine::session::Session,
    prompt: &[u32],
    n: usize,
    mut see: impl FnMut(&[f32]),
) -> Vec<u32> {
    use edge_engine::sampling::argmax;
    let eos = session.model().tokenizer.eos_id();
    let mut out = Vec::new();
    let logits = session.prefill(prompt).expect("prefill");
    see(logits);
    let mut next = argmax(logits);
    for _ in 0..n {
        out.push(next);
        if Some(next) == eos || out.len() == n {
            break;
        }
        let logits = session.step(next).expect("step");
        see(logits);
        next = argmax(logits);
    }
    out
}

/// A session of `model` with a 512-token context on `threads` threads with `kernels` (the
/// reference tests' set-up: every greedy reference case fits).
pub fn session_on(
    model: &std::sync::Arc<edge_engine::model::Model>,
    threads: usize,
    kernels: edge_engine::kernels::Kernels,
) -> edge_engine::session::Session {
    use edge_engine::session::{Session, SessionConfig, SessionPlan};
    let cfg = SessionConfig {
        ctx: Some(512),
        threads: Some(threads),
        ..Default::default()
    };
    let plan = SessionPlan::new(model, &cfg).expect("planning a 512-token session");
    Session::from_plan_with_kernels(model.clone(), plan, kernels).expect("opening the session")
}

/// A global allocator that forwards to the system's and, while [`COUNTING`] is set, counts
/// allocations and reallocations in [`ALLOCATIONS`]. A test binary installs it with
/// `#[global_allocator] static GLOBAL: edge_tests::CountingAlloc = edge_tests::CountingAlloc;`
/// (each test binary has its own counters).
pub struct CountingAlloc;

/// Whether [`CountingAlloc`] counts.
pub static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Allocations and reallocations counted by [`CountingAlloc`].
pub static ALLOCATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[inline(always)]
fn count() {
    use std::sync::atomic::Ordering;
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// all-MiniLM-L6-v2 converted to GGUF by scripts/fetch-embed-model.sh (override with
/// `EDGE_RUN_EMBED_MODEL`), or `None` after [`missing`] (outside CI the embedding tests then
/// skip; in CI, which runs the script first through scripts/test.sh, they fail).
pub fn minilm_path() -> Option<PathBuf> {
    let p = match std::env::var_os("EDGE_RUN_EMBED_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2.f16.gguf")
        }
    };
    if p.exists() {
        Some(p)
    } else {
        missing(
            p.display(),
            "run scripts/fetch-embed-model.sh (scripts/test.sh does)",
        );
        None
    }
}
