//! The KV cache: keys and values of every layer for `ctx` positions, rows of f16 or q8_0, in
//! one allocation; a sliding-window layer holds only its window (a ring). The CPU backend
//! reads and writes it; the CUDA backend keeps the same layout in device memory.

use edge_gguf::GgmlType;
use edge_kernels::cpu::rope::{rope_row_at, Rope};
use edge_kernels::Kernels;

use crate::memory::SharedMem;

#[cfg(test)]
mod tests;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// f16: llama.cpp's default; attention then reproduces llama.cpp bit for bit.
    #[default]
    F16,
    /// q8_0 blocks (34 bytes per 32 values, 47% less memory); attention then runs tiled with an
    /// online softmax, as llama.cpp's flash-attention path does for a quantized cache.
    Q8_0,
}

impl KvType {
    /// Parses `f16` or `q8_0`.
    pub fn from_name(name: &str) -> Option<KvType> {
        match name {
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }

    /// `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The tensor type of the rows.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of one row of `n` values (`None` if `n` is not a whole number of blocks).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        self.ggml_type().row_bytes(n as u64).map(|b| b as usize)
    }
}

/// Largest head size a q8_0 cache supports (its query block lives on the stack).
pub const MAX_Q8_HEAD_DIM: usize = 512;

/// Keys and values of every layer for `ctx` positions: rows of `kv_dim` values of a [`KvType`].
///
/// A layer may hold fewer rows than `ctx` (a sliding-window layer): its rows are then a ring,
/// position p in row p % rows.
pub struct KvCache {
    pub(crate) mem: SharedMem,
    n_layer: usize,
    pub(crate) ctx: usize,
    pub(crate) kv_dim: usize,
    pub(crate) ty: KvType,
    pub(crate) row_bytes: usize,
    /// Rows of each layer (K and V each).
    layer_rows: Vec<usize>,
    /// Byte offset of each layer's keys; its values follow them.
    layer_base: Vec<usize>,
}

impl KvCache {
    /// Allocates the cache (zeroed), `ctx` rows for every layer.
    pub fn new(n_layer: usize, ctx: usize, kv_dim: usize, ty: KvType) -> Result<KvCache, String> {
        KvCache::with_layer_rows(&vec![ctx; n_layer], ctx, kv_dim, ty)
    }

    /// Allocates the cache (zeroed) with `layer_rows[l]` rows (at most `ctx`) for layer l.
    pub fn with_layer_rows(
        layer_rows: &[usize],
        ctx: usize,
        kv_dim: usize,
        ty: KvType,
    ) -> Result<KvCache, String> {
        let bytes = KvCache::bytes_for_rows(layer_rows, kv_dim, ty)
            .ok_or_else(|| format!("a KV cache of {ctx} positions does not fit in memory"))?;
        if layer_rows.iter().any(|&r| r == 0 || r > ctx) {
            return Err(format!("KV layer rows {layer_rows:?} must be 1 to {ctx}"));
        }
        let row_bytes = ty.row_bytes(kv_dim).ok_or("bad KV row")?;
        let mut layer_base = Vec::with_capacity(layer_rows.len());
        let mut base = 0;
        for &r in layer_rows {
            layer_base.push(base);
            base += 2 * r * row_bytes;
        }
        Ok(KvCache {
            mem: SharedMem::new(bytes)?,
            n_layer: layer_rows.len(),
            ctx,
            kv_dim,
            ty,
            row_bytes,
            layer_rows: layer_rows.to_vec(),
            layer_base,
        })
    }

    /// Bytes a cache of this shape takes (`None` if that overflows or a row is not whole
    /// blocks).
    pub fn bytes_for(n_layer: usize, ctx: usize, kv_dim: usize, ty: KvType) -> Option<usize> {
        [n_layer, ctx, ty.row_bytes(kv_dim)?]
            .iter()
            .try_fold(2usize, |acc, &x| acc.checked_mul(x))
    }

    /// Bytes a cache with `layer_rows[l]` rows for layer l takes (`None` on overflow or if a
    /// row is not whole blocks).
    pub fn bytes_for_rows(layer_rows: &[usize], kv_dim: usize, ty: KvType) -> Option<usize> {
        let rb = ty.row_bytes(kv_dim)?;
        layer_rows.iter().try_fold(0usize, |acc, &r| {
            acc.checked_add(r.checked_mul(rb)?.checked_mul(2)?)
        })
    }

    /// Whether `other` has this cache's layout (layers, rows per layer, row type and width), so
    /// that one run may use both (sequences decoded together).
    pub fn same_shape(&self, other: &KvCache) -> bool {
        self.ctx == other.ctx
            && self.kv_dim == other.kv_dim
            && self.ty == other.ty
            && self.layer_rows == other.layer_rows
    }

    /// Whether every layer holds all `ctx` positions (no ring buffers).
    pub fn is_full(&self) -> bool {
        self.layer_rows.iter().all(|&r| r == self.ctx)
    }

    /// Positions the cache holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Element type.
    pub fn ty(&self) -> KvType {
        self.ty
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }

