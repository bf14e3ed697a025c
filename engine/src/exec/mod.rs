//! The CPU executor: runs a planned graph over one arena, the KV cache and the mapped weights,
//! on a persistent thread pool, without allocating.
//!
//! Every thread walks the same op list; each op is split by rows (tokens), weight rows or
//! heads, and the threads meet at a barrier after each op.
//!
//! Memory safety rests on two facts, checked when the session is built:
//! 1. the arena plan passed [`edge_arena::check`]: values live at the same time never overlap,
//!    and an op's inputs and output are all live during the op;
//! 2. within an op, each thread creates mutable slices only of its own part of the output
//!    (and of the KV cache rows of its own tokens), and nobody writes an op's inputs.

pub mod memory;

use half::f16;

use crate::cpu::{self, Kernels};
use crate::graph::{Graph, Op, Rope, RopeOrdering, ValueId};
use crate::model::Model;
use crate::threads::{split_range, SpinBarrier, ThreadPool};
use memory::SharedMem;

/// Keys and values of every layer for `ctx` positions, as f16 rows of `kv_dim` elements.
pub struct KvCache {
    mem: SharedMem,
    n_layer: usize,
    ctx: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Allocates the cache (zeroed).
    pub fn new(n_layer: usize, ctx: usize, kv_dim: usize) -> Result<KvCache, String> {
        let bytes = KvCache::bytes_for(n_layer, ctx, kv_dim);
        Ok(KvCache {
            mem: SharedMem::new(bytes)?,
            n_layer,
            ctx,
            kv_dim,
        })
    }

    /// Bytes a cache of this shape takes.
    pub fn bytes_for(n_layer: usize, ctx: usize, kv_dim: usize) -> usize {
        2 * n_layer * ctx * kv_dim * std::mem::size_of::<f16>()
    }

    /// Positions the cache holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }

    /// Byte offset of row `pos` of the keys (v = false) or values (v = true) of `layer`.
    fn row_offset(&self, layer: usize, v: bool, pos: usize) -> usize {
        debug_assert!(layer < self.n_layer && pos < self.ctx);
        (((2 * layer + usize::from(v)) * self.ctx + pos) * self.kv_dim) * 2
    }
}

/// A graph with its arena offsets.
pub struct PlannedGraph {
    /// The graph.
    pub graph: Graph,
    /// Byte offset of each value in the arena.
    pub offsets: Vec<usize>,
}

/// Per-thread scratch: room for one head's query and accumulator and one tile of scores.
pub const ATTENTION_TILE: usize = 32;

/// Bytes of scratch one thread needs for heads of `head_dim`.
pub fn scratch_bytes_per_thread(head_dim: usize) -> usize {
    (2 * head_dim + ATTENTION_TILE) * 4
}

/// Everything a run touches besides the model.
pub struct Executor {
    pool: ThreadPool,
    barrier: SpinBarrier,
    kernels: Kernels,
    arena: SharedMem,
    scratch: SharedMem,
    scratch_per_thread: usize,
}

/// Inputs of one run.
#[derive(Clone, Copy)]
pub struct RunArgs<'a> {
    /// Token ids (at most the graph's ubatch).
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
}

impl Executor {
    /// An executor with an arena of `arena_bytes` and `n_threads` threads.
    pub fn new(arena_bytes: usize, n_threads: usize, head_dim: usize, kernels: Kernels) -> Result<Executor, String> {
        let scratch_per_thread = scratch_bytes_per_thread(head_dim).next_multiple_of(memory::ALIGN);
        Ok(Executor {
            pool: ThreadPool::new(n_threads),
            barrier: SpinBarrier::new(n_threads.max(1)),
            kernels,
            arena: SharedMem::new(arena_bytes)?,
            scratch: SharedMem::new(scratch_per_thread * n_threads.max(1))?,
            scratch_per_thread,
        })
    }

