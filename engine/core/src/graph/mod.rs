//! The compute graph: a list of ops over named values, built once per (architecture, ubatch,
//! ctx) and planned into one arena before the first token.
//!
//! Every value is a row-major matrix of `rows x cols` elements (rows = tokens of the ubatch, or
//! 1 for the last-position values). Its size is known when the graph is built, so the arena
//! planner sees every buffer and its lifetime (producer op to last consumer op) up front. The
//! number of tokens actually processed in a run may be smaller than the ubatch; buffers are
//! sized for the full ubatch and the first rows are used.

pub mod build;

use edge_gguf::GgmlType;

/// Index of a value (an activation buffer) in [`Graph::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValueId(pub usize);

/// Index of a weight tensor in the model's weight table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightId(pub usize);

/// Element type of an activation value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// f32 elements.
    F32,
    /// Rows quantized to the given activation type (q8_0, q8_1, f16, bf16, f32) for a matmul.
    Quantized(GgmlType),
}

/// An activation buffer: its name (for plans and debugging), shape and type.
#[derive(Debug, Clone)]
pub struct Value {
    /// Readable name, e.g. `blk.3.attn_q`.
    pub name: String,
    /// Rows (tokens) the buffer holds.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Element type.
    pub ty: ValueType,
}

impl Value {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        match self.ty {
            ValueType::F32 => self.cols * 4,
            ValueType::Quantized(t) => t.row_bytes(self.cols as u64).unwrap_or(0) as usize,
        }
    }

    /// Bytes of the whole buffer.
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }
}

pub use edge_kernels::cpu::rope::{Rope, RopeOrdering};

/// How an encoder turns its per-token states into one vector (llama.cpp's
/// `{arch}.pooling_type`: 1 mean, 2 cls, 3 last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of all token states.
    Mean,
    /// The state of the first token (`[CLS]`).
    Cls,
    /// The state of the last token.
    Last,
}

impl Pooling {
    /// `mean`, `cls` or `last`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// Parses `mean`, `cls` or `last`.
    pub fn from_name(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }
}

/// Which row of a table [`Op::AddTableRow`] adds to each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableRow {
    /// The same row for every token (BERT's token type 0, "sentence A").
    Fixed(usize),
    /// Row `pos0 + t` for token t (absolute position embeddings).
    Position,
}

/// The operands of causal grouped-query attention over the KV cache ([`Op::Attention`]).
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    /// Queries.
    pub q: ValueId,
    /// The layer whose KV cache rows it uses.
    pub layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Factor of the scores before the softmax.
    pub scale: f32,
    /// Sliding window: row t sees only positions pos0 + t - window + 1 ..= pos0 + t.
    pub window: Option<usize>,
    /// Scores become `cap * tanh(score / cap)` before scaling and the softmax.
    pub softcap: Option<f32>,
    /// The output.
    pub out: ValueId,
}

