//! The CPU executor's elementwise ops, norms, embeddings, activation quantization and RoPE:
//! each thread takes its share of the rows (or, for one token, of the columns).

use edge_gguf::GgmlType;
use edge_kernels::cpu::{self, activations, rope::rope_row_factors};

use super::exec::{OpCtx, F32_GRANULE};
use crate::graph::{Pooling, Rope, TableRow, ValueId, ValueType, WeightId};

impl OpCtx<'_> {
    /// out = a + b; in place when the plan put the output on `a` or on `b` (the element is read
    /// through the output slice; addition commutes exactly, so the result is the same).
    pub(super) fn add(&self, a: ValueId, b: ValueId, out: ValueId) {
        let cols = self.cols(out);
        let other = if self.aliases(out, a) {
            Some(b)
        } else if self.aliases(out, b) {
            Some(a)
        } else {
            None
        };
        let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, F32_GRANULE);
        for t in rows {
            let o = self.output(out, t, part.clone());
            match other {
                Some(y) => {
                    for (o, y) in o.iter_mut().zip(&self.input(y, t..t + 1)[part.clone()]) {
                        *o += y;
                    }
                }
                None => {
                    let (a, b) = (
                        &self.input(a, t..t + 1)[part.clone()],
                        &self.input(b, t..t + 1)[part.clone()],
                    );
                    for ((o, x), y) in o.iter_mut().zip(a).zip(b) {
                        *o = x + y;
                    }
                }
            }
        }
    }

    /// out = silu(gate) * up; in place when the plan put the output on the gate.
    pub(super) fn swiglu(&self, gate: ValueId, up: ValueId, out: ValueId) {
        let cols = self.cols(out);
        let in_place = self.aliases(out, gate);
        let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, F32_GRANULE);
        for t in rows {
            let u = &self.input(up, t..t + 1)[part.clone()];
            let o = self.output(out, t, part.clone());
            if in_place {
                activations::swiglu_row_inplace(o, u);
            } else {
                activations::swiglu_row(&self.input(gate, t..t + 1)[part.clone()], u, o);
            }
        }
    }

    /// out[0] = x[n_tokens - 1].
    pub(super) fn take_last(&self, x: ValueId, out: ValueId) {
        if self.tid == 0 {
            let last = self.n_tokens() - 1;
            let cols = self.cols(out);
            self.output(out, 0, 0..cols)
                .copy_from_slice(self.input(x, last..last + 1));
        }
    }

    /// out = LayerNorm(x) * weight + bias, per row.
    pub(super) fn layer_norm(
        &self,
        x: ValueId,
        weight: WeightId,
        bias: WeightId,
        eps: f32,
        out: ValueId,
    ) {
        let (w, b) = (self.model.weight_f32(weight), self.model.weight_f32(bias));
        let cols = self.cols(out);
        for t in self.share(self.rows_of(out), 1) {
            cpu::layer_norm(
                self.input(x, t..t + 1),
                w,
                b,
                eps,
                self.output(out, t, 0..cols),
            );
        }
    }

    /// out = GELU(x); in place when the plan put the output on `x`.
    pub(super) fn gelu(&self, x: ValueId, out: ValueId) {
        let cols = self.cols(out);
        let in_place = self.aliases(out, x);
        for t in self.share(self.rows_of(out), 1) {
            let o = self.output(out, t, 0..cols);
            if in_place {
                for o in o.iter_mut() {
                    *o = cpu::gelu(*o);
                }
            } else {
                for (o, &v) in o.iter_mut().zip(self.input(x, t..t + 1)) {
                    *o = cpu::gelu(v);
                }
            }
        }
    }

    /// RMSNorm of each head of each row.
    pub(super) fn head_rms_norm(
        &self,
        x: ValueId,
        weight: WeightId,
        eps: f32,
        head_dim: usize,
        out: ValueId,
    ) {
        let w = self.model.weight_f32(weight);
        let cols = self.cols(out);
        for t in self.share(self.rows_of(out), 1) {
            let o = self.output(out, t, 0..cols);
            for (src, dst) in self
                .input(x, t..t + 1)
                .chunks_exact(head_dim)
                .zip(o.chunks_exact_mut(head_dim))
            {
                cpu::rms_norm(src, w, eps, dst);
            }
        }
    }

    /// out = gelu(gate) * up as ggml's GeGLU; in place when the plan put the output on the gate.
    pub(super) fn geglu(&self, gate: ValueId, up: ValueId, out: ValueId) {
        let cols = self.cols(out);
        let in_place = self.aliases(out, gate);
        for t in self.share(self.rows_of(out), 1) {
            let u = self.input(up, t..t + 1);
            let o = self.output(out, t, 0..cols);
            if in_place {
                activations::geglu_row_inplace(o, u);
            } else {
                activations::geglu_row(self.input(gate, t..t + 1), u, o);
            }
        }
    }

    /// out[t] = x[t][start..start + out.cols].
    pub(super) fn columns(&self, x: ValueId, start: usize, out: ValueId) {
        let cols = self.cols(out);
        for t in self.share(self.rows_of(out), 1) {
            self.output(out, t, 0..cols)
                .copy_from_slice(&self.input(x, t..t + 1)[start..start + cols]);
        }
    }

    /// out[t] = x[t] + the table row `row` names for token t. In place when the plan puts out
    /// on x: each element is read through the output before it is written.
    pub(super) fn add_table_row(&self, x: ValueId, table: WeightId, row: TableRow, out: ValueId) {
        let w = self.model.weight(table);
        let bytes = self.model.weight_bytes(table);
        let row_bytes = w.ty.row_bytes(w.row_len as u64).unwrap_or(0) as usize;
        let cols = self.cols(out);
        let in_place = self.aliases(out, x);
        let tmp = &mut self.scratch()[..cols];
        for t in self.share(self.rows_of(out), 1) {
            let r = match row {
                TableRow::Fixed(r) => r,
                TableRow::Position => self.pos(t),
            };
            // Rows past the table are refused before a run (the embedder checks the length);
            // a zero row keeps a bug from reading out of bounds.
            if r >= w.n_rows
                || cpu::dequantize_row(w.ty, &bytes[r * row_bytes..(r + 1) * row_bytes], tmp)
                    .is_err()
            {
                tmp.fill(0.0);
            }
            let o = self.output(out, t, 0..cols);
            if in_place {
                for (o, &e) in o.iter_mut().zip(tmp.iter()) {
                    *o += e;
                }
            } else {
                for ((o, &v), &e) in o.iter_mut().zip(self.input(x, t..t + 1)).zip(tmp.iter()) {
                    *o = v + e;
                }
            }
        }
    }

    /// One row out: the mean of the rows (summed in f64), the first, or the last.
    pub(super) fn pool(&self, x: ValueId, pooling: Pooling, out: ValueId) {
        let n = self.n_tokens();
        let cols = self.cols(out);
        // Columns are split among the threads.
        let mine = self.share(cols, 16);
        if mine.is_empty() {
            return;
        }
        let o = self.output(out, 0, mine.clone());
        match pooling {
            Pooling::Mean => {
                let xs = self.input(x, 0..n);
                for (i, o) in mine.zip(o.iter_mut()) {
                    let sum: f64 = (0..n).map(|t| f64::from(xs[t * cols + i])).sum();
                    *o = (sum / n as f64) as f32;
                }
            }
            Pooling::Cls => o.copy_from_slice(&self.input(x, 0..1)[mine]),
            Pooling::Last => o.copy_from_slice(&self.input(x, n - 1..n)[mine]),
        }
    }

    /// out = f(column, x) elementwise, row by row; in place when the plan put `out` on `x`
    /// (the element is read through the output slice before it is written).
    #[inline(always)]
    pub(super) fn unary(&self, x: ValueId, out: ValueId, f: impl Fn(usize, f32) -> f32) {
        let cols = self.cols(out);
        let in_place = self.aliases(out, x);
        for t in self.share(self.rows_of(out), 1) {
            let o = self.output(out, t, 0..cols);
            if in_place {
                for (c, o) in o.iter_mut().enumerate() {
                    *o = f(c, *o);
                }
            } else {
                for (c, (o, &v)) in o.iter_mut().zip(self.input(x, t..t + 1)).enumerate() {
                    *o = f(c, v);
                }
            }
        }
    }

    /// out[t] = the dequantized table row of token t (a zero row for an id outside it).
    pub(super) fn embed(&self, table: WeightId, out: ValueId) {
        let w = self.model.weight(table);
        let bytes = self.model.weight_bytes(table);
        let row_bytes = w.ty.row_bytes(w.row_len as u64).unwrap_or(0) as usize;
        for t in self.share(self.n_tokens(), 1) {
            let id = self.args.tokens[t] as usize;
            let dst = self.output(out, t, 0..w.row_len);
            if id < w.n_rows {
                let src = &bytes[id * row_bytes..(id + 1) * row_bytes];
                if cpu::dequantize_row(w.ty, src, dst).is_err() {
                    dst.fill(0.0);
                }
            } else {
                // Ids are validated by the session; a zero row keeps a bug from reading out of bounds.
                dst.fill(0.0);
            }
        }
    }

    /// out = x * rsqrt(mean(x^2) + eps) * weight, per row (one token: split by columns).
    pub(super) fn rms_norm(&self, x: ValueId, weight: WeightId, eps: f32, out: ValueId) {
        let w = self.model.weight_f32(weight);
        let cols = self.cols(out);
        let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, F32_GRANULE);
        for t in rows {
            let x = self.input(x, t..t + 1);
            // Every thread sharing the row computes the same scale (the sum is serial).
            let scale = cpu::rms_scale(x, eps);
            cpu::scale_by_weight(
                &x[part.clone()],
                &w[part.clone()],
                scale,
                self.output(out, t, part.clone()),
            );
        }
    }

    /// out = x quantized row by row to the output value's activation type.
    pub(super) fn quantize(&self, x: ValueId, out: ValueId) {
        let ty = match self.pg.graph.values[out.0].ty {
            ValueType::Quantized(t) => t,
            ValueType::F32 => GgmlType::F32,
        };
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        let cols = self.cols(x);
        let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, bs);
        if part.is_empty() {
            return;
        }
        for t in rows {
            let dst =
                &mut self.output_bytes(out, t)[part.start / bs * bb..part.end.div_ceil(bs) * bb];
            // Lengths come from the graph, built with whole blocks; an error would be a bug.
            let _ = self
                .exec
                .kernels
                .quantize_row(ty, &self.input(x, t..t + 1)[part.clone()], dst);
        }
    }

    /// out = x with each head rotated at token t's position (with per-frequency divisors when
    /// the model has them); one token's heads are shared out whole.
    pub(super) fn rope(
        &self,
        x: ValueId,
        head_dim: usize,
        rope: Rope,
        freq_factors: Option<WeightId>,
        out: ValueId,
    ) {
        let cols = self.cols(out);
        let factors = freq_factors.map(|w| self.model.weight_f32(w));
        // Heads rotate independently: one token's heads are shared out whole.
        let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, head_dim);
        if part.is_empty() {
            return;
        }
        for t in rows {
            let src = &self.input(x, t..t + 1)[part.clone()];
            rope_row_factors(
                src,
                self.output(out, t, part.clone()),
                self.pos(t) as f32,
                head_dim,
                rope,
                factors,
            );
        }
    }
}
