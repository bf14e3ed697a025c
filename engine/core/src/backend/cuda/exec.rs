//! The CUDA executor: runs the same [`PlannedGraph`]s as the CPU executor, on an NVIDIA GPU.
//!
//! Memory follows the plan: the arena is ONE device allocation of the planned size and every
//! value lives at its planned offset; the KV cache is ONE allocation (the CPU layout,
//! `[layer][k|v][pos][row]`, rows of f16 or q8_0); the weights are ONE device buffer (discrete GPUs) or the
//! file mapping registered read-only / one managed buffer (integrated GPUs, see
//! [`host::choose_weight_path`]). Besides these, the backend owns the attention partials
//! and a parameter block (position, token ids, argmax result) that kernels read, so that a decode
//! step's launches never change: the decode step is captured once as a CUDA graph and replayed
//! per token after copying the token id and position into the parameter block.
//!
//! Every op is one or two kernel launches (engine/core/cuda/kernels.cu, enqueued by
//! `encode.rs`) on one stream. A run ends
//! with a device argmax of the logits, so greedy decoding copies back one token id, and
//! [`CudaExecutor::sample_on_device`] samples (temperature, top-k, top-p, min-p) on the device and copies
//! back one token id too: no logits copy per token unless asked for
//! ([`CudaExecutor::copy_logits`]). The KV cache is f16 or q8_0 rows (the CPU's layouts).
//!
//! Unsafe code here is limited to the driver's FFI (allocations, copies, registration) and
//! kernel launches; each block states its invariant.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream, LaunchConfig,
    PushKernelArg,
};

#[cfg(test)]
mod tests;

use edge_gguf::GgmlType;
use edge_kernels::{Kernels, Q8Rounding};

use super::device::{context, device_attrs, drv, place_weights, DeviceAlloc, WeightsMem};
use super::host::{self, ConstraintLayout, WeightPath, QUANT_MATMUL};
use super::module;
use crate::backend::interface::{check_kv_range, Allocation, Backend};
use crate::device::Device;
use crate::error::{EngineError, Result as EngineResult};
use crate::graph::ValueId;
use crate::kv::{KvCache, KvType};
use crate::model::Model;
use crate::plan::PlannedGraph;
use crate::sampling::Sampler;

/// The kernels, looked up once.
pub(super) struct CudaKernels {
    pub(super) embed: CudaFunction,
    pub(super) rms_norm: CudaFunction,
    pub(super) quantize_q8: CudaFunction,
    pub(super) quantize_float: CudaFunction,
    pub(super) quantize_q8_k: CudaFunction,
    /// Mat-vec (one token) kernels of the types of [`QUANT_MATMUL`], in its order.
    pub(super) mmv: Vec<CudaFunction>,
    /// Mat-mul (token tiles of [`MMM_TILE`]) kernels of the types of [`QUANT_MATMUL`].
    pub(super) mmm: Vec<CudaFunction>,
    pub(super) mm_float: CudaFunction,
    pub(super) rope: CudaFunction,
    pub(super) store_kv_f16: CudaFunction,
    pub(super) store_kv_q8_0: CudaFunction,
    pub(super) attn_partial: CudaFunction,
    pub(super) attn_partial_q8: CudaFunction,
    pub(super) attn_combine: CudaFunction,
    pub(super) add: CudaFunction,
    pub(super) swiglu: CudaFunction,
    pub(super) copy_row: CudaFunction,
    pub(super) argmax: CudaFunction,
    pub(super) sample_top_k: CudaFunction,
    pub(super) mask_logits: CudaFunction,
}

