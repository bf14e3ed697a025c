//! The CUDA driver side of the backend: devices and contexts, device (and managed)
//! allocations, the file mapping registered for the GPU, and placing the weights. Unsafe code
//! here is the driver's FFI; each block states its invariant.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::host::{self, DeviceAttrs, WeightPath};
use crate::graph::WeightId;
use crate::model::Model;

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

pub(super) fn drv(what: &str) -> impl Fn(result::DriverError) -> String + '_ {
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
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) ctx: Arc<CudaContext>,
}

impl DeviceAlloc {
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        managed: bool,
    ) -> Result<DeviceAlloc, String> {
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
pub(super) struct Registered {
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
pub(super) enum WeightsMem {
    Device(#[allow(dead_code)] DeviceAlloc),
    Registered(#[allow(dead_code)] Registered),
}

/// Puts the weights where the device reads them and returns each weight's device address.
pub(super) fn place_weights(
    ctx: &Arc<CudaContext>,
    model: &Model,
    path: WeightPath,
    file: Option<&[u8]>,
) -> Result<(WeightsMem, Vec<u64>), String> {
    match path {
        WeightPath::Upload | WeightPath::Managed => {
            let total = host::uploaded_weight_bytes(model) as usize;
            let mem = DeviceAlloc::new(ctx, total, path == WeightPath::Managed)?;
            let mut at: HashMap<usize, u64> = HashMap::new();
            let mut next = 0u64;
            let mut wptr = Vec::with_capacity(model.weights.len());
            for (i, w) in model.weights.iter().enumerate() {
                let off = match at.get(&w.tensor_index) {
                    Some(&o) => o,
                    None => {
                        let bytes = model.weight_bytes(WeightId(i));
                        let o = next;
                        // SAFETY: o + bytes.len() <= total (uploaded_weight_bytes sums the same
                        // tensors with the same alignment); the copy is synchronous.
                        unsafe { result::memcpy_htod_sync(mem.ptr + o, bytes) }
                            .map_err(drv("upload weights"))?;
                        next +=
                            (bytes.len() as u64).div_ceil(host::WEIGHT_ALIGN) * host::WEIGHT_ALIGN;
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
                .map(|i| dptr + (model.weight_bytes(WeightId(i)).as_ptr() as u64 - base))
                .collect();
            Ok((WeightsMem::Registered(reg), wptr))
        }
    }
}
