//! `edge-run serve` with OpenAI's own Python client (`pip install openai`; under `CI=true` a
//! missing package fails): `serve_openai.py` checks chat (streamed and not, greedy text equal
//! to the CLI's), completions, models, embeddings, constrained output, tool calls (on a second
//! server with a Hermes tool-call template) and the client's exception classes. And
//! `/v1/embeddings` over plain HTTP against `edge-run embed` (itself tested against llama.cpp).

mod serve_util;

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use serve_util::*;

/// `edge-run embed --json` vectors of `texts`.
fn cli_embed(path: &std::path::Path, texts: &[&str]) -> Vec<Vec<f64>> {
    let out = Command::new(BIN)
        .arg("embed")
        .arg(path)
        .args(texts)
        .args(["--json", "-t", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

const TEXTS: [&str; 2] = [
    "A robot picks up the red cup.",
    "The weather is nice today.",
];

#[test]
fn the_openai_python_client_works_unchanged() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_openai.py");
    let probe = Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return edge_tests::missing(
            "python3 with the openai and jsonschema packages",
            "pip install openai jsonschema",
        );
    }
    let srv = Server::start(&[
        "-t",
        "1",
        "--ctx",
        "512",
        "--slots",
        "2",
        "--api-key",
        "test-key",
    ]);
    // Tool calls need a template with a tool-call syntax (SmolLM2's own has none).
    let reference = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let template = reference.join("chat-templates/hermes-tools.jinja");
    let tools_srv = Server::start(&[
        "-t",
        "1",
        "--ctx",
        "2048",
        "--slots",
        "2",
        "--api-key",
        "test-key",
        "--chat-template-file",
        template.to_str().unwrap(),
    ]);
    let expected = cli_chat(QUESTION, 32);
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .env(
            "EDGE_RUN_TOOLS_BASE_URL",
            format!("http://{}/v1", tools_srv.addr),
        )
        .env("EDGE_RUN_TOOL_SETS", reference.join("tool-sets"))
        .env("EDGE_RUN_SCHEMAS", reference.join("json-schemas"))
        .env("EDGE_RUN_BASE_URL", format!("http://{}/v1", srv.addr))
        .env("EDGE_RUN_API_KEY", "test-key")
        .env("EDGE_RUN_QUESTION", QUESTION)
        .env("EDGE_RUN_EXPECTED", &expected);
    // The embeddings part needs the encoder model (skipped outside CI without it).
    let embed_srv = edge_tests::minilm_path().map(|p| {
        let s = Server::start_with(&p, &["-t", "1"]);
        let expected = json!(cli_embed(&p, &TEXTS)).to_string();
        cmd.env("EDGE_RUN_EMBED_BASE_URL", format!("http://{}/v1", s.addr))
            .env("EDGE_RUN_EMBED_TEXTS", json!(TEXTS).to_string())
            .env("EDGE_RUN_EMBED_EXPECTED", expected);
        s
    });
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "serve_openai.py failed:\n{stdout}\n{stderr}\nserver log:\n{}\ntools server log:\n{}",
        srv.log(),
        tools_srv.log()
    );
    assert!(stdout.contains("ok: all checks passed"), "{stdout}");
    assert!(stdout.contains("ok: tool calls checked"), "{stdout}");
    let set = stdout
        .lines()
        .find(|l| l.starts_with("ok: schema set through the server"));
    eprintln!("{}", set.unwrap_or("no schema set line"));
    if embed_srv.is_some() {
        assert!(stdout.contains("ok: embeddings equal"), "{stdout}");
    }
}

#[test]
fn embeddings_over_http_equal_the_cli() {
    let Some(path) = edge_tests::minilm_path() else {
        return;
    };
    let expected = cli_embed(&path, &TEXTS);
    let srv = Server::start_with(&path, &["-t", "1", "--slots", "2"]);
    let r = srv.post("/v1/embeddings", &json!({"input": TEXTS, "model": "x"}));
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    for (i, want) in expected.iter().enumerate() {
        let d = &v["data"][i];
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        let got: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), want.len());
        // The CLI prints 6 decimals in its table but full precision in JSON.
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "text {i}: max difference {worst}");
    }
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    // Errors: no input, a non-string, a text model's endpoints on an encoder.
    let e = api_error(&srv.post("/v1/embeddings", &json!({})), 400);
    assert_eq!(e["param"], "input");
    let e = api_error(&srv.post("/v1/embeddings", &json!({"input": [1]})), 400);
    assert_eq!(e["param"], "input");
    let e = api_error(
        &srv.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        400,
    );
    assert!(
        e["message"].as_str().unwrap().contains("/v1/embeddings"),
        "{e}"
    );
    let long = "word ".repeat(1000);
    let e = api_error(
        &srv.post("/v1/embeddings", &json!({"input": ["ok", long]})),
        400,
    );
    assert_eq!(e["param"], "input[1]", "{e}");
}

