//! A session: one conversation's state over a shared [`Model`] — its KV cache, its arena (one
//! allocation, planned before the first token) and its threads.

use std::sync::Arc;

use crate::arch;
use crate::cpu::Kernels;
use crate::device::{CudaMemory, Device};
use crate::error::{EngineError, Result};
use crate::exec::{
    memory::ALIGN, online_scratch_bytes_per_thread, scratch_bytes_per_thread, Executor, KvCache,
    PlannedGraph, RunArgs,
};
use crate::gguf::HugePages;
use crate::graph::Graph;
use crate::model::Model;

/// Default context size when none is given (capped by the model's trained context).
pub const DEFAULT_CTX: usize = 4096;
/// Most threads a session may use.
pub const MAX_THREADS: usize = 1024;
/// Default prompt chunk (tokens per prefill run).
pub const DEFAULT_UBATCH: usize = 512;

/// How to size a session.
#[derive(Debug, Clone, Default)]
pub struct SessionConfig {
    /// Context size in tokens (KV cache positions); `None`: min(4096, trained context).
    pub ctx: Option<usize>,
    /// Tokens per prefill run; `None`: min(512, ctx).
    pub ubatch: Option<usize>,
    /// Threads; `None`: the available cores.
    pub threads: Option<usize>,
    /// Element type of the KV cache (f16 by default).
    pub kv_type: crate::exec::KvType,
    /// Tiled (flash-style, online-softmax) attention for an f16 cache too, with scratch that
    /// does not grow with the context. Off by default: the exact path reproduces llama.cpp's
    /// logits bit for bit. A q8_0 cache always uses the tiled attention.
    pub flash_attn: bool,
    /// Where the session runs (the CPU by default; see [`crate::device::default_device`]).
    pub device: Device,
    /// CUDA only: how the weights reach the device (`None`: chosen from the device's
    /// attributes, or `EDGE_RUN_CUDA_WEIGHTS`).
    pub cuda_weights: Option<crate::device::WeightPath>,
}

/// What a session does when a run needs more positions than its context holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextPolicy {
    /// Refuse the run with [`EngineError::ContextFull`] (the default): the caller decides.
    #[default]
    Stop,
    /// Shift the context as llama.cpp's `--context-shift` does: keep the first `keep`
    /// positions (e.g. 1 for the BOS token, or the tokens of a system prompt), drop the oldest
    /// half of the rest, move the remaining positions down and re-rotate their keys, then go
    /// on. The model then no longer sees the dropped tokens.
    Shift {
        /// Positions at the start that are never dropped.
        keep: usize,
    },
}

/// Memory a session owns, computed from its plan. Weights are mapped from the file, not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    /// Mapped weight bytes the graph reads.
    pub weights_bytes: u64,
    /// KV cache.
    pub kv_bytes: u64,
    /// Arena (all activations), as planned.
    pub arena_bytes: u64,
    /// Peak of simultaneously-live activation bytes: no plan can be smaller.
    pub arena_lower_bound_bytes: u64,
    /// Per-thread scratch of the kernels.
    pub scratch_bytes: u64,
    /// Heap of the loaded model besides its weights (tokenizer, metadata), as measured at load
    /// ([`Model::runtime_bytes`]); shared by all sessions of the model, not planned, not
    /// charged to a budget, but part of the total the process uses.
    pub runtime_bytes: u64,
}

impl MemoryReport {
    /// What the session allocates: KV cache + arena + scratch (weights excluded: mapped).
    pub fn owned_bytes(&self) -> u64 {
        self.kv_bytes + self.arena_bytes + self.scratch_bytes
    }

    /// Owned bytes plus the mapped weights: what a budget that counts weights is charged.
    pub fn owned_with_weights_bytes(&self) -> u64 {
        self.owned_bytes() + self.weights_bytes
    }

    /// Everything the process holds for the model and this session: owned, mapped weights and
    /// the model's runtime heap.
    pub fn total_bytes(&self) -> u64 {
        self.owned_with_weights_bytes() + self.runtime_bytes
    }
}

