//! SmolLM2-135M-Instruct requantized by llama.cpp's `llama-quantize --allow-requantize` into the
//! other ggml quant types (mixed files: Q4_K_M holds Q4_K, Q6_K, Q5_0 and Q8_0 tensors, since
//! SmolLM2's 576-wide rows are not whole 256-element k-quant blocks), against llama.cpp's outputs
//! for the same files in `tests/reference/smollm2-<type>/` (made with
//! `../shared/peer/llama-ref.py`, 1 thread; prompts: the shared SmolLM2 reference's three logits
//! prompts plus its eight greedy prompts each followed by their 32-token Q4_1 continuation).
//!
//! The models are not in the repository: `scripts/make-quant-models.sh` makes them (it needs the
//! peer's llama-quantize) and checks each file's sha256. A missing model skips its test with a
//! message saying so, and fails it in CI (`CI=true`), which builds the peer and the models first.
//!
//! Measures, per type: top-1 agreement over every teacher-forced position, |logit error| over the
//! reference's top-10 entries, and identical 32-token greedy continuations; asserts top-1 >= 99%
//! of positions and the logit bounds stated per test (measured figures with a margin).

use std::path::PathBuf;

use edge_engine::model::Model;
use edge_engine::sampling::argmax;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::{greedy, ids, read_jsonl};

