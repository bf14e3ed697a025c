//! `edge_engine::perplexity` against llama.cpp's `llama-perplexity` on SmolLM2 and a committed
//! text (tests/reference/perplexity/: an excerpt of the GPL-3, its llama.cpp outputs, and the
//! commands that made them in README.md).
//!
//! - Perplexity of the Q4_1 file, context half token by token (ubatch 1): the same running
//!   values and final estimate as `llama-perplexity -b 1`, to every printed digit; with the
//!   context half batched (ubatch 512), the same to 4 significant digits as `-b 512`.
//! - The base-logits file of the Q8_0 file (scripts/make-quant-models.sh makes it): the same
//!   bytes as llama.cpp's (its sha256 is committed; the file is 125 MB).
//! - KL divergence of the Q4_1 file from that base: llama.cpp's statistics (the mean KLD within
//!   the bound below, the other figures printed alike).
//!
//! A missing Q8_0 file skips the tests that need it outside CI and fails them under `CI=true`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::perplexity::{self as ppl, report, BaseReader};
use edge_engine::session::{Session, SessionConfig};
use edge_tests::{missing, smollm2_path};

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference/perplexity")
}

fn read(name: &str) -> String {
    let p = reference().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn session(model: &Arc<Model>, ubatch: usize) -> Session {
    let cfg = SessionConfig {
        ctx: Some(512),
        ubatch: Some(ubatch),
        // One thread: the figures do not depend on it, and a shared machine's other work
        // cannot slow a spinning second thread.
        threads: Some(1),
        ..Default::default()
    };
    Session::new(Arc::clone(model), &cfg).unwrap()
}

fn text_tokens(model: &Model) -> Vec<u32> {
    model
        .tokenize(&read("gpl-3-excerpt.txt"), true, false)
        .unwrap()
}

/// The running values (`[1]x,[2]y,...`) and the final-estimate line of a llama.cpp log.
fn llama_ppl(log: &str) -> (Vec<String>, String) {
    let running = log
        .lines()
        .find(|l| l.starts_with("[1]"))
        .expect("llama.cpp's log has the running values")
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().to_string())
        .collect();
    let fin = log
        .lines()
        .find(|l| l.starts_with("Final estimate"))
        .expect("llama.cpp's log has the final estimate")
        .trim()
        .to_string();
    (running, fin)
}

fn ours(model: &Arc<Model>, ubatch: usize, base_out: Option<&Path>) -> (Vec<String>, String, f64) {
    let tokens = text_tokens(model);
    let mut s = session(model, ubatch);
    let mut running = Vec::new();
    let r = ppl::perplexity(&mut s, &tokens, 512, None, base_out, None, |d| {
        running.push(
            report::running_ppl(d.index, d.ppl)
                .trim_end_matches(',')
                .to_string(),
        )
    })
    .unwrap();
    (running, r.final_line(), r.ppl())
}

fn final_ppl(line: &str) -> f64 {
    line.split_whitespace().nth(4).unwrap().parse().unwrap()
}

#[test]
fn text_is_long_enough_for_five_chunks() {
    let model = Model::load(smollm2_path()).unwrap();
    let n = text_tokens(&model).len();
    assert!(n >= 5 * 512, "{n} tokens");
    assert_eq!(ppl::n_chunks(n, 512, None).unwrap(), 5);
}

#[test]
fn token_by_token_perplexity_equals_llama_cpp_b1() {
    let model = Arc::new(Model::load(smollm2_path()).unwrap());
    let (want_running, want_final) = llama_ppl(&read("llama-ppl-q4_1-b1.txt"));
    let (running, fin, _) = ours(&model, 1, None);
    assert_eq!(running, want_running);
    assert_eq!(fin, want_final);
}

