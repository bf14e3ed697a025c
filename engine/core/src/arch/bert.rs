//! BERT encoders (all-MiniLM, bge, ...): token + token-type (0) + absolute position
//! embeddings, a LayerNorm, then per block (post-norm)
//! `x = LN(x + Wo·Attention(Wq·x + bq, Wk·x + bk, Wv·x + bv) + bo)` with bidirectional attention
//! and `x = LN(x + Wdown·GELU(Wup·x + bup) + bdown)`; the token states are pooled (mean, CLS or
//! last token, from `{arch}.pooling_type`) into one embedding. As llama.cpp's `bert` graph.

use edge_gguf::{GgmlType, Gguf};

use crate::error::{EngineError, Result};
use crate::graph::build::GraphBuilder;
use crate::graph::{Graph, Op, Pooling, TableRow, ValueId, WeightId};
use crate::model::hparams::HyperParams;
use crate::model::weights::{bind, Weight};

/// The weights of one encoder block.
#[derive(Debug, Clone)]
pub struct BertLayerWeights {
    /// Query projection and bias.
    pub wq: WeightId,
    /// Query bias.
    pub bq: Option<WeightId>,
    /// Key projection.
    pub wk: WeightId,
    /// Key bias.
    pub bk: Option<WeightId>,
    /// Value projection.
    pub wv: WeightId,
    /// Value bias.
    pub bv: Option<WeightId>,
    /// Attention output projection.
    pub wo: WeightId,
    /// Attention output bias.
    pub bo: Option<WeightId>,
    /// LayerNorm after the attention residual (weight, bias).
    pub attn_out_norm: (WeightId, WeightId),
    /// Feed-forward up projection.
    pub w_up: WeightId,
    /// Up bias.
    pub b_up: Option<WeightId>,
    /// Feed-forward down projection.
    pub w_down: WeightId,
    /// Down bias.
    pub b_down: Option<WeightId>,
    /// LayerNorm after the feed-forward residual (weight, bias).
    pub layer_out_norm: (WeightId, WeightId),
}

/// The weights and encoder-only hyper-parameters of a BERT model.
#[derive(Debug, Clone)]
pub struct BertWeights {
    /// Token embedding table [n_vocab rows of n_embd].
    pub token_embd: WeightId,
    /// Token-type table; row 0 ("sentence A") is added to every token. Optional, as in llama.cpp.
    pub token_types: Option<WeightId>,
    /// Absolute position table [n_ctx_train rows of n_embd].
    pub position_embd: WeightId,
    /// LayerNorm of the summed embeddings (weight, bias).
    pub embd_norm: (WeightId, WeightId),
    /// Blocks.
    pub layers: Vec<BertLayerWeights>,
    /// `{arch}.attention.layer_norm_epsilon`.
    pub norm_eps: f32,
    /// `{arch}.pooling_type` as the file says it (0 or absent: none, 1 mean, 2 cls, 3 last,
    /// 4 rank); see [`BertWeights::pooling`].
    pub pooling_type: u32,
}

