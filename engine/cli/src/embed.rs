//! `edge-run embed`: sentence embeddings from an encoder model, one per text, through the
//! library's embedder; and the embedder's settings from the command line, which `plan` shares.

use std::sync::Arc;

use edge_engine::backend::cuda::cuda_unsupported;
use edge_engine::device::Device;
use edge_engine::error::EngineError;
use edge_engine::kv::KvType;
use edge_engine::model::Model;

use crate::args::{EmbedArgs, MemoryFlags};
use crate::errors::{hint, hint_text, load_model, CliError, CliResult};
use crate::output::write_lines;

/// The embedder's settings from the command line, refusing the flags that do not apply to an
/// encoder (it has no KV cache and runs on the CPU).
pub fn embed_config(
    model: &Model,
    flag: &str,
    max_tokens: Option<usize>,
    threads: Option<usize>,
    device: Option<Device>,
    budget: &MemoryFlags,
) -> CliResult<edge_engine::embed::EmbedConfig> {
    if let Some(Device::Cuda(_)) = device {
        let reason = cuda_unsupported(model).map_or_else(
            || "encoder models run on the CPU; use --device cpu".to_string(),
            |r| hint_text(&r),
        );
        return Err(CliError::usage(format!("--device cuda: {reason}")));
    }
    if budget.kv_type != KvType::F16 || budget.flash_attn {
        return Err(CliError::usage(
            "--kv-type and --flash-attn do not apply to an encoder model (it has no KV cache); leave them out",
        ));
    }
    let n_ctx = model.params.n_ctx_train;
    if let Some(n) = max_tokens.filter(|&n| n > n_ctx) {
        return Err(CliError::usage(format!(
            "{flag} {n}: the model takes at most {n_ctx} tokens per text (its position table); use at most {n_ctx}"
        )));
    }
    Ok(edge_engine::embed::EmbedConfig {
        max_tokens,
        threads,
        ..Default::default()
    })
}

/// Plans an embedder, within the budget if there is one.
pub fn embed_plan(
    model: &Model,
    cfg: &edge_engine::embed::EmbedConfig,
    budget: Option<&edge_targets::Budget>,
) -> CliResult<edge_engine::embed::EmbedPlan> {
    use edge_engine::embed::EmbedPlan;
    match budget {
        None => EmbedPlan::new(model, cfg),
        Some(b) => EmbedPlan::within_budget(model, cfg, b),
    }
    .map_err(|e| match e {
        EngineError::Budget(_) => CliError::from(format!(
            "{} (for an encoder the context is the longest text: --max-tokens / --ctx)",
            hint(&e)
        )),
        e => CliError::from(format!("cannot plan the embedder: {}", hint(&e))),
    })
}

/// `edge-run embed`: one embedding per text.
pub fn embed(a: EmbedArgs) -> CliResult {
    let model = load_model(&a.model)?;
    if !model.layout.is_encoder() {
        return Err(format!(
            "{}: {} is a decoder (text generation) model; `edge-run embed` needs an encoder (embedding) model such as all-MiniLM-L6-v2 (scripts/fetch-embed-model.sh fetches it)",
            a.model.display(),
            model.params.arch
        )
        .into());
    }
    let mut cfg = embed_config(
        &model,
        "--max-tokens",
        a.max_tokens,
        a.threads,
        a.device,
        &a.memory,
    )?;
    cfg.pooling = a.pooling;
    // The two flags override each other: the last one given wins.
    cfg.normalize = !a.no_normalize;
    let budget = a.memory.budget()?;
    let plan = embed_plan(&model, &cfg, budget.as_ref())?;
    let model = Arc::new(model);
    let mut embedder = edge_engine::embed::Embedder::from_plan(Arc::clone(&model), plan)
        .map_err(|e| format!("cannot set up the embedder: {}", hint(&e)))?;
    let mut lines = Vec::with_capacity(a.texts.len());
    let mut records = Vec::new();
    for (i, text) in a.texts.iter().enumerate() {
        let n_tokens = model
            .tokenize(text, true, false)
            .map_err(|e| format!("text {}: {}", i + 1, hint(&e)))?
            .len();
        // The embedder numbers the one text it is given "text 1"; here it is text i + 1.
        let v = embedder.embed(&[text.as_str()]).map_err(|e| match e {
            EngineError::InvalidArgument(_) | EngineError::InvalidSetting { .. } => {
                hint(&e).replacen("text 1 ", &format!("text {} ", i + 1), 1)
            }
            e => format!("text {}: {}", i + 1, hint(&e)),
        })?;
        let v = v.into_iter().next().unwrap_or_default();
        if a.json {
            records.push(serde_json::json!({
                "text": text,
                "n_tokens": n_tokens,
                "embedding": v,
            }));
        } else {
            lines.push(
                v.iter()
                    .map(|x| format!("{x:.6}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
    }
    if a.json {
        lines.push(serde_json::Value::Array(records).to_string());
    }
    write_lines(&lines)
}
