//! The compiled kernels embedded in the binary (cubins per architecture and PTX, built by
//! build.rs with nvcc) and the choice of which to load on a device.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;

/// Cubins by compute capability (major * 10 + minor). Keep in sync with build.rs.
const CUBINS: &[(u32, &[u8])] = &[
    (
        86,
        include_bytes!(concat!(env!("OUT_DIR"), "/kernels.sm_86.cubin")),
    ),
    (
        87,
        include_bytes!(concat!(env!("OUT_DIR"), "/kernels.sm_87.cubin")),
    ),
    (
        89,
        include_bytes!(concat!(env!("OUT_DIR"), "/kernels.sm_89.cubin")),
    ),
    (
        90,
        include_bytes!(concat!(env!("OUT_DIR"), "/kernels.sm_90.cubin")),
    ),
];

/// PTX for compute_80: the driver JIT-compiles it for GPUs without a matching cubin.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));
/// Compute capability the PTX targets (its minimum).
const PTX_CC: u32 = 80;

/// The kernel source, for the NVRTC fallback.
pub const SOURCE: &str = include_str!("../../../cuda/kernels.cu");

/// Which embedded image to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// The cubin built for this compute capability (major * 10 + minor).
    Cubin(u32),
    /// The PTX, JIT-compiled by the driver.
    Ptx,
    /// The source, compiled at run time by NVRTC.
    Nvrtc,
}

/// The images to try, best first, for a device of compute capability `cc` (major * 10 + minor)
/// given the cubins `available`: the exact cubin, else the newest cubin of the same major version
/// and a lower minor (binary compatible), then the PTX if the device is at least compute_80, then
/// NVRTC. `forced` (from `EDGE_RUN_CUDA_MODULE=cubin|ptx|nvrtc`) drops the ones before it.
pub fn candidates(cc: u32, available: &[u32], forced: Option<&str>) -> Vec<Image> {
    let mut out = Vec::new();
    if available.contains(&cc) {
        out.push(Image::Cubin(cc));
    } else if let Some(&c) = available
        .iter()
        .filter(|&&c| c / 10 == cc / 10 && c < cc)
        .max()
    {
        out.push(Image::Cubin(c));
    }
    if cc >= PTX_CC {
        out.push(Image::Ptx);
    }
    out.push(Image::Nvrtc);
    match forced {
        Some("ptx") => out.retain(|i| !matches!(i, Image::Cubin(_))),
        Some("nvrtc") => out.retain(|i| *i == Image::Nvrtc),
        _ => {}
    }
    out
}

/// Loads the best image for the context's device; returns the module and a description of
/// what was loaded (logged by the caller). Each failed candidate is logged and the next tried.
pub fn load(ctx: &Arc<CudaContext>) -> Result<(Arc<CudaModule>, String), String> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("compute capability: {e}"))?;
    let cc = (major * 10 + minor) as u32;
    let available: Vec<u32> = CUBINS.iter().map(|c| c.0).collect();
    let forced = std::env::var("EDGE_RUN_CUDA_MODULE").ok();
    let mut errors = Vec::new();
    for image in candidates(cc, &available, forced.as_deref()) {
        let (what, res) = match image {
            Image::Cubin(c) => {
                let bytes = CUBINS.iter().find(|x| x.0 == c).map(|x| x.1).unwrap_or(&[]);
                (
                    format!("cubin sm_{c} for a compute {major}.{minor} device"),
                    ctx.load_module(Ptx::from_binary(bytes.to_vec()))
                        .map_err(|e| e.to_string()),
                )
            }
            Image::Ptx => (
                format!("PTX compute_{PTX_CC} (JIT) for a compute {major}.{minor} device"),
                ctx.load_module(Ptx::from_src(PTX))
                    .map_err(|e| e.to_string()),
            ),
            Image::Nvrtc => (
                format!("NVRTC-compiled source for a compute {major}.{minor} device"),
                nvrtc(ctx),
            ),
        };
        match res {
            Ok(m) => {
                if !matches!(image, Image::Cubin(_)) {
                    log::warn!("cuda: no cubin loaded for this device; using {what}");
                }
                return Ok((m, what));
            }
            Err(e) => {
                log::warn!("cuda: loading {what} failed: {e}");
                errors.push(format!("{what}: {e}"));
            }
        }
    }
    Err(format!(
        "no kernel image loads on this device: {}",
        errors.join("; ")
    ))
}

