//! The CPU executor: runs a planned graph over one arena, the KV cache and the mapped weights,
//! on a persistent thread pool, without allocating.
//!
//! Every thread walks the same op list; each op is split by rows (tokens), weight rows or
//! heads, and the threads meet at a barrier after each op that a later one depends on. A
//! single token's elementwise ops are split by columns instead, and its matmuls' weight rows
//! and attention heads are claimed in chunks, so that a thread that finishes early takes work
//! from the others (`steal.rs`).
//!
//! Memory safety rests on two facts, checked when the session is built:
//! 1. the arena plan passed [`edge_arena::check_with_inplace`]: values live at the same time
//!    never overlap, except that an elementwise op's output may sit exactly on an input that
//!    dies at that op (`Graph::inplace_pairs`); an op's inputs and output are all live during
//!    the op;
//! 2. within an op, each thread creates mutable slices only of its own part of the output
//!    (rows, columns or chunks it was given or claimed; and of the KV cache rows of its own
//!    tokens, or for one token its own columns), and nobody writes an op's inputs — an op
//!    whose output shares an input's offset never makes a shared slice of that input: it reads
//!    the element through the output slice, before writing it.

pub mod memory;
mod steal;

use half::f16;

use crate::cpu::{self, Kernels};
use crate::graph::{Graph, Op, Rope, RopeOrdering, ValueId};
use crate::model::Model;
use crate::threads::{split_range, SpinBarrier, ThreadPool};
use memory::SharedMem;

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
    pub fn ggml_type(self) -> crate::tensor::GgmlType {
        match self {
            KvType::F16 => crate::tensor::GgmlType::F16,
            KvType::Q8_0 => crate::tensor::GgmlType::Q8_0,
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
    mem: SharedMem,
    n_layer: usize,
    ctx: usize,
    kv_dim: usize,
    ty: KvType,
    row_bytes: usize,
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
            return Err(
                "context shift: the cache has sliding-window (ring) layers; use a larger --ctx"
                    .into(),
            );
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
                    cpu::dequantize_row(ty, row, src).map_err(|e| e.to_string())?;
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
        cpu::dequantize_row(
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
    fn layer_span(&self, layer: usize) -> (usize, usize, usize) {
        let rows = self.layer_rows[layer];
        let base = self.layer_base[layer];
        (base, base + rows * self.row_bytes, rows)
    }

    /// Byte offset of the row of position `pos` in the keys (v = false) or values (v = true)
    /// of `layer` (row pos % rows of a ring layer).
    #[inline(always)]
    fn row_offset(&self, layer: usize, v: bool, pos: usize) -> usize {
        debug_assert!(layer < self.n_layer && pos < self.ctx);
        let rows = self.layer_rows[layer];
        self.layer_base[layer] + (usize::from(v) * rows + ring_slot(pos, rows)) * self.row_bytes
    }
}

/// The row of position `pos` in a layer of `rows` rows: `pos` itself while it fits (every
/// position of a full layer), else `pos % rows` (a sliding-window ring).
#[inline(always)]
fn ring_slot(pos: usize, rows: usize) -> usize {
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
fn ring_runs(first: usize, n: usize, rows: usize) -> [(usize, usize); 2] {
    if first + n <= rows {
        return [(first, n), (0, 0)];
    }
    debug_assert!(n <= rows, "a ring holds at most its rows");
    let start = ring_slot(first, rows);
    let head = (rows - start).min(n);
    [(start, head), (0, n - head)]
}

/// Rotary embedding of one row (all heads) at position `pos`: `dst` = `src` with pairs rotated
/// by `pos * freq_scale * freq_base^(-2i/n_rot)`, pairs adjacent (normal) or `n_rot/2` apart
/// (NeoX); dimensions past `n_rot` pass through.
#[cfg(test)]
pub(crate) fn rope_row(src: &[f32], dst: &mut [f32], pos: usize, head_dim: usize, rope: Rope) {
    rope_row_at(src, dst, pos as f32, head_dim, rope)
}

/// [`rope_row`] at a position given as f32, which may be negative: rotating by `-d` undoes
/// `d` positions of rotation (RoPE angles add), which is how a context shift moves cached keys.
pub fn rope_row_at(src: &[f32], dst: &mut [f32], pos: f32, head_dim: usize, rope: Rope) {
    rope_row_factors(src, dst, pos, head_dim, rope, None)
}

/// [`rope_row_at`] with optional per-frequency divisors (`factors[i]` divides the angle of pair
/// i before the position scale, as ggml applies Llama 3's `rope_freqs`; `n_rot / 2` values).
pub fn rope_row_factors(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked), the only feature it enables.
        return unsafe { rope_row_fma(src, dst, pos, head_dim, rope, factors) };
    }
    rope_row_body(src, dst, pos, head_dim, rope, factors)
}

/// [`rope_row_body`] compiled with hardware FMA: `mul_add` is one instruction instead of a call
/// to libm's `fmaf` (the same exactly rounded result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_row_fma(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    rope_row_body(src, dst, pos, head_dim, rope, factors)
}

/// The rotation itself (inlined into the FMA and baseline builds).
#[inline(always)]
fn rope_row_body(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    dst.copy_from_slice(src);
    let n_heads = src.len() / head_dim;
    let half = rope.n_rot / 2;
    let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
    // theta_i by the same recurrence ggml uses, so the rounding matches the reference.
    let mut theta = pos;
    for i in 0..half {
        let angle = match factors {
            Some(f) => theta / f[i] * rope.freq_scale,
            None => theta * rope.freq_scale,
        };
        let (sin, cos) = angle.sin_cos();
        for h in 0..n_heads {
            let base = h * head_dim;
            let (a, b) = match rope.ordering {
                RopeOrdering::Normal => (base + 2 * i, base + 2 * i + 1),
                RopeOrdering::NeoX => (base + i, base + i + half),
            };
            let (x0, x1) = (src[a], src[b]);
            // Fused as GCC contracts ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`.
            dst[a] = x0.mul_add(cos, -(x1 * sin));
            dst[b] = x0.mul_add(sin, x1 * cos);
        }
        theta *= theta_scale;
    }
}

#[cfg(test)]
mod rope_tests {
    use super::*;

    fn rope(ordering: RopeOrdering, n_rot: usize, freq_scale: f32) -> Rope {
        Rope {
            ordering,
            n_rot,
            freq_base: 100.0,
            freq_scale,
        }
    }

    /// Rotating (1, 0) by theta gives (cos, sin): each pair's angle can be read back.
    fn angles(dst: &[f32], pairs: &[(usize, usize)]) -> Vec<f32> {
        pairs.iter().map(|&(a, b)| dst[b].atan2(dst[a])).collect()
    }