/// One operation. Inputs are values or weights; each op writes exactly its `out` value
/// (ops that write the KV cache have no output value).
#[derive(Debug, Clone)]
pub enum Op {
    /// `out[t]` = dequantized row `tokens[t]` of the embedding table.
    Embed {
        /// The table (embedding rows).
        table: WeightId,
        /// The output.
        out: ValueId,
    },
    /// out = x * rsqrt(mean(x^2) + eps) * weight, per row.
    RmsNorm {
        /// The input.
        x: ValueId,
        /// The weight.
        weight: WeightId,
        /// Epsilon added to the variance.
        eps: f32,
        /// The output.
        out: ValueId,
    },
    /// out = x quantized row by row to the activation type of a matmul.
    Quantize {
        /// The input.
        x: ValueId,
        /// The output.
        out: ValueId,
    },
    /// `out[t][r] = dot(weight row r, x[t])`; x already quantized to the weight's vec-dot type.
    MatMul {
        /// The weight.
        weight: WeightId,
        /// The input.
        x: ValueId,
        /// The output.
        out: ValueId,
    },
    /// out = x with rotary embedding applied to each head at positions pos0 + t.
    Rope {
        /// The input.
        x: ValueId,
        /// Elements per head.
        head_dim: usize,
        /// The rotary embedding.
        rope: Rope,
        /// Per-frequency divisors (n_rot / 2 f32 values, Llama 3's `rope_freqs.weight`).
        freq_factors: Option<WeightId>,
        /// The output.
        out: ValueId,
    },
    /// Writes rows of k and v (already rotated) into the KV cache of `layer` at pos0 + t.
    StoreKv {
        /// Keys (rotated).
        k: ValueId,
        /// Values.
        v: ValueId,
        /// The layer whose KV cache rows it uses.
        layer: usize,
        /// Elements per KV head (rows are `n_head_kv` heads of this many): a decode step
        /// stores each head on the thread whose attention reads it.
        head_dim: usize,
    },
    /// Causal grouped-query attention of q over the cached keys/values of `layer`
    /// (positions 0..=pos0+t for row t), computed per (token, head) with one row of scores in
    /// per-thread scratch: no score matrix exists, whatever the ubatch.
    Attention(Attention),
    /// out = a + b.
    Add {
        /// The first operand.
        a: ValueId,
        /// The second operand.
        b: ValueId,
        /// The output.
        out: ValueId,
    },
    /// out = silu(gate) * up.
    SwiGlu {
        /// The gate (goes through the activation).
        gate: ValueId,
        /// The up projection.
        up: ValueId,
        /// The output.
        out: ValueId,
    },
    /// `out[0] = x[n_tokens - 1]`: only the last position goes on to the output head.
    TakeLast {
        /// The input.
        x: ValueId,
        /// The output.
        out: ValueId,
    },
    /// `out[t] = x[t]` + (dequantized) row of `table` given by `row` (encoders: token-type and
    /// absolute position embeddings).
    AddTableRow {
        /// The input.
        x: ValueId,
        /// The table (embedding rows).
        table: WeightId,
        /// Which row of the table.
        row: TableRow,
        /// The output.
        out: ValueId,
    },
    /// out = LayerNorm(x) * weight + bias, per row.
    LayerNorm {
        /// The input.
        x: ValueId,
        /// The weight.
        weight: WeightId,
        /// The bias vector.
        bias: WeightId,
        /// Epsilon added to the variance.
        eps: f32,
        /// The output.
        out: ValueId,
    },
    /// `out[t] = x[t] + bias` (a vector of `cols` f32).
    AddBias {
        /// The input.
        x: ValueId,
        /// The bias vector.
        bias: WeightId,
        /// The output.
        out: ValueId,
    },
    /// out = GELU(x), element-wise (ggml's tanh approximation).
    Gelu {
        /// The input.
        x: ValueId,
        /// The output.
        out: ValueId,
    },
    /// Bidirectional (not causal) multi-head attention of the ubatch's tokens over each other:
    /// q, k, v are rows of `n_head * head_dim` values; no KV cache (encoders see the whole
    /// input in one run).
    EncoderAttention {
        /// Queries.
        q: ValueId,
        /// Keys (rotated).
        k: ValueId,
        /// Values.
        v: ValueId,
        /// Query heads.
        n_head: usize,
        /// Elements per head.
        head_dim: usize,
        /// Factor of the scores before the softmax.
        scale: f32,
        /// The output.
        out: ValueId,
    },
    /// `out[0]` = the pooling of the rows of x (one row out).
    Pool {
        /// The input.
        x: ValueId,
        /// How the rows are pooled.
        pooling: Pooling,
        /// The output.
        out: ValueId,
    },
    /// RMSNorm of each head (`head_dim` values) of each row, times `weight` (head_dim values).
    HeadRmsNorm {
        /// The input.
        x: ValueId,
        /// The weight.
        weight: WeightId,
        /// Epsilon added to the variance.
        eps: f32,
        /// Elements per head.
        head_dim: usize,
        /// The output.
        out: ValueId,
    },
    /// out = x * factor.
    Scale {
        /// The input.
        x: ValueId,
        /// The factor.
        factor: f32,
        /// The output.
        out: ValueId,
    },
    /// out = cap * tanh(x / cap).
    SoftCap {
        /// The input.
        x: ValueId,
        /// The cap.
        cap: f32,
        /// The output.
        out: ValueId,
    },
    /// out = gelu(gate) * up, GELU as ggml computes it (tanh approximation through an f16
    /// table).
    GeGlu {
        /// The gate (goes through the activation).
        gate: ValueId,
        /// The up projection.
        up: ValueId,
        /// The output.
        out: ValueId,
    },
    /// `out[t] = x[t][start..start + out.cols]`: a column range (one part of a fused projection).
    Columns {
        /// The input.
        x: ValueId,
        /// First column taken.
        start: usize,
        /// The output.
        out: ValueId,
    },
}

