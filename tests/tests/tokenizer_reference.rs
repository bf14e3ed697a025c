//! The tokenizer against llama.cpp: its tokenizer test vocabularies (`ggml-vocab-*.gguf`, inputs in
//! `.inp`, expected ids in `.out`, add_special = false, parse_special = false) and SmolLM2's
//! reference tokenizations (plain and with special tokens parsed). Vocabularies are read from the
//! GGUF files with the engine's reader (`edge_engine::vocab`).

use std::path::{Path, PathBuf};

use edge_engine::gguf::Gguf;
use edge_tests::{ids, read_jsonl, shared_dir, smollm2_path};
use edge_tokenizers::Tokenizer;

fn tokenizer(path: &Path) -> Tokenizer {
    let g = Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cfg = edge_engine::model::vocab::vocab_config_from_gguf(&g)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_config(cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn vocab_dir() -> PathBuf {
    shared_dir().join("reference/tokenizer")
}

/// The cases of a `.inp` file: each case is followed by a line `__ggml_vocab_test__` (so every
/// case ends with "\n__ggml_vocab_test__\n"; a case may itself be empty or consist of newlines).
fn read_cases(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut cases: Vec<String> = text
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    // the text after the last separator is not a case
    assert_eq!(
        cases.pop().as_deref(),
        Some(""),
        "{}: trailing text after the last separator",
        path.display()
    );
    cases
}

fn read_expected(path: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("token id"))
                .collect()
        })
        .collect()
}

fn check_vocab(name: &str) {
    let gguf = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let tok = tokenizer(&gguf);
    let cases = read_cases(&gguf.with_extension("gguf.inp"));
    let expected = read_expected(&gguf.with_extension("gguf.out"));
    assert_eq!(
        cases.len(),
        expected.len(),
        "{name}: .inp and .out disagree on the number of cases"
    );
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(&expected) {
        let got = tok
            .encode(case, false, false)
            .unwrap_or_else(|e| panic!("{name}: {case:?}: {e}"));
        if &got != want {
            failures.push(format!(
                "  case {case:?}\n    expected {want:?}\n    got      {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn vocab_llama_spm() {
    check_vocab("llama-spm");
}

#[test]
fn vocab_phi_3() {
    check_vocab("phi-3");
}

#[test]
fn vocab_bert_bge() {
    check_vocab("bert-bge");
}

#[test]
fn vocab_gpt_2() {
    check_vocab("gpt-2");
}

#[test]
fn vocab_llama_bpe() {
    check_vocab("llama-bpe");
}

#[test]
fn vocab_qwen2() {
    check_vocab("qwen2");
}

#[test]
fn vocab_deepseek_llm() {
    check_vocab("deepseek-llm");
}

#[test]
fn vocab_starcoder() {
    check_vocab("starcoder");
}

#[test]
fn vocab_falcon() {
    check_vocab("falcon");
}

/// Every vocabulary in the reference folder has a test above.
#[test]
fn every_reference_vocab_is_tested() {
    let tested = [
        "llama-spm",
        "phi-3",
        "bert-bge",
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "deepseek-llm",
        "starcoder",
        "falcon",
    ];
    let dir = vocab_dir();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry
            .expect("dir entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if let Some(v) = name
            .strip_prefix("ggml-vocab-")
            .and_then(|n| n.strip_suffix(".gguf"))
        {
            assert!(
                tested.contains(&v),
                "{name} has no test in tokenizer_reference.rs"
            );
        }
    }
}

fn check_smollm2(file: &str, parse_special: bool) {
    let tok = tokenizer(&smollm2_path());
    let path = shared_dir().join("reference/smollm2").join(file);
    let rows = read_jsonl(&path);
    assert!(!rows.is_empty(), "{}: no cases", path.display());
    let mut failures = Vec::new();
    for row in &rows {
        let text = row["text"].as_str().expect("text");
        let want = ids(&row["ids"]);
        let got = tok
            .encode(text, false, parse_special)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
        if got != want {
            failures.push(format!(
                "  case {text:?}\n    expected {want:?}\n    got      {got:?}"
            ));
        } else if tok.decode(&got) != text {
            failures.push(format!(
                "  case {text:?}: decodes to {:?}",
                tok.decode(&got)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{file}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_tokenize_plain() {
    check_smollm2("tokenize.jsonl", false);
}

#[test]
fn smollm2_tokenize_special() {
    check_smollm2("tokenize-special.jsonl", true);
}

#[test]
fn smollm2_special_tokens_and_eog() {
    let tok = tokenizer(&smollm2_path());
    let im_start = tok.token_id("<|im_start|>").expect("<|im_start|>");
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
    let eot = tok.token_id("<|endoftext|>").expect("<|endoftext|>");
    assert!(
        tok.is_eog(im_end) && tok.is_eog(eot),
        "<|im_end|> and <|endoftext|> end generation"
    );
    assert!(!tok.is_eog(im_start));
    assert_eq!(tok.token_to_piece(im_start), b"<|im_start|>");
    // add_bos_token is false for SmolLM2: add_special adds nothing
    assert_eq!(
        tok.encode("Hi", true, false).unwrap(),
        tok.encode("Hi", false, false).unwrap()
    );
    // special text stays plain text unless parsed
    assert_eq!(
        tok.encode("<|im_start|>", false, true).unwrap(),
        vec![im_start]
    );
    assert!(tok.encode("<|im_start|>", false, false).unwrap().len() > 1);
}

#[test]
fn streaming_matches_decode() {
    let tok = tokenizer(&smollm2_path());
    let text = "emoji 🤖🚀 and 👩‍💻, 显存管理, Привет";
    let ids = tok.encode(text, false, false).unwrap();
    let mut d = edge_tokenizers::StreamDecoder::new();
    let mut streamed = String::new();
    for &id in &ids {
        if let Some(s) = d.push(id, &tok) {
            assert!(!s.contains('\u{FFFD}'), "a character was split: {s:?}");
            streamed.push_str(s);
        }
    }
    if let Some(s) = d.flush() {
        streamed.push_str(s);
    }
    assert_eq!(streamed, text);
    assert_eq!(tok.decode(&ids), text);
}

#[test]
fn add_special_per_family() {
    let spm = tokenizer(&vocab_dir().join("ggml-vocab-llama-spm.gguf"));
    let ids = spm.encode("Hello", true, false).unwrap();
    assert_eq!(ids.first().copied(), spm.bos_id(), "SPM adds BOS");
    let bert = tokenizer(&vocab_dir().join("ggml-vocab-bert-bge.gguf"));
    let ids = bert.encode("Hello", true, false).unwrap();
    assert_eq!(ids.first(), Some(&101), "bert adds CLS");
    assert_eq!(ids.last(), Some(&102), "bert adds SEP");
    let llama3 = tokenizer(&vocab_dir().join("ggml-vocab-llama-bpe.gguf"));
    let ids = llama3.encode("Hello", true, false).unwrap();
    assert_eq!(ids.first(), Some(&128000), "llama3 adds <|begin_of_text|>");
    assert!(llama3.is_eog(llama3.token_id("<|eot_id|>").unwrap()));
}
