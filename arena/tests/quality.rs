//! Plan quality against the lower bound, planning time, and the heap-free
//! [`plan_into`] against [`plan`].
#![cfg(feature = "alloc")]

mod common;

use common::{random_buffers, Rng};
use edge_arena::{check, lower_bound, plan, plan_into, scratch_len, ArenaPlan, Buffer};

fn planned(buffers: &[Buffer]) -> ArenaPlan {
    let p = plan(buffers).expect("plan");
    check(buffers, &p.offsets, p.size).expect("check");
    assert_eq!(p.lower_bound, lower_bound(buffers));
    assert!(p.ratio() >= 1.0);
    p
}

#[test]
fn random_instances_mean_ratio_within_ten_percent() {
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let (mut sum, mut worst, mut count, mut at_bound) = (0.0f64, 1.0f64, 0usize, 0usize);
    for _ in 0..500 {
        let n = 1 + rng.below(300);
        let ops = 1 + rng.below(150);
        let max_size = 1 + rng.below(100_000);
        let bufs = random_buffers(&mut rng, n, ops, max_size, 7);
        let p = planned(&bufs);
        if p.lower_bound == 0 {
            continue;
        }
        let r = p.ratio();
        sum += r;
        worst = worst.max(r);
        count += 1;
        at_bound += usize::from(p.size == p.lower_bound);
    }
    let mean = sum / count as f64;
    eprintln!(
        "random: {count} instances, mean plan/bound {mean:.4}, worst {worst:.4}, \
         at the bound {at_bound}"
    );
    assert!(mean <= 1.10, "mean ratio {mean}");
}

/// Buffers of a Llama-like decoder (SmolLM2-135M shapes: hidden 576, kv 192,
/// ffn 1536) over `tokens` tokens and `layers` layers, f32 activations with
/// ~1/4-size quantized copies of matmul inputs. Lifetimes run from the
/// producing op to the last consuming op.
fn transformer(tokens: usize, layers: usize) -> Vec<Buffer> {
    transformer_with_inplace(tokens, layers).0
}

/// [`transformer`] and the `(out, input)` pairs where an elementwise op (rope,
/// SwiGLU, residual add) may write over its dying input.
fn transformer_with_inplace(tokens: usize, layers: usize) -> (Vec<Buffer>, Vec<(usize, usize)>) {
    struct G {
        bufs: Vec<Buffer>,
        op: usize,
    }
    impl G {
        /// A new value of `elems` f32 (or `elems` quantized bytes if `q`)
        /// produced by the next op, which reads `inputs`.
        fn op(&mut self, elems: usize, q: bool, inputs: &[usize]) -> usize {
            let op = self.op;
            self.op += 1;
            for &i in inputs {
                self.bufs[i].last_op = op;
            }
            // Q8-like: 1 byte per element plus a 4-byte scale per 32.
            let size = if q { elems + elems / 32 * 4 } else { elems * 4 };
            self.bufs
                .push(Buffer::new(size.next_multiple_of(64), 64, op, op));
            self.bufs.len() - 1
        }
    }
    let (h, kv, ffn, t) = (576, 192, 1536, tokens);
    let mut g = G {
        bufs: Vec::new(),
        op: 0,
    };
    let mut pairs = Vec::new();
    let mut resid = g.op(t * h, false, &[]); // embedding lookup
    for _ in 0..layers {
        let norm = g.op(t * h, false, &[resid]);
        let qn = g.op(t * h, true, &[norm]);
        let q = g.op(t * h, false, &[qn]);
        let k = g.op(t * kv, false, &[qn]);
        let v = g.op(t * kv, false, &[qn]);
        let qr = g.op(t * h, false, &[q]); // rope
        let kr = g.op(t * kv, false, &[k]);
        pairs.extend([(qr, q), (kr, k)]);
        let attn = g.op(t * h, false, &[qr, kr, v]);
        let qa = g.op(t * h, true, &[attn]);
        let o = g.op(t * h, false, &[qa]);
        let r2 = g.op(t * h, false, &[resid, o]);
        pairs.push((r2, o));
        let norm2 = g.op(t * h, false, &[r2]);
        let qn2 = g.op(t * h, true, &[norm2]);
        let gate = g.op(t * ffn, false, &[qn2]);
        let up = g.op(t * ffn, false, &[qn2]);
        let sw = g.op(t * ffn, false, &[gate, up]);
        pairs.push((sw, gate));
        let qs = g.op(t * ffn, true, &[sw]);
        let down = g.op(t * h, false, &[qs]);
        let next = g.op(t * h, false, &[r2, down]);
        pairs.push((next, down));
        resid = next;
    }
    let norm = g.op(t * h, false, &[resid]);
    let qn = g.op(h, true, &[norm]); // last token only
    let logits = g.op(49_152, false, &[qn]);
    g.op(1, false, &[logits]); // sampling reads the logits
    (g.bufs, pairs)
}

