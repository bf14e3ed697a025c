//! The `edge-run` binary end to end: help and README in sync, one-line errors for bad input,
//! `tokenize` against llama.cpp's reference ids, `inspect`, and generation (greedy output equal
//! to llama.cpp's, chat, seeded sampling).
//!
//! Needs the real model (`scripts/fetch-model.sh`, or `EDGE_RUN_MODEL`) and `../shared/`
//! beside the repository (or `EDGE_RUN_SHARED`).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shared() -> PathBuf {
    edge_tests::shared_dir()
}

fn model() -> PathBuf {
    edge_tests::smollm2_path()
}

fn gpt2_vocab() -> PathBuf {
    shared().join("reference/tokenizer/ggml-vocab-gpt-2.gguf")
}

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "edge-run-cli-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn run_with(args: &[&str], stdin: Option<&[u8]>) -> Out {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("starting edge-run");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

fn run(args: &[&str]) -> Out {
    run_with(args, None)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exactly one line on stderr, starting with `error: ` and containing every needle
/// (case-insensitive); nothing on stdout; a non-zero exit that is not a panic's.
#[track_caller]
fn assert_error(out: &Out, needles: &[&str]) {
    assert!(
        matches!(out.code, Some(c) if c != 0 && c != 101),
        "expected a non-zero exit without a panic: {out:?}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing should go to stdout: {out:?}"
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one line on stderr: {out:?}"
    );
    let line = lines[0];
    assert!(line.starts_with("error: "), "{out:?}");
    assert!(!line.contains("panicked"), "{out:?}");
    let lower = line.to_lowercase();
    for n in needles {
        assert!(
            lower.contains(&n.to_lowercase()),
            "the error should mention {n:?}: {out:?}"
        );
    }
}

/// Runs `f` over `items` on a few threads (each item starts a process), in order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = 3;
    let next = AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() {
                    break;
                }
                let r = f(&items[i]);
                *results[i].lock().unwrap() = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().unwrap().unwrap())
        .collect()
}

fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids_of(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

/// Every `--long-flag` in a text.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-'
            && b[i + 1] == b'-'
            && b[i + 2].is_ascii_lowercase()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-'));
        if starts {
            let mut j = i + 2;
            while j < b.len() && (b[j].is_ascii_lowercase() || b[j] == b'-') {
                j += 1;
            }
            out.insert(text[i..j].trim_end_matches('-').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- help and README

#[test]
fn help_and_readme_list_the_same_flags() {
    let mut help = String::new();
    for args in [
        &["--help"][..],
        &["tokenize", "--help"],
        &["inspect", "--help"],
        &["plan", "--help"],
        &["bench", "--help"],
        &["embed", "--help"],
        &["chat", "--help"],
        &["serve", "--help"],
        &["perplexity", "--help"],
    ] {
        let out = run(args);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(out.stderr.is_empty(), "{out:?}");
        help.push_str(&out.stdout);
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let usage = readme
        .split("\n## Usage")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has a Usage section");
    let in_help = long_flags(&help);
    let in_readme = long_flags(usage);
    assert!(
        in_help.len() >= 20,
        "too few flags found in --help: {in_help:?}"
    );
    let missing_in_readme: Vec<_> = in_help.difference(&in_readme).collect();
    let missing_in_help: Vec<_> = in_readme.difference(&in_help).collect();
    assert!(
        missing_in_readme.is_empty() && missing_in_help.is_empty(),
        "README Usage and --help disagree: only in --help {missing_in_readme:?}, only in the README {missing_in_help:?}"
    );
    // short forms and the subcommands are documented too
    for short in ["-m,", "-p,", "-f,", "-n,", "-c,", "-t,", "-v,"] {
        assert!(help.contains(short), "--help lacks {short}");
        assert!(usage.contains(short), "README Usage lacks {short}");
    }
    for sub in [
        "tokenize",
        "inspect",
        "plan",
        "bench",
        "embed",
        "chat",
        "serve",
        "perplexity",
    ] {
        assert!(
            help.contains(sub) && usage.contains(sub),
            "{sub} undocumented"
        );
    }
}

#[test]
fn version_prints_and_exits_zero() {
    let out = run(&["--version"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.starts_with("edge-run "), "{out:?}");
}

// ---------------------------------------------------------------- bad files

#[test]
fn bad_files_give_one_line_errors() {
    let dir = TempDir::new("bad-files");
    let m = model();
    let bytes = std::fs::read(&m).unwrap();
    let not_gguf = dir.file("notes.gguf", b"# just some text, not a model\n");
    let empty = dir.file("empty.gguf", b"");
    let trunc_header = dir.file("trunc-header.gguf", &bytes[..100_000]);
    let trunc_data = dir.file("trunc-data.gguf", &bytes[..2_000_000]);
    let trunc_tail = dir.file("trunc-tail.gguf", &bytes[..bytes.len() - 1]);
    let missing = dir.0.join("no-such-model.gguf");
    let vocab = gpt2_vocab();

    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![s(&missing), "-p", "hi"],
            vec!["no-such-model.gguf", "no such file", "path"],
        ),
        (
            vec![s(&not_gguf), "-p", "hi"],
            vec!["notes.gguf", "not a GGUF file"],
        ),
        (
            vec![s(&empty), "-p", "hi"],
            vec!["empty.gguf", "empty (0 bytes)"],
        ),
        (
            vec![s(&trunc_header), "-p", "hi"],
            vec!["trunc-header.gguf", "incomplete or damaged"],
        ),
        (
            vec![s(&trunc_data), "-p", "hi"],
            vec![
                "trunc-data.gguf",
                "token_embd.weight",
                "past the end",
                "download",
            ],
        ),
        (
            vec![s(&trunc_tail), "-p", "hi"],
            vec!["trunc-tail.gguf", "past the end", "download"],
        ),
        (vec![s(&dir.0), "-p", "hi"], vec!["directory"]),
        (
            vec![s(&vocab), "-p", "hi"],
            vec!["vocabulary-only", "tokenize"],
        ),
        (
            vec!["tokenize", s(&missing), "hi"],
            vec!["no-such-model.gguf", "no such file"],
        ),
        (
            vec!["tokenize", s(&not_gguf), "hi"],
            vec!["not a GGUF file"],
        ),
        (
            vec!["tokenize", s(&trunc_header), "hi"],
            vec!["incomplete or damaged"],
        ),
        (vec!["inspect", s(&missing)], vec!["no such file"]),
        (vec!["inspect", s(&not_gguf)], vec!["not a GGUF file"]),
        (vec!["inspect", s(&trunc_data)], vec!["past the end"]),
    ];
    let outs = par_map(&cases, |(args, _)| run(args));
    for ((args, needles), out) in cases.iter().zip(&outs) {
        eprintln!("edge-run {}", args.join(" "));
        assert_error(out, needles);
        assert_eq!(out.code, Some(1), "{out:?}");
    }
}

/// A tiny f32 Llama GGUF (2 layers, width 64, byte-level vocabulary of 256 + 2 tokens, trained
/// context 64), optionally without one tensor and with another architecture name.
fn tiny_model(arch: &str, drop_tensor: Option<&str>) -> Vec<u8> {
    use edge_engine::gguf::GgmlType;
    use edge_engine::gguf::{GgufWriter, MetaValue};
    let mut tokens: Vec<String> = Vec::new();
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        tokens.push(if printable {
            char::from_u32(b).unwrap().to_string()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap().to_string()
        });
    }
    tokens.push("he".into()); // the one merge
    tokens.push("<|endoftext|>".into());
    let mut types = vec![1i32; 257];
    types.push(3);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", arch);
    for (k, v) in [
        ("block_count", 2),
        ("context_length", 64),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
    ] {
        w.add_u32(&format!("{arch}.{k}"), v);
    }
    w.add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "gpt-2")
        .add_str_array("tokenizer.ggml.tokens", &refs)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add(
            "tokenizer.ggml.merges",
            MetaValue::Array(vec![MetaValue::String("h e".into())]),
        )
        .add_u32("tokenizer.ggml.eos_token_id", 257);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut tensor = |w: &mut GgufWriter, name: String, dims: &[u64], norm: bool| {
        if Some(name.as_str()) == drop_tensor {
            return;
        }
        let n: u64 = dims.iter().product();
        let data = (0..n)
            .flat_map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let x = if norm {
                    1.0
                } else {
                    (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                };
                x.to_le_bytes()
            })
            .collect();
        w.add_tensor(&name, dims, GgmlType::F32, data);
    };
    tensor(&mut w, "token_embd.weight".into(), &[64, 258], false);
    for l in 0..2 {
        for (name, dims, norm) in [
            ("attn_norm", &[64][..], true),
            ("attn_q", &[64, 64], false),
            ("attn_k", &[64, 32], false),
            ("attn_v", &[64, 32], false),
            ("attn_output", &[64, 64], false),
            ("ffn_norm", &[64], true),
            ("ffn_gate", &[64, 128], false),
            ("ffn_up", &[64, 128], false),
            ("ffn_down", &[128, 64], false),
        ] {
            tensor(&mut w, format!("blk.{l}.{name}.weight"), dims, norm);
        }
    }
    tensor(&mut w, "output_norm.weight".into(), &[64], true);
    w.to_bytes()
}

