//! The CUDA backend: runs the same [`PlannedGraph`]s as the CPU executor, on an NVIDIA GPU.
//!
//! Memory follows the plan: the arena is ONE device allocation of the planned size and every
//! value lives at its planned offset; the KV cache is ONE allocation (the CPU layout,
//! `[layer][k|v][pos][row]`, rows of f16 or q8_0); the weights are ONE device buffer (discrete GPUs) or the
//! file mapping registered read-only / one managed buffer (integrated GPUs, see
//! [`crate::device::choose_weight_path`]). Besides these, the backend owns the attention partials
//! and a parameter block (position, token ids, argmax result) that kernels read, so that a decode
//! step's launches never change: the decode step is captured once as a CUDA graph and replayed
//! per token after copying the token id and position into the parameter block.
//!
//! Every op is one or two kernel launches (engine/cuda/kernels.cu) on one stream. A run ends
//! with a device argmax of the logits, so greedy decoding copies back one token id, and
//! [`CudaExecutor::sample`] samples (temperature, top-k, top-p, min-p) on the device and copies
//! back one token id too: no logits copy per token unless asked for
//! ([`CudaExecutor::logits`]). The KV cache is f16 or q8_0 rows (the CPU's layouts).
//!
//! Unsafe code here is limited to the driver's FFI (allocations, copies, registration) and
//! kernel launches; each block states its invariant.

pub mod module;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaStream, LaunchConfig,
    PushKernelArg,
};

use crate::device::{self, DeviceAttrs, WeightPath};
use crate::exec::{KvType, PlannedGraph};
use crate::graph::{Op, RopeOrdering, ValueId, ValueType};
use crate::model::Model;
use crate::tensor::GgmlType;

/// Number of CUDA devices, or why there are none (no driver library, driver error). Never
/// panics, even when the driver library is missing (the binary loads it at run time).
pub fn device_count() -> Result<usize, String> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| "loading the CUDA driver failed".to_string())?
        .map(|n| n.max(0) as usize)
        .map_err(|e| format!("CUDA driver: {e}"))
}

/// A CUDA context on device `ordinal`, or why not.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, String> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(format!(
            "CUDA device {ordinal} does not exist ({n} device(s) found)"
        ));
    }
    std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| "creating a CUDA context panicked".to_string())?
        .map_err(|e| format!("CUDA device {ordinal}: {e}"))
}

fn drv(what: &str) -> impl Fn(result::DriverError) -> String + '_ {
    move |e| format!("cuda {what}: {e}")
}

/// The device attributes the weight-path choice reads.
pub fn device_attrs(ctx: &CudaContext) -> Result<DeviceAttrs, String> {
    use sys::CUdevice_attribute as A;
    let get = |a| ctx.attribute(a).map(|v| v != 0).map_err(drv("attribute"));
    Ok(DeviceAttrs {
        integrated: get(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)?,
        host_register: get(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)?,
        read_only_host_register: get(A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)?,
    })
}