    #[test]
    fn normal_rotates_adjacent_pairs() {
        // head_dim 4, two heads: pairs (0,1), (2,3) in each; angles pos * 100^(-2i/4).
        let mut src = vec![0.0f32; 8];
        for a in [0, 2, 4, 6] {
            src[a] = 1.0;
        }
        let mut dst = vec![0.0; 8];
        rope_row(&src, &mut dst, 3, 4, rope(RopeOrdering::Normal, 4, 1.0));
        let got = angles(&dst, &[(0, 1), (2, 3), (4, 5), (6, 7)]);
        let want = [3.0f32, 0.3, 3.0, 0.3];
        for (g, w) in got.iter().zip(want) {
            let w = (w + std::f32::consts::PI).rem_euclid(2.0 * std::f32::consts::PI)
                - std::f32::consts::PI;
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
    }

    #[test]
    fn neox_rotates_halves_and_partial_rotary_passes_the_rest() {
        // head_dim 6, n_rot 4: pairs (0,2), (1,3); dims 4 and 5 untouched.
        let src = [1.0f32, 1.0, 0.0, 0.0, 7.0, -7.0];
        let mut dst = [0.0f32; 6];
        rope_row(&src, &mut dst, 1, 6, rope(RopeOrdering::NeoX, 4, 1.0));
        let got = angles(&dst, &[(0, 2), (1, 3)]);
        assert!(
            (got[0] - 1.0).abs() < 1e-6 && (got[1] - 0.1).abs() < 1e-6,
            "{got:?}"
        );
        assert_eq!(&dst[4..], &[7.0, -7.0]);
    }

    #[test]
    fn linear_scaling_divides_the_position() {
        let src = [1.0f32, 0.0];
        let (mut scaled, mut plain) = ([0.0f32; 2], [0.0f32; 2]);
        rope_row(&src, &mut scaled, 8, 2, rope(RopeOrdering::Normal, 2, 0.25));
        rope_row(&src, &mut plain, 2, 2, rope(RopeOrdering::Normal, 2, 1.0));
        assert_eq!(scaled, plain);
        // Position 0 is the identity.
        let mut zero = [0.0f32; 2];
        rope_row(
            &[0.3, -0.4],
            &mut zero,
            0,
            2,
            rope(RopeOrdering::NeoX, 2, 1.0),
        );
        assert_eq!(zero, [0.3, -0.4]);
    }
}

#[cfg(test)]
mod shift_tests {
    use super::*;
    use crate::cpu::testutil::Rng;

    const HEAD_DIM: usize = 64;
    const KV_DIM: usize = 2 * HEAD_DIM;

    fn ropes() -> [Rope; 3] {
        let r = |ordering, n_rot, freq_scale| Rope {
            ordering,
            n_rot,
            freq_base: 10000.0,
            freq_scale,
        };
        [
            r(RopeOrdering::Normal, HEAD_DIM, 1.0),
            r(RopeOrdering::NeoX, HEAD_DIM, 1.0),
            // partial rotary with linear scaling
            r(RopeOrdering::NeoX, HEAD_DIM / 2, 0.25),
        ]
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The math the shift relies on, in f32: roping at p then at -d is roping at p - d.
    #[test]
    fn rotating_by_minus_d_equals_roping_at_p_minus_d() {
        let mut rng = Rng::new(7);
        for rope in ropes() {
            for (p, d) in [(10usize, 3usize), (100, 50), (3000, 1500), (4095, 2047)] {
                let x = rng.vec(KV_DIM, 1.0);
                let (mut at_p, mut shifted, mut direct) =
                    (vec![0.0; KV_DIM], vec![0.0; KV_DIM], vec![0.0; KV_DIM]);
                rope_row(&x, &mut at_p, p, HEAD_DIM, rope);
                rope_row_at(&at_p, &mut shifted, -(d as f32), HEAD_DIM, rope);
                rope_row(&x, &mut direct, p - d, HEAD_DIM, rope);
                // f32 angles of a few thousand radians carry ~1e-4 of absolute error.
                let err = max_diff(&shifted, &direct);
                assert!(err < 2e-3, "{rope:?} p {p} d {d}: {err}");
            }
        }
    }

    /// A shifted cache holds, at each new position, the key roped directly at that position
    /// (within the rounding of the cache type), the values moved unchanged, and the kept
    /// positions untouched.
    #[test]
    fn shifted_keys_equal_keys_roped_at_their_new_position() {
        let kernels = Kernels::detect();
        let (ctx, n_past, keep, n_discard) = (24usize, 20usize, 3usize, 8usize);
        for (ty, tol) in [(KvType::F16, 2e-3f32), (KvType::Q8_0, 2.5e-2)] {
            for rope in ropes() {
                let mut rng = Rng::new(11);
                let mut kv = KvCache::new(2, ctx, KV_DIM, ty).unwrap();
                // Unroped keys (|x| < 1) and values, per layer and position.
                let xs: Vec<Vec<Vec<f32>>> = (0..2)
                    .map(|_| (0..n_past).map(|_| rng.vec(KV_DIM, 1.0)).collect())
                    .collect();
                let vs: Vec<Vec<Vec<f32>>> = (0..2)
                    .map(|_| (0..n_past).map(|_| rng.vec(KV_DIM, 1.0)).collect())
                    .collect();
                let mut k = vec![0.0; KV_DIM];
                for l in 0..2 {
                    for p in 0..n_past {
                        rope_row(&xs[l][p], &mut k, p, HEAD_DIM, rope);
                        kv.write_row(l, false, p, &k, &kernels).unwrap();
                        kv.write_row(l, true, p, &vs[l][p], &kernels).unwrap();
                    }
                }
                let snapshot = |kv: &mut KvCache, l: usize, v: bool, p: usize| {
                    let mut out = vec![0.0; KV_DIM];
                    kv.read_row(l, v, p, &mut out).unwrap();
                    out
                };
                let before: Vec<Vec<f32>> = (0..2)
                    .flat_map(|l| [false, true].map(|v| (l, v)))
                    .flat_map(|(l, v)| (0..n_past).map(move |p| (l, v, p)))
                    .map(|(l, v, p)| snapshot(&mut kv, l, v, p))
                    .collect();
                let idx = |l: usize, v: bool, p: usize| (l * 2 + usize::from(v)) * n_past + p;
                let mut tmp = vec![0.0; 2 * KV_DIM];
                kv.shift(n_past, keep, n_discard, HEAD_DIM, rope, &kernels, &mut tmp)
                    .unwrap();
                for l in 0..2 {
                    for p in 0..keep {
                        for v in [false, true] {
                            assert_eq!(snapshot(&mut kv, l, v, p), before[idx(l, v, p)]);
                        }
                    }
                    for new in keep..n_past - n_discard {
                        let old = new + n_discard;
                        // Values move bit for bit.
                        assert_eq!(snapshot(&mut kv, l, true, new), before[idx(l, true, old)]);
                        // Keys: compared with RoPE computed directly at the new position.
                        let mut direct = vec![0.0; KV_DIM];
                        rope_row(&xs[l][old], &mut direct, new, HEAD_DIM, rope);
                        let got = snapshot(&mut kv, l, false, new);
                        let err = max_diff(&got, &direct);
                        assert!(
                            err < tol,
                            "{ty:?} {rope:?} layer {l} pos {old}->{new}: {err}"
                        );
                        // Not trivially equal to the unshifted key (the rotation happened).
                        if n_discard > 0 && rope.n_rot > 0 {
                            assert!(max_diff(&got, &before[idx(l, false, old)]) > tol);
                        }
                    }
                }
            }
        }
    }

    /// A layer with fewer rows than the context is a ring: position p lands in row p % rows,
    /// overwriting p - rows; full layers keep every position; the bytes are the sum of the
    /// layers'.
    #[test]
    fn ring_layers_keep_the_last_rows() {
        let kernels = Kernels::detect();
        let (ctx, ring) = (16usize, 5usize);
        let mut kv = KvCache::with_layer_rows(&[ctx, ring], ctx, KV_DIM, KvType::F16).unwrap();
        assert_eq!(kv.bytes(), 2 * (ctx + ring) * KV_DIM * 2);
        assert_eq!(
            KvCache::bytes_for_rows(&[ctx, ring], KV_DIM, KvType::F16),
            Some(kv.bytes())
        );
        assert!(!kv.is_full());
        let row = |p: usize, v: bool| vec![p as f32 + if v { 0.5 } else { 0.0 }; KV_DIM];
        for p in 0..ctx {
            for l in 0..2 {
                for v in [false, true] {
                    kv.write_row(l, v, p, &row(p, v), &kernels).unwrap();
                }
            }
        }
        let mut out = vec![0.0; KV_DIM];
        for p in 0..ctx {
            for v in [false, true] {
                kv.read_row(0, v, p, &mut out).unwrap();
                assert_eq!(out, row(p, v), "full layer, position {p}");
                kv.read_row(1, v, p, &mut out).unwrap();
                // The ring holds the last `ring` positions; row p % ring holds the latest of them.
                let latest = ctx - 1 - (ctx - 1 - p) % ring;
                let want = if p + ring >= ctx { p } else { latest };
                assert_eq!(out, row(want, v), "ring layer, position {p}");
            }
        }
        let mut tmp = vec![0.0; 2 * KV_DIM];
        let e = kv
            .shift(ctx, 0, 2, HEAD_DIM, ropes()[0], &kernels, &mut tmp)
            .unwrap_err();
        assert!(e.contains("sliding-window"), "{e}");
        assert!(KvCache::with_layer_rows(&[0], ctx, KV_DIM, KvType::F16).is_err());
        assert!(KvCache::with_layer_rows(&[ctx + 1], ctx, KV_DIM, KvType::F16).is_err());
    }

    #[test]
    fn impossible_shifts_are_errors() {
        let kernels = Kernels::detect();
        let mut kv = KvCache::new(1, 8, KV_DIM, KvType::F16).unwrap();
        let mut tmp = vec![0.0; 2 * KV_DIM];
        let rope = ropes()[0];
        assert!(kv
            .shift(9, 0, 1, HEAD_DIM, rope, &kernels, &mut tmp)
            .is_err());
        assert!(kv
            .shift(4, 3, 2, HEAD_DIM, rope, &kernels, &mut tmp)
            .is_err());
        assert!(kv
            .shift(4, 0, 2, HEAD_DIM, rope, &kernels, &mut tmp[..3])
            .is_err());
        assert!(kv
            .shift(4, 0, 2, HEAD_DIM, rope, &kernels, &mut tmp)
            .is_ok());
    }
}

/// One row of `silu(gate) * up` with ggml's SiLU (its own exp polynomial; see
/// [`cpu::ggml_order`]).
#[inline(always)]
pub(crate) fn swiglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = cpu::ggml_order::silu(g) * u;
    }
}

