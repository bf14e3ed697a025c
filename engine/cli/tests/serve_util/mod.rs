//! What the `edge-run serve` tests share: the server started on a free port with the real
//! model (killed on drop), and a small HTTP/1.1 client that shows every status line, header and
//! byte as a client sees them.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

pub fn model() -> PathBuf {
    edge_tests::smollm2_path()
}

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `edge-run serve MODEL --port 0 ARGS` and waits for its "listening on" line.
    pub fn start(args: &[&str]) -> Server {
        Server::start_with(&model(), args)
    }

    /// Starts `edge-run serve PATH --port 0 ARGS`.
    pub fn start_with(path: &std::path::Path, args: &[&str]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve").arg(path).args(["--port", "0"]).args(args);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start edge-run serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(String::new()));
        let mut addr = None;
        let mut line = String::new();
        while addr.is_none() {
            line.clear();
            if lines.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.wait();
                panic!(
                    "the server exited before listening: {}",
                    log.lock().unwrap()
                );
            }
            log.lock().unwrap().push_str(&line);
            if let Some(rest) = line
                .trim()
                .strip_prefix("edge-run serve: listening on http://")
            {
                addr = Some(rest.parse().expect("an address"));
            }
        }
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut rest = String::new();
            while lines.read_line(&mut rest).unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&rest);
                rest.clear();
            }
        });
        Server {
            child,
            addr: addr.unwrap(),
            stderr: log,
        }
    }

    pub fn get(&self, path: &str) -> Resp {
        http(self.addr, "GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        http(self.addr, "POST", path, &[], body.to_string().as_bytes())
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The `data:` payloads of a server-sent-event body.
    pub fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// Sends one request (Connection: close) and reads the whole answer, chunked or not.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // A server may answer (413) before reading a large body; a failed write is fine then.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

/// [`http`], also timing the answer: the time from sending the request to the first byte of a
/// server-sent event carrying text (`"content":"` and a character), if one came.
pub fn http_timed(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> (Resp, Option<Duration>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let sent = std::time::Instant::now();
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let (mut raw, mut buf, mut first) = (Vec::new(), [0u8; 4096], None);
    let text_event = |raw: &[u8]| {
        let key = b"\"content\":\"";
        raw.windows(key.len() + 1)
            .any(|w| w.starts_with(key) && w[key.len()] != b'"')
    };
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if first.is_none() && text_event(&raw) {
                    first = Some(sent.elapsed());
                }
            }
        }
    }
    (parse_response(&raw), first)
}

fn parse_response(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete response: {text:?}"));
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Asserts OpenAI's error shape with this status, and returns the error object.
pub fn api_error(r: &Resp, status: u16) -> Value {
    assert_eq!(r.status, status, "{r:?}");
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{r:?}"
    );
    let e = r.json()["error"].clone();
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{r:?}"
    );
    assert!(e["type"].is_string(), "{r:?}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{r:?}");
    e
}

/// The CLI's greedy chat answer to `prompt` (at most `n` tokens).
/// The chat message the greedy comparisons use.
pub const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

pub fn cli_chat(prompt: &str, n: usize) -> String {
    let out = Command::new(BIN)
        .arg(model())
        .args([
            "--chat",
            "-p",
            prompt,
            "--temp",
            "0",
            "-n",
            &n.to_string(),
            "-t",
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A number from the server's /metrics.
pub fn metric(srv: &Server, name: &str) -> f64 {
    let m = srv.get("/metrics").body;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}
