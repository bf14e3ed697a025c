//! `edge-run serve` end to end: the binary started on a free port with the real model, spoken
//! to over plain HTTP/1.1 (a small client here, so that every status line, header and byte of
//! the server's answer is seen as a client sees it). Greedy chat output is compared with the
//! CLI's `--chat --temp 0` text (itself tested against llama.cpp); error cases check status,
//! OpenAI's error shape and the field named; a disconnecting client must free its slot; the
//! memory plan refuses what does not fit; a second server on a taken port fails; SIGTERM stops
//! it cleanly. `serve_openai.rs` runs OpenAI's own Python client against it, and embeddings.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod serve_util;

use serve_util::*;

#[test]
fn greedy_chat_equals_the_cli_streamed_or_not() {
    let expected = cli_chat(QUESTION, 48);
    assert!(!expected.trim().is_empty());
    let srv = Server::start(&["-t", "1", "--ctx", "512"]);
    let req = json!({
        "model": "anything",
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 48,
    });
    let r = srv.post("/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        expected
    );
    let finish = v["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(finish == "stop" || finish == "length", "{v}");
    let u = &v["usage"];
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!(completion > 0 && completion <= 48, "{v}");
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10, "{v}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + completion
    );
    assert_eq!(finish == "length", completion == 48, "{v}");

    // The same, streamed: chunks in OpenAI's format, ending with [DONE].
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let r = srv.post("/v1/chat/completions", &sreq);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{r:?}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finishes = Vec::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["id"], chunks[0]["id"]);
        if let Some(choice) = c["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(f) = choice["finish_reason"].as_str() {
                finishes.push(f.to_string());
            }
        }
    }
    assert_eq!(text, expected);
    assert_eq!(finishes, [finish]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64(),
        Some(completion)
    );
}