/// [`swiglu_row`] compiled with hardware FMA (see [`OpCtx::attention_fma`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_row_fma(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_row(gate, up, out)
}

/// [`swiglu_row`] with the gate in `x`, overwritten by the result.
#[inline(always)]
fn swiglu_row_inplace(x: &mut [f32], up: &[f32]) {
    for (o, &u) in x.iter_mut().zip(up) {
        *o = cpu::ggml_order::silu(*o) * u;
    }
}

/// [`swiglu_row_inplace`] compiled with hardware FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_row_inplace_fma(x: &mut [f32], up: &[f32]) {
    swiglu_row_inplace(x, up)
}

/// A thread's attention jobs (see [`OpCtx::attention_jobs`]): job `t * n_head + h` is token
/// t's head h.
enum AttentionJobs<'a> {
    /// Heads claimed in chunks (one token).
    Claimed {
        claims: steal::Claimed<'a>,
        heads: std::ops::Range<usize>,
    },
    /// Every `n_threads`-th job.
    Strided(std::iter::StepBy<std::ops::Range<usize>>),
}

impl Iterator for AttentionJobs<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            AttentionJobs::Claimed { claims, heads } => loop {
                if let Some(h) = heads.next() {
                    return Some(h);
                }
                *heads = claims.next()?;
            },
            AttentionJobs::Strided(jobs) => jobs.next(),
        }
    }
}

/// The operands of an attention op.
#[derive(Clone, Copy)]
struct AttentionArgs {
    q: ValueId,
    layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    scale: f32,
    window: Option<usize>,
    softcap: Option<f32>,
    out: ValueId,
}

/// ggml's GELU (tanh approximation) of the gate times `up`, as its CPU GeGLU computes it: the
/// gate rounded to f16, GELU from a table of f16 results, 0 below -10 and the identity above 10.
#[inline(always)]
fn geglu(gate: f32, up: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    if gate <= -10.0 {
        0.0
    } else if gate >= 10.0 {
        gate * up
    } else {
        let x = f16::from_f32(gate).to_f32();
        let g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh());
        f16::from_f32(g).to_f32() * up
    }
}

/// `cap * tanh(score / cap)` as ggml computes it (scale by 1/cap, tanh, scale by cap), or the
/// score unchanged without a cap.
#[inline(always)]
fn soft_cap(score: f32, cap: Option<f32>) -> f32 {
    match cap {
        Some(c) => (score * (1.0 / c)).tanh() * c,
        None => score,
    }
}

