//! Every supported decoder architecture against llama.cpp: a small random-weight model of each
//! (built here by `edge_tests::synth`, byte for byte the model the reference was made from —
//! its SHA-256 is checked) agrees with llama.cpp's teacher-forced top-10 logits and greedy
//! continuations in `tests/reference/arch-<name>/` (see the README there for how they were made).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edge_engine::gguf::Gguf;
use edge_engine::model::Model;
use edge_engine::sampling::argmax;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::synth::{make_arch_model, sha256_hex, ARCH_MODELS};
use edge_tests::{greedy, ids, read_jsonl, smollm2_path};

/// Largest difference allowed between a logit of ours and llama.cpp's, over the reference's
/// top 10 at every position. Both run the same f16 weights and f16 KV cache; they differ in
/// summation order (llama.cpp evaluates the prompt as one batch, we step token by token, and
/// its sliding-window cache orders cells differently) and in its 4-decimal rounding.
const LOGIT_TOLERANCE: f32 = 0.03;

fn reference_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("reference/arch-{name}"))
}

fn donor() -> &'static Gguf {
    static DONOR: OnceLock<Gguf> = OnceLock::new();
    DONOR.get_or_init(|| Gguf::open(smollm2_path()).expect("the SmolLM2 donor GGUF"))
}

/// The synthetic model `name`, checked to be the one the reference was made from.
fn model(name: &str) -> Arc<Model> {
    let bytes = make_arch_model(name, donor()).unwrap();
    let want = std::fs::read_to_string(reference_dir(name).join("model.sha256")).unwrap();
    assert_eq!(
        sha256_hex(&bytes),
        want.trim(),
        "the generated {name} model differs from the one the reference was made from: \
         regenerate the reference (tests/reference/arch-{name}/README.md)"
    );
    let gguf = Gguf::from_bytes(bytes).unwrap();
    Arc::new(Model::from_gguf(gguf).unwrap_or_else(|e| panic!("loading {name}: {e}")))
}

fn session(model: &Arc<Model>, ubatch: Option<usize>) -> Session {
    Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(256),
            ubatch,
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Teacher-forced logits, token by token, against llama.cpp's top 10 per position; then the
/// last position again after a whole-prompt prefill (one ubatch) and a chunked one (ubatches
/// of 3: sliding-window ring buffers wrap mid-ubatch).
fn teacher_forced(name: &str) {
    let model = model(name);
    let cases = read_jsonl(&reference_dir(name).join("logits.jsonl"));
    let mut sess = session(&model, None);
    let mut chunked = session(&model, Some(3));
    let (mut positions, mut agree, mut max_diff) = (0usize, 0usize, 0.0f32);
    for case in &cases {
        let prompt = ids(&case["prompt_ids"]);
        let add_bos = model.tokenizer.add_bos();
        assert_eq!(
            model
                .tokenizer
                .encode(case["prompt"].as_str().unwrap(), add_bos, true)
                .unwrap(),
            prompt
        );
        let top = case["top"].as_array().unwrap();
        assert_eq!(top.len(), prompt.len());
        let compare = |logits: &[f32], pos: usize, max_diff: &mut f32| -> bool {
            let want = top[pos].as_array().unwrap();
            for pair in want {
                let (id, v) = (
                    pair[0].as_u64().unwrap() as usize,
                    pair[1].as_f64().unwrap(),
                );
                *max_diff = max_diff.max((logits[id] - v as f32).abs());
            }
            argmax(logits) as u64 == want[0][0].as_u64().unwrap()
        };
        sess.reset();
        for (pos, &tok) in prompt.iter().enumerate() {
            let logits = if pos == 0 {
                sess.prefill(&[tok]).unwrap()
            } else {
                sess.step(tok).unwrap()
            };
            positions += 1;
            agree += usize::from(compare(logits, pos, &mut max_diff));
        }
        let last = prompt.len() - 1;
        for s in [&mut sess, &mut chunked] {
            s.reset();
            let logits = s.prefill(&prompt).unwrap().to_vec();
            assert!(
                compare(&logits, last, &mut max_diff),
                "{name}: prefill top-1 differs"
            );
        }
    }
    eprintln!(
        "{name}: top-1 agrees at {agree}/{positions} positions; top-10 logits within {max_diff:.4}"
    );
    assert!(
        agree * 100 >= positions * 99,
        "{name}: top-1 agrees at only {agree} of {positions} positions"
    );
    assert!(
        max_diff <= LOGIT_TOLERANCE,
        "{name}: logits differ by up to {max_diff} (tolerance {LOGIT_TOLERANCE})"
    );
}

/// Greedy continuations token for token.
fn greedy_matches(name: &str) {
    let model = model(name);
    let cases = read_jsonl(&reference_dir(name).join("greedy.jsonl"));
    let mut sess = session(&model, None);
    for case in &cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        sess.reset();
        let got = greedy(&mut sess, &prompt, want.len());
        assert_eq!(
            got, want,
            "{name}: greedy continuation of {:?}",
            case["prompt"]
        );
    }
}

macro_rules! arch_tests {
    ($($name:ident),*) => {
        $(
            mod $name {
                #[test]
                fn teacher_forced_logits_match_llama_cpp() {
                    super::teacher_forced(stringify!($name));
                }

                #[test]
                fn greedy_tokens_match_llama_cpp() {
                    super::greedy_matches(stringify!($name));
                }
            }
        )*
    };
}

arch_tests!(qwen2, qwen3, llama3, phi3, gemma2, gemma3);

#[test]
fn every_synthetic_model_has_a_reference() {
    for name in ARCH_MODELS {
        assert!(
            reference_dir(name).join("logits.jsonl").exists(),
            "{name}: no reference"
        );
    }
}