impl BertWeights {
    /// The pooling the metadata asks for, if it is one this engine computes (mean, cls, last).
    pub fn pooling(&self) -> Option<Pooling> {
        match self.pooling_type {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }
}

/// Finds and checks every tensor of a BERT model.
pub fn bind_weights(g: &Gguf, p: &HyperParams, weights: &mut Vec<Weight>) -> Result<BertWeights> {
    let (d, a) = (p.n_embd as u64, p.arch.as_str());
    let ff = p.n_ff as u64;
    let qkv_dim = (p.n_head * p.head_dim) as u64;
    if p.n_head_kv != p.n_head {
        return Err(EngineError::Metadata {
            key: format!("{a}.attention.head_count_kv"),
            problem: format!(
                "{} key/value heads for {} query heads: BERT has no grouped-query attention",
                p.n_head_kv, p.n_head
            ),
        });
    }
    let opt = |weights: &mut Vec<Weight>, name: &str, shape: &[u64]| -> Result<Option<WeightId>> {
        match g.tensor(name) {
            Some(_) => bind(g, weights, a, name, shape).map(Some),
            None => Ok(None),
        }
    };
    let token_embd = bind(g, weights, a, "token_embd.weight", &[d, p.n_vocab as u64])?;
    let token_types = match g.tensor("token_types.weight") {
        Some(t) => {
            let n_types = t.dims.get(1).copied().unwrap_or(1).max(1);
            Some(bind(g, weights, a, "token_types.weight", &[d, n_types])?)
        }
        None => None,
    };
    let position_embd = bind(
        g,
        weights,
        a,
        "position_embd.weight",
        &[d, p.n_ctx_train as u64],
    )?;
    let embd_norm = (
        bind(g, weights, a, "token_embd_norm.weight", &[d])?,
        bind(g, weights, a, "token_embd_norm.bias", &[d])?,
    );
    // Grown as layers bind: the first missing tensor ends the loop, so a layer count the
    // file cannot back never sizes an allocation.
    let mut layers = Vec::new();
    for l in 0..p.n_layer {
        let n = |s: &str, kind: &str| format!("blk.{l}.{s}.{kind}");
        let w = |weights: &mut Vec<Weight>, s: &str, shape: &[u64]| {
            bind(g, weights, a, &n(s, "weight"), shape)
        };
        layers.push(BertLayerWeights {
            wq: w(weights, "attn_q", &[d, qkv_dim])?,
            bq: opt(weights, &n("attn_q", "bias"), &[qkv_dim])?,
            wk: w(weights, "attn_k", &[d, qkv_dim])?,
            bk: opt(weights, &n("attn_k", "bias"), &[qkv_dim])?,
            wv: w(weights, "attn_v", &[d, qkv_dim])?,
            bv: opt(weights, &n("attn_v", "bias"), &[qkv_dim])?,
            wo: w(weights, "attn_output", &[qkv_dim, d])?,
            bo: opt(weights, &n("attn_output", "bias"), &[d])?,
            attn_out_norm: (
                w(weights, "attn_output_norm", &[d])?,
                bind(g, weights, a, &n("attn_output_norm", "bias"), &[d])?,
            ),
            w_up: w(weights, "ffn_up", &[d, ff])?,
            b_up: opt(weights, &n("ffn_up", "bias"), &[ff])?,
            w_down: w(weights, "ffn_down", &[ff, d])?,
            b_down: opt(weights, &n("ffn_down", "bias"), &[d])?,
            layer_out_norm: (
                w(weights, "layer_output_norm", &[d])?,
                bind(g, weights, a, &n("layer_output_norm", "bias"), &[d])?,
            ),
        });
    }
    // Norms and biases are read as f32 vectors by the kernels.
    for w in weights.iter() {
        let vector = w.name.ends_with(".bias") || w.name.ends_with("norm.weight");
        if vector && w.ty != GgmlType::F32 {
            return Err(EngineError::UnsupportedTensorType {
                name: w.name.clone(),
                ty: w.ty,
            });
        }
    }
    let eps_key = format!("{a}.attention.layer_norm_epsilon");
    if g.get(&eps_key).is_none() {
        return Err(EngineError::Metadata {
            key: eps_key,
            problem: "missing or not a number (BERT's LayerNorm needs it)".into(),
        });
    }
    let norm_eps = crate::model::hparams::finite_positive(g, &eps_key, 0.0)?;
    let pooling_type = match g.get_u64(&format!("{a}.pooling_type")) {
        Some(v) if v <= 4 => v as u32,
        Some(v) => {
            return Err(EngineError::Metadata {
                key: format!("{a}.pooling_type"),
                problem: format!(
                    "{v} is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
                ),
            })
        }
        None => 0,
    };
    Ok(BertWeights {
        token_embd,
        token_types,
        position_embd,
        embd_norm,
        layers,
        norm_eps,
        pooling_type,
    })
}

/// `w · x (+ bias)` for each of `ws`, with `x` converted once per activation type for all.
fn linear(
    b: &mut GraphBuilder<'_>,
    x: ValueId,
    ws: &[(String, WeightId, Option<WeightId>)],
) -> Vec<ValueId> {
    let mut converted = Vec::new();
    ws.iter()
        .map(|(name, w, bias)| {
            let out = b.matmul_sharing(name.clone(), *w, x, &mut converted);
            match bias {
                Some(bias) => b.add_bias(format!("{name}.bias"), out, *bias),
                None => out,
            }
        })
        .collect()
}

/// Builds the encoder for up to `ubatch` tokens per run (one run sees the whole input), pooled
/// with `pooling`: the output is one row of `n_embd` values, not normalised.
pub fn build_graph_pooled(
    p: &HyperParams,
    weights: &[Weight],
    w: &BertWeights,
    ubatch: usize,
    pooling: Pooling,
) -> Graph {
    let (d, t) = (p.n_embd, ubatch);
    let mut b = GraphBuilder::new(weights, ubatch);
    let mut x = b.f32("token_embd".into(), t, d);
    b.push(Op::Embed {
        table: w.token_embd,
        out: x,
    });
    if let Some(types) = w.token_types {
        let y = b.f32("token_types".into(), t, d);
        b.push(Op::AddTableRow {
            x,
            table: types,
            row: TableRow::Fixed(0),
            out: y,
        });
        x = y;
    }
    let y = b.f32("position_embd".into(), t, d);
    b.push(Op::AddTableRow {
        x,
        table: w.position_embd,
        row: TableRow::Position,
        out: y,
    });
    x = b.layer_norm("token_embd_norm".into(), y, w.embd_norm, w.norm_eps);
    let qkv_dim = p.n_head * p.head_dim;
    for (l, lw) in w.layers.iter().enumerate() {
        let qkv = linear(
            &mut b,
            x,
            &[
                (format!("blk.{l}.attn_q"), lw.wq, lw.bq),
                (format!("blk.{l}.attn_k"), lw.wk, lw.bk),
                (format!("blk.{l}.attn_v"), lw.wv, lw.bv),
            ],
        );
        let att = b.f32(format!("blk.{l}.attn"), t, qkv_dim);
        b.push(Op::EncoderAttention {
            q: qkv[0],
            k: qkv[1],
            v: qkv[2],
            n_head: p.n_head,
            head_dim: p.head_dim,
            scale: 1.0 / (p.head_dim as f32).sqrt(),
            out: att,
        });
        let o = linear(
            &mut b,
            att,
            &[(format!("blk.{l}.attn_output"), lw.wo, lw.bo)],
        )[0];
        let r = b.add(format!("blk.{l}.attn_residual"), o, x);
        let h = b.layer_norm(
            format!("blk.{l}.attn_output_norm"),
            r,
            lw.attn_out_norm,
            w.norm_eps,
        );
        let up = linear(&mut b, h, &[(format!("blk.{l}.ffn_up"), lw.w_up, lw.b_up)])[0];
        let act = b.f32(format!("blk.{l}.ffn_gelu"), t, p.n_ff);
        b.push(Op::Gelu { x: up, out: act });
        let down = linear(
            &mut b,
            act,
            &[(format!("blk.{l}.ffn_down"), lw.w_down, lw.b_down)],
        )[0];
        let r2 = b.add(format!("blk.{l}.ffn_residual"), down, h);
        x = b.layer_norm(
            format!("blk.{l}.layer_output_norm"),
            r2,
            lw.layer_out_norm,
            w.norm_eps,
        );
    }
    let pooled = b.f32(format!("pooled_{}", pooling.name()), 1, d);
    b.push(Op::Pool {
        x,
        pooling,
        out: pooled,
    });
    b.finish(pooled)
}

/// [`build_graph_pooled`] with the metadata's pooling (mean when the file names none this
/// engine computes; [`crate::embed`] refuses such files unless a pooling is given).
pub fn build_graph(p: &HyperParams, weights: &[Weight], w: &BertWeights, ubatch: usize) -> Graph {
    build_graph_pooled(p, weights, w, ubatch, w.pooling().unwrap_or(Pooling::Mean))
}
