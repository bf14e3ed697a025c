//! `edge-run chat` and `--prompt-cache` on the real model, through the binary. The chat's
//! answers at --temp 0 must be llama.cpp's greedy text for the conversation (recorded), its first
//! answer the one-shot `--chat` output, its second the one-shot output of
//! the whole conversation written out as ChatML (independently of the template engine) in a
//! fresh process; a conversation saved with /save and loaded with /load in another process
//! must go on exactly as the uninterrupted one; and a state from another model is refused with
//! a clear line. `--prompt-cache` must not change the output (llama.cpp's greedy reference
//! text) while the second run reuses the prompt.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::tiny::{Parts, TempDir, DIMS};

const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

fn model() -> PathBuf {
    edge_tests::smollm2_path()
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

fn run_with(args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("starting edge-run");
    if let Some(text) = stdin {
        // A process that exits before reading (a refused command line) closes the pipe.
        let _ = child.stdin.take().unwrap().write_all(text.as_bytes());
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Common flags: greedy, one thread (and `-c 512` unless a test gives another).
const FLAGS: [&str; 6] = ["--temp", "0", "-n", "20", "-t", "1"];

fn chat(input: &str, extra: &[&str]) -> Out {
    let m = model();
    let mut args = vec!["chat", s(&m)];
    args.extend(FLAGS);
    if !extra.contains(&"-c") {
        args.extend(["-c", "512"]);
    }
    args.extend(extra);
    run_with(&args, Some(input))
}

fn one_shot(extra: &[&str]) -> String {
    let m = model();
    let mut args = vec![s(&m)];
    args.extend(FLAGS);
    args.extend(["-c", "512"]);
    args.extend(extra);
    let out = run_with(&args, None);
    assert_eq!(out.code, Some(0), "{out:?}");
    out.stdout
}

/// SmolLM2's template, written out: its default system message, the turns, the assistant
/// header.
fn chatml(turns: &[(&str, &str)]) -> String {
    let mut s = String::from(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    );
    for (role, text) in turns {
        s.push_str(&format!("<|im_start|>{role}\n{text}<|im_end|>\n"));
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

const Q1: &str = "What is the capital of France?";
const Q2: &str = "And of Italy?";

#[test]
fn chat_answers_equal_one_shot_runs_of_the_conversation() {
    let out = chat(&format!("{Q1}\n{Q2}\n"), &["-v"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let a1 = one_shot(&["--chat", "-p", Q1]);
    assert!(!a1.trim().is_empty());
    assert!(
        out.stdout.starts_with(&format!("{a1}\n")),
        "the first answer is not the one-shot --chat output {a1:?}: {out:?}"
    );
    let a2 = one_shot(&[
        "-p",
        &chatml(&[("user", Q1), ("assistant", &a1), ("user", Q2)]),
    ]);
    assert_eq!(
        out.stdout,
        format!("{a1}\n{a2}\n"),
        "the second answer is not a fresh run of the conversation"
    );
    // The second turn reused the first's KV cache (the -v log line of each turn).
    let reused: Vec<usize> = out
        .stderr
        .lines()
        .filter_map(|l| l.split(" tokens, ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(reused.len(), 2, "{out:?}");
    assert_eq!(reused[0], 0);
    assert!(
        reused[1] > 30,
        "turn 2 reused only {} tokens: {out:?}",
        reused[1]
    );
}

/// llama.cpp's greedy text (argmax of the raw logits) for the first turn and for the whole
/// two-turn conversation, recorded with `shared/peer/llama-ref.py --model
/// SmolLM2-135M-Instruct.Q4_1.gguf greedy --n 20` on [`chatml`]`(&[("user", Q1)])` and on
/// `chatml(&[("user", Q1), ("assistant", LLAMA_1), ("user", Q2)])`: fresh llama.cpp contexts, so
/// the chat's reuse of its KV cache must not change a token.
const LLAMA_1: &str = "L'Étoile, la Cité, la Nation, la Géologie, la Culture";
const LLAMA_2: &str = "L'Ion, la Roma, la Culture, la Géologie, la Culture Natienne";

#[test]
fn chat_answers_are_llamas_greedy_text() {
    let out = chat(&format!("{Q1}\n{Q2}\n"), &[]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, format!("{LLAMA_1}\n{LLAMA_2}\n"), "{out:?}");
}

#[test]
fn save_and_load_go_on_as_the_uninterrupted_chat() {
    let dir = TempDir::new("chat-state");
    let file = dir.0.join("chat.state");
    let f = s(&file);
    let whole = chat(&format!("{Q1}\n/save {f}\n{Q2}\n"), &[]);
    assert_eq!(whole.code, Some(0), "{whole:?}");
    assert!(whole.stderr.contains("[saved 2 messages"), "{whole:?}");
    let resumed = chat(&format!("/load {f}\n{Q2}\n/exit\nignored\n"), &[]);
    assert_eq!(resumed.code, Some(0), "{resumed:?}");
    assert!(resumed.stderr.contains("[loaded 2 messages"), "{resumed:?}");
    assert!(
        resumed.stdout.len() > 10 && whole.stdout.ends_with(&resumed.stdout),
        "the loaded chat went another way: {resumed:?}\nthe whole chat: {whole:?}"
    );
    assert!(!whole.stdout.starts_with(&resumed.stdout), "{whole:?}");
    // Another context: refused with the reason; the chat goes on from scratch.
    let other = chat(&format!("/load {f}\n{Q1}\n"), &["-c", "256"]);
    assert_eq!(other.code, Some(0), "{other:?}");
    assert!(
        other.stderr.contains("error: /load:") && other.stderr.contains("context 512"),
        "{other:?}"
    );
    assert!(whole.stdout.starts_with(&other.stdout), "{other:?}");
}

#[test]
fn chat_commands_and_errors() {
    let dir = TempDir::new("chat-errors");
    // A state of another model (a tiny synthetic Llama).
    let tiny_path = dir.write("tiny.gguf", &Parts::llama(DIMS).bytes());
    let tiny = Arc::new(Model::load(&tiny_path).unwrap());
    let mut t = Session::new(
        tiny,
        &SessionConfig {
            ctx: Some(32),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    t.prefill(&[1, 2, 3]).unwrap();
    let foreign = dir.0.join("tiny.state");
    t.save_state(&foreign).unwrap();
    let input = format!(
        "/help\n/bogus\n/load {}\n/load\n/save {}\n/reset\n",
        s(&foreign),
        s(&dir.0.join("no-such-dir/x.state"))
    );
    let out = chat(&input, &[]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    for needle in [
        "/save FILE",
        "error: unknown command /bogus",
        "another model file",
        "error: /load needs a file",
        "error: /save:",
        "[conversation reset]",
    ] {
        assert!(out.stderr.contains(needle), "{needle:?}: {out:?}");
    }
    // A model without a chat template.
    let out = run_with(&["chat", s(&tiny_path)], Some("hi\n"));
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("no tokenizer.chat_template"), "{out:?}");
}

#[test]
fn prompt_cache_keeps_llamas_output_and_reuses_the_prompt() {
    let reference =
        edge_tests::read_jsonl(&edge_tests::shared_dir().join("reference/smollm2/greedy.jsonl"));
    let (prompt, want) = (
        reference[0]["prompt"].as_str().unwrap(),
        reference[0]["text"].as_str().unwrap(),
    );
    let dir = TempDir::new("prompt-cache");
    let cache = dir.0.join("p.cache");
    let c = s(&cache);
    let m = model();
    let run = |extra: &[&str]| {
        let mut args = vec![s(&m), "-p", prompt, "--temp", "0", "-n", "16", "-t", "1"];
        args.extend(extra);
        run_with(&args, None)
    };
    let first = run(&["--prompt-cache", c]);
    assert_eq!(first.code, Some(0), "{first:?}");
    assert!(
        want.starts_with(&first.stdout) && first.stdout.len() > 20,
        "{first:?}"
    );
    assert!(
        first.stderr.contains("0 from the prompt cache"),
        "{first:?}"
    );
    let saved = std::fs::read(&cache).expect("the cache was written");
    let second = run(&["--prompt-cache", c, "--prompt-cache-ro"]);
    assert_eq!(second.stdout, first.stdout, "{second:?}");
    let n: usize = second
        .stderr
        .split(" from the prompt cache")
        .next()
        .and_then(|h| h.rsplit(", ").next())
        .and_then(|n| n.parse().ok())
        .expect("the count in the summary");
    assert!(n >= 3, "{second:?}");
    assert_eq!(std::fs::read(&cache).unwrap(), saved, "-ro wrote the file");
    // Another context: the cache does not fit; a warning, the same text, the file replaced.
    let other = run(&["--prompt-cache", c, "-c", "128"]);
    assert_eq!(other.stdout, first.stdout, "{other:?}");
    assert!(
        other.stderr.contains("prompt cache:") && other.stderr.contains("not used"),
        "{other:?}"
    );
    assert_ne!(std::fs::read(&cache).unwrap(), saved);
    // A damaged file: a warning, the same text.
    let mut bad = saved.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&cache, &bad).unwrap();
    let damaged = run(&["--prompt-cache", c]);
    assert_eq!(damaged.stdout, first.stdout, "{damaged:?}");
    assert!(damaged.stderr.contains("damaged"), "{damaged:?}");
    // A state of another model (a tiny synthetic Llama): a warning naming it, the same text.
    let tiny_path = dir.write("tiny.gguf", &Parts::llama(DIMS).bytes());
    let mut t = Session::new(
        Arc::new(Model::load(&tiny_path).unwrap()),
        &SessionConfig {
            ctx: Some(32),
            threads: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    t.prefill(&[1, 2, 3]).unwrap();
    t.save_state(&cache).unwrap();
    let foreign = run(&["--prompt-cache", c, "--prompt-cache-ro"]);
    assert_eq!(foreign.stdout, first.stdout, "{foreign:?}");
    assert!(foreign.stderr.contains("another model file"), "{foreign:?}");
    // -ro alone is a bad command line.
    let out = run(&["--prompt-cache-ro"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("--prompt-cache FILE"), "{out:?}");
}

#[test]
fn ctrl_c_stops_the_answer_and_the_chat_goes_on() {
    use std::io::Read;
    let m = model();
    let mut child = Command::new(BIN)
        .args([
            "chat",
            s(&m),
            "--temp",
            "0",
            "-n",
            "400",
            "-t",
            "1",
            "-c",
            "1024",
        ])
        .args(["--system", "You write very long stories.", "-v"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin
        .write_all(b"Tell me a long story about a robot.\n")
        .unwrap();
    // Wait for the answer to start streaming, then Ctrl-C.
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: sends SIGINT to the child we spawned (its pid is live until we wait on it).
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stdin.write_all(b"/reset\nHi\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("[stopped]"), "{stderr}");
    assert!(stderr.contains("[conversation reset]"), "{stderr}");
    // The stopped answer was cut short of its 400 tokens, and "Hi" got an answer after it
    // (the -v line of each turn).
    let answers: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.split("; answer: ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(answers.len(), 2, "{stderr}");
    assert!(
        answers[0] < 200,
        "the answer was not stopped: {answers:?} {rest:?}"
    );
    assert!(answers[1] > 0, "{stderr}");
}
