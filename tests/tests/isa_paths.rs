//! Greedy outputs on the reference prompts with every kernel set this machine runs
//! ([`Kernels::available`]: scalar, and avx2 on x86-64 / both NEON variants on aarch64), each
//! chosen explicitly (as `EDGE_RUN_ISA` would) with the host's activation rounding.
//!
//! On x86-64 every path must give llama.cpp's reference tokens: the SIMD kernels add in ggml's
//! order and the scalar references, which add in another, differ from them only in the last
//! bits of a dot product — too little to flip a greedy choice on these prompts. Elsewhere the
//! reference (made on x86-64) is not llama.cpp's own output for that machine, so the paths must
//! agree with one another instead; the NEON variants are bit-identical to each other.

use std::sync::Arc;

use edge_engine::cpu::{Kernels, Q8Rounding};
use edge_engine::model::Model;
use edge_engine::sampling::argmax;
use edge_engine::session::{Session, SessionConfig, SessionPlan};
use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};

/// Greedy decoding as the reference does it: argmax over raw logits, stop after EOS.
fn greedy(session: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let eos = session.model().tokenizer.eos_id();
    let mut out = Vec::new();
    let mut next = argmax(session.prefill(prompt).expect("prefill"));
    for _ in 0..n {
        out.push(next);
        if Some(next) == eos || out.len() == n {
            break;
        }
        next = argmax(session.step(next).expect("step"));
    }
    out
}

#[test]
fn greedy_matches_reference_on_every_isa_path() {
    let model = Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2"));
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    assert!(cases.len() >= 8);
    let paths = Kernels::available();
    assert!(paths.len() >= 2 || !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")));
    let mut outputs: Vec<(String, Vec<Vec<u32>>)> = Vec::new();
    for kernels in paths {
        let kernels = kernels.with_q8_rounding(Q8Rounding::host());
        let name = kernels.isa_name().to_string();
        // Two threads: the row split across threads must not matter either.
        let cfg = SessionConfig {
            ctx: Some(512),
            threads: Some(2),
            ..Default::default()
        };
        let plan = SessionPlan::new(&model, &cfg).unwrap();
        let mut session = Session::from_plan_with_kernels(model.clone(), plan, kernels).unwrap();
        let mut got_all = Vec::new();
        for case in &cases {
            let prompt_ids = ids(&case["prompt_ids"]);
            let want = ids(&case["ids"]);
            session.reset();
            let got = greedy(&mut session, &prompt_ids, want.len());
            if cfg!(target_arch = "x86_64") {
                assert_eq!(
                    got,
                    want,
                    "{name}: greedy continuation of {:?} differs from llama.cpp's",
                    case["prompt"].as_str().unwrap()
                );
            }
            got_all.push(got);
        }
        eprintln!("{name}: {} continuations done", got_all.len());
        outputs.push((name, got_all));
    }
    if !cfg!(target_arch = "x86_64") {
        // No reference for this machine: every path must agree with the best one.
        let (best, want) = outputs.last().unwrap();
        for (name, got) in &outputs {
            assert_eq!(got, want, "{name} differs from {best}");
        }
    }
}
