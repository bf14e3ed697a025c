//! Shared-part runs (the executor's mode for a contended machine: each op's shares claimed by
//! whichever thread is on a core, phases ending when their parts are done) give llama.cpp's
//! reference tokens, with more threads than this machine has cores, on the kernels this CPU
//! runs. `EDGE_RUN_SHARED_PARTS=1` forces the mode (this binary's only test sets it before
//! building any session; one thread never shares, so the one-thread run is the usual one).

use std::sync::Arc;

use edge_engine::kernels::cpu::{Kernels, Q8Rounding};
use edge_engine::model::Model;
use edge_tests::{greedy, ids, read_jsonl, session_on, shared_dir, smollm2_path};

#[test]
fn shared_parts_on_more_threads_than_cores_keep_the_reference_tokens() {
    std::env::set_var("EDGE_RUN_SHARED_PARTS", "1");
    let model = Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2"));
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    assert!(cases.len() >= 8);
    let kernels = Kernels::detect().with_q8_rounding(Q8Rounding::host());
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let run = |threads: usize| -> Vec<Vec<u32>> {
        let mut session = session_on(&model, threads, kernels);
        cases
            .iter()
            .map(|case| {
                session.reset();
                greedy(
                    &mut session,
                    &ids(&case["prompt_ids"]),
                    ids(&case["ids"]).len(),
                )
            })
            .collect()
    };
    let alone = run(1);
    for threads in [cores + 1, 2 * cores + 1] {
        let got = run(threads);
        for ((case, got), one) in cases.iter().zip(&got).zip(&alone) {
            let prompt = case["prompt"].as_str().unwrap();
            assert_eq!(
                got, one,
                "{threads} threads, shared parts: {prompt:?} differs from one thread"
            );
            if cfg!(target_arch = "x86_64") {
                // llama.cpp's reference was made on x86-64 (see isa_paths.rs).
                assert_eq!(
                    got,
                    &ids(&case["ids"]),
                    "{threads} threads: {prompt:?} differs from llama.cpp's"
                );
            }
        }
    }
}
