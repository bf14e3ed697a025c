//! The CLI under faults and hostile input: a model file truncated or renamed over during a
//! generation, Ctrl-C during a long prompt, endless input files, absurd counts, and model files
//! whose hyper-parameters, weights or chat template are built to abort or exhaust the process.
//! Each must end in one clear line and its exit status (never a crash), the unbounded ones
//! under an address-space limit. Needs the real model (`scripts/fetch-model.sh`) and `../shared/`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use edge_engine::gguf::MetaValue;
use edge_tests::tiny::{Parts, TempDir, DIMS};

const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

/// The address space a child gets where a test must show that input cannot exhaust memory:
/// 1 GiB (the tiny and the real model need well under 300 MB of it).
const ADDRESS_SPACE_KB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn spawn(args: &[&str], stdin: Stdio) -> Child {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting edge-run")
}

/// Runs edge-run under [`ADDRESS_SPACE_KB`] of address space.
fn run_limited(args: &[&str], stdin: Stdio) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KB} && exec \"$0\" \"$@\""
        ))
        .arg(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(stdin)
        .output()
        .expect("running edge-run under ulimit")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One error line on stderr containing every needle, with exit status `code`.
fn assert_one_line_error(out: &Output, code: i32, needles: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "`{n}` missing from: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A copy of the real model in a temp dir (the tests change the copy).
fn model_copy(dir: &TempDir) -> PathBuf {
    let dst = dir.0.join("model.gguf");
    std::fs::copy(edge_tests::smollm2_path(), &dst).unwrap();
    dst
}

// ---------------------------------------------------------------- the model file changes

const CHANGED: &str =
    "was truncated or rewritten while in use: replace model files by writing a new file and renaming it over the old one";

/// Truncating the model file while it generates ends with the one line naming the file and
/// exit status 3 (before: SIGBUS, status 135, no message); what was printed stays printed.
#[cfg(unix)]
#[test]
fn truncating_the_model_during_generation_is_a_clear_error() {
    let dir = TempDir::new("cli-truncate");
    let path = model_copy(&dir);
    let mut child = spawn(
        &[
            s(&path),
            "-p",
            "Once upon a time",
            "-n",
            "100000",
            "--ctx",
            "256",
            "--ctx-shift",
            "--temp",
            "0",
            "-t",
            "1",
        ],
        Stdio::null(),
    );
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).expect("generated text");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let out = Output {
        stdout: [&first[..], &rest].concat(),
        ..out
    };
    assert_one_line_error(&out, 3, &[s(&path), CHANGED]);
    assert!(out.stdout.len() >= 16, "the text printed before is kept");
}

/// Writing a new file and renaming it over the model's path while it generates does not
/// disturb the run: the output is still llama.cpp's greedy continuation.
#[cfg(unix)]
#[test]
fn renaming_a_new_file_over_the_model_does_not_disturb_the_run() {
    let dir = TempDir::new("cli-rename");
    let path = model_copy(&dir);
    let case =
        &edge_tests::read_jsonl(&edge_tests::shared_dir().join("reference/smollm2/greedy.jsonl"))
            [0];
    let prompt = case["prompt"].as_str().unwrap();
    // The replacement: another file entirely (a tiny model), written before, renamed during.
    let new = dir.write("model.gguf.new", &Parts::llama(DIMS).bytes());
    let mut child = spawn(
        &[s(&path), "-p", prompt, "-n", "32", "--temp", "0", "-t", "1"],
        Stdio::null(),
    );
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("generated text");
    std::fs::rename(&new, &path).unwrap();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let generated = text(&[&first[..], &rest].concat());
    assert_eq!(generated, case["text"].as_str().unwrap());
    assert!(
        text(&out.stderr).contains("generated: 32 tokens"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------- Ctrl-C during a prompt

/// Ctrl-C during a long prompt stops it between ubatch chunks: the summary says how far it
/// got and the status is 130, seconds before the prompt would have finished.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_long_prompt_between_chunks() {
    let m = edge_tests::smollm2_path();
    let prompt = "the robot walks to the door and opens it. ".repeat(300);
    let mut child = spawn(
        &[
            s(&m),
            "-p",
            &prompt,
            "-n",
            "8",
            "--ctx",
            "4096",
            "--ubatch",
            "256",
            "-t",
            "1",
            "-v",
        ],
        Stdio::null(),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if line.contains("loaded ") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the model loads");
    // Into the prompt's first chunks (one 256-token chunk takes about a second on 1 thread).
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let waited = sent.elapsed();
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("[edge-run] prompt: interrupted after "))
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    let numbers: Vec<usize> = summary.split(' ').filter_map(|w| w.parse().ok()).collect();
    let (done, total) = (numbers[0], numbers[1]);
    assert!(done % 256 == 0 && done < total, "{summary}");
    assert!(total > 2000, "{summary}");
    assert!(
        summary.ends_with("stopped: interrupted (Ctrl-C)"),
        "{summary}"
    );
    // At most one chunk after the signal (measured: about 1 s per chunk on 1 thread).
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

// ---------------------------------------------------------------- endless input and counts

/// `-f /dev/zero` and `tokenize --stdin < /dev/zero` stop at 16 MiB with an error, under a
/// 1 GiB address space (before: read until memory ran out).
#[cfg(unix)]
#[test]
fn endless_input_is_capped() {
    let m = edge_tests::smollm2_path();
    let out = run_limited(&[s(&m), "-f", "/dev/zero", "-n", "1"], Stdio::null());
    assert_one_line_error(&out, 1, &["/dev/zero", "larger than 16 MiB"]);
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let out = run_limited(&["tokenize", s(&m), "--stdin"], Stdio::from(zero));
    assert_one_line_error(&out, 1, &["standard input", "larger than 16 MiB"]);
}

/// `bench -r 4294967295` is refused (before: all repetitions were allocated up front).
#[test]
fn absurd_repetition_counts_are_refused() {
    let m = edge_tests::smollm2_path();
    let out = Command::new(BIN)
        .args(["bench", s(&m), "-r", "4294967295"])
        .output()
        .unwrap();
    assert_one_line_error(&out, 2, &["-r", "at most 1000"]);
}

// ---------------------------------------------------------------- hostile model files

fn tiny_with(dir: &TempDir, name: &str, f: impl FnOnce(&mut Parts)) -> PathBuf {
    let mut p = Parts::llama(DIMS);
    f(&mut p);
    dir.write(name, &p.bytes())
}

/// Hyper-parameters the file cannot back or that cannot be computed with, weights that make
/// the logits NaN, and a chat template that doubles a string: each is one line and status 1,
/// under a 1 GiB address space.
#[cfg(unix)]
#[test]
fn hostile_model_files_are_clear_errors_within_bounds() {
    let dir = TempDir::new("cli-hostile");
    let layers = tiny_with(&dir, "layers.gguf", |p| {
        p.set("llama.block_count", MetaValue::U64(1 << 31));
    });
    let eps = tiny_with(&dir, "eps.gguf", |p| {
        p.set(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::NAN),
        );
    });
    let base = tiny_with(&dir, "base.gguf", |p| {
        p.set("llama.rope.freq_base", MetaValue::F32(-10000.0));
    });
    let nan = tiny_with(&dir, "nan.gguf", |p| {
        p.tensor("output_norm.weight").data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let template = tiny_with(&dir, "template.gguf", |p| {
        p.set(
            "tokenizer.chat_template",
            MetaValue::String(
                "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
                    .into(),
            ),
        );
    });
    let cases: [(&Path, &[&str], &[&str]); 6] = [
        (
            &layers,
            &[],
            &["llama.block_count", "2147483648 layers", "damaged"],
        ),
        (
            &eps,
            &[],
            &[
                "llama.attention.layer_norm_rms_epsilon",
                "NaN",
                "finite positive",
            ],
        ),
        (
            &base,
            &[],
            &["llama.rope.freq_base", "-10000", "finite positive"],
        ),
        (&nan, &[], &["logits at position", "not finite"]),
        (
            &nan,
            &["--temp", "0.7"],
            &["logits at position", "not finite"],
        ),
        (
            &template,
            &["--chat"],
            &["--chat", "chat template stopped", "fuel"],
        ),
    ];
    for (model, extra, needles) in cases {
        let mut args = vec![s(model), "-p", "hi", "-n", "4"];
        args.extend_from_slice(extra);
        let out = run_limited(&args, Stdio::null());
        eprintln!("edge-run {}", args.join(" "));
        assert_one_line_error(&out, 1, needles);
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
}
