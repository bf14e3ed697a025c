//! Compiles the CUDA kernels (engine/cuda/*.cu) ahead of time when the `cuda` feature is on:
//! one cubin per supported architecture plus PTX for the rest, written to OUT_DIR and embedded
//! in the binary by `src/cuda/module.rs`. Without the feature this does nothing, so a CPU build
//! needs no CUDA toolkit.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Cubin architectures: Jetson Orin (sm_87), desktop Ampere (sm_86), Ada (sm_89), Hopper (sm_90).
/// Keep in sync with `CUBIN_ARCHS` in src/cuda/module.rs.
const CUBIN_ARCHS: &[u32] = &[86, 87, 89, 90];
/// PTX target: the oldest architecture the kernels support (dp4a, f16 conversions); the driver
/// JIT-compiles it for any newer GPU without a matching cubin.
const PTX_ARCH: u32 = 80;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=EDGE_RUN_CUDA_PREFIX");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = Path::new("cuda/kernels.cu");
    println!("cargo:rerun-if-changed=cuda/kernels.cu");
    let nvcc = find_nvcc().unwrap_or_else(|| {
        panic!(
            "\n\nthe `cuda` feature needs nvcc (CUDA 13.0) and none was found (looked at $NVCC, PATH, \
             $EDGE_RUN_CUDA_PREFIX or ~/.cache/edge-run/cuda-13.0, pip's site-packages, /usr/local/cuda).\n\
             Install it with `./scripts/install-nvcc.sh` (from PyPI, no root needed), or set NVCC=/path/to/nvcc.\n\n"
        )
    });
    // nvcc runs are independent: run them side by side.
    let mut jobs = Vec::new();
    for &arch in CUBIN_ARCHS {
        let dst = out.join(format!("kernels.sm_{arch}.cubin"));
        let args = vec![
            "-cubin".to_string(),
            format!("-arch=sm_{arch}"),
            "-O3".into(),
            "-o".into(),
            dst.display().to_string(),
            src.display().to_string(),
        ];
        jobs.push((nvcc.clone(), args));
    }
    let ptx = out.join("kernels.ptx");
    jobs.push((
        nvcc.clone(),
        vec![
            "-ptx".into(),
            format!("-arch=compute_{PTX_ARCH}"),
            "-O3".into(),
            "-o".into(),
            ptx.display().to_string(),
            src.display().to_string(),
        ],
    ));
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|(nvcc, args)| {
            std::thread::spawn(move || {
                let res = Command::new(&nvcc).args(&args).output();
                (args, res)
            })
        })
        .collect();
    for h in handles {
        let (args, res) = h.join().expect("nvcc thread");
        match res {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "nvcc {} failed:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("cannot run {}: {e}", nvcc.display()),
        }
    }
    build_host_check(&nvcc, &out);
}

/// Builds cuda/host_check.cu (kernels.cu's block decoders compiled for the host, see there) into
/// OUT_DIR and passes its path to the crate as `EDGE_RUN_CUDA_HOST_CHECK` (empty when it could not
/// be built: it needs a host compiler and CUDA's static runtime, and is only a test aid, so a
/// failure is a warning, never a build error).
fn build_host_check(nvcc: &Path, out: &Path) {
    println!("cargo:rerun-if-changed=cuda/host_check.cu");
    let exe = out.join("host_check");
    let mut cmd = Command::new(nvcc);
    cmd.args([
        "-arch=sm_90",
        "-O2",
        "-cudart",
        "static",
        "-Xcompiler",
        "-ffp-contract=off",
    ]);
    // The pip wheels keep the static runtime beside bin/ (nvidia/cu13/lib), not where nvcc looks.
    if let Some(lib) = nvcc.parent().and_then(Path::parent).map(|p| p.join("lib")) {
        if lib.is_dir() {
            cmd.arg(format!("-L{}", lib.display()));
        }
    }
    cmd.arg("-o").arg(&exe).arg("cuda/host_check.cu");
    let built = match cmd.output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            println!("cargo:warning=cuda/host_check.cu not built (its test will skip): {first}");
            false
        }
        Err(e) => {
            println!("cargo:warning=cuda/host_check.cu not built (its test will skip): {e}");
            false
        }
    };
    let path = if built {
        exe.display().to_string()
    } else {
        String::new()
    };
    println!("cargo:rustc-env=EDGE_RUN_CUDA_HOST_CHECK={path}");
}

fn works(nvcc: &Path) -> bool {
    Command::new(nvcc)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// NVCC, then PATH, then the prefix of scripts/install-nvcc.sh, then pip's site-packages
/// (`nvidia/cu13/bin/nvcc` of the nvidia-cuda-nvcc wheel), then /usr/local/cuda.
fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        let p = PathBuf::from(p);
        return works(&p).then_some(p);
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    let prefix = std::env::var_os("EDGE_RUN_CUDA_PREFIX")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/edge-run/cuda-13.0"))
        });
    if let Some(p) = prefix {
        candidates.push(p.join("nvidia/cu13/bin/nvcc"));
    }
    if let Ok(o) = Command::new("python3")
        .args([
            "-c",
            "import site,sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .output()
    {
        for dir in String::from_utf8_lossy(&o.stdout).lines() {
            candidates.push(Path::new(dir).join("nvidia/cu13/bin/nvcc"));
        }
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    candidates.into_iter().find(|c| c.is_file() && works(c))
}