/// One device (or managed) allocation, zero-filled, freed on drop.
pub(crate) struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceAlloc {
    fn new(ctx: &Arc<CudaContext>, bytes: usize, managed: bool) -> Result<DeviceAlloc, String> {
        ctx.bind_to_thread().map_err(drv("bind"))?;
        let n = bytes.max(1);
        // SAFETY: plain allocations of n > 0 bytes in the bound context; the memory is zeroed
        // before anyone reads it.
        let ptr = unsafe {
            let p = if managed {
                result::malloc_managed(n, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
            } else {
                result::malloc_sync(n)
            }
            .map_err(|e| format!("cuda: allocating {bytes} bytes: {e}"))?;
            result::memset_d8_sync(p, 0, n).map_err(drv("memset"))?;
            p
        };
        Ok(DeviceAlloc {
            ptr,
            bytes,
            ctx: Arc::clone(ctx),
        })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemAlloc/cuMemAllocManaged in this context; the stream was
        // synchronized after the last run (every run ends with a synchronize), so no kernel uses it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// The file mapping registered as page-locked, read-only, device-mapped host memory.
struct Registered {
    host: *mut std::ffi::c_void,
    ctx: Arc<CudaContext>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `host` was registered by cuMemHostRegister in this context and the mapping
        // (owned by the Model, which outlives the executor through its Arc) is still there.
        let _ = unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

/// Where the weights live; kept alive for the executor's lifetime.
enum WeightsMem {
    Device(#[allow(dead_code)] DeviceAlloc),
    Registered(#[allow(dead_code)] Registered),
}

/// The kernels, looked up once.
struct Kernels {
    embed: CudaFunction,
    rms_norm: CudaFunction,
    quantize_q8: CudaFunction,
    quantize_float: CudaFunction,
    quantize_q8_k: CudaFunction,
    /// Mat-vec (one token) kernels of the types of [`QUANT_MATMUL`], in its order.
    mmv: Vec<CudaFunction>,
    /// Mat-mul (token tiles of [`MMM_TILE`]) kernels of the types of [`QUANT_MATMUL`].
    mmm: Vec<CudaFunction>,
    mm_float: CudaFunction,
    rope: CudaFunction,
    store_kv_f16: CudaFunction,
    store_kv_q8_0: CudaFunction,
    attn_partial: CudaFunction,
    attn_partial_q8: CudaFunction,
    attn_combine: CudaFunction,
    add: CudaFunction,
    swiglu: CudaFunction,
    copy_row: CudaFunction,
    argmax: CudaFunction,
    sample_top_k: CudaFunction,
}

impl Kernels {
    fn load(m: &Arc<CudaModule>) -> Result<Kernels, String> {
        let f = |name: &str| {
            m.load_function(name)
                .map_err(|e| format!("cuda kernel {name}: {e}"))
        };
        Ok(Kernels {
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
        })
    }
}

/// The quantized weight types with integer (dp4a) matmul kernels, and the suffix of their kernel
/// names (`mmv_<suffix>` for one token, `mmm_<suffix>` for token tiles, in kernels.cu). Other
/// weight types (f32, f16, bf16) go to `mm_float`.
pub(crate) const QUANT_MATMUL: [(GgmlType, &str); 12] = [
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::IQ4_NL, "iq4_nl"),
    (GgmlType::Q2_K, "q2_k"),
    (GgmlType::Q3_K, "q3_k"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::IQ4_XS, "iq4_xs"),
];

/// Index of `ty` in [`QUANT_MATMUL`] (`None`: not a quantized matmul type).
pub(crate) fn quant_matmul_index(ty: GgmlType) -> Option<usize> {
    QUANT_MATMUL.iter().position(|&(t, _)| t == ty)
}

/// Tokens per tile of the `mmm_*` kernels (`NT` of their instantiations in kernels.cu).
pub(crate) const MMM_TILE: usize = 8;
/// Weight rows per thread block of every matmul kernel (one warp per row, 128 threads).
pub(crate) const MATMUL_ROWS_PER_BLOCK: usize = 4;

/// Grid of a matmul launch (block: 128 threads) for `n_rows` weight rows and `n_tok` tokens:
/// `x` covers the rows four at a time; `y` the token tiles (`mmm_*`: tiles of [`MMM_TILE`];
/// `mmv_*`, used for one token: 1; `mm_float`: one token per block, `per_token_blocks`).
pub(crate) fn matmul_grid(n_rows: usize, n_tok: usize, per_token_blocks: bool) -> (u32, u32) {
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
pub(crate) fn quantize_grid(rows: usize, cols: usize, block_len: usize) -> u32 {
    (rows * (cols / block_len)).div_ceil(8) as u32
}

/// Grid of `store_kv_q8_0` (block: 256 threads = 8 warps, one warp per 32-value block) for
/// `n_tokens` rows of keys and of values of `kv_dim` values.
pub(crate) fn store_kv_q8_0_grid(n_tokens: usize, kv_dim: usize) -> u32 {
    (n_tokens * 2 * (kv_dim / 32)).div_ceil(8) as u32
}

/// A kernel argument (the kernels' C types: pointers and `unsigned long long` as u64, `int`,
/// `float`, `long long`).
#[derive(Clone, Copy)]
enum Arg {
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
const PARAM_ARGMAX: usize = 2;
const PARAM_TOKENS: usize = 4;

/// The device a CUDA session runs on, with everything it allocated.
pub struct CudaExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
    arena: DeviceAlloc,
    kv: DeviceAlloc,
    partial: DeviceAlloc,
    params: DeviceAlloc,
    /// The device sampler's result: token id and whether it used the random draw (2 i32s).
    sample_out: DeviceAlloc,
    _weights: WeightsMem,
    /// Device address of each weight (indexed like `Model::weights`).
    wptr: Vec<u64>,
    host_params: Vec<i32>,
    /// The decode step's graph, captured at the first decode run (one per session: the decode
    /// PlannedGraph never changes).
    decode_graph: Option<CudaGraph>,
    use_graphs: bool,
    /// Host copy of the logits, made on demand; reset by every run.
    logits: OnceLock<Vec<f32>>,
    /// The logits buffer between runs, reused so that asking for logits allocates once.
    spare: Mutex<Option<Vec<f32>>>,
    /// Device address and length of the logits of the last run.
    logits_src: (u64, usize),
    q8_flavour: i32,
    /// The KV cache's element type (f16, or q8_0 blocks).
    kv_type: KvType,
    ctx_len: usize,
    kv_dim: usize,
    decode_splits: usize,
    weight_path: WeightPath,
    ordinal: usize,
    description: String,
}

// SAFETY: the driver handles inside (context, stream, module, graph exec) may be used from any
// thread once the context is current there; every method binds the context first, and the
// executor is used through `&mut`/`&` of its Session, never by two threads at once for a run
// (runs take `&mut self`). The raw host pointer in `Registered` is only passed back to the driver.
unsafe impl Send for CudaExecutor {}

impl CudaExecutor {
    /// Opens device `ordinal`, loads the kernels, places the weights (see
    /// [`device::choose_weight_path`]; `weights` overrides it) and allocates the arena (`arena_bytes`),
    /// the KV cache (`ctx` positions, f16) and the attention partials, once.
    pub fn new(
        model: &Model,
        ordinal: usize,
        arena_bytes: usize,
        ctx_len: usize,
        ubatch: usize,
        kv_type: KvType,
        weights: Option<WeightPath>,
    ) -> Result<CudaExecutor, String> {
        let p = &model.params;
        if let Some(reason) = crate::device::cuda_unsupported(model) {
            return Err(reason);
        }
        let ctx = context(ordinal)?;
        // The executor orders everything on its one stream; cudarc's per-buffer events would
        // only add work (and are not capturable).
        // SAFETY: no CudaSlice of this context is used by this backend.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream"))?;
        let (module, image) = module::load(&ctx)?;
        let k = Kernels::load(&module)?;
        let name = ctx.name().unwrap_or_else(|_| "?".into());
        let requested = match weights {
            Some(w) => Some(w),
            None => device::weight_path_from_env()?,
        };
        let attrs = device_attrs(&ctx)?;
        let file = model.gguf().mapped_bytes();
        let (path, why) = device::choose_weight_path(attrs, file.is_some(), requested)?;
        let (weights_mem, wptr) = place_weights(&ctx, model, path, file)?;
        log::info!(
            "cuda:{ordinal} {name}: kernels from {image}; weights: {} ({why})",
            path.name()
        );
        let kv_bytes = crate::exec::KvCache::bytes_for(p.n_layer, ctx_len, p.kv_dim(), kv_type)
            .ok_or("KV cache size overflows")?;
        let arena = DeviceAlloc::new(&ctx, arena_bytes, false)?;
        let kv = DeviceAlloc::new(&ctx, kv_bytes, false)?;
        let partial = DeviceAlloc::new(
            &ctx,
            device::attn_partial_bytes(ubatch, ctx_len, p.n_head, p.head_dim),
            false,
        )?;
        let params = DeviceAlloc::new(&ctx, device::params_bytes(ubatch), false)?;
        let sample_out = DeviceAlloc::new(&ctx, 8, false)?;
        let kernels = crate::cpu::Kernels::detect();
        let q8_flavour = match kernels.q8_rounding() {
            crate::cpu::Q8Rounding::GgmlRef => 0,
            crate::cpu::Q8Rounding::GgmlX86 => 1,
            crate::cpu::Q8Rounding::GgmlArm => 2,
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
            decode_splits: device::decode_attn_splits(ctx_len),
            weight_path: path,
            ordinal,
        })
    }

    /// Device, kernel image and weight path, for logs.
    pub fn description(&self) -> &str {
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
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes
    }

    /// Runs `pg` for `tokens` at positions `pos0..` and waits for it. `decode`: this is the
    /// session's decode graph (ubatch 1), which is captured as a CUDA graph on first use and
    /// replayed afterwards.
    pub fn run(
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

    fn launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), String> {
        launch(&self.stream, f, grid, block, args)
    }

    /// Enqueues every op of `pg` for `n` tokens, then the argmax of the logits.
    fn encode(&self, model: &Model, pg: &PlannedGraph, n: usize) -> Result<(), String> {
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
                                "cuda: no matmul kernel for weights of type {}; use --device cpu",
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
                // Frequency factors never reach here: `device::cuda_unsupported` sends such
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
                Op::Attention {
                    q,
                    layer,
                    n_head,
                    n_head_kv,
                    head_dim,
                    scale,
                    out,
                    // Sliding windows and soft-capping never reach here (see above).
                    ..
                } => {
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
                // (device::cuda_unsupported says so first).
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
                        "the CUDA backend has no {} op; use --device cpu",
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

    /// The argmax of the last run's logits (computed on the device; copies one i32).
    pub fn argmax(&self) -> Result<u32, String> {
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        let mut v = [0i32; 1];
        // SAFETY: the parameter block holds at least PARAM_TOKENS i32s; the stream is
        // synchronized before `v` is read or dropped.
        unsafe {
            result::memcpy_dtoh_async(
                &mut v,
                self.params.ptr + (PARAM_ARGMAX * 4) as u64,
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("copy argmax"))?;
        self.stream.synchronize().map_err(drv("argmax"))?;
        Ok(v[0].max(0) as u32)
    }

    /// Samples the last run's logits on the device as the CPU's `Sampler::sample` would with
    /// settings `ds` and the uniform draw `uniform` (see [`crate::sampling::DeviceSampling`]);
    /// copies back the token id and whether the draw was used, never the logits. Greedy
    /// settings use the run's device argmax. `Err` names why (a top-k the kernel cannot take,
    /// fewer logits than `ds.n`, a driver error).
    pub fn sample(
        &self,
        ds: &crate::sampling::DeviceSampling,
        uniform: f64,
    ) -> Result<(u32, bool), String> {
        let (src, len) = self.logits_src;
        if ds.n != len {
            return Err(format!(
                "cuda sampler: {} of {len} logits asked for; sample on the host",
                ds.n
            ));
        }
        if ds.greedy {
            return Ok((self.argmax()?, false));
        }
        if ds.top_k == 0 || ds.top_k > SAMPLE_MAX_TOP_K.min(len) {
            return Err(format!(
                "cuda sampler: top-k {} outside 1..={}; sample on the host",
                ds.top_k,
                SAMPLE_MAX_TOP_K.min(len)
            ));
        }
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        launch(
            &self.stream,
            &self.k.sample_top_k,
            (1, 1),
            1024,
            &[
                Arg::U64(src),
                Arg::I32(len as i32),
                Arg::I32(ds.top_k as i32),
                Arg::F32(ds.temperature),
                Arg::I32(i32::from(ds.top_p.is_some())),
                Arg::F32(ds.top_p.unwrap_or(1.0)),
                Arg::I32(i32::from(ds.ln_min_p.is_some())),
                Arg::F32(ds.ln_min_p.unwrap_or(0.0)),
                Arg::F64(uniform),
                Arg::U64(self.sample_out.ptr),
            ],
        )?;
        let mut v = [0i32; 2];
        // SAFETY: sample_out holds 2 i32s; the stream is synchronized before `v` is read.
        unsafe { result::memcpy_dtoh_async(&mut v, self.sample_out.ptr, self.stream.cu_stream()) }
            .map_err(drv("copy sample"))?;
        self.stream.synchronize().map_err(drv("sample"))?;
        Ok((v[0].max(0) as u32, v[1] != 0))
    }

    /// Number of logits of the last run (0 before any run).
    pub fn logits_len(&self) -> usize {
        self.logits_src.1
    }

    /// The last run's logits, copied to the host on the first call after a run.
    pub fn logits(&self) -> Result<&[f32], String> {
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

/// Launches `f` on `stream` with `grid` blocks of `block` threads and the given arguments.
fn launch(
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

/// Puts the weights where the device reads them and returns each weight's device address.
fn place_weights(
    ctx: &Arc<CudaContext>,
    model: &Model,
    path: WeightPath,
    file: Option<&[u8]>,
) -> Result<(WeightsMem, Vec<u64>), String> {
    match path {
        WeightPath::Upload | WeightPath::Managed => {
            let total = device::uploaded_weight_bytes(model) as usize;
            let mem = DeviceAlloc::new(ctx, total, path == WeightPath::Managed)?;
            let mut at: HashMap<usize, u64> = HashMap::new();
            let mut next = 0u64;
            let mut wptr = Vec::with_capacity(model.weights.len());
            for (i, w) in model.weights.iter().enumerate() {
                let off = match at.get(&w.tensor_index) {
                    Some(&o) => o,
                    None => {
                        let bytes = model.weight_bytes(crate::graph::WeightId(i));
                        let o = next;
                        // SAFETY: o + bytes.len() <= total (uploaded_weight_bytes sums the same
                        // tensors with the same alignment); the copy is synchronous.
                        unsafe { result::memcpy_htod_sync(mem.ptr + o, bytes) }
                            .map_err(drv("upload weights"))?;
                        next += (bytes.len() as u64).div_ceil(device::WEIGHT_ALIGN)
                            * device::WEIGHT_ALIGN;
                        at.insert(w.tensor_index, o);
                        o
                    }
                };
                wptr.push(mem.ptr + off);
            }
            // The weights now live in the device (or managed) buffer: the file's pages need not
            // stay resident in this process as well ("never both resident" on unified memory).
            if let Err(e) = model.gguf().release_resident_pages() {
                log::warn!("could not release the file mapping's pages after the upload: {e}");
            }
            Ok((WeightsMem::Device(mem), wptr))
        }
        WeightPath::Register => {
            let file = file.ok_or("register: the weights are not a file mapping")?;
            // Pages of the mapping: the mapping starts on a page and its last page is mapped
            // whole, so rounding the length up to 4 KiB stays inside it.
            let len = file.len().div_ceil(4096) * 4096;
            let host = file.as_ptr() as *mut std::ffi::c_void;
            ctx.bind_to_thread().map_err(drv("bind"))?;
            let flags = sys::CU_MEMHOSTREGISTER_READ_ONLY | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: `host..host+len` is the read-only mapping owned by the model, which lives
            // as long as the executor (the Session holds its Arc); READ_ONLY tells the driver
            // the device never writes it. Unregistered on drop.
            unsafe { sys::cuMemHostRegister_v2(host, len, flags) }
                .result()
                .map_err(drv("register the weights"))?;
            let reg = Registered {
                host,
                ctx: Arc::clone(ctx),
            };
            let mut dptr: sys::CUdeviceptr = 0;
            // SAFETY: `host` was registered with DEVICEMAP just above.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) }
                .result()
                .map_err(drv("device pointer of the weights"))?;
            let base = file.as_ptr() as u64;
            let wptr = (0..model.weights.len())
                .map(|i| {
                    dptr + (model.weight_bytes(crate::graph::WeightId(i)).as_ptr() as u64 - base)
                })
                .collect();
            Ok((WeightsMem::Registered(reg), wptr))
        }
    }
}