#[test]
fn batched_perplexity_agrees_with_llama_cpp_b512() {
    let model = Arc::new(Model::load(smollm2_path()).unwrap());
    let (_, want_final) = llama_ppl(&read("llama-ppl-q4_1-b512.txt"));
    let (_, fin, got) = ours(&model, 512, None);
    let want = final_ppl(&want_final);
    // 4 significant digits.
    assert!(
        (got - want).abs() / want < 5e-4,
        "ours {fin} vs llama.cpp {want_final}"
    );
}

fn q8_0_model() -> Option<PathBuf> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q8_0.gguf");
    if p.exists() {
        Some(p)
    } else {
        missing(
            "models/SmolLM2-135M-Instruct.Q8_0.gguf",
            "run scripts/make-quant-models.sh Q8_0",
        );
        None
    }
}

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("running sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// The KL-divergence statistics lines of a log (from "====== Perplexity statistics").
fn stats_lines(log: &str) -> Vec<String> {
    log.lines()
        .skip_while(|l| !l.starts_with("====== Perplexity statistics"))
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn figure(lines: &[String], label: &str) -> f64 {
    let l = lines
        .iter()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} line in {lines:#?}"));
    l.split(':')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn base_file_and_kl_divergence_match_llama_cpp() {
    let Some(q8) = q8_0_model() else { return };
    let base_model = Arc::new(Model::load(&q8).unwrap());
    let dir = std::env::temp_dir().join(format!("edge-run-kld-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("q8_0.kld");
    // The base file, context half token by token as llama-perplexity -b 1 computes it.
    let (_, fin, _) = ours(&base_model, 1, Some(&base));
    let (_, want_final) = llama_ppl(&read("llama-base-q8_0-b1.txt"));
    assert_eq!(
        fin, want_final,
        "the Q8_0 model's perplexity on the base-writing path"
    );
    let want_sha = read("llama-base-q8_0-b1.sha256");
    assert_eq!(
        sha256(&base),
        want_sha.split_whitespace().next().unwrap(),
        "our base file is not byte for byte llama.cpp's"
    );
    drop(base_model);

    let model = Arc::new(Model::load(smollm2_path()).unwrap());
    let mut reader = BaseReader::open(&base, model.n_vocab()).unwrap();
    assert_eq!((reader.header.n_ctx, reader.header.n_chunks), (512, 5));
    let mut s = session(&model, 1);
    let mut rows = Vec::new();
    let mut r = ppl::kl_divergence(&mut s, &mut reader, None, None, |d| {
        rows.push(report::kld_chunk_line(d.index, d.kld.unwrap()))
    })
    .unwrap();
    let got = r.summary();
    let _ = std::fs::remove_dir_all(&dir);
    let log = read("llama-kld-q4_1-vs-q8_0-b1.txt");
    let want = stats_lines(&log);
    let got: Vec<String> = got.into_iter().filter(|l| !l.is_empty()).collect();
    eprintln!("ours:\n{}\nllama.cpp:\n{}", got.join("\n"), want.join("\n"));
    let (k, k_want) = (figure(&got, "Mean    KLD"), figure(&want, "Mean    KLD"));
    assert!(
        (k - k_want).abs() <= 0.02 * k_want,
        "mean KLD {k} vs llama.cpp's {k_want}"
    );
    for label in [
        "Mean PPL(Q) ",
        "Mean PPL(base)",
        "Same top p",
        "RMS Δp",
        "Median  KLD",
    ] {
        let (a, b) = (figure(&got, label), figure(&want, label));
        assert!(
            (a - b).abs() <= 0.02 * b.abs().max(1e-3),
            "{label}: ours {a} vs llama.cpp's {b}"
        );
    }
    // The per-chunk table rows, too.
    for (i, row) in rows.iter().enumerate() {
        assert!(
            log.lines().any(|l| l.trim_end() == row.trim_end()),
            "chunk {} row differs from llama.cpp's:\n{row}",
            i + 1
        );
    }
    assert_eq!(got, want, "every statistic as llama.cpp prints it");
}