impl CudaKernels {
    fn load(m: &Arc<CudaModule>) -> Result<CudaKernels, String> {
        let f = |name: &str| {
            m.load_function(name)
                .map_err(|e| format!("cuda kernel {name}: {e}"))
        };
        Ok(CudaKernels {
            embed: f("embed")?,
            rms_norm: f("rms_norm")?,
            quantize_q8: f("quantize_q8")?,
            quantize_float: f("quantize_float")?,
            quantize_q8_k: f("quantize_q8_k")?,
            mmv: QUANT_MATMUL
                .iter()
                .map(|(_, suffix)| f(&format!("mmv_{suffix}")))
                .collect::<Result<_, _>>()?,
            mmm: QUANT_MATMUL
                .iter()
                .map(|(_, suffix)| f(&format!("mmm_{suffix}")))
                .collect::<Result<_, _>>()?,
            mm_float: f("mm_float")?,
            rope: f("rope")?,
            store_kv_f16: f("store_kv_f16")?,
            store_kv_q8_0: f("store_kv_q8_0")?,
            attn_partial: f("attn_partial")?,
            attn_partial_q8: f("attn_partial_q8")?,
            attn_combine: f("attn_combine")?,
            add: f("add_f32")?,
            swiglu: f("swiglu_f32")?,
            copy_row: f("copy_row")?,
            argmax: f("argmax_f32")?,
            sample_top_k: f("sample_top_k")?,
            mask_logits: f("mask_logits_f32")?,
        })
    }
}

/// Index of `ty` in [`QUANT_MATMUL`] (`None`: not a quantized matmul type).
pub(super) fn quant_matmul_index(ty: GgmlType) -> Option<usize> {
    QUANT_MATMUL.iter().position(|&(t, _)| t == ty)
}

/// Tokens per tile of the `mmm_*` kernels (`NT` of their instantiations in kernels.cu).
pub(crate) const MMM_TILE: usize = 8;
/// Weight rows per thread block of every matmul kernel (one warp per row, 128 threads).
pub(crate) const MATMUL_ROWS_PER_BLOCK: usize = 4;

/// Grid of a matmul launch (block: 128 threads) for `n_rows` weight rows and `n_tok` tokens:
/// `x` covers the rows four at a time; `y` the token tiles (`mmm_*`: tiles of [`MMM_TILE`];
/// `mmv_*`, used for one token: 1; `mm_float`: one token per block, `per_token_blocks`).
pub(super) fn matmul_grid(n_rows: usize, n_tok: usize, per_token_blocks: bool) -> (u32, u32) {
    let x = n_rows.div_ceil(MATMUL_ROWS_PER_BLOCK) as u32;
    let y = if per_token_blocks {
        n_tok
    } else if n_tok == 1 {
        1
    } else {
        n_tok.div_ceil(MMM_TILE)
    };
    (x, y as u32)
}

/// Grid of `quantize_q8` / `quantize_q8_k` (block: 256 threads = 8 warps, one warp per block
/// of `block_len` values) for `rows` rows of `cols` values.
pub(super) fn quantize_grid(rows: usize, cols: usize, block_len: usize) -> u32 {
    (rows * (cols / block_len)).div_ceil(8) as u32
}

/// Grid of `store_kv_q8_0` (block: 256 threads = 8 warps, one warp per 32-value block) for
/// `n_tokens` rows of keys and of values of `kv_dim` values.
pub(super) fn store_kv_q8_0_grid(n_tokens: usize, kv_dim: usize) -> u32 {
    (n_tokens * 2 * (kv_dim / 32)).div_ceil(8) as u32
}

/// A kernel argument (the kernels' C types: pointers and `unsigned long long` as u64, `int`,
/// `float`, `long long`).
#[derive(Clone, Copy)]
pub(super) enum Arg {
    U64(u64),
    I32(i32),
    F32(f32),
    I64(i64),
    F64(f64),
}

/// The largest top-k the device sampler takes (`SAMPLE_MAX_K` in kernels.cu: its candidate
/// arrays live in shared memory); a larger one (or top-k off) samples on the host.
pub const SAMPLE_MAX_TOP_K: usize = 1024;

/// Index of the argmax result in the parameter block (i32 words). Mirrors `Params` in
/// kernels.cu: [pos0, n_tokens, argmax, pad, tokens...].
pub(super) const PARAM_ARGMAX: usize = 2;
const PARAM_TOKENS: usize = 4;

