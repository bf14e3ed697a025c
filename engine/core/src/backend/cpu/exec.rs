//! The CPU executor: runs a planned graph over one arena, the KV cache and the mapped weights,
//! on a persistent thread pool, without allocating.
//!
//! Every thread walks the same op list; each op is split by rows (tokens), weight rows or
//! heads, and the threads meet at a barrier after each op that a later one depends on. A
//! single token's elementwise ops are split by columns instead, and its matmuls' weight rows
//! and attention heads are claimed in chunks, so that a thread that finishes early takes work
//! from the others ([`edge_kernels::steal`]). When the barriers' waits show that a thread of
//! ours is being descheduled (more threads than free cores), runs switch to shared parts
//! ([`edge_kernels::phases`]): each op's shares become parts that any thread claims, and a
//! phase ends when its parts are done, not when every thread has arrived, so the threads that
//! are on a core carry the run (see [`Executor::run`]). The ops are in the files beside this one:
//! `ops.rs` (elementwise ops, norms, embeddings, RoPE), `matmul.rs` and `attention.rs`.
//!
//! Memory safety rests on two facts, checked when the session is built:
//! 1. the arena plan passed [`edge_arena::check_with_inplace`]: values live at the same time
//!    never overlap, except that an elementwise op's output may sit exactly on an input that
//!    dies at that op (`Graph::inplace_pairs`); an op's inputs and output are all live during
//!    the op;
//! 2. within an op, each thread creates mutable slices only of its own part of the output
//!    (rows, columns or chunks it was given or claimed, or those of the shared part it
//!    claimed; and of the KV cache rows of its own tokens, or for one token its own columns),
//!    and no op starts before the ops it reads have finished (a barrier, or the end of a
//!    shared phase), and nobody writes an op's inputs — an op
//!    whose output shares an input's offset never makes a shared slice of that input: it reads
//!    the element through the output slice, before writing it.

use edge_kernels::balance::ShareBalance;
use edge_kernels::cpu::ggml_order::LANES;
use edge_kernels::phases::PhaseCounters;
use edge_kernels::steal;
use edge_kernels::threads::{split_range, SpinBarrier, ThreadPool};
use edge_kernels::Kernels;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::time::Instant;

use crate::graph::{Op, ValueId, ValueType};
use crate::kv::KvCache;
use crate::memory::SharedMem;
use crate::model::Model;
use crate::plan::PlannedGraph;

use super::profile::OpProfile;
use super::shares::{run_phase, share_balance};

