//! The prompt cache and saved state on the real model. A session that reuses the prefix a new
//! prompt shares with what it holds must give exactly (bit for bit) the logits and greedy tokens
//! of a fresh session given the whole prompt, and llama.cpp's reference tokens where they apply;
//! a state saved and loaded into another session must continue exactly as the uninterrupted
//! run; and a state file from another model, another session shape, or a truncated or damaged
//! file must be a typed error that leaves the session as it was, never a panic.

use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};

use edge_engine::error::EngineError;
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::kv::KvType;
use edge_engine::model::Model;
use edge_engine::session::{ContextPolicy, Session, SessionConfig, StateError};
use edge_tests::tiny::{Parts, TempDir, DIMS};
use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2")))
        .clone()
}

fn session_with(model: &Arc<Model>, ctx: usize, ubatch: usize, kv_type: KvType) -> Session {
    Session::new(
        Arc::clone(model),
        &SessionConfig {
            ctx: Some(ctx),
            ubatch: Some(ubatch),
            threads: Some(1),
            kv_type,
            ..Default::default()
        },
    )
    .expect("session")
}

fn session(model: &Arc<Model>) -> Session {
    session_with(model, 256, 16, KvType::F16)
}

/// Greedy tokens of `prompt` through `generate_cached` (`cached`) or `generate`.
fn greedy(s: &mut Session, prompt: &[u32], n: usize, cached: bool) -> Vec<u32> {
    let mut out = Vec::new();
    let on = |e: edge_engine::generate::GenerateEvent<'_>| {
        out.extend(e.token);
        ControlFlow::Continue(())
    };
    let opts = GenerateOptions::greedy(n);
    let done = if cached {
        s.generate_cached(prompt, &opts, on)
    } else {
        s.generate(prompt, &opts, on)
    }
    .expect("generate");
    if let StopReason::EndOfGeneration(t) = done.stop_reason {
        out.push(t);
    }
    out
}

fn tokenize(model: &Model, text: &str) -> Vec<u32> {
    model.tokenizer.encode(text, true, true).unwrap()
}

