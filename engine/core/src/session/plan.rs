//! How a session is sized ([`SessionConfig`]) and everything it will own, planned before
//! anything is allocated ([`SessionPlan`]): `edge-run plan`, budgets and [`super::Session::new`]
//! all read the same plan.

use crate::backend::cuda::{self, CudaMemory, WeightPath};
use crate::backend::{self, Allocation, Shape};
use crate::device::Device;
use crate::error::{EngineError, Result, Setting};
use crate::hint;
use crate::kv::{KvCache, KvType, MAX_Q8_HEAD_DIM};
use crate::model::Model;
use crate::plan::{plan_within_budget, MemoryReport, PlannedGraph};

/// Default context size when none is given (capped by the model's trained context).
pub const DEFAULT_CTX: usize = 4096;
/// Most threads a session may use.
pub const MAX_THREADS: usize = 1024;
/// Default prompt chunk (tokens per prefill run).
pub const DEFAULT_UBATCH: usize = 512;

/// How to size a session.
#[derive(Debug, Clone, Default)]
pub struct SessionConfig {
    /// Context size in tokens (KV cache positions), at most the model's trained context;
    /// `None`: min(4096, trained context).
    pub ctx: Option<usize>,
    /// Tokens per prefill run; `None`: min(512, ctx).
    pub ubatch: Option<usize>,
    /// Threads; `None`: the available cores.
    pub threads: Option<usize>,
    /// Element type of the KV cache (f16 by default).
    pub kv_type: KvType,
    /// Tiled (flash-style, online-softmax) attention for an f16 cache too, with scratch that
    /// does not grow with the context. Off by default: the exact path reproduces llama.cpp's
    /// logits bit for bit. A q8_0 cache always uses the tiled attention.
    pub flash_attn: bool,
    /// Where the session runs (the CPU by default; see [`crate::backend::default_device`]).
    pub device: Device,
    /// CUDA only: how the weights reach the device (`None`: chosen from the device's
    /// attributes, or `EDGE_RUN_CUDA_WEIGHTS`).
    pub cuda_weights: Option<WeightPath>,
}

/// The threads to use when none are asked for: the CPUs this process may run on, less those
/// other processes keep busy ([`edge_kernels::threads::default_thread_count`]).
pub fn default_threads() -> usize {
    let choice = edge_kernels::threads::default_thread_count();
    if choice.busy > 0 {
        log::info!(
            "threads: {} ({} CPUs allowed, {} busy with other processes)",
            choice.threads,
            choice.allowed,
            choice.busy
        );
    }
    choice.threads
}

/// `threads`, or why it is no thread count (1 to [`MAX_THREADS`]).
pub(crate) fn check_threads(threads: usize) -> Result<usize> {
    if threads == 0 || threads > MAX_THREADS {
        return Err(EngineError::invalid_setting(
            Setting::Threads,
            threads,
            hint![
                Setting::Threads,
                format!(" {threads}: use 1 to {MAX_THREADS} (the number of cores is best)")
            ],
        ));
    }
    Ok(threads)
}

