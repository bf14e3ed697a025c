//! `edge-run plan`: the memory a session (or, for an encoder, an embedder) would hold, from
//! its plan, without allocating it: weights by type, KV cache, arena, scratch, the totals, the
//! device allocations of a CUDA session, and what fits a budget.

use edge_engine::model::Model;
use edge_engine::session::{SessionConfig, SessionPlan};

use crate::args::PlanArgs;
use crate::embed::{embed_config, embed_plan};
use crate::errors::{load_model, CliError, CliResult};
use crate::output::{extend_json, memory_json, memory_row, mib, write_lines};
use crate::session::plan_session;

/// `edge-run plan`: the memory a session would hold, planned without allocating it.
pub fn plan(a: PlanArgs) -> CliResult {
    let model = load_model(&a.model)?;
    if model.layout.is_encoder() {
        return plan_encoder(&a, &model);
    }
    a.session.check_ctx(&model)?;
    let cfg = a.session.config(&model)?;
    let budget = a.session.memory.budget()?;
    let plan = plan_session(&model, &cfg, budget.as_ref(), "plan")?;
    // The largest context the budget allows (with these ubatch and threads).
    // Without --ctx the budgeted plan already is the largest fitting one; search only otherwise.
    let max_ctx = budget.as_ref().and_then(|b| {
        if a.session.ctx.is_none() {
            return Some(plan.ctx);
        }
        let probe = SessionConfig {
            ctx: None,
            ..cfg.clone()
        };
        SessionPlan::within_budget(&model, &probe, b)
            .ok()
            .map(|p| p.ctx)
    });
    let r = plan.report;
    if a.json {
        let mut v = memory_json(&r, max_ctx, budget.as_ref());
        extend_json(
            &mut v,
            serde_json::json!({
                "ctx": plan.ctx,
                "ubatch": plan.ubatch,
                "threads": plan.threads,
                "kv_type": plan.kv_type.name(),
                "flash_attn": plan.flash_attn,
                "device": plan.device.name(),
                "cuda": plan.cuda.map(|c| serde_json::json!({
                    "arena_bytes": c.arena_bytes,
                    "kv_bytes": c.kv_bytes,
                    "weights_upload_bytes": c.weights_upload_bytes,
                    "scratch_bytes": c.scratch_bytes,
                    "device_total_bytes": c.device_total_bytes(),
                })),
            }),
        );
        return write_lines(&[v.to_string()]);
    }
    let p = &model.params;
    let mut by_type: std::collections::BTreeMap<&'static str, (usize, u64)> = Default::default();
    for t in model.gguf().tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let in_file: u64 = by_type.values().map(|(_, b)| b).sum();
    let mut lines = vec![format!(
        "{}: {}, {} layers; ctx {}, ubatch {}, {} threads",
        a.model.display(),
        p.arch,
        p.n_layer,
        plan.ctx,
        plan.ubatch,
        plan.threads
    )];
    lines.push(String::new());
    let row = memory_row;
    let weights_note = if in_file == r.weights_bytes {
        "mapped from the file, not copied".to_string()
    } else {
        format!(
            "mapped from the file, not copied ({} of the file's tensors are read)",
            mib(r.weights_bytes)
        )
    };
    lines.push(row("weights", r.weights_bytes, weights_note));
    for (ty, (n, b)) in &by_type {
        lines.push(format!(
            "    {ty:<26} {:>12} {b:>14} B  {n} tensor{}",
            mib(*b),
            if *n == 1 { "" } else { "s" }
        ));
    }
    lines.push(row("KV cache", r.kv_bytes, {
        // Sliding-window layers hold only their window plus one ubatch.
        let rows = p.kv_layer_rows(plan.ctx, plan.ubatch);
        let n_full = rows.iter().filter(|&&r| r == plan.ctx).count();
        let mut layers = format!("{n_full} layers x {} ctx", plan.ctx);
        if n_full < rows.len() {
            let ring = rows
                .iter()
                .copied()
                .filter(|&r| r < plan.ctx)
                .max()
                .unwrap_or(0);
            layers += &format!(
                " + {} sliding-window layers x {ring} rows",
                rows.len() - n_full
            );
        }
        format!(
            "{}, K and V: {layers} x {} kv_dim",
            plan.kv_type.name(),
            p.kv_dim()
        )
    }));
    let ratio = r.arena_bytes as f64 / (r.arena_lower_bound_bytes.max(1)) as f64;
    lines.push(row(
        "arena (activations)",
        r.arena_bytes,
        format!(
            "planned; lower bound {} ({:.3}x the lower bound)",
            mib(r.arena_lower_bound_bytes),
            ratio
        ),
    ));
    let scratch_note = if plan.cuda.is_some() {
        "attention partials, parameter block, constrained-step buffer (on the device)".to_string()
    } else {
        format!(
            "{} threads x {}",
            plan.threads,
            mib(r.scratch_bytes / plan.threads.max(1) as u64)
        )
    };
    lines.push(row("scratch", r.scratch_bytes, scratch_note));
    lines.push(row(
        "total owned",
        r.owned_bytes(),
        "KV cache + arena + scratch: allocated by the session".into(),
    ));
    lines.push(row(
        "total with weights",
        r.owned_with_weights_bytes(),
        "owned + mapped weights".into(),
    ));
    lines.push(row(
        "model runtime",
        r.runtime_bytes,
        "tokenizer and metadata heap, measured at load (shared by sessions)".into(),
    ));
    lines.push(row(
        "total",
        r.total_bytes(),
        "what the process holds: weights + runtime + owned".into(),
    ));
    if let Some(c) = &plan.cuda {
        lines.push(String::new());
        lines.push(format!(
            "device allocations on {} (one each, sized by the plan):",
            plan.device.name()
        ));
        lines.push(row(
            "arena",
            c.arena_bytes,
            "one allocation; values at the plan's offsets".into(),
        ));
        lines.push(row("KV cache", c.kv_bytes, "one allocation, f16".into()));
        lines.push(row(
            "weights",
            c.weights_upload_bytes,
            "one upload on a discrete GPU; integrated GPUs register the file mapping (0 B extra) or fill one managed buffer".into(),
        ));
        lines.push(row(
            "scratch",
            c.scratch_bytes,
            "attention partials, parameters, constrained-step buffer".into(),
        ));
        lines.push(row(
            "total on the device",
            c.device_total_bytes(),
            "discrete GPU: arena + KV + scratch + weights".into(),
        ));
    }
    if let Some(b) = &budget {
        let charged = if b.count_weights {
            r.owned_with_weights_bytes()
        } else {
            r.owned_bytes()
        };
        lines.push(String::new());
        lines.push(format!(
            "budget: {} ({}), {} charged; largest ctx that fits: {}",
            mib(b.limit_bytes),
            if b.count_weights {
                "weights counted"
            } else {
                "weights not counted"
            },
            mib(charged),
            max_ctx.map_or("none".to_string(), |c| c.to_string())
        ));
    }
    write_lines(&lines)
}

