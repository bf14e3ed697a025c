//! Decoder-only transformers of the Llama family and its relatives — `llama` (with Llama 3's
//! rope frequency factors), `qwen2`, `qwen3`, `phi3`, `gemma2`, `gemma3` — as one graph
//! builder whose optional parts the architecture's weights and hyper-parameters switch on.
//!
//! Per block: `h = RMSNorm(x)`; q, k, v from `h` (three matrices or one fused `attn_qkv`,
//! plus Qwen2's biases); per-head RMSNorm of q and k (Qwen3, Gemma 3); RoPE (per layer: Gemma
//! 3's local layers have their own base); queries scaled (Phi-3, Gemma); causal attention,
//! over a sliding window on Gemma's local layers and with Gemma 2's score soft-capping;
//! `o = Wo·att`, RMSNorm'd again on Gemma; `x += o`; then the gated feed-forward block
//! (SwiGLU, or GeGLU on Gemma; gate and up fused in one `ffn_up` on Phi-3), RMSNorm'd again on
//! Gemma; `x += ffn`. Gemma scales the embeddings by sqrt(n_embd) and Gemma 2 soft-caps the
//! logits. The output head is tied to the embedding table when the file has no
//! `output.weight`. What each architecture computes follows llama.cpp's `src/models/*.cpp`.

use edge_gguf::{GgmlType, Gguf};

use crate::error::{EngineError, Result};
use crate::graph::build::GraphBuilder;
use crate::graph::{Attention, Graph, Op, WeightId};
use crate::model::hparams::{FfnActivation, HyperParams};
use crate::model::weights::{bind, Weight};

/// The query, key and value projections of a block.
#[derive(Debug, Clone)]
pub enum QkvWeights {
    /// Three matrices (`attn_q`, `attn_k`, `attn_v`).
    Separate {
        /// Query projection.
        wq: WeightId,
        /// Key projection.
        wk: WeightId,
        /// Value projection.
        wv: WeightId,
    },
    /// One matrix whose output rows are q, then k, then v (`attn_qkv`, Phi-3).
    Fused(WeightId),
}

/// The gate and up projections of a gated feed-forward block.
#[derive(Debug, Clone)]
pub enum GateUpWeights {
    /// Two matrices (`ffn_gate`, `ffn_up`).
    Separate {
        /// Gate projection (goes through the activation).
        gate: WeightId,
        /// Up projection.
        up: WeightId,
    },
    /// One `ffn_up` matrix of 2 x n_ff rows: the gate, then the up projection (Phi-3).
    Fused(WeightId),
}

/// The weights of one decoder block. The optional ones exist in some architectures only.
#[derive(Debug, Clone)]
pub struct DecoderLayerWeights {
    /// RMSNorm before attention.
    pub attn_norm: WeightId,
    /// Query, key and value projections.
    pub qkv: QkvWeights,
    /// Biases of q, k and v (Qwen2).
    pub qkv_bias: Option<[WeightId; 3]>,
    /// Per-head RMSNorm of the queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: Option<[WeightId; 2]>,
    /// Attention output projection.
    pub wo: WeightId,
    /// RMSNorm of the attention output before the residual add (Gemma 2/3).
    pub post_attn_norm: Option<WeightId>,
    /// RMSNorm before the feed-forward block.
    pub ffn_norm: WeightId,
    /// Gate and up projections.
    pub gate_up: GateUpWeights,
    /// Feed-forward down projection.
    pub w_down: WeightId,
    /// RMSNorm of the feed-forward output before the residual add (Gemma 2/3).
    pub post_ffn_norm: Option<WeightId>,
}

/// The weights of a decoder-only model (Llama family).
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Token embedding table [n_vocab rows of n_embd].
    pub token_embd: WeightId,
    /// Blocks.
    pub layers: Vec<DecoderLayerWeights>,
    /// Final RMSNorm.
    pub output_norm: WeightId,
    /// Output head; the embedding table when the model ties them.
    pub output: WeightId,
    /// Llama 3 rotary frequency factors (`rope_freqs.weight`, n_rot / 2 values): frequency i
    /// is divided by factor i.
    pub rope_freqs: Option<WeightId>,
}

