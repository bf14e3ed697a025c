//! Planning time and quality on 10 000 graph-like buffers:
//! `cargo run --release -p edge-arena --example bench`.

use edge_arena::{plan, Buffer};
use std::time::Instant;

fn main() {
    let mut s = 42u64;
    let mut below = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let n = 10_000;
    // The same instance as the `ten_thousand_buffers` test: a long chain with
    // skip connections and some long-lived values.
    let bufs: Vec<Buffer> = (0..n)
        .map(|i| {
            let len = match below(10) {
                0 => below(200),
                _ => 1 + below(3),
            };
            Buffer::new(64 * (1 + below(1024)), 64, i, i + len)
        })
        .collect();
    let mut best = f64::MAX;
    let mut p = plan(&bufs).unwrap();
    for _ in 0..20 {
        let t = Instant::now();
        p = plan(&bufs).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{n} buffers: {:.2} ms (best of 20), size {} bound {} ratio {:.4}",
        best * 1e3,
        p.size,
        p.lower_bound,
        p.ratio()
    );
}