#[test]
fn tiny_synthetic_models_through_the_cli() {
    let dir = TempDir::new("tiny");
    let good = dir.file("tiny.gguf", &tiny_model("llama", None));
    let no_ffn = dir.file(
        "no-ffn.gguf",
        &tiny_model("llama", Some("blk.1.ffn_up.weight")),
    );
    let mamba = dir.file("mamba.gguf", &tiny_model("mamba", None));
    let long_prompt = "x".repeat(100);

    let out = run(&[s(&good), "-p", "hello", "-n", "6", "--temp", "0", "-t", "1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("prompt: 4 tokens"), "{out:?}");
    let out = run(&["tokenize", s(&good), "hello"]);
    assert_eq!(tokenize_out(&out), vec![256, 108, 108, 111]);

    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![s(&no_ffn), "-p", "hi"], vec!["no-ffn.gguf", "'blk.1.ffn_up.weight' is missing"]),
        (vec![s(&mamba), "-p", "hi"], vec!["mamba.gguf", "'mamba'", "llama"]),
        (vec![s(&good), "-p", &long_prompt], vec!["100 tokens", "context holds 64", "shorten the prompt"]),
        (vec![s(&good), "-p", "hi", "--ctx", "65"], vec!["--ctx 65", "64 tokens"]),
        (vec![s(&good), "--chat", "-p", "hi"], vec!["--chat", "chat_template"]),
    ];
    let outs = par_map(&cases, |(args, _)| run(args));
    for ((args, needles), out) in cases.iter().zip(&outs) {
        eprintln!("edge-run {}", args.join(" "));
        assert_error(out, needles);
    }
}

// ---------------------------------------------------------------- bad flags and prompts

