//! The context policy on the real model: under `ContextPolicy::Shift` a session generates far
//! past its context (n_past never above ctx), under `Stop` it refuses with `ContextFull`, and
//! impossible shifts are errors, not panics. The re-rotation itself is checked against RoPE
//! computed directly in `engine/core/src/kv` (its tests).

use std::sync::Arc;

use edge_engine::error::EngineError;
use edge_engine::kv::KvType;
use edge_engine::model::Model;
use edge_engine::sampling::argmax;
use edge_engine::session::{ContextPolicy, Session, SessionConfig};

fn model() -> Arc<Model> {
    Arc::new(Model::load(edge_tests::smollm2_path()).expect("model loads"))
}

fn session(model: &Arc<Model>, ctx: usize, kv_type: KvType) -> Session {
    Session::new(
        Arc::clone(model),
        &SessionConfig {
            ctx: Some(ctx),
            ubatch: Some(16),
            threads: Some(1),
            kv_type,
            ..Default::default()
        },
    )
    .expect("session")
}

fn prompt(model: &Model) -> Vec<u32> {
    model
        .tokenizer
        .encode("Once upon a time, in a small village,", true, true)
        .unwrap()
}

#[test]
fn shift_generates_200_tokens_in_a_context_of_64() {
    let model = model();
    for kv_type in [KvType::F16, KvType::Q8_0] {
        let mut s = session(&model, 64, kv_type);
        s.set_context_policy(ContextPolicy::Shift { keep: 1 });
        let ids = prompt(&model);
        let mut next = argmax(s.prefill(&ids).unwrap());
        let mut max_past = s.n_past();
        for i in 0..200 {
            let logits = s
                .step(next)
                .unwrap_or_else(|e| panic!("{kv_type:?} step {i}: {e}"));
            assert!(logits.iter().all(|x| x.is_finite()), "step {i}");
            next = argmax(logits);
            max_past = max_past.max(s.n_past());
            assert!(s.n_past() <= s.ctx(), "n_past {} > ctx", s.n_past());
        }
        assert_eq!(max_past, 64, "{kv_type:?}: the context filled up");
        // 200 + prompt tokens through 64 positions, about 31 freed per shift.
        assert!(s.n_shifts() >= 5, "{kv_type:?}: {} shifts", s.n_shifts());
        s.reset();
        assert_eq!((s.n_past(), s.n_shifts()), (0, 0));
    }
}

#[test]
fn shift_keeps_the_first_tokens_and_continues_coherently() {
    // Right after a shift that drops nothing the model attends to much, the greedy token equals
    // the one without the shift (keep everything but a small stretch of filler).
    let model = model();
    let ids = prompt(&model);
    let mut plain = session(&model, 128, KvType::F16);
    let mut shifted = session(&model, 128, KvType::F16);
    let a = argmax(plain.prefill(&ids).unwrap());
    let b = argmax(shifted.prefill(&ids).unwrap());
    assert_eq!(a, b);
    // Drop nothing: a shift of 0 positions is the identity.
    shifted.shift_context(1, 0).unwrap();
    assert_eq!(
        argmax(plain.step(a).unwrap()),
        argmax(shifted.step(b).unwrap())
    );
    // A real shift keeps the session usable and n_past consistent.
    let before = shifted.n_past();
    shifted.shift_context(1, 4).unwrap();
    assert_eq!(shifted.n_past(), before - 4);
    assert!(shifted.step(a).unwrap().iter().all(|x| x.is_finite()));
    // Dropping more than there is: an error naming the numbers.
    let e = shifted.shift_context(1, 1000).unwrap_err();
    assert!(
        matches!(e, EngineError::InvalidArgument(ref m) if m.contains("1000")),
        "{e}"
    );
}

#[test]
fn stop_policy_refuses_with_context_full() {
    let model = model();
    let mut s = session(&model, 32, KvType::F16);
    assert_eq!(s.context_policy(), ContextPolicy::Stop);
    let ids = prompt(&model);
    let mut next = argmax(s.prefill(&ids).unwrap());
    while s.n_past() < s.ctx() {
        next = argmax(s.step(next).unwrap());
    }
    let e = s.step(next).unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::ContextFull {
                ctx: 32,
                needed: 33,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("use a larger ctx"), "{e}");
}

#[test]
fn impossible_shifts_are_clear_errors() {
    let model = model();
    let ids = prompt(&model);
    // A prompt longer than the context: refused even with shifting, naming the context size.
    let mut s = session(&model, 8, KvType::F16);
    s.set_context_policy(ContextPolicy::Shift { keep: 1 });
    let e = s.prefill(&ids).unwrap_err();
    assert!(
        matches!(e, EngineError::ContextFull { what: "prompt", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("use a larger ctx"), "{e}");
    assert_eq!(s.n_past(), 0, "nothing ran");
    // Keeping the whole context leaves nothing to drop.
    let mut s = session(&model, 16, KvType::F16);
    s.set_context_policy(ContextPolicy::Shift { keep: 1000 });
    let mut next = argmax(s.prefill(&ids).unwrap());
    let e = loop {
        match s.step(next) {
            Ok(l) => next = argmax(l),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(e, EngineError::ContextShift { ctx: 16, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("use a smaller keep"), "{e}");
    // A prompt that must shift in the middle of its chunks works.
    let mut s = session(&model, 16, KvType::F16);
    s.set_context_policy(ContextPolicy::Shift { keep: 1 });
    s.prefill(&ids).unwrap();
    s.prefill(&ids).unwrap();
    assert!(s.n_past() <= 16 && s.n_shifts() > 0);
}
