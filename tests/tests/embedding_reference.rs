//! all-MiniLM-L6-v2 embeddings against llama.cpp's, for the sentences of
//! tests/data/embed/ (see its README for how the reference was made). Skips when the model
//! is missing (scripts/fetch-embed-model.sh makes it).

use std::path::PathBuf;
use std::sync::Arc;

use edge_engine::embed::{EmbedConfig, Embedder, Pooling};
use edge_engine::model::Model;
use edge_tests::{ids, minilm_path, read_jsonl};

/// The sha256 of the GGUF file the reference data was made from (tests/data/embed/README.md).
const MODEL_SHA256: &str = "31b8f19f1058734f1b279f15ef1c83452767dcfdf4325ffa10736c690cf7fe62";

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/embed")
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// The file must be the one llama.cpp embedded, or the comparison means nothing.
#[test]
fn model_file_is_the_one_the_reference_was_made_from() {
    let Some(path) = minilm_path() else { return };
    let out = match std::process::Command::new("sha256sum").arg(&path).output() {
        Ok(o) if o.status.success() => o,
        _ => {
            return edge_tests::missing("sha256sum", "install coreutils");
        }
    };
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        line.split_whitespace().next(),
        Some(MODEL_SHA256),
        "{} is not the file the reference embeddings were made from; run scripts/fetch-embed-model.sh",
        path.display()
    );
}

#[test]
fn tokens_match_llama_cpp() {
    let Some(path) = minilm_path() else { return };
    let model = Model::load(&path).unwrap();
    for rec in read_jsonl(&data_dir().join("tokens.jsonl")) {
        let text = rec["text"].as_str().unwrap();
        assert_eq!(
            model.tokenize(text, true, false).unwrap(),
            ids(&rec["ids"]),
            "{text:?}"
        );
    }
}

/// Every sentence's embedding points where llama.cpp's does and has its length. Measured: the
/// smallest cosine over the 14 sentences is 0.9999998 (1 - cos <= 1.8e-7) and the raw
/// (unnormalised) lengths agree within 1.2e-4. Asserted with a margin of about 5x and 2x:
/// 1 - cos <= 1e-6, lengths within 2.5e-4. A kernel that is off (GELU in f32 instead of ggml's
/// f16 table, a LayerNorm epsilon, a pooling off by one token) moves 1 - cos to 1e-4 or more.
#[test]
fn embeddings_match_llama_cpp() {
    let Some(path) = minilm_path() else { return };
    let model = Arc::new(Model::load(&path).unwrap());
    let refs = read_jsonl(&data_dir().join("embeddings.jsonl"));
    let texts: Vec<&str> = refs.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let cfg = EmbedConfig {
        threads: Some(2),
        normalize: false,
        ..Default::default()
    };
    let mut embedder = Embedder::new(Arc::clone(&model), &cfg).unwrap();
    assert_eq!(embedder.pooling(), Pooling::Mean, "from bert.pooling_type");
    let got = embedder.embed(&texts).unwrap();
    let mut min_cos = f64::MAX;
    for ((text, rec), v) in texts.iter().zip(&refs).zip(&got) {
        let want = floats(&rec["embedding"]);
        assert_eq!(v.len(), want.len());
        let c = cosine(v, &want);
        let norm_got = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        let norm_want = want.iter().map(|y| y * y).sum::<f64>().sqrt();
        let short: String = text.chars().take(40).collect();
        eprintln!(
            "cosine {c:.7} (1 - cos {:.1e})  norm {norm_got:.4} vs {norm_want:.4}  {short:?}",
            1.0 - c
        );
        assert!(1.0 - c <= 1e-6, "{text:?}: cosine {c}: 1 - cos > 1e-6");
        assert!(
            (norm_got / norm_want - 1.0).abs() <= 2.5e-4,
            "{text:?}: norm {norm_got} vs {norm_want}"
        );
        min_cos = min_cos.min(c);
    }
    eprintln!("min cosine over {} sentences: {min_cos:.7}", texts.len());

    // Normalised (the default): unit vectors in the same directions; the buffers are reused,
    // so a second pass over the batch gives the same vectors again.
    let mut unit = Embedder::new(
        Arc::clone(&model),
        &EmbedConfig {
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let first = unit.embed(&texts).unwrap();
    assert_eq!(unit.embed(&texts).unwrap(), first);
    for (u, v) in first.iter().zip(&got) {
        let n: f64 = u.iter().map(|&x| f64::from(x).powi(2)).sum();
        assert!((n - 1.0).abs() < 1e-5, "norm^2 {n}");
        let raw: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
        assert!(cosine(u, &raw) > 0.999_999);
    }
    // Semantics, as a sanity check on top of the reference: the paraphrase is closer than
    // an unrelated sentence.
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!(dot(&first[0], &first[1]) > dot(&first[0], &first[6]) + 0.2);
    assert!(dot(&first[2], &first[3]) > dot(&first[2], &first[4]) + 0.2);
}
