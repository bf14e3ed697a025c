//! `edge-run perplexity` end to end: its output against llama.cpp's (the running values of
//! tests/reference/perplexity/llama-ppl-q4_1-b1.txt), its errors (too short a text, a bad base
//! file, a flag missing), and Ctrl-C (exit 130, no partial base file left).
//!
//! Needs the real model (`scripts/fetch-model.sh`, or `EDGE_RUN_MODEL`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    edge_tests::smollm2_path()
}

fn text() -> PathBuf {
    repo().join("tests/reference/perplexity/gpl-3-excerpt.txt")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("edge-run-ppl-cli-{}-{name}", std::process::id()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Out {
    let out = Command::new(BIN)
        .arg("perplexity")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("starting edge-run");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One `error: ` line on stderr with every needle, nothing on stdout, exit `code`.
#[track_caller]
fn assert_error(out: &Out, code: i32, needles: &[&str]) {
    assert_eq!(out.code, Some(code), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{out:?}");
    assert!(lines[0].starts_with("error: "), "{out:?}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {out:?}");
    }
}

#[test]
fn output_is_llama_cpps() {
    let want =
        std::fs::read_to_string(repo().join("tests/reference/perplexity/llama-ppl-q4_1-b1.txt"))
            .unwrap();
    let running = want.lines().find(|l| l.starts_with("[1]")).unwrap();
    let m = model();
    let out = run(&[
        s(&m),
        "-f",
        s(&text()),
        "-b",
        "1",
        "-t",
        "1",
        "--chunks",
        "2",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    // The first two chunks' running values, as llama.cpp printed them.
    let two: String = running.split_inclusive(',').take(2).collect();
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some(two.as_str()), "{out:?}");
    assert_eq!(lines.next(), Some(""));
    let fin = lines.next().unwrap();
    assert!(
        fin.starts_with("Final estimate: PPL = 17.7562 +/- "),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("chunk 2/2"),
        "progress on stderr: {out:?}"
    );
}

#[test]
fn too_short_a_text_names_the_tokens_needed() {
    let m = model();
    let f = temp("short.txt");
    std::fs::write(&f, "Just a few words.").unwrap();
    let out = run(&[s(&m), "-f", s(&f)]);
    let _ = std::fs::remove_file(&f);
    assert_error(&out, 2, &["tokens", "needs at least 1024", "-c 512"]);
    let out = run(&[s(&m), "-f", s(&text()), "-c", "2048"]);
    assert_error(&out, 2, &["2765 tokens", "at least 4096"]);
}

#[test]
fn bad_command_lines_and_base_files_are_refused() {
    let m = model();
    let out = run(&[s(&m)]);
    assert_error(&out, 2, &["-f FILE"]);
    let out = run(&[s(&m), "--kl-divergence"]);
    assert_error(&out, 2, &["--kl-divergence-base"]);
    let out = run(&[s(&m), "-f", s(&text()), "-c", "2"]);
    assert_error(&out, 2, &["-c 2"]);
    let f = temp("not-logits.kld");
    std::fs::write(&f, b"some text that is not a base-logits file at all").unwrap();
    let out = run(&[s(&m), "--kl-divergence-base", s(&f), "--kl-divergence"]);
    assert_error(&out, 2, &["_logits_"]);
    // A valid header whose file is short of what it announces.
    let mut bytes = b"_logits_".to_vec();
    for v in [512i32, 49152, 5] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&[0; 4096]);
    std::fs::write(&f, &bytes).unwrap();
    let out = run(&[s(&m), "--kl-divergence-base", s(&f), "--kl-divergence"]);
    assert_error(&out, 2, &["implies", "truncated"]);
    // Another vocabulary.
    let mut bytes = b"_logits_".to_vec();
    for v in [8i32, 4, 1] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&[0; 32]);
    bytes.extend_from_slice(&[0; 2 * 3 * 8]);
    std::fs::write(&f, &bytes).unwrap();
    let out = run(&[s(&m), "--kl-divergence-base", s(&f), "--kl-divergence"]);
    assert_error(&out, 2, &["vocabulary of 4 tokens", "49152"]);
    let _ = std::fs::remove_file(&f);
    let out = run(&[
        s(&m),
        "--kl-divergence-base",
        "/nonexistent/base.kld",
        "--kl-divergence",
    ]);
    assert_error(&out, 1, &["/nonexistent/base.kld"]);
}

/// Ctrl-C stops the run between tokens with exit status 130, and a base file being written is
/// removed (its header would announce chunks it lacks).
#[cfg(unix)]
#[test]
fn ctrl_c_exits_130_and_leaves_no_partial_base_file() {
    use std::io::Read;
    let m = model();
    let base = temp("partial.kld");
    let mut child = Command::new(BIN)
        .args(["perplexity", s(&m), "-f", s(&text()), "-b", "1", "-t", "1"])
        .args(["--kl-divergence-base", s(&base)])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting edge-run");
    // The first chunk's value: the handler is installed before the first chunk runs.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 3];
    stdout.read_exact(&mut first).expect("some output");
    assert_eq!(&first, b"[1]");
    assert!(base.exists());
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
    assert!(stderr.contains("interrupted (Ctrl-C)"), "{stderr}");
    assert!(!String::from_utf8_lossy(&rest).contains("Final estimate"));
    assert!(!base.exists(), "the partial base file is removed");
}
