//! The library API on the real model: sessions on one shared model in parallel threads, and
//! generation's stop conditions, checked against llama.cpp's greedy reference tokens.

use std::ops::ControlFlow;
use std::sync::{Arc, Barrier, OnceLock};

use edge_engine::error::{EngineError, Setting};
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2")))
        .clone()
}

/// (prompt ids, reference greedy ids) of the reference cases.
fn cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"))
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["ids"])))
        .collect()
}

fn session(model: &Arc<Model>, ctx: usize) -> Session {
    Session::new(
        Arc::clone(model),
        &SessionConfig {
            ctx: Some(ctx),
            threads: Some(1),
            ..Default::default()
        },
    )
    .expect("session")
}

/// Greedy tokens as the reference lists them: the generated ones, then the end-of-generation
/// token if it stopped there.
fn greedy(session: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let done = session
        .generate(prompt, &GenerateOptions::greedy(n), |e| {
            out.extend(e.token);
            ControlFlow::Continue(())
        })
        .expect("generate");
    if let StopReason::EndOfGeneration(t) = done.stop_reason {
        out.push(t);
    }
    out
}

#[test]
fn two_sessions_in_two_threads_produce_what_each_produces_alone() {
    let model = model();
    let cases = cases();
    let picked = [&cases[0], &cases[1]];
    let alone: Vec<Vec<u32>> = picked
        .iter()
        .map(|(prompt, want)| greedy(&mut session(&model, 128), prompt, want.len()))
        .collect();
    for ((_, want), got) in picked.iter().zip(&alone) {
        assert_eq!(got, want, "a session alone differs from llama.cpp");
    }
    // Both threads start decoding together, so their steps interleave.
    let start = Barrier::new(2);
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = picked
            .iter()
            .map(|(prompt, want)| {
                let (model, start) = (&model, &start);
                s.spawn(move || {
                    let mut session = session(model, 128);
                    start.wait();
                    greedy(&mut session, prompt, want.len())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert_eq!(together, alone);
}

#[test]
fn generation_stops_for_each_reason_and_continues() {
    let model = model();
    let (prompt, want) = cases().swap_remove(0);

    // Stopped by the caller after 3 tokens: the third is pending (not in the cache).
    let mut s = session(&model, 128);
    let mut seen = Vec::new();
    let done = s
        .generate(&prompt, &GenerateOptions::greedy(20), |e| {
            seen.extend(e.token);
            if seen.len() == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(done.stop_reason, StopReason::Stopped);
    assert_eq!((done.n_tokens, done.pending_token), (3, Some(want[2])));
    assert_eq!(seen, want[..3]);
    assert_eq!(s.n_past(), prompt.len() + 2);
    // Continuing from the pending token gives the rest of the reference continuation.
    let rest = greedy(&mut s, &[want[2]], 5);
    assert_eq!(rest, want[3..8]);

    // The iterator: the same tokens, and the text of each.
    s.reset();
    let mut gen = s.generator(&prompt, &GenerateOptions::greedy(6)).unwrap();
    let mut text = String::new();
    let mut tokens = Vec::new();
    for t in gen.by_ref() {
        tokens.push(t.unwrap());
    }
    assert_eq!(gen.stop_reason(), Some(StopReason::MaxTokens));
    assert_eq!(tokens, want[..6]);
    text.push_str(&model.detokenize(&tokens, false));
    assert_eq!(text, " Paris.\n\nThe United");

    // A full context is a stop reason: prompt + generated tokens fill all positions but the
    // last token, which is sampled from the logits of the last position and stays pending.
    let mut small = session(&model, prompt.len() + 2);
    let done = small
        .generate(&prompt, &GenerateOptions::greedy(20), |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(done.stop_reason, StopReason::ContextFull);
    assert_eq!(done.n_tokens, 3);
    assert_eq!(small.n_past(), small.ctx());

    // max_tokens 0 processes the prompt only; an empty prompt then continues from it.
    small.reset();
    let done = small
        .generate(&prompt, &GenerateOptions::greedy(0), |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(done.stop_reason, StopReason::MaxTokens);
    assert_eq!((done.n_tokens, small.n_past()), (0, prompt.len()));
    assert_eq!(greedy(&mut small, &[], 2), want[..2]);
}

#[test]
fn generation_refuses_bad_input_with_typed_errors() {
    let model = model();
    let mut s = session(&model, 16);
    let greedy4 = GenerateOptions::greedy(4);
    let go = |_: edge_engine::generate::GenerateEvent<'_>| ControlFlow::Continue(());
    // Nothing to continue from.
    assert!(matches!(
        s.generate(&[], &greedy4, go),
        Err(EngineError::InvalidArgument(_))
    ));
    // A token outside the vocabulary.
    let bad = model.n_vocab() as u32;
    assert!(matches!(
        s.generate(&[1, bad], &greedy4, go),
        Err(EngineError::InvalidArgument(_))
    ));
    // A prompt longer than the context.
    assert!(matches!(
        s.generate(&[1; 17], &greedy4, go),
        Err(EngineError::ContextFull { .. })
    ));
    // Bad sampler settings.
    let mut opts = GenerateOptions::default();
    opts.sampling.top_p = 2.0;
    assert!(matches!(
        s.generate(&[1], &opts, go),
        Err(EngineError::InvalidSetting {
            setting: Setting::TopP,
            ..
        })
    ));
    // The session still works afterwards.
    assert_eq!(s.n_past(), 0);
    let done = s.generate(&[1, 2], &greedy4, go).unwrap();
    assert_eq!(done.n_tokens, 4);
}

#[test]
fn tokenize_and_detokenize_through_the_model() {
    let model = model();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    let case = &cases[0];
    let prompt = case["prompt"].as_str().unwrap();
    let add_bos = model.tokenizer.add_bos();
    let ids_ = model.tokenize(prompt, add_bos, true).unwrap();
    assert_eq!(ids_, ids(&case["prompt_ids"]));
    assert_eq!(model.detokenize(&ids_, false), prompt);
    // Control tokens render only when asked for.
    let im_end = model.tokenize("<|im_end|>", false, true).unwrap();
    assert_eq!(im_end.len(), 1);
    assert!(model.is_eog(im_end[0]));
    assert_eq!(model.detokenize(&im_end, false), "");
    assert_eq!(model.detokenize(&im_end, true), "<|im_end|>");
    assert!(model.token_piece(u32::MAX, true).is_empty());
}
