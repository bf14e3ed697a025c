//! What every architecture's graph builder writes with: named values, the common ops, and
//! matmuls with the activation quantization each weight type needs inserted before them.

use edge_gguf::GgmlType;

use super::{Graph, Op, ValueId, ValueType, WeightId};
use crate::model::weights::Weight;

/// A graph under construction over a model's weight table.
pub struct GraphBuilder<'w> {
    g: Graph,
    weights: &'w [Weight],
}

impl<'w> GraphBuilder<'w> {
    /// An empty graph for up to `ubatch` tokens per run, over `weights`.
    pub fn new(weights: &'w [Weight], ubatch: usize) -> GraphBuilder<'w> {
        GraphBuilder {
            g: Graph::new(ubatch),
            weights,
        }
    }

    /// The finished graph, whose output (what the caller reads after a run) is `output`.
    pub fn finish(mut self, output: ValueId) -> Graph {
        self.g.output = output;
        self.g
    }

    /// A weight's table entry.
    pub fn weight(&self, w: WeightId) -> &'w Weight {
        &self.weights[w.0]
    }

    /// (rows, cols) of value `x`.
    pub fn shape(&self, x: ValueId) -> (usize, usize) {
        (self.g.values[x.0].rows, self.g.values[x.0].cols)
    }

    /// Appends an op.
    pub fn push(&mut self, op: Op) {
        self.g.push(op);
    }

    /// A new f32 value of `rows` x `cols`.
    pub fn f32(&mut self, name: String, rows: usize, cols: usize) -> ValueId {
        self.g.value(name, rows, cols, ValueType::F32)
    }

    /// A new f32 value shaped like `x`.
    pub fn like(&mut self, name: String, x: ValueId) -> ValueId {
        let (rows, cols) = self.shape(x);
        self.f32(name, rows, cols)
    }

    /// `x * rsqrt(mean(x^2) + eps) * weight`, per row.
    pub fn rms_norm(&mut self, name: String, x: ValueId, weight: WeightId, eps: f32) -> ValueId {
        let out = self.like(name, x);
        self.push(Op::RmsNorm {
            x,
            weight,
            eps,
            out,
        });
        out
    }

    /// RMSNorm of each head of `head_dim` values.
    pub fn head_rms_norm(
        &mut self,
        name: String,
        x: ValueId,
        weight: WeightId,
        eps: f32,
        head_dim: usize,
    ) -> ValueId {
        let out = self.like(name, x);
        self.push(Op::HeadRmsNorm {
            x,
            weight,
            eps,
            head_dim,
            out,
        });
        out
    }

    /// `LayerNorm(x) * weight + bias`, per row.
    pub fn layer_norm(
        &mut self,
        name: String,
        x: ValueId,
        (weight, bias): (WeightId, WeightId),
        eps: f32,
    ) -> ValueId {
        let out = self.like(name, x);
        self.push(Op::LayerNorm {
            x,
            weight,
            bias,
            eps,
            out,
        });
        out
    }

    /// `a + b`.
    pub fn add(&mut self, name: String, a: ValueId, b: ValueId) -> ValueId {
        let out = self.like(name, a);
        self.push(Op::Add { a, b, out });
        out
    }

    /// `x + bias` per row.
    pub fn add_bias(&mut self, name: String, x: ValueId, bias: WeightId) -> ValueId {
        let out = self.like(name, x);
        self.push(Op::AddBias { x, bias, out });
        out
    }

    /// `x * factor`.
    pub fn scale(&mut self, name: String, x: ValueId, factor: f32) -> ValueId {
        let out = self.like(name, x);
        self.push(Op::Scale { x, factor, out });
        out
    }

    /// Columns `start..start + cols` of `x`.
    pub fn columns(&mut self, name: String, x: ValueId, start: usize, cols: usize) -> ValueId {
        let rows = self.shape(x).0;
        let out = self.f32(name, rows, cols);
        self.push(Op::Columns { x, start, out });
        out
    }

    /// `w · x`, with `x` first quantized to the weight type's activation type.
    pub fn matmul(&mut self, name: String, w: WeightId, x: ValueId) -> ValueId {
        self.matmul_sharing(name, w, x, &mut Vec::new())
    }

    /// Several matmuls over the same input, sharing one quantized copy of it per activation
    /// type (the q, k and v projections of a block, or its gate and up projections).
    pub fn matmuls(&mut self, x: ValueId, ws: &[(String, WeightId)]) -> Vec<ValueId> {
        let mut quantized = Vec::new();
        ws.iter()
            .map(|(name, w)| self.matmul_sharing(name.clone(), *w, x, &mut quantized))
            .collect()
    }

    /// `w · x`, reusing the quantized copy of `x` in `quantized` that has the weight type's
    /// activation type, or making one (and remembering it there).
    pub fn matmul_sharing(
        &mut self,
        name: String,
        w: WeightId,
        x: ValueId,
        quantized: &mut Vec<(GgmlType, ValueId)>,
    ) -> ValueId {
        let weight = self.weight(w);
        let act_ty = weight.ty.vec_dot_type();
        let (rows, cols) = self.shape(x);
        let xq = match quantized.iter().find(|(t, _)| *t == act_ty) {
            Some(&(_, v)) => v,
            None => {
                let v = self.g.value(
                    format!("{name}.in_q"),
                    rows,
                    cols,
                    ValueType::Quantized(act_ty),
                );
                self.push(Op::Quantize { x, out: v });
                quantized.push((act_ty, v));
                v
            }
        };
        let out = self.f32(name, rows, weight.n_rows);
        self.push(Op::MatMul {
            weight: w,
            x: xq,
            out,
        });
        out
    }
}
