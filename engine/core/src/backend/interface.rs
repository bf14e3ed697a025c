//! The interface every backend implements, and what a backend is given to open: the sizes a
//! session's plan resolved.

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::kv::KvType;
use crate::model::Model;
use crate::plan::PlannedGraph;
use crate::sampling::Sampler;

/// Runs planned graphs on one device, over the arena and KV cache it allocated when it opened.
pub trait Backend: Send {
    /// Where it runs.
    fn device(&self) -> Device;

    /// What computes: the CPU kernel set (`scalar`, `avx2`, `avx512`, `neon`, `neon+dotprod`)
    /// or `cuda`.
    fn name(&self) -> &'static str;

    /// Threads that run (CPU) or feed (GPU) it.
    fn n_threads(&self) -> usize;

    /// One line for logs: the threads and kernels, or the GPU, its kernel image and weight path.
    fn description(&self) -> String;

    /// Bytes of the KV cache it allocated.
    fn kv_bytes(&self) -> u64;

    /// Runs `graph` for `tokens` at positions `pos0..` and waits for it. The caller has checked
    /// that the tokens fit the graph's ubatch and the cache and are in the vocabulary.
    /// `decode`: this is the session's one-token graph, the same at every step (a GPU captures
    /// it once and replays it).
    fn run(
        &mut self,
        model: &Model,
        graph: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
        decode: bool,
    ) -> Result<()>;

    /// The output value of the last run of `graph` (a decoder's logits, an encoder's pooled
    /// vector): one row. A GPU copies it to the host on the first call after a run.
    fn output(&self, graph: &PlannedGraph) -> Result<&[f32]>;

    /// The index of the largest output value of the last run (the first on ties, as
    /// [`crate::sampling::argmax`]); a GPU computes it there and copies one id.
    fn argmax(&self, graph: &PlannedGraph) -> Result<u32> {
        Ok(crate::sampling::argmax(self.output(graph)?))
    }

    /// The next token from the last run's logits with `sampler`: the token
    /// `sampler.sample(logits)` gives, the sampler's generator advanced the same way. A GPU
    /// samples there when the settings allow and copies back one id.
    fn sample(&self, graph: &PlannedGraph, sampler: &mut Sampler) -> Result<u32> {
        Ok(sampler.sample(self.output(graph)?))
    }

    /// [`Backend::sample`] of the last run's output with every value whose bit in `allowed` is
    /// clear at -inf (bit `i % 32` of word `i / 32`, the layout of llguidance's masks; ids past
    /// the words are refused): a constrained step. `Ok(None)`: this backend leaves that to the
    /// caller, which masks a host copy of [`Backend::output`] (the CPU, whose output is already
    /// on the host). A GPU uploads the mask, masks and samples there, and copies back one
    /// token id instead of the logits.
    fn sample_masked(
        &self,
        graph: &PlannedGraph,
        allowed: &[u32],
        sampler: &mut Sampler,
    ) -> Result<Option<u32>> {
        let _ = (graph, allowed, sampler);
        Ok(None)
    }

    /// Whether the last run's output is finite where it matters: `chosen` is the index a
    /// sampler picked from it. The default checks every value (on the host that is a pass
    /// over one row, far below a run's cost); a GPU checks the chosen value, one copy of 4 bytes,
    /// which catches the usual failure (a NaN that spread to every logit).
    fn output_finite(&self, graph: &PlannedGraph, chosen: u32) -> Result<bool> {
        let _ = chosen;
        Ok(self.output(graph)?.iter().all(|v| v.is_finite()))
    }

    /// Copies `out.len()` bytes of the KV cache, from byte `offset`, to `out`. The cache is laid
    /// out as [`crate::kv::KvCache`]'s: per layer its key rows, then its value rows. For saved
    /// session state; the default refuses.
    fn read_kv(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        let _ = (offset, out);
        Err(kv_copy_unsupported(self.name()))
    }

    /// Copies `data` into the KV cache at byte `offset` (the layout of [`Backend::read_kv`]).
    fn write_kv(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let _ = (offset, data);
        Err(kv_copy_unsupported(self.name()))
    }

    /// The caller has stopped decoding step by step (a generation ended): a backend that
    /// decodes several sessions together stops waiting for this one's next step.
    fn end_steps(&mut self) {}

    /// How decode steps were batched, for a backend that decodes sessions together.
    fn decode_batches(&self) -> Option<DecodeBatches> {
        None
    }

    /// Drops the KV cache positions `keep..keep + n_discard` of the `n_past` held: the later
    /// ones move down and their keys are rotated back by `n_discard` positions.
    fn shift_context(
        &mut self,
        model: &Model,
        n_past: usize,
        keep: usize,
        n_discard: usize,
    ) -> Result<()>;
}

/// How a group's decode steps were run: passes, and the steps they held (steps / passes is
/// the mean batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeBatches {
    /// Forward passes that ran decode steps.
    pub passes: u64,
    /// Decode steps they ran.
    pub steps: u64,
    /// Passes that ran two steps or more.
    pub shared_passes: u64,
}

/// The sizes a backend's scratch depends on.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Context (KV positions).
    pub ctx: usize,
    /// Tokens per prefill run.
    pub ubatch: usize,
    /// Threads.
    pub threads: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tiled attention.
    pub flash_attn: bool,
    /// Values of the output row (a decoder's logits).
    pub n_vocab: usize,
}

/// What a backend allocates for one session: the sizes its plan resolved (a backend sees
/// these, never the session).
#[derive(Debug, Clone, Copy)]
pub struct Allocation {
    /// Where it runs.
    pub device: Device,
    /// Context (KV positions).
    pub ctx: usize,
    /// Tokens per prefill run.
    pub ubatch: usize,
    /// Threads.
    pub threads: usize,
    /// The KV cache's element type.
    pub kv_type: KvType,
    /// Tiled attention.
    pub flash_attn: bool,
    /// Bytes of the arena (the largest of the session's graphs' plans).
    pub arena_bytes: usize,
    /// Bytes of the KV cache.
    pub kv_bytes: usize,
    /// Bytes of scratch ([`crate::backend::scratch_bytes`]).
    pub scratch_bytes: usize,
    /// CUDA: how the weights reach the device (`None`: the backend chooses).
    pub cuda_weights: Option<super::cuda::host::WeightPath>,
}

/// The error of a backend that failed to allocate: what, and the fix.
pub(crate) fn allocation_error(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::OutOfMemory(format!("cannot allocate the {what}: {e}").into())
}

/// The error of a backend that cannot copy its KV cache to or from the host.
fn kv_copy_unsupported(backend: &str) -> EngineError {
    EngineError::Unsupported(
        format!("saving and loading session state is not implemented on the {backend} backend")
            .into(),
    )
}

/// Checks that `len` bytes from `offset` lie inside a KV cache of `kv_bytes` bytes.
pub(crate) fn check_kv_range(offset: usize, len: usize, kv_bytes: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > kv_bytes) {
        return Err(EngineError::InvalidArgument(format!(
            "KV cache bytes {offset}..+{len} are outside the cache of {kv_bytes} bytes"
        )));
    }
    Ok(())
}