#[test]
fn completions_stop_strings_and_lengths() {
    let srv = Server::start(&["-t", "1", "--ctx", "256"]);
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.starts_with(" 6, 7"), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // A stop string ends the text before it, streamed or not.
    for stream in [false, true] {
        let r = srv.post(
            "/v1/completions",
            &json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 40, "temperature": 0, "stop": [" 9"], "stream": stream}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        let (text, finish) = if stream {
            let events = r.events();
            assert_eq!(events.last().unwrap(), "[DONE]");
            let mut t = String::new();
            let mut f = String::new();
            for e in &events[..events.len() - 1] {
                let c: Value = serde_json::from_str(e).unwrap();
                assert_eq!(c["object"], "text_completion");
                t.push_str(c["choices"][0]["text"].as_str().unwrap());
                if let Some(x) = c["choices"][0]["finish_reason"].as_str() {
                    f = x.to_string();
                }
            }
            (t, f)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(text, " 6, 7, 8,", "stream {stream}");
        assert_eq!(finish, "stop");
    }
    // Models and health.
    let m = srv.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(m["data"][0]["object"], "model");
    let h = srv.get("/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field() {
    let srv = Server::start(&["-t", "1", "--ctx", "64"]);
    let chat = "/v1/chat/completions";
    let e = api_error(&http(srv.addr, "POST", chat, &[], b"{\"messages\": ["), 400);
    assert!(
        e["message"].as_str().unwrap().contains("not valid JSON"),
        "{e}"
    );
    api_error(&http(srv.addr, "POST", chat, &[], b""), 400);
    api_error(&http(srv.addr, "POST", chat, &[], b"[1, 2]"), 400);
    for (body, param) in [
        (json!({"messages": "hi"}), "messages"),
        (json!({}), "messages"),
        (json!({"messages": [{"content": "hi"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}),
            "top_p",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}),
            "max_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "stop": [1]}),
            "stop",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
            "stream",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}),
            "n",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= ("}),
            "grammar",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= \"a\"", "json_schema": {}}),
            "json_schema",
        ),
    ] {
        let e = api_error(&srv.post(chat, &body), 400);
        assert_eq!(e["param"], param, "{body} -> {e}");
        assert!(e["message"].as_str().unwrap().contains(param), "{e}");
    }
    let e = api_error(&srv.post("/v1/completions", &json!({"prompt": 3})), 400);
    assert_eq!(e["param"], "prompt");
    // A prompt longer than a slot's context (64 tokens).
    let long = "word ".repeat(200);
    let e = api_error(&srv.post("/v1/completions", &json!({"prompt": long})), 400);
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    assert!(e["message"].as_str().unwrap().contains("64"), "{e}");
    // Embeddings from a decoder model.
    let e = api_error(&srv.post("/v1/embeddings", &json!({"input": "hi"})), 400);
    assert!(
        e["message"].as_str().unwrap().contains("embedding model"),
        "{e}"
    );
    // Unknown routes and methods; metrics are off without --metrics.
    api_error(&srv.get("/v1/nothing"), 404);
    api_error(&srv.get(chat), 405);
    api_error(&srv.get("/metrics"), 404);
    // A body over the limit (8 MiB) is refused with 413, with an answer.
    let big = vec![b' '; 9 << 20];
    api_error(&http(srv.addr, "POST", chat, &[], &big), 413);
    // The server still answers after all that.
    let r = srv.post(
        chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn api_key_is_required_when_set() {
    let srv = Server::start(&["-t", "1", "--ctx", "64", "--api-key", "sesame", "--metrics"]);
    let body = json!({"prompt": "Hi", "max_tokens": 1}).to_string();
    let r = http(srv.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(api_error(&r, 401)["code"], "missing_api_key");
    let r = http(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer nope")],
        body.as_bytes(),
    );
    assert_eq!(api_error(&r, 401)["code"], "invalid_api_key");
    let r = http(
        srv.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sesam")],
        b"",
    );
    api_error(&r, 401);
    let r = http(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sesame")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{r:?}");
    // /health needs no key.
    assert_eq!(srv.get("/health").status, 200);
    let r = http(
        srv.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer sesame")],
        b"",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body
            .contains("edge_run_requests_total{endpoint=\"completions\",status=\"401\"} 2"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("edge_run_requests_total{endpoint=\"completions\",status=\"200\"} 1"),
        "{}",
        r.body
    );
}

/// Opens a streaming request and reads until `n` events arrived; returns the open socket.
fn open_stream(addr: SocketAddr, body: &Value, n: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let b = body.to_string();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < n {
        let k = s.read(&mut buf).unwrap();
        assert!(
            k > 0,
            "stream closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..k]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    s
}

#[test]
fn busy_slots_give_503_and_a_client_that_leaves_frees_its_slot() {
    let srv = Server::start(&[
        "-t",
        "1",
        "--ctx",
        "2048",
        "--slots",
        "1",
        "--queue",
        "0",
        "--metrics",
    ]);
    let long = json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1900, "temperature": 0, "stream": true, "ignore_eos": true});
    let stream = open_stream(srv.addr, &long, 3);
    assert_eq!(metric(&srv, "edge_run_slots_busy"), 1.0);
    // The one slot is busy and no request may wait: 503 with Retry-After, at once.
    let t = Instant::now();
    let r = srv.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    let e = api_error(&r, 503);
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(e["message"].as_str().unwrap().contains("busy"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // The client goes away mid-stream: its generation stops and the slot is free again long
    // before 1900 tokens could have been generated.
    drop(stream);
    let t = Instant::now();
    while metric(&srv, "edge_run_slots_busy") != 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the slot stayed busy: {}",
            srv.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let generated = metric(&srv, "edge_run_generated_tokens_total");
    assert!(generated < 1900.0, "{generated}");
    assert_eq!(metric(&srv, "edge_run_client_disconnects_total"), 1.0);
    let r = srv.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(r.status, 200, "{r:?}");
    // A queue of one lets one request wait while the slot works.
    drop(srv);
    let srv = Server::start(&[
        "-t",
        "1",
        "--ctx",
        "256",
        "--slots",
        "1",
        "--queue",
        "1",
        "--metrics",
    ]);
    let stream = open_stream(
        srv.addr,
        &json!({"prompt": "1, 2,", "max_tokens": 200, "stream": true, "ignore_eos": true, "temperature": 0}),
        2,
    );
    let addr = srv.addr;
    let waiter = std::thread::spawn(move || {
        http(
            addr,
            "POST",
            "/v1/completions",
            &[],
            json!({"prompt": "Hi", "max_tokens": 2})
                .to_string()
                .as_bytes(),
        )
    });
    let t = Instant::now();
    while metric(&srv, "edge_run_requests_queued") != 1.0 {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    api_error(
        &srv.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1})),
        503,
    );
    drop(stream);
    assert_eq!(waiter.join().unwrap().status, 200);
    let m = srv.get("/metrics").body;
    for name in [
        "edge_run_time_to_first_token_seconds_bucket",
        "edge_run_token_latency_seconds_count",
        "edge_run_memory_planned_bytes{part=\"kv_per_slot\"}",
        "edge_run_slot_context_tokens 256",
    ] {
        assert!(m.contains(name), "{name} missing from {m}");
    }
}

fn run_serve(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("serve")
        .arg(model())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn slots_that_do_not_fit_the_budget_are_refused_with_what_fits() {
    // SmolLM2's f16 KV cache is 22.5 MiB per 1024 positions.
    let (code, err) = run_serve(&[
        "--port",
        "0",
        "--slots",
        "4",
        "--ctx",
        "4096",
        "--mem-budget",
        "200MiB",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("memory budget exceeded: 4 slots of ctx 4096"),
        "{err}"
    );
    assert!(
        err.contains("--slots 2 fits") && err.contains("fits 4 slots"),
        "{err}"
    );
    assert!(!err.contains("listening"), "{err}");
    // Without --ctx the largest context that fits the slots is chosen, and shown.
    let srv = Server::start(&[
        "-t",
        "1",
        "--slots",
        "2",
        "--mem-budget",
        "200MiB",
        "--metrics",
    ]);
    let ctx = metric(&srv, "edge_run_slot_context_tokens") as u64;
    assert!((2048..8192).contains(&ctx), "{ctx}");
    let owned = metric(&srv, "edge_run_memory_planned_bytes{part=\"owned_total\"}");
    assert!(owned <= 200.0 * 1048576.0, "{owned}");
    assert!(
        srv.log().contains(&format!("2 slots x ctx {ctx}")),
        "{}",
        srv.log()
    );
}

#[test]
fn a_taken_port_is_an_error_and_sigterm_stops_cleanly() {
    let srv = Server::start(&["-t", "1", "--ctx", "128"]);
    let port = srv.addr.port().to_string();
    let (code, err) = run_serve(&["--port", &port, "--ctx", "128"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("in use"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
    // Bad flags are usage errors (2).
    assert_eq!(run_serve(&["--port", "70000"]).0, Some(2));
    assert_eq!(run_serve(&["--slots", "0"]).0, Some(2));
    let (code, err) = run_serve(&["--host", "not a host", "--port", "0"]);
    assert_eq!(code, Some(2), "{err}");
    // SIGTERM while a stream runs: the stream ends properly and the server exits 0.
    let mut srv = srv;
    let mut stream = open_stream(
        srv.addr,
        &json!({"prompt": "1, 2,", "max_tokens": 100, "stream": true, "ignore_eos": true}),
        2,
    );
    let pid = srv.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let mut rest = String::new();
    let _ = stream.read_to_string(&mut rest);
    assert!(rest.contains("data: [DONE]"), "{rest}");
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
    assert_eq!(status.code(), Some(0), "{}", srv.log());
    assert!(srv.log().contains("stopped"), "{}", srv.log());
}