/// Plans `graph` into an arena and proves the plan sound (the executor's memory safety
/// depends on it, so this runs in every build, not only in debug).
pub fn plan_graph(graph: Graph) -> Result<(PlannedGraph, usize, usize)> {
    let buffers = graph.buffers(ALIGN);
    let inplace = graph.inplace_pairs();
    let plan = edge_arena::plan_with_inplace(&buffers, &inplace)
        .map_err(|e| EngineError::Plan(e.to_string()))?;
    edge_arena::check_with_inplace(&buffers, &plan.offsets, plan.size, &inplace)
        .map_err(|e| EngineError::Plan(e.to_string()))?;
    Ok((
        PlannedGraph::new(graph, plan.offsets),
        plan.size,
        plan.lower_bound,
    ))
}

/// Everything a session will own, planned but not allocated: the resolved sizes, the planned
/// graphs and the [`MemoryReport`]. `edge-run plan` and budget checks use it to answer "will it
/// fit?" before anything is allocated; [`Session::new`] allocates exactly what it says.
pub struct SessionPlan {
    /// Context size in tokens.
    pub ctx: usize,
    /// Tokens per prefill run.
    pub ubatch: usize,
    /// Threads.
    pub threads: usize,
    /// KV cache element type.
    pub kv_type: crate::exec::KvType,
    /// Attention runs tiled with an online softmax (flash attention asked for, or a q8_0
    /// cache).
    pub flash_attn: bool,
    /// Memory the session will hold.
    pub report: MemoryReport,
    /// Where it runs.
    pub device: Device,
    /// CUDA sessions: the device allocations (arena, KV cache, weights uploaded, scratch).
    pub cuda: Option<CudaMemory>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    cuda_weights: Option<crate::device::WeightPath>,
    decode: PlannedGraph,
    prefill: Option<PlannedGraph>,
}

impl std::fmt::Debug for SessionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionPlan")
            .field("ctx", &self.ctx)
            .field("ubatch", &self.ubatch)
            .field("threads", &self.threads)
            .field("report", &self.report)
            .finish()
    }
}

