//! Sessions that decode together: `n` sessions of one model, each with its own KV cache and
//! conversation, sharing one executor (threads, arena, scratch) on the CPU. Each session is
//! driven as any other (from its own thread, typically); decode steps asked for at the same
//! time run as the rows of one forward pass, so the weights are read once per step for all
//! of them ([`crate::backend::cpu::group`]). A server's slots are such a group.
//!
//! Everything is planned up front like a lone session: [`GroupPlan`] holds the `n` caches,
//! the one arena (the largest of the prompt, one-token and `n`-row graphs) and the scratch,
//! and [`GroupPlan::report`] is what the group allocates.

use std::sync::Arc;

use edge_kernels::Kernels;

use super::{Session, SessionConfig, SessionPlan};
use crate::backend::cpu::group::CpuGroup;
pub use crate::backend::cpu::group::{MAX_BATCH, MAX_MEMBERS};
pub use crate::backend::DecodeBatches;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::plan::{MemoryReport, PlannedGraph};

/// `n` sessions of one shape that decode together, planned but not allocated.
pub struct GroupPlan {
    /// One session's sizes (its report is a lone session's).
    pub session: SessionPlan,
    /// Sessions in the group.
    pub n: usize,
    /// What the whole group allocates: `n` KV caches, one arena, one scratch plus the
    /// members' logits rows.
    pub report: MemoryReport,
    sizing: GroupSizing,
}

impl std::fmt::Debug for GroupPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupPlan")
            .field("n", &self.n)
            .field("session", &self.session)
            .field("report", &self.report)
            .finish()
    }
}

impl GroupPlan {
    /// Plans `n` sessions of `cfg` (CPU only) that decode together.
    pub fn new(model: &Model, cfg: &SessionConfig, n: usize) -> Result<GroupPlan> {
        GroupPlan::from_session(model, SessionPlan::new(model, cfg)?, n)
    }

    /// Plans a group of `n` sessions shaped as `session`.
    pub fn from_session(model: &Model, session: SessionPlan, n: usize) -> Result<GroupPlan> {
        GroupPlan::from_sizing(session, GroupSizing::new(model, n)?)
    }

    /// A group of sessions shaped as `session`, with the every-row graph `sizing` planned.
    pub fn from_sizing(session: SessionPlan, sizing: GroupSizing) -> Result<GroupPlan> {
        if session.device != Device::Cpu {
            return Err(EngineError::Unsupported(
                "sessions decode together on the CPU only; on a GPU each session runs alone".into(),
            ));
        }
        Ok(GroupPlan {
            report: sizing.report(&session.report),
            session,
            n: sizing.n,
            sizing,
        })
    }

    /// What a budget is charged for the group.
    pub fn demand(&self) -> edge_targets::Demand {
        self.report.demand()
    }
}

/// Rows of one shared pass of a group of `n`: every member's step, up to [`MAX_BATCH`] (whose
/// logits alone take `MAX_BATCH` rows of the vocabulary in the arena); at least 2.
pub fn batch_rows(n: usize) -> usize {
    n.clamp(2, MAX_BATCH)
}

/// What a group of `n` sessions adds to one session's memory, its every-row graph planned
/// once: for budgets that try many contexts, and then for the group's plan.
#[derive(Clone)]
pub struct GroupSizing {
    /// Sessions.
    pub n: usize,
    /// The every-row graph ([`batch_rows`] rows).
    batch: PlannedGraph,
    /// The members' logits rows.
    pub logits_bytes: u64,
}

impl std::fmt::Debug for GroupSizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupSizing")
            .field("n", &self.n)
            .field("batch_arena_bytes", &self.batch.arena_bytes)
            .field("logits_bytes", &self.logits_bytes)
            .finish()
    }
}

impl GroupSizing {
    /// Plans the every-row graph of a group of `n` of `model`'s sessions.
    pub fn new(model: &Model, n: usize) -> Result<GroupSizing> {
        if n == 0 || n > MAX_MEMBERS {
            return Err(EngineError::InvalidArgument(format!(
                "a group holds 1 to {MAX_MEMBERS} sessions, not {n}"
            )));
        }
        let graph = model.build_every_row_graph(batch_rows(n)).ok_or_else(|| {
            EngineError::InvalidArgument(
                "an encoder (embedding) model has no decode steps to run together".into(),
            )
        })?;
        Ok(GroupSizing {
            n,
            batch: PlannedGraph::plan(graph)?,
            logits_bytes: CpuGroup::logits_bytes(model.params.n_vocab, n) as u64,
        })
    }

    /// What the group is charged, given what one session is: `n` KV caches, the one arena
    /// (the larger of the session's and the every-row graph's), the one scratch and the
    /// logits rows (counted as scratch).
    pub fn demand(&self, one: &edge_targets::Demand) -> edge_targets::Demand {
        edge_targets::Demand {
            weights: one.weights,
            kv: one.kv.saturating_mul(self.n as u64),
            arena: one.arena.max(self.batch.arena_bytes as u64),
            scratch: one.scratch.saturating_add(self.logits_bytes),
        }
    }

    /// What the group allocates ([`GroupSizing::demand`]), given one session's report.
    pub fn report(&self, one: &MemoryReport) -> MemoryReport {
        let d = self.demand(&one.demand());
        MemoryReport {
            kv_bytes: d.kv,
            arena_bytes: d.arena,
            arena_lower_bound_bytes: one
                .arena_lower_bound_bytes
                .max(self.batch.lower_bound_bytes as u64),
            scratch_bytes: d.scratch,
            ..*one
        }
    }
}

/// Opens the `n` sessions of `plan`, allocating what its report says; their kernels are chosen
/// for this CPU once ([`crate::backend::cpu::tune::choose`]).
pub fn open_group(model: Arc<Model>, plan: GroupPlan) -> Result<Vec<Session>> {
    let kernels =
        crate::backend::cpu::tune::choose(&model, Kernels::detect(), plan.session.threads);
    open_group_with_kernels(model, plan, kernels)
}

/// [`open_group`] with the given kernels (tests and benchmarks).
pub fn open_group_with_kernels(
    model: Arc<Model>,
    plan: GroupPlan,
    kernels: Kernels,
) -> Result<Vec<Session>> {
    let GroupPlan {
        session,
        n,
        report,
        sizing,
    } = plan;
    let batch = sizing.batch;
    let mut alloc = session.allocation();
    // The one executor's arena serves every graph of the group.
    alloc.arena_bytes = report.arena_bytes as usize;
    let members = CpuGroup::open(&model, &alloc, kernels, batch, n)?;
    let mut sessions = Vec::with_capacity(n);
    for member in members {
        let member_plan = SessionPlan {
            ctx: session.ctx,
            ubatch: session.ubatch,
            threads: session.threads,
            kv_type: session.kv_type,
            flash_attn: session.flash_attn,
            report,
            device: session.device,
            cuda: None,
            cuda_weights: None,
            decode: session.decode.clone(),
            prefill: session.prefill.clone(),
        };
        sessions.push(Session::with_backend(
            Arc::clone(&model),
            member_plan,
            Box::new(member),
        ));
    }
    log::info!(
        "{n} sessions decode together: KV {:.1} MiB, one arena of {:.2} MiB, scratch and logits {} KiB",
        report.kv_bytes as f64 / 1048576.0,
        report.arena_bytes as f64 / 1048576.0,
        report.scratch_bytes / 1024
    );
    Ok(sessions)
}
