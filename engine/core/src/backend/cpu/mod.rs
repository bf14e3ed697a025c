//! The CPU backend: the executor ([`exec`]) over one arena and the KV cache, on a persistent
//! thread pool, with the kernels chosen once for this CPU. Bit-exact with llama.cpp's CPU
//! build.

mod attention;
pub mod exec;
pub mod group;
mod matmul;
mod ops;
mod profile;
mod shares;
pub mod tune;

use edge_gguf::HugePages;
use edge_kernels::Kernels;

use super::interface::{allocation_error, check_kv_range, Allocation, Backend, Shape};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::hint;
use crate::kv::KvCache;
use crate::memory::ALIGN;
use crate::model::Model;
use crate::plan::PlannedGraph;
pub use exec::{
    heads_together, online_scratch_bytes_per_thread, scratch_bytes_per_thread, Executor, RunArgs,
    SeqRow, MAX_HEADS_TOGETHER,
};

/// Bytes of scratch of all threads of a session of this shape (`None` on overflow).
pub fn scratch_bytes(shape: &Shape) -> Option<usize> {
    exec::with_panels(if shape.flash_attn {
        online_scratch_bytes_per_thread(shape.head_dim)
    } else {
        scratch_bytes_per_thread(
            shape.ctx,
            shape.head_dim,
            heads_together(shape.n_head / shape.n_head_kv.max(1)),
        )
    })
    .checked_next_multiple_of(ALIGN)?
    .checked_mul(shape.threads)
}

/// The CPU backend of one session: its executor (threads, arena, scratch) and its KV cache.
pub struct CpuBackend {
    exec: Executor,
    kv: KvCache,
    /// Two KV rows of f32, for re-rotating keys during a context shift (allocated here, so that
    /// a shift allocates nothing).
    shift_rows: Vec<f32>,
}

impl CpuBackend {
    /// Allocates what `alloc` says: the KV cache, the arena, the threads and their scratch.
    pub fn open(model: &Model, alloc: &Allocation, kernels: Kernels) -> Result<CpuBackend> {
        let p = &model.params;
        // Decoding streams the mapped weights: huge pages read faster.
        match model.gguf().settle_huge_pages() {
            HugePages::Relaid { huge_mib, seconds } => log::info!(
                "weights re-read into huge pages ({huge_mib} MiB in 2 MiB pages) in {seconds:.2} s"
            ),
            HugePages::Unsupported => {
                log::debug!(
                    "weights stay in small pages: the kernel gave the re-read no huge pages"
                )
            }
            HugePages::AlreadyHuge | HugePages::NotAttempted => {}
        }
        let kv = open_kv(model, alloc)?;
        let exec = Executor::new(
            alloc.arena_bytes,
            alloc.threads,
            alloc.ctx,
            p.head_dim,
            heads_together(p.n_head / p.n_head_kv.max(1)),
            alloc.flash_attn,
            kernels,
        )
        .map_err(|e| allocation_error("session", e))?;
        debug_assert_eq!(exec.scratch_bytes(), alloc.scratch_bytes);
        debug_assert_eq!(kv.bytes(), alloc.kv_bytes);
        Ok(CpuBackend {
            exec,
            kv,
            shift_rows: vec![0.0; 2 * p.kv_dim()],
        })
    }

    /// The executor (its kernels, threads and arena).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn name(&self) -> &'static str {
        self.exec.kernels().isa_name()
    }

    fn n_threads(&self) -> usize {
        self.exec.n_threads()
    }

    fn description(&self) -> String {
        format!(
            "{} threads, kernels {}",
            self.exec.n_threads(),
            self.exec.kernels().isa_name()
        )
    }

    fn kv_bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }

    fn run(
        &mut self,
        model: &Model,
        graph: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
        _decode: bool,
    ) -> Result<()> {
        if self
            .exec
            .run(model, &self.kv, graph, RunArgs::one_sequence(tokens, pos0))
        {
            Ok(())
        } else {
            Err(EngineError::Kernel(
                "a worker thread panicked; this is a bug".into(),
            ))
        }
    }

    fn output(&self, graph: &PlannedGraph) -> Result<&[f32]> {
        Ok(self.exec.read_f32(graph, graph.graph.output, 1))
    }

    fn read_kv(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        read_kv_bytes(&mut self.kv, offset, out)
    }

    fn write_kv(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        write_kv_bytes(&mut self.kv, offset, data)
    }

    fn shift_context(
        &mut self,
        model: &Model,
        n_past: usize,
        keep: usize,
        n_discard: usize,
    ) -> Result<()> {
        let shift = KvShift {
            n_past,
            keep,
            n_discard,
        };
        shift_kv(
            &mut self.kv,
            model,
            shift,
            self.exec.kernels(),
            &mut self.shift_rows,
        )
    }
}

/// A KV cache of `alloc`'s shape for `model` (the error names the context that does not fit).
fn open_kv(model: &Model, alloc: &Allocation) -> Result<KvCache> {
    let p = &model.params;
    let kv_rows = p.kv_layer_rows(alloc.ctx, alloc.ubatch);
    KvCache::with_layer_rows(&kv_rows, alloc.ctx, p.kv_dim(), alloc.kv_type).map_err(|e| {
        use crate::error::Setting::Ctx;
        EngineError::invalid_setting(
            Ctx,
            alloc.ctx,
            hint![
                Ctx,
                format!(
                    " {}: {e}; use a smaller context (the model was trained for {})",
                    alloc.ctx, p.n_ctx_train
                )
            ],
        )
    })
}

/// [`Backend::read_kv`] of one cache.
fn read_kv_bytes(kv: &mut KvCache, offset: usize, out: &mut [u8]) -> Result<()> {
    check_kv_range(offset, out.len(), kv.bytes())?;
    out.copy_from_slice(&kv.mem.bytes_mut()[offset..offset + out.len()]);
    Ok(())
}

/// [`Backend::write_kv`] of one cache.
fn write_kv_bytes(kv: &mut KvCache, offset: usize, data: &[u8]) -> Result<()> {
    check_kv_range(offset, data.len(), kv.bytes())?;
    kv.mem.bytes_mut()[offset..offset + data.len()].copy_from_slice(data);
    Ok(())
}

/// The positions a context shift drops ([`Backend::shift_context`]).
#[derive(Clone, Copy)]
struct KvShift {
    n_past: usize,
    keep: usize,
    n_discard: usize,
}

/// [`Backend::shift_context`] of one cache, with two f32 KV rows of scratch.
fn shift_kv(
    kv: &mut KvCache,
    model: &Model,
    s: KvShift,
    kernels: &Kernels,
    rows: &mut [f32],
) -> Result<()> {
    let p = &model.params;
    kv.shift(
        s.n_past,
        s.keep,
        s.n_discard,
        p.head_dim,
        p.rope,
        kernels,
        rows,
    )
    .map_err(EngineError::Kernel)
}