impl Op {
    /// Values the op reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        match *self {
            Op::Embed { .. } => vec![],
            Op::RmsNorm { x, .. }
            | Op::Quantize { x, .. }
            | Op::MatMul { x, .. }
            | Op::Rope { x, .. }
            | Op::TakeLast { x, .. }
            | Op::AddBias { x, .. }
            | Op::HeadRmsNorm { x, .. }
            | Op::Scale { x, .. }
            | Op::SoftCap { x, .. }
            | Op::Columns { x, .. }
            | Op::AddTableRow { x, .. }
            | Op::LayerNorm { x, .. }
            | Op::Gelu { x, .. }
            | Op::Pool { x, .. } => vec![x],
            Op::EncoderAttention { q, k, v, .. } => vec![q, k, v],
            Op::GeGlu { gate, up, .. } => vec![gate, up],
            Op::StoreKv { k, v, .. } => vec![k, v],
            Op::Attention(a) => vec![a.q],
            // x + x would read the aliased input twice: planned apart.
            Op::Add { a, b, .. } if a == b => vec![],
            Op::Add { a, b, .. } => vec![a, b],
            Op::SwiGlu { gate, up, .. } => vec![gate, up],
        }
    }

    /// The value the op writes, if any.
    pub fn output(&self) -> Option<ValueId> {
        match *self {
            Op::Embed { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::Quantize { out, .. }
            | Op::MatMul { out, .. }
            | Op::Rope { out, .. }
            | Op::Add { out, .. }
            | Op::SwiGlu { out, .. }
            | Op::TakeLast { out, .. }
            | Op::AddBias { out, .. }
            | Op::HeadRmsNorm { out, .. }
            | Op::Scale { out, .. }
            | Op::SoftCap { out, .. }
            | Op::GeGlu { out, .. }
            | Op::Columns { out, .. }
            | Op::AddTableRow { out, .. }
            | Op::LayerNorm { out, .. }
            | Op::Gelu { out, .. }
            | Op::EncoderAttention { out, .. }
            | Op::Pool { out, .. } => Some(out),
            Op::Attention(a) => Some(a.out),
            Op::StoreKv { .. } => None,
        }
    }

    /// Inputs the op may overwrite with its output, when the input dies at this op: the
    /// elementwise ops (`Add`, `SwiGlu`, `GeGlu`, `AddBias`, `Scale`, `SoftCap`, `AddTableRow`,
    /// `Gelu`), which read each element before writing the same element. The planner then gives
    /// the output the input's offset (see
    /// [`edge_arena::plan_with_inplace`]).
    pub fn inplace_inputs(&self) -> Vec<ValueId> {
        match *self {
            // x + x would read the aliased input twice: planned apart.
            Op::Add { a, b, .. } if a == b => vec![],
            Op::Add { a, b, .. } => vec![a, b],
            Op::SwiGlu { gate, .. } | Op::GeGlu { gate, .. } => vec![gate],
            Op::AddBias { x, .. }
            | Op::Scale { x, .. }
            | Op::SoftCap { x, .. }
            | Op::AddTableRow { x, .. }
            | Op::Gelu { x, .. } => vec![x],
            _ => vec![],
        }
    }

    /// Short name for logs and profiles.
    pub fn kind(&self) -> &'static str {
        OP_KINDS[self.kind_index()]
    }

    /// The index of [`Op::kind`] in [`OP_KINDS`] (for per-kind tallies without a lookup).
    pub fn kind_index(&self) -> usize {
        match self {
            Op::Embed { .. } => 0,
            Op::RmsNorm { .. } => 1,
            Op::Quantize { .. } => 2,
            Op::MatMul { .. } => 3,
            Op::Rope { .. } => 4,
            Op::StoreKv { .. } => 5,
            Op::Attention(_) => 6,
            Op::Add { .. } => 7,
            Op::SwiGlu { .. } => 8,
            Op::TakeLast { .. } => 9,
            Op::AddBias { .. } => 10,
            Op::HeadRmsNorm { .. } => 11,
            Op::Scale { .. } => 12,
            Op::SoftCap { .. } => 13,
            Op::GeGlu { .. } => 14,
            Op::Columns { .. } => 15,
            Op::AddTableRow { .. } => 16,
            Op::LayerNorm { .. } => 17,
            Op::Gelu { .. } => 18,
            Op::EncoderAttention { .. } => 19,
            Op::Pool { .. } => 20,
        }
    }
}