    /// Shifts the context: drops positions `keep..keep + n_discard`, moves the rows of positions
    /// `keep + n_discard..n_past` down by `n_discard`, and rotates the moved keys by
    /// `-n_discard` positions so that they carry the RoPE angle of their new position (angles
    /// add, so this equals roping them at the new position, up to the rounding of the cache
    /// type). Each key row is decoded to f32, rotated and re-encoded as the cache type (f16, or
    /// q8_0 quantized again with `kernels`); values only move. Single-threaded: `&mut self`
    /// guarantees that no run is in progress.
    #[allow(clippy::too_many_arguments)]
    pub fn shift(
        &mut self,
        n_past: usize,
        keep: usize,
        n_discard: usize,
        head_dim: usize,
        rope: Rope,
        kernels: &Kernels,
        tmp: &mut [f32],
    ) -> Result<(), String> {
        if keep + n_discard > n_past || n_past > self.ctx {
            return Err(format!(
                "context shift of {n_discard} after {keep} kept positions does not fit {n_past} \
                 positions in a cache of {}",
                self.ctx
            ));
        }
        if tmp.len() < 2 * self.kv_dim || head_dim == 0 || !self.kv_dim.is_multiple_of(head_dim) {
            return Err("context shift: bad row buffer or head size".into());
        }
        if !self.is_full() {
            return Err("context shift: the cache has sliding-window (ring) layers".into());
        }
        let (rb, ty) = (self.row_bytes, self.ty.ggml_type());
        let (src, dst) = tmp[..2 * self.kv_dim].split_at_mut(self.kv_dim);
        let moved = n_past - keep - n_discard;
        let delta = -(n_discard as f32);
        for layer in 0..self.n_layer {
            for v in [false, true] {
                let base = self.row_offset(layer, v, 0);
                let mem = &mut self.mem.bytes_mut()[base..base + self.ctx * rb];
                // Rows move down (to lower positions), so copy_within is safe in one go.
                let from = (keep + n_discard) * rb;
                mem.copy_within(from..from + moved * rb, keep * rb);
                if v {
                    continue;
                }
                for p in keep..keep + moved {
                    let row = &mut mem[p * rb..(p + 1) * rb];
                    edge_kernels::cpu::dequantize_row(ty, row, src).map_err(|e| e.to_string())?;
                    rope_row_at(src, dst, delta, head_dim, rope);
                    kernels
                        .quantize_row(ty, dst, row)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Decodes row `pos` of the keys (`v` = false) or values of `layer` into `out` (`kv_dim`
    /// values), e.g. to test what a shift did. `&mut self`: no run may be in progress.
    pub fn read_row(
        &mut self,
        layer: usize,
        v: bool,
        pos: usize,
        out: &mut [f32],
    ) -> Result<(), String> {
        if layer >= self.n_layer || pos >= self.ctx || out.len() != self.kv_dim {
            return Err(format!(
                "no KV row {pos} of layer {layer} with {} values",
                out.len()
            ));
        }
        let off = self.row_offset(layer, v, pos);
        let rb = self.row_bytes;
        edge_kernels::cpu::dequantize_row(
            self.ty.ggml_type(),
            &self.mem.bytes_mut()[off..off + rb],
            out,
        )
        .map_err(|e| e.to_string())
    }

    /// Encodes `row` (`kv_dim` values) into row `pos` of the keys or values of `layer`.
    /// `&mut self`: no run may be in progress.
    pub fn write_row(
        &mut self,
        layer: usize,
        v: bool,
        pos: usize,
        row: &[f32],
        kernels: &Kernels,
    ) -> Result<(), String> {
        if layer >= self.n_layer || pos >= self.ctx || row.len() != self.kv_dim {
            return Err(format!(
                "no KV row {pos} of layer {layer} with {} values",
                row.len()
            ));
        }
        let off = self.row_offset(layer, v, pos);
        let rb = self.row_bytes;
        kernels
            .quantize_row(
                self.ty.ggml_type(),
                row,
                &mut self.mem.bytes_mut()[off..off + rb],
            )
            .map_err(|e| e.to_string())
    }

    /// Values per row (K or V of one position: KV heads x head size).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Where `layer` lives, for loops over positions: (byte offset of its key row 0, of its
    /// value row 0, its number of rows). Position p is in row [`ring_slot`]`(p, rows)`.
    #[inline(always)]
    pub(crate) fn layer_span(&self, layer: usize) -> (usize, usize, usize) {
        let rows = self.layer_rows[layer];
        let base = self.layer_base[layer];
        (base, base + rows * self.row_bytes, rows)
    }

    /// Byte offset of the row of position `pos` in the keys (v = false) or values (v = true)
    /// of `layer` (row pos % rows of a ring layer).
    #[inline(always)]
    pub(crate) fn row_offset(&self, layer: usize, v: bool, pos: usize) -> usize {
        debug_assert!(layer < self.n_layer && pos < self.ctx);
        let rows = self.layer_rows[layer];
        self.layer_base[layer] + (usize::from(v) * rows + ring_slot(pos, rows)) * self.row_bytes
    }
}

/// The row of position `pos` in a layer of `rows` rows: `pos` itself while it fits (every
/// position of a full layer), else `pos % rows` (a sliding-window ring).
#[inline(always)]
pub(crate) fn ring_slot(pos: usize, rows: usize) -> usize {
    if pos < rows {
        pos
    } else {
        pos % rows
    }
}

/// The rows of positions `first..first + n` in a layer of `rows` rows, as runs of consecutive
/// rows `(first row, count)`: one run, or two where a sliding-window ring wraps (`n <= rows`
/// there). Unused runs have count 0.
#[inline(always)]
pub(crate) fn ring_runs(first: usize, n: usize, rows: usize) -> [(usize, usize); 2] {
    if first + n <= rows {
        return [(first, n), (0, 0)];
    }
    debug_assert!(n <= rows, "a ring holds at most its rows");
    let start = ring_slot(first, rows);
    let head = (rows - start).min(n);
    [(start, head), (0, n - head)]
}
