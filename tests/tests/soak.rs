//! Soak: a long generation with context shifting keeps memory flat. 20,000 tokens (override
//! with `EDGE_RUN_SOAK_TOKENS`) through a context of 128 with `ContextPolicy::Shift`, sampled
//! and detokenized as the CLI does; VmRSS (from /proc/self/status) after a warm-up that
//! includes the first shifts and at the end must differ by less than 1 MiB, and the measured
//! phase — hundreds of shifts included — must not touch the heap at all.
//!
//! Minutes long, so `#[ignore]`d in the normal suite: `scripts/soak.sh` runs it (CI does), with
//! `--test-threads=1`: with more, libtest's own main thread allocates a "has been running for
//! over 60 seconds" warning while the test counts (seen as 3 allocations in a CI run).

use std::sync::atomic::Ordering;

use edge_tests::{ALLOCATIONS, COUNTING};
use std::sync::Arc;
use std::time::Instant;

use edge_engine::model::Model;
use edge_engine::sampling::{Sampler, SamplerConfig};
use edge_engine::session::{ContextPolicy, Session, SessionConfig};
use edge_tokenizers::StreamDecoder;

#[global_allocator]
static GLOBAL: edge_tests::CountingAlloc = edge_tests::CountingAlloc;

/// Resident memory of this process in KiB (Linux).
fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// RSS may grow by less than this between the warm-up and the end.
const MAX_GROWTH_KIB: u64 = 1024;

#[test]
#[ignore = "minutes long: run by scripts/soak.sh"]
fn twenty_thousand_tokens_with_context_shift_keep_rss_flat() {
    let n_tokens: usize = std::env::var("EDGE_RUN_SOAK_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let warm_up = 1_000.min(n_tokens / 2);
    let model = Arc::new(Model::load(edge_tests::smollm2_path()).expect("model"));
    let mut session = Session::new(
        Arc::clone(&model),
        &SessionConfig {
            ctx: Some(128),
            threads: Some(2),
            ..Default::default()
        },
    )
    .expect("session");
    session.set_context_policy(ContextPolicy::Shift { keep: 1 });
    let tok = &model.tokenizer;
    let prompt = tok
        .encode("Tell me a very long story about a robot.", true, true)
        .unwrap();
    let mut sampler = Sampler::new(
        SamplerConfig {
            temperature: 0.8,
            seed: 7,
            ..Default::default()
        },
        model.params.n_vocab,
    );
    let mut stream = StreamDecoder::new();
    let mut text_bytes = 0usize;
    let mut next = sampler.sample(session.prefill(&prompt).unwrap());
    let t0 = Instant::now();
    let mut rss_warm = 0;
    let mut shifts_warm = 0;
    let mut max_past = 0;
    for i in 0..n_tokens {
        if i == warm_up {
            rss_warm = vm_rss_kib();
            shifts_warm = session.n_shifts();
            assert!(shifts_warm > 0, "the warm-up includes shifts");
            COUNTING.store(true, Ordering::SeqCst);
        }
        sampler.accept(next);
        if let Some(s) = stream.push(next, tok) {
            text_bytes += s.len();
        }
        let logits = session
            .step(next)
            .unwrap_or_else(|e| panic!("token {i}: {e}"));
        next = sampler.sample(logits);
        max_past = max_past.max(session.n_past());
    }
    COUNTING.store(false, Ordering::SeqCst);
    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    let rss_end = vm_rss_kib();
    let secs = t0.elapsed().as_secs_f64();
    let shifts = session.n_shifts() - shifts_warm;
    eprintln!(
        "soak: {n_tokens} tokens in {secs:.1} s ({:.1} tok/s), {} context shifts ({shifts} measured), \
         {text_bytes} bytes of text; VmRSS {rss_warm} KiB after {warm_up} tokens, {rss_end} KiB at the end \
         ({:+} KiB); {allocations} heap allocations in the measured phase",
        n_tokens as f64 / secs,
        session.n_shifts(),
        rss_end as i64 - rss_warm as i64,
    );
    assert!(max_past <= session.ctx());
    assert!(shifts > 0 || n_tokens < 200, "no shift measured");
    assert_eq!(allocations, 0, "the measured phase allocated");
    assert!(
        rss_end <= rss_warm + MAX_GROWTH_KIB,
        "VmRSS grew from {rss_warm} KiB to {rss_end} KiB"
    );
}
