//! SmolLM2-135M-Instruct (Q4_1) against llama.cpp's outputs in `shared/reference/smollm2/`:
//! greedy continuations token for token, and teacher-forced logits.

use std::sync::{Arc, OnceLock};

use edge_engine::model::Model;
use edge_engine::sampling::argmax;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::{greedy, ids, read_jsonl, shared_dir, smollm2_path};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(Model::load(smollm2_path()).expect("loading SmolLM2")))
        .clone()
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let model = model();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    assert!(cases.len() >= 8);
    let mut session = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(2048),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        let add_bos = model.tokenizer.add_bos();
        assert_eq!(
            model.tokenizer.encode(prompt, add_bos, true).unwrap(),
            prompt_ids,
            "prompt tokens of {prompt:?}"
        );
        session.reset();
        let got = greedy(&mut session, &prompt_ids, want.len());
        if got != want {
            let first = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            failures.push(format!(
                "{prompt:?}: first difference at generated token {first}\n  want {want:?}\n  got  {got:?}\n  text {:?}",
                model.tokenizer.decode(&got)
            ));
        } else {
            // llama.cpp's detokenizer leaves out control tokens (the final <|im_end|>).
            let text_ids: Vec<u32> = got
                .iter()
                .copied()
                .filter(|&t| !model.tokenizer.is_control(t))
                .collect();
            assert_eq!(
                model.tokenizer.decode(&text_ids),
                case["text"].as_str().unwrap(),
                "text of {prompt:?}"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} continuations differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn chunked_prefill_and_threads_do_not_change_tokens() {
    let model = model();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    // The longest prompts exercise chunks that split the prompt unevenly.
    let case = cases
        .iter()
        .max_by_key(|c| c["prompt_ids"].as_array().unwrap().len())
        .unwrap();
    let prompt_ids = ids(&case["prompt_ids"]);
    let want = ids(&case["ids"]);
    for (ubatch, threads) in [(3, 1), (1, 2), (5, 2)] {
        let cfg = SessionConfig {
            ctx: Some(256),
            ubatch: Some(ubatch),
            threads: Some(threads),
            ..Default::default()
        };
        let mut session = Session::new(model.clone(), &cfg).unwrap();
        assert_eq!(
            greedy(&mut session, &prompt_ids, want.len()),
            want,
            "ubatch {ubatch}, {threads} threads"
        );
    }
}

/// Teacher-forced logits: the logits at every prompt position compared with llama.cpp's top 10.
///
/// Tolerance 1e-3: the engine reproduces llama.cpp's x86 CPU arithmetic operation for operation
/// (same activation rounding, same summation order in every dot product, same exp polynomial;
/// see `edge_engine::kernels::cpu::ggml_order`), so the logits are bit-identical and the only difference
/// left is the reference file's rounding to 4 decimals (5e-5). Before that emulation, engines
/// that agree on the math but not the order differed by up to 1.3 here (30 layers amplify
/// last-bit differences through the q8 activation rounding), which flipped greedy choices. On
/// other ISAs (aarch64) the order differs; see the README.
#[test]
fn teacher_forced_logits_match_llama_cpp() {
    const TOLERANCE: f32 = 1e-3;
    let model = model();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/logits-top10.jsonl"));
    let mut session = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(512),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let (mut positions, mut top1_same, mut max_err) = (0usize, 0usize, 0f32);
    let mut out_of_tolerance = Vec::new();
    for case in &cases {
        let prompt_ids = ids(&case["prompt_ids"]);
        let top = case["top"].as_array().unwrap();
        assert_eq!(top.len(), prompt_ids.len());
        for (pos, want) in top.iter().enumerate() {
            // llama.cpp computed these logits in one batch over the whole prompt; a batch over
            // the prefix up to `pos` runs the same kernels and yields the same row.
            session.reset();
            let logits = session.prefill(&prompt_ids[..=pos]).unwrap();
            positions += 1;
            let want = want.as_array().unwrap();
            let want_top1 = want[0][0].as_u64().unwrap() as u32;
            if argmax(logits) == want_top1 {
                top1_same += 1;
            }
            if std::env::var_os("EDGE_RUN_SHOW_ERRORS").is_some() {
                let errs: Vec<String> = want
                    .iter()
                    .map(|e| {
                        format!(
                            "{:+.3}",
                            logits[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap() as f32
                        )
                    })
                    .collect();
                eprintln!("pos {pos}: {}", errs.join(" "));
            }
            for entry in want {
                let (tid, value) = (
                    entry[0].as_u64().unwrap() as usize,
                    entry[1].as_f64().unwrap() as f32,
                );
                let err = (logits[tid] - value).abs();
                max_err = max_err.max(err);
                if err > TOLERANCE {
                    out_of_tolerance.push(format!(
                        "pos {pos} token {tid}: want {value}, got {}",
                        logits[tid]
                    ));
                }
            }
        }
    }
    eprintln!(
        "teacher-forced: {top1_same}/{positions} top-1 identical, max |logit error| {max_err:.4}"
    );
    assert!(
        top1_same * 100 >= positions * 99,
        "top-1 identical at only {top1_same} of {positions} positions"
    );
    assert!(
        out_of_tolerance.is_empty(),
        "logits outside ±{TOLERANCE}:\n{}",
        out_of_tolerance.join("\n")
    );
}

/// The planned arena of the real model's graph: every activation has an offset, the checker
/// accepts the plan, the logits buffer holds one row (the last position), not one per prompt
/// token, and the decode arena does not depend on the context size.
#[test]
fn arena_plan_is_sound_and_logits_are_last_position_only() {
    use edge_engine::memory::ALIGN;
    let model = model();
    let n_vocab = model.params.n_vocab;
    for ubatch in [1, 7, 512] {
        let graph = model.build_graph(ubatch);
        let logits = &graph.values[graph.output.0];
        assert_eq!((logits.rows, logits.cols), (1, n_vocab), "ubatch {ubatch}");
        // No other buffer is vocabulary-sized per token.
        let biggest_other = graph
            .values
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != graph.output.0)
            .map(|(_, v)| v.bytes())
            .max()
            .unwrap();
        assert!(
            biggest_other < n_vocab * 4 * ubatch.max(2) / 2,
            "ubatch {ubatch}: a buffer of {biggest_other} bytes"
        );
        let buffers = graph.buffers(ALIGN);
        let plan = edge_arena::plan(&buffers).unwrap();
        edge_arena::check(&buffers, &plan.offsets, plan.size).unwrap();
        assert!(plan.size >= plan.lower_bound);
        // The planner reuses memory: far less than the sum of all activations.
        let total: usize = buffers.iter().map(|b| b.size).sum();
        assert!(
            plan.size * 4 < total,
            "ubatch {ubatch}: arena {} of {total} bytes",
            plan.size
        );
    }
    let small = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(512),
            ubatch: Some(1),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let large = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(8192),
            ubatch: Some(1),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(small.memory().arena_bytes, large.memory().arena_bytes);
    assert_eq!(large.memory().kv_bytes, 16 * small.memory().kv_bytes);
    // With tiled attention nothing but the KV cache depends on the context, scratch included.
    let plan = |ctx: usize| {
        edge_engine::session::SessionPlan::new(
            &model,
            &SessionConfig {
                ctx: Some(ctx),
                ubatch: Some(1),
                threads: Some(2),
                flash_attn: true,
                ..Default::default()
            },
        )
        .unwrap()
        .report
    };
    let (small, large) = (plan(512), plan(8192));
    assert_eq!(small.arena_bytes, large.arena_bytes);
    assert_eq!(small.scratch_bytes, large.scratch_bytes);
    assert_eq!(large.kv_bytes, 16 * small.kv_bytes);
}

/// A memory budget: an explicit context that does not fit is refused before anything is
/// allocated, with the largest context that fits; without a context, the largest one that fits
/// is chosen, and one more position would not fit.
#[test]
fn budget_refuses_or_picks_the_largest_context() {
    use edge_engine::error::EngineError;
    use edge_engine::session::SessionPlan;
    use edge_targets::Budget;
    let model = model();
    let cfg = |ctx: Option<usize>| SessionConfig {
        ctx,
        ubatch: Some(64),
        threads: Some(1),
        ..Default::default()
    };
    let at_1024 = SessionPlan::new(&model, &cfg(Some(1024)))
        .unwrap()
        .report
        .owned_bytes();
    let budget = Budget {
        limit_bytes: at_1024,
        count_weights: false,
    };
    // 1024 fits exactly; 2048 does not, and the error names 1024 as the largest that fits.
    assert!(SessionPlan::within_budget(&model, &cfg(Some(1024)), &budget).is_ok());
    match SessionPlan::within_budget(&model, &cfg(Some(2048)), &budget) {
        Err(EngineError::Budget(e)) => {
            assert_eq!(e.largest_fitting_ctx, Some(1024));
            let line = EngineError::Budget(e).to_string();
            assert!(
                !line.contains('\n') && line.contains("use ctx 1024 or less"),
                "{line}"
            );
        }
        other => panic!("expected a budget error, got {other:?}"),
    }
    let picked = SessionPlan::within_budget(&model, &cfg(None), &budget).unwrap();
    assert_eq!(picked.ctx, 1024);
    // Counting the mapped weights (as on Orin) leaves less room.
    let with_weights = Budget {
        limit_bytes: at_1024,
        count_weights: true,
    };
    let smaller = SessionPlan::within_budget(&model, &cfg(None), &with_weights);
    assert!(
        matches!(smaller, Err(EngineError::Budget(_))),
        "92 MiB of weights do not fit in {at_1024} bytes"
    );
    let session = Session::from_plan(model.clone(), picked).unwrap();
    assert_eq!(session.ctx(), 1024);
}

/// Tiled attention against the reference (made by llama.cpp's exact, non-flash path): the
/// accuracy cost of an online softmax, with an f16 cache (`--flash-attn`) and with a q8_0 cache
/// (half the memory). Measures top-1 agreement over the 60 teacher-forced positions, the logit
/// errors over the reference's top 10, and how many of the 8 greedy continuations are identical.
struct Tiled {
    top1_same: usize,
    mean_err: f64,
    max_err: f32,
    greedy_same: usize,
}

fn tiled_attention_stays_close(kv_type: edge_engine::kv::KvType, flash_attn: bool) -> Tiled {
    let model = model();
    let cfg = SessionConfig {
        ctx: Some(512),
        threads: Some(1),
        kv_type,
        flash_attn,
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &cfg).unwrap();
    let cases = read_jsonl(&shared_dir().join("reference/smollm2/logits-top10.jsonl"));
    let (mut positions, mut top1_same, mut max_err, mut sum_err, mut n_err) = (0, 0, 0f32, 0f64, 0);
    for case in &cases {
        let prompt_ids = ids(&case["prompt_ids"]);
        for (pos, want) in case["top"].as_array().unwrap().iter().enumerate() {
            session.reset();
            let logits = session.prefill(&prompt_ids[..=pos]).unwrap();
            let want = want.as_array().unwrap();
            positions += 1;
            if argmax(logits) as u64 == want[0][0].as_u64().unwrap() {
                top1_same += 1;
            }
            for e in want {
                let err =
                    (logits[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap() as f32).abs();
                max_err = max_err.max(err);
                sum_err += f64::from(err);
                n_err += 1;
            }
        }
    }
    let mean_err = sum_err / n_err as f64;
    let greedy_cases = read_jsonl(&shared_dir().join("reference/smollm2/greedy.jsonl"));
    let mut greedy_same = 0;
    for case in &greedy_cases {
        session.reset();
        let want = ids(&case["ids"]);
        if greedy(&mut session, &ids(&case["prompt_ids"]), want.len()) == want {
            greedy_same += 1;
        }
    }
    eprintln!(
        "{} KV, flash_attn {flash_attn}: top-1 {top1_same}/{positions}, |logit error| max {max_err:.3} mean {mean_err:.3}; greedy continuations identical {greedy_same}/{}",
        kv_type.name(),
        greedy_cases.len()
    );
    assert_eq!(positions, 60);
    Tiled {
        top1_same,
        mean_err,
        max_err,
        greedy_same,
    }
}

/// A q8_0 KV cache: half the memory of f16, attention always tiled. Measured: top-1 58/60,
/// |logit error| max 0.976, mean 0.252, 5 of 8 greedy continuations identical. Asserted with a
/// margin of one position and about 20% on the errors; the greedy count is exact, because every
/// x86-64 kernel set gives the same bits (a change there is a change of arithmetic).
#[test]
fn q8_0_kv_cache_stays_close_to_llama_cpp() {
    let t = tiled_attention_stays_close(edge_engine::kv::KvType::Q8_0, false);
    assert!(t.top1_same >= 57, "top-1 {}/60", t.top1_same);
    assert!(
        t.mean_err <= 0.30 && t.max_err <= 1.2,
        "mean {}, max {}",
        t.mean_err,
        t.max_err
    );
    assert!(
        t.greedy_same >= 5,
        "{} of 8 greedy continuations identical",
        t.greedy_same
    );
}

/// An f16 cache with tiled attention (`--flash-attn`): the math of llama.cpp's exact path in
/// another order (f32 query, running softmax sums, f32 probabilities). Measured: top-1 57/60,
/// max error 1.261, mean 0.209, 3 of 8 greedy continuations identical: the same size as
/// q8_0's, since 30 layers amplify last-bit differences through the q8 rounding of activations
/// (see the README's correctness section). Asserted as for q8_0: top-1 >= 56, max <= 1.5,
/// mean <= 0.25, greedy >= 3.
#[test]
fn flash_attention_stays_close_to_llama_cpp() {
    let t = tiled_attention_stays_close(edge_engine::kv::KvType::F16, true);
    assert!(t.top1_same >= 56, "top-1 {}/60", t.top1_same);
    assert!(
        t.mean_err <= 0.25 && t.max_err <= 1.5,
        "mean {}, max {}",
        t.mean_err,
        t.max_err
    );
    assert!(
        t.greedy_same >= 3,
        "{} of 8 greedy continuations identical",
        t.greedy_same
    );
}