/// Finds and checks every tensor of a decoder model of one of the supported architectures.
pub fn bind_weights(
    g: &Gguf,
    p: &HyperParams,
    weights: &mut Vec<Weight>,
) -> Result<DecoderWeights> {
    let (d, a) = (p.n_embd as u64, p.arch.as_str());
    let q_dim = (p.n_head * p.head_dim) as u64;
    let kv_dim = p.kv_dim() as u64;
    let hd = p.head_dim as u64;
    let ff = p.n_ff as u64;
    let gemma = matches!(a, "gemma2" | "gemma3");
    let token_embd = bind(g, weights, a, "token_embd.weight", &[d, p.n_vocab as u64])?;
    // Grown as layers bind: the first missing tensor ends the loop, so a layer count the
    // file cannot back never sizes an allocation.
    let mut layers = Vec::new();
    for l in 0..p.n_layer {
        let has = |name: &str| g.tensor(&format!("blk.{l}.{name}")).is_some();
        let mut w =
            |name: &str, shape: &[u64]| bind(g, weights, a, &format!("blk.{l}.{name}"), shape);
        let attn_norm = w("attn_norm.weight", &[d])?;
        let qkv = if has("attn_qkv.weight") {
            QkvWeights::Fused(w("attn_qkv.weight", &[d, q_dim + 2 * kv_dim])?)
        } else {
            QkvWeights::Separate {
                wq: w("attn_q.weight", &[d, q_dim])?,
                wk: w("attn_k.weight", &[d, kv_dim])?,
                wv: w("attn_v.weight", &[d, kv_dim])?,
            }
        };
        let qkv_bias = if has("attn_q.bias") || a == "qwen2" {
            Some([
                w("attn_q.bias", &[q_dim])?,
                w("attn_k.bias", &[kv_dim])?,
                w("attn_v.bias", &[kv_dim])?,
            ])
        } else {
            None
        };
        let qk_norm = if has("attn_q_norm.weight") || matches!(a, "qwen3" | "gemma3") {
            Some([
                w("attn_q_norm.weight", &[hd])?,
                w("attn_k_norm.weight", &[hd])?,
            ])
        } else {
            None
        };
        let wo = w("attn_output.weight", &[q_dim, d])?;
        let post_attn_norm = if gemma {
            Some(w("post_attention_norm.weight", &[d])?)
        } else {
            None
        };
        let ffn_norm = w("ffn_norm.weight", &[d])?;
        let gate_up = if a == "phi3" && !has("ffn_gate.weight") {
            GateUpWeights::Fused(w("ffn_up.weight", &[d, 2 * ff])?)
        } else {
            GateUpWeights::Separate {
                gate: w("ffn_gate.weight", &[d, ff])?,
                up: w("ffn_up.weight", &[d, ff])?,
            }
        };
        let w_down = w("ffn_down.weight", &[ff, d])?;
        let post_ffn_norm = if gemma {
            Some(w("post_ffw_norm.weight", &[d])?)
        } else {
            None
        };
        layers.push(DecoderLayerWeights {
            attn_norm,
            qkv,
            qkv_bias,
            qk_norm,
            wo,
            post_attn_norm,
            ffn_norm,
            gate_up,
            w_down,
            post_ffn_norm,
        });
    }
    let output_norm = bind(g, weights, a, "output_norm.weight", &[d])?;
    let output = if g.tensor("output.weight").is_some() {
        bind(g, weights, a, "output.weight", &[d, p.n_vocab as u64])?
    } else {
        token_embd
    };
    // Phi-3's long-context variants switch between two factor sets by context length, with an
    // attention factor: not implemented, and running without them would be silently wrong.
    if let Some(t) = ["rope_factors_long.weight", "rope_factors_short.weight"]
        .into_iter()
        .find(|t| g.tensor(t).is_some())
    {
        return Err(EngineError::Metadata {
            key: t.into(),
            problem: "long-context rope factors (Phi-3 128k \"longrope\") are not supported yet; use a 4k-context variant of the model".into(),
        });
    }
    let rope_freqs = if g.tensor("rope_freqs.weight").is_some() {
        Some(bind(
            g,
            weights,
            a,
            "rope_freqs.weight",
            &[(p.rope.n_rot / 2) as u64],
        )?)
    } else {
        None
    };
    for w in weights.iter() {
        let vector = w.name.ends_with("norm.weight")
            || w.name.ends_with(".bias")
            || w.name == "rope_freqs.weight";
        if vector && w.ty != GgmlType::F32 {
            return Err(EngineError::UnsupportedTensorType {
                name: w.name.clone(),
                ty: w.ty,
            });
        }
    }
    Ok(DecoderWeights {
        token_embd,
        layers,
        output_norm,
        output,
        rope_freqs,
    })
}

