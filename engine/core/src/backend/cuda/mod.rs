//! The CUDA backend: runs the same planned graphs as the CPU on an NVIDIA GPU (the executor,
//! `exec.rs`, its sampling, `sample.rs`, and its kernel images, `module.rs`, are built with the `cuda` feature), and the
//! decisions it makes on the host, which need no GPU and are compiled and tested in every
//! build: whether a model can run on CUDA, how the weights reach the device, and what a CUDA
//! session allocates.

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod encode;
#[cfg(feature = "cuda")]
mod exec;
pub mod host;
#[cfg(feature = "cuda")]
pub mod module;
#[cfg(feature = "cuda")]
mod sample;

#[cfg(feature = "cuda")]
pub use exec::{CudaExecutor, SAMPLE_MAX_TOP_K};
pub use host::{
    attn_partial_bytes, choose_weight_path, cuda_unsupported, decode_attn_splits, device_memory,
    params_bytes, scratch_bytes, uploaded_weight_bytes, weight_path_from_env, CudaMemory,
    DeviceAttrs, WeightPath, MAX_ATTN_SPLITS, QUANT_MATMUL, WEIGHTS_ENV, WEIGHT_ALIGN,
};

use edge_kernels::Kernels;

use super::interface::{Allocation, Backend};
use crate::error::Result;
use crate::model::Model;

/// Whether this build has the CUDA backend (the `cuda` feature).
pub const COMPILED: bool = cfg!(feature = "cuda");

/// Why a CUDA device cannot be used by a build without the `cuda` feature, and the fix.
pub const NO_CUDA_SUPPORT: &str =
    "built without CUDA support; rebuild with `cargo build --release --features cuda`";

/// Number of CUDA devices, or why there are none (no driver library, a driver error, or a
/// build without the backend). Never panics, even when the driver library is missing (the
/// binary loads it at run time).
pub fn device_count() -> std::result::Result<usize, String> {
    #[cfg(feature = "cuda")]
    return device::device_count();
    #[cfg(not(feature = "cuda"))]
    Err(NO_CUDA_SUPPORT.into())
}

/// Opens CUDA device `ordinal` and allocates what `alloc` says.
pub fn open(
    model: &Model,
    alloc: &Allocation,
    ordinal: usize,
    kernels: Kernels,
) -> Result<Box<dyn Backend>> {
    #[cfg(feature = "cuda")]
    {
        let exec = CudaExecutor::new(model, alloc, ordinal, kernels)?;
        debug_assert_eq!(exec.kv_alloc_bytes(), alloc.kv_bytes);
        Ok(Box::new(exec))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (model, alloc, ordinal, kernels);
        Err(crate::error::EngineError::Device(NO_CUDA_SUPPORT.into()))
    }
}