/// `edge-run plan` for an encoder model: the embedder's memory (`--ctx` is the longest text).
fn plan_encoder(a: &PlanArgs, model: &Model) -> CliResult {
    let s = &a.session;
    if s.ubatch.is_some() {
        return Err(CliError::usage(
            "--ubatch does not apply to an encoder model (it runs each text in one pass of up to --ctx tokens); leave it out",
        ));
    }
    let cfg = embed_config(
        model,
        "--ctx",
        s.ctx,
        s.compute.threads,
        s.compute.device,
        &s.memory,
    )?;
    let budget = s.memory.budget()?;
    let plan = embed_plan(model, &cfg, budget.as_ref())?;
    let max_ctx = budget.as_ref().and_then(|b| {
        if s.ctx.is_none() {
            return Some(plan.max_tokens);
        }
        let probe = edge_engine::embed::EmbedConfig {
            max_tokens: None,
            ..cfg.clone()
        };
        edge_engine::embed::EmbedPlan::within_budget(model, &probe, b)
            .ok()
            .map(|p| p.max_tokens)
    });
    let r = plan.report;
    if a.json {
        let mut v = memory_json(&r, max_ctx, budget.as_ref());
        extend_json(
            &mut v,
            serde_json::json!({
                "ctx": plan.max_tokens,
                "ubatch": plan.max_tokens,
                "threads": plan.threads,
                "device": "cpu",
                "encoder": true,
                "pooling": plan.pooling.name(),
            }),
        );
        return write_lines(&[v.to_string()]);
    }
    let p = &model.params;
    let row = memory_row;
    let ratio = r.arena_bytes as f64 / (r.arena_lower_bound_bytes.max(1)) as f64;
    let mut lines = vec![
        format!(
            "{}: {} encoder (embeddings, {} pooling), {} layers; up to {} tokens per text, {} threads",
            a.model.display(),
            p.arch,
            plan.pooling.name(),
            p.n_layer,
            plan.max_tokens,
            plan.threads
        ),
        String::new(),
        row("weights", r.weights_bytes, "mapped from the file, not copied".into()),
        row("KV cache", 0, "none: an encoder sees each text in one pass".into()),
        row(
            "arena (activations)",
            r.arena_bytes,
            format!(
                "planned for {} tokens; lower bound {} ({ratio:.3}x the lower bound)",
                plan.max_tokens,
                mib(r.arena_lower_bound_bytes)
            ),
        ),
        row(
            "scratch",
            r.scratch_bytes,
            format!(
                "{} threads x {}",
                plan.threads,
                mib(r.scratch_bytes / plan.threads.max(1) as u64)
            ),
        ),
        row("total owned", r.owned_bytes(), "arena + scratch: allocated by the embedder".into()),
        row(
            "total with weights",
            r.owned_with_weights_bytes(),
            "owned + mapped weights".into(),
        ),
        row(
            "model runtime",
            r.runtime_bytes,
            "tokenizer and metadata heap, measured at load".into(),
        ),
        row(
            "total",
            r.total_bytes(),
            "what the process holds: weights + runtime + owned".into(),
        ),
    ];
    if let (Some(b), Some(m)) = (&budget, max_ctx) {
        lines.push(format!(
            "budget {} ({}): the longest text that fits is {m} tokens",
            mib(b.limit_bytes),
            if b.count_weights {
                "weights counted"
            } else {
                "weights not counted"
            }
        ));
    }
    write_lines(&lines)
}