struct Agreement {
    positions: usize,
    top1_same: usize,
    max_err: f32,
    mean_err: f64,
    greedy_same: usize,
    greedy_cases: usize,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Fails unless `path` is the very file llama.cpp's reference for `file` was made from (its
/// sha256 is pinned in `tests/reference/quant-models.sha256`).
fn check_sha256(path: &std::path::Path, file: &str) {
    let pins = std::fs::read_to_string(root().join("tests/reference/quant-models.sha256"))
        .expect("tests/reference/quant-models.sha256");
    let want = pins
        .lines()
        .find_map(|l| {
            l.split_once("  ")
                .filter(|(_, n)| *n == file)
                .map(|(h, _)| h)
        })
        .unwrap_or_else(|| {
            panic!("{file}: no sha256 pinned in tests/reference/quant-models.sha256")
        });
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("running sha256sum");
    let line = String::from_utf8_lossy(&out.stdout);
    let got = line.split_whitespace().next().unwrap_or("");
    assert_eq!(
        got,
        want,
        "{} is not the file llama.cpp's reference was made from; delete it and run scripts/make-quant-models.sh",
        path.display()
    );
}

/// Runs the comparison for one quant type, or `None` (after saying why) if its model is missing.
fn measure(ty: &str) -> Option<Agreement> {
    let file = format!("SmolLM2-135M-Instruct.{ty}.gguf");
    let path = match std::env::var_os("EDGE_RUN_MODELS") {
        Some(d) => PathBuf::from(d).join(&file),
        None => root().join("models").join(&file),
    };
    if !path.exists() {
        edge_tests::missing(
            path.display(),
            format!("run scripts/make-quant-models.sh {ty} (needs llama.cpp's llama-quantize: ../shared/peer/build-llama-cpp.sh builds it)"),
        );
        return None;
    }
    check_sha256(&path, &file);
    let model = std::sync::Arc::new(Model::load(&path).expect("loading the model"));
    let cfg = SessionConfig {
        ctx: Some(256),
        threads: Some(1),
        ..Default::default()
    };
    let mut session = Session::new(model, &cfg).unwrap();
    let dir = root().join(format!("tests/reference/smollm2-{}", ty.to_lowercase()));
    let (mut positions, mut top1_same, mut max_err, mut sum_err, mut n_err) = (0, 0, 0f32, 0f64, 0);
    for case in read_jsonl(&dir.join("logits-top10.jsonl")) {
        let prompt_ids = ids(&case["prompt_ids"]);
        let top = case["top"].as_array().unwrap();
        assert_eq!(top.len(), prompt_ids.len());
        session.reset();
        // Teacher forcing one position at a time (the KV cache holds the earlier ones).
        for (pos, want) in top.iter().enumerate() {
            let logits = if pos == 0 {
                session.prefill(&prompt_ids[..1]).unwrap()
            } else {
                session.step(prompt_ids[pos]).unwrap()
            };
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
    let greedy_cases = read_jsonl(&dir.join("greedy.jsonl"));
    let mut greedy_same = 0;
    for case in &greedy_cases {
        session.reset();
        let want = ids(&case["ids"]);
        if greedy(&mut session, &ids(&case["prompt_ids"]), want.len()) == want {
            greedy_same += 1;
        }
    }
    let a = Agreement {
        positions,
        top1_same,
        max_err,
        mean_err: sum_err / n_err as f64,
        greedy_same,
        greedy_cases: greedy_cases.len(),
    };
    eprintln!(
        "{ty}: top-1 {}/{}, |logit error| max {:.4} mean {:.5}; greedy continuations identical {}/{}",
        a.top1_same, a.positions, a.max_err, a.mean_err, a.greedy_same, a.greedy_cases
    );
    Some(a)
}

/// Asserts top-1 >= `min_top1_pct`% of positions and the logit error bounds.
fn check(ty: &str, min_top1_pct: usize, max_bound: f32, mean_bound: f64, min_greedy: usize) {
    let Some(a) = measure(ty) else { return };
    assert!(
        a.top1_same * 100 >= a.positions * min_top1_pct,
        "{ty}: top-1 {}/{}",
        a.top1_same,
        a.positions
    );
    assert!(
        a.max_err <= max_bound,
        "{ty}: max |logit error| {} > {max_bound}",
        a.max_err
    );
    assert!(
        a.mean_err <= mean_bound,
        "{ty}: mean |logit error| {} > {mean_bound}",
        a.mean_err
    );
    assert!(
        a.greedy_same >= min_greedy,
        "{ty}: greedy identical {}/{}",
        a.greedy_same,
        a.greedy_cases
    );
}

/// The Q4_1 file itself (fetched, not requantized) along its own greedy continuations:
/// `tests/reference/smollm2-q4_1/`, made the same way by llama.cpp, is the reference
/// `cuda_reference.rs` judges the GPU's near-ties on. Measured: top-1 367/367, max 0.0000, mean
/// 0.00003, greedy 8/8 (the shared reference's continuations): the reference is sound.
#[test]
fn q4_1_continuations_agree_with_llama_cpp() {
    check("Q4_1", 100, 0.001, 1e-4, 8);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00002 (teacher-forced logits bit-exact), greedy
/// 5/8. llama.cpp repacks the Q4_K weights (576 rows, a multiple of 8) on x86 and runs
/// `ggml_gemv_q4_K_8x8_q8_K`, whose per-row order `cpu/repack.rs` reproduces (97.8% before);
/// the Q6_K, Q5_0 and Q8_0 tensors run the unrepacked x86 dots. Greedy: some continuations
/// differ after the batched prompt, as for Q6_K (not explained yet; llama.cpp's repacked `gemm`
/// adds each output in its `gemv` order, see `cpu/repack.rs`, so it is not that).
#[test]
fn q4_k_m_agrees_with_llama_cpp() {
    check("Q4_K_M", 100, 0.001, 1e-4, 5);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00003 (teacher-forced logits bit-exact); greedy
/// 5/8: as for Q6_K, some continuations differ after a batched prefill, not explained yet (6/8
/// on Zen 3 since its Q6_K tensors' prefill follows llama.cpp's batched order, stop 39).
#[test]
fn q5_k_m_agrees_with_llama_cpp() {
    check("Q5_K_M", 100, 0.001, 1e-4, 5);
}

/// Measured: top-1 367/367, max 0.0001, mean 0.00002 (teacher-forced logits as llama.cpp's to
/// the reference's printed precision), greedy 3/8 (batched prefill, as for Q4_K_M). This file
/// holds no Q3_K tensor: Q4_0, Q5_0, Q5_1, Q4_K and one Q5_K; the Q4_0 and Q4_K ones are
/// repacked by llama.cpp (`ggml_gemv_q4_0_8x8_q8_0`, `..._q4_K_8x8_q8_K`, see `cpu/repack.rs`;
/// 96.7% before).
#[test]
fn q3_k_m_agrees_with_llama_cpp() {
    check("Q3_K_M", 100, 0.001, 1e-4, 3);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00002 (teacher-forced logits bit-exact); greedy
/// 6/8 where the batched prefill keeps ggml's one-token order, 5/8 with the packed panels
/// (AVX-512 VNNI: most of this file's tensors are Q8_0; see `q8_0_agrees_with_llama_cpp`) and
/// with the AVX2 set's rows in the lanes, the same order (Zen 3); 6/8 on Zen 3 again since the
/// Q6_K tensors' prefill follows llama.cpp's batched (tiled) order (`cpu/q6_k_rows.rs`).
#[test]
fn q6_k_agrees_with_llama_cpp() {
    check("Q6_K", 100, 0.001, 1e-4, 5);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00003 (bit-exact), greedy 8/8 where prefill
/// keeps ggml's one-token order, 6/8 with the packed panels of AVX-512 VNNI machines and with
/// the AVX2 set's rows in the lanes (Zen 3; the same order: see `q8_0_agrees_with_llama_cpp`),
/// and with the AVX2 panels since stop 40 (the same bits).
#[test]
fn q5_0_agrees_with_llama_cpp() {
    check("Q5_0", 100, 0.001, 1e-4, 6);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00003, greedy 8/8 (bit-exact).
#[test]
fn q5_1_agrees_with_llama_cpp() {
    check("Q5_1", 100, 0.001, 1e-4, 8);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00002 (teacher-forced logits bit-exact). Greedy
/// after the batched prompt: 8/8 where prefill keeps ggml's one-token order
/// (`EDGE_RUN_PANELS=0` on AVX-512, or NEON), 6/8 with the packed panels of AVX-512 VNNI
/// machines and with the AVX2 set's 8-token kernel without AVX-512 (`q8_0_rows.rs`, Zen 3; the
/// AVX2 panels since stop 40, the same bits),
/// which scale each block's exact integer dot once instead of ggml's 8 lane sums (1.6x the
/// prefill speed with the panels, 1.4x on Zen 3; the rule: where matching llama.cpp's
/// batched order costs speed, speed wins). The two
/// continuations that change follow near-ties after the prompt; llama.cpp's own batched and
/// one-token paths differ as much (perplexity of this file on the committed text:
/// llama-perplexity `-b 1` 18.2467, `-b 512` 18.2260; edge-run `-b 512` 18.2497 without the
/// panels, 18.2017 with them).
#[test]
fn q8_0_agrees_with_llama_cpp() {
    check("Q8_0", 100, 0.001, 1e-4, 6);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00002 (bit-exact), greedy 6/8 (batched
/// prefill). llama.cpp repacks the IQ4_NL weights on x86 and runs `ggml_gemv_iq4_nl_8x8_q8_0`,
/// reproduced in `cpu/repack.rs` (97.5% before); the three Q5_K tensors run the x86 dot.
#[test]
fn iq4_nl_agrees_with_llama_cpp() {
    check("IQ4_NL", 100, 0.001, 1e-4, 6);
}

/// Measured: top-1 367/367, max 0.0001, mean 0.00003 (as llama.cpp's to the reference's printed
/// precision), greedy 7/8 (batched prefill) where prefill keeps ggml's one-token order, 6/8
/// with the packed panels (AVX-512 VNNI; the IQ4_XS tensors' super-block sums scaled once:
/// perplexity on the committed text, `-c 512 -b 512`: llama-perplexity 21.3518 batched and
/// 21.4601 one token at a time, edge-run 21.3537 without the panels and 21.4345 with them).
/// Since stop 41 AVX2 runs the IQ4_XS panels too, from 32 tokens (Zen 3: perplexity 21.4345,
/// the AVX-512 panels' value to the last digit; greedy 7/8, its prompts being shorter).
/// IQ4_XS tensors (ffn_down) run ggml's x86 `ggml_vec_dot_iq4_xs_q8_K` order
/// (`cpu/kquant_order.rs`) one token at a time, the IQ4_NL ones (576-wide rows) the repacked
/// `ggml_gemv_iq4_nl_8x8_q8_0` (`cpu/repack.rs`, the panels' order too); 96.7% before. Stop 40
/// tried the IQ4_XS tensors in llama.cpp's batched (tiled) order on AVX2: 5/8 with the AVX2
/// tile's `fma`, 6/8 with the VNNI tile's unfused add (the references' machine), against 7/8
/// here; not kept (README, "Stop 40").
#[test]
fn iq4_xs_agrees_with_llama_cpp() {
    check("IQ4_XS", 100, 0.001, 1e-4, 6);
}

/// Measured: top-1 367/367, max 0.0000, mean 0.00002 (bit-exact), greedy 5/8 (batched
/// prefill). This file holds no Q2_K tensor (llama-quantize falls back to Q4_0 for 576-wide
/// rows): Q3_K tensors (ffn_down) run ggml's x86 `ggml_vec_dot_q3_K_q8_K` order
/// (`cpu/kquant_order.rs`), the Q4_0 ones the repacked `ggml_gemv_q4_0_8x8_q8_0`
/// (`cpu/repack.rs`); 94.8% before.
#[test]
fn q2_k_agrees_with_llama_cpp() {
    check("Q2_K", 100, 0.001, 1e-4, 5);
}

/// The Q2_K file above holds no Q2_K tensor, so this one is made with `llama-quantize --pure`:
/// ffn_down (1536-wide rows, whole 256-value blocks) in Q2_K (llama.cpp's repacked order: 576
/// rows), everything else Q4_0. Measured: top-1 367/367, max 0.0000, mean 0.00003, greedy 5/8.
#[test]
fn q2_k_pure_agrees_with_llama_cpp() {
    check("Q2_K-pure", 100, 0.001, 1e-4, 5);
}