/// Whether `EDGE_RUN_DUMP` asks for a per-op trace of values (a debugging aid).
fn dump_enabled() -> bool {
    std::env::var_os("EDGE_RUN_DUMP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// What `EDGE_RUN_SHARED_PARTS` forces: `1` shared parts on every run (tests, and
/// machines known to be oversubscribed), `0` barriers always; unset or anything else: chosen
/// by the barriers' waits.
fn shared_parts_forced() -> Option<bool> {
    match std::env::var("EDGE_RUN_SHARED_PARTS").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

/// Whether `n_threads` are more than the CPUs this process may use (affinity mask and cgroup
/// quota): then some thread is always off its core, and every run takes shared parts from the
/// start. Waiting for the barriers' spin budget to collapse is not enough there: with one
/// thread more than the CPUs, the waits can settle just inside the longest spin (each barrier
/// waiting ~100 µs for a thread the scheduler soon runs again), where the budget keeps growing
/// instead of collapsing: SmolLM2 Q4_1 decoded at 17 tok/s with `-t 3` on 2 CPUs when nothing
/// before the decode had collapsed it (`bench -p 1`), 224 tok/s with shared parts.
fn oversubscribed(n_threads: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|cpus| n_threads > cpus.get())
}

/// Columns per thread part of a decode step's elementwise f32 ops: a whole cache line, so that
/// two threads never write the same line.
pub(super) const F32_GRANULE: usize = 16;

/// A barrier spin budget at or below this (ns) means waits have mostly outlasted the spin: a
/// thread of ours is being descheduled (more threads than free cores).
const CONTENDED_SPIN_NS: u32 = 4 * edge_kernels::wait::SpinBudget::MIN_NS;

/// Shared-part runs in a row none of whose phase waits outlasted the spin, after which runs go
/// back to barriers: nobody was being descheduled any more.
const QUIET_RUNS_TO_LEAVE_SHARED: u32 = 16;

/// Most query heads of one KV head that a job of batched attention takes together.
pub const MAX_HEADS_TOGETHER: usize = 4;

/// The query heads of one KV head that batched attention takes together, for `group` query
/// heads per KV head: the largest divisor of `group` up to [`MAX_HEADS_TOGETHER`]. They read the
/// same key and value rows, which are widened from f16 once for all of them.
pub fn heads_together(group: usize) -> usize {
    heads_together_up_to(group, MAX_HEADS_TOGETHER)
}

/// The largest divisor of `group` (query heads per KV head) up to `cap` (at least 1).
pub(super) fn heads_together_up_to(group: usize, cap: usize) -> usize {
    (1..=cap.min(group.max(1)))
        .rev()
        .find(|g| group.is_multiple_of(*g))
        .unwrap_or(1)
}

/// Most (token, query head) pairs a job of batched attention takes together: the heads taken
/// together ([`heads_together`]) of up to [`tokens_together`] tokens.
pub const MAX_PAIRS_TOGETHER: usize = 8;

/// Consecutive tokens of one sequence that a job of batched attention takes together, with
/// `heads_together` heads each: their keys and values are read from memory once per job
/// instead of once per token (at thousands of positions a layer's cache outgrows the core's
/// L2). At least 1.
pub fn tokens_together(heads_together: usize) -> usize {
    (MAX_PAIRS_TOGETHER / heads_together.max(1)).max(1)
}

/// Bytes of scratch one thread needs for attention over `ctx` positions with heads of
/// `head_dim`, taking `heads_together` query heads at a time in a batch: for one token, one row
/// of scores, the query and the ordered accumulators of the output (64 lanes per output
/// element; see [`edge_kernels::cpu::ggml_order`]); for a batch, the same with 16 lanes for
/// each (token, head) pair taken together ([`tokens_together`] tokens of the heads taken
/// together).
pub fn scratch_bytes_per_thread(ctx: usize, head_dim: usize, heads_together: usize) -> usize {
    let one_token = ctx + head_dim + head_dim * 4 * LANES;
    let pairs = heads_together.max(1) * tokens_together(heads_together);
    let batch = pairs * (ctx + head_dim + head_dim * LANES);
    one_token.max(batch) * 4
}

/// Bytes of scratch one thread needs for the tiled (online-softmax) attention: an f32
/// accumulator and one dequantized value row of one head. Independent of the context.
pub fn online_scratch_bytes_per_thread(head_dim: usize) -> usize {
    2 * head_dim * 4
}

/// A thread's scratch of `attention_bytes` for attention, grown where this CPU may run prefill
/// through packed panels to hold them too (one op uses the scratch at a time: a matmul's
/// panels, or attention's rows).
pub fn with_panels(attention_bytes: usize) -> usize {
    if edge_kernels::cpu::panels_possible() {
        attention_bytes.max(edge_kernels::cpu::PANELS_SCRATCH_BYTES)
    } else {
        attention_bytes
    }
}

/// Everything a run touches besides the model.
pub struct Executor {
    /// Attention runs tiled with an online softmax (always for a q8_0 cache; for f16 when
    /// flash attention was asked for).
    pub(super) online_attention: bool,
    /// Batched attention takes several tokens per job ([`tokens_together`]); off with
    /// `EDGE_RUN_ATTENTION_TILES=0` (same bits either way; for comparisons).
    pub(super) attention_tiles: bool,
    /// Most query heads of one KV head a job of batched attention takes together (its scratch
    /// holds that many heads' scores and accumulators).
    pub(super) heads_together: usize,
    pool: ThreadPool,
    barrier: SpinBarrier,
    pub(super) kernels: Kernels,
    pub(super) arena: SharedMem,
    scratch: SharedMem,
    pub(super) scratch_per_thread: usize,
    /// `EDGE_RUN_DUMP` was set when the executor was built.
    dump: bool,
    /// Decode matmuls' row chunks, claimed by the threads (see [`edge_kernels::steal`]).
    pub(super) claims: steal::RowClaims,
    /// The threads' measured speeds in decode and in prefill runs (`[decode, prefill]`, see
    /// [`run_phase`]), by which the matmuls not claimed in chunks are shared (see
    /// [`edge_kernels::balance`]). Two: a core's speed relative to the others' may differ
    /// between streaming weights from memory and multiplying panels in cache.
    balance: [ShareBalance; 2],
    /// The tag of the next run's first op: each op of each run tags its row claims with a
    /// larger number than any before it.
    next_tag: std::sync::atomic::AtomicUsize,
    /// Claim and completion counts of the shared-part runs.
    phases: PhaseCounters,
    /// Runs use shared parts (the machine is contended).
    shared: AtomicBool,
    /// `EDGE_RUN_SHARED_PARTS` when the executor was built; else `Some(true)` where there are
    /// more threads than CPUs ([`oversubscribed`]).
    shared_forced: Option<bool>,
    /// Shared-part runs in a row without a long phase wait.
    quiet_runs: AtomicU32,
    /// `EDGE_RUN_PROFILE=1`: each thread's time per kind of op (see `profile.rs`).
    profile: Option<OpProfile>,
}

/// Inputs of one run.
#[derive(Clone, Copy)]
pub struct RunArgs<'a> {
    /// Token ids (at most the graph's ubatch).
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
    /// Tokens of different sequences decoded together: token t is at position `seqs[t].pos`
    /// of the sequence whose KV cache is `seqs[t].kv` (one entry per token, each cache at most
    /// once). `None`: one sequence, token t at `pos0 + t` of the run's cache.
    pub seqs: Option<&'a [SeqRow<'a>]>,
}