/// The device a CUDA session runs on, with everything it allocated.
pub struct CudaExecutor {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) k: CudaKernels,
    pub(super) arena: DeviceAlloc,
    pub(super) kv: DeviceAlloc,
    pub(super) partial: DeviceAlloc,
    pub(super) params: DeviceAlloc,
    /// The device sampler's result: token id and whether it used the random draw (2 i32s).
    pub(super) sample_out: DeviceAlloc,
    /// A constrained step's buffers: the uploaded mask, the masked logits and their argmax
    /// (laid out as `constraint_layout`).
    pub(super) constraint: DeviceAlloc,
    pub(super) constraint_layout: ConstraintLayout,
    _weights: WeightsMem,
    /// Device address of each weight (indexed like `Model::weights`).
    pub(super) wptr: Vec<u64>,
    pub(super) host_params: Vec<i32>,
    /// The decode step's graph, captured at the first decode run (one per session: the decode
    /// PlannedGraph never changes).
    pub(super) decode_graph: Option<CudaGraph>,
    pub(super) use_graphs: bool,
    /// Host copy of the logits, made on demand; reset by every run.
    pub(super) logits: OnceLock<Vec<f32>>,
    /// The logits buffer between runs, reused so that asking for logits allocates once.
    pub(super) spare: Mutex<Option<Vec<f32>>>,
    /// Device address and length of the logits of the last run.
    pub(super) logits_src: (u64, usize),
    pub(super) q8_flavour: i32,
    /// The KV cache's element type (f16, or q8_0 blocks).
    pub(super) kv_type: KvType,
    pub(super) ctx_len: usize,
    pub(super) kv_dim: usize,
    pub(super) decode_splits: usize,
    pub(super) weight_path: WeightPath,
    pub(super) ordinal: usize,
    pub(super) description: String,
}

// SAFETY: the driver handles inside (context, stream, module, graph exec) may be used from any
// thread once the context is current there; every method binds the context first, and the
// executor is used through `&mut`/`&` of its Session, never by two threads at once for a run
// (runs take `&mut self`). The raw host pointer in `Registered` is only passed back to the driver.
unsafe impl Send for CudaExecutor {}

impl CudaExecutor {
    /// Opens device `ordinal`, loads the kernels, places the weights (see
    /// [`host::choose_weight_path`]; `alloc.cuda_weights` overrides it) and allocates what
    /// `alloc` says: the arena, the KV cache and the attention partials, once. `kernels`: the CPU
    /// kernels whose activation rounding flavour the device reproduces.
    pub fn new(
        model: &Model,
        alloc: &Allocation,
        ordinal: usize,
        kernels: Kernels,
    ) -> EngineResult<CudaExecutor> {
        if let Some(reason) = host::cuda_unsupported(model) {
            return Err(EngineError::Device(reason));
        }
        CudaExecutor::open(
            model,
            ordinal,
            alloc.arena_bytes,
            alloc.ctx,
            alloc.ubatch,
            alloc.kv_type,
            alloc.cuda_weights,
            kernels.q8_rounding(),
        )
        .map_err(|e| EngineError::Device(e.into()))
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        model: &Model,
        ordinal: usize,
        arena_bytes: usize,
        ctx_len: usize,
        ubatch: usize,
        kv_type: KvType,
        weights: Option<WeightPath>,
        q8: Q8Rounding,
    ) -> Result<CudaExecutor, String> {
        let p = &model.params;
        let ctx = context(ordinal)?;
        // The executor orders everything on its one stream; cudarc's per-buffer events would
        // only add work (and are not capturable).
        // SAFETY: no CudaSlice of this context is used by this backend.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream"))?;
        let (module, image) = module::load(&ctx)?;
        let k = CudaKernels::load(&module)?;
        let name = ctx.name().unwrap_or_else(|_| "?".into());
        let requested = match weights {
            Some(w) => Some(w),
            None => host::weight_path_from_env()?,
        };
        let attrs = device_attrs(&ctx)?;
        let file = model.gguf().mapped_bytes();
        let (path, why) = host::choose_weight_path(attrs, file.is_some(), requested)?;
        let (weights_mem, wptr) = place_weights(&ctx, model, path, file)?;
        log::info!(
            "cuda:{ordinal} {name}: kernels from {image}; weights: {} ({why})",
            path.name()
        );
        let kv_bytes = KvCache::bytes_for(p.n_layer, ctx_len, p.kv_dim(), kv_type)
            .ok_or("KV cache size overflows")?;
        let arena = DeviceAlloc::new(&ctx, arena_bytes, false)?;
        let kv = DeviceAlloc::new(&ctx, kv_bytes, false)?;
        let partial = DeviceAlloc::new(
            &ctx,
            host::attn_partial_bytes(ubatch, ctx_len, p.n_head, p.head_dim),
            false,
        )?;
        let params = DeviceAlloc::new(&ctx, host::params_bytes(ubatch), false)?;
        let sample_out = DeviceAlloc::new(&ctx, 8, false)?;
        let constraint_layout = ConstraintLayout::new(p.n_vocab);
        let constraint = DeviceAlloc::new(&ctx, constraint_layout.bytes, false)?;
        let q8_flavour = match q8 {
            Q8Rounding::GgmlRef => 0,
            Q8Rounding::GgmlX86 => 1,
            Q8Rounding::GgmlArm => 2,
        };
        let use_graphs = !matches!(
            std::env::var("EDGE_RUN_CUDA_GRAPHS").ok().as_deref(),
            Some("0")
        );
        Ok(CudaExecutor {
            description: format!("cuda:{ordinal} ({name}, {image}, weights {})", path.name()),
            ctx,
            stream,
            k,
            arena,
            kv,
            partial,
            params,
            sample_out,
            constraint,
            constraint_layout,
            _weights: weights_mem,
            wptr,
            host_params: vec![0; PARAM_TOKENS + ubatch],
            decode_graph: None,
            use_graphs,
            logits: OnceLock::new(),
            spare: Mutex::new(None),
            logits_src: (0, 0),
            q8_flavour,
            kv_type,
            ctx_len,
            kv_dim: p.kv_dim(),
            decode_splits: host::decode_attn_splits(ctx_len),
            weight_path: path,
            ordinal,
        })
    }

