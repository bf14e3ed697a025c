#!/usr/bin/env python3
"""Load on a running `edge-run serve` (or llama-server): for each concurrency C given, C clients
each send R streamed chat requests (greedy, N tokens, ignore_eos) at once; prints per C the
requests answered and refused (503), p50/p99 time to first token, and the aggregate decode
speed (tokens after the first, summed over the clients, per second of wall time).

    scripts/serve-bench.py http://127.0.0.1:8080 --concurrency 1 2 4 --requests 3 --tokens 64

Standard library only; bounded (C x R requests per level) and stops by itself."""

import argparse
import json
import statistics
import threading
import time
import urllib.error
import urllib.request


def one(base, tokens, out):
    body = json.dumps({
        "messages": [{"role": "user", "content": "Tell me a long story about a robot."}],
        "temperature": 0, "max_tokens": tokens, "stream": True, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    first = None
    n = 0
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    n += 1
                    if first is None:
                        first = time.time()
        out.append(("ok", first - t0 if first else None, n, first, time.time()))
    except urllib.error.HTTPError as e:
        out.append(("refused" if e.code == 503 else f"http {e.code}", None, 0, None, None))


def level(base, c, requests, tokens):
    results = []

    def client():
        for _ in range(requests):
            one(base, tokens, results)

    t0 = time.time()
    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    ok = [r for r in results if r[0] == "ok"]
    ttft = sorted(r[1] for r in ok if r[1] is not None)
    decoded = sum(max(r[2] - 1, 0) for r in ok)
    # Decode time: from the first client's first token to the last client's last token.
    starts = [r[3] for r in ok if r[3]]
    ends = [r[4] for r in ok if r[4]]
    span = (max(ends) - min(starts)) if starts else wall
    p = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else float("nan")
    print(f"concurrency {c}: {len(ok)} ok, {sum(r[0] == 'refused' for r in results)} refused (503), "
          f"{sum(r[0] not in ('ok', 'refused') for r in results)} other; "
          f"TTFT p50 {p(0.5) * 1e3:.0f} ms p99 {p(0.99) * 1e3:.0f} ms; "
          f"aggregate decode {decoded / span:.1f} tok/s ({decoded} tokens in {span:.1f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    for c in a.concurrency:
        level(a.base.rstrip("/"), c, a.requests, a.tokens)


if __name__ == "__main__":
    main()
