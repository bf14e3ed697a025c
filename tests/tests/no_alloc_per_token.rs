//! The per-token path allocates nothing: after the first token, `Session::step`, the sampler
//! and the streaming detokenizer run without touching the heap (a counting global allocator
//! proves it). This is what makes the memory plan true at run time.

use std::sync::atomic::Ordering;

use edge_tests::{ALLOCATIONS, COUNTING};
use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::sampling::{Sampler, SamplerConfig};
use edge_engine::session::{Session, SessionConfig};
use edge_tokenizers::StreamDecoder;

#[global_allocator]
static GLOBAL: edge_tests::CountingAlloc = edge_tests::CountingAlloc;

/// The counter is global: tests that count take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn decoding_allocates_nothing_per_token() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Arc::new(Model::load(edge_tests::smollm2_path()).unwrap());
    let tok = &model.tokenizer;
    for threads in [1, 2] {
        let cfg = SessionConfig {
            ctx: Some(256),
            ubatch: Some(16),
            threads: Some(threads),
            ..Default::default()
        };
        let mut session = Session::new(model.clone(), &cfg).unwrap();
        let mut sampler = Sampler::new(
            SamplerConfig {
                temperature: 0.8,
                seed: 7,
                ..Default::default()
            },
            model.params.n_vocab,
        );
        let mut stream = StreamDecoder::new();
        let prompt = tok
            .encode(
                "Once upon a time, there was a little robot who",
                false,
                true,
            )
            .unwrap();
        let mut next = sampler.sample(session.prefill(&prompt).unwrap());
        // One warm-up token (lazy initialisations in the kernels' CPU detection, etc.).
        sampler.accept(next);
        let _ = stream.push(next, tok);
        next = sampler.sample(session.step(next).unwrap());

        ALLOCATIONS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        let mut bytes = 0usize;
        for _ in 0..40 {
            sampler.accept(next);
            if let Some(text) = stream.push(next, tok) {
                bytes += text.len();
            }
            next = sampler.sample(session.step(next).unwrap());
        }
        COUNTING.store(false, Ordering::SeqCst);
        let n = ALLOCATIONS.load(Ordering::SeqCst);
        assert!(bytes > 0, "some text was produced");
        assert_eq!(n, 0, "{threads} threads: {n} heap allocations in 40 tokens");
    }
}

/// The same through the library's generation API: each `next` of the generator (a decode step,
/// sampling and the streamed text) allocates nothing.
#[test]
fn generation_api_allocates_nothing_per_token() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Arc::new(Model::load(edge_tests::smollm2_path()).unwrap());
    let cfg = SessionConfig {
        ctx: Some(256),
        threads: Some(2),
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &cfg).unwrap();
    let prompt = model
        .tokenize(
            "Once upon a time, there was a little robot who",
            false,
            true,
        )
        .unwrap();
    let options = edge_engine::generate::GenerateOptions {
        max_tokens: 100,
        stop_at_eog: false,
        ..Default::default()
    };
    let mut gen = session.generator(&prompt, &options).unwrap();
    // Warm-up tokens (lazy initialisations), as above.
    for _ in 0..2 {
        gen.next().unwrap().unwrap();
    }
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let mut bytes = 0usize;
    for _ in 0..40 {
        gen.next().unwrap().unwrap();
        bytes += gen.text().len();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert!(bytes > 0, "some text was produced");
    assert_eq!(n, 0, "{n} heap allocations in 40 generated tokens");
}

/// A second turn through the prompt cache: finding and cutting back to the shared prefix and
/// the generation after it allocate nothing per token either (the session's token buffer is
/// reserved for its whole context when it opens).
#[test]
fn cached_generation_allocates_nothing_per_token() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Arc::new(Model::load(edge_tests::smollm2_path()).unwrap());
    let cfg = SessionConfig {
        ctx: Some(256),
        threads: Some(2),
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &cfg).unwrap();
    let prompt = model
        .tokenize(
            "Once upon a time, there was a little robot who",
            false,
            true,
        )
        .unwrap();
    let options = edge_engine::generate::GenerateOptions {
        max_tokens: 30,
        stop_at_eog: false,
        ..Default::default()
    };
    session
        .generate_cached(&prompt, &options, |_| std::ops::ControlFlow::Continue(()))
        .unwrap();
    let mut turn2 = session.tokens().to_vec();
    turn2.extend(model.tokenize(" and then", false, true).unwrap());
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let kept = session.reuse_prefix(&turn2);
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(
        ALLOCATIONS.load(Ordering::SeqCst),
        0,
        "reuse_prefix allocated"
    );
    assert!(kept > prompt.len(), "kept {kept}");
    let mut gen = session.generator_cached(&turn2, &options).unwrap();
    for _ in 0..2 {
        gen.next().unwrap().unwrap();
    }
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..20 {
        gen.next().unwrap().unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(
        n, 0,
        "{n} heap allocations in 20 generated tokens after a cached prompt"
    );
}

/// The ops of the other architectures (biases, q/k norms, fused projections, GeGLU,
/// soft-capping, sliding-window ring buffers) allocate nothing per token either.
#[test]
fn every_architecture_decodes_without_allocating() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let donor = edge_engine::gguf::Gguf::open(edge_tests::smollm2_path()).unwrap();
    for name in edge_tests::synth::ARCH_MODELS {
        let bytes = edge_tests::synth::make_arch_model(name, &donor).unwrap();
        let gguf = edge_engine::gguf::Gguf::from_bytes(bytes).unwrap();
        let model = Arc::new(Model::from_gguf(gguf).unwrap());
        let cfg = SessionConfig {
            ctx: Some(128),
            ubatch: Some(4),
            threads: Some(2),
            ..Default::default()
        };
        let mut session = Session::new(model.clone(), &cfg).unwrap();
        let mut next = edge_engine::sampling::argmax(session.prefill(&[1, 2, 3, 4, 5]).unwrap());
        next = edge_engine::sampling::argmax(session.step(next).unwrap());
        ALLOCATIONS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        // 30 tokens: the sliding-window layers' rings (window 8 + ubatch 4 rows) wrap.
        for _ in 0..30 {
            next = edge_engine::sampling::argmax(session.step(next).unwrap());
        }
        COUNTING.store(false, Ordering::SeqCst);
        let n = ALLOCATIONS.load(Ordering::SeqCst);
        assert_eq!(n, 0, "{name}: {n} heap allocations in 30 tokens");
    }
}