/// The kinds of op, by [`Op::kind_index`].
pub const OP_KINDS: [&str; 21] = [
    "embed",
    "rms_norm",
    "quantize",
    "matmul",
    "rope",
    "store_kv",
    "attention",
    "add",
    "swiglu",
    "take_last",
    "add_bias",
    "head_rms_norm",
    "scale",
    "soft_cap",
    "geglu",
    "columns",
    "add_table_row",
    "layer_norm",
    "gelu",
    "encoder_attention",
    "pool",
];

/// A built graph: values, ops in execution order, and the value holding the logits.
#[derive(Debug, Clone)]
pub struct Graph {
    /// All activation values.
    pub values: Vec<Value>,
    /// Ops in execution order.
    pub ops: Vec<Op>,
    /// The value the caller reads after a run (logits of the last position).
    pub output: ValueId,
    /// Tokens per run at most (the ubatch).
    pub ubatch: usize,
}

impl Graph {
    /// An empty graph for up to `ubatch` tokens per run.
    pub fn new(ubatch: usize) -> Graph {
        Graph {
            values: Vec::new(),
            ops: Vec::new(),
            output: ValueId(0),
            ubatch,
        }
    }

    /// Declares a value.
    pub fn value(
        &mut self,
        name: impl Into<String>,
        rows: usize,
        cols: usize,
        ty: ValueType,
    ) -> ValueId {
        self.values.push(Value {
            name: name.into(),
            rows,
            cols,
            ty,
        });
        ValueId(self.values.len() - 1)
    }

    /// Appends an op.
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// The in-place permissions of this graph as `(output, input)` value indices, for
    /// [`edge_arena::plan_with_inplace`]; the planner uses those whose input dies at the op.
    pub fn inplace_pairs(&self) -> Vec<(usize, usize)> {
        self.ops
            .iter()
            .filter_map(|op| Some((op.output()?, op.inplace_inputs())))
            .flat_map(|(out, ins)| ins.into_iter().map(move |i| (out.0, i.0)))
            .collect()
    }

    /// The arena buffers of this graph: one per value, live from the op that writes it to the
    /// last op that reads it (the output value lives to the end, since the caller reads it).
    pub fn buffers(&self, align: usize) -> Vec<edge_arena::Buffer> {
        let n_ops = self.ops.len();
        let mut first = vec![usize::MAX; self.values.len()];
        let mut last = vec![0usize; self.values.len()];
        for (i, op) in self.ops.iter().enumerate() {
            if let Some(o) = op.output() {
                first[o.0] = first[o.0].min(i);
                last[o.0] = last[o.0].max(i);
            }
            for v in op.inputs() {
                first[v.0] = first[v.0].min(i);
                last[v.0] = last[v.0].max(i);
            }
        }
        last[self.output.0] = n_ops.saturating_sub(1);
        self.values
            .iter()
            .enumerate()
            .map(|(i, v)| edge_arena::Buffer {
                size: v.bytes(),
                align,
                first_op: if first[i] == usize::MAX { 0 } else { first[i] },
                last_op: if first[i] == usize::MAX { 0 } else { last[i] },
            })
            .collect()
    }
}
