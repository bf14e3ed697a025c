//! A tiny random BERT written with `GgufWriter`, run by the [`Embedder`] and by a plain f64
//! implementation of the same math written here (llama.cpp's `bert` graph: embeddings + LayerNorm,
//! post-norm blocks, bidirectional attention, tanh-GELU, pooling). Checks every encoder op, the
//! three poolings, buffer reuse across lengths, the error paths; needs no downloaded model.

use std::sync::Arc;

use edge_engine::embed::{EmbedConfig, EmbedPlan, Embedder, Pooling};
use edge_engine::error::{EngineError, Setting};
use edge_engine::gguf::GgmlType;
use edge_engine::gguf::{Gguf, GgufWriter};
use edge_engine::model::Model;

const D: usize = 8;
const HEADS: usize = 2;
const FF: usize = 16;
const LAYERS: usize = 2;
const CTX: usize = 16;
const EPS: f32 = 1e-12;
const TOKENS: [&str; 10] = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "\u{2581}a",
    "\u{2581}b",
    "\u{2581}c",
    "\u{2581}d",
    "\u{2581}e",
];

struct Rng(u64);

impl Rng {
    fn f32(&mut self, scale: f32) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }
}

/// Every tensor as f32 values, by name (row-major: row r of a [in, out] matrix is output r).
struct Weights(Vec<(String, Vec<u64>, Vec<f32>)>);

impl Weights {
    fn get(&self, name: &str) -> &[f32] {
        &self.0.iter().find(|(n, _, _)| n == name).unwrap().2
    }
}

fn random_weights() -> Weights {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let mut w = Vec::new();
    let mut t = |name: &str, dims: &[u64], scale: f32, offset: f32| {
        let n = dims.iter().product::<u64>() as usize;
        let v = r.vec(n, scale).into_iter().map(|x| x + offset).collect();
        w.push((name.to_string(), dims.to_vec(), v));
    };
    let (d, ff) = (D as u64, FF as u64);
    t("token_embd.weight", &[d, TOKENS.len() as u64], 1.0, 0.0);
    t("token_types.weight", &[d, 2], 0.5, 0.0);
    t("position_embd.weight", &[d, CTX as u64], 0.5, 0.0);
    t("token_embd_norm.weight", &[d], 0.2, 1.0);
    t("token_embd_norm.bias", &[d], 0.1, 0.0);
    for l in 0..LAYERS {
        for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            t(&format!("blk.{l}.{m}.weight"), &[d, d], 0.5, 0.0);
            t(&format!("blk.{l}.{m}.bias"), &[d], 0.1, 0.0);
        }
        t(&format!("blk.{l}.ffn_up.weight"), &[d, ff], 0.5, 0.0);
        t(&format!("blk.{l}.ffn_up.bias"), &[ff], 0.1, 0.0);
        t(&format!("blk.{l}.ffn_down.weight"), &[ff, d], 0.5, 0.0);
        t(&format!("blk.{l}.ffn_down.bias"), &[d], 0.1, 0.0);
        for n in ["attn_output_norm", "layer_output_norm"] {
            t(&format!("blk.{l}.{n}.weight"), &[d], 0.2, 1.0);
            t(&format!("blk.{l}.{n}.bias"), &[d], 0.1, 0.0);
        }
    }
    Weights(w)
}

fn gguf_bytes(w: &Weights, pooling_type: Option<u32>, arch: &str) -> Vec<u8> {
    gguf_bytes_with_eps(w, pooling_type, arch, EPS)
}