impl SessionPlan {
    /// Resolves the configuration's defaults, builds and plans the graphs, and computes the
    /// memory report. Allocates nothing that grows with the context.
    pub fn new(model: &Model, cfg: &SessionConfig) -> Result<SessionPlan> {
        let p = &model.params;
        if model.layout.is_encoder() {
            return Err(EngineError::InvalidArgument(format!(
                "this is an encoder (embedding) model ({}): it computes embeddings, not next-token logits; use `edge-run embed` (the library's embed::Embedder)",
                p.arch
            )));
        }
        let ctx = cfg.ctx.unwrap_or(DEFAULT_CTX.min(p.n_ctx_train));
        if ctx == 0 {
            return Err(EngineError::InvalidArgument(
                "--ctx must be at least 1".into(),
            ));
        }
        let ubatch = cfg.ubatch.unwrap_or(DEFAULT_UBATCH).min(ctx);
        if ubatch == 0 {
            return Err(EngineError::InvalidArgument(
                "--ubatch must be at least 1".into(),
            ));
        }
        let threads = cfg
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if threads == 0 || threads > MAX_THREADS {
            return Err(EngineError::InvalidArgument(format!(
                "--threads {threads}: use 1 to {MAX_THREADS} (the number of cores is best)"
            )));
        }
        if cfg.kv_type == crate::exec::KvType::Q8_0
            && (!p.head_dim.is_multiple_of(32) || p.head_dim > crate::exec::MAX_Q8_HEAD_DIM)
        {
            return Err(EngineError::InvalidArgument(format!(
                "--kv-type q8_0 needs a head size that is a multiple of 32 and at most {} (this model's is {}); use --kv-type f16",
                crate::exec::MAX_Q8_HEAD_DIM,
                p.head_dim
            )));
        }
        // Sliding-window layers hold only their window plus one ubatch (ring buffers).
        let kv_rows = p.kv_layer_rows(ctx, ubatch);
        let kv_bytes = KvCache::bytes_for_rows(&kv_rows, p.kv_dim(), cfg.kv_type).ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "--ctx {ctx}: the KV cache would not fit in memory; use a smaller context (the model was trained for {})",
                p.n_ctx_train
            ))
        })?;
        // The CUDA attention is always tiled; on the CPU a q8_0 cache or --flash-attn is.
        let flash_attn =
            cfg.device.is_cuda() || cfg.flash_attn || cfg.kv_type == crate::exec::KvType::Q8_0;
        // CPU: per-thread attention scratch. CUDA: the attention partials and the parameter
        // block (the threads only feed the GPU).
        let scratch_bytes = if cfg.device.is_cuda() {
            crate::device::attn_partial_bytes(ubatch, ctx, p.n_head, p.head_dim)
                + crate::device::params_bytes(ubatch)
        } else {
            if flash_attn {
                online_scratch_bytes_per_thread(p.head_dim)
            } else {
                scratch_bytes_per_thread(ctx, p.head_dim)
            }
            .checked_next_multiple_of(ALIGN)
            .and_then(|b| b.checked_mul(threads))
            .ok_or_else(|| EngineError::InvalidArgument(format!("--ctx {ctx}: too large")))?
        };
        let (decode, decode_size, decode_bound) = plan_graph(arch::build_graph(model, 1))?;
        let (prefill, arena_bytes, lower_bound) = if ubatch > 1 {
            let (pg, size, bound) = plan_graph(arch::build_graph(model, ubatch))?;
            (Some(pg), size.max(decode_size), bound.max(decode_bound))
        } else {
            (None, decode_size, decode_bound)
        };
        let cuda = cfg.device.is_cuda().then(|| CudaMemory {
            arena_bytes: arena_bytes as u64,
            kv_bytes: kv_bytes as u64,
            weights_upload_bytes: crate::device::uploaded_weight_bytes(model),
            scratch_bytes: scratch_bytes as u64,
        });
        Ok(SessionPlan {
            ctx,
            ubatch,
            threads,
            kv_type: cfg.kv_type,
            flash_attn,
            device: cfg.device,
            cuda,
            cuda_weights: cfg.cuda_weights,
            report: MemoryReport {
                weights_bytes: model.weight_bytes_total(),
                kv_bytes: kv_bytes as u64,
                arena_bytes: arena_bytes as u64,
                arena_lower_bound_bytes: lower_bound as u64,
                scratch_bytes: scratch_bytes as u64,
                runtime_bytes: model.runtime_bytes(),
            },
            decode,
            prefill,
        })
    }
}

impl SessionPlan {
    /// What the budget would be charged for this plan.
    pub fn demand(&self) -> edge_targets::Demand {
        edge_targets::Demand {
            weights: self.report.weights_bytes,
            kv: self.report.kv_bytes,
            arena: self.report.arena_bytes,
            scratch: self.report.scratch_bytes,
        }
    }

    /// Plans a session within `budget`. With `cfg.ctx` given, refuses (before allocating
    /// anything) if it does not fit, naming each component and the largest context that would.
    /// Without it, picks the largest context (up to the model's trained context) that fits.
    pub fn within_budget(
        model: &Model,
        cfg: &SessionConfig,
        budget: &edge_targets::Budget,
    ) -> Result<SessionPlan> {
        plan_within_budget(
            cfg.ctx,
            model.params.n_ctx_train as u64,
            budget,
            |ctx| {
                SessionPlan::new(
                    model,
                    &SessionConfig {
                        ctx: Some(ctx),
                        ..cfg.clone()
                    },
                )
            },
            SessionPlan::demand,
        )
    }
}

