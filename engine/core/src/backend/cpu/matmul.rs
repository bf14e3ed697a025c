//! The CPU executor's matrix products: a decode step streams each thread's share of the weight
//! rows once (claiming chunks, and stealing the last ones, where a share is large); prefill
//! runs rows in chunks that stay in L2 while 8 or 4 tokens at a time use them.

use edge_gguf::GgmlType;
use edge_kernels::cpu::{panel_parts, Panels, MATVEC_TOKENS, MATVEC_TOKENS8};
use edge_kernels::steal;

use super::exec::OpCtx;
use crate::graph::{ValueId, WeightId};

impl OpCtx<'_> {
    /// Tokens `t0..` of a matmul in groups of `N` through `kernel` (a multi-token entry of
    /// [`edge_kernels::Kernels`]: activations `xq` in rows of `xrb` bytes, outputs rows `rows` of `out`),
    /// while whole groups remain and the kernel takes them; returns the first token left.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn token_groups<const N: usize>(
        &self,
        out: ValueId,
        xq: &[u8],
        xrb: usize,
        t0: usize,
        n_tok: usize,
        rows: &std::ops::Range<usize>,
        kernel: impl Fn([&[u8]; N], [&mut [f32]; N]) -> bool,
    ) -> usize {
        let mut t = t0;
        while t + N <= n_tok {
            let xs: [&[u8]; N] = std::array::from_fn(|k| &xq[(t + k) * xrb..(t + k + 1) * xrb]);
            let ys: [&mut [f32]; N] =
                std::array::from_fn(|k| self.output(out, t + k, rows.clone()));
            if !kernel(xs, ys) {
                break;
            }
            t += N;
        }
        t
    }

    /// out[t] = weight · x[t] for this thread's rows (`x` already quantized to the weight
    /// type's activation type).
    pub(super) fn matmul(&self, weight: WeightId, x: ValueId, out: ValueId) {
        /// Weight rows per granule of a thread's share (the repacked kernels' 16-row groups).
        const ROWS_PER_CHUNK: usize = 16;
        /// Weight rows a prefill matmul runs all its tokens over before moving on: they stay in
        /// L2 (64 rows of a 1536-wide Q8_0 matrix are 102 KiB), and each token group's setup
        /// and each pass over the activations are paid once per 64 rows, not per 16. Measured
        /// on a 2-core Zen 1, pp512 tok/s with 16 / 32 / 64 / 128 rows: SmolLM2 Q4_K_M 139 /
        /// 146 / 150 / 150, Q5_K_M 149 / 152 / 154 / 151, IQ4_XS 164 / 158 / 167 / 164, the
        /// Gemma-3-class file 163 / 167 / 170 / 173; SmolLM2 Q8_0 161 / 169 / 169 (16 / 32 /
        /// 64); never slower than 16 on the 1.1B and Qwen3-class files (pp256).
        const PREFILL_ROWS_PER_CHUNK: usize = 64;
        /// A decode matmul's chunks are this fraction of what is left of a share: long runs
        /// of rows first (each thread streams its weights), short ones last (threads finish
        /// together).
        const DECODE_SHRINK: usize = 4;
        /// ... but not below this many bytes of weights, where a call's own cost would show.
        const DECODE_MIN_CHUNK_BYTES: usize = 32 << 10;
        /// Below this many bytes of weights per thread, a decode matmul takes a few microseconds
        /// and claiming costs more than it evens out (SmolLM2's matrices: 3% slower decode):
        /// each thread then computes its share in one call.
        const STEAL_MIN_SHARE_BYTES: usize = 1 << 20;
        let w = self.model.weight(weight);
        let bytes = self.model.weight_bytes(weight);
        let n_tok = self.rows_of(out);
        let xq = self.input_bytes(x, 0..n_tok);
        let xrb = self.pg.graph.values[x.0].row_bytes();
        let large = bytes.len() / self.n_threads >= STEAL_MIN_SHARE_BYTES;
        // Decode, of one session or of up to 4 decoding together, streams the weights once
        // and is memory-bound: long chunks first keep each thread's reads sequential, and
        // stealing the short last ones evens out the finish.
        if n_tok <= MATVEC_TOKENS && self.n_threads > 1 && (large || self.steal_all) {
            let min_rows = DECODE_MIN_CHUNK_BYTES
                .div_ceil(bytes.len() / w.n_rows.max(1))
                .max(1);
            let plan = steal::ChunkPlan::guided(
                w.n_rows,
                self.n_threads,
                ROWS_PER_CHUNK,
                DECODE_SHRINK,
                min_rows,
            );
            for rows in self.exec.claims.claimed(plan, self.tag, self.tid) {
                self.matmul_rows(w.ty, w.row_len, bytes, xq, xrb, n_tok, rows, out);
            }
            return;
        }
        let decode = n_tok <= MATVEC_TOKENS;
        // A decode matmul (one session's, or a few decoding together) streams the weights
        // once: one call over the thread's whole share, so that the kernels' prefetching runs
        // ahead across it without a break (and the tokens' scales are converted once).
        // Prefill runs its share in chunks that stay in L2 while the tokens use them. Either
        // way the shares follow the threads' measured speeds in that phase, so that they
        // arrive at the barrier together.
        let balance = self.exec.balance_for(n_tok);
        let mine = if self.balanced {
            balance.share(w.n_rows, self.tid, ROWS_PER_CHUNK)
        } else {
            self.share(w.n_rows, ROWS_PER_CHUNK)
        };
        if mine.is_empty() {
            return;
        }
        let started = self.balanced.then(std::time::Instant::now);
        let chunk = if decode {
            mine.len()
        } else {
            PREFILL_ROWS_PER_CHUNK
        };
        let mut start = mine.start;
        while start < mine.end {
            let end = (start + chunk).min(mine.end);
            self.matmul_rows(w.ty, w.row_len, bytes, xq, xrb, n_tok, start..end, out);
            start = end;
        }
        if let Some(started) = started {
            let row_bytes = bytes.len() / w.n_rows.max(1);
            balance.record(
                self.thread,
                (mine.len() * row_bytes) as u64,
                started.elapsed().as_nanos() as u64,
            );
        }
    }

    /// out[t][rows] = rows `rows` of the weight (type `wt`, rows of `n` values, `bytes`) · x[t]
    /// for every token, in groups of 8 tokens where a kernel takes them (prefill), then of 4,
    /// 3 and 2 (they share each weight row's unpacking: the decode step of sessions running
    /// together, or the end of a prompt chunk), then one at a time.
    #[allow(clippy::too_many_arguments)]
    fn matmul_rows(
        &self,
        wt: GgmlType,
        n: usize,
        bytes: &[u8],
        xq: &[u8],
        xrb: usize,
        n_tok: usize,
        rows: std::ops::Range<usize>,
        out: ValueId,
    ) {
        let k = &self.exec.kernels;
        let mut t = 0;
        if n_tok >= k.panel_min_tokens(wt) && k.panels_for(wt, n, bytes) {
            t = self.panel_groups(wt, n, bytes, xq, xrb, n_tok, &rows, out);
        }
        t = self.token_groups::<{ MATVEC_TOKENS8 }>(out, xq, xrb, t, n_tok, &rows, |xs, ys| {
            k.matvec_tokens8(wt, n, bytes, xs, rows.clone(), ys)
        });
        // A batch of 8 tokens or more: where llama.cpp adds such a batch in another order than
        // one token (Q6_K), the tokens the groups left take that order too.
        if n_tok >= MATVEC_TOKENS8 {
            macro_rules! batched {
                ($n:expr) => {
                    self.token_groups::<{ $n }>(out, xq, xrb, t, n_tok, &rows, |xs, ys| {
                        k.matvec_tokens_batched(wt, n, bytes, xs, rows.clone(), ys)
                    })
                };
            }
            t = batched!(MATVEC_TOKENS);
            t = batched!(3);
            t = batched!(2);
            t = batched!(1);
        }
        // The logits of sessions decoding together need not match one token's bits (their
        // kernel may add in another order: no later layer requantizes them, so the rounding
        // stays that small); their layers, and a prompt's tokens, keep ggml's order.
        let steps = self.args.seqs.is_some() && out == self.pg.graph.output;
        macro_rules! groups_of {
            ($n:expr) => {
                self.token_groups::<{ $n }>(out, xq, xrb, t, n_tok, &rows, |xs, ys| {
                    if steps {
                        k.matvec_steps(wt, n, bytes, xs, rows.clone(), ys)
                    } else {
                        k.matvec_tokens(wt, n, bytes, xs, rows.clone(), ys)
                    }
                })
            };
        }
        t = groups_of!(MATVEC_TOKENS);
        t = groups_of!(3);
        t = groups_of!(2);
        for t in t..n_tok {
            let y = self.output(out, t, rows.clone());
            k.matvec(wt, n, bytes, &xq[t * xrb..(t + 1) * xrb], rows.clone(), y);
        }
    }

    /// The tokens of a prefill matmul 8 at a time through `rows` packed into panels (in this
    /// thread's planned scratch, as many rows as they hold at a time, each packing used by all
    /// the tokens: see `edge_kernels::cpu::Panels`); returns the first token left.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn panel_groups(
        &self,
        wt: GgmlType,
        n: usize,
        bytes: &[u8],
        xq: &[u8],
        xrb: usize,
        n_tok: usize,
        rows: &std::ops::Range<usize>,
        out: ValueId,
    ) -> usize {
        let k = &self.exec.kernels;
        let mut panels = Panels::new(self.scratch());
        let mut t = 0;
        for part in panel_parts(n, rows.clone()) {
            k.pack_panels(wt, n, bytes, part.clone(), &mut panels);
            // Every part stops at the same token group, if one declines (the AVX2 kernel's
            // check of the activations, the same for every part).
            t = self.token_groups::<{ MATVEC_TOKENS8 }>(out, xq, xrb, 0, n_tok, &part, |xs, ys| {
                k.matmul_panels8(&panels, xs, ys)
            });
        }
        t
    }
}