fn gguf_bytes_with_eps(w: &Weights, pooling_type: Option<u32>, arch: &str, eps: f32) -> Vec<u8> {
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", arch);
    g.add_u32(&format!("{arch}.block_count"), LAYERS as u32);
    g.add_u32(&format!("{arch}.context_length"), CTX as u32);
    g.add_u32(&format!("{arch}.embedding_length"), D as u32);
    g.add_u32(&format!("{arch}.feed_forward_length"), FF as u32);
    g.add_u32(&format!("{arch}.attention.head_count"), HEADS as u32);
    g.add_f32(&format!("{arch}.attention.layer_norm_epsilon"), eps);
    g.add_bool(&format!("{arch}.attention.causal"), false);
    if let Some(p) = pooling_type {
        g.add_u32(&format!("{arch}.pooling_type"), p);
    }
    g.add_str("tokenizer.ggml.model", "bert");
    g.add_str_array("tokenizer.ggml.tokens", &TOKENS);
    g.add_i32_array("tokenizer.ggml.token_type", &[3, 2, 3, 3, 3, 1, 1, 1, 1, 1]);
    g.add_u32("tokenizer.ggml.bos_token_id", 2);
    g.add_u32("tokenizer.ggml.eos_token_id", 3);
    g.add_u32("tokenizer.ggml.seperator_token_id", 3);
    g.add_u32("tokenizer.ggml.unknown_token_id", 1);
    g.add_u32("tokenizer.ggml.padding_token_id", 0);
    for (name, dims, v) in &w.0 {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        g.add_tensor(name, dims, GgmlType::F32, bytes);
    }
    g.to_bytes()
}

fn model(w: &Weights, pooling_type: Option<u32>) -> Result<Arc<Model>, EngineError> {
    let g = Gguf::from_bytes(gguf_bytes(w, pooling_type, "bert"))?;
    Model::from_gguf(g).map(Arc::new)
}

// ---------------------------------------------------------------- the f64 reference

fn layer_norm(x: &[f64], w: &[f32], b: &[f32]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    x.iter()
        .enumerate()
        .map(|(i, v)| {
            (v - mean) / (var + f64::from(EPS)).sqrt() * f64::from(w[i]) + f64::from(b[i])
        })
        .collect()
}

fn linear(x: &[f64], w: &[f32], b: &[f32]) -> Vec<f64> {
    let (n_in, n_out) = (x.len(), b.len());
    (0..n_out)
        .map(|r| {
            (0..n_in)
                .map(|c| f64::from(w[r * n_in + c]) * x[c])
                .sum::<f64>()
                + f64::from(b[r])
        })
        .collect()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

fn reference(w: &Weights, ids: &[u32], pooling: Pooling) -> Vec<f64> {
    let n = ids.len();
    let row = |name: &str, r: usize| -> Vec<f64> {
        w.get(name)[r * D..(r + 1) * D]
            .iter()
            .map(|&v| f64::from(v))
            .collect()
    };
    let mut x: Vec<Vec<f64>> = (0..n)
        .map(|t| {
            let (a, b, c) = (
                row("token_embd.weight", ids[t] as usize),
                row("token_types.weight", 0),
                row("position_embd.weight", t),
            );
            let e: Vec<f64> = (0..D).map(|i| a[i] + b[i] + c[i]).collect();
            layer_norm(
                &e,
                w.get("token_embd_norm.weight"),
                w.get("token_embd_norm.bias"),
            )
        })
        .collect();
    let hd = D / HEADS;
    for l in 0..LAYERS {
        let p = |s: &str, k: &str| format!("blk.{l}.{s}.{k}");
        let lin = |x: &[f64], s: &str| linear(x, w.get(&p(s, "weight")), w.get(&p(s, "bias")));
        let q: Vec<_> = x.iter().map(|r| lin(r, "attn_q")).collect();
        let k: Vec<_> = x.iter().map(|r| lin(r, "attn_k")).collect();
        let v: Vec<_> = x.iter().map(|r| lin(r, "attn_v")).collect();
        let mut h = Vec::new();
        for t in 0..n {
            let mut att = vec![0.0; D];
            for head in 0..HEADS {
                let cols = head * hd..(head + 1) * hd;
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        cols.clone().map(|c| q[t][c] * k[j][c]).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - max).exp()).sum();
                for c in cols {
                    att[c] = (0..n).map(|j| (s[j] - max).exp() / z * v[j][c]).sum();
                }
            }
            let o = lin(&att, "attn_output");
            let r: Vec<f64> = (0..D).map(|i| o[i] + x[t][i]).collect();
            h.push(layer_norm(
                &r,
                w.get(&p("attn_output_norm", "weight")),
                w.get(&p("attn_output_norm", "bias")),
            ));
        }
        x = h
            .iter()
            .map(|h| {
                let u: Vec<f64> = lin(h, "ffn_up").into_iter().map(gelu).collect();
                let dn = lin(&u, "ffn_down");
                let r: Vec<f64> = (0..D).map(|i| dn[i] + h[i]).collect();
                layer_norm(
                    &r,
                    w.get(&p("layer_output_norm", "weight")),
                    w.get(&p("layer_output_norm", "bias")),
                )
            })
            .collect();
    }
    match pooling {
        Pooling::Mean => (0..D)
            .map(|i| x.iter().map(|r| r[i]).sum::<f64>() / n as f64)
            .collect(),
        Pooling::Cls => x[0].clone(),
        Pooling::Last => x[n - 1].clone(),
    }
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

