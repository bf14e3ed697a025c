//! The Llama family: token embedding, then per block
//! `x += Wo · Attention(RoPE(Wq·RMSNorm(x)), RoPE(Wk·RMSNorm(x)), Wv·RMSNorm(x))` and
//! `x += Wdown · (SiLU(Wgate·RMSNorm(x)) ⊙ Wup·RMSNorm(x))`, a final RMSNorm and the output head
//! (tied to the embedding table when the file has no `output.weight`).

use crate::cpu;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::graph::{Graph, Op, ValueId, ValueType, WeightId};
use crate::model::{bind, DecoderLayerWeights, DecoderWeights, HyperParams, Model, Weight};

/// Finds and checks every tensor of a Llama-family model.
pub fn bind_weights(
    g: &Gguf,
    p: &HyperParams,
    weights: &mut Vec<Weight>,
) -> Result<DecoderWeights> {
    let (d, a) = (p.n_embd as u64, p.arch.as_str());
    let q_dim = (p.n_head * p.head_dim) as u64;
    let kv_dim = p.kv_dim() as u64;
    let ff = p.n_ff as u64;
    let token_embd = bind(g, weights, a, "token_embd.weight", &[d, p.n_vocab as u64])?;
    let mut layers = Vec::with_capacity(p.n_layer);
    for l in 0..p.n_layer {
        let mut w = |name: &str, shape: &[u64]| {
            bind(g, weights, a, &format!("blk.{l}.{name}.weight"), shape)
        };
        layers.push(DecoderLayerWeights {
            attn_norm: w("attn_norm", &[d])?,
            wq: w("attn_q", &[d, q_dim])?,
            wk: w("attn_k", &[d, kv_dim])?,
            wv: w("attn_v", &[d, kv_dim])?,
            wo: w("attn_output", &[q_dim, d])?,
            ffn_norm: w("ffn_norm", &[d])?,
            w_gate: w("ffn_gate", &[d, ff])?,
            w_up: w("ffn_up", &[d, ff])?,
            w_down: w("ffn_down", &[ff, d])?,
        });
    }
    let output_norm = bind(g, weights, a, "output_norm.weight", &[d])?;
    let output = if g.tensor("output.weight").is_some() {
        bind(g, weights, a, "output.weight", &[d, p.n_vocab as u64])?
    } else {
        token_embd
    };
    for w in weights.iter() {
        if w.name.ends_with("norm.weight") && w.ty != crate::tensor::GgmlType::F32 {
            return Err(crate::error::EngineError::UnsupportedTensorType {
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
    })
}

/// Helper that names values and inserts the activation quantization each matmul needs.
struct Builder<'m> {
    model: &'m Model,
    g: Graph,
}

impl Builder<'_> {
    fn f32(&mut self, name: String, rows: usize, cols: usize) -> ValueId {
        self.g.value(name, rows, cols, ValueType::F32)
    }

    /// `x` quantized for the weight's vec-dot type, then the matmul.
    fn matmul(&mut self, name: String, w: WeightId, x: ValueId) -> ValueId {
        let weight = self.model.weight(w);
        let act_ty = cpu::vec_dot_type(weight.ty);
        let rows = self.g.values[x.0].rows;
        let cols = self.g.values[x.0].cols;
        let xq = self.g.value(
            format!("{name}.in_q"),
            rows,
            cols,
            ValueType::Quantized(act_ty),
        );
        self.g.push(Op::Quantize { x, out: xq });
        let out = self.f32(name, rows, weight.n_rows);
        self.g.push(Op::MatMul {
            weight: w,
            x: xq,
            out,
        });
        out
    }

    /// Several matmuls over the same input sharing one quantized copy when their types agree.
    fn matmuls(&mut self, x: ValueId, ws: &[(String, WeightId)]) -> Vec<ValueId> {
        let rows = self.g.values[x.0].rows;
        let cols = self.g.values[x.0].cols;
        let mut quantized: Vec<(crate::tensor::GgmlType, ValueId)> = Vec::new();
        let mut outs = Vec::new();
        for (name, w) in ws {
            let weight = self.model.weight(*w);
            let act_ty = cpu::vec_dot_type(weight.ty);
            let xq = match quantized.iter().find(|(t, _)| *t == act_ty) {
                Some(&(_, v)) => v,
                None => {
                    let v = self.g.value(
                        format!("{name}.in_q"),
                        rows,
                        cols,
                        ValueType::Quantized(act_ty),
                    );
                    self.g.push(Op::Quantize { x, out: v });
                    quantized.push((act_ty, v));
                    v
                }
            };
            let out = self.f32(name.clone(), rows, weight.n_rows);
            self.g.push(Op::MatMul {
                weight: *w,
                x: xq,
                out,
            });
            outs.push(out);
        }
        outs
    }
}

