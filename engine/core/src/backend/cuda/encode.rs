//! Enqueuing a planned graph on the stream: one or two kernel launches per op, with the
//! arena offsets, weight addresses and shapes the plan gives.

use edge_gguf::GgmlType;

use super::exec::{
    matmul_grid, quant_matmul_index, quantize_grid, store_kv_q8_0_grid, Arg, CudaExecutor,
};
use crate::graph::{Attention, Op, RopeOrdering, ValueId, ValueType};
use crate::kv::KvType;
use crate::model::Model;
use crate::plan::PlannedGraph;

impl CudaExecutor {
    /// Enqueues every op of `pg` for `n` tokens, then the argmax of the logits.
    pub(super) fn encode(&self, model: &Model, pg: &PlannedGraph, n: usize) -> Result<(), String> {
        use Arg::*;
        let vals = &pg.graph.values;
        let ptr = |v: ValueId| U64(self.arena.ptr + pg.offsets[v.0] as u64);
        let rows = |v: ValueId| vals[v.0].rows.min(n);
        let cols = |v: ValueId| vals[v.0].cols;
        let params = U64(self.params.ptr);
        let blocks = |total: usize, per: usize| total.div_ceil(per) as u32;
        for op in &pg.graph.ops {
            match *op {
                Op::Embed { table, out } => {
                    let w = model.weight(table);
                    let rb = w.ty.row_bytes(w.row_len as u64).unwrap_or(0);
                    self.launch(
                        &self.k.embed,
                        (n as u32, 1),
                        256,
                        &[
                            U64(self.wptr[table.0]),
                            I32(w.ty.id() as i32),
                            U64(rb),
                            I32(w.n_rows as i32),
                            I32(w.row_len as i32),
                            params,
                            ptr(out),
                        ],
                    )?;
                }
                Op::RmsNorm {
                    x,
                    weight,
                    eps,
                    out,
                } => self.launch(
                    &self.k.rms_norm,
                    (rows(out) as u32, 1),
                    256,
                    &[
                        ptr(x),
                        U64(self.wptr[weight.0]),
                        ptr(out),
                        I32(cols(out) as i32),
                        F32(eps),
                    ],
                )?,
                Op::Quantize { x, out } => {
                    let (r, c) = (rows(out), cols(out));
                    match vals[out.0].ty {
                        ValueType::Quantized(GgmlType::Q8_K) => self.launch(
                            &self.k.quantize_q8_k,
                            (quantize_grid(r, c, 256), 1),
                            256,
                            &[
                                ptr(x),
                                ptr(out),
                                I32(r as i32),
                                I32(c as i32),
                                U64(vals[out.0].row_bytes() as u64),
                            ],
                        )?,
                        ValueType::Quantized(t @ (GgmlType::Q8_0 | GgmlType::Q8_1)) => self
                            .launch(
                                &self.k.quantize_q8,
                                (quantize_grid(r, c, 32), 1),
                                256,
                                &[
                                    ptr(x),
                                    ptr(out),
                                    I32(r as i32),
                                    I32(c as i32),
                                    U64(vals[out.0].row_bytes() as u64),
                                    I32(i32::from(t == GgmlType::Q8_1)),
                                    I32(self.q8_flavour),
                                ],
                            )?,
                        ValueType::Quantized(
                            t @ (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
                        ) => self.launch(
                            &self.k.quantize_float,
                            (blocks(r * c, 256), 1),
                            256,
                            &[ptr(x), ptr(out), I64((r * c) as i64), I32(t.id() as i32)],
                        )?,
                        ValueType::F32 => self.launch(
                            &self.k.quantize_float,
                            (blocks(r * c, 256), 1),
                            256,
                            &[ptr(x), ptr(out), I64((r * c) as i64), I32(0)],
                        )?,
                        ValueType::Quantized(t) => {
                            return Err(format!("cuda: no quantizer for activations of type {t}"))
                        }
                    }
                }
                Op::MatMul { weight, x, out } => {
                    let w = model.weight(weight);
                    let r = rows(out);
                    match quant_matmul_index(w.ty) {
                        Some(i) => {
                            let f = if r == 1 {
                                &self.k.mmv[i]
                            } else {
                                &self.k.mmm[i]
                            };
                            self.launch(
                                f,
                                matmul_grid(w.n_rows, r, false),
                                128,
                                &[
                                    U64(self.wptr[weight.0]),
                                    ptr(x),
                                    ptr(out),
                                    I32(w.n_rows as i32),
                                    I32(w.row_len as i32),
                                    I32(r as i32),
                                    U64(vals[x.0].row_bytes() as u64),
                                ],
                            )?
                        }
                        None if !matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => {
                            return Err(format!(
                                "cuda: no matmul kernel for weights of type {} (the type table and the kernels disagree: a bug)",
                                w.ty
                            ))
                        }
                        None => self.launch(
                            &self.k.mm_float,
                            matmul_grid(w.n_rows, r, true),
                            128,
                            &[
                                U64(self.wptr[weight.0]),
                                I32(w.ty.id() as i32),
                                ptr(x),
                                ptr(out),
                                I32(w.n_rows as i32),
                                I32(w.row_len as i32),
                                I32(r as i32),
                            ],
                        )?,
                    }
                }
                // Frequency factors never reach here: `cuda_unsupported` sends such
                // models to the CPU.
                Op::Rope {
                    x,
                    head_dim,
                    rope,
                    out,
                    ..
                } => {
                    // The CPU's theta_scale, computed the same way on the host.
                    let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
                    self.launch(
                        &self.k.rope,
                        (rows(out) as u32, 1),
                        256,
                        &[
                            ptr(x),
                            ptr(out),
                            I32(cols(out) as i32),
                            I32(head_dim as i32),
                            I32(rope.n_rot as i32),
                            I32(i32::from(rope.ordering == RopeOrdering::NeoX)),
                            F32(theta_scale),
                            F32(rope.freq_scale),
                            params,
                        ],
                    )?
                }
                Op::StoreKv { k, v, layer, .. } => match self.kv_type {
                    KvType::F16 => self.launch(
                        &self.k.store_kv_f16,
                        (n as u32, 1),
                        256,
                        &[
                            ptr(k),
                            ptr(v),
                            U64(self.kv.ptr),
                            I32(layer as i32),
                            I32(self.ctx_len as i32),
                            I32(self.kv_dim as i32),
                            params,
                        ],
                    )?,
                    KvType::Q8_0 => self.launch(
                        &self.k.store_kv_q8_0,
                        (store_kv_q8_0_grid(n, self.kv_dim), 1),
                        256,
                        &[
                            ptr(k),
                            ptr(v),
                            U64(self.kv.ptr),
                            I32(layer as i32),
                            I32(self.ctx_len as i32),
                            I32(self.kv_dim as i32),
                            I32(n as i32),
                            I32(self.q8_flavour),
                            params,
                        ],
                    )?,
                },
                // Sliding windows and soft-capping never reach here (see above).
                Op::Attention(Attention {
                    q,
                    layer,
                    n_head,
                    n_head_kv,
                    head_dim,
                    scale,
                    out,
                    ..
                }) => {
                    let splits = if n == 1 { self.decode_splits } else { 1 };
                    let f = match self.kv_type {
                        KvType::F16 => &self.k.attn_partial,
                        KvType::Q8_0 => &self.k.attn_partial_q8,
                    };
                    let args = [
                        ptr(q),
                        U64(self.kv.ptr),
                        U64(self.partial.ptr),
                        I32(n_head as i32),
                        I32(n_head_kv as i32),
                        I32(head_dim as i32),
                        I32(self.ctx_len as i32),
                        I32(self.kv_dim as i32),
                        I32(layer as i32),
                        F32(scale),
                        I32(splits as i32),
                        I32(self.q8_flavour), // the q8_0 cache's query quantizer
                        params,
                    ];
                    self.launch(f, ((n * n_head) as u32, splits as u32), 32, &args)?;
                    self.launch(
                        &self.k.attn_combine,
                        ((n * n_head) as u32, 1),
                        128,
                        &[
                            U64(self.partial.ptr),
                            ptr(out),
                            I32(head_dim as i32),
                            I32(splits as i32),
                        ],
                    )?;
                }
                Op::Add { a, b, out } => {
                    let total = rows(out) * cols(out);
                    self.launch(
                        &self.k.add,
                        (blocks(total, 256), 1),
                        256,
                        &[ptr(a), ptr(b), ptr(out), I64(total as i64)],
                    )?
                }
                Op::SwiGlu { gate, up, out } => {
                    let total = rows(out) * cols(out);
                    self.launch(
                        &self.k.swiglu,
                        (blocks(total, 256), 1),
                        256,
                        &[ptr(gate), ptr(up), ptr(out), I64(total as i64)],
                    )?
                }
                Op::TakeLast { x, out } => self.launch(
                    &self.k.copy_row,
                    (blocks(cols(out), 256), 1),
                    256,
                    &[ptr(x), ptr(out), I32(cols(out) as i32), I32(n as i32 - 1)],
                )?,
                // Encoder models and the other decoder architectures run on the CPU
                // (cuda_unsupported says so first).
                Op::AddTableRow { .. }
                | Op::LayerNorm { .. }
                | Op::AddBias { .. }
                | Op::Gelu { .. }
                | Op::EncoderAttention { .. }
                | Op::Pool { .. }
                | Op::HeadRmsNorm { .. }
                | Op::Scale { .. }
                | Op::SoftCap { .. }
                | Op::GeGlu { .. }
                | Op::Columns { .. } => {
                    return Err(format!(
                    "the CUDA backend has no {} op (cuda_unsupported should have said so: a bug)",
                    op.kind()
                ))
                }
            }
        }
        let o = pg.graph.output;
        self.launch(
            &self.k.argmax,
            (1, 1),
            1024,
            &[ptr(o), I32(cols(o) as i32), params],
        )
    }
}
