//! Input an attacker (or a broken converter, or an over-the-air update) could hand the library,
//! each of which must end in an error naming the problem, never an abort, a NaN run that looks
//! normal, or a crash: hyper-parameters the file cannot back or that cannot be computed with,
//! weights that make the logits non-finite, a model file truncated, rewritten or renamed over
//! while a session uses it, and an interrupt during a long prompt.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use edge_engine::error::EngineError;
use edge_engine::generate::GenerateOptions;
use edge_engine::gguf::{GgufError, MetaValue};
use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::tiny::*;

fn load(parts: &Parts) -> Result<Model, EngineError> {
    let dir = TempDir::new("hostile");
    let path = dir.write("model.gguf", &parts.bytes());
    Model::load(&path)
}

fn with(f: impl FnOnce(&mut Parts)) -> Parts {
    let mut p = Parts::llama(DIMS);
    f(&mut p);
    p
}

fn session(model: &Arc<Model>, ctx: usize, ubatch: usize) -> Session {
    Session::new(
        Arc::clone(model),
        &SessionConfig {
            ctx: Some(ctx),
            ubatch: Some(ubatch),
            threads: Some(1),
            ..Default::default()
        },
    )
    .expect("session")
}

fn metadata_error(e: EngineError) -> (String, String) {
    match e {
        EngineError::Metadata { key, problem } => (key, problem),
        other => panic!("expected a Metadata error, got {other:?}"),
    }
}

// ---------------------------------------------------------------- hyper-parameters

/// A layer count the file cannot back is refused before anything is sized by it: 2^31 layers
/// used to abort at `Vec::with_capacity(n_layer)` (the 352-byte file); larger counts
/// are out of range.
#[test]
fn a_layer_count_the_file_cannot_back_is_refused() {
    for n in [1u64 << 31, 1 << 20, 100] {
        let e = load(&with(|p| {
            p.set("llama.block_count", MetaValue::U64(n));
        }))
        .unwrap_err();
        let (key, problem) = metadata_error(e);
        assert_eq!(key, "llama.block_count");
        assert!(problem.contains(&n.to_string()), "{problem}");
        assert!(problem.contains("tensors"), "{problem}");
    }
    // No tensors at all, as in the 352-byte file (this one carries a vocabulary).
    let mut p = with(|p| {
        p.set("llama.block_count", MetaValue::U64(1 << 31));
    });
    p.tensors.clear();
    let bytes = p.bytes();
    assert!(bytes.len() < 8192, "{} bytes", bytes.len());
    let e = load(&p).unwrap_err();
    assert!(
        matches!(&e, EngineError::MissingTensor { name, .. } if name == "token_embd.weight"),
        "{e:?}"
    );
    let e = load(&with(|p| {
        p.set("llama.block_count", MetaValue::U64(u64::MAX));
    }))
    .unwrap_err();
    assert_eq!(metadata_error(e).0, "llama.block_count");
}

/// NaN, infinite, zero or negative epsilons and rope bases are refused at load with the key
/// and the value: each would make every logit NaN.
#[test]
fn non_finite_or_non_positive_hyper_parameters_are_refused() {
    for key in [
        "llama.attention.layer_norm_rms_epsilon",
        "llama.rope.freq_base",
        "llama.rope.scaling.factor",
    ] {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0] {
            let e = load(&with(|p| {
                p.set(key, MetaValue::F32(v));
            }))
            .unwrap_err();
            let text = e.to_string();
            let (k, problem) = metadata_error(e);
            assert_eq!(k, key, "{key} = {v}: {text}");
            assert!(problem.contains(&v.to_string()), "{text}");
        }
    }
    for key in [
        "llama.attention.layer_norm_rms_epsilon",
        "llama.rope.freq_base",
    ] {
        let e = load(&with(|p| {
            p.set(key, MetaValue::F32(0.0));
        }))
        .unwrap_err();
        assert_eq!(metadata_error(e).0, key);
        // a string where a number belongs
        let e = load(&with(|p| {
            p.set(key, MetaValue::String("1e-5".into()));
        }))
        .unwrap_err();
        assert_eq!(metadata_error(e).0, key);
    }
}

// ---------------------------------------------------------------- non-finite logits

