//! Every supported decoder architecture against llama.cpp: a small random-weight model of each
//! (built here by `edge_tests::synth`, byte for byte the model the reference was made from —
//! its SHA-256 is checked) agrees with llama.cpp's teacher-forced top-10 logits and greedy
//! continuations in `tests/reference/arch-<name>/` (see the README there for how they were made).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edge_engine::error::Setting;
use edge_engine::gguf::Gguf;
use edge_engine::kv::KvType;
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
    session_with(model, ubatch, &SessionConfig::default())
}

/// A session of `base`'s attention settings with a 256-token context, one thread and `ubatch`.
fn session_with(model: &Arc<Model>, ubatch: Option<usize>, base: &SessionConfig) -> Session {
    Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(256),
            ubatch,
            threads: Some(1),
            ..base.clone()
        },
    )
    .unwrap()
}

/// Teacher-forced logits, token by token, against llama.cpp's top 10 per position; then the
/// last position again after a whole-prompt prefill (one ubatch, sliding-window layers then
/// hold the whole context) and a chunked one (ubatches of 3: the ring buffers of the
/// sliding-window layers, window + 3 rows, wrap mid-ubatch). Token by token, the ring buffers
/// have window + 4 rows and wrap every few tokens of the 31-52 token prompts.
fn teacher_forced(name: &str) {
    let (agree, positions, max_diff) = teacher_forced_with(name, &SessionConfig::default());
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

/// [`teacher_forced`]'s comparison under the attention settings of `base`: (positions whose
/// top-1 agrees, positions, largest top-10 logit difference).
fn teacher_forced_with(name: &str, base: &SessionConfig) -> (usize, usize, f32) {
    let model = model(name);
    let cases = read_jsonl(&reference_dir(name).join("logits.jsonl"));
    let mut sess = session_with(&model, Some(4), base);
    let mut whole = session_with(&model, None, base);
    let mut chunked = session_with(&model, Some(3), base);
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
        for s in [&mut whole, &mut chunked] {
            s.reset();
            let logits = s.prefill(&prompt).unwrap().to_vec();
            positions += 1;
            agree += usize::from(compare(&logits, last, &mut max_diff));
        }
    }
    (agree, positions, max_diff)
}

/// The tiled (online-softmax) attention, with an f16 cache (`--flash-attn`) or a q8_0 one,
/// applies the sliding window and the soft-cap too: it stays close to llama.cpp's exact
/// (non-flash, f16) reference.
#[test]
fn tiled_attention_and_q8_0_cache_stay_close() {
    for kv_type in [KvType::F16, KvType::Q8_0] {
        for name in ["gemma2", "gemma3", "qwen3"] {
            let cfg = SessionConfig {
                flash_attn: true,
                kv_type,
                ..Default::default()
            };
            let (agree, positions, max_diff) = teacher_forced_with(name, &cfg);
            eprintln!(
                "{name} tiled, {} cache: top-1 {agree}/{positions}, top-10 logits within {max_diff:.4}",
                kv_type.name()
            );
            let (min_agree, tolerance) = match kv_type {
                KvType::F16 => (99, LOGIT_TOLERANCE),
                KvType::Q8_0 => (95, 0.5),
            };
            assert!(
                agree * 100 >= positions * min_agree,
                "{name} {kv_type:?}: {agree}/{positions}"
            );
            assert!(max_diff <= tolerance, "{name} {kv_type:?}: {max_diff}");
        }
    }
}

