//! The CPU executor's attention: the KV store, causal attention over the cache (llama.cpp's
//! exact non-flash order for an f16 cache, or tiled with an online softmax), and the encoders'
//! bidirectional attention. One row of scores per thread at most: no score matrix exists.

use half::f16;

use edge_gguf::GgmlType;
use edge_kernels::cpu::{self, activations::soft_cap};
use edge_kernels::steal;

use super::exec::OpCtx;
use crate::graph::{Attention, ValueId};
use crate::kv::{ring_runs, ring_slot, KvType, MAX_Q8_HEAD_DIM};

/// A thread's attention jobs (see [`OpCtx::attention_jobs`]): job `t * n_head + h` is token
/// t's head h.
pub(super) enum AttentionJobs<'a> {
    /// Heads claimed in chunks (one token).
    Claimed {
        claims: steal::Claimed<'a>,
        heads: std::ops::Range<usize>,
    },
    /// Every `n_threads`-th job.
    Strided(std::iter::StepBy<std::ops::Range<usize>>),
}

impl Iterator for AttentionJobs<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            AttentionJobs::Claimed { claims, heads } => loop {
                if let Some(h) = heads.next() {
                    return Some(h);
                }
                *heads = claims.next()?;
            },
            AttentionJobs::Strided(jobs) => jobs.next(),
        }
    }
}

