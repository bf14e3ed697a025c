//! Planning the slots before the port opens: `--slots N` sessions of `--ctx` tokens each,
//! charged against the budget together (the weights once, each slot's KV cache, arena and
//! scratch N times). A configuration that does not fit is refused with the numbers and the
//! largest N, and the largest context for N, that would.

use edge_engine::model::Model;
use edge_engine::session::{SessionConfig, SessionPlan};
use edge_targets::{format_size, Budget, Demand};

use crate::errors::{CliError, CliResult};
use crate::session::plan_session;

use super::metrics::PlannedMemory;

/// What `n` slots of `one` charge together.
fn demand_of(one: &Demand, n: usize) -> Demand {
    let n = n as u64;
    Demand {
        weights: one.weights,
        kv: one.kv.saturating_mul(n),
        arena: one.arena.saturating_mul(n),
        scratch: one.scratch.saturating_mul(n),
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

/// The largest context for which `n` slots fit `budget`, if any does.
fn largest_ctx(model: &Model, cfg: &SessionConfig, budget: &Budget, n: usize) -> Option<usize> {
    let hi = model.params.n_ctx_train as u64;
    edge_targets::largest_fitting(budget, 16.min(hi), hi, |ctx| {
        one_slot(model, cfg, ctx as usize).map_or(
            Demand {
                kv: u64::MAX,
                ..Demand::default()
            },
            |d| demand_of(&d, n),
        )
    })
    .map(|c| c as usize)
}

/// The largest number of slots of `one` that fit `budget`.
fn largest_slots(one: &Demand, budget: &Budget) -> usize {
    let base = if budget.count_weights { one.weights } else { 0 };
    let per = one.kv + one.arena + one.scratch;
    match budget.limit_bytes.checked_sub(base) {
        Some(left) if per > 0 => (left / per).min(usize::MAX as u64) as usize,
        _ => 0,
    }
}

/// Plans one slot's session so that `n` of them fit `budget` (if there is one). Without
/// `--ctx`, the context is the default (min(4096, trained)) without a budget, or the largest
/// that fits `n` slots with one.
pub fn plan_slots(
    model: &Model,
    cfg: &SessionConfig,
    budget: Option<&Budget>,
    n: usize,
) -> CliResult<SessionPlan> {
    let Some(budget) = budget else {
        return plan_session(model, cfg, None, "plan");
    };
    let cfg = match cfg.ctx {
        Some(_) => cfg.clone(),
        None => match largest_ctx(model, cfg, budget, n) {
            Some(ctx) => SessionConfig {
                ctx: Some(ctx),
                ..cfg.clone()
            },
            None => {
                let one = one_slot(model, cfg, 16).unwrap_or_default();
                return Err(refusal(
                    &one,
                    budget,
                    n,
                    16,
                    None,
                    largest_slots(&one, budget),
                ));
            }
        },
    };
    let plan = plan_session(model, &cfg, None, "plan")?;
    let total = demand_of(&plan.demand(), n);
    if !budget.fits(&total) {
        let max_ctx = largest_ctx(model, &cfg, budget, n);
        return Err(refusal(
            &plan.demand(),
            budget,
            n,
            plan.ctx,
            max_ctx,
            largest_slots(&plan.demand(), budget),
        ));
    }
    Ok(plan)
}

/// The error of `n` slots of `ctx` that do not fit: the numbers, and what would fit.
fn refusal(
    one: &Demand,
    budget: &Budget,
    n: usize,
    ctx: usize,
    max_ctx: Option<usize>,
    max_slots: usize,
) -> CliError {
    let total = demand_of(one, n);
    let need = budget.charged(&total);
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
    CliError::from(format!(
        "memory budget exceeded: {n} slots of ctx {ctx} need {} ({weights}{n} x (KV {} + arena {} + scratch {})), budget {}: {}",
        format_size(need),
        format_size(one.kv),
        format_size(one.arena),
        format_size(one.scratch),
        format_size(budget.limit_bytes),
        fix.join("; ")
    ))
}

/// The plan as the metrics show it.
pub fn planned_memory(plan: &SessionPlan, n: usize, budget: Option<&Budget>) -> PlannedMemory {
    let d = plan.demand();
    PlannedMemory {
        slots: n,
        ctx: plan.ctx,
        weights: d.weights,
        kv: d.kv,
        arena: d.arena,
        scratch: d.scratch,
        budget: budget.map(|b| b.limit_bytes),
    }
}

/// The start-up line that shows the plan.
pub fn plan_line(m: &PlannedMemory, threads: usize) -> String {
    let budget = m
        .budget
        .map(|b| format!(" of a {} budget", format_size(b)))
        .unwrap_or_default();
    format!(
        "{} slot{} x ctx {} ({threads} thread{} each): KV {} + arena {} + scratch {} per slot = {} owned{budget}; weights {} mapped",
        m.slots,
        if m.slots == 1 { "" } else { "s" },
        m.ctx,
        if threads == 1 { "" } else { "s" },
        format_size(m.kv),
        format_size(m.arena),
        format_size(m.scratch),
        format_size(m.owned_total()),
        format_size(m.weights)
    )
}