    /// Device, kernel image and weight path, for logs.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// How the weights reached the device.
    pub fn weight_path(&self) -> WeightPath {
        self.weight_path
    }

    /// Bytes of the arena allocation.
    pub fn arena_bytes(&self) -> usize {
        self.arena.bytes
    }

    /// Bytes of the KV cache allocation.
    pub fn kv_alloc_bytes(&self) -> usize {
        self.kv.bytes
    }

    /// Runs `pg` for `tokens` at positions `pos0..` and waits for it. `decode`: this is the
    /// session's decode graph (ubatch 1), which is captured as a CUDA graph on first use and
    /// replayed afterwards.
    pub fn execute(
        &mut self,
        model: &Model,
        pg: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
        decode: bool,
    ) -> Result<(), String> {
        assert!(!tokens.is_empty() && tokens.len() <= pg.graph.ubatch);
        assert!(pos0 + tokens.len() <= self.ctx_len);
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        // Forget the previous logits (keep the buffer).
        if let Some(v) = self.logits.take() {
            *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        }
        let n = tokens.len();
        self.host_params[0] = pos0 as i32;
        self.host_params[1] = n as i32;
        for (d, &t) in self.host_params[PARAM_TOKENS..].iter_mut().zip(tokens) {
            *d = t as i32;
        }
        // SAFETY: the parameter block holds PARAM_TOKENS + ubatch i32s and n <= ubatch; the
        // copy is from pageable memory, which the driver stages before returning, so reusing
        // host_params afterwards is fine.
        unsafe {
            result::memcpy_htod_async(
                self.params.ptr,
                &self.host_params[..PARAM_TOKENS + n],
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("copy params"))?;
        let out = pg.graph.output;
        self.logits_src = (
            self.arena.ptr + pg.offsets[out.0] as u64,
            pg.graph.values[out.0].cols,
        );
        if decode && n == 1 && self.use_graphs {
            if self.decode_graph.is_none() {
                match self.capture(model, pg) {
                    Ok(g) => self.decode_graph = Some(g),
                    Err(e) => {
                        log::warn!("cuda: capturing the decode graph failed ({e}); launching kernels one by one");
                        self.use_graphs = false;
                    }
                }
            }
            if let Some(g) = &self.decode_graph {
                g.launch().map_err(drv("graph launch"))?;
            } else {
                self.encode(model, pg, n)?;
            }
        } else {
            self.encode(model, pg, n)?;
        }
        self.stream.synchronize().map_err(drv("run"))
    }

    fn capture(&self, model: &Model, pg: &PlannedGraph) -> Result<CudaGraph, String> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("begin capture"))?;
        let encoded = self.encode(model, pg, 1);
        // End the capture whatever happened, so the stream is usable again.
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("end capture"));
        encoded?;
        let graph = graph?.ok_or("empty graph")?;
        log::debug!("cuda: decode step captured as a graph");
        Ok(graph)
    }

    pub(super) fn launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), String> {
        launch(&self.stream, f, grid, block, args)
    }

    /// Logit `index` of the last run (one f32 copied), `None` outside the logits.
    pub fn logit_at(&self, index: usize) -> Result<Option<f32>, String> {
        let (src, len) = self.logits_src;
        if index >= len {
            return Ok(None);
        }
        if let Some(v) = self.logits.get() {
            return Ok(Some(v[index]));
        }
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        let mut v = [0f32; 1];
        // SAFETY: `src` holds `len` f32s of the last run's logits and `index < len`; the
        // stream is synchronized before `v` is read or dropped.
        unsafe {
            result::memcpy_dtoh_async(&mut v, src + (index * 4) as u64, self.stream.cu_stream())
        }
        .map_err(drv("copy logit"))?;
        self.stream.synchronize().map_err(drv("logit"))?;
        Ok(Some(v[0]))
    }

    /// Number of logits of the last run (0 before any run).
    pub fn logits_len(&self) -> usize {
        self.logits_src.1
    }

    /// The last run's logits, copied to the host on the first call after a run.
    pub fn copy_logits(&self) -> Result<&[f32], String> {
        if let Some(v) = self.logits.get() {
            return Ok(v);
        }
        let (src, len) = self.logits_src;
        let mut buf = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        buf.resize(len, 0.0);
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        // SAFETY: `src` is the output value of the last run (len f32s inside the arena); the
        // stream is synchronized before `buf` is used.
        unsafe { result::memcpy_dtoh_async(&mut buf[..], src, self.stream.cu_stream()) }
            .map_err(drv("copy logits"))?;
        self.stream.synchronize().map_err(drv("logits"))?;
        Ok(self.logits.get_or_init(|| buf))
    }

    /// Copies `rows` rows of f32 value `v` of `pg` to the host (tests and debugging).
    pub fn read_f32(&self, pg: &PlannedGraph, v: ValueId, rows: usize) -> Result<Vec<f32>, String> {
        let val = &pg.graph.values[v.0];
        let mut out = vec![0.0f32; rows.min(val.rows) * val.cols];
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        // SAFETY: in bounds of the value's planned buffer; synchronized before returning.
        unsafe {
            result::memcpy_dtoh_async(
                &mut out[..],
                self.arena.ptr + pg.offsets[v.0] as u64,
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("copy"))?;
        self.stream.synchronize().map_err(drv("read"))?;
        Ok(out)
    }
}