/// Builds the forward pass for up to `ubatch` tokens per run. Only the last position's logits
/// are computed: the output head runs on one row.
pub fn build_graph(model: &Model, lw: &DecoderWeights, ubatch: usize) -> Graph {
    let p = &model.params;
    let (d, t) = (p.n_embd, ubatch);
    let mut b = Builder {
        model,
        g: Graph::new(ubatch),
    };
    let mut x = b.f32("token_embd".into(), t, d);
    b.g.push(Op::Embed {
        table: lw.token_embd,
        out: x,
    });
    for (l, w) in lw.layers.iter().enumerate() {
        let h = b.f32(format!("blk.{l}.attn_norm"), t, d);
        b.g.push(Op::RmsNorm {
            x,
            weight: w.attn_norm,
            eps: p.rms_eps,
            out: h,
        });
        let qkv = b.matmuls(
            h,
            &[
                (format!("blk.{l}.attn_q"), w.wq),
                (format!("blk.{l}.attn_k"), w.wk),
                (format!("blk.{l}.attn_v"), w.wv),
            ],
        );
        let (q, k, v) = (qkv[0], qkv[1], qkv[2]);
        let q_rot = b.f32(format!("blk.{l}.attn_q.rope"), t, p.n_head * p.head_dim);
        b.g.push(Op::Rope {
            x: q,
            head_dim: p.head_dim,
            rope: p.rope,
            out: q_rot,
        });
        let k_rot = b.f32(format!("blk.{l}.attn_k.rope"), t, p.kv_dim());
        b.g.push(Op::Rope {
            x: k,
            head_dim: p.head_dim,
            rope: p.rope,
            out: k_rot,
        });
        b.g.push(Op::StoreKv {
            k: k_rot,
            v,
            layer: l,
        });
        let att = b.f32(format!("blk.{l}.attn"), t, p.n_head * p.head_dim);
        b.g.push(Op::Attention {
            q: q_rot,
            layer: l,
            n_head: p.n_head,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            scale: 1.0 / (p.head_dim as f32).sqrt(),
            out: att,
        });
        let o = b.matmul(format!("blk.{l}.attn_output"), w.wo, att);
        let x_mid = b.f32(format!("blk.{l}.attn_residual"), t, d);
        b.g.push(Op::Add {
            a: x,
            b: o,
            out: x_mid,
        });
        let h2 = b.f32(format!("blk.{l}.ffn_norm"), t, d);
        b.g.push(Op::RmsNorm {
            x: x_mid,
            weight: w.ffn_norm,
            eps: p.rms_eps,
            out: h2,
        });
        let gu = b.matmuls(
            h2,
            &[
                (format!("blk.{l}.ffn_gate"), w.w_gate),
                (format!("blk.{l}.ffn_up"), w.w_up),
            ],
        );
        let act = b.f32(format!("blk.{l}.ffn_swiglu"), t, p.n_ff);
        b.g.push(Op::SwiGlu {
            gate: gu[0],
            up: gu[1],
            out: act,
        });
        let down = b.matmul(format!("blk.{l}.ffn_down"), w.w_down, act);
        let x_out = b.f32(format!("blk.{l}.ffn_residual"), t, d);
        b.g.push(Op::Add {
            a: x_mid,
            b: down,
            out: x_out,
        });
        x = x_out;
    }
    let last = b.f32("last_position".into(), 1, d);
    b.g.push(Op::TakeLast { x, out: last });
    let normed = b.f32("output_norm".into(), 1, d);
    b.g.push(Op::RmsNorm {
        x: last,
        weight: lw.output_norm,
        eps: p.rms_eps,
        out: normed,
    });
    let logits = b.matmul("logits".into(), lw.output, normed);
    b.g.output = logits;
    b.g
}
