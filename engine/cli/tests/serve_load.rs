//! A bounded load test of `edge-run serve`: 8 concurrent clients x 25 requests each (streamed
//! and not) on 2 slots with a queue of 2. Every request must get a complete, valid answer or a
//! 503 with `Retry-After`; none may be lost or cut off; the server's resident memory stays
//! within its plan (weights + the slots' planned memory + a fixed allowance for code, the
//! vocabulary and the HTTP runtime). It reports the streamed answers' p50/p99 time to first
//! token and the aggregate tok/s (the speed figures themselves are `scripts/serve-bench.py`'s).

mod serve_util;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_util::*;

/// Resident memory of a process, in bytes (Linux).
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[test]
fn eight_clients_get_answers_or_503s_and_memory_stays_planned() {
    let srv = Server::start(&[
        "-t",
        "1",
        "--ctx",
        "512",
        "--slots",
        "2",
        "--queue",
        "2",
        "--metrics",
    ]);
    let addr = srv.addr;
    const CLIENTS: usize = 8;
    const REQUESTS: usize = 25;
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for i in 0..REQUESTS {
                    let stream = (c + i) % 2 == 0;
                    let body = json!({
                        "messages": [{"role": "user", "content": format!("Client {c} asks question {i}: name a colour.")}],
                        "max_tokens": 8, "temperature": 0.7, "seed": c * 10 + i, "stream": stream,
                    });
                    let (r, ttft) = http_timed(addr, "POST", "/v1/chat/completions", body.to_string().as_bytes());
                    outcomes.push((stream, r, ttft));
                    std::thread::sleep(Duration::from_millis(10));
                }
                outcomes
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    let mut ttfts = Vec::new();
    for c in clients {
        for (stream, r, ttft) in c.join().unwrap() {
            match r.status {
                200 if stream => {
                    ttfts.extend(ttft);
                    let events = r.events();
                    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{r:?}");
                    let finish: Vec<Value> = events[..events.len() - 1]
                        .iter()
                        .map(|e| serde_json::from_str::<Value>(e).unwrap())
                        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
                        .collect();
                    assert_eq!(finish.len(), 1, "{r:?}");
                    ok += 1;
                }
                200 => {
                    let v = r.json();
                    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
                    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 8);
                    ok += 1;
                }
                503 => {
                    api_error(&r, 503);
                    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
                    busy += 1;
                }
                _ => panic!("unexpected answer: {r:?}"),
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let total = CLIENTS * REQUESTS;
    assert_eq!(ok + busy, total);
    assert!(ok >= 4, "only {ok} of {total} answered");
    eprintln!("load: {ok} answered, {busy} refused with 503, in {wall:.1} s");
    ttfts.sort();
    if let (Some(p50), Some(p99)) = (
        ttfts.get(ttfts.len() / 2),
        ttfts.get((ttfts.len() * 99 / 100).min(ttfts.len().saturating_sub(1))),
    ) {
        eprintln!(
            "load: time to first token of {} streamed answers: p50 {} ms, p99 {} ms",
            ttfts.len(),
            p50.as_millis(),
            p99.as_millis()
        );
    }
    eprintln!(
        "load: {:.1} generated tok/s in all",
        metric(&srv, "edge_run_generated_tokens_total") / wall
    );
    // The counters agree with what the clients saw.
    assert_eq!(
        metric(
            &srv,
            "edge_run_requests_total{endpoint=\"chat\",status=\"200\"}"
        ) as usize,
        ok
    );
    if busy > 0 {
        assert_eq!(
            metric(
                &srv,
                "edge_run_requests_total{endpoint=\"chat\",status=\"503\"}"
            ) as usize,
            busy
        );
    }
    assert_eq!(metric(&srv, "edge_run_slots_busy"), 0.0);
    assert_eq!(metric(&srv, "edge_run_requests_queued"), 0.0);
    let planned = metric(&srv, "edge_run_memory_planned_bytes{part=\"owned_total\"}")
        + metric(&srv, "edge_run_memory_planned_bytes{part=\"weights\"}");
    if let Some(rss) = rss(srv.child.id()) {
        let allowance = 64.0 * 1048576.0;
        eprintln!(
            "load: RSS {:.1} MiB, planned {:.1} MiB",
            rss as f64 / 1048576.0,
            planned / 1048576.0
        );
        assert!(
            (rss as f64) <= planned + allowance,
            "RSS {rss} above the plan {planned} + 64 MiB"
        );
    }
}
