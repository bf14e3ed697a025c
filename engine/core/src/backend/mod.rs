//! What runs a session's planned graphs: the [`Backend`] interface and its two
//! implementations, the CPU executor ([`cpu`]) and the CUDA backend ([`cuda`], behind the
//! `cuda` feature; its sizing arithmetic is compiled in every build).
//!
//! The graph and its arena plan are the same for every backend: a backend gets the planned
//! graph and runs it over its own copies of the arena and the KV cache, allocated once when it
//! opens. Everything a session does with a device goes through this interface, so a session
//! does not know which backend it holds.

pub mod cpu;
pub mod cuda;
mod interface;

use edge_kernels::Kernels;

use crate::device::Device;
use crate::error::Result;
use crate::model::Model;
pub(crate) use interface::allocation_error;
pub use interface::{Allocation, Backend, DecodeBatches, Shape};

/// Whether attention on `device` is always the tiled (online-softmax) kind: the CUDA kernels
/// have no other; the CPU runs llama.cpp's exact order unless asked for tiles.
pub fn tiled_attention_only(device: Device) -> bool {
    device.is_cuda()
}

/// Bytes of scratch `device`'s backend allocates for a session of this shape (besides the
/// arena and the KV cache), or `None` if that overflows.
pub fn scratch_bytes(device: Device, shape: &Shape) -> Option<usize> {
    match device {
        Device::Cpu => cpu::scratch_bytes(shape),
        Device::Cuda(_) => Some(cuda::scratch_bytes(
            shape.ubatch,
            shape.ctx,
            shape.n_head,
            shape.head_dim,
            shape.n_vocab,
        )),
    }
}

/// Opens the backend `alloc.device` names for `model` and allocates what `alloc` says.
/// `kernels`: the CPU kernels (a GPU takes only their activation rounding flavour).
pub fn open(model: &Model, alloc: &Allocation, kernels: Kernels) -> Result<Box<dyn Backend>> {
    Ok(match alloc.device {
        Device::Cpu => Box::new(cpu::CpuBackend::open(model, alloc, kernels)?),
        Device::Cuda(ordinal) => cuda::open(model, alloc, ordinal, kernels)?,
    })
}

/// The device to use when none is asked for: CUDA device 0 if this build has the CUDA backend
/// and a driver with a device is present, else the CPU (with a log line saying why).
pub fn default_device() -> Device {
    if !cuda::COMPILED {
        return Device::Cpu;
    }
    match cuda::device_count() {
        Ok(n) if n > 0 => return Device::Cuda(0),
        Ok(_) => log::info!("no CUDA device found; running on the CPU"),
        // No driver at all is the normal case of a CPU machine; a driver that fails is not.
        Err(e) if e.contains("no CUDA driver library") => {
            log::info!("CUDA unavailable ({e}); running on the CPU")
        }
        Err(e) => log::warn!("CUDA unavailable ({e}); running on the CPU"),
    }
    Device::Cpu
}

/// The device for `model` when none was asked for: [`default_device`], but the CPU (with a log
/// line) if the CUDA backend cannot run this model. A session asked to run on CUDA still
/// reports the reason as an error.
pub fn device_for(model: &Model) -> Device {
    match default_device() {
        Device::Cuda(n) => match cuda::cuda_unsupported(model) {
            Some(reason) => {
                log::warn!("not running on CUDA: {reason}; running on the CPU");
                Device::Cpu
            }
            None => Device::Cuda(n),
        },
        d => d,
    }
}