// ---------------------------------------------------------------- tests

#[test]
fn every_pooling_matches_the_f64_reference() {
    let w = random_weights();
    let m = model(&w, Some(1)).unwrap();
    let inputs: [&[u32]; 4] = [
        &[2, 5, 3],
        &[2, 9, 8, 7, 6, 5, 1, 3],
        &[2, 3],
        &[2, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 3],
    ];
    for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
        for threads in [1, 3] {
            let cfg = EmbedConfig {
                pooling: Some(pooling),
                threads: Some(threads),
                normalize: false,
                ..Default::default()
            };
            let mut e = Embedder::new(Arc::clone(&m), &cfg).unwrap();
            assert_eq!(e.max_tokens(), CTX);
            // Lengths go up and down through the same buffers.
            for ids in inputs.iter().chain(inputs.iter().rev()) {
                let got = e.embed_tokens(ids).unwrap();
                let want = reference(&w, ids, pooling);
                let diff = max_diff(&got, &want);
                // GELU at f16 precision (as ggml) is the only deliberate difference (measured
                // max 7e-4).
                assert!(
                    diff < 3e-3,
                    "{pooling:?} {threads} threads {ids:?}: {diff}\n{got:?}\n{want:?}"
                );
            }
        }
    }
    // Without a pooling in the config, the metadata's (1 = mean) is used; normalising scales
    // to unit length.
    let mut e = Embedder::new(Arc::clone(&m), &EmbedConfig::default()).unwrap();
    assert_eq!(e.pooling(), Pooling::Mean);
    let v = e.embed_tokens(inputs[1]).unwrap();
    let want = reference(&w, inputs[1], Pooling::Mean);
    let n = want.iter().map(|x| x * x).sum::<f64>().sqrt();
    let unit: Vec<f64> = want.iter().map(|x| x / n).collect();
    assert!(max_diff(&v, &unit) < 1e-2);
    // Text goes through the WordPiece tokenizer with [CLS] and [SEP].
    assert_eq!(
        m.tokenize("a b e", true, false).unwrap(),
        vec![2, 5, 6, 9, 3]
    );
    let from_text = e.embed(&["a b e"]).unwrap();
    assert_eq!(from_text[0], e.embed_tokens(&[2, 5, 6, 9, 3]).unwrap());
}

#[test]
fn pooling_from_metadata_and_its_errors() {
    let w = random_weights();
    for (ty, want) in [(1, Pooling::Mean), (2, Pooling::Cls), (3, Pooling::Last)] {
        let e = Embedder::new(model(&w, Some(ty)).unwrap(), &EmbedConfig::default()).unwrap();
        assert_eq!(e.pooling(), want);
    }
    for ty in [None, Some(0), Some(4)] {
        let err = Embedder::new(model(&w, ty).unwrap(), &EmbedConfig::default()).unwrap_err();
        assert_eq!(err.setting(), Some(Setting::Pooling), "{err}");
        assert!(err.to_string().contains("pooling mean|cls|last"), "{err}");
    }
    let err = model(&w, Some(9)).unwrap_err();
    assert!(err.to_string().contains("pooling_type"), "{err}");
}

