//! Planning the slots before the port opens: `--slots N` sessions of `--ctx` tokens each,
//! charged against the budget together. On the CPU the slots are a group that decodes
//! together ([`edge_engine::session::group`]): the weights, the arena and the scratch once,
//! each slot's KV cache and logits N times. On a GPU each slot is a session of its own (KV
//! cache, arena and scratch N times). A configuration that does not fit is refused with the
//! numbers and the largest N, and the largest context for N, that would.

use edge_engine::device::Device;
use edge_engine::model::Model;
use edge_engine::session::group::GroupSizing;
use edge_engine::session::{SessionConfig, SessionPlan};
use edge_targets::{format_size, Budget, Demand};

use crate::errors::{CliError, CliResult};
use crate::session::plan_session;

use super::metrics::PlannedMemory;

/// How the slots share memory: a group's sizing (CPU), or none (each slot alone).
#[derive(Debug)]
pub struct Sharing {
    /// The slots decode together: the group's sizing.
    pub group: Option<GroupSizing>,
    /// Slots.
    pub n: usize,
}

impl Sharing {
    /// How `n` slots of `model` on `device` share memory.
    pub fn new(model: &Model, device: Device, n: usize) -> CliResult<Sharing> {
        let group = if decode_together(model, device) {
            Some(GroupSizing::new(model, n).map_err(|e| {
                CliError::from(format!(
                    "cannot plan {n} slots that decode together: {}",
                    crate::errors::hint(&e)
                ))
            })?)
        } else {
            None
        };
        Ok(Sharing { group, n })
    }
}

/// Whether the slots of `model` on `device` are one group that decodes together: a decoder
/// on the CPU.
pub fn decode_together(model: &Model, device: Device) -> bool {
    !model.layout.is_encoder() && device == Device::Cpu
}

/// What the slots of `sharing` charge together, one of which charges `one`.
fn demand_of(one: &Demand, sharing: &Sharing) -> Demand {
    let n = sharing.n as u64;
    match &sharing.group {
        Some(g) => g.demand(one),
        None => Demand {
            weights: one.weights,
            kv: one.kv.saturating_mul(n),
            arena: one.arena.saturating_mul(n),
            scratch: one.scratch.saturating_mul(n),
        },
    }
}

/// The demand of one slot of `ctx` tokens (`None` if it cannot be planned).
fn one_slot(model: &Model, cfg: &SessionConfig, ctx: usize) -> Option<Demand> {
    SessionPlan::new(
        model,
        &SessionConfig {
            ctx: Some(ctx),
            ..cfg.clone()
        },
    )
    .ok()
    .map(|p| p.demand())
}

/// The largest context for which the slots fit `budget`, if any does.
fn largest_ctx(
    model: &Model,
    cfg: &SessionConfig,
    budget: &Budget,
    sharing: &Sharing,
) -> Option<usize> {
    let hi = model.params.n_ctx_train as u64;
    edge_targets::largest_fitting(budget, 16.min(hi), hi, |ctx| {
        one_slot(model, cfg, ctx as usize).map_or(
            Demand {
                kv: u64::MAX,
                ..Demand::default()
            },
            |d| demand_of(&d, sharing),
        )
    })
    .map(|c| c as usize)
}

/// The largest number of slots of `one` that fit `budget` (shared as `sharing` says).
fn largest_slots(one: &Demand, budget: &Budget, sharing: &Sharing) -> usize {
    let base = if budget.count_weights { one.weights } else { 0 };
    let (shared, per) = match &sharing.group {
        Some(g) => {
            let all = g.demand(one);
            (
                all.arena + one.scratch,
                one.kv + g.logits_bytes / g.n.max(1) as u64,
            )
        }
        None => (0, one.kv + one.arena + one.scratch),
    };
    match budget.limit_bytes.checked_sub(base + shared) {
        Some(left) if per > 0 => (left / per).min(usize::MAX as u64) as usize,
        _ => 0,
    }
}