/// Weights that turn the logits into NaN or infinities end the run with an error: before, the
/// argmax of NaN logits picked a token (often the end of generation) and the run ended "normally".
#[test]
fn non_finite_logits_are_an_error_not_an_end_of_generation() {
    for bad in [f32::NAN, f32::INFINITY] {
        let mut parts = Parts::llama(DIMS);
        let norm = parts.tensor("output_norm.weight");
        norm.data[..4].copy_from_slice(&bad.to_le_bytes());
        let model = Arc::new(load(&parts).unwrap());
        let mut s = session(&model, 32, 8);
        let prompt = [1u32, 2, 3];
        for temperature in [0.0, 0.8] {
            s.reset();
            let mut options = GenerateOptions {
                max_tokens: 4,
                ..Default::default()
            };
            options.sampling.temperature = temperature;
            let Err(e) = s.generator(&prompt, &options) else {
                panic!("{bad}, temperature {temperature}: generation started");
            };
            assert!(
                matches!(
                    e,
                    EngineError::NonFinite {
                        what: "the logits",
                        position: 2
                    }
                ),
                "{bad}, temperature {temperature}: {e:?}"
            );
            assert!(e.to_string().contains("not finite"), "{e}");
        }
        s.reset();
        s.advance(&prompt).unwrap();
        assert!(matches!(s.argmax(), Err(EngineError::NonFinite { .. })));
    }
}

// ---------------------------------------------------------------- the file under a session

/// A model file truncated or rewritten in place is an error at the next run (the mapping
/// would fault or hold bytes that were never validated); a new file renamed over the path is
/// not: the session keeps the old file's mapping and computes the same logits.
#[test]
fn a_file_changed_under_a_session_is_an_error_and_a_rename_is_not() {
    let parts = Parts::llama(DIMS);
    let bytes = parts.bytes();
    let prompt = [5u32, 6, 7, 8];

    let dir = TempDir::new("hostile-file");
    let path = dir.write("model.gguf", &bytes);
    let reference = {
        let model = Arc::new(Model::load(&path).unwrap());
        let mut s = session(&model, 32, 8);
        s.advance(&prompt).unwrap();
        s.logits().to_vec()
    };

    // renamed over: unchanged
    let model = Arc::new(Model::load(&path).unwrap());
    let mut s = session(&model, 32, 8);
    s.advance(&prompt[..2]).unwrap();
    let other = with(|p| {
        p.set("general.name", MetaValue::String("another model".into()));
    });
    let new = dir.write("model.gguf.new", &other.bytes());
    std::fs::rename(&new, &path).unwrap();
    s.advance(&prompt[2..]).unwrap();
    assert_eq!(
        s.logits(),
        &reference[..],
        "the renamed-over session changed"
    );
    drop(s);
    drop(model);

    // truncated: refused before the run that would fault
    let path = dir.write("model.gguf", &bytes);
    let model = Arc::new(Model::load(&path).unwrap());
    let mut s = session(&model, 32, 8);
    s.advance(&prompt[..2]).unwrap();
    let n_past = s.n_past();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let e = s.advance(&prompt[2..]).unwrap_err();
    assert!(
        matches!(&e, EngineError::Gguf(GgufError::Changed { path: p }) if *p == path),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("model.gguf was truncated or rewritten while in use")
            && text.contains("renaming it over the old one"),
        "{text}"
    );
    assert_eq!(s.n_past(), n_past, "nothing ran");
    drop(s);
    drop(model);

    // rewritten in place, same length: refused too (its modification time moved)
    let path = dir.write("model.gguf", &bytes);
    let model = Arc::new(Model::load(&path).unwrap());
    let mut s = session(&model, 32, 8);
    s.advance(&prompt[..2]).unwrap();
    // File times have the kernel's coarse clock (a few ms): wait past one tick.
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::write(&path, &bytes).unwrap();
    let e = s.advance(&prompt[2..]).unwrap_err();
    assert!(
        matches!(&e, EngineError::Gguf(GgufError::Changed { .. })),
        "{e:?}"
    );
}

// ---------------------------------------------------------------- interrupts

/// A raised interrupt flag stops a long prompt between ubatch chunks, keeping what ran; the
/// rest then goes on from there, as if uninterrupted.
#[test]
fn an_interrupt_stops_a_long_prompt_between_chunks() {
    let model = Arc::new(load(&Parts::llama(DIMS)).unwrap());
    let prompt: Vec<u32> = (0..20).map(|i| 10 + i).collect();
    let mut whole = session(&model, 32, 8);
    whole.advance(&prompt).unwrap();
    let reference = whole.logits().to_vec();

    let mut s = session(&model, 32, 8);
    let flag = Arc::new(AtomicBool::new(true));
    s.set_interrupt(Arc::clone(&flag));
    let e = s.advance(&prompt).unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::Interrupted {
                processed: 8,
                requested: 20
            }
        ),
        "{e:?}"
    );
    assert_eq!(s.n_past(), 8);
    assert!(
        e.to_string().contains("interrupted after 8 of 20 tokens"),
        "{e}"
    );
    flag.store(false, std::sync::atomic::Ordering::Relaxed);
    s.advance(&prompt[8..]).unwrap();
    assert_eq!(s.logits(), &reference[..]);
}