impl<'a> RunArgs<'a> {
    /// `tokens` of one sequence at positions `pos0..`.
    pub fn one_sequence(tokens: &'a [u32], pos0: usize) -> RunArgs<'a> {
        RunArgs {
            tokens,
            pos0,
            seqs: None,
        }
    }
}

/// Where one token of a run over several sequences goes ([`RunArgs::seqs`]).
#[derive(Clone, Copy)]
pub struct SeqRow<'a> {
    /// The sequence's KV cache (the same shape as every other cache of the run).
    pub kv: &'a KvCache,
    /// The token's position in its sequence.
    pub pos: usize,
}

impl Executor {
    /// An executor with an arena of `arena_bytes` and `n_threads` threads; `online_attention`
    /// picks the tiled online-softmax attention (scratch independent of `ctx`) over the exact
    /// llama.cpp-order one.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arena_bytes: usize,
        n_threads: usize,
        ctx: usize,
        head_dim: usize,
        heads_together: usize,
        online_attention: bool,
        kernels: Kernels,
    ) -> Result<Executor, String> {
        let scratch_per_thread = with_panels(if online_attention {
            online_scratch_bytes_per_thread(head_dim)
        } else {
            scratch_bytes_per_thread(ctx, head_dim, heads_together)
        })
        .next_multiple_of(crate::memory::ALIGN);
        Ok(Executor {
            online_attention,
            attention_tiles: !matches!(
                std::env::var("EDGE_RUN_ATTENTION_TILES").as_deref(),
                Ok("0")
            ),
            heads_together: heads_together.max(1),
            pool: ThreadPool::new(n_threads)?,
            barrier: SpinBarrier::new(n_threads.max(1)),
            kernels,
            arena: SharedMem::new(arena_bytes)?,
            scratch: SharedMem::new(scratch_per_thread * n_threads.max(1))?,
            scratch_per_thread,
            dump: dump_enabled(),
            claims: steal::RowClaims::new(n_threads),
            balance: [share_balance(n_threads), share_balance(n_threads)],
            next_tag: std::sync::atomic::AtomicUsize::new(0),
            phases: PhaseCounters::new(),
            shared: AtomicBool::new(false),
            shared_forced: shared_parts_forced().or_else(|| {
                oversubscribed(n_threads.max(1)).then(|| {
                    log::info!(
                        "threads: {n_threads} on fewer CPUs than that: every run uses shared parts"
                    );
                    true
                })
            }),
            quiet_runs: AtomicU32::new(0),
            profile: OpProfile::from_env(n_threads),
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
    ///
    /// Runs meet at barriers while the threads have the cores to themselves. Once the
    /// barrier's spin budget has collapsed (waits outlasting any spin: a thread of ours is off
    /// its core), runs switch to shared parts, and back after
    /// `QUIET_RUNS_TO_LEAVE_SHARED` runs in which no phase wait outlasted its spin. Both give
    /// the same bits: a part computes what the same thread's share would.
    pub fn run(&self, model: &Model, kv: &KvCache, pg: &PlannedGraph, args: RunArgs<'_>) -> bool {
        assert!(args.tokens.len() <= pg.graph.ubatch && !args.tokens.is_empty());
        match args.seqs {
            None => assert!(args.pos0 + args.tokens.len() <= kv.ctx),
            Some(seqs) => {
                // Each row writes its own cache's row `pos` (the executor's memory safety,
                // fact 2): one row per cache, every position inside it, every cache alike.
                assert_eq!(seqs.len(), args.tokens.len());
                for (i, r) in seqs.iter().enumerate() {
                    assert!(r.pos < r.kv.ctx && r.kv.same_shape(kv));
                    assert!(seqs[..i].iter().all(|o| !std::ptr::eq(o.kv, r.kv)));
                }
            }
        }
        let n = self.n_threads();
        let dump = self.dump;
        // Decided once per run, for every thread alike (a matmul's rows are either all claimed
        // or all split statically): when the barrier's waits have been long, a thread is being
        // descheduled, and every decode matmul lets the others take its rows.
        let contended = self.barrier.spin_nanos() <= CONTENDED_SPIN_NS;
        let tag0 = self
            .next_tag
            .fetch_add(pg.graph.ops.len(), std::sync::atomic::Ordering::Relaxed);
        let can_share = n > 1
            && !dump
            && pg.graph.ops.len() <= PhaseCounters::MAX_OPS
            && self.shared_forced != Some(false);
        let forced = self.shared_forced == Some(true);
        if can_share && (forced || contended || self.shared.load(Relaxed)) {
            self.shared.store(true, Relaxed);
            self.phases.reset(pg.graph.ops.len());
            // Speeds measured while a thread was being descheduled say nothing of its core:
            // barrier runs start again from equal shares.
            for b in &self.balance {
                b.reset();
            }
            let long_wait = AtomicBool::new(false);
            let ok = self.pool.run(&|tid| {
                let base = OpCtx {
                    steal_all: true,
                    ..OpCtx::first_op(self, model, kv, pg, args, tid, tag0)
                };
                self.run_shared(base, &long_wait);
            });
            if forced || long_wait.load(Relaxed) {
                self.quiet_runs.store(0, Relaxed);
            } else if self.quiet_runs.fetch_add(1, Relaxed) + 1 >= QUIET_RUNS_TO_LEAVE_SHARED {
                self.quiet_runs.store(0, Relaxed);
                self.shared.store(false, Relaxed);
                self.barrier.reset_spin();
            }
            return ok;
        }
        let balance = self.balance_for(args.tokens.len());
        let prefill = run_phase(args.tokens.len()) == 1 && n > 1;
        let ok = self.pool.run(&|tid| {
            let base = OpCtx {
                steal_all: contended,
                balanced: n > 1,
                ..OpCtx::first_op(self, model, kv, pg, args, tid, tag0)
            };
            for (i, op) in pg.graph.ops.iter().enumerate() {
                let started = self.profile.as_ref().map(|_| Instant::now());
                base.at_op(i).run(op);
                let ran = started.map(|s| s.elapsed());
                if pg.barrier_after(i) || dump {
                    if prefill && matches!(op, Op::MatMul { .. }) {
                        // A prompt chunk is one run: its shares adapt matmul by matmul, by the
                        // last thread to arrive, while the others wait.
                        self.barrier.wait_then(|| balance.update());
                    } else {
                        self.barrier.wait();
                    }
                }
                if let (Some(p), Some(s), Some(ran)) = (&self.profile, started, ran) {
                    let n_tok = args.tokens.len();
                    p.add(tid, n_tok, op.kind_index(), ran, s.elapsed() - ran);
                }
                if dump && tid == 0 {
                    self.dump_value(pg, op, args.tokens.len());
                }
            }
        });
        if let Some(p) = &self.profile {
            p.count_run(args.tokens.len());
        }
        // Every thread has left the run, and the next one's job post publishes the new
        // weights (see `edge_kernels::balance`).
        balance.update();
        ok
    }

    /// The weights of the matmul shares of runs of `tokens` tokens.
    pub(super) fn balance_for(&self, tokens: usize) -> &ShareBalance {
        &self.balance[run_phase(tokens)]
    }

    /// Each thread's share of the matmuls of decode runs and of prefill runs, relative to an
    /// equal one (see [`edge_kernels::balance`]): where one core runs slower than the others
    /// (a busy host, cores of two kinds), it gets fewer rows.
    pub fn share_weights(&self) -> [Vec<f32>; 2] {
        [
            self.balance[0].relative_weights(),
            self.balance[1].relative_weights(),
        ]
    }

    /// One thread's (`base.thread`) walk of a shared-part run: in each phase (the ops up to
    /// the next barrier) it claims parts of each op until none is left, then waits for the
    /// phase's parts to be done. A thread that was off its core finds the parts of the ops it
    /// missed claimed, and passes their phases at once.
    fn run_shared(&self, base: OpCtx<'_>, long_wait: &AtomicBool) {
        let pg = base.pg;
        let ops = &pg.graph.ops;
        let n = self.n_threads();
        let mut first = 0;
        while first < ops.len() {
            let last = (first..ops.len())
                .find(|&j| pg.barrier_after(j))
                .unwrap_or(ops.len() - 1);
            let total = n * (last - first + 1);
            for (i, op) in ops.iter().enumerate().take(last + 1).skip(first) {
                while let Some(part) = self.phases.claim(i, n) {
                    OpCtx {
                        tid: part,
                        ..base.at_op(i)
                    }
                    .run(op);
                    self.phases.finish(last, total);
                }
            }
            // After the last phase, the pool's job end is the wait.
            if pg.barrier_after(last) && self.phases.wait(last, total) {
                long_wait.store(true, Relaxed);
            }
            first = last + 1;
        }
    }

    /// Prints the first and last values and the sum of an op's output (last row) to stderr,
    /// in the format of llama.cpp's `llama-eval-callback`, to locate numeric differences.
    fn dump_value(&self, pg: &PlannedGraph, op: &Op, n_tokens: usize) {
        let Some(o) = op.output() else { return };
        let v = &pg.graph.values[o.0];
        if v.ty != ValueType::F32 || v.cols < 6 {
            return;
        }
        let row = v.rows.min(n_tokens) - 1;
        // SAFETY: called between ops, after the barrier, by one thread: nothing writes the arena.
        let x = unsafe {
            self.arena
                .slice::<f32>(pg.offsets[o.0] + row * v.cols * 4, v.cols)
        };
        let sum: f64 = x.iter().map(|&a| f64::from(a)).sum();
        let c = v.cols;
        eprintln!(
            "{:32} [{:.4}, {:.4}, {:.4}, ..., {:.4}, {:.4}, {:.4}] sum = {:.6}",
            v.name,
            x[0],
            x[1],
            x[2],
            x[c - 3],
            x[c - 2],
            x[c - 1],
            sum
        );
    }

    /// The f32 contents of `value` (first `rows` rows), e.g. the logits after a run.
    pub fn read_f32(&self, pg: &PlannedGraph, value: ValueId, rows: usize) -> &[f32] {
        let v = &pg.graph.values[value.0];
        // SAFETY: no run is in progress (runs take &self and return before we are called
        // again; callers hold the session mutably while running), so nothing writes the arena.
        unsafe {
            self.arena
                .slice::<f32>(pg.offsets[value.0], rows.min(v.rows) * v.cols)
        }
    }
}

impl Drop for Executor {
    /// Tells `-v` the profile, if one was asked for, and where the threads' speeds differed
    /// enough to share the rows unequally.
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            for line in p.report() {
                log::info!("{line}");
            }
        }
        for (w, phase) in self.share_weights().iter().zip(["decode", "prefill"]) {
            if w.iter().any(|&x| (x - 1.0).abs() >= 0.05) {
                let shares: Vec<String> = w.iter().map(|x| format!("{x:.2}")).collect();
                log::info!(
                    "threads: {phase} matmul shares at the end, by measured speed: {} of an \
                     equal share",
                    shares.join(" / ")
                );
            }
        }
    }
}