/// The exact wire shape of tool calls, over plain HTTP (what the openai client hides: a JSON
/// `null` content, `arguments` as a string, the first streamed delta of a call), and the 400s
/// of requests the server cannot honour.
#[test]
fn tool_calls_have_openais_wire_shape() {
    let reference = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference");
    let template = reference.join("chat-templates/hermes-tools.jinja");
    let tools: Value = serde_json::from_str(
        &std::fs::read_to_string(reference.join("tool-sets/robot_base.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    let srv = Server::start(&[
        "-t",
        "1",
        "--chat-template-file",
        template.to_str().unwrap(),
    ]);
    let ask = json!([{"role": "user", "content": "Go forward one meter."}]);
    let body = json!({"messages": ask, "tools": tools, "tool_choice": "required",
                      "temperature": 0, "max_tokens": 96});
    let r = srv.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let m = &choice["message"];
    assert_eq!(m["role"], "assistant");
    assert!(m.get("content").is_some_and(Value::is_null), "{m}");
    let calls = m["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{m}");
    let c = &calls[0];
    assert_eq!(c["type"], "function");
    let id = c["id"].as_str().unwrap();
    assert!(id.len() == 29 && id.starts_with("call_"), "{id}");
    assert!(
        names.contains(&c["function"]["name"].as_str().unwrap()),
        "{c}"
    );
    let args = c["function"]["arguments"]
        .as_str()
        .expect("arguments is a string");
    assert!(
        serde_json::from_str::<Value>(args).unwrap().is_object(),
        "{args}"
    );

    // Streamed: the call's first delta has index, id, type and name (and empty arguments);
    // the later ones only index and argument text, which joined are the whole answer's.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = srv.post("/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200, "{r:?}");
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(deltas.len() >= 2, "{chunks:?}");
    let first = deltas[0];
    assert_eq!(first["index"], 0);
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], c["function"]["name"]);
    assert_eq!(first["function"]["arguments"], "");
    assert!(first["id"].as_str().unwrap().starts_with("call_"));
    let mut joined = String::new();
    for d in &deltas[1..] {
        assert_eq!(d["index"], 0);
        assert!(
            d.get("id").is_none() && d["function"].get("name").is_none(),
            "{d}"
        );
        joined.push_str(d["function"]["arguments"].as_str().unwrap());
    }
    assert_eq!(joined, args, "streamed arguments equal the whole answer's");
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls");
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .is_none_or(str::is_empty)));

    // The 400s, each naming its field.
    let cases = [
        (json!({"messages": ask, "tools": {"a": 1}}), "tools"),
        (
            json!({"messages": ask, "tools": [{"type": "function", "function": {"description": "x"}}]}),
            "tools",
        ),
        (
            json!({"messages": ask, "tools": tools, "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"messages": ask, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "fly"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": ask, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": ask, "tools": tools, "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
        ),
        (
            json!({"messages": ask, "tools": tools, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": ask, "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "string", "if": {}}}}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "x",
                "type": "function", "function": {"name": "move", "arguments": "{not json"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": ask, "functions": [{"name": "f"}]}),
            "functions",
        ),
        (json!({"prompt": "hi", "tools": tools}), "tools"),
    ];
    for (body, param) in cases {
        let path = if body.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let e = api_error(&srv.post(path, &body), 400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    // A template without a tool-call syntax: the 400 names the fix.
    let plain = Server::start(&["-t", "1"]);
    let e = api_error(
        &plain.post(
            "/v1/chat/completions",
            &json!({"messages": ask, "tools": tools}),
        ),
        400,
    );
    assert_eq!(e["param"], "tools");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("--chat-template-file") && msg.contains("Hermes"),
        "{msg}"
    );
    // tool_choice "none" with that template is plain text: no syntax needed.
    let r = plain.post(
        "/v1/chat/completions",
        &json!({"messages": ask, "tools": tools, "tool_choice": "none", "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{r:?}");
}