impl OpCtx<'_> {
    /// Attention with hardware FMA where the CPU has it (the ggml-ordered kernels are chains of
    /// fused multiply-adds, each a libm call without the instruction; same results either way).
    pub(super) fn attention_op(&self, a: Attention) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports FMA (checked), the only feature it enables.
            return unsafe { self.attention_fma(a) };
        }
        self.attention(a)
    }

    /// This thread's (token, head) jobs of attention. For one token: heads claimed one at a
    /// time from a contiguous share (whole groups of heads that share a KV head where the KV
    /// heads divide evenly among the threads, so that each thread mostly reads the KV heads it
    /// stored: see `store_kv`), then heads taken from the back of the others' shares, so that
    /// threads finish together. For several tokens: [`Self::share_causal`].
    pub(super) fn attention_jobs(&self, n_head: usize, group: usize) -> AttentionJobs<'_> {
        if self.n_tokens() == 1 && self.n_threads > 1 {
            let n_head_kv = n_head / group.max(1);
            let granule = if n_head_kv.is_multiple_of(self.n_threads) {
                group
            } else {
                1
            };
            let plan = steal::ChunkPlan {
                n_rows: n_head,
                n_threads: self.n_threads,
                granule,
                chunk: 1,
                shrink: 0,
            };
            AttentionJobs::Claimed {
                claims: self.exec.claims.claimed(plan, self.tag, self.tid),
                heads: 0..0,
            }
        } else {
            AttentionJobs::Strided(self.share_causal(self.n_tokens() * n_head))
        }
    }

    /// This thread's (token, head) jobs of causal attention, dealt round-robin: a job's cost
    /// grows with its token's position, so contiguous ranges would give the last thread most of
    /// the work (3x the first's for two threads over a whole prompt).
    pub(super) fn share_causal(&self, n: usize) -> std::iter::StepBy<std::ops::Range<usize>> {
        (self.tid.min(n)..n).step_by(self.n_threads.max(1))
    }

    /// Bidirectional attention: every (token, head) pair attends to all tokens of the run;
    /// pairs are split among the threads, each writing its own head's slice of the output.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encoder_attention(
        &self,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        n_head: usize,
        head_dim: usize,
        scale: f32,
        out: ValueId,
    ) {
        let n = self.rows_of(out);
        let (qs, ks, vs) = (
            self.input(q, 0..n),
            self.input(k, 0..n),
            self.input(v, 0..n),
        );
        let width = self.cols(q);
        let scores = self.scratch();
        for pair in self.share(n * n_head, 1) {
            let (t, h) = (pair / n_head, pair % n_head);
            let cols = h * head_dim..(h + 1) * head_dim;
            let (a, e) = (cols.start, cols.end);
            let key = |j: usize| &ks[j * width + a..j * width + e];
            let value = |j: usize| &vs[j * width + a..j * width + e];
            cpu::attend_all(
                &qs[t * width + a..t * width + e],
                n,
                &key,
                &value,
                scale,
                scores,
                self.output(out, t, cols.clone()),
            );
        }
    }

    /// Writes this thread's part of the rows of k and v into the KV cache of `layer`.
    pub(super) fn store_kv(&self, k: ValueId, v: ValueId, layer: usize, head_dim: usize) {
        let kv_dim = self.kv.kv_dim;
        // One token's heads go to the threads whose attention reads them (see
        // `attention_jobs`), so each thread's KV rows stay in its own caches; q8_0 heads must
        // be whole blocks to be split.
        let granule = match self.kv.ty {
            KvType::Q8_0 if !head_dim.is_multiple_of(32) => kv_dim,
            _ => head_dim.max(1),
        };
        let (tokens, part) = self.share_rows_or_cols(self.n_tokens(), kv_dim, granule);
        if part.is_empty() {
            return;
        }
        for t in tokens {
            // Every cache of a run has the same layout: offsets are the same in each.
            let (kv, pos) = (self.kv_of(t), self.pos(t));
            for (is_v, src) in [(false, k), (true, v)] {
                let src = &self.input(src, t..t + 1)[part.clone()];
                let offset = kv.row_offset(layer, is_v, pos);
                match self.kv.ty {
                    KvType::F16 => {
                        // SAFETY: this part of row `pos` of token t's cache is written only by
                        // the thread that owns it (token t, these columns; a cache serves one
                        // token of a run, checked by `Executor::run`), and no attention op reads
                        // the cache during this op.
                        let dst =
                            unsafe { kv.mem.slice_mut::<f16>(offset + part.start * 2, part.len()) };
                        cpu::f32_to_f16_row(src, dst);
                    }
                    KvType::Q8_0 => {
                        // Rows are whole blocks (checked when the session is planned), and so
                        // is `part` (the granule above).
                        let (b0, b1) = (part.start / 32 * 34, part.end.div_ceil(32) * 34);
                        // SAFETY: as above.
                        let dst = unsafe { kv.mem.slice_mut::<u8>(offset + b0, b1 - b0) };
                        let _ = self.exec.kernels.quantize_row(GgmlType::Q8_0, src, dst);
                    }
                }
            }
        }
    }

    /// Attention tiled over the cache, flash-style: one pass over the positions keeps a running
    /// maximum, a running denominator and an f32 accumulator of V, rescaled whenever the
    /// maximum grows (online softmax). Memory: one head of accumulator per thread, whatever the
    /// context. With a q8_0 cache the query is quantized to q8_0 for integer K·q products, as
    /// llama.cpp's flash-attention path does for a quantized cache; with f16 the products are
    /// f32 over the widened keys.
    #[inline(always)]
    pub(super) fn attention_online(&self, a: Attention) {
        use edge_gguf::GgmlType;
        let Attention {
            q,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            scale,
            window,
            softcap,
            out,
        } = a;
        let group = n_head / n_head_kv;
        let head_bytes = self.kv.row_bytes / n_head_kv;
        let rb = self.kv.row_bytes;
        let (k_base, v_base, rows) = self.kv.layer_span(layer);
        let scratch = self.scratch();
        let (acc, rest) = scratch.split_at_mut(head_dim);
        let (vtmp, _) = rest.split_at_mut(head_dim);
        // q8_0 of one query head (head_dim <= MAX_Q8_HEAD_DIM, checked when planning).
        let quantized = self.kv.ty == KvType::Q8_0;
        let mut q8 = [0u8; MAX_Q8_HEAD_DIM / 32 * 34];
        let q8 = &mut q8[..if quantized { head_bytes } else { 0 }];
        for job in self.attention_jobs(n_head, group) {
            let (t, h) = (job / n_head, job % n_head);
            let kvh = h / group;
            let (kv, n_pos) = (self.kv_of(t), self.pos(t) + 1);
            let qh = &self.input(q, t..t + 1)[h * head_dim..(h + 1) * head_dim];
            if quantized {
                let _ = self.exec.kernels.quantize_row(GgmlType::Q8_0, qh, q8);
            }
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0.0f32;
            acc.fill(0.0);
            let first = window.map_or(0, |w| n_pos.saturating_sub(w));
            for p in first..n_pos {
                // SAFETY: the cache is only read during attention (see `attention`).
                let krow = unsafe { kv.mem.slice::<u8>(k_base + ring_slot(p, rows) * rb, rb) };
                let k = &krow[kvh * head_bytes..(kvh + 1) * head_bytes];
                let dot = if quantized {
                    self.exec.kernels.vec_dot(GgmlType::Q8_0, head_dim, k, q8)
                } else {
                    k.chunks_exact(2)
                        .zip(qh)
                        .map(|(k, q)| f16::from_le_bytes([k[0], k[1]]).to_f32() * q)
                        .sum::<f32>()
                };
                let s = soft_cap(dot, softcap) * scale;
                let (ms, vs) = if s > max {
                    let ms = (max - s).exp();
                    max = s;
                    for x in acc.iter_mut() {
                        *x *= ms;
                    }
                    (ms, 1.0)
                } else {
                    (1.0, (s - max).exp())
                };
                // SAFETY: read-only, as above.
                let vrow = unsafe { kv.mem.slice::<u8>(v_base + ring_slot(p, rows) * rb, rb) };
                let _ = edge_kernels::cpu::dequantize_row(
                    self.kv.ty.ggml_type(),
                    &vrow[kvh * head_bytes..(kvh + 1) * head_bytes],
                    vtmp,
                );
                for (x, v) in acc.iter_mut().zip(vtmp.iter()) {
                    *x = v.mul_add(vs, *x);
                }
                sum = sum * ms + vs;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            for (o, x) in self
                .output(out, t, h * head_dim..(h + 1) * head_dim)
                .iter_mut()
                .zip(acc.iter())
            {
                *o = x * inv;
            }
        }
    }

    /// [`OpCtx::attention`] compiled with hardware FMA: the ggml-ordered kernels are chains of
    /// fused multiply-adds, each a libm call without the instruction. Same results either way.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn attention_fma(&self, a: Attention) {
        self.attention(a)
    }

    /// Attention for row t, head h. With an f16 cache, reproduces llama.cpp's non-flash CPU
    /// path: scores `K·f16(q)`, `softmax(scores * scale)` in f32 with its exp and sums,
    /// probabilities rounded to f16, then `V·p`; the dot products are added in the order ggml
    /// uses for one token (`ggml_vec_dot_f16`) or for a batch (tinyBLAS), see
    /// [`cpu::ggml_order`]. One row of scores per (token, head) pair a job takes; no score
    /// matrix. A q8_0 cache goes to
    /// [`OpCtx::attention_online`].
    #[inline(always)]
    pub(super) fn attention(&self, a: Attention) {
        if self.exec.online_attention || self.kv.ty == KvType::Q8_0 {
            return self.attention_online(a);
        }
        let Attention {
            q,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            scale,
            window,
            softcap,
            out,
        } = a;
        use edge_kernels::cpu::ggml_order::{self as order, LANES, STEP_LANES};
        let group = n_head / n_head_kv;
        let n_tok = self.n_tokens();
        let batch = n_tok > 1;
        let width = if batch { LANES } else { STEP_LANES };
        // A batch job takes `g` query heads of one KV head: their scores use the same key and
        // value rows, widened from f16 once for all of them (each head's sums keep their order,
        // so the bits are those of one head at a time).
        let g = if batch {
            super::exec::heads_together_up_to(group, self.exec.heads_together)
        } else {
            1
        };
        // Tokens of one sequence without a window share their key and value rows: a job takes
        // `tile` consecutive tokens, `g * tile` (token, head) pairs, and reads the cache in
        // chunks of ROWS_PER_CHUNK rows, each used by every pair while it sits in the core's
        // caches, instead of one pass over the whole cache per token. Each score and output
        // keeps the operations and order of one token at a time (the scores of rows a pair does
        // not see are computed and ignored; its `V·p` takes exactly its own rows).
        let tile =
            if batch && window.is_none() && self.args.seqs.is_none() && self.exec.attention_tiles {
                super::exec::tokens_together(g)
            } else {
                1
            };
        let chunk = if tile > 1 { ROWS_PER_CHUNK } else { usize::MAX };
        let ctx = self.kv.ctx;
        let (k_base, v_base, rows) = self.kv.layer_span(layer);
        // Rows are f16 of `row_bytes` bytes.
        let row_len = self.kv.row_bytes / 2;
        debug_assert!(row_len >= self.kv.kv_dim);
        let pairs_max = g * tile;
        let per_pair = head_dim * width;
        let scratch = self.scratch();
        let (scores, rest) = scratch.split_at_mut(pairs_max * ctx);
        let (qs, rest) = rest.split_at_mut(pairs_max * head_dim);
        let accs = &mut rest[..pairs_max * per_pair];
        let head_groups = n_head / g;
        let jobs = if pairs_max == 1 {
            self.attention_jobs(n_head, group)
        } else {
            AttentionJobs::Strided(self.share_causal(n_tok.div_ceil(tile) * head_groups))
        };
        for job in jobs {
            // Job (tile i, h0): tokens t0..t1, heads h0..h0 + g; pair p is token t0 + p / g,
            // head h0 + p % g.
            let (t0, h0) = (job / head_groups * tile, job % head_groups * g);
            let t1 = (t0 + tile).min(n_tok);
            let pairs = (t1 - t0) * g;
            let kvh = h0 / group;
            // The tile's tokens share a cache and a first position (tile > 1 only for one
            // sequence without a window), and see positions first..seen(t).
            let kv = self.kv_of(t0);
            let seen = |t: usize| self.pos(t) + 1;
            let first = window.map_or(0, |w| seen(t0).saturating_sub(w));
            let (n_first, n_last) = (seen(t0) - first, seen(t1 - 1) - first);
            // The layer's keys and values in the tile's cache (the same layout in every cache
            // of a run).
            // SAFETY: the cache is only read during attention: StoreKv wrote it before the
            // barrier that precedes this op, and nothing writes it until the next StoreKv.
            let (keys, values) = unsafe {
                (
                    kv.mem.slice::<f16>(k_base, rows * row_len),
                    kv.mem.slice::<f16>(v_base, rows * row_len),
                )
            };
            for (k, t) in (t0..t1).enumerate() {
                qs[k * g * head_dim..(k + 1) * g * head_dim]
                    .copy_from_slice(&self.input(q, t..t + 1)[h0 * head_dim..(h0 + g) * head_dim]);
            }
            // ggml converts the query to f16 before its f16 K·Q product (`x * 1` is `x`).
            let qs = &mut qs[..pairs * head_dim];
            order::scale_round_f16(qs, 1.0);
            let off = kvh * head_dim;
            // scores[p * ctx + i] is pair p's score of position first + i; those positions sit
            // in at most two runs of consecutive rows (a ring wraps once).
            let mut at = 0;
            for (slot0, len) in ring_runs(first, n_last, rows) {
                for c0 in (0..len).step_by(chunk) {
                    let c1 = len.min(c0.saturating_add(chunk));
                    let run = &keys[(slot0 + c0) * row_len..];
                    let out = &mut scores[at + c0..];
                    if pairs == 1 {
                        order::dot_f16_rows(run, row_len, off, qs, &mut out[..c1 - c0], batch);
                    } else {
                        order::dot_f16_rows_heads(
                            run,
                            row_len,
                            off,
                            qs,
                            head_dim,
                            out,
                            ctx,
                            c1 - c0,
                        );
                    }
                }
                at += len;
            }
            for p in 0..pairs {
                let n_seen = seen(t0 + p / g) - first;
                softmax_rounded_f16(&mut scores[p * ctx..p * ctx + n_seen], scale, softcap);
            }
            // V·p with p rounded to f16. Output element d accumulates term i in slot i % width
            // (see cpu::ggml_order); slots are stored [slot][d] so that one position updates a
            // contiguous row of head_dim accumulators (vectorizable, same order). The rows every
            // pair sees go for all pairs, then each later token's last few rows for its own
            // pairs (terms stay in order in every slot).
            let accs = &mut accs[..pairs * per_pair];
            accs.fill(0.0);
            let mut at = 0;
            for (slot0, len) in ring_runs(first, n_first, rows) {
                for c0 in (0..len).step_by(chunk) {
                    let c1 = len.min(c0.saturating_add(chunk));
                    let run = &values[(slot0 + c0) * row_len..];
                    let (term, probs) = (at + c0, &scores[at + c0..]);
                    if pairs == 1 {
                        order::axpy_f16_rows(
                            accs,
                            width,
                            term,
                            run,
                            row_len,
                            off,
                            &probs[..c1 - c0],
                        );
                    } else {
                        order::axpy_f16_rows_heads(
                            accs,
                            head_dim,
                            width,
                            term,
                            run,
                            row_len,
                            off,
                            probs,
                            ctx,
                            c1 - c0,
                        );
                    }
                }
                at += len;
            }
            for p in 0..pairs {
                // Only tiles of more than one token have later tokens: no window, no ring, so
                // term i is row i.
                let n_seen = seen(t0 + p / g) - first;
                if n_seen > n_first {
                    order::axpy_f16_rows(
                        &mut accs[p * per_pair..(p + 1) * per_pair],
                        width,
                        n_first,
                        &values[n_first * row_len..],
                        row_len,
                        off,
                        &scores[p * ctx + n_first..p * ctx + n_seen],
                    );
                }
            }
            for p in 0..pairs {
                let (t, h) = (t0 + p / g, h0 + p % g);
                order::accumulated_sums(
                    &accs[p * per_pair..(p + 1) * per_pair],
                    self.output(out, t, h * head_dim..(h + 1) * head_dim),
                );
            }
        }
    }
}

/// Rows of the cache a job of [`OpCtx::attention`] with several tokens reads at a time (64 KiB
/// of keys for a head of 128).
const ROWS_PER_CHUNK: usize = 256;

/// llama.cpp's softmax of one row of scores, in place: `soft_cap(s) * scale`, the maximum,
/// `exp(s - max)` summed 16 at a time in f64 (`ggml_vec_soft_max_f32`), then the probabilities
/// rounded to f16 (the operand of its f16 `V·p`).
#[inline(always)]
fn softmax_rounded_f16(scores: &mut [f32], scale: f32, softcap: Option<f32>) {
    use edge_kernels::cpu::ggml_order as order;
    match softcap {
        Some(_) => scores
            .iter_mut()
            .for_each(|s| *s = soft_cap(*s, softcap) * scale),
        // The common case in a loop the compiler vectorizes.
        None => scores.iter_mut().for_each(|s| *s *= scale),
    }
    let max = order::max_ignoring_nan(scores);
    // (One call: every element's exp is the same whichever lanes compute it.)
    order::expf_shifted(scores, max);
    let sum = order::sum16_f64(scores);
    let inv = (1.0 / sum) as f32;
    order::scale_round_f16(scores, inv);
}