#[test]
fn transformer_graphs_with_inplace_reuse() {
    use edge_arena::{check_with_inplace, plan_with_inplace};
    for tokens in [1, 32, 512] {
        let (bufs, pairs) = transformer_with_inplace(tokens, 30);
        let plain = planned(&bufs);
        let p = plan_with_inplace(&bufs, &pairs).unwrap();
        check_with_inplace(&bufs, &p.offsets, p.size, &pairs).unwrap();
        let used = pairs
            .iter()
            .filter(|&&(o, i)| p.offsets[o] == p.offsets[i])
            .count();
        eprintln!(
            "transformer in place, {tokens} tokens: {used}/{} pairs at one offset, plan {} \
             (without in-place {}), bound {} ratio {:.4}",
            pairs.len(),
            p.size,
            plain.size,
            p.lower_bound,
            p.ratio()
        );
        assert_eq!(used, pairs.len());
        assert!(p.size <= plain.size);
        assert!(p.ratio() <= 1.05, "{tokens} tokens: ratio {}", p.ratio());
    }
}

#[test]
fn transformer_graphs_within_five_percent() {
    for tokens in [1, 7, 32, 128, 512] {
        let bufs = transformer(tokens, 30);
        let p = planned(&bufs);
        eprintln!(
            "transformer, {tokens} tokens, {} buffers: plan {} bound {} ratio {:.4}",
            bufs.len(),
            p.size,
            p.lower_bound,
            p.ratio()
        );
        assert!(p.ratio() <= 1.05, "{tokens} tokens: ratio {}", p.ratio());
    }
}

#[test]
fn ten_thousand_buffers_time() {
    // A long chain with skip connections and some long-lived values (the
    // instance of `examples/bench.rs`).
    let mut rng = Rng(42);
    let bufs: Vec<Buffer> = (0..10_000)
        .map(|i| {
            let len = match rng.below(10) {
                0 => rng.below(200),
                _ => 1 + rng.below(3),
            };
            Buffer::new(64 * (1 + rng.below(1024)), 64, i, i + len)
        })
        .collect();
    let mut best = std::time::Duration::MAX;
    let mut p = plan(&bufs).unwrap();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        p = plan(&bufs).unwrap();
        best = best.min(t.elapsed());
    }
    eprintln!(
        "10k buffers: plan {best:?} (best of 3; debug builds include the self-check), \
         ratio {:.4}",
        p.ratio()
    );
    check(&bufs, &p.offsets, p.size).unwrap();
    if !cfg!(debug_assertions) {
        assert!(best.as_millis() < 200, "{best:?}");
    }
}

#[test]
fn ratio_is_one_for_an_empty_bound() {
    let p = plan(&[Buffer::new(0, 1, 0, 0)]).unwrap();
    assert_eq!(p.ratio(), 1.0);
    let p = plan(&[Buffer::new(10, 1, 0, 1), Buffer::new(8, 16, 0, 1)]).unwrap();
    assert_eq!(p.ratio(), 24.0 / 18.0);
}

#[test]
fn plan_into_agrees_with_plan() {
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    for trial in 0..600 {
        let n = rng.below(150);
        let ops = 1 + rng.below(60);
        let max_size = 1 + rng.below(3000);
        let bufs = random_buffers(&mut rng, n, ops, max_size, 7);
        let p = plan(&bufs).unwrap();
        let mut offsets = vec![usize::MAX; n];
        // Any scratch at least `scratch_len` long will do.
        let mut scratch = vec![7usize; scratch_len(n) + trial % 3];
        let size = plan_into(&bufs, &mut offsets, &mut scratch).unwrap();
        assert_eq!((offsets, size), (p.offsets, p.size), "{bufs:?}");
    }
    // Everything living together: too many pairs for neighbour lists, so
    // `plan` takes its block-index fallback too.
    let bufs: Vec<Buffer> = (0..1600)
        .map(|i| Buffer::new(1 + i % 97, 1, i % 5, 10_000))
        .collect();
    let p = plan(&bufs).unwrap();
    let mut offsets = vec![0; bufs.len()];
    let mut scratch = vec![0; scratch_len(bufs.len())];
    assert_eq!(plan_into(&bufs, &mut offsets, &mut scratch), Ok(p.size));
    assert_eq!(offsets, p.offsets);
}

#[test]
fn plan_into_reports_errors() {
    use edge_arena::PlanError;
    let mut scratch = [0; 64];
    assert_eq!(
        plan_into(&[Buffer::new(1, 1, 0, 0)], &mut [], &mut scratch),
        Err(PlanError::LengthMismatch {
            buffers: 1,
            offsets: 0
        })
    );
    assert_eq!(
        plan_into(&[Buffer::new(1, 3, 0, 0)], &mut [0], &mut scratch),
        Err(PlanError::BadAlign { index: 0, align: 3 })
    );
    assert_eq!(plan_into(&[], &mut [], &mut []), Ok(0));
}

#[test]
#[should_panic(expected = "scratch")]
fn plan_into_panics_on_short_scratch() {
    let bufs = [Buffer::new(1, 1, 0, 0), Buffer::new(1, 1, 0, 0)];
    let mut scratch = vec![0; scratch_len(2) - 1];
    let _ = plan_into(&bufs, &mut [0, 0], &mut scratch);
}
