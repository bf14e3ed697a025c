//! `edge-run serve`'s prompt cache and saved state: a repeated ~1,000-token system prompt is
//! reused from the slot that holds it (time to first token at most 0.2x the first request's,
//! the answer the CLI's, which processes everything afresh), and `--state-dir` keeps the cache
//! across a restart; a damaged state file is reported and its slot starts empty.

mod serve_util;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use serve_util::*;

/// A system prompt of about 1,000 tokens, as a robot's tool list would be.
fn long_system_prompt() -> String {
    let mut s = String::from("You are the dialogue node of a warehouse robot. Follow these rules.");
    for i in 0..60 {
        s.push_str(&format!(
            " Rule {i}: when shelf {i} is empty, report it to the planner and wait."
        ));
    }
    s
}

#[test]
fn a_repeated_system_prompt_is_reused_from_the_slot_cache() {
    let system = long_system_prompt();
    let srv = Server::start(&["-t", "1", "--ctx", "2048", "--slots", "2", "--metrics"]);
    let ask = |question: &str, max_tokens: usize| {
        let t = Instant::now();
        let r = srv.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                    "temperature": 0, "max_tokens": max_tokens}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        (t.elapsed(), r.json())
    };
    let (first, v) = ask("Which rule is about shelf 3?", 1);
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_prompt >= 1000, "{n_prompt}");
    // Another prompt goes to the empty slot and leaves the first slot's cache alone.
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": "1, 2, 3,", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
    let (second, v) = ask("Which rule is about shelf 7?", 1);
    let from_cache = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(from_cache + 20 >= n_prompt, "{v}");
    assert!(
        second.as_secs_f64() <= 0.2 * first.as_secs_f64(),
        "the second request took {second:?}, the first {first:?}"
    );
    let cached = metric(&srv, "edge_run_prompt_tokens_cached_total");
    assert!(cached >= (n_prompt - 20) as f64, "{cached} of {n_prompt}");
    // The answer from the cache is the CLI's, which processes everything afresh.
    let question = "Which rule is about shelf 7?";
    let (_, v) = ask(question, 24);
    let out = Command::new(BIN)
        .arg(model())
        .args([
            "--chat", "--system", &system, "-p", question, "--temp", "0", "-n", "24", "-t", "1",
            "-c", "2048",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        String::from_utf8(out.stdout).unwrap()
    );
}

/// Stops a server with SIGTERM and waits for it to exit 0.
fn terminate(mut srv: Server) -> String {
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(100));
    let log = srv.log();
    assert_eq!(status.code(), Some(0), "{log}");
    log
}

#[test]
fn state_dir_keeps_the_prompt_cache_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("edge-run-serve-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let system = long_system_prompt();
    let body = |q: &str, n: usize| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
               "temperature": 0, "max_tokens": n})
    };
    let args = ["-t", "1", "--ctx", "2048", "--metrics", "--state-dir", d];
    let srv = Server::start(&args);
    let r = srv.post(
        "/v1/chat/completions",
        &body("Which rule is about shelf 3?", 1),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let n_prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let log = terminate(srv);
    assert!(log.contains("slot 0: saved"), "{log}");
    let file = dir.join("slot-0.state");
    assert!(file.exists());

    // Restarted: the first request finds the system prompt in the restored slot.
    let srv = Server::start(&args);
    assert!(srv.log().contains("slot 0: restored"), "{}", srv.log());
    let question = "Which rule is about shelf 7?";
    let r = srv.post("/v1/chat/completions", &body(question, 24));
    assert_eq!(r.status, 200, "{r:?}");
    let cached = metric(&srv, "edge_run_prompt_tokens_cached_total");
    assert!(cached >= (n_prompt - 20) as f64, "{cached} of {n_prompt}");
    let out = Command::new(BIN)
        .arg(model())
        .args([
            "--chat", "--system", &system, "-p", question, "--temp", "0", "-n", "24", "-t", "1",
            "-c", "2048",
        ])
        .output()
        .unwrap();
    assert_eq!(
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap(),
        String::from_utf8(out.stdout).unwrap()
    );
    terminate(srv);

    // A damaged file is reported, and the slot serves from an empty cache.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let srv = Server::start(&args);
    let log = srv.log();
    assert!(
        log.contains("warning: slot 0:") && log.contains("slot-0.state"),
        "{log}"
    );
    let r = srv.post("/v1/chat/completions", &body(question, 4));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(metric(&srv, "edge_run_prompt_tokens_cached_total"), 0.0);
    // Another --ctx cannot use the file either: a clear warning, not a failure.
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