/// A plan of the given size (a context, or the longest text an encoder takes), or without one
/// the largest size up to `max` that fits `budget`; refused before anything is allocated,
/// naming each component and the largest size that would fit (`with_largest_fitting_ctx`).
pub(crate) fn plan_within_budget<P>(
    given: Option<usize>,
    max: u64,
    budget: &edge_targets::Budget,
    plan: impl Fn(usize) -> Result<P>,
    demand: impl Fn(&P) -> edge_targets::Demand,
) -> Result<P> {
    let probe = |n: u64| match plan(n as usize) {
        Ok(p) => demand(&p),
        // An impossible size never fits.
        Err(_) => edge_targets::Demand {
            weights: u64::MAX,
            ..Default::default()
        },
    };
    let largest = || edge_targets::largest_fitting(budget, 1, max, probe);
    let size = match given {
        Some(n) => n,
        None => match largest() {
            Some(n) => return plan(n as usize),
            // Nothing fits: plan the smallest, whose check below names the components.
            None => 1,
        },
    };
    let p = plan(size)?;
    budget
        .check(&demand(&p))
        .map_err(|e| EngineError::Budget(Box::new(e.with_largest_fitting_ctx(largest()))))?;
    Ok(p)
}

/// One conversation's state: KV cache, arena, threads; the model is shared.
pub struct Session {
    model: Arc<Model>,
    backend: Backend,
    ctx: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    threads: usize,
    decode: PlannedGraph,
    prefill: Option<PlannedGraph>,
    ubatch: usize,
    n_past: usize,
    report: MemoryReport,
    /// Whether the last run produced logits that can be read.
    has_logits: bool,
    last_graph_is_prefill: bool,
    policy: ContextPolicy,
    /// Context shifts done since the last reset.
    n_shifts: usize,
    /// Two KV rows of f32, for re-rotating keys during a shift (allocated once here, so that
    /// a shift allocates nothing).
    shift_rows: Vec<f32>,
}

/// What runs the planned graphs: the CPU executor with its KV cache, or a CUDA device.
// One per session, never moved in a hot path: a few hundred bytes inline cost nothing.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Cpu {
        exec: Executor,
        kv: KvCache,
    },
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::cuda::CudaExecutor>),
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ctx", &self.ctx)
            .field("ubatch", &self.ubatch)
            .field("n_past", &self.n_past)
            .finish()
    }
}

impl Session {
    /// Opens a session: builds and plans the graphs ([`SessionPlan`]), then allocates the KV
    /// cache and the arena, once.
    pub fn new(model: Arc<Model>, cfg: &SessionConfig) -> Result<Session> {
        let plan = SessionPlan::new(&model, cfg)?;
        Session::from_plan(model, plan)
    }

    /// Opens a session from a plan made for this model (e.g. by
    /// [`SessionPlan::within_budget`]): allocates exactly what the plan's report says.
    pub fn from_plan(model: Arc<Model>, plan: SessionPlan) -> Result<Session> {
        Session::from_plan_with_kernels(model, plan, Kernels::detect())
    }