#[test]
fn bad_inputs_are_errors() {
    let w = random_weights();
    let m = model(&w, Some(1)).unwrap();
    let mut e = Embedder::new(
        Arc::clone(&m),
        &EmbedConfig {
            max_tokens: Some(6),
            ..Default::default()
        },
    )
    .unwrap();
    let err = e.embed(&["a", "a b c d e"]).unwrap_err().to_string();
    assert!(
        err.contains("text 2 has 7 tokens") && err.contains("raise max_tokens (up to"),
        "{err}"
    );
    assert!(e.embed_tokens(&[]).is_err());
    let err = e.embed_tokens(&[2, 10, 3]).unwrap_err().to_string();
    assert!(err.contains("token id 10"), "{err}");
    let err = EmbedPlan::new(
        &m,
        &EmbedConfig {
            max_tokens: Some(CTX + 1),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(&format!("1 to {CTX}")), "{err}");
    assert!(EmbedPlan::new(
        &m,
        &EmbedConfig {
            threads: Some(0),
            ..Default::default()
        }
    )
    .is_err());
    // Encoders do not open generation sessions, and do not run on CUDA.
    let err = edge_engine::session::Session::new(Arc::clone(&m), &Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("embed::Embedder"), "{err}");
    let why = edge_engine::backend::cuda::cuda_unsupported(&m).expect("encoders are CPU-only");
    assert!(
        why.to_string().contains("encoder") && why.to_string().ends_with("use device cpu"),
        "{why}"
    );
    // A missing bias-free tensor is named.
    let mut broken = random_weights();
    broken
        .0
        .retain(|(n, _, _)| n != "blk.1.layer_output_norm.bias");
    let err = Model::from_gguf(Gguf::from_bytes(gguf_bytes(&broken, Some(1), "bert")).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.1.layer_output_norm.bias"), "{err}");
}

/// An epsilon that is NaN, infinite, zero or negative is refused at load, naming the key and
/// the value: it would make every vector NaN.
#[test]
fn a_layer_norm_epsilon_that_cannot_work_is_refused() {
    let w = random_weights();
    for eps in [f32::NAN, f32::INFINITY, 0.0, -1e-12] {
        let bytes = gguf_bytes_with_eps(&w, Some(1), "bert", eps);
        let err = Model::from_gguf(Gguf::from_bytes(bytes).unwrap()).unwrap_err();
        match &err {
            EngineError::Metadata { key, problem } => {
                assert_eq!(key, "bert.attention.layer_norm_epsilon");
                assert!(problem.contains(&eps.to_string()), "{problem}");
            }
            other => panic!("eps {eps}: expected Metadata, got {other:?}"),
        }
    }
}

/// Weights that make the vector NaN or infinite end with an error, not a printed NaN vector.
#[test]
fn a_non_finite_embedding_is_an_error() {
    for bad in [f32::NAN, f32::INFINITY] {
        let mut w = random_weights();
        w.0.iter_mut()
            .find(|(n, _, _)| n == "blk.1.ffn_down.bias")
            .unwrap()
            .2[0] = bad;
        let m = model(&w, Some(1)).unwrap();
        let mut e = Embedder::new(Arc::clone(&m), &EmbedConfig::default()).unwrap();
        let err = e.embed(&["a b"]).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::NonFinite {
                    what: "the embedding",
                    ..
                }
            ),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains("not finite"), "{err}");
    }
}

#[test]
fn the_plan_fits_a_budget_or_says_what_would() {
    let w = random_weights();
    let m = model(&w, Some(1)).unwrap();
    let cfg = EmbedConfig {
        threads: Some(1),
        ..Default::default()
    };
    let full = EmbedPlan::new(&m, &cfg).unwrap();
    assert_eq!(full.report.kv_bytes, 0);
    assert!(full.report.arena_bytes >= full.report.arena_lower_bound_bytes);
    let small = EmbedPlan::new(
        &m,
        &EmbedConfig {
            max_tokens: Some(4),
            ..cfg.clone()
        },
    )
    .unwrap();
    assert!(small.report.arena_bytes < full.report.arena_bytes);
    // A budget between the two: the largest max_tokens that fits is chosen.
    let limit = (small.report.owned_bytes() + full.report.owned_bytes()) / 2;
    let budget = edge_targets::Budget {
        limit_bytes: limit,
        count_weights: false,
    };
    let fit = EmbedPlan::within_budget(&m, &cfg, &budget).unwrap();
    assert!(fit.max_tokens >= 4 && fit.max_tokens < CTX && fit.report.owned_bytes() <= limit);
    // Asking for all of it is refused with the largest that fits.
    let err = EmbedPlan::within_budget(
        &m,
        &EmbedConfig {
            max_tokens: Some(CTX),
            ..cfg
        },
        &budget,
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Budget(_)));
    assert!(
        err.to_string()
            .contains(&format!("use ctx {} or less", fit.max_tokens)),
        "{err}"
    );
}