/// Last resort: compiles the embedded source with NVRTC (loaded dynamically; absent on many
/// machines, so every failure is an error message, never a panic).
fn nvrtc(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>, String> {
    let ptx = nvrtc_ptx()?;
    ctx.load_module(ptx).map_err(|e| e.to_string())
}

/// Directories that hold CUDA's `cuda_fp16.h` (NVRTC does not ship it): `$CUDA_HOME/include`,
/// `$CUDA_PATH/include`, /usr/local/cuda/include, and scripts/install-nvcc.sh's prefix.
fn cuda_include_dirs() -> Vec<String> {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(std::path::PathBuf::from(d).join("include"));
        }
    }
    dirs.push("/usr/local/cuda/include".into());
    let prefix = std::env::var_os("EDGE_RUN_CUDA_PREFIX")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::Path::new(&h).join(".cache/edge-run/cuda-13.0"))
        });
    if let Some(p) = prefix {
        dirs.push(p.join("nvidia/cu13/include"));
    }
    dirs.into_iter()
        .filter(|d| d.join("cuda_fp16.h").is_file())
        .map(|d| d.display().to_string())
        .collect()
}

/// The embedded source compiled to compute_80 PTX by NVRTC (needs libnvrtc, no GPU).
fn nvrtc_ptx() -> Result<Ptx, String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("libnvrtc not found".into());
    }
    // NVRTC has no <stdint.h>; the kernels need only these (<string.h> is skipped under
    // __CUDACC_RTC__ in the source).
    let src = SOURCE.replace(
        "#include <stdint.h>",
        "typedef unsigned char uint8_t; typedef signed char int8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;",
    );
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_80"),
        include_paths: cuda_include_dirs(),
        ..Default::default()
    };
    std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(|_| "NVRTC panicked".to_string())?
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last-resort image: NVRTC compiles the embedded source (no GPU needed; skips
    /// without libnvrtc, e.g. pip's nvidia-cuda-nvrtc on LD_LIBRARY_PATH provides it, or
    /// without CUDA headers).
    #[test]
    fn nvrtc_compiles_the_embedded_source() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("nvrtc: skipped: libnvrtc not found");
            return;
        }
        if cuda_include_dirs().is_empty() {
            eprintln!("nvrtc: skipped: no CUDA headers (cuda_fp16.h) found");
            return;
        }
        let ptx = nvrtc_ptx().expect("NVRTC compiles kernels.cu");
        let text = ptx.to_src();
        for kernel in [
            "mmv_q4_k",
            "mmm_iq4_xs",
            "quantize_q8_k",
            "attn_partial_q8",
            "sample_top_k",
        ] {
            assert!(text.contains(kernel), "{kernel} missing from the NVRTC PTX");
        }
    }

    #[test]
    fn image_choice() {
        let avail = [86, 87, 89, 90];
        assert_eq!(
            candidates(90, &avail, None),
            vec![Image::Cubin(90), Image::Ptx, Image::Nvrtc]
        );
        assert_eq!(candidates(87, &avail, None)[0], Image::Cubin(87));
        // sm_88 (hypothetical) runs the sm_87 cubin; sm_80 has none of its major below it.
        assert_eq!(candidates(88, &avail, None)[0], Image::Cubin(87));
        assert_eq!(candidates(80, &avail, None), vec![Image::Ptx, Image::Nvrtc]);
        // Blackwell: no cubin of its major, PTX.
        assert_eq!(candidates(100, &avail, None)[0], Image::Ptx);
        // Turing: below the PTX target: NVRTC only.
        assert_eq!(candidates(75, &avail, None), vec![Image::Nvrtc]);
        assert_eq!(
            candidates(90, &avail, Some("ptx")),
            vec![Image::Ptx, Image::Nvrtc]
        );
        assert_eq!(candidates(90, &avail, Some("nvrtc")), vec![Image::Nvrtc]);
    }

    #[test]
    fn every_cubin_is_embedded() {
        for (cc, bytes) in CUBINS {
            assert!(bytes.len() > 1000, "cubin sm_{cc} is empty");
        }
        assert!(PTX.contains(".entry"), "PTX has no kernels");
    }
}
