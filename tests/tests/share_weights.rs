//! Matmuls shared by the threads' measured speeds (`edge_kernels::balance`) give the same
//! logits, bit for bit, however unequal the shares: this binary's only test pins skewed
//! weights with `EDGE_RUN_SHARE_WEIGHTS` before building each session (the executor reads it
//! once), on 2 and 3 threads, and compares the logits of every prompt (5–16 tokens: a prefill
//! run) and every decode step with one thread's (which never shares), and the tokens with
//! llama.cpp's reference. A share cut off a row would change them.

use std::sync::Arc;

use edge_engine::kernels::cpu::{Kernels, Q8Rounding};
use edge_engine::model::Model;
use edge_tests::{greedy_seeing, ids, read_jsonl, session_on, shared_dir, smollm2_path};

#[test]
fn skewed_matmul_shares_keep_every_logit() {
    let model = Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2"));
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    assert!(cases.len() >= 8);
    let kernels = Kernels::detect().with_q8_rounding(Q8Rounding::host());
    // Each case's greedy tokens, and the logits of its prompt and of every decode step.
    let run = |threads: usize, weights: &str| -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
        std::env::set_var("EDGE_RUN_SHARE_WEIGHTS", weights);
        let mut session = session_on(&model, threads, kernels);
        cases
            .iter()
            .map(|case| {
                session.reset();
                let mut seen = Vec::new();
                let tokens = greedy_seeing(
                    &mut session,
                    &ids(&case["prompt_ids"]),
                    ids(&case["ids"]).len(),
                    |logits| seen.push(logits.to_vec()),
                );
                (tokens, seen)
            })
            .collect()
    };
    let alone = run(1, "1");
    for (threads, weights) in [(2, "0.25,1.75"), (2, "1.6,0.4"), (3, "0.3,1.7,1.0")] {
        let got = run(threads, weights);
        for ((case, got), one) in cases.iter().zip(&got).zip(&alone) {
            let prompt = case["prompt"].as_str().unwrap();
            assert_eq!(got.0, one.0, "{threads} threads at {weights}: {prompt:?}");
            assert!(
                got.1 == one.1,
                "{threads} threads at {weights}: {prompt:?}: the prompt's or a step's logits \
                 differ from one thread's"
            );
            if cfg!(target_arch = "x86_64") {
                // llama.cpp's reference was made on x86-64 (see isa_paths.rs).
                assert_eq!(got.0, ids(&case["ids"]), "{threads} threads: {prompt:?}");
            }
        }
    }
}