/// Everything a session will own, planned but not allocated: the resolved sizes, the planned
/// graphs and the [`MemoryReport`]. `edge-run plan` and budget checks use it to answer "will it
/// fit?" before anything is allocated; [`super::Session::new`] allocates exactly what it says.
pub struct SessionPlan {
    /// Context size in tokens.
    pub ctx: usize,
    /// Tokens per prefill run.
    pub ubatch: usize,
    /// Threads.
    pub threads: usize,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Attention runs tiled with an online softmax (flash attention asked for, a q8_0 cache,
    /// or a device that has no other).
    pub flash_attn: bool,
    /// Memory the session will hold.
    pub report: MemoryReport,
    /// Where it runs.
    pub device: Device,
    /// CUDA sessions: the device allocations (arena, KV cache, weights uploaded, scratch).
    pub cuda: Option<CudaMemory>,
    /// CUDA sessions: how the weights reach the device (`None`: the backend chooses).
    pub cuda_weights: Option<WeightPath>,
    pub(super) decode: PlannedGraph,
    pub(super) prefill: Option<PlannedGraph>,
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
                "this is an encoder (embedding) model ({}): it computes embeddings, not next-token logits; embed texts with an embed::Embedder",
                p.arch
            )));
        }
        let ctx = cfg.ctx.unwrap_or(DEFAULT_CTX.min(p.n_ctx_train));
        if ctx == 0 {
            return Err(EngineError::invalid_setting(
                Setting::Ctx,
                ctx,
                hint![Setting::Ctx, " must be at least 1"],
            ));
        }
        // Positions past the trained context have rotary angles the model never saw; and the
        // size is from the caller, so it is bounded before anything is sized by it.
        if ctx > p.n_ctx_train {
            return Err(EngineError::invalid_setting(
                Setting::Ctx,
                ctx,
                hint![
                    Setting::Ctx,
                    format!(
                        " {ctx} is more than the {} tokens the model was trained for: use ",
                        p.n_ctx_train
                    ),
                    Setting::Ctx,
                    format!(" {} or less", p.n_ctx_train)
                ],
            ));
        }
        let ubatch = cfg.ubatch.unwrap_or(DEFAULT_UBATCH).min(ctx);
        if ubatch == 0 {
            return Err(EngineError::invalid_setting(
                Setting::Ubatch,
                ubatch,
                hint![Setting::Ubatch, " must be at least 1"],
            ));
        }
        let threads = check_threads(cfg.threads.unwrap_or_else(default_threads))?;
        if cfg.kv_type == KvType::Q8_0
            && (!p.head_dim.is_multiple_of(32) || p.head_dim > MAX_Q8_HEAD_DIM)
        {
            return Err(EngineError::invalid_setting(
                Setting::KvType,
                "q8_0",
                hint![
                    Setting::KvType,
                    format!(
                        " q8_0 needs a head size that is a multiple of 32 and at most {MAX_Q8_HEAD_DIM} (this model's is {}); use ",
                        p.head_dim
                    ),
                    Setting::KvType,
                    " f16"
                ],
            ));
        }
        let too_large = |what: &str| {
            EngineError::invalid_setting(
                Setting::Ctx,
                ctx,
                hint![
                    Setting::Ctx,
                    format!(
                        " {ctx}: {what}; use a smaller context (the model was trained for {})",
                        p.n_ctx_train
                    )
                ],
            )
        };
        // Sliding-window layers hold only their window plus one ubatch (ring buffers).
        let kv_rows = p.kv_layer_rows(ctx, ubatch);
        let kv_bytes = KvCache::bytes_for_rows(&kv_rows, p.kv_dim(), cfg.kv_type)
            .ok_or_else(|| too_large("the KV cache would not fit in memory"))?;
        let flash_attn = backend::tiled_attention_only(cfg.device)
            || cfg.flash_attn
            || cfg.kv_type == KvType::Q8_0;
        let shape = Shape {
            ctx,
            ubatch,
            threads,
            n_head: p.n_head,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            flash_attn,
            n_vocab: p.n_vocab,
        };
        let scratch_bytes = backend::scratch_bytes(cfg.device, &shape)
            .ok_or_else(|| too_large("the scratch would not fit in memory"))?;
        let decode = PlannedGraph::plan(model.build_graph(1))?;
        let prefill = if ubatch > 1 {
            Some(PlannedGraph::plan(model.build_graph(ubatch))?)
        } else {
            None
        };
        // Decode and prefill never run at the same time: they share one arena.
        let graphs = || std::iter::once(&decode).chain(&prefill);
        let arena_bytes = graphs().map(|g| g.arena_bytes).max().unwrap_or(0);
        let lower_bound = graphs().map(|g| g.lower_bound_bytes).max().unwrap_or(0);
        let cuda = cfg.device.is_cuda().then(|| {
            cuda::device_memory(
                model,
                arena_bytes as u64,
                kv_bytes as u64,
                scratch_bytes as u64,
            )
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

    /// What the session's backend allocates.
    pub fn allocation(&self) -> Allocation {
        Allocation {
            device: self.device,
            ctx: self.ctx,
            ubatch: self.ubatch,
            threads: self.threads,
            kv_type: self.kv_type,
            flash_attn: self.flash_attn,
            arena_bytes: self.report.arena_bytes as usize,
            kv_bytes: self.report.kv_bytes as usize,
            scratch_bytes: self.report.scratch_bytes as usize,
            cuda_weights: self.cuda_weights,
        }
    }

    /// What the budget would be charged for this plan.
    pub fn demand(&self) -> edge_targets::Demand {
        self.report.demand()
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