    /// [`Session::from_plan`] with the given kernels instead of [`Kernels::detect`]'s (to run
    /// one instruction set in tests and benchmarks without `EDGE_RUN_ISA`).
    pub fn from_plan_with_kernels(
        model: Arc<Model>,
        plan: SessionPlan,
        kernels: Kernels,
    ) -> Result<Session> {
        let p = &model.params;
        if plan.ctx > p.n_ctx_train {
            log::warn!(
                "context {} is larger than the {} tokens the model was trained for; quality may drop",
                plan.ctx,
                p.n_ctx_train
            );
        }
        let report = plan.report;
        let (backend, what) = match plan.device {
            Device::Cpu => {
                // Decoding streams the mapped weights: huge pages read faster.
                match model.gguf().settle_huge_pages() {
                    HugePages::Relaid { huge_mib, seconds } => log::info!(
                        "weights re-read into huge pages ({huge_mib} MiB in 2 MiB pages) in {seconds:.2} s"
                    ),
                    HugePages::Unsupported => log::debug!(
                        "weights stay in small pages: the kernel gave the re-read no huge pages"
                    ),
                    HugePages::AlreadyHuge | HugePages::NotAttempted => {}
                }
                let kv_rows = p.kv_layer_rows(plan.ctx, plan.ubatch);
                let kv = KvCache::with_layer_rows(&kv_rows, plan.ctx, p.kv_dim(), plan.kv_type)
                    .map_err(|e| {
                        EngineError::InvalidArgument(format!(
                            "--ctx {}: {e}; use a smaller context (the model was trained for {})",
                            plan.ctx, p.n_ctx_train
                        ))
                    })?;
                let exec = Executor::new(
                    plan.report.arena_bytes as usize,
                    plan.threads,
                    plan.ctx,
                    p.head_dim,
                    plan.flash_attn,
                    kernels,
                )
                .map_err(|e| {
                    EngineError::InvalidArgument(format!("cannot allocate the session: {e}"))
                })?;
                debug_assert_eq!(exec.scratch_bytes() as u64, plan.report.scratch_bytes);
                debug_assert_eq!(kv.bytes() as u64, plan.report.kv_bytes);
                let what = format!(
                    "{} threads, kernels {}",
                    plan.threads,
                    exec.kernels().isa_name()
                );
                (Backend::Cpu { exec, kv }, what)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                let exec = crate::cuda::CudaExecutor::new(
                    &model,
                    ordinal,
                    plan.report.arena_bytes as usize,
                    plan.ctx,
                    plan.ubatch,
                    plan.kv_type,
                    plan.cuda_weights,
                )
                .map_err(EngineError::Device)?;
                debug_assert_eq!(exec.kv_bytes() as u64, plan.report.kv_bytes);
                let what = exec.description().to_string();
                (Backend::Cuda(Box::new(exec)), what)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => {
                return Err(EngineError::Device(crate::device::NO_CUDA_SUPPORT.into()));
            }
        };
        let shift_rows = vec![0.0; 2 * p.kv_dim()];
        log::info!(
            "session: ctx {}, ubatch {}, {what}; KV {:.1} MiB, arena {:.2} MiB (lower bound {:.2} MiB), scratch {} KiB",
            plan.ctx,
            plan.ubatch,
            report.kv_bytes as f64 / 1048576.0,
            report.arena_bytes as f64 / 1048576.0,
            report.arena_lower_bound_bytes as f64 / 1048576.0,
            report.scratch_bytes / 1024
        );
        Ok(Session {
            model,
            backend,
            ctx: plan.ctx,
            threads: plan.threads,
            decode: plan.decode,
            prefill: plan.prefill,
            ubatch: plan.ubatch,
            n_past: 0,
            report,
            has_logits: false,
            last_graph_is_prefill: false,
            policy: ContextPolicy::Stop,
            n_shifts: 0,
            shift_rows,
        })
    }

    /// The model this session runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context size in tokens.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Tokens per prefill run.
    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    /// Threads per op (CPU sessions; a CUDA session reports its planned threads, which only
    /// feed the GPU).
    pub fn n_threads(&self) -> usize {
        match &self.backend {
            Backend::Cpu { exec, .. } => exec.n_threads(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => self.threads,
        }
    }

    /// Where the session runs.
    pub fn device(&self) -> Device {
        match &self.backend {
            Backend::Cpu { .. } => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Device::Cuda(c.ordinal()),
        }
    }

    /// What computes: the CPU kernel set (`avx2`, `scalar`) or `cuda`.
    pub fn backend_name(&self) -> &'static str {
        match &self.backend {
            Backend::Cpu { exec, .. } => exec.kernels().isa_name(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => "cuda",
        }
    }

    /// Positions already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The session's memory, from its plan.
    pub fn memory(&self) -> MemoryReport {
        self.report
    }

    /// Forgets the conversation (the KV cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
        self.has_logits = false;
        self.n_shifts = 0;
    }

    /// What to do when the context is full ([`ContextPolicy::Stop`] unless set).
    pub fn context_policy(&self) -> ContextPolicy {
        self.policy
    }

    /// Sets what to do when the context is full; applies to the following runs.
    pub fn set_context_policy(&mut self, policy: ContextPolicy) {
        self.policy = policy;
    }

    /// Context shifts done since the session was opened or reset.
    pub fn n_shifts(&self) -> usize {
        self.n_shifts
    }

    /// Drops `n_discard` positions after the first `keep` ones: the later positions move down
    /// and their keys are re-rotated (see [`KvCache::shift`]); [`Session::n_past`] drops by
    /// `n_discard`. The logits of the last run stay readable. [`ContextPolicy::Shift`] calls this
    /// with half of the positions after `keep` when a run would overflow the context.
    pub fn shift_context(&mut self, keep: usize, n_discard: usize) -> Result<()> {
        if keep
            .checked_add(n_discard)
            .is_none_or(|end| end > self.n_past)
        {
            return Err(EngineError::InvalidArgument(format!(
                "context shift: cannot drop {n_discard} positions after the first {keep}: only {} are in the context",
                self.n_past
            )));
        }
        let p = &self.model.params;
        if let Some(reason) = self.model.context_shift_unsupported() {
            return Err(EngineError::InvalidArgument(reason));
        }
        match &mut self.backend {
            Backend::Cpu { exec, kv } => kv
                .shift(
                    self.n_past,
                    keep,
                    n_discard,
                    p.head_dim,
                    p.rope,
                    exec.kernels(),
                    &mut self.shift_rows,
                )
                .map_err(EngineError::Kernel)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => {
                return Err(EngineError::Device(
                    "context shift is not implemented on --device cuda yet; use --device cpu, or a larger --ctx".into(),
                ))
            }
        }
        self.n_past -= n_discard;
        self.n_shifts += 1;
        Ok(())
    }

    /// Under [`ContextPolicy::Shift`], shifts until `n` more positions fit (a no-op when they
    /// already do, or under [`ContextPolicy::Stop`]).
    fn make_room(&mut self, n: usize, what: &'static str) -> Result<()> {
        let ContextPolicy::Shift { keep } = self.policy else {
            return Ok(());
        };
        while self.n_past + n > self.ctx() {
            let keep = keep.min(self.n_past);
            let n_discard = (self.n_past - keep) / 2;
            if n_discard == 0 {
                return Err(EngineError::ContextShift {
                    what,
                    needed: n,
                    keep,
                    ctx: self.ctx(),
                });
            }
            self.shift_context(keep, n_discard)?;
        }
        Ok(())
    }

    /// Appends `tokens` to the context, in chunks of the ubatch, and returns the logits of the
    /// last one.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.advance_as(tokens, "prompt")?;
        self.try_logits()
    }

