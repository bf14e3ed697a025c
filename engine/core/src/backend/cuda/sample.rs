//! Sampling where the logits lie: the run's argmax, the device sampler, and constrained steps
//! whose grammar mask is uploaded ([`CudaExecutor::sample_masked_on_device`]), so that a token
//! costs one id copied back, never the logits.

use cudarc::driver::result;

use super::device::drv;
use super::exec::{launch, Arg, CudaExecutor, PARAM_ARGMAX, SAMPLE_MAX_TOP_K};
use crate::sampling::Sampler;

impl CudaExecutor {
    /// The argmax of the last run's logits (computed on the device; copies one i32).
    pub fn argmax_on_device(&self) -> Result<u32, String> {
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
    pub fn sample_on_device(
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
            return Ok((self.argmax_on_device()?, false));
        }
        if ds.top_k == 0 || ds.top_k > SAMPLE_MAX_TOP_K.min(len) {
            return Err(format!(
                "cuda sampler: top-k {} outside 1..={}; sample on the host",
                ds.top_k,
                SAMPLE_MAX_TOP_K.min(len)
            ));
        }
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        self.sample_top_k_at(src, ds, uniform)
    }

    /// Launches the device sampler on `ds.n` logits at `src` and copies back its result (the
    /// context is bound; `ds.top_k` is within the kernel's limit).
    fn sample_top_k_at(
        &self,
        src: u64,
        ds: &crate::sampling::DeviceSampling,
        uniform: f64,
    ) -> Result<(u32, bool), String> {
        launch(
            &self.stream,
            &self.k.sample_top_k,
            (1, 1),
            1024,
            &sample_top_k_args(src, ds, uniform, self.sample_out.ptr),
        )?;
        let mut v = [0i32; 2];
        // SAFETY: sample_out holds 2 i32s; the stream is synchronized before `v` is read.
        unsafe { result::memcpy_dtoh_async(&mut v, self.sample_out.ptr, self.stream.cu_stream()) }
            .map_err(drv("copy sample"))?;
        self.stream.synchronize().map_err(drv("sample"))?;
        Ok((v[0].max(0) as u32, v[1] != 0))
    }

    /// [`crate::backend::Backend::sample_masked`] on the device: uploads `allowed` (at most the buffer's
    /// words; ids past them are refused), writes the masked logits beside the run's, and takes
    /// their argmax or samples them there. `Ok(None)` where the sampler must see the logits
    /// ([`Sampler::device_sampling`]: a repetition penalty with history, a top-k above
    /// [`SAMPLE_MAX_TOP_K`]) or they are larger than the buffer planned for them.
    pub fn sample_masked_on_device(
        &self,
        allowed: &[u32],
        sampler: &mut Sampler,
    ) -> Result<Option<u32>, String> {
        let (src, len) = self.logits_src;
        let lay = self.constraint_layout;
        if len == 0 || len > lay.n_vocab {
            return Ok(None);
        }
        let Some(ds) = sampler.device_sampling(len, SAMPLE_MAX_TOP_K.min(len)) else {
            return Ok(None);
        };
        if ds.n != len {
            return Ok(None);
        }
        let words = &allowed[..allowed.len().min(lay.mask_words)];
        let base = self.constraint.ptr;
        let masked = base + lay.masked as u64;
        self.ctx.bind_to_thread().map_err(drv("bind"))?;
        if !words.is_empty() {
            // SAFETY: the buffer holds `lay.mask_words` u32s at `lay.mask` and `words` is no
            // longer. `words` is pageable host memory: the driver has staged it when the call
            // returns (CUDA's API sync behaviour for pageable host-to-device copies), so the
            // caller may change it afterwards; the kernels below run after the copy on this
            // stream.
            unsafe {
                result::memcpy_htod_async(base + lay.mask as u64, words, self.stream.cu_stream())
            }
            .map_err(drv("copy mask"))?;
        }
        let grid = len.div_ceil(256) as u32;
        launch(
            &self.stream,
            &self.k.mask_logits,
            (grid, 1),
            256,
            &[
                Arg::U64(src),
                Arg::I32(len as i32),
                Arg::U64(base + lay.mask as u64),
                Arg::I32(words.len() as i32),
                Arg::U64(masked),
            ],
        )?;
        if ds.greedy {
            launch(
                &self.stream,
                &self.k.argmax,
                (1, 1),
                1024,
                &[
                    Arg::U64(masked),
                    Arg::I32(len as i32),
                    Arg::U64(base + lay.params as u64),
                ],
            )?;
            let mut v = [0i32; 1];
            // SAFETY: the constraint buffer's parameter block holds PARAM_TOKENS i32s; the
            // stream is synchronized before `v` is read.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut v,
                    base + (lay.params + PARAM_ARGMAX * 4) as u64,
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("copy argmax"))?;
            self.stream.synchronize().map_err(drv("masked argmax"))?;
            return Ok(Some(v[0].max(0) as u32));
        }
        sampler
            .sample_with_draw(|u| self.sample_top_k_at(masked, &ds, u))
            .map(Some)
    }
}

/// The arguments of `sample_top_k` (kernels.cu): `ds.n` logits at `src` sampled with the
/// settings `ds` and the uniform draw `uniform`; the token id and whether the draw was used go
/// to `out` (2 i32s).
pub(super) fn sample_top_k_args(
    src: u64,
    ds: &crate::sampling::DeviceSampling,
    uniform: f64,
    out: u64,
) -> [Arg; 10] {
    [
        Arg::U64(src),
        Arg::I32(ds.n as i32),
        Arg::I32(ds.top_k as i32),
        Arg::F32(ds.temperature),
        Arg::I32(i32::from(ds.top_p.is_some())),
        Arg::F32(ds.top_p.unwrap_or(1.0)),
        Arg::I32(i32::from(ds.ln_min_p.is_some())),
        Arg::F32(ds.ln_min_p.unwrap_or(0.0)),
        Arg::F64(uniform),
        Arg::U64(out),
    ]
}