#[test]
fn bad_arguments_give_one_line_errors() {
    let m = model();
    let m = s(&m);
    let dir = TempDir::new("bad-args");
    let empty_file = dir.file("empty.txt", b"");
    let latin1 = dir.file("latin1.txt", b"caf\xe9\n");
    let long_prompt = "one two three four five six seven eight nine ten";
    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![m, "-p", "hi", "--temp", "abc"], vec!["--temp", "'abc'", "number"]),
        (vec![m, "-p", "hi", "--temp", "-1"], vec!["--temp", ">= 0"]),
        (vec![m, "-p", "hi", "-n", "-1"], vec!["--n-predict", "'-1'", ">= 0"]),
        (vec![m, "-p", "hi", "-n", "lots"], vec!["--n-predict", "'lots'"]),
        (vec![m, "-p", "hi", "--ctx", "0"], vec!["--ctx", "at least 1"]),
        (vec![m, "-p", "hi", "-c", "-3"], vec!["--ctx", "'-3'"]),
        (vec![m, "-p", "hi", "--ctx", "1000000"], vec!["--ctx", "8192"]),
        (vec![m, "-p", "hi", "--ubatch", "0"], vec!["--ubatch", "at least 1"]),
        (vec![m, "-p", "hi", "-t", "0"], vec!["--threads", "1 to 1024"]),
        (vec![m, "-p", "hi", "--top-p", "2"], vec!["--top-p", "(0, 1]", "2"]),
        (vec![m, "-p", "hi", "--top-p", "nan"], vec!["--top-p", "number"]),
        (vec![m, "-p", "hi", "--min-p", "1.5"], vec!["--min-p", "[0, 1]"]),
        (vec![m, "-p", "hi", "--top-k", "-1"], vec!["--top-k", ">= 0"]),
        (vec![m, "-p", "hi", "--repeat-penalty", "0"], vec!["--repeat-penalty", "> 0"]),
        (vec![m, "-p", "hi", "--seed", "-7"], vec!["--seed", "whole number"]),
        (vec![m, "-p", "hi", "--bogus"], vec!["--bogus", "--help"]),
        (vec![m, "-p", "hi", "--top_p", "0.5"], vec!["--top_p", "--top-p"]),
        (vec![m, "-p", "hi", "-f", "x.txt"], vec!["--prompt", "--file"]),
        (vec![m, "-p", "hi", "--system", "be brief"], vec!["--system", "--chat"]),
        (vec![m, "-p", "hi", "--keep", "4"], vec!["--keep", "--ctx-shift"]),
        (vec![m, "-p", "hi", "--ctx-shift", "--keep", "-1"], vec!["--keep", "'-1'", ">= 0"]),
        (vec![m, "-p", "hi", "--mem-budget", "1 parsec"], vec!["--mem-budget", "'1 parsec'"]),
        (vec![m, "-p", "hi", "--mem-budget", "0"], vec!["--mem-budget", "more than 0"]),
        (vec![m, "-p", "hi", "--mem-budget", "-5MiB"], vec!["--mem-budget", "'-5MiB'"]),
        (vec![m, "-p", "hi", "--kv-type", "q4_0"], vec!["--kv-type", "'q4_0'", "f16 or q8_0"]),
        (vec![m, "-p", "hi", "--target", "toaster"], vec!["--target", "toaster"]),
        (vec![m, "-p", "hi", "--count-weights"], vec!["--count-weights", "--mem-budget"]),
        (vec![m, "-p", "hi", "--repeat-last-n", "x"], vec!["--repeat-last-n", "'x'"]),
        (vec![m, "-p", "hi", "--temp", "inf"], vec!["--temp", "finite"]),
        (vec![m, "The capital of France is"], vec!["The capital of France is", "-p"]),
        (vec![m, "-p", ""], vec!["prompt is empty", "-p"]),
        (vec![m, "-f", s(&empty_file)], vec!["prompt is empty", "-f"]),
        (vec![m, "-f", s(&latin1)], vec!["latin1.txt", "UTF-8"]),
        (vec![m, "-f", "/no/such/prompt.txt"], vec!["/no/such/prompt.txt"]),
        (vec![m], vec!["no prompt", "-p"]),
        (vec!["-p", "hi"], vec!["no model"]),
        (vec![], vec!["no model"]),
        (vec![m, "-p", long_prompt, "--ctx", "4", "-n", "4"], vec!["10 tokens", "context holds 4", "--ctx 14"]),
        (vec!["tokenize", m], vec!["<TEXT>", "tokenize --help"]),
        (vec!["tokenize", m, "hi", "--stdin"], vec!["--stdin"]),
        (vec!["tokenize"], vec!["<MODEL>"]),
        (vec!["inspect"], vec!["<MODEL>"]),
        (vec!["inspect", m, "--bogus"], vec!["--bogus"]),
    ];
    let outs = par_map(&cases, |(args, _)| run(args));
    for ((args, needles), out) in cases.iter().zip(&outs) {
        eprintln!("edge-run {}", args.join(" "));
        assert_error(out, needles);
    }
    // a bad command line exits with 2; an unreadable prompt file with 1
    for ((args, _), out) in cases.iter().zip(&outs) {
        let file_problem = args.contains(&s(&latin1)) || args.contains(&"/no/such/prompt.txt");
        assert_eq!(out.code, Some(if file_problem { 1 } else { 2 }), "{out:?}");
    }
}

#[test]
fn tokenize_stdin_must_be_utf8() {
    let out = run_with(&["tokenize", s(&gpt2_vocab()), "--stdin"], Some(b"caf\xe9"));
    assert_error(&out, &["standard input", "UTF-8"]);
}

// ---------------------------------------------------------------- tokenize