    /// Appends one token and returns the logits for the next.
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        self.advance_as(&[token], "generation")?;
        self.try_logits()
    }

    /// Appends `tokens` (in chunks of the ubatch) without fetching the logits: on a GPU they
    /// stay on the device until [`Session::logits`] or [`Session::argmax`] asks.
    pub fn advance(&mut self, tokens: &[u32]) -> Result<()> {
        let what = if tokens.len() == 1 && self.n_past > 0 {
            "generation"
        } else {
            "prompt"
        };
        self.advance_as(tokens, what)
    }

    fn advance_as(&mut self, tokens: &[u32], what: &'static str) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidArgument(
                "nothing to process: the prompt has no tokens".into(),
            ));
        }
        self.check_vocab(tokens)?;
        if let ContextPolicy::Shift { keep } = self.policy {
            // Shifting only drops context already processed: a prompt itself (and the kept
            // tokens) must fit. A generated token that cannot is make_room's error (--keep).
            let kept = keep.min(self.n_past);
            if what == "prompt" && kept + tokens.len() > self.ctx() {
                return Err(EngineError::ContextFull {
                    what,
                    needed: kept + tokens.len(),
                    ctx: self.ctx(),
                    max: self.model.params.n_ctx_train,
                });
            }
        } else {
            // Refused before anything runs: a prompt is processed whole or not at all.
            self.check_fits(tokens.len(), what)?;
        }
        let ubatch = self.ubatch;
        for chunk in tokens.chunks(ubatch) {
            self.make_room(chunk.len(), what)?;
            self.check_fits(chunk.len(), what)?;
            self.run(chunk)?;
        }
        Ok(())
    }

    /// The most likely next token after the last run (the first on ties), as
    /// [`crate::sampling::argmax`] of the logits. On a GPU it is computed there and only the id
    /// is copied back.
    pub fn argmax(&self) -> Result<u32> {
        if !self.has_logits {
            return Err(EngineError::InvalidArgument(
                "no logits yet: process some tokens first".into(),
            ));
        }
        match &self.backend {
            Backend::Cpu { .. } => Ok(crate::sampling::argmax(self.logits())),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.argmax().map_err(EngineError::Device),
        }
    }

    /// The next token from the last run's logits with `sampler`: the token
    /// `sampler.sample(self.logits())` gives, with the sampler's generator advanced the same way.
    /// On a GPU the logits stay there when the sampler allows it
    /// ([`crate::sampling::Sampler::device_sampling`]: no active repetition penalty, top-k at
    /// most [`crate::cuda::SAMPLE_MAX_TOP_K`]): greedy settings use the device argmax, others the
    /// device sampler (same arithmetic as the CPU's, fed the CPU generator's uniform draw), and
    /// only the token id is copied back. Otherwise, and on the CPU, the logits are sampled here.
    pub fn sample(&mut self, sampler: &mut crate::sampling::Sampler) -> Result<u32> {
        if !self.has_logits {
            return Err(EngineError::InvalidArgument(
                "no logits yet: process some tokens first".into(),
            ));
        }
        #[cfg(feature = "cuda")]
        if let Backend::Cuda(c) = &self.backend {
            let len = c.logits_len();
            if let Some(ds) =
                sampler.device_sampling(len, crate::cuda::SAMPLE_MAX_TOP_K.min(len.max(1)))
            {
                if ds.n == len && len > 0 {
                    return sampler
                        .sample_with_draw(|u| c.sample(&ds, u))
                        .map_err(EngineError::Device);
                }
            }
        }
        let logits = self.try_logits()?;
        Ok(sampler.sample(logits))
    }

    /// Logits of the last processed position (empty before any run, or if copying them from
    /// the device failed; [`Session::prefill`] and [`Session::step`] report such errors).
    pub fn logits(&self) -> &[f32] {
        self.try_logits().unwrap_or_else(|e| {
            log::error!("{e}");
            &[]
        })
    }

    fn try_logits(&self) -> Result<&[f32]> {
        if !self.has_logits {
            return Ok(&[]);
        }
        match &self.backend {
            Backend::Cpu { exec, .. } => {
                let pg = if self.last_graph_is_prefill {
                    self.prefill.as_ref().unwrap_or(&self.decode)
                } else {
                    &self.decode
                };
                Ok(exec.read_f32(pg, pg.graph.output, 1))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.logits().map_err(EngineError::Device),
        }
    }

    fn check_vocab(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.params.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        Ok(())
    }

    fn check_fits(&self, n: usize, what: &'static str) -> Result<()> {
        if self.n_past + n > self.ctx() {
            return Err(EngineError::ContextFull {
                what,
                needed: self.n_past + n,
                ctx: self.ctx(),
                max: self.model.params.n_ctx_train,
            });
        }
        Ok(())
    }

    fn run(&mut self, chunk: &[u32]) -> Result<()> {
        let use_prefill = chunk.len() > 1;
        let pg = if use_prefill {
            self.prefill.as_ref().unwrap_or(&self.decode)
        } else {
            &self.decode
        };
        self.has_logits = false;
        match &mut self.backend {
            Backend::Cpu { exec, kv } => {
                let args = RunArgs {
                    tokens: chunk,
                    pos0: self.n_past,
                };
                if !exec.run(&self.model, kv, pg, args) {
                    return Err(EngineError::Kernel(
                        "a worker thread panicked; this is a bug".into(),
                    ));
                }
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                c.run(&self.model, pg, chunk, self.n_past, !use_prefill)
                    .map_err(EngineError::Device)?;
            }
        }
        self.n_past += chunk.len();
        self.has_logits = true;
        self.last_graph_is_prefill = use_prefill && self.prefill.is_some();
        Ok(())
    }
}