/// What one thread needs to run its share of one op.
#[derive(Clone, Copy)]
pub(super) struct OpCtx<'a> {
    pub(super) exec: &'a Executor,
    pub(super) model: &'a Model,
    pub(super) kv: &'a KvCache,
    pub(super) pg: &'a PlannedGraph,
    pub(super) args: RunArgs<'a>,
    /// Which share of the op this is (the thread's own, or the shared part it claimed).
    pub(super) tid: usize,
    /// The thread running it (whose scratch it uses).
    pub(super) thread: usize,
    pub(super) n_threads: usize,
    /// Tags this op's row claims: consecutive ops have consecutive tags.
    pub(super) tag: usize,
    /// Every decode matmul claims its rows in chunks, whatever its size (the machine is
    /// contended: see [`CONTENDED_SPIN_NS`]).
    pub(super) steal_all: bool,
    /// The matmuls not claimed in chunks are shared by the threads' measured speeds, and
    /// timed (runs that meet at barriers, each thread with its own share; not shared-part
    /// runs, whose parts any thread may take).
    pub(super) balanced: bool,
}

impl<'a> OpCtx<'a> {
    /// Thread `thread`'s own share of the run's first op (tagged `tag0`); `steal_all` off.
    fn first_op(
        exec: &'a Executor,
        model: &'a Model,
        kv: &'a KvCache,
        pg: &'a PlannedGraph,
        args: RunArgs<'a>,
        thread: usize,
        tag0: usize,
    ) -> OpCtx<'a> {
        OpCtx {
            exec,
            model,
            kv,
            pg,
            args,
            tid: thread,
            thread,
            n_threads: exec.n_threads(),
            tag: tag0,
            steal_all: false,
            balanced: false,
        }
    }

    /// The same for op `i` of the run (whose claims carry the first op's tag plus `i`).
    fn at_op(self, i: usize) -> OpCtx<'a> {
        OpCtx {
            tag: self.tag.wrapping_add(i),
            ..self
        }
    }
}