/// The CUDA backend of one session.
impl Backend for CudaExecutor {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn n_threads(&self) -> usize {
        1
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn kv_bytes(&self) -> u64 {
        self.kv.bytes as u64
    }

    fn run(
        &mut self,
        model: &Model,
        graph: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
        decode: bool,
    ) -> EngineResult<()> {
        self.execute(model, graph, tokens, pos0, decode)
            .map_err(|e| EngineError::Device(e.into()))
    }

    fn output(&self, _graph: &PlannedGraph) -> EngineResult<&[f32]> {
        self.copy_logits()
            .map_err(|e| EngineError::Device(e.into()))
    }

    fn argmax(&self, _graph: &PlannedGraph) -> EngineResult<u32> {
        self.argmax_on_device()
            .map_err(|e| EngineError::Device(e.into()))
    }

    /// On the device when the sampler allows it ([`Sampler::device_sampling`]: no active
    /// repetition penalty, top-k at most [`SAMPLE_MAX_TOP_K`]): greedy settings use the device
    /// argmax, others the device sampler (the CPU sampler's arithmetic, fed the CPU
    /// generator's uniform draw); only the token id is copied back. Otherwise the logits are
    /// copied and sampled on the host.
    fn sample(&self, graph: &PlannedGraph, sampler: &mut Sampler) -> EngineResult<u32> {
        let len = self.logits_len();
        if let Some(ds) = sampler.device_sampling(len, SAMPLE_MAX_TOP_K.min(len.max(1))) {
            if ds.n == len && len > 0 {
                return sampler
                    .sample_with_draw(|u| self.sample_on_device(&ds, u))
                    .map_err(|e| EngineError::Device(e.into()));
            }
        }
        Ok(sampler.sample(self.output(graph)?))
    }