/// ChatML as SmolLM2's template renders it (written out here, independently of the template
/// engine), with its default system message.
fn chatml(turns: &[(&str, &str)]) -> String {
    let mut s = String::from(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    );
    for (role, text) in turns {
        s.push_str(&format!("<|im_start|>{role}\n{text}<|im_end|>\n"));
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

#[test]
fn reused_prefix_gives_the_logits_of_a_fresh_session_bit_for_bit() {
    let model = model();
    let long = tokenize(
        &model,
        "The capital of France is Paris, and the capital of Germany is Berlin. The capital of Italy is",
    );
    for ubatch in [16, 19, 2, 3] {
        let new = || session_with(&model, 64, ubatch, KvType::F16);
        let mut fresh = new();
        let want = fresh.prefill(&long).unwrap().to_vec();
        // Cuts that land on, before and after ubatch boundaries, and the whole prompt.
        for cut in [
            1,
            2,
            5,
            15,
            16,
            17,
            18,
            long.len() - 2,
            long.len() - 1,
            long.len(),
        ] {
            // The reused rows must come from runs of several tokens: a one-token run takes the
            // decode graph, whose sums are added in another order (llama.cpp's too).
            if cut % ubatch == 1 {
                continue;
            }
            let mut s = new();
            s.prefill(&long[..cut]).unwrap();
            // Something else after the prefix, which the reuse must drop.
            s.step(model.tokenizer.encode(" banana", false, false).unwrap()[0])
                .unwrap();
            let predicted = s.reusable_prefix(&long);
            let kept = s.reuse_prefix(&long);
            assert_eq!(predicted, kept);
            let most = cut.min(long.len() - 1);
            assert!(kept <= most && kept + 3 >= most, "cut {cut}: kept {kept}");
            assert_eq!(s.tokens(), &long[..kept]);
            assert!(s.logits().is_empty(), "logits after a truncation");
            let got = s.prefill_rest(&long[kept..], long.len()).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "ubatch {ubatch}, cut {cut}: logits differ from a fresh session's"
            );
            assert_eq!(s.tokens(), &long[..]);
        }
    }
}

#[test]
fn multi_turn_chat_processes_only_the_new_turn_and_matches_a_fresh_session() {
    let model = model();
    let mut chat = session_with(&model, 512, 32, KvType::F16);
    let turn1 = tokenize(
        &model,
        &chatml(&[("user", "What is the capital of France?")]),
    );
    let answer1 = greedy(&mut chat, &turn1, 24, true);
    let mut fresh = session_with(&model, 512, 32, KvType::F16);
    assert_eq!(answer1, greedy(&mut fresh, &turn1, 24, false));
    let text1 = model.detokenize(
        answer1
            .iter()
            .copied()
            .filter(|&t| !model.is_eog(t))
            .collect::<Vec<_>>()
            .as_slice(),
        false,
    );
    let turn2 = tokenize(
        &model,
        &chatml(&[
            ("user", "What is the capital of France?"),
            ("assistant", &text1),
            ("user", "And of Italy?"),
        ]),
    );
    // What the session holds is the start of the second turn's prompt.
    let held = chat.tokens().to_vec();
    let kept = chat.reuse_prefix(&turn2);
    assert!(
        kept > turn1.len() && kept <= held.len(),
        "kept {kept} of {} held, turn 1 had {}",
        held.len(),
        turn1.len()
    );
    let answer2 = greedy(&mut chat, &turn2, 24, true);
    fresh.reset();
    assert_eq!(answer2, greedy(&mut fresh, &turn2, 24, false));
}

#[test]
fn reuse_continues_llamas_greedy_reference() {
    let model = model();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    let mut s = session(&model);
    for c in cases.iter().take(3) {
        let (prompt, want) = (ids(&c["prompt_ids"]), ids(&c["ids"]));
        let n = want.len();
        assert_eq!(greedy(&mut s, &prompt, n, true), want, "first run");
        // The prompt extended by half the reference: only its new tokens run, and the rest of
        // the reference follows.
        let mut longer = prompt.clone();
        longer.extend(&want[..n / 2]);
        let got = greedy(&mut s, &longer, n - n / 2, true);
        assert_eq!(got, want[n / 2..], "continuation after reuse");
    }
}

#[test]
fn truncate_and_tokens_follow_the_kv_cache() {
    let model = model();
    let mut s = session_with(&model, 64, 8, KvType::F16);
    let ids = tokenize(&model, "Once upon a time, in a small village, there lived");
    s.prefill(&ids).unwrap();
    assert_eq!(s.tokens(), &ids[..]);
    assert!(matches!(
        s.truncate(ids.len() + 1),
        Err(EngineError::InvalidArgument(_))
    ));
    s.truncate(3).unwrap();
    assert_eq!((s.n_past(), s.tokens()), (3, &ids[..3]));
    // A context shift moves the tokens with their rows; only the kept ones stay reusable.
    s.reset();
    s.set_context_policy(ContextPolicy::Shift { keep: 4 });
    s.prefill(&ids).unwrap();
    let mut all = ids.clone();
    let mut next = edge_engine::sampling::argmax(s.logits());
    for _ in 0..80 {
        all.push(next);
        next = edge_engine::sampling::argmax(s.step(next).unwrap());
    }
    assert!(s.n_shifts() > 0);
    assert_eq!(s.tokens().len(), s.n_past());
    assert_eq!(s.tokens()[..4], all[..4]);
    assert_eq!(s.tokens().last(), all.last(), "the newest token is last");
    assert!(
        all.ends_with(&s.tokens()[4..]),
        "the tail is the newest tokens"
    );
    assert_eq!(s.n_reusable(), 4);
    assert!(s.reuse_prefix(&all) <= 4);
}

#[test]
fn a_state_saved_after_a_prompt_gives_its_logits_bit_for_bit() {
    let model = model();
    let dir = TempDir::new("state-prompt");
    let prompt = tokenize(&model, &chatml(&[("user", "Write a haiku about robots.")]));
    let mut a = session_with(&model, 128, 16, KvType::F16);
    let want = a.prefill(&prompt).unwrap().to_vec();
    let path = dir.0.join("p.state");
    a.save_state(&path).unwrap();
    let mut b = session_with(&model, 128, 16, KvType::F16);
    b.load_state(&path).unwrap();
    assert!(b
        .logits()
        .iter()
        .zip(&want)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(
        greedy(&mut a, &[], 16, false),
        greedy(&mut b, &[], 16, false)
    );
}

#[test]
fn saved_state_continues_exactly_as_the_uninterrupted_run() {
    let model = model();
    let dir = TempDir::new("state");
    let prompt = tokenize(&model, &chatml(&[("user", "Name three colours.")]));
    for kv_type in [KvType::F16, KvType::Q8_0] {
        let mut a = session_with(&model, 256, 16, kv_type);
        let whole = greedy(&mut a, &prompt, 32, false);
        a.reset();
        let first = greedy(&mut a, &prompt, 12, false);
        assert_eq!(first, whole[..12]);
        let logits = a.logits().to_vec();
        let path = dir.0.join(format!("{}.state", kv_type.name()));
        a.save_state(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
        assert_eq!(
            names.len(),
            1 + usize::from(kv_type == KvType::Q8_0),
            "temp files left"
        );

        let mut b = session_with(&model, 256, 16, kv_type);
        b.load_state(&path).unwrap();
        assert_eq!(b.tokens(), a.tokens());
        assert!(
            b.logits()
                .iter()
                .zip(&logits)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{kv_type:?}: logits after load differ"
        );
        // The prompt plus what was generated, as a caller that kept the conversation passes it.
        let mut longer = prompt.clone();
        longer.extend(&first);
        let rest = greedy(&mut b, &longer, 20, true);
        assert_eq!(rest, whole[12..], "{kv_type:?}: continuation after load");
    }
}

/// A small tiny-model state file, for the foreign-model checks.
fn tiny_state(dir: &TempDir, name: &str, general_name: &str) -> std::path::PathBuf {
    let mut parts = Parts::llama(DIMS);
    parts.set(
        "general.name",
        edge_engine::gguf::MetaValue::String(general_name.into()),
    );
    let path = dir.write(&format!("{name}.gguf"), &parts.bytes());
    let tiny = Arc::new(Model::load(&path).unwrap());
    let mut s = session_with(&tiny, 32, 8, KvType::F16);
    s.prefill(&[1, 2, 3, 4, 5]).unwrap();
    let state = dir.0.join(format!("{name}.state"));
    s.save_state(&state).unwrap();
    state
}

fn state_error(r: Result<(), EngineError>) -> StateError {
    match r {
        Err(EngineError::State { error, .. }) => error,
        other => panic!("expected a state error, got {other:?}"),
    }
}

#[test]
fn foreign_and_mismatched_states_are_refused_with_the_reason() {
    let model = model();
    let dir = TempDir::new("state-foreign");
    let mut s = session(&model);
    let ids = tokenize(&model, "The capital of France is");
    s.prefill(&ids).unwrap();
    let before = s.logits().to_vec();

    // Another model: a tiny synthetic Llama.
    let tiny = tiny_state(&dir, "tiny", "tiny-test-llama");
    let e = s.load_state(&tiny).unwrap_err();
    assert!(
        matches!(
            &e,
            EngineError::State {
                error: StateError::OtherModel {
                    same_size: false,
                    ..
                },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("another model file"), "{e}");
    // Same size, another header (a renamed model): the hash tells them apart.
    let tiny_b = tiny_state(&dir, "tiny-b", "tiny-test-llamb");
    let tiny_model = Arc::new(Model::load(dir.0.join("tiny.gguf")).unwrap());
    let mut t = session_with(&tiny_model, 32, 8, KvType::F16);
    assert!(matches!(
        state_error(t.load_state(&tiny_b)),
        StateError::OtherModel {
            same_size: true,
            ..
        }
    ));
    t.load_state(&tiny).expect("its own state loads");
    assert_eq!(t.tokens(), &[1, 2, 3, 4, 5]);

    // Another session shape: context, KV type, ubatch of no consequence here (no windows).
    let path = dir.0.join("smol.state");
    s.save_state(&path).unwrap();
    for (other, what) in [
        (session_with(&model, 128, 16, KvType::F16), "context"),
        (session_with(&model, 256, 16, KvType::Q8_0), "KV type"),
    ] {
        let mut other = other;
        match state_error(other.load_state(&path)) {
            StateError::Shape { what: w, .. } => assert_eq!(w, what),
            e => panic!("{what}: {e:?}"),
        }
        assert_eq!(other.n_past(), 0);
    }
    session_with(&model, 256, 64, KvType::F16)
        .load_state(&path)
        .expect("another ubatch is the same shape for a model without windows");
    // Not a state at all, and a missing file.
    let text = dir.write("notes.state", b"just some text\n");
    assert_eq!(state_error(s.load_state(&text)), StateError::NotAState);
    assert!(matches!(
        s.load_state(dir.0.join("missing.state")),
        Err(EngineError::Io { .. })
    ));
    // Every failure left the session as it was.
    assert_eq!(s.tokens(), &ids[..]);
    assert!(s
        .logits()
        .iter()
        .zip(&before)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn truncated_and_damaged_state_files_are_errors_never_panics() {
    let model = model();
    let dir = TempDir::new("state-damage");
    let mut s = session_with(&model, 64, 16, KvType::F16);
    let ids = tokenize(&model, "Once upon a time");
    s.prefill(&ids).unwrap();
    let path = dir.0.join("good.state");
    s.save_state(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut t = session_with(&model, 64, 16, KvType::F16);
    t.load_state(&path).unwrap();
    let other = tokenize(&model, "Hello");
    let bad = dir.0.join("bad.state");
    // Truncations: every length in the header, then a spread through the KV rows.
    let mut cuts: Vec<usize> = (0..200).collect();
    cuts.extend((200..bytes.len()).step_by(997));
    cuts.push(bytes.len() - 1);
    for cut in cuts {
        t.reset();
        t.prefill(&other).unwrap();
        std::fs::write(&bad, &bytes[..cut]).unwrap();
        let e = state_error(t.load_state(&bad));
        assert!(
            matches!(
                e,
                StateError::NotAState | StateError::Truncated { .. } | StateError::Damaged(_)
            ),
            "cut at {cut}: {e:?}"
        );
        assert_eq!(t.tokens(), &other[..], "cut at {cut}: the session changed");
    }
    // Flipped bits: every byte of the header, then a spread through the rows and the checksum.
    let mut at: Vec<usize> = (0..200).collect();
    at.extend((200..bytes.len()).step_by(499));
    at.extend(bytes.len() - 8..bytes.len());
    for i in at {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        std::fs::write(&bad, &b).unwrap();
        let e = state_error(t.load_state(&bad));
        let msg = EngineError::State {
            path: "x".into(),
            error: e.clone(),
        }
        .to_string();
        assert!(!msg.is_empty());
        if i >= 12 {
            assert!(
                matches!(e, StateError::Damaged(_) | StateError::Truncated { .. }),
                "flip at {i}: {e:?}"
            );
        }
    }
    // An appended byte.
    let mut b = bytes.clone();
    b.push(0);
    std::fs::write(&bad, &b).unwrap();
    assert!(matches!(
        state_error(t.load_state(&bad)),
        StateError::Damaged(_)
    ));
    // The good file still loads.
    t.load_state(&path).unwrap();
    assert_eq!(t.tokens(), &ids[..]);
}

/// Sliding-window models (the synthetic Gemma 2 and 3: windows of 8 in rings of 8 + ubatch
/// rows): extending what the session holds reuses it, cutting deeper than the rings allow starts
/// over; either way the tokens are a fresh session's.
#[test]
fn sliding_window_models_reuse_what_their_rings_still_hold() {
    let donor = edge_engine::gguf::Gguf::open(smollm2_path()).unwrap();
    for name in ["gemma2", "gemma3"] {
        let bytes = edge_tests::synth::make_arch_model(name, &donor).unwrap();
        let gguf = edge_engine::gguf::Gguf::from_bytes(bytes).unwrap();
        let model = Arc::new(Model::from_gguf(gguf).unwrap());
        let new = || session_with(&model, 128, 4, KvType::F16);
        let p1: Vec<u32> = (1..=30).collect();
        let mut s = new();
        let out1 = greedy(&mut s, &p1, 10, true);
        // An extension of what the session holds: reused.
        let mut p2 = s.tokens().to_vec();
        p2.extend([40, 41, 42]);
        assert!(s.reusable_prefix(&p2) > 30, "{name}");
        let out2 = greedy(&mut s, &p2, 10, true);
        assert_eq!(
            out2,
            greedy(&mut new(), &p2, 10, false),
            "{name}: extension"
        );
        // Saved and loaded with wrapped rings, it goes on as the session itself does.
        let dir = TempDir::new("state-swa");
        let path = dir.0.join("swa.state");
        s.save_state(&path).unwrap();
        let mut loaded = new();
        loaded.load_state(&path).unwrap();
        let mut p4 = s.tokens().to_vec();
        p4.extend([60, 61]);
        assert_eq!(
            greedy(&mut loaded, &p4, 8, true),
            greedy(&mut s, &p4, 8, true),
            "{name}: after load"
        );
        // A cut 20 positions back: the rings were overwritten since; the session starts over.
        let mut p3 = p1[..20].to_vec();
        p3.extend([50, 51]);
        assert_eq!(s.reusable_prefix(&p3), 0, "{name}");
        let out3 = greedy(&mut s, &p3, 10, true);
        assert_eq!(out3, greedy(&mut new(), &p3, 10, false), "{name}: deep cut");
        assert!(!out1.is_empty());
    }
}