    /// Threads used per op.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Bytes of the arena.
    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    /// Bytes of per-thread scratch.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.len()
    }

    /// The kernels in use.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Runs the graph for `args.tokens` at positions `pos0..`; the caller has checked that the
    /// tokens fit the graph's ubatch and the cache. Returns false if a thread panicked (a bug).
    pub fn run(&self, model: &Model, kv: &KvCache, pg: &PlannedGraph, args: RunArgs<'_>) -> bool {
        assert!(args.tokens.len() <= pg.graph.ubatch && !args.tokens.is_empty());
        assert!(args.pos0 + args.tokens.len() <= kv.ctx);
        let n = self.n_threads();
        self.pool.run(&|tid| {
            for op in &pg.graph.ops {
                let ctx = OpCtx {
                    exec: self,
                    model,
                    kv,
                    pg,
                    args,
                    tid,
                    n_threads: n,
                };
                ctx.run(op);
                self.barrier.wait();
            }
        })
    }

    /// The f32 contents of `value` (first `rows` rows), e.g. the logits after a run.
    pub fn read_f32(&self, pg: &PlannedGraph, value: ValueId, rows: usize) -> &[f32] {
        let v = &pg.graph.values[value.0];
        // SAFETY: no run is in progress (runs take &self and return before we are called
        // again; callers hold the session mutably while running), so nothing writes the arena.
        unsafe { self.arena.slice::<f32>(pg.offsets[value.0], rows.min(v.rows) * v.cols) }
    }
}

/// What one thread needs to run its share of one op.
struct OpCtx<'a> {
    exec: &'a Executor,
    model: &'a Model,
    kv: &'a KvCache,
    pg: &'a PlannedGraph,
    args: RunArgs<'a>,
    tid: usize,
    n_threads: usize,
}