/// Whether `EDGE_RUN_DUMP` asks for a per-op trace of values (a debugging aid).
fn dump_enabled() -> bool {
    std::env::var_os("EDGE_RUN_DUMP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Columns per thread part of a decode step's elementwise f32 ops: a whole cache line, so that
/// two threads never write the same line.
const F32_GRANULE: usize = 16;

/// A graph with its arena offsets.
pub struct PlannedGraph {
    /// The graph.
    pub graph: Graph,
    /// Byte offset of each value in the arena.
    pub offsets: Vec<usize>,
    /// Whether the threads meet at a barrier after each op (see [`sync_points`]).
    sync_after: Vec<bool>,
}

impl PlannedGraph {
    /// The graph with its planned offsets (which must be a checked plan of `graph`).
    pub fn new(graph: Graph, offsets: Vec<usize>) -> PlannedGraph {
        let sync_after = sync_points(&graph, &offsets);
        PlannedGraph {
            graph,
            offsets,
            sync_after,
        }
    }

    /// Barriers one run of the graph costs (for tests and the curious).
    pub fn n_barriers(&self) -> usize {
        self.sync_after.iter().filter(|&&b| b).count()
    }
}

/// What an op reads and writes: arena byte ranges, and the KV cache.
struct Access {
    reads: Vec<std::ops::Range<usize>>,
    writes: Vec<std::ops::Range<usize>>,
    reads_kv: bool,
    writes_kv: bool,
}

impl Access {
    fn of(op: &Op, graph: &Graph, offsets: &[usize]) -> Access {
        let range = |v: ValueId| offsets[v.0]..offsets[v.0] + graph.values[v.0].bytes();
        let mut reads: Vec<ValueId> = op.inputs();
        // `inputs` leaves out `x + x` (for the in-place planner); it is still a read.
        if let Op::Add { a, b, .. } = *op {
            reads = vec![a, b];
        }
        Access {
            reads: reads.into_iter().map(range).collect(),
            writes: op.output().into_iter().map(range).collect(),
            reads_kv: matches!(op, Op::Attention { .. }),
            writes_kv: matches!(op, Op::StoreKv { .. }),
        }
    }

    /// Whether running `self` and `later` concurrently could race: one writes what the other
    /// reads or writes.
    fn conflicts(&self, later: &Access) -> bool {
        let overlap = |a: &[std::ops::Range<usize>], b: &[std::ops::Range<usize>]| {
            a.iter()
                .any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
        };
        overlap(&self.writes, &later.reads)
            || overlap(&self.writes, &later.writes)
            || overlap(&later.writes, &self.reads)
            || (self.writes_kv && (later.reads_kv || later.writes_kv))
            || (later.writes_kv && self.reads_kv)
    }
}

/// For each op, whether the threads must meet after it. Ops that neither read nor write what
/// the ops since the last barrier write (compared as arena byte ranges, since the planner lets
/// values share memory, plus the KV cache) run without one: e.g. the query, key and value
/// matmuls, or the gate and up matmuls, one after the other with a single barrier at the end.
/// A 135M model's decode step runs about 600 ops of a few microseconds each, so every barrier
/// saved counts. The last op always has one.
fn sync_points(graph: &Graph, offsets: &[usize]) -> Vec<bool> {
    let n = graph.ops.len();
    let mut sync = vec![true; n];
    let mut epoch: Vec<Access> = Vec::new();
    for (i, op) in graph.ops.iter().enumerate() {
        let access = Access::of(op, graph, offsets);
        if i > 0 {
            let meet = epoch.iter().any(|e| e.conflicts(&access));
            sync[i - 1] = meet;
            if meet {
                epoch.clear();
            }
        }
        epoch.push(access);
    }
    sync
}

/// Bytes of scratch one thread needs for attention over `ctx` positions with heads of
/// `head_dim`: one row of scores (one head, one token), the query, and the ordered
/// accumulators of the output (64 lanes per output element; see [`cpu::ggml_order`]).
pub fn scratch_bytes_per_thread(ctx: usize, head_dim: usize) -> usize {
    (ctx + head_dim + head_dim * 4 * cpu::ggml_order::LANES) * 4
}

/// Bytes of scratch one thread needs for the tiled (online-softmax) attention: an f32
/// accumulator and one dequantized value row of one head. Independent of the context.
pub fn online_scratch_bytes_per_thread(head_dim: usize) -> usize {
    2 * head_dim * 4
}

/// Everything a run touches besides the model.
pub struct Executor {
    /// Attention runs tiled with an online softmax (always for a q8_0 cache; for f16 when
    /// flash attention was asked for).
    online_attention: bool,
    pool: ThreadPool,
    barrier: SpinBarrier,
    kernels: Kernels,
    arena: SharedMem,
    scratch: SharedMem,
    scratch_per_thread: usize,
    /// `EDGE_RUN_DUMP` was set when the executor was built.
    dump: bool,
    /// Decode matmuls' row chunks, claimed by the threads (see [`steal`]).
    claims: steal::RowClaims,
    /// The tag of the next run's first op: each op of each run tags its row claims with a
    /// larger number than any before it.
    next_tag: std::sync::atomic::AtomicUsize,
}

/// Inputs of one run.
#[derive(Clone, Copy)]
pub struct RunArgs<'a> {
    /// Token ids (at most the graph's ubatch).
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
}

impl Executor {
    /// An executor with an arena of `arena_bytes` and `n_threads` threads; `online_attention`
    /// picks the tiled online-softmax attention (scratch independent of `ctx`) over the exact
    /// llama.cpp-order one.
    pub fn new(
        arena_bytes: usize,
        n_threads: usize,
        ctx: usize,
        head_dim: usize,
        online_attention: bool,
        kernels: Kernels,
    ) -> Result<Executor, String> {
        let scratch_per_thread = if online_attention {
            online_scratch_bytes_per_thread(head_dim)
        } else {
            scratch_bytes_per_thread(ctx, head_dim)
        }
        .next_multiple_of(memory::ALIGN);
        Ok(Executor {
            online_attention,
            pool: ThreadPool::new(n_threads)?,
            barrier: SpinBarrier::new(n_threads.max(1)),
            kernels,
            arena: SharedMem::new(arena_bytes)?,
            scratch: SharedMem::new(scratch_per_thread * n_threads.max(1))?,
            scratch_per_thread,
            dump: dump_enabled(),
            claims: steal::RowClaims::new(n_threads),
            next_tag: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Threads used per op.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Bytes of the arena.
    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    /// Bytes of per-thread scratch.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.len()
    }

    /// The kernels in use.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Runs the graph for `args.tokens` at positions `pos0..`; the caller has checked that the
    /// tokens fit the graph's ubatch and the cache. Returns false if a thread panicked (a bug).
    pub fn run(&self, model: &Model, kv: &KvCache, pg: &PlannedGraph, args: RunArgs<'_>) -> bool {
        assert!(args.tokens.len() <= pg.graph.ubatch && !args.tokens.is_empty());
        assert!(args.pos0 + args.tokens.len() <= kv.ctx);
        let n = self.n_threads();
        let dump = self.dump;
        let tag0 = self
            .next_tag
            .fetch_add(pg.graph.ops.len(), std::sync::atomic::Ordering::Relaxed);
        self.pool.run(&|tid| {
            for (i, (op, &sync)) in pg.graph.ops.iter().zip(&pg.sync_after).enumerate() {
                let ctx = OpCtx {
                    exec: self,
                    model,
                    kv,
                    pg,
                    args,
                    tid,
                    n_threads: n,
                    tag: tag0.wrapping_add(i),
                };
                ctx.run(op);
                if sync || dump {
                    self.barrier.wait();
                }
                if dump && tid == 0 {
                    self.dump_value(pg, op, args.tokens.len());
                }
            }
        })
    }

    /// Prints the first and last values and the sum of an op's output (last row) to stderr,
    /// in the format of llama.cpp's `llama-eval-callback`, to locate numeric differences.
    fn dump_value(&self, pg: &PlannedGraph, op: &Op, n_tokens: usize) {
        let Some(o) = op.output() else { return };
        let v = &pg.graph.values[o.0];
        if v.ty != crate::graph::ValueType::F32 || v.cols < 6 {
            return;
        }
        let row = v.rows.min(n_tokens) - 1;
        // SAFETY: called between ops, after the barrier, by one thread: nothing writes the arena.
        let x = unsafe {
            self.arena
                .slice::<f32>(pg.offsets[o.0] + row * v.cols * 4, v.cols)
        };
        let sum: f64 = x.iter().map(|&a| f64::from(a)).sum();
        let c = v.cols;
        eprintln!(
            "{:32} [{:.4}, {:.4}, {:.4}, ..., {:.4}, {:.4}, {:.4}] sum = {:.6}",
            v.name,
            x[0],
            x[1],
            x[2],
            x[c - 3],
            x[c - 2],
            x[c - 1],
            sum
        );
    }

    /// The f32 contents of `value` (first `rows` rows), e.g. the logits after a run.
    pub fn read_f32(&self, pg: &PlannedGraph, value: ValueId, rows: usize) -> &[f32] {
        let v = &pg.graph.values[value.0];
        // SAFETY: no run is in progress (runs take &self and return before we are called
        // again; callers hold the session mutably while running), so nothing writes the arena.
        unsafe {
            self.arena
                .slice::<f32>(pg.offsets[value.0], rows.min(v.rows) * v.cols)
        }
    }
}

/// What one thread needs to run its share of one op.
struct OpCtx<'a> {
    exec: &'a Executor,
    model: &'a Model,
    kv: &'a KvCache,
    pg: &'a PlannedGraph,
    args: RunArgs<'a>,
    tid: usize,
    n_threads: usize,
    /// Tags this op's row claims: consecutive ops have consecutive tags.
    tag: usize,
}

impl OpCtx<'_> {
    fn n_tokens(&self) -> usize {
        self.args.tokens.len()
    }

    fn rows_of(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].rows.min(self.n_tokens())
    }

    fn cols(&self, v: ValueId) -> usize {
        self.pg.graph.values[v.0].cols
    }

    /// Whether the plan put `out` exactly on `input` (an in-place op).
    fn aliases(&self, out: ValueId, input: ValueId) -> bool {
        out != input && self.pg.offsets[out.0] == self.pg.offsets[input.0]
    }

    /// My share of `0..n` with the given granule.
    fn share(&self, n: usize, granule: usize) -> std::ops::Range<usize> {
        split_range(n, self.tid, self.n_threads, granule)
    }

    /// This thread's part of an op over `rows` rows of `cols` independent columns: its share
    /// of the rows and every column (prefill), or, with fewer rows than threads (decode), every
    /// row and its share of the columns in whole `granule`s — one token's elementwise ops would
    /// otherwise run on one thread while the others wait.
    fn share_rows_or_cols(
        &self,
        rows: usize,
        cols: usize,
        granule: usize,
    ) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        if rows >= self.n_threads {
            (self.share(rows, 1), 0..cols)
        } else {
            (0..rows, self.share(cols, granule))
        }
    }

    /// This thread's (token, head) jobs of attention. For one token: heads claimed one at a
    /// time from a contiguous share (whole groups of heads that share a KV head where the KV
    /// heads divide evenly among the threads, so that each thread mostly reads the KV heads it
    /// stored: see `store_kv`), then heads taken from the back of the others' shares, so that
    /// threads finish together. For several tokens: [`Self::share_causal`].
    fn attention_jobs(&self, n_head: usize, group: usize) -> AttentionJobs<'_> {
        if self.n_tokens() == 1 && self.n_threads > 1 {
            let n_head_kv = n_head / group.max(1);
            let granule = if n_head_kv.is_multiple_of(self.n_threads) {
                group
            } else {
                1
            };
            let plan = steal::ChunkPlan {
                n_rows: n_head,
                n_threads: self.n_threads,
                granule,
                chunk: 1,
                shrink: 0,
            };
            AttentionJobs::Claimed {
                claims: self.exec.claims.claimed(plan, self.tag, self.tid),
                heads: 0..0,
            }
        } else {
            AttentionJobs::Strided(self.share_causal(self.n_tokens() * n_head))
        }
    }

    /// This thread's (token, head) jobs of causal attention, dealt round-robin: a job's cost
    /// grows with its token's position, so contiguous ranges would give the last thread most of
    /// the work (3x the first's for two threads over a whole prompt).
    fn share_causal(&self, n: usize) -> std::iter::StepBy<std::ops::Range<usize>> {
        (self.tid.min(n)..n).step_by(self.n_threads.max(1))
    }

    /// Rows `rows` of f32 value `v`, read-only.
    fn input(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[f32] {
        let cols = self.cols(v);
        // SAFETY: inputs are not written during the op (module docs, fact 2).
        unsafe {
            self.exec.arena.slice::<f32>(
                self.pg.offsets[v.0] + rows.start * cols * 4,
                rows.len() * cols,
            )
        }
    }

    /// Raw rows of a quantized value, read-only.
    fn input_bytes(&self, v: ValueId, rows: std::ops::Range<usize>) -> &[u8] {
        let rb = self.pg.graph.values[v.0].row_bytes();
        // SAFETY: as `input`.
        unsafe {
            self.exec
                .arena
                .slice::<u8>(self.pg.offsets[v.0] + rows.start * rb, rows.len() * rb)
        }
    }

    /// Elements `range` of row `row` of f32 value `v`, for writing.
    #[allow(clippy::mut_from_ref)]
    fn output(&self, v: ValueId, row: usize, range: std::ops::Range<usize>) -> &mut [f32] {
        let cols = self.cols(v);
        debug_assert!(range.end <= cols);
        // SAFETY: each thread asks only for its own disjoint part of the output (fact 2), and
        // the output does not overlap any input (fact 1).
        unsafe {
            self.exec.arena.slice_mut::<f32>(
                self.pg.offsets[v.0] + (row * cols + range.start) * 4,
                range.len(),
            )
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn output_bytes(&self, v: ValueId, row: usize) -> &mut [u8] {
        let rb = self.pg.graph.values[v.0].row_bytes();
        // SAFETY: as `output`; a thread writes only its own rows.
        unsafe {
            self.exec
                .arena
                .slice_mut::<u8>(self.pg.offsets[v.0] + row * rb, rb)
        }
    }

    #[allow(clippy::mut_from_ref)]
    fn scratch(&self) -> &mut [f32] {
        let per = self.exec.scratch_per_thread;
        // SAFETY: each thread uses only its own scratch slot.
        unsafe { self.exec.scratch.slice_mut::<f32>(self.tid * per, per / 4) }
    }

    fn run(&self, op: &Op) {
        match *op {
            Op::Embed { table, out } => self.embed(table, out),
            Op::RmsNorm {
                x,
                weight,
                eps,
                out,
            } => self.rms_norm(x, weight, eps, out),
            Op::Quantize { x, out } => self.quantize(x, out),
            Op::MatMul { weight, x, out } => self.matmul(weight, x, out),
            Op::Rope {
                x,
                head_dim,
                rope,
                freq_factors,
                out,
            } => self.rope(x, head_dim, rope, freq_factors, out),
            Op::StoreKv {
                k,
                v,
                layer,
                head_dim,
            } => self.store_kv(k, v, layer, head_dim),
            Op::Attention {
                q,
                layer,
                n_head,
                n_head_kv,
                head_dim,
                scale,
                window,
                softcap,
                out,
            } => {
                let a = AttentionArgs {
                    q,
                    layer,
                    n_head,
                    n_head_kv,
                    head_dim,
                    scale,
                    window,
                    softcap,
                    out,
                };
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports FMA (checked), the only feature it enables.
                    return unsafe { self.attention_fma(a) };
                }
                self.attention(a)
            }
            Op::Add { a, b, out } => {
                let cols = self.cols(out);
                // In place: the output sits on `a` or on `b` (fact 1); read that one through
                // the output slice. Addition commutes exactly, so the result is the same.
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
            Op::SwiGlu { gate, up, out } => {
                let cols = self.cols(out);
                let in_place = self.aliases(out, gate);
                let (rows, part) = self.share_rows_or_cols(self.rows_of(out), cols, F32_GRANULE);
                for t in rows {
                    let u = &self.input(up, t..t + 1)[part.clone()];
                    let o = self.output(out, t, part.clone());
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("fma") {
                        // SAFETY: the CPU supports FMA (checked), the only feature it enables.
                        unsafe {
                            if in_place {
                                swiglu_row_inplace_fma(o, u)
                            } else {
                                swiglu_row_fma(&self.input(gate, t..t + 1)[part.clone()], u, o)
                            }
                        };
                        continue;
                    }
                    if in_place {
                        swiglu_row_inplace(o, u);
                    } else {
                        swiglu_row(&self.input(gate, t..t + 1)[part.clone()], u, o);
                    }
                }
            }
            Op::TakeLast { x, out } => {
                if self.tid == 0 {
                    let last = self.n_tokens() - 1;
                    let cols = self.cols(out);
                    self.output(out, 0, 0..cols)
                        .copy_from_slice(self.input(x, last..last + 1));
                }
            }
            Op::AddTableRow { x, table, row, out } => self.add_table_row(x, table, row, out),
            Op::LayerNorm {
                x,
                weight,
                bias,
                eps,
                out,
            } => {
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
            Op::Gelu { x, out } => {
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
            Op::EncoderAttention {
                q,
                k,
                v,
                n_head,
                head_dim,
                scale,
                out,
            } => self.encoder_attention(q, k, v, n_head, head_dim, scale, out),
            Op::Pool { x, pooling, out } => self.pool(x, pooling, out),
            Op::AddBias { x, bias, out } => {
                let b = self.model.weight_f32(bias);
                self.unary(x, out, |c, v| v + b[c]);
            }
            Op::Scale { x, factor, out } => self.unary(x, out, |_, v| v * factor),
            Op::SoftCap { x, cap, out } => {
                let inv = 1.0 / cap;
                self.unary(x, out, |_, v| (v * inv).tanh() * cap);
            }
            Op::HeadRmsNorm {
                x,
                weight,
                eps,
                head_dim,
                out,
            } => {
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
            Op::GeGlu { gate, up, out } => {
                let cols = self.cols(out);
                let in_place = self.aliases(out, gate);
                for t in self.share(self.rows_of(out), 1) {
                    let u = self.input(up, t..t + 1);
                    let o = self.output(out, t, 0..cols);
                    if in_place {
                        for (o, &u) in o.iter_mut().zip(u) {
                            *o = geglu(*o, u);
                        }
                    } else {
                        for ((o, &g), &u) in o.iter_mut().zip(self.input(gate, t..t + 1)).zip(u) {
                            *o = geglu(g, u);
                        }
                    }
                }
            }
            Op::Columns { x, start, out } => {
                let cols = self.cols(out);
                for t in self.share(self.rows_of(out), 1) {
                    self.output(out, t, 0..cols)
                        .copy_from_slice(&self.input(x, t..t + 1)[start..start + cols]);
                }
            }
        }
    }

    /// out[t] = x[t] + the table row `row` names for token t. In place when the plan puts out
    /// on x: each element is read through the output before it is written.
    fn add_table_row(
        &self,
        x: ValueId,
        table: crate::graph::WeightId,
        row: crate::graph::TableRow,
        out: ValueId,
    ) {
        let w = self.model.weight(table);
        let bytes = self.model.weight_bytes(table);
        let row_bytes = w.ty.row_bytes(w.row_len as u64).unwrap_or(0) as usize;
        let cols = self.cols(out);
        let in_place = self.aliases(out, x);
        let tmp = &mut self.scratch()[..cols];
        for t in self.share(self.rows_of(out), 1) {
            let r = match row {
                crate::graph::TableRow::Fixed(r) => r,
                crate::graph::TableRow::Position => self.args.pos0 + t,
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

    /// Bidirectional attention: every (token, head) pair attends to all tokens of the run;
    /// pairs are split among the threads, each writing its own head's slice of the output.
    #[allow(clippy::too_many_arguments)]
    fn encoder_attention(
        &self,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        n_head: usize,
        head_dim: usize,
        scale: f32,
        out: ValueId,
    ) {
        let n = self.rows_of(out);
        let (qs, ks, vs) = (
            self.input(q, 0..n),
            self.input(k, 0..n),
            self.input(v, 0..n),
        );
        let width = self.cols(q);
        let scores = self.scratch();
        for pair in self.share(n * n_head, 1) {
            let (t, h) = (pair / n_head, pair % n_head);
            let cols = h * head_dim..(h + 1) * head_dim;
            let (a, e) = (cols.start, cols.end);
            let key = |j: usize| &ks[j * width + a..j * width + e];
            let value = |j: usize| &vs[j * width + a..j * width + e];
            cpu::attend_all(
                &qs[t * width + a..t * width + e],
                n,
                &key,
                &value,
                scale,
                scores,
                self.output(out, t, cols.clone()),
            );
        }
    }

    /// One row out: the mean of the rows (summed in f64), the first, or the last.
    fn pool(&self, x: ValueId, pooling: crate::graph::Pooling, out: ValueId) {
        let n = self.n_tokens();
        let cols = self.cols(out);
        // Columns are split among the threads.
        let mine = self.share(cols, 16);
        if mine.is_empty() {
            return;
        }
        let o = self.output(out, 0, mine.clone());
        match pooling {
            crate::graph::Pooling::Mean => {
                let xs = self.input(x, 0..n);
                for (i, o) in mine.zip(o.iter_mut()) {
                    let sum: f64 = (0..n).map(|t| f64::from(xs[t * cols + i])).sum();
                    *o = (sum / n as f64) as f32;
                }
            }
            crate::graph::Pooling::Cls => o.copy_from_slice(&self.input(x, 0..1)[mine]),
            crate::graph::Pooling::Last => o.copy_from_slice(&self.input(x, n - 1..n)[mine]),
        }
    }

    /// out = f(column, x) elementwise, row by row; in place when the plan put `out` on `x`
    /// (the element is read through the output slice before it is written).
    #[inline(always)]
    fn unary(&self, x: ValueId, out: ValueId, f: impl Fn(usize, f32) -> f32) {
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

    fn embed(&self, table: crate::graph::WeightId, out: ValueId) {
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

    fn rms_norm(&self, x: ValueId, weight: crate::graph::WeightId, eps: f32, out: ValueId) {
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

    fn quantize(&self, x: ValueId, out: ValueId) {
        let ty = match self.pg.graph.values[out.0].ty {
            crate::graph::ValueType::Quantized(t) => t,
            crate::graph::ValueType::F32 => crate::tensor::GgmlType::F32,
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

    /// Tokens `t0..` of a matmul in groups of `N` through `kernel` (a multi-token entry of
    /// [`Kernels`]: activations `xq` in rows of `xrb` bytes, outputs rows `rows` of `out`),
    /// while whole groups remain and the kernel takes them; returns the first token left.
    #[allow(clippy::too_many_arguments)]
    fn token_groups<const N: usize>(
        &self,
        out: ValueId,
        xq: &[u8],
        xrb: usize,
        t0: usize,
        n_tok: usize,
        rows: &std::ops::Range<usize>,
        kernel: impl Fn([&[u8]; N], [&mut [f32]; N]) -> bool,
    ) -> usize {
        let mut t = t0;
        while t + N <= n_tok {
            let xs: [&[u8]; N] = std::array::from_fn(|k| &xq[(t + k) * xrb..(t + k + 1) * xrb]);
            let ys: [&mut [f32]; N] =
                std::array::from_fn(|k| self.output(out, t + k, rows.clone()));
            if !kernel(xs, ys) {
                break;
            }
            t += N;
        }
        t
    }

    fn matmul(&self, weight: crate::graph::WeightId, x: ValueId, out: ValueId) {
        /// Weight rows per chunk: small enough to stay in L1/L2 while every token uses them.
        const ROWS_PER_CHUNK: usize = 16;
        /// A decode matmul's chunks are this fraction of what is left of a share: long runs
        /// of rows first (each thread streams its weights), short ones last (threads finish
        /// together).
        const DECODE_SHRINK: usize = 4;
        /// ... but not below this many bytes of weights, where a call's own cost would show.
        const DECODE_MIN_CHUNK_BYTES: usize = 32 << 10;
        /// Below this many bytes of weights per thread, a decode matmul takes a few microseconds
        /// and claiming costs more than it evens out (SmolLM2's matrices: 3% slower decode):
        /// each thread then computes its share in one call.
        const STEAL_MIN_SHARE_BYTES: usize = 1 << 20;
        let w = self.model.weight(weight);
        let bytes = self.model.weight_bytes(weight);
        let n_tok = self.rows_of(out);
        let xq = self.input_bytes(x, 0..n_tok);
        let xrb = self.pg.graph.values[x.0].row_bytes();
        if n_tok == 1 && self.n_threads > 1 && bytes.len() / self.n_threads >= STEAL_MIN_SHARE_BYTES
        {
            // Decode streams the weights once and is memory-bound: long chunks first keep each
            // thread's reads sequential, and stealing the short last ones evens out the finish.
            let min_rows = DECODE_MIN_CHUNK_BYTES
                .div_ceil(bytes.len() / w.n_rows.max(1))
                .max(1);
            let plan = steal::ChunkPlan::guided(
                w.n_rows,
                self.n_threads,
                ROWS_PER_CHUNK,
                DECODE_SHRINK,
                min_rows,
            );
            for rows in self.exec.claims.claimed(plan, self.tag, self.tid) {
                let y = self.output(out, 0, rows.clone());
                self.exec
                    .kernels
                    .matvec(w.ty, w.row_len, bytes, &xq[..xrb], rows, y);
            }
            return;
        }
        let mine = self.share(w.n_rows, ROWS_PER_CHUNK);
        // A small decode matmul streams the weights once: one call over the thread's whole
        // share, so that the kernels' prefetching runs ahead across it without a break.
        let chunk = if n_tok == 1 {
            mine.len().max(1)
        } else {
            ROWS_PER_CHUNK
        };
        let mut start = mine.start;
        while start < mine.end {
            let end = (start + chunk).min(mine.end);
            // Groups of 8 tokens where a kernel takes them (prefill), then of 4.
            let rows = start..end;
            let k = &self.exec.kernels;
            let (wt, n) = (w.ty, w.row_len);
            let mut t = self.token_groups::<{ cpu::MATVEC_TOKENS8 }>(
                out,
                xq,
                xrb,
                0,
                n_tok,
                &rows,
                |xs, ys| k.matvec_tokens8(wt, n, bytes, xs, rows.clone(), ys),
            );
            t = self.token_groups::<{ cpu::MATVEC_TOKENS }>(
                out,
                xq,
                xrb,
                t,
                n_tok,
                &rows,
                |xs, ys| k.matvec_tokens(wt, n, bytes, xs, rows.clone(), ys),
            );
            for t in t..n_tok {
                let y = self.output(out, t, start..end);
                self.exec.kernels.matvec(
                    w.ty,
                    w.row_len,
                    bytes,
                    &xq[t * xrb..(t + 1) * xrb],
                    start..end,
                    y,
                );
            }
            start = end;
        }
    }

    fn rope(
        &self,
        x: ValueId,
        head_dim: usize,
        rope: Rope,
        freq_factors: Option<crate::graph::WeightId>,
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
                (self.args.pos0 + t) as f32,
                head_dim,
                rope,
                factors,
            );
        }
    }

    fn store_kv(&self, k: ValueId, v: ValueId, layer: usize, head_dim: usize) {
        let kv_dim = self.kv.kv_dim;
        // One token's heads go to the threads whose attention reads them (see
        // `attention_jobs`), so each thread's KV rows stay in its own caches; q8_0 heads must
        // be whole blocks to be split.
        let granule = match self.kv.ty {
            KvType::Q8_0 if !head_dim.is_multiple_of(32) => kv_dim,
            _ => head_dim.max(1),
        };
        let (tokens, part) = self.share_rows_or_cols(self.n_tokens(), kv_dim, granule);
        if part.is_empty() {
            return;
        }
        for t in tokens {
            let pos = self.args.pos0 + t;
            for (is_v, src) in [(false, k), (true, v)] {
                let src = &self.input(src, t..t + 1)[part.clone()];
                let offset = self.kv.row_offset(layer, is_v, pos);
                match self.kv.ty {
                    KvType::F16 => {
                        // SAFETY: this part of row `pos` is written only by the thread that owns
                        // it (token t, these columns), and no attention op reads the cache
                        // during this op.
                        let dst = unsafe {
                            self.kv
                                .mem
                                .slice_mut::<f16>(offset + part.start * 2, part.len())
                        };
                        cpu::f32_to_f16_row(src, dst);
                    }
                    KvType::Q8_0 => {
                        // Rows are whole blocks (checked when the session is planned), and so
                        // is `part` (the granule above).
                        let (b0, b1) = (part.start / 32 * 34, part.end.div_ceil(32) * 34);
                        // SAFETY: as above.
                        let dst = unsafe { self.kv.mem.slice_mut::<u8>(offset + b0, b1 - b0) };
                        let _ =
                            self.exec
                                .kernels
                                .quantize_row(crate::tensor::GgmlType::Q8_0, src, dst);
                    }
                }
            }
        }
    }

    /// Attention tiled over the cache, flash-style: one pass over the positions keeps a running
    /// maximum, a running denominator and an f32 accumulator of V, rescaled whenever the
    /// maximum grows (online softmax). Memory: one head of accumulator per thread, whatever the
    /// context. With a q8_0 cache the query is quantized to q8_0 for integer K·q products, as
    /// llama.cpp's flash-attention path does for a quantized cache; with f16 the products are
    /// f32 over the widened keys.
    #[inline(always)]
    fn attention_online(&self, a: AttentionArgs) {
        use crate::tensor::GgmlType;
        let AttentionArgs {
            q,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            scale,
            window,
            softcap,
            out,
        } = a;
        let group = n_head / n_head_kv;
        let head_bytes = self.kv.row_bytes / n_head_kv;
        let rb = self.kv.row_bytes;
        let (k_base, v_base, rows) = self.kv.layer_span(layer);
        let scratch = self.scratch();
        let (acc, rest) = scratch.split_at_mut(head_dim);
        let (vtmp, _) = rest.split_at_mut(head_dim);
        // q8_0 of one query head (head_dim <= MAX_Q8_HEAD_DIM, checked when planning).
        let quantized = self.kv.ty == KvType::Q8_0;
        let mut q8 = [0u8; MAX_Q8_HEAD_DIM / 32 * 34];
        let q8 = &mut q8[..if quantized { head_bytes } else { 0 }];
        for job in self.attention_jobs(n_head, group) {
            let (t, h) = (job / n_head, job % n_head);
            let kvh = h / group;
            let n_pos = self.args.pos0 + t + 1;
            let qh = &self.input(q, t..t + 1)[h * head_dim..(h + 1) * head_dim];
            if quantized {
                let _ = self.exec.kernels.quantize_row(GgmlType::Q8_0, qh, q8);
            }
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0.0f32;
            acc.fill(0.0);
            let first = window.map_or(0, |w| n_pos.saturating_sub(w));
            for p in first..n_pos {
                // SAFETY: the cache is only read during attention (see `attention`).
                let krow = unsafe {
                    self.kv
                        .mem
                        .slice::<u8>(k_base + ring_slot(p, rows) * rb, rb)
                };
                let k = &krow[kvh * head_bytes..(kvh + 1) * head_bytes];
                let dot = if quantized {
                    self.exec.kernels.vec_dot(GgmlType::Q8_0, head_dim, k, q8)
                } else {
                    k.chunks_exact(2)
                        .zip(qh)
                        .map(|(k, q)| f16::from_le_bytes([k[0], k[1]]).to_f32() * q)
                        .sum::<f32>()
                };
                let s = soft_cap(dot, softcap) * scale;
                let (ms, vs) = if s > max {
                    let ms = (max - s).exp();
                    max = s;
                    for x in acc.iter_mut() {
                        *x *= ms;
                    }
                    (ms, 1.0)
                } else {
                    (1.0, (s - max).exp())
                };
                // SAFETY: read-only, as above.
                let vrow = unsafe {
                    self.kv
                        .mem
                        .slice::<u8>(v_base + ring_slot(p, rows) * rb, rb)
                };
                let _ = cpu::dequantize_row(
                    self.kv.ty.ggml_type(),
                    &vrow[kvh * head_bytes..(kvh + 1) * head_bytes],
                    vtmp,
                );
                for (x, v) in acc.iter_mut().zip(vtmp.iter()) {
                    *x = v.mul_add(vs, *x);
                }
                sum = sum * ms + vs;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            for (o, x) in self
                .output(out, t, h * head_dim..(h + 1) * head_dim)
                .iter_mut()
                .zip(acc.iter())
            {
                *o = x * inv;
            }
        }
    }

    /// [`OpCtx::attention`] compiled with hardware FMA: the ggml-ordered kernels are chains of
    /// fused multiply-adds, each a libm call without the instruction. Same results either way.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn attention_fma(&self, a: AttentionArgs) {
        self.attention(a)
    }

    /// Attention for row t, head h. With an f16 cache, reproduces llama.cpp's non-flash CPU
    /// path: scores `K·f16(q)`, `softmax(scores * scale)` in f32 with its exp and sums,
    /// probabilities rounded to f16, then `V·p`; the dot products are added in the order ggml
    /// uses for one token (`ggml_vec_dot_f16`) or for a batch (tinyBLAS), see
    /// [`cpu::ggml_order`]. One row of scores per thread; no score matrix. A q8_0 cache goes to
    /// [`OpCtx::attention_online`].
    #[inline(always)]
    fn attention(&self, a: AttentionArgs) {
        if self.exec.online_attention || self.kv.ty == KvType::Q8_0 {
            return self.attention_online(a);
        }
        let AttentionArgs {
            q,
            layer,
            n_head,
            n_head_kv,
            head_dim,
            scale,
            window,
            softcap,
            out,
        } = a;
        use cpu::ggml_order::{self as order, LANES, STEP_LANES};
        let group = n_head / n_head_kv;
        let n_tok = self.n_tokens();
        let batch = n_tok > 1;
        let width = if batch { LANES } else { STEP_LANES };
        let ctx = self.kv.ctx;
        let (k_base, v_base, rows) = self.kv.layer_span(layer);
        // The layer's keys and values, one slice each (f16 rows of `row_bytes` bytes).
        let row_len = self.kv.row_bytes / 2;
        debug_assert!(row_len >= self.kv.kv_dim);
        // SAFETY: the cache is only read during attention: StoreKv wrote it before the barrier
        // that precedes this op, and nothing writes it until the next StoreKv.
        let (keys, values) = unsafe {
            (
                self.kv.mem.slice::<f16>(k_base, rows * row_len),
                self.kv.mem.slice::<f16>(v_base, rows * row_len),
            )
        };
        let scratch = self.scratch();
        let (scores, rest) = scratch.split_at_mut(ctx);
        let (qh, rest) = rest.split_at_mut(head_dim);
        let accs = &mut rest[..head_dim * width];
        for job in self.attention_jobs(n_head, group) {
            let (t, h) = (job / n_head, job % n_head);
            let kvh = h / group;
            let n_pos = self.args.pos0 + t + 1;
            // ggml converts the query to f16 before its f16 K·Q product.
            for (d, s) in qh
                .iter_mut()
                .zip(&self.input(q, t..t + 1)[h * head_dim..(h + 1) * head_dim])
            {
                *d = f16::from_f32(*s).to_f32();
            }
            // A sliding window starts later; scores[i] is position first + i.
            let first = window.map_or(0, |w| n_pos.saturating_sub(w));
            let n_seen = n_pos - first;
            let off = kvh * head_dim;
            // Positions first.. sit in at most two runs of consecutive rows (a ring wraps once).
            let runs = ring_runs(first, n_seen, rows);
            let mut at = 0;
            for (slot0, len) in runs {
                let run = &keys[slot0 * row_len..];
                order::dot_f16_rows(run, row_len, off, qh, &mut scores[at..at + len], batch);
                at += len;
            }
            for s in &mut scores[..n_seen] {
                *s = soft_cap(*s, softcap) * scale;
            }
            // The maximum in 8 lanes (vectorized; one serial chain of `max` is slow): the same
            // value as a serial fold, NaNs ignored either way (a zero's sign may differ, which
            // changes no `s - max`).
            let mut lanes = [f32::NEG_INFINITY; 8];
            for c in scores[..n_seen].chunks(8) {
                for (m, s) in lanes.iter_mut().zip(c) {
                    *m = m.max(*s);
                }
            }
            let max = lanes.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
            // exp(s - max), summed 16 at a time in f64 (ggml_vec_soft_max_f32).
            let mut sum = 0.0f64;
            for chunk in scores[..n_seen].chunks_mut(LANES) {
                order::expf_shifted(chunk, max);
                let mut lanes = [0.0f32; LANES];
                lanes[..chunk.len()].copy_from_slice(chunk);
                sum += f64::from(order::reduce16(&lanes));
            }
            let inv = (1.0 / sum) as f32;
            order::scale_round_f16(&mut scores[..n_seen], inv);
            // V·p with p rounded to f16. Output element d accumulates term p in slot
            // p % width (see cpu::ggml_order); slots are stored [slot][d] so that one position
            // updates a contiguous row of head_dim accumulators (vectorizable, same order).
            accs.fill(0.0);
            let mut at = 0;
            for (slot0, len) in runs {
                let run = &values[slot0 * row_len..];
                order::axpy_f16_rows(accs, width, at, run, row_len, off, &scores[at..at + len]);
                at += len;
            }
            order::accumulated_sums(accs, self.output(out, t, h * head_dim..(h + 1) * head_dim));
        }
    }
}

#[cfg(test)]
mod ring_tests {
    use super::{ring_runs, ring_slot};

    /// The runs list exactly the rows `ring_slot` gives, position by position.
    #[test]
    fn ring_runs_cover_the_slots_in_order() {
        for rows in [1usize, 3, 8, 13] {
            for first in 0..3 * rows {
                for n in 0..=rows {
                    let want: Vec<usize> = (first..first + n).map(|p| ring_slot(p, rows)).collect();
                    let got: Vec<usize> = ring_runs(first, n, rows)
                        .iter()
                        .flat_map(|&(s, len)| s..s + len)
                        .collect();
                    assert_eq!(got, want, "rows {rows} first {first} n {n}");
                }
            }
        }
    }
}

#[cfg(test)]
mod sync_tests {
    use super::*;
    use crate::graph::{ValueType, WeightId};

    /// Values of 4 f32 (16 bytes) each; offsets given by hand so that aliasing can be staged.
    fn graph(n_values: usize) -> (Graph, Vec<ValueId>) {
        let mut g = Graph::new(1);
        let v = (0..n_values)
            .map(|i| g.value(format!("v{i}"), 1, 4, ValueType::F32))
            .collect();
        (g, v)
    }

    fn matmul(x: ValueId, out: ValueId) -> Op {
        Op::MatMul {
            weight: WeightId(0),
            x,
            out,
        }
    }

    #[test]
    fn independent_ops_share_one_barrier() {
        // q, k, v = W·x (independent), then q + k reads two of them.
        let (mut g, v) = graph(5);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[0], v[2]));
        g.push(matmul(v[0], v[3]));
        g.push(Op::Add {
            a: v[1],
            b: v[2],
            out: v[4],
        });
        let offsets = (0..5).map(|i| i * 16).collect();
        let pg = PlannedGraph::new(g, offsets);
        assert_eq!(pg.sync_after, [false, false, true, true]);
        assert_eq!(pg.n_barriers(), 2);
    }

    #[test]
    fn a_dependency_two_ops_back_still_meets() {
        // A writes v1; B is independent of A; C reads A's output: the barrier goes before C.
        let (mut g, v) = graph(4);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[0], v[2]));
        g.push(matmul(v[1], v[3]));
        let pg = PlannedGraph::new(g, vec![0, 16, 32, 48]);
        assert_eq!(pg.sync_after, [false, true, true]);
    }

    #[test]
    fn shared_arena_bytes_are_a_dependency() {
        // B's output is planned over A's input (A's input dies at A): B must wait for A.
        let (mut g, v) = graph(4);
        g.push(matmul(v[0], v[1]));
        g.push(matmul(v[2], v[3]));
        let pg = PlannedGraph::new(g, vec![0, 16, 32, 8]);
        assert_eq!(pg.sync_after, [true, true]);
    }

    #[test]
    fn the_cache_orders_store_and_attention() {
        let (mut g, v) = graph(4);
        g.push(Op::StoreKv {
            k: v[0],
            v: v[1],
            layer: 0,
            head_dim: 4,
        });
        g.push(Op::Attention {
            q: v[2],
            layer: 0,
            n_head: 1,
            n_head_kv: 1,
            head_dim: 4,
            scale: 1.0,
            window: None,
            softcap: None,
            out: v[3],
        });
        let pg = PlannedGraph::new(g, vec![0, 16, 32, 48]);
        assert_eq!(pg.sync_after, [true, true]);
    }
}