    /// Uploads the mask and samples on the device ([`CudaExecutor::sample_masked_on_device`]):
    /// a constrained step copies a few KiB up and one token id back, never the logits.
    fn sample_masked(
        &self,
        _graph: &PlannedGraph,
        allowed: &[u32],
        sampler: &mut Sampler,
    ) -> EngineResult<Option<u32>> {
        self.sample_masked_on_device(allowed, sampler)
            .map_err(|e| EngineError::Device(e.into()))
    }

    fn output_finite(&self, _graph: &PlannedGraph, chosen: u32) -> EngineResult<bool> {
        let v = self
            .logit_at(chosen as usize)
            .map_err(|e| EngineError::Device(e.into()))?;
        Ok(v.is_none_or(f32::is_finite))
    }

    fn read_kv(&mut self, offset: usize, out: &mut [u8]) -> EngineResult<()> {
        check_kv_range(offset, out.len(), self.kv.bytes)?;
        let dev = |e: String| EngineError::Device(e.into());
        self.ctx
            .bind_to_thread()
            .map_err(drv("bind"))
            .map_err(dev)?;
        // SAFETY: the range was checked to lie inside the KV allocation; the stream is
        // synchronized before `out` is used or released.
        unsafe {
            result::memcpy_dtoh_async(out, self.kv.ptr + offset as u64, self.stream.cu_stream())
        }
        .map_err(drv("copy kv"))
        .map_err(dev)?;
        self.stream.synchronize().map_err(drv("kv")).map_err(dev)
    }

    fn write_kv(&mut self, offset: usize, data: &[u8]) -> EngineResult<()> {
        check_kv_range(offset, data.len(), self.kv.bytes)?;
        let dev = |e: String| EngineError::Device(e.into());
        self.ctx
            .bind_to_thread()
            .map_err(drv("bind"))
            .map_err(dev)?;
        // SAFETY: the range was checked to lie inside the KV allocation; the stream is
        // synchronized before `data` may be released.
        unsafe {
            result::memcpy_htod_async(self.kv.ptr + offset as u64, data, self.stream.cu_stream())
        }
        .map_err(drv("copy kv"))
        .map_err(dev)?;
        self.stream.synchronize().map_err(drv("kv")).map_err(dev)
    }

    fn shift_context(
        &mut self,
        _model: &Model,
        _n_past: usize,
        _keep: usize,
        _n_discard: usize,
    ) -> EngineResult<()> {
        use crate::error::Setting::{Ctx, Device};
        Err(EngineError::Device(crate::hint![
            "context shift is not implemented on ",
            Device,
            " cuda yet; use ",
            Device,
            " cpu, or a larger ",
            Ctx
        ]))
    }
}

/// Launches `f` on `stream` with `grid` blocks of `block` threads and the given arguments.
pub(super) fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32),
    block: u32,
    args: &[Arg],
) -> Result<(), String> {
    let cfg = LaunchConfig {
        grid_dim: (grid.0.max(1), grid.1.max(1), 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    for a in args {
        match a {
            Arg::U64(x) => b.arg(x),
            Arg::I32(x) => b.arg(x),
            Arg::F32(x) => b.arg(x),
            Arg::I64(x) => b.arg(x),
            Arg::F64(x) => b.arg(x),
        };
    }
    // SAFETY: every call site passes exactly the kernel's parameters, in order and with its C
    // types (see kernels.cu); pointers are into live allocations of the stream's context at
    // offsets the arena plan proved in bounds (values) or computed from the model's validated
    // shapes (weights, KV rows < ctx), and grids never index past the sizes passed with them.
    unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv("launch"))
}