/// Plans one slot's session so that the slots of `sharing` fit `budget` (if there is one).
/// Without `--ctx`, the context is the default (min(4096, trained)) without a budget, or the
/// largest that fits the slots with one.
pub fn plan_slots(
    model: &Model,
    cfg: &SessionConfig,
    budget: Option<&Budget>,
    sharing: &Sharing,
) -> CliResult<SessionPlan> {
    let Some(budget) = budget else {
        return plan_session(model, cfg, None, "plan");
    };
    let cfg = match cfg.ctx {
        Some(_) => cfg.clone(),
        None => match largest_ctx(model, cfg, budget, sharing) {
            Some(ctx) => SessionConfig {
                ctx: Some(ctx),
                ..cfg.clone()
            },
            None => {
                let one = one_slot(model, cfg, 16).unwrap_or_default();
                return Err(refusal(&one, budget, sharing, 16, None));
            }
        },
    };
    let plan = plan_session(model, &cfg, None, "plan")?;
    let total = demand_of(&plan.demand(), sharing);
    if !budget.fits(&total) {
        let max_ctx = largest_ctx(model, &cfg, budget, sharing);
        return Err(refusal(&plan.demand(), budget, sharing, plan.ctx, max_ctx));
    }
    Ok(plan)
}

/// The error of the slots of `sharing` at `ctx` that do not fit: the numbers, and what would
/// fit.
fn refusal(
    one: &Demand,
    budget: &Budget,
    sharing: &Sharing,
    ctx: usize,
    max_ctx: Option<usize>,
) -> CliError {
    let n = sharing.n;
    let total = demand_of(one, sharing);
    let need = budget.charged(&total);
    let max_slots = largest_slots(one, budget, sharing);
    let weights = if budget.count_weights {
        format!("weights {} + ", format_size(one.weights))
    } else {
        String::new()
    };
    let mut fix = Vec::new();
    if max_slots >= 1 {
        fix.push(format!("--slots {max_slots} fits at --ctx {ctx}"));
    }
    match max_ctx {
        Some(c) => fix.push(format!("--ctx {c} fits {n} slots")),
        None if n > 1 => fix.push(format!("no context fits {n} slots")),
        None => {}
    }
    if fix.is_empty() {
        fix.push("raise --mem-budget".into());
    }
    let parts = match sharing.group {
        Some(_) => format!(
            "{weights}{n} x KV {} + one arena {} + scratch and logits {}",
            format_size(total.kv / n.max(1) as u64),
            format_size(total.arena),
            format_size(total.scratch)
        ),
        None => format!(
            "{weights}{n} x (KV {} + arena {} + scratch {})",
            format_size(one.kv),
            format_size(one.arena),
            format_size(one.scratch)
        ),
    };
    CliError::from(format!(
        "memory budget exceeded: {n} slots of ctx {ctx} need {} ({parts}), budget {}: {}",
        format_size(need),
        format_size(budget.limit_bytes),
        fix.join("; ")
    ))
}

/// The plan as the metrics show it.
pub fn planned_memory(
    plan: &SessionPlan,
    sharing: &Sharing,
    budget: Option<&Budget>,
) -> PlannedMemory {
    let one = plan.demand();
    let d = demand_of(&one, sharing);
    PlannedMemory {
        slots: sharing.n,
        ctx: plan.ctx,
        weights: d.weights,
        kv: one.kv,
        together: sharing.group.is_some(),
        arena: if sharing.group.is_some() {
            d.arena
        } else {
            one.arena
        },
        scratch: if sharing.group.is_some() {
            d.scratch
        } else {
            one.scratch
        },
        budget: budget.map(|b| b.limit_bytes),
    }
}

/// The start-up line that shows the plan.
pub fn plan_line(m: &PlannedMemory, threads: usize) -> String {
    let budget = m
        .budget
        .map(|b| format!(" of a {} budget", format_size(b)))
        .unwrap_or_default();
    let (s, ts) = (
        if m.slots == 1 { "" } else { "s" },
        if threads == 1 { "" } else { "s" },
    );
    let (how, parts) = if m.together {
        (
            format!("decoding together on {threads} thread{ts}"),
            format!(
                "KV {} per slot + one arena {} + scratch and logits {}",
                format_size(m.kv),
                format_size(m.arena),
                format_size(m.scratch)
            ),
        )
    } else {
        (
            format!("{threads} thread{ts} each"),
            format!(
                "KV {} + arena {} + scratch {} per slot",
                format_size(m.kv),
                format_size(m.arena),
                format_size(m.scratch)
            ),
        )
    };
    format!(
        "{} slot{s} x ctx {} ({how}): {parts} = {} owned{budget}; weights {} mapped",
        m.slots,
        m.ctx,
        format_size(m.owned_total()),
        format_size(m.weights)
    )
}