impl<'a> OpCtx<'a> {
    /// Tokens of this run.
    pub(super) fn n_tokens(&self) -> usize {
        self.args.tokens.len()
    }

    /// The position of token `t` in its sequence.
    pub(super) fn pos(&self, t: usize) -> usize {
        match self.args.seqs {
            Some(seqs) => seqs[t].pos,
            None => self.args.pos0 + t,
        }
    }

    /// The KV cache of token `t`'s sequence.
    pub(super) fn kv_of(&self, t: usize) -> &'a KvCache {
        match self.args.seqs {
            Some(seqs) => seqs[t].kv,
            None => self.kv,
        }
    }

    /// Rows of `v` this run uses.
    pub(super) fn rows_of(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].rows.min(self.n_tokens())
    }

    /// Elements per row of `v`.
    pub(super) fn cols(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].cols
    }

    /// Whether the plan put `out` exactly on `input` (an in-place op).
    pub(super) fn aliases(&self, out: ValueId, input: ValueId) -> bool {
        out != input && self.pg.offsets[out.0] == self.pg.offsets[input.0]
    }

    /// My share of `0..n` with the given granule.
    pub(super) fn share(&self, n: usize, granule: usize) -> std::ops::Range<usize> {
        split_range(n, self.tid, self.n_threads, granule)
    }

    /// This thread's part of an op over `rows` rows of `cols` independent columns: its share
    /// of the rows and every column (prefill), or, with fewer rows than threads (decode), every
    /// row and its share of the columns in whole `granule`s — one token's elementwise ops would
    /// otherwise run on one thread while the others wait.
    pub(super) fn share_rows_or_cols(
        &self,
        rows: usize,
        cols: usize,
        granule: usize,
    ) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        if rows >= self.n_threads {
            (self.share(rows, 1), 0..cols)
        } else {
            (0..rows, self.share(cols, granule))
        }
    }

    /// Rows `rows` of f32 value `v`, read-only.
    pub(super) fn input(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[f32] {
        let cols = self.cols(v);
        // SAFETY: inputs are not written during the op (module docs, fact 2).
        unsafe {
            self.exec.arena.slice::<f32>(
                self.pg.offsets[v.0] + rows.start * cols * 4,
                rows.len() * cols,
            )
        }
    }

    /// Raw rows of a quantized value, read-only.
    pub(super) fn input_bytes(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[u8] {
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
    pub(super) fn output(
        &self,
        v: ValueId,
        row: usize,
        range: std::ops::Range<usize>,
    ) -> &mut [f32] {
        let cols = self.cols(v);
        debug_assert!(range.end <= cols);
        // SAFETY: each thread asks only for its own disjoint part of the output (fact 2), and
        // the output does not overlap any input (fact 1).
        unsafe {
            self.exec.arena.slice_mut::<f32>(
                self.pg.offsets[v.0] + (row * cols + range.start) * 4,
                range.len(),
            )
        }
    }

    #[allow(clippy::mut_from_ref)]
    pub(super) fn output_bytes(&self, v: ValueId, row: usize) -> &mut [u8] {
        let rb = self.pg.graph.values[v.0].row_bytes();
        // SAFETY: as `output`; a thread writes only its own rows.
        unsafe {
            self.exec
                .arena
                .slice_mut::<u8>(self.pg.offsets[v.0] + row * rb, rb)
        }
    }

    #[allow(clippy::mut_from_ref)]
    pub(super) fn scratch(&self) -> &mut [f32] {
        let per = self.exec.scratch_per_thread;
        // SAFETY: each thread uses only its own scratch slot, one part at a time.
        unsafe {
            self.exec
                .scratch
                .slice_mut::<f32>(self.thread * per, per / 4)
        }
    }

    /// Runs this thread's share of `op`.
    pub(super) fn run(&self, op: &Op) {
        match *op {
            Op::Embed { table, out } => self.embed(table, out),
            Op::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => self.rms_norm(x, weight, eps, out),
            Op::Quantize { x, out } => self.quantize(x, out),
            Op::MatMul { weight, x, out } => self.matmul(weight, x, out),
            Op::Rope {
                x,
                head_dim,
                rope,
                freq_factors,
                out,
            } => self.rope(x, head_dim, rope, freq_factors, out),
            Op::StoreKv {
                k,
                v,
                layer,
                head_dim,
            } => self.store_kv(k, v, layer, head_dim),
            Op::Attention(a) => self.attention_op(a),
            Op::Add { a, b, out } => self.add(a, b, out),
            Op::SwiGlu { gate, up, out } => self.swiglu(gate, up, out),
            Op::TakeLast { x, out } => self.take_last(x, out),
            Op::AddTableRow { x, table, row, out } => self.add_table_row(x, table, row, out),
            Op::LayerNorm {
                x,
                weight,
                bias,
                eps,
                out,
            } => self.layer_norm(x, weight, bias, eps, out),
            Op::Gelu { x, out } => self.gelu(x, out),
            Op::EncoderAttention {
                q,
                k,
                v,
                n_head,
                head_dim,
                scale,
                out,
            } => self.encoder_attention(q, k, v, n_head, head_dim, scale, out),
            Op::Pool { x, pooling, out } => self.pool(x, pooling, out),
            Op::AddBias { x, bias, out } => {
                let b = self.model.weight_f32(bias);
                self.unary(x, out, |c, v| v + b[c]);
            }
            Op::Scale { x, factor, out } => self.unary(x, out, |_, v| v * factor),
            Op::SoftCap { x, cap, out } => {
                let inv = 1.0 / cap;
                self.unary(x, out, |_, v| (v * inv).tanh() * cap);
            }
            Op::HeadRmsNorm {
                x,
                weight,
                eps,
                head_dim,
                out,
            } => self.head_rms_norm(x, weight, eps, head_dim, out),
            Op::GeGlu { gate, up, out } => self.geglu(gate, up, out),
            Op::Columns { x, start, out } => self.columns(x, start, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::oversubscribed;

    #[test]
    fn more_threads_than_cpus_is_oversubscribed() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(!oversubscribed(cpus));
        assert!(!oversubscribed(1));
        assert!(oversubscribed(cpus + 1));
    }
}