impl OpCtx<'_> {
    fn n_tokens(&self) -> usize {
        self.args.tokens.len()
    }

    fn rows_of(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].rows.min(self.n_tokens())
    }

    fn cols(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].cols
    }

    /// My share of `0..n` with the given granule.
    fn share(&self, n: usize, granule: usize) -> std::ops::Range<usize> {
        split_range(n, self.tid, self.n_threads, granule)
    }

    /// Rows `rows` of f32 value `v`, read-only.
    fn input(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[f32] {
        let cols = self.cols(v);
        // SAFETY: inputs are not written during the op (module docs, fact 2).
        unsafe {
            self.exec
                .arena
                .slice::<f32>(self.pg.offsets[v.0] + rows.start * cols * 4, rows.len() * cols)
        }
    }

    /// Raw rows of a quantized value, read-only.
    fn input_bytes(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[u8] {
        let rb = self.pg.graph.values[v.0].row_bytes();
        // SAFETY: as `input`.
        unsafe {
            self.exec
                .arena
                .slice::<u8>(self.pg.offsets[v.0] + rows.start * rb, rows.len() * rb)
        }
    }

    /// Elements `range` of row `row` of f32 value `v`, for writing.
    #[allow(clippy::mut_from_ref)]
    fn output(&self, v: ValueId, row: usize, range: std::ops::Range<usize>) -> &mut [f32] {
        let cols = self.cols(v);
        debug_assert!(range.end <= cols);
        // SAFETY: each thread asks only for its own disjoint part of the output (fact 2), and
        // the output does not overlap any input (fact 1).
        unsafe {
            self.exec
                .arena
                .slice_mut::<f32>(self.pg.offsets[v.0] + (row * cols + range.start) * 4, range.len())
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn output_bytes(&self, v: ValueId, row: usize) -> &mut [u8] {
        let rb = self.pg.graph.values[v.0].row_bytes();
        // SAFETY: as `output`; a thread writes only its own rows.
        unsafe { self.exec.arena.slice_mut::<u8>(self.pg.offsets[v.0] + row * rb, rb) }
    }

    #[allow(clippy::mut_from_ref)]
    fn scratch(&self) -> &mut [f32] {
        let per = self.exec.scratch_per_thread;
        // SAFETY: each thread uses only its own scratch slot.
        unsafe { self.exec.scratch.slice_mut::<f32>(self.tid * per, per / 4) }
    }

    fn run(&self, op: &Op) {
        match *op {
            Op::Embed { table, out } => self.embed(table, out),
            Op::RmsNorm { x, weight, eps, out } => self.rms_norm(x, weight, eps, out),
            Op::Quantize { x, out } => self.quantize(x, out),
            Op::MatMul { weight, x, out } => self.matmul(weight, x, out),
            Op::Rope { x, head_dim, rope, out } => self.rope(x, head_dim, rope, out),
            Op::StoreKv { k, v, layer } => self.store_kv(k, v, layer),
            Op::Attention {
                q,
                layer,
                n_head,
                n_head_kv,
                head_dim,
                scale,
                out,
            } => self.attention(q, layer, n_head, n_head_kv, head_dim, scale, out),
            Op::Add { a, b, out } => {
                let cols = self.cols(out);
                for t in self.share(self.rows_of(out), 1) {
                    let (a, b) = (self.input(a, t..t + 1), self.input(b, t..t + 1));
                    for ((o, x), y) in self.output(out, t, 0..cols).iter_mut().zip(a).zip(b) {
                        *o = x + y;
                    }
                }
            }
            Op::SwiGlu { gate, up, out } => {
                let cols = self.cols(out);
                for t in self.share(self.rows_of(out), 1) {
                    let (g, u) = (self.input(gate, t..t + 1), self.input(up, t..t + 1));
                    cpu::swiglu(g, u, self.output(out, t, 0..cols));
                }
            }
            Op::TakeLast { x, out } => {
                if self.tid == 0 {
                    let last = self.n_tokens() - 1;
                    let cols = self.cols(out);
                    self.output(out, 0, 0..cols).copy_from_slice(self.input(x, last..last + 1));
                }
            }
        }
    }

    fn embed(&self, table: crate::graph::WeightId, out: ValueId) {
        let w = self.model.weight(table);
        let bytes = self.model.weight_bytes(table);
        let row_bytes = w.ty.row_bytes(w.row_len as u64).unwrap_or(0) as usize;
        for t in self.share(self.n_tokens(), 1) {
            let id = self.args.tokens[t] as usize;
            let dst = self.output(out, t, 0..w.row_len);
            if id < w.n_rows {
                let src = &bytes[id * row_bytes..(id + 1) * row_bytes];
                if cpu::dequantize_row(w.ty, src, dst).is_err() {
                    dst.fill(0.0);
                }
            } else {
                // Ids are validated by the session; a zero row keeps a bug from reading out of bounds.
                dst.fill(0.0);
            }
        }
    }

    fn rms_norm(&self, x: ValueId, weight: crate::graph::WeightId, eps: f32, out: ValueId) {
        let w = self.model.weight_f32(weight);
        let cols = self.cols(out);
        for t in self.share(self.rows_of(out), 1) {
            cpu::rms_norm(self.input(x, t..t + 1), w, eps, self.output(out, t, 0..cols));
        }
    }

    fn quantize(&self, x: ValueId, out: ValueId) {
        let ty = match self.pg.graph.values[out.0].ty {
            crate::graph::ValueType::Quantized(t) => t,
            crate::graph::ValueType::F32 => crate::tensor::GgmlType::F32,
        };
        for t in self.share(self.rows_of(out), 1) {
            // Lengths come from the graph, built with whole blocks; an error would be a bug.
            let _ = cpu::quantize_row(ty, self.input(x, t..t + 1), self.output_bytes(out, t));
        }
    }

    fn matmul(&self, weight: crate::graph::WeightId, x: ValueId, out: ValueId) {
        /// Weight rows per chunk: small enough to stay in L1/L2 while every token uses them.
        const ROWS_PER_CHUNK: usize = 16;
        let w = self.model.weight(weight);
        let bytes = self.model.weight_bytes(weight);
        let n_tok = self.rows_of(out);
        let mine = self.share(w.n_rows, ROWS_PER_CHUNK);
        let xq = self.input_bytes(x, 0..n_tok);
        let xrb = self.pg.graph.values[x.0].row_bytes();
        let mut start = mine.start;
        while start < mine.end {
            let end = (start + ROWS_PER_CHUNK).min(mine.end);
            for t in 0..n_tok {
                let y = self.output(out, t, start..end);
                self.exec.kernels.matvec(
                    w.ty,
                    w.row_len,
                    bytes,
                    &xq[t * xrb..(t + 1) * xrb],
                    start..end,
                    y,
                );
            }
            start = end;
        }
    }

    fn rope(&self, x: ValueId, head_dim: usize, rope: Rope, out: ValueId) {
        let cols = self.cols(out);
        let n_heads = cols / head_dim;
        let half = rope.n_rot / 2;
        let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
        for t in self.share(self.rows_of(out), 1) {
            let src = self.input(x, t..t + 1);
            let dst = self.output(out, t, 0..cols);
            dst.copy_from_slice(src);
            let pos = (self.args.pos0 + t) as f32;
            // theta_i = pos * scale * base^(-2i/n_rot), by the same recurrence ggml uses so the
            // rounding matches the reference.
            let mut theta = pos;
            for i in 0..half {
                let (sin, cos) = (theta * rope.freq_scale).sin_cos();
                for h in 0..n_heads {
                    let base = h * head_dim;
                    let (a, b) = match rope.ordering {
                        RopeOrdering::Normal => (base + 2 * i, base + 2 * i + 1),
                        RopeOrdering::NeoX => (base + i, base + i + half),
                    };
                    let (x0, x1) = (src[a], src[b]);
                    dst[a] = x0 * cos - x1 * sin;
                    dst[b] = x0 * sin + x1 * cos;
                }
                theta *= theta_scale;
            }
        }
    }

    fn store_kv(&self, k: ValueId, v: ValueId, layer: usize) {
        let kv_dim = self.kv.kv_dim;
        for t in self.share(self.n_tokens(), 1) {
            let pos = self.args.pos0 + t;
            for (is_v, src) in [(false, k), (true, v)] {
                let src = self.input(src, t..t + 1);
                // SAFETY: row `pos` of this layer is written only by the thread that owns token
                // t, and no attention op reads the cache during this op.
                let dst = unsafe {
                    self.kv
                        .mem
                        .slice_mut::<f16>(self.kv.row_offset(layer, is_v, pos), kv_dim)
                };
                cpu::f32_to_f16_row(src, dst);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: ValueId,
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
        out: ValueId,
    ) {
        let group = n_head / n_head_kv;
        let n_tok = self.n_tokens();
        let kv_dim = self.kv.kv_dim;
        let scratch = self.scratch();
        let (qh, rest) = scratch.split_at_mut(head_dim);
        let (acc, rest) = rest.split_at_mut(head_dim);
        let scores = &mut rest[..ATTENTION_TILE];
        for job in self.share(n_tok * n_head, 1) {
            let (t, h) = (job / n_head, job % n_head);
            let kvh = h / group;
            let n_pos = self.args.pos0 + t + 1;
            // The query is rounded to f16 as the reference does before its f16 K·Q products.
            for (d, s) in qh.iter_mut().zip(&self.input(q, t..t + 1)[h * head_dim..(h + 1) * head_dim]) {
                *d = f16::from_f32(*s).to_f32();
            }
            // Pass 1, tile by tile: the maximum score and the softmax denominator, rescaled
            // online whenever the maximum grows. No score buffer longer than a tile exists.
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0.0f64;
            let mut p0 = 0;
            while p0 < n_pos {
                let tile = (n_pos - p0).min(ATTENTION_TILE);
                self.scores(layer, kvh, head_dim, scale, qh, p0, &mut scores[..tile]);
                let tile_max = scores[..tile].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if tile_max > max {
                    sum *= f64::from((max - tile_max).exp());
                    max = tile_max;
                }
                sum += scores[..tile].iter().map(|&s| f64::from((s - max).exp())).sum::<f64>();
                p0 += tile;
            }
            // Pass 2: recompute the scores, turn them into probabilities and accumulate V.
            // Probabilities are rounded to f16, as the reference rounds them before its f16
            // V·P product: attention is sensitive enough that this rounding shows in the logits.
            let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
            acc.fill(0.0);
            let mut p0 = 0;
            while p0 < n_pos {
                let tile = (n_pos - p0).min(ATTENTION_TILE);
                self.scores(layer, kvh, head_dim, scale, qh, p0, &mut scores[..tile]);
                for (j, &s) in scores[..tile].iter().enumerate() {
                    let p = f16::from_f32((s - max).exp() * inv).to_f32();
                    // SAFETY: the cache is only read during attention (see `scores`).
                    let vrow = unsafe {
                        self.kv
                            .mem
                            .slice::<f16>(self.kv.row_offset(layer, true, p0 + j), kv_dim)
                    };
                    cpu::axpy_f16(acc, p, &vrow[kvh * head_dim..(kvh + 1) * head_dim]);
                }
                p0 += tile;
            }
            self.output(out, t, h * head_dim..(h + 1) * head_dim)
                .copy_from_slice(acc);
        }
    }

    /// Scores of query head `qh` (already f16-rounded) against keys `p0..p0+out.len()` of KV head
    /// `kvh` of `layer`, times `scale`.
    #[allow(clippy::too_many_arguments)]
    fn scores(&self, layer: usize, kvh: usize, head_dim: usize, scale: f32, qh: &[f32], p0: usize, out: &mut [f32]) {
        let kv_dim = self.kv.kv_dim;
        for (j, s) in out.iter_mut().enumerate() {
            // SAFETY: the cache is only read during attention: StoreKv wrote it before the
            // barrier that precedes this op, and nothing writes it until the next StoreKv.
            let krow = unsafe {
                self.kv
                    .mem
                    .slice::<f16>(self.kv.row_offset(layer, false, p0 + j), kv_dim)
            };
            *s = cpu::dot_f16_f32(&krow[kvh * head_dim..(kvh + 1) * head_dim], qh) * scale;
        }
    }
}