fn tokenize_out(out: &Out) -> Vec<u64> {
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert!(out.stdout.ends_with("]\n"), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("a JSON array");
    ids_of(&v)
}

/// The SmolLM2 reference tokenizations: plain ones with TEXT as an argument, special ones with
/// --special through --stdin (which keeps leading/trailing spaces and newlines verbatim).
#[test]
fn tokenize_matches_smollm2_reference() {
    let m = model();
    let dir = shared().join("reference/smollm2");
    let mut cases = Vec::new();
    for case in read_jsonl(&dir.join("tokenize.jsonl")) {
        cases.push((false, false, case));
    }
    for case in read_jsonl(&dir.join("tokenize-special.jsonl")) {
        cases.push((true, true, case));
    }
    // the whitespace-sensitive plain cases through --stdin as well
    for case in read_jsonl(&dir.join("tokenize.jsonl")) {
        let t = case["text"].as_str().unwrap();
        if t.trim() != t || t.contains('\n') {
            cases.push((false, true, case));
        }
    }
    assert!(cases.len() >= 60);
    let outs = par_map(&cases, |(special, stdin, case)| {
        let text = case["text"].as_str().unwrap();
        let mut args = vec!["tokenize", s(&m)];
        if *special {
            args.push("--special");
        }
        if *stdin {
            args.push("--stdin");
            run_with(&args, Some(text.as_bytes()))
        } else {
            args.push(text);
            run(&args)
        }
    });
    let mut failures = Vec::new();
    for ((special, stdin, case), out) in cases.iter().zip(&outs) {
        let got = tokenize_out(out);
        let want = ids_of(&case["ids"]);
        if got != want {
            failures.push(format!(
                "special={special} stdin={stdin} {:?}: got {got:?}, want {want:?}",
                case["text"].as_str().unwrap()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// llama.cpp's gpt-2 vocabulary test (a vocabulary-only GGUF), every case through --stdin.
#[test]
fn tokenize_vocab_only_gpt2_matches_llama_cpp() {
    let vocab = gpt2_vocab();
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let mut cases: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(cases.pop(), Some(""));
    let expected: Vec<Vec<u64>> = std::fs::read_to_string(vocab.with_extension("gguf.out"))
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(cases.len(), expected.len());
    let outs = par_map(&cases, |text| {
        run_with(&["tokenize", s(&vocab), "--stdin"], Some(text.as_bytes()))
    });
    let mut failures = Vec::new();
    for ((text, want), out) in cases.iter().zip(&expected).zip(&outs) {
        let got = tokenize_out(out);
        if &got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn tokenize_flags() {
    let m = model();
    let m = s(&m);
    // --special parses <|im_start|>; without it the text is plain
    let special = tokenize_out(&run(&["tokenize", m, "--special", "<|im_start|>user"]));
    let plain = tokenize_out(&run(&["tokenize", m, "<|im_start|>user"]));
    assert_eq!(special[0], 1, "{special:?}");
    assert!(
        plain.len() > special.len() && !plain.contains(&1),
        "{plain:?}"
    );
    // text that looks like a flag, and empty text
    let dash = tokenize_out(&run(&["tokenize", m, "-1"]));
    assert_eq!(dash, tokenize_out(&run(&["tokenize", m, "--", "-1"])));
    assert!(!dash.is_empty());
    assert_eq!(tokenize_out(&run(&["tokenize", m, ""])), Vec::<u64>::new());
    assert_eq!(
        tokenize_out(&run_with(&["tokenize", m, "--stdin"], Some(b""))),
        Vec::<u64>::new()
    );
    // --add-special adds BOS where the metadata says so (llama-spm: add_bos_token = true)
    let spm = shared().join("reference/tokenizer/ggml-vocab-llama-spm.gguf");
    let with = tokenize_out(&run(&["tokenize", s(&spm), "--add-special", "Hello"]));
    let without = tokenize_out(&run(&["tokenize", s(&spm), "Hello"]));
    assert_eq!(with[0], 1);
    assert_eq!(&with[1..], &without[..]);
    // SmolLM2 does not add BOS (add_bos_token = false)
    assert_eq!(
        tokenize_out(&run(&["tokenize", m, "--add-special", "Hello world"])),
        vec![19556, 905]
    );
}

// ---------------------------------------------------------------- inspect

#[test]
fn inspect_prints_metadata_and_tensors() {
    let m = model();
    let out = run(&["inspect", s(&m)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].contains("GGUF v3, 33 metadata keys, 272 tensors, alignment 32"),
        "{}",
        lines[0]
    );
    let has = |words: &[&str]| {
        lines
            .iter()
            .any(|l| words.iter().all(|w| l.split_whitespace().any(|x| x == *w)))
    };
    assert!(has(&["general.architecture", "\"llama\""]), "{out:?}");
    assert!(has(&["llama.block_count", "30"]), "{out:?}");
    assert!(has(&["llama.embedding_length", "576"]), "{out:?}");
    assert!(has(&["tokenizer.ggml.model", "\"gpt2\""]), "{out:?}");
    assert!(
        has(&["tensor", "type", "dims", "bytes", "offset"]),
        "{out:?}"
    );
    assert!(
        has(&["token_embd.weight", "q8_0", "[576,", "49152]", "30081024"]),
        "{out:?}"
    );
    assert!(
        has(&["blk.0.attn_q.weight", "q4_1", "[576,", "576]"]),
        "{out:?}"
    );
    assert!(
        has(&["output_norm.weight", "f32", "[576]", "2304"]),
        "{out:?}"
    );
    let n_tensor_lines = lines.iter().filter(|l| l.contains(".weight ")).count();
    assert_eq!(n_tensor_lines, 272);
    assert!(
        lines.last().unwrap().starts_with("weights: ")
            && lines.last().unwrap().contains("q4_1: 210 tensors"),
        "{out:?}"
    );
    // long arrays are cut unless --full
    let full = run(&["inspect", s(&m), "--full"]);
    assert_eq!(full.code, Some(0), "{full:?}");
    assert!(full.stdout.len() > out.stdout.len() + 100_000);

    let vocab = run(&["inspect", s(&gpt2_vocab())]);
    assert_eq!(vocab.code, Some(0), "{vocab:?}");
    assert!(vocab.stdout.contains("0 tensors"), "{vocab:?}");
    assert!(vocab.stdout.contains("tokenizer.ggml.model"), "{vocab:?}");
}

// ---------------------------------------------------------------- generation

/// `edge-run MODEL -p "The capital of France is" -n 32 --temp 0` prints exactly llama.cpp's
/// greedy continuation on stdout, and nothing else; the summary goes to stderr.
#[test]
fn greedy_generation_matches_llama_cpp() {
    let m = model();
    let case = &read_jsonl(&shared().join("reference/smollm2/greedy.jsonl"))[0];
    let prompt = case["prompt"].as_str().unwrap();
    assert_eq!(prompt, "The capital of France is");
    let want = case["text"].as_str().unwrap();
    let out = run(&[s(&m), "-p", prompt, "-n", "32", "--temp", "0", "-t", "1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains("[edge-run] prompt: 5 tokens"),
        "{out:?}"
    );
    assert!(out.stderr.contains("generated: 32 tokens"), "{out:?}");
    assert_eq!(
        out.stdout, want,
        "stdout differs from llama.cpp's greedy text"
    );
}

#[test]
fn chat_applies_the_models_template() {
    let m = model();
    let m = s(&m);
    // SmolLM2's template: its default system message, the user turn, the assistant header
    let cases = [
        (
            None,
            "What is the capital of France?",
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            Some("You are a pirate."),
            "Hi",
            "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        ),
    ];
    let outs = par_map(&cases, |(system, prompt, rendered)| {
        let mut args = vec![
            m, "--chat", "-p", prompt, "-n", "16", "--temp", "0", "-t", "1",
        ];
        if let Some(sys) = system {
            args.extend(["--system", sys]);
        }
        let chat = run(&args);
        let ids = tokenize_out(&run(&["tokenize", m, "--special", rendered]));
        (chat, ids.len())
    });
    for (out, n_rendered) in &outs {
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(!out.stdout.trim().is_empty(), "{out:?}");
        for marker in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"] {
            assert!(!out.stdout.contains(marker), "{out:?}");
        }
        let n_prompt: usize = out
            .stderr
            .split("prompt: ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("timing summary");
        assert_eq!(
            n_prompt, *n_rendered,
            "the chat prompt is not the template's rendering: {out:?}"
        );
    }
}

/// Seeded sampling through the CLI: the same seed gives the same text, another seed another
/// text, and neither is the greedy text. The texts are recorded: made by this engine (commit
/// 163b4c8, x86-64; every kernel set gives the same bits, so the same logits and the same
/// draws) with `-f prompt.txt -n 12 --temp 0.9 -t 1 --ctx 64` and seeds 7 and 8. They pin the
/// sampler's chain (penalties, top-k 40, top-p 0.95, min-p 0.05, temperature, the seeded
/// xoshiro256** draw): sampling that silently became greedy, or drew from another distribution
/// or generator, changes them. A deliberate change of the sampler records them again.
#[test]
fn sampling_is_reproducible_with_a_seed_and_prompt_file_works() {
    const SEED_7: &str = ", a famous singer in Hollywood had a secret talent that no";
    const SEED_8: &str = ", I used to work with a non-profit organization that";
    let m = model();
    let dir = TempDir::new("sampling");
    let file = dir.file("prompt.txt", b"Once upon a time");
    let args = |seed: &'static str, temp: &'static str| {
        vec![
            s(&m).to_string(),
            "-f".into(),
            s(&file).to_string(),
            "-n".into(),
            "12".into(),
            "--temp".into(),
            temp.into(),
            "--seed".into(),
            seed.into(),
            "-t".into(),
            "1".into(),
            "--ctx".into(),
            "64".into(),
        ]
    };
    let runs = [("7", "0.9"), ("7", "0.9"), ("8", "0.9"), ("7", "0")];
    let outs = par_map(&runs, |&(seed, temp)| {
        let a = args(seed, temp);
        run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    });
    for o in &outs {
        assert_eq!(o.code, Some(0), "{o:?}");
        assert!(!o.stdout.is_empty(), "{o:?}");
    }
    assert_eq!(outs[0].stdout, outs[1].stdout, "same seed, different text");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(outs[0].stdout, SEED_7, "seed 7");
        assert_eq!(outs[2].stdout, SEED_8, "seed 8");
    }
    assert_ne!(
        outs[0].stdout, outs[2].stdout,
        "seeds 7 and 8 gave the same text"
    );
    assert_ne!(
        outs[0].stdout, outs[3].stdout,
        "sampling gave the greedy text"
    );
}

/// The context fills up during generation: it stops cleanly (not an error, not a panic).
#[test]
fn generation_stops_when_the_context_is_full() {
    let m = model();
    let out = run(&[
        s(&m),
        "-p",
        "The capital of France is",
        "--ctx",
        "8",
        "-n",
        "100",
        "--temp",
        "0",
        "-t",
        "1",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("stopped: context full"), "{out:?}");
    // 5 prompt tokens + generated ones fill 8 positions; one more token is sampled from the last
    assert!(out.stderr.contains("generated: 4 tokens"), "{out:?}");
}

#[test]
fn ctx_shift_generates_past_the_context() {
    let m = model();
    let out = run(&[
        s(&m),
        "-p",
        "The capital of France is",
        "--ctx",
        "32",
        "--ctx-shift",
        "-n",
        "80",
        "--temp",
        "0",
        "-t",
        "1",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("generated: 80 tokens"), "{out:?}");
    assert!(out.stderr.contains("stopped: token limit"), "{out:?}");
    let shifts: usize = out
        .stderr
        .split("context shifts: ")
        .nth(1)
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or_else(|| panic!("no shift count: {out:?}"));
    assert!(shifts >= 3, "{out:?}");
    // --keep larger than the context: refused up front (it is capped at the prompt's length,
    // and a prompt as long as the context leaves nothing to shift).
    let out = run(&[
        s(&m),
        "-p",
        "The capital of France is",
        "--ctx",
        "5",
        "--ctx-shift",
        "--keep",
        "99",
        "-t",
        "1",
    ]);
    assert_error(&out, &["--keep 5", "--ctx"]);
    assert_eq!(out.code, Some(2));
}

/// The first Ctrl-C stops generation after the current token: the timing summary is printed
/// and the exit status is 130.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_generation_with_the_summary() {
    use std::io::Read;
    let m = model();
    let mut child = Command::new(BIN)
        .args([
            s(&m),
            "-p",
            "Once upon a time",
            "--ctx",
            "64",
            "--ctx-shift",
            "-n",
            "1000000",
            "--temp",
            "0",
            "-t",
            "1",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting edge-run");
    // Wait for generated text: the handler is installed before the first token is printed.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("some output");
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(killed.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("stopped: interrupted (Ctrl-C)") && stderr.contains("generated: "),
        "{stderr}"
    );
    assert!(!stderr.contains("error"), "{stderr}");
}

// ---------------------------------------------------------------- plan and bench

fn json_out(out: &Out) -> serde_json::Value {
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "one JSON line: {out:?}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not a count: {v}"))
}

#[test]
fn plan_reports_consistent_memory() {
    let m = model();
    let m = s(&m);
    let cases: Vec<Vec<&str>> = vec![
        vec!["plan", m, "--json", "-t", "1"],
        vec![
            "plan", m, "--json", "--ctx", "512", "--ubatch", "1", "-t", "1",
        ],
        vec![
            "plan", m, "--json", "--ctx", "8192", "--ubatch", "1", "-t", "1",
        ],
        vec![
            "plan", m, "--json", "-c", "1024", "--ubatch", "64", "-t", "3",
        ],
    ];
    let outs = par_map(&cases, |args| run(args));
    let vs: Vec<serde_json::Value> = outs.iter().map(json_out).collect();
    for (args, v) in cases.iter().zip(&vs) {
        let ctx = u(v, "ctx");
        // SmolLM2-135M: 30 layers, kv_dim 192, K and V in f16
        assert_eq!(u(v, "kv_bytes"), 2 * 30 * ctx * 192 * 2, "{args:?}: {v}");
        let owned = u(v, "kv_bytes") + u(v, "arena_bytes") + u(v, "scratch_bytes");
        assert_eq!(u(v, "owned_bytes"), owned, "{args:?}: {v}");
        assert_eq!(
            u(v, "total_bytes"),
            owned + u(v, "weights_bytes") + u(v, "runtime_bytes"),
            "{args:?}: {v}"
        );
        // The tokenizer of a 49k-token vocabulary: several MiB, far below the weights.
        let runtime = u(v, "runtime_bytes");
        assert!(runtime > 1 << 20 && runtime < 64 << 20, "{args:?}: {v}");
        assert!(
            u(v, "arena_bytes") >= u(v, "arena_lower_bound_bytes"),
            "{v}"
        );
        assert!(u(v, "arena_lower_bound_bytes") > 0, "{v}");
        assert!(u(v, "weights_bytes") > 50 << 20, "{v}");
        assert!(u(v, "ubatch") >= 1 && u(v, "threads") >= 1, "{v}");
    }
    assert_eq!(u(&vs[0], "ctx"), 4096, "default ctx: {}", vs[0]);
    assert_eq!(u(&vs[0], "ubatch"), 512, "default ubatch: {}", vs[0]);
    assert_eq!(u(&vs[0], "threads"), 1);
    assert_eq!(
        (u(&vs[3], "ctx"), u(&vs[3], "ubatch"), u(&vs[3], "threads")),
        (1024, 64, 3)
    );
    // activations do not grow with the context at ubatch 1 (attention is tiled)
    assert_eq!(u(&vs[1], "arena_bytes"), u(&vs[2], "arena_bytes"));
    assert!(u(&vs[0], "arena_bytes") > u(&vs[1], "arena_bytes"));

    let out = run(&["plan", m, "--ctx", "2048", "-t", "2"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    for needle in [
        "weights",
        "mapped",
        "q4_1",
        "KV cache",
        "f16",
        "arena",
        "lower bound",
        "scratch",
        "total owned",
        "total with weights",
        "ctx 2048",
        "2 threads",
    ] {
        assert!(
            out.stdout.contains(needle),
            "plan lacks {needle:?}: {out:?}"
        );
    }
    assert!(
        out.stdout
            .contains(&(2u64 * 30 * 2048 * 192 * 2).to_string()),
        "{out:?}"
    );
}

/// `EDGE_RUN_PROFILE=1` with `-v` logs each thread's time per kind of op, decode and prefill
/// apart (of the runs that meet at barriers); a malformed `EDGE_RUN_SHARE_WEIGHTS` is named
/// in a warning and the run goes on.
#[test]
fn profile_and_share_weights_variables() {
    let m = model();
    let out = Command::new(BIN)
        .args([
            "bench",
            s(&m),
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-t",
            "2",
            "-v",
        ])
        .env("EDGE_RUN_PROFILE", "1")
        .env("EDGE_RUN_SHARE_WEIGHTS", "fast")
        // Barrier runs only (shared-part runs are not profiled, and a machine busy with the
        // other tests may switch to them).
        .env("EDGE_RUN_SHARED_PARTS", "0")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("EDGE_RUN_SHARE_WEIGHTS=\"fast\" is not a list of positive numbers"),
        "{err}"
    );
    for phase in ["decode", "prefill"] {
        assert!(
            err.contains(&format!("profile: {phase}, ")),
            "{phase}: {err}"
        );
    }
    // One matmul line per phase, a "running / waiting" pair of microseconds per thread.
    let matmuls: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("profile:   matmul"))
        .collect();
    assert_eq!(matmuls.len(), 2, "{err}");
    for line in matmuls {
        let cells: Vec<&str> = line.rsplit(": ").next().unwrap().split(", ").collect();
        assert_eq!(cells.len(), 2, "two threads: {line}");
        for cell in cells {
            let (run, wait) = cell.split_once(" / ").unwrap();
            let (run, wait): (f64, f64) = (run.parse().unwrap(), wait.parse().unwrap());
            assert!(run > 0.0 && wait >= 0.0, "{line}");
        }
    }
}

#[test]
fn bench_measures_positive_speeds() {
    let m = model();
    let out = run(&[
        "bench",
        s(&m),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--json",
    ]);
    let v = json_out(&out);
    for key in ["pp", "pp_sd", "tg", "tg_sd"] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key}: {v}"));
        assert!(x.is_finite() && x >= 0.0, "{key}: {v}");
    }
    assert!(
        v["pp"].as_f64().unwrap() > 0.0 && v["tg"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert_eq!(
        (u(&v, "p"), u(&v, "n"), u(&v, "r"), u(&v, "threads")),
        (8, 4, 2, 1)
    );
    assert!(
        ["scalar", "avx2", "avx512", "neon", "neon+dotprod"].contains(&v["isa"].as_str().unwrap()),
        "{v}"
    );
    assert!(
        v.get("read_bandwidth_gbs").is_none(),
        "only with --bandwidth: {v}"
    );

    // --bandwidth: the decoded weights (SmolLM2's matmul weights, the tied embedding table
    // included) streamed once; the limit is bandwidth / those bytes.
    let out = run(&[
        "bench",
        s(&m),
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
        "--bandwidth",
    ]);
    let v = json_out(&out);
    let bytes = u(&v, "weights_per_token_bytes");
    assert!((90 << 20..93 << 20).contains(&bytes), "{v}");
    let (bw, limit, frac) = (
        v["read_bandwidth_gbs"].as_f64().unwrap(),
        v["tg_limit"].as_f64().unwrap(),
        v["tg_fraction_of_limit"].as_f64().unwrap(),
    );
    assert!(bw > 0.0 && limit > 0.0 && frac > 0.0, "{v}");
    assert!(
        (limit - bw * 1e9 / bytes as f64).abs() < 1e-6 * limit,
        "{v}"
    );
    let out = run(&[
        "bench",
        s(&m),
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "--bandwidth",
    ]);
    assert!(out.stdout.contains("of weights per token"), "{out:?}");

    let out = run(&["bench", s(&m), "-p", "4", "-n", "2", "-r", "1", "-t", "1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("pp4") && out.stdout.contains("tg2"),
        "{out:?}"
    );
    assert!(out.stdout.contains(" ± "), "{out:?}");

    // -d: the tests run after 70 tokens of context, named as llama-bench names them; the
    // session's context holds the depth and the longer test (70 + 4 + 16).
    let depth = [
        "bench",
        s(&m),
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "-d",
        "70",
    ];
    let out = run(&depth);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("pp4 @ d70") && out.stdout.contains("tg2 @ d70"),
        "{out:?}"
    );
    let v = json_out(&run(&[&depth[..], &["--json"]].concat()));
    assert_eq!((u(&v, "d"), u(&v, "ctx")), (70, 90), "{v}");
    assert!(v["tg"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn plan_and_bench_bad_arguments_give_one_line_errors() {
    let m = model();
    let m = s(&m);
    #[rustfmt::skip]
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["plan"], vec!["<MODEL>", "plan --help"]),
        (vec!["plan", m, "--ctx", "0"], vec!["--ctx", "at least 1"]),
        (vec!["plan", m, "--ctx", "lots"], vec!["--ctx", "'lots'"]),
        (vec!["plan", m, "--ctx", "100000"], vec!["--ctx", "8192"]),
        (vec!["plan", m, "--ubatch", "-1"], vec!["--ubatch", "'-1'"]),
        (vec!["plan", m, "-t", "0"], vec!["--threads", "1 to 1024"]),
        (vec!["plan", m, "--mem-budget", "1 parsec"], vec!["--mem-budget", "plan --help"]),
        (vec!["plan", "/no/such/model.gguf"], vec!["/no/such/model.gguf", "no such file"]),
        (vec!["bench"], vec!["<MODEL>", "bench --help"]),
        (vec!["bench", m, "-r", "0"], vec!["--repetitions", "at least 1"]),
        (vec!["bench", m, "-p", "0"], vec!["--n-prompt", "at least 1"]),
        (vec!["bench", m, "-n", "-4"], vec!["--n-gen", "'-4'"]),
        (vec!["bench", m, "-p", "x"], vec!["--n-prompt", "'x'"]),
        (vec!["bench", m, "-t", "2000"], vec!["--threads", "1 to 1024"]),
        (vec!["bench", m, "-p", "9000"], vec!["9000", "8192"]),
        (vec!["bench", m, "-d", "-1"], vec!["--n-depth", "'-1'"]),
        (vec!["bench", m, "-d", "8000", "-p", "512"], vec!["-d 8000", "8512", "8192"]),
        (vec!["bench", m, "--bogus"], vec!["--bogus", "bench --help"]),
    ];
    let outs = par_map(&cases, |(args, _)| run(args));
    for ((args, needles), out) in cases.iter().zip(&outs) {
        eprintln!("edge-run {}", args.join(" "));
        assert_error(out, needles);
        let file_problem = args.contains(&"/no/such/model.gguf");
        assert_eq!(out.code, Some(if file_problem { 1 } else { 2 }), "{out:?}");
    }
}

/// The memory budget: an explicit context that does not fit is refused up front with the
/// numbers and the largest context that fits; without --ctx the largest one is used, and the
/// plan it reports stays inside the budget.
#[test]
fn memory_budget_refuses_or_fits() {
    let m = model();
    let m = s(&m);
    let out = run(&[
        m,
        "--mem-budget",
        "40MiB",
        "--ctx",
        "8192",
        "-p",
        "hi",
        "-t",
        "1",
    ]);
    assert_error(&out, &["kv cache 180.00 MiB", "budget 40.00 MiB"]);
    assert_eq!(out.code, Some(1));
    // The largest fitting ctx (about 1480: 40 MiB less the 7.4 MiB arena, over 22.5 KiB of KV
    // per position).
    let fit: u64 = out
        .stderr
        .split("use --ctx ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ctx in {out:?}"));
    assert!((1400..1550).contains(&fit), "{out:?}");

    let out = run(&["plan", m, "--mem-budget", "40MiB", "-t", "1", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let budget = 40u64 << 20;
    assert_eq!(v["budget_bytes"].as_u64(), Some(budget));
    assert!(v["owned_bytes"].as_u64().unwrap() <= budget);
    assert_eq!(v["ctx"], v["max_ctx"]);
    let ctx = v["ctx"].as_u64().unwrap();
    assert!(ctx > 1000 && ctx < 2048, "ctx {ctx}");

    let prompt = "The capital of France is";
    let out = run(&[
        m,
        "--mem-budget",
        "40MiB",
        "-p",
        prompt,
        "-n",
        "4",
        "--temp",
        "0",
        "-t",
        "1",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.starts_with(" Paris"), "{out:?}");

    for bad in [
        vec!["plan", m, "--count-weights"],
        vec!["plan", m, "--target", "nope"],
        vec!["plan", m, "--mem-budget", "12parsecs"],
        vec!["plan", m, "--mem-budget", "0"],
    ] {
        let out = run(&bad);
        assert_error(&out, &[]);
        assert_eq!(out.code, Some(2), "{bad:?}");
    }
}

/// `--device cuda` on a build without the `cuda` feature names the rebuild command, in every
/// command that takes `--device`.
#[cfg(not(feature = "cuda"))]
#[test]
fn device_cuda_without_the_feature_is_a_clear_error() {
    let m = model();
    let cases: [&[&str]; 3] = [
        &[s(&m), "-p", "hi", "-n", "1", "--device", "cuda"],
        &["plan", s(&m), "--device", "cuda"],
        &[
            "bench",
            s(&m),
            "-p",
            "8",
            "-n",
            "2",
            "-r",
            "1",
            "--device",
            "cuda:1",
        ],
    ];
    for args in cases {
        assert_error(
            &run(args),
            &[
                "built without CUDA support",
                "cargo build --release --features cuda",
            ],
        );
    }
}

/// A CUDA build on a machine without a driver: `--device cuda` is an error naming the fix, and
/// the default device falls back to the CPU.
#[cfg(feature = "cuda")]
#[test]
fn device_cuda_without_a_gpu_is_a_clear_error_and_the_default_falls_back() {
    if edge_engine::backend::cuda::device_count().is_ok_and(|n| n > 0) {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    let m = model();
    assert_error(
        &run(&[s(&m), "-p", "hi", "-n", "1", "--device", "cuda"]),
        &["cuda:0", "--device cpu"],
    );
    let out = run(&[
        s(&m),
        "-p",
        "The capital of France is",
        "-n",
        "2",
        "--temp",
        "0",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn device_values_are_checked() {
    let m = model();
    let out = run(&["plan", s(&m), "--device", "gpu"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("cpu, cuda or cuda:N"), "{out:?}");
    let out = run(&["plan", s(&m), "--device", "cpu", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["device"], "cpu");
    assert!(v["cuda"].is_null());
}

/// `plan --device cuda` is arithmetic: it works without a GPU and reports the device
/// allocations (only a CUDA build accepts the device).
#[cfg(feature = "cuda")]
#[test]
fn plan_reports_cuda_device_allocations_without_a_gpu() {
    let m = model();
    let out = run(&["plan", s(&m), "--device", "cuda", "--ctx", "1024", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["device"], "cuda:0");
    assert_eq!(v["cuda"]["kv_bytes"], v["kv_bytes"]);
    assert_eq!(v["cuda"]["arena_bytes"], v["arena_bytes"]);
    assert!(
        v["cuda"]["weights_upload_bytes"].as_u64().unwrap() >= v["weights_bytes"].as_u64().unwrap()
    );
    // A q8_0 cache on the GPU: 34 bytes per 32 values instead of 64.
    let f16_kv = v["cuda"]["kv_bytes"].as_u64().unwrap();
    let out = run(&[
        "plan",
        s(&m),
        "--device",
        "cuda",
        "--ctx",
        "1024",
        "--kv-type",
        "q8_0",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["cuda"]["kv_bytes"], v["kv_bytes"]);
    assert_eq!(v["cuda"]["kv_bytes"].as_u64().unwrap() * 64, f16_kv * 34);
}

// ---------------------------------------------------------------- embed (encoder models)

/// all-MiniLM-L6-v2 (scripts/fetch-embed-model.sh; or EDGE_RUN_EMBED_MODEL), or `None` with a
/// "skipped" line when it is missing.
fn minilm() -> Option<PathBuf> {
    let p = match std::env::var_os("EDGE_RUN_EMBED_MODEL") {
        Some(p) => PathBuf::from(p),
        None => repo().join("models/all-MiniLM-L6-v2.f16.gguf"),
    };
    if p.exists() {
        Some(p)
    } else {
        edge_tests::missing(p.display(), "run scripts/fetch-embed-model.sh");
        None
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

#[test]
fn embed_prints_one_vector_per_text() {
    let Some(m) = minilm() else { return };
    let refs = read_jsonl(&repo().join("tests/data/embed/embeddings.jsonl"));
    let (t0, t1) = (
        refs[0]["text"].as_str().unwrap(),
        refs[2]["text"].as_str().unwrap(),
    );
    // Plain: one line of 384 numbers per text, unit length (normalised by default).
    let out = run(&["embed", s(&m), t0, t1, "-t", "1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<Vec<f64>> = out
        .stdout
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(lines.len(), 2);
    for v in &lines {
        assert_eq!(v.len(), 384);
        assert!((norm(v) - 1.0).abs() < 1e-4, "{}", norm(v));
    }
    // JSON, raw vectors: the same direction and length as llama.cpp's.
    let out = run(&["embed", s(&m), t0, t1, "--no-normalize", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 2);
    for (rec, want) in arr.iter().zip([&refs[0], &refs[2]]) {
        assert_eq!(rec["text"], want["text"]);
        assert!(rec["n_tokens"].as_u64().unwrap() >= 3);
        let got: Vec<f64> = rec["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let want: Vec<f64> = want["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let cos =
            got.iter().zip(&want).map(|(a, b)| a * b).sum::<f64>() / (norm(&got) * norm(&want));
        assert!(cos >= 0.999, "cosine {cos}");
        assert!((norm(&got) / norm(&want) - 1.0).abs() < 5e-3);
    }
    // --no-normalize then --normalize: the last wins.
    let out = run(&[
        "embed",
        s(&m),
        t0,
        "--no-normalize",
        "--normalize",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let e: Vec<f64> = v[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!((norm(&e) - 1.0).abs() < 1e-5);
    // CLS pooling gives another vector than mean pooling.
    let cls = run(&["embed", s(&m), t0, "--pooling", "cls"]);
    assert_eq!(cls.code, Some(0), "{cls:?}");
    assert_ne!(cls.stdout.lines().next(), out.stdout.lines().next());
}

#[test]
fn embed_and_encoder_errors_are_one_line() {
    let Some(m) = minilm() else { return };
    let long = "word ".repeat(20);
    for (args, needles) in [
        (
            vec!["embed", s(&m), long.as_str(), "--max-tokens", "8"],
            &["text 1", "22 tokens", "8", "--max-tokens"][..],
        ),
        (
            vec!["embed", s(&m), "hi", "--max-tokens", "513"],
            &["--max-tokens 513", "512"],
        ),
        (
            vec!["embed", s(&m), "hi", "--pooling", "max"],
            &["mean, cls or last"],
        ),
        (
            vec!["embed", s(&m), "hi", "--device", "cuda"],
            &["encoder", "--device cpu"],
        ),
        (
            vec!["embed", s(&m), "hi", "--kv-type", "q8_0"],
            &["no kv cache"],
        ),
        (vec!["embed", s(&m)], &["TEXT"]),
        (
            vec![
                "embed",
                s(&m),
                "hi",
                "--mem-budget",
                "1MiB",
                "--max-tokens",
                "512",
            ],
            &["budget", "--ctx"],
        ),
        (vec![s(&m), "-p", "hi"], &["encoder", "edge-run embed"]),
        (vec!["bench", s(&m)], &["encoder", "edge-run embed"]),
        (
            vec!["plan", s(&m), "--ubatch", "8"],
            &["--ubatch", "encoder"],
        ),
        (vec!["plan", s(&m), "--ctx", "600"], &["--ctx 600", "512"]),
        (
            vec!["plan", s(&m), "--ctx", "512", "--mem-budget", "2MiB"],
            &["budget", "--ctx"],
        ),
    ] {
        assert_error(&run(&args), needles);
    }
    // A decoder model is no embedding model.
    assert_error(
        &run(&["embed", s(&model()), "hi"]),
        &["decoder", "encoder", "fetch-embed-model.sh"],
    );
}

#[test]
fn plan_reports_an_encoder_without_kv_cache() {
    let Some(m) = minilm() else { return };
    let out = run(&["plan", s(&m), "--json", "-t", "2"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["encoder"], true);
    assert_eq!(v["kv_bytes"], 0);
    assert_eq!(v["ctx"], 512);
    assert_eq!(v["pooling"], "mean");
    let arena = v["arena_bytes"].as_u64().unwrap();
    assert!(arena > 0 && arena >= v["arena_lower_bound_bytes"].as_u64().unwrap());
    assert_eq!(
        v["owned_bytes"].as_u64().unwrap(),
        arena + v["scratch_bytes"].as_u64().unwrap()
    );
    // A budget without --ctx: the longest text that fits, whose plan fits.
    let out = run(&["plan", s(&m), "--json", "-t", "2", "--mem-budget", "2MiB"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let ctx = v["ctx"].as_u64().unwrap();
    assert!(ctx > 16 && ctx < 512, "{ctx}");
    assert_eq!(v["max_ctx"], ctx);
    assert!(v["owned_bytes"].as_u64().unwrap() <= 2 << 20);
    // The text summary names the encoder and the missing KV cache.
    let out = run(&["plan", s(&m)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("encoder") && out.stdout.contains("none: an encoder"));
}