/// Greedy continuations token for token.
fn greedy_matches(name: &str) {
    let model = model(name);
    let cases = read_jsonl(&reference_dir(name).join("greedy.jsonl"));
    let mut sess = session(&model, Some(4));
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

/// Sliding-window layers hold min(ctx, window + ubatch) KV rows, and the plan (what
/// `edge-run plan` prints and `--mem-budget` charges) counts exactly that; other models keep
/// ctx rows per layer.
#[test]
fn plan_charges_sliding_window_layers_only_their_window() {
    use edge_engine::session::SessionPlan;
    let window = edge_tests::synth::WINDOW as usize;
    // (model, layers, sliding-window layers): Gemma 2 alternates (layers 0 and 2 of 4),
    // Gemma 3 has five local layers to one global (layers 0-4 of 6), Qwen2 none.
    for (name, n_layer, n_swa) in [("gemma2", 4, 2), ("gemma3", 6, 5), ("qwen2", 3, 0)] {
        let model = model(name);
        let row = 2 * model.params.kv_dim(); // f16
        for (ctx, ubatch) in [(256usize, 16usize), (256, 512), (12, 4), (64, 1)] {
            let cfg = SessionConfig {
                ctx: Some(ctx),
                ubatch: Some(ubatch),
                threads: Some(1),
                ..Default::default()
            };
            let plan = SessionPlan::new(&model, &cfg).unwrap();
            let ubatch = ubatch.min(ctx);
            let swa_rows = ctx.min(window + ubatch);
            let want = 2 * row * ((n_layer - n_swa) * ctx + n_swa * swa_rows);
            assert_eq!(
                plan.report.kv_bytes, want as u64,
                "{name} ctx {ctx} ubatch {ubatch}"
            );
            assert_eq!(plan.demand().kv, want as u64);
        }
    }
}

/// A context shift would re-rotate keys over a cache laid out by position: refused, with the
/// fix, for models with sliding-window layers or rope frequency factors.
#[test]
fn context_shift_is_refused_where_it_cannot_work() {
    for name in ["gemma2", "gemma3", "llama3"] {
        let model = model(name);
        let mut s = session(&model, Some(4));
        s.prefill(&[1, 2, 3, 4, 5, 6]).unwrap();
        let err = s.shift_context(1, 2).unwrap_err();
        let e = err.to_string();
        assert!(
            e.contains("context shift is not supported")
                && e.ends_with("use a larger ctx")
                && err.setting() == Some(Setting::Ctx),
            "{name}: {e}"
        );
        assert_eq!(s.n_past(), 6, "{name}: nothing was dropped");
    }
    // Phi-3 (partial rotary, one rope) shifts.
    let model = model("phi3");
    let mut s = session(&model, Some(4));
    s.prefill(&[1, 2, 3, 4, 5, 6]).unwrap();
    s.shift_context(1, 2).unwrap();
    assert_eq!(s.n_past(), 4);
}

/// The CUDA backend runs the llama architecture only: every other one goes to the CPU (the
/// default device logs why; `--device cuda` reports it). Decided without a GPU.
#[test]
fn cuda_refuses_the_new_architectures() {
    use edge_engine::backend::cuda::cuda_unsupported;
    for name in ["qwen2", "qwen3", "phi3", "gemma2", "gemma3"] {
        let model = model(name);
        let reason = cuda_unsupported(&model).unwrap_or_else(|| panic!("{name} accepted"));
        let text = reason.to_string();
        assert!(
            text.contains(&model.params.arch)
                && text.ends_with("use device cpu")
                && reason.settings().eq([Setting::Device]),
            "{reason}"
        );
    }
    let reason = cuda_unsupported(&model("llama3")).expect("rope factors refused");
    assert!(reason.to_string().contains("rope_freqs"), "{reason}");
}

/// Phi-3's long-context variants (`rope_factors_long`/`_short`, "longrope") are refused at
/// load with the fix, not run without their factors.
#[test]
fn phi3_longrope_factors_are_refused() {
    let bytes = make_arch_model("phi3", donor()).unwrap();
    let g = Gguf::from_bytes(bytes).unwrap();
    let mut w = edge_engine::gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone());
    }
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ggml_type, g.tensor_data(t).to_vec());
    }
    let n = (model("phi3").params.rope.n_rot / 2) as u64;
    let ones: Vec<u8> = (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    w.add_tensor(
        "rope_factors_long.weight",
        &[n],
        edge_engine::gguf::GgmlType::F32,
        ones,
    );
    let e = Model::from_gguf(Gguf::from_bytes(w.to_bytes()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rope_factors_long") && e.contains("not supported"),
        "{e}"
    );
}