/// Builds the forward pass for up to `ubatch` tokens per run. With `every_row` false only the
/// last position's logits are computed (the output head runs on one row: a prompt chunk); with
/// it true every row gets its logits (rows that are each the next token of a different
/// sequence, decoded together: [`crate::session::group`]).
pub fn build_graph(
    p: &HyperParams,
    weights: &[Weight],
    lw: &DecoderWeights,
    ubatch: usize,
    every_row: bool,
) -> Graph {
    let (d, t) = (p.n_embd, ubatch);
    let (q_dim, kv_dim) = (p.n_head * p.head_dim, p.kv_dim());
    let eps = p.rms_eps;
    let mut b = GraphBuilder::new(weights, ubatch);
    let mut x = b.f32("token_embd".into(), t, d);
    b.push(Op::Embed {
        table: lw.token_embd,
        out: x,
    });
    if let Some(factor) = p.embd_scale {
        x = b.scale("token_embd.scaled".into(), x, factor);
    }
    for (l, w) in lw.layers.iter().enumerate() {
        let h = b.rms_norm(format!("blk.{l}.attn_norm"), x, w.attn_norm, eps);
        let (mut q, mut k, v) = match w.qkv {
            QkvWeights::Separate { wq, wk, wv } => {
                let qkv = b.matmuls(
                    h,
                    &[
                        (format!("blk.{l}.attn_q"), wq),
                        (format!("blk.{l}.attn_k"), wk),
                        (format!("blk.{l}.attn_v"), wv),
                    ],
                );
                (qkv[0], qkv[1], qkv[2])
            }
            QkvWeights::Fused(wqkv) => {
                let qkv = b.matmul(format!("blk.{l}.attn_qkv"), wqkv, h);
                (
                    b.columns(format!("blk.{l}.attn_q"), qkv, 0, q_dim),
                    b.columns(format!("blk.{l}.attn_k"), qkv, q_dim, kv_dim),
                    b.columns(format!("blk.{l}.attn_v"), qkv, q_dim + kv_dim, kv_dim),
                )
            }
        };
        let v = match w.qkv_bias {
            Some([bq, bk, bv]) => {
                q = b.add_bias(format!("blk.{l}.attn_q.bias"), q, bq);
                k = b.add_bias(format!("blk.{l}.attn_k.bias"), k, bk);
                b.add_bias(format!("blk.{l}.attn_v.bias"), v, bv)
            }
            None => v,
        };
        if let Some([q_norm, k_norm]) = w.qk_norm {
            q = b.head_rms_norm(format!("blk.{l}.attn_q_norm"), q, q_norm, eps, p.head_dim);
            k = b.head_rms_norm(format!("blk.{l}.attn_k_norm"), k, k_norm, eps, p.head_dim);
        }
        let rope = p.layer_rope(l);
        let mut q_rot = b.f32(format!("blk.{l}.attn_q.rope"), t, q_dim);
        b.push(Op::Rope {
            x: q,
            head_dim: p.head_dim,
            rope,
            freq_factors: lw.rope_freqs,
            out: q_rot,
        });
        let k_rot = b.f32(format!("blk.{l}.attn_k.rope"), t, kv_dim);
        b.push(Op::Rope {
            x: k,
            head_dim: p.head_dim,
            rope,
            freq_factors: lw.rope_freqs,
            out: k_rot,
        });
        // Phi-3 and Gemma scale the queries, then attend with a scale of 1.
        let scale = match p.query_scale {
            Some(factor) => {
                q_rot = b.scale(format!("blk.{l}.attn_q.scaled"), q_rot, factor);
                1.0
            }
            None => 1.0 / (p.head_dim as f32).sqrt(),
        };
        b.push(Op::StoreKv {
            k: k_rot,
            v,
            layer: l,
            head_dim: p.head_dim,
        });
        let att = b.f32(format!("blk.{l}.attn"), t, q_dim);
        b.push(Op::Attention(Attention {
            q: q_rot,
            layer: l,
            n_head: p.n_head,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            scale,
            window: p.layer_window(l),
            softcap: p.attn_softcap,
            out: att,
        }));
        let mut o = b.matmul(format!("blk.{l}.attn_output"), w.wo, att);
        if let Some(norm) = w.post_attn_norm {
            o = b.rms_norm(format!("blk.{l}.post_attention_norm"), o, norm, eps);
        }
        let x_mid = b.add(format!("blk.{l}.attn_residual"), x, o);
        let h2 = b.rms_norm(format!("blk.{l}.ffn_norm"), x_mid, w.ffn_norm, eps);
        let (gate, up) = match w.gate_up {
            GateUpWeights::Separate { gate, up } => {
                let gu = b.matmuls(
                    h2,
                    &[
                        (format!("blk.{l}.ffn_gate"), gate),
                        (format!("blk.{l}.ffn_up"), up),
                    ],
                );
                (gu[0], gu[1])
            }
            GateUpWeights::Fused(wgu) => {
                let gu = b.matmul(format!("blk.{l}.ffn_gate_up"), wgu, h2);
                (
                    b.columns(format!("blk.{l}.ffn_gate"), gu, 0, p.n_ff),
                    b.columns(format!("blk.{l}.ffn_up"), gu, p.n_ff, p.n_ff),
                )
            }
        };
        let act = match p.ffn_act {
            FfnActivation::Silu => {
                let act = b.f32(format!("blk.{l}.ffn_swiglu"), t, p.n_ff);
                b.push(Op::SwiGlu { gate, up, out: act });
                act
            }
            FfnActivation::Gelu => {
                let act = b.f32(format!("blk.{l}.ffn_geglu"), t, p.n_ff);
                b.push(Op::GeGlu { gate, up, out: act });
                act
            }
        };
        let mut down = b.matmul(format!("blk.{l}.ffn_down"), w.w_down, act);
        if let Some(norm) = w.post_ffn_norm {
            down = b.rms_norm(format!("blk.{l}.post_ffw_norm"), down, norm, eps);
        }
        x = b.add(format!("blk.{l}.ffn_residual"), x_mid, down);
    }
    let (head_in, head_rows) = if every_row {
        (x, t)
    } else {
        let last = b.f32("last_position".into(), 1, d);
        b.push(Op::TakeLast { x, out: last });
        (last, 1)
    };
    let normed = b.rms_norm("output_norm".into(), head_in, lw.output_norm, eps);
    let mut logits = b.matmul("logits".into(), lw.output, normed);
    if let Some(cap) = p.final_softcap {
        let capped = b.f32("logits.softcap".into(), head_rows, p.n_vocab);
        b.push(Op::SoftCap {
            x: logits,
            cap,
            out: capped,
        });
        logits = capped;
    }
    b.finish(logits)
}
