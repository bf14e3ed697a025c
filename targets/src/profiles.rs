//! Device profiles: how much memory a target has and how much of it the engine may use.

use std::fmt;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A device the engine can run on, with the memory it offers.
///
/// `total_bytes - reserve_bytes` ([`Target::usable_bytes`]) is what the engine may own
/// by default; `--mem-budget` can only lower that further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Short name used on the command line (`--target orin-nano-8`).
    pub name: &'static str,
    /// Human-readable description of the device.
    pub description: &'static str,
    /// Physical memory the engine's data lives in: shared LPDDR5 on Jetson, VRAM on a
    /// discrete card, RAM (`MemTotal`) on the host.
    pub total_bytes: u64,
    /// Memory that is not the engine's to take: firmware carve-outs, the OS and desktop
    /// on unified-memory boards, the CUDA context and display on discrete cards.
    pub reserve_bytes: u64,
    /// Weights compete with activations for the same RAM (Jetson, CPU host): a
    /// `--mem-budget` then counts the mapped weights too, as if `--count-weights` was given.
    pub unified_memory: bool,
    /// Citation: where `total_bytes` (vendor datasheet / product page) and
    /// `reserve_bytes` come from.
    pub source: &'static str,
}

impl Target {
    /// Bytes the engine may own on this target: `total_bytes - reserve_bytes` (never below 0).
    pub fn usable_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.reserve_bytes)
    }
}

/// A target could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// No profile has this name; `valid` lists the names that exist.
    UnknownName {
        /// The name asked for.
        name: String,
        /// All accepted names, including `host`.
        valid: Vec<&'static str>,
    },
    /// `/proc/meminfo` could not be read or parsed.
    Meminfo(String),
    /// The `host` target needs `/proc/meminfo`, which this OS does not have.
    Unsupported(&'static str),
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::UnknownName { name, valid } => write!(
                f,
                "unknown target `{name}`; valid targets: {}",
                valid.join(", ")
            ),
            TargetError::Meminfo(msg) => write!(f, "cannot determine host memory: {msg}"),
            TargetError::Unsupported(msg) => write!(f, "target `host` is not supported: {msg}"),
        }
    }
}

impl std::error::Error for TargetError {}

/// Source shared by the Jetson reserves (see the crate docs, "How the reserve was chosen").
macro_rules! jetson_reserve_note {
    () => {
        " Reserve: measured on an 8 GB Orin running the stock JetPack desktop, tegrastats \
         at idle reads 'RAM 2847/7772MB' (proventusnova.com/blog/jetson-orin-high-ram-usage-idle): \
         8192 MiB - (7772 - 2847) MiB = 3267 MiB are firmware/GPU carve-outs, the default \
         512 MiB CMA pool and the idle OS + desktop, rounded up to 3.25 GiB. Other sizes are \
         extrapolated from that one measurement (desktop use is roughly constant, carve-outs \
         and page tables grow a little with DRAM); headless images can pass --mem-budget."
    };
}

/// Source shared by the discrete-GPU reserves (see the crate docs).
macro_rules! cuda_reserve_note {
    () => {
        " Reserve 1 GiB: the CUDA context (driver state, module images, per-SM local memory; \
         typically 300-500 MiB as reported by nvidia-smi for an otherwise idle process, less \
         with CUDA_MODULE_LOADING=LAZY, CUDA C++ Programming Guide 'Lazy Loading') plus a \
         display server/compositor on a desktop card. Engineering estimate, not a vendor figure; \
         weights live in VRAM, separate from host RAM, so they are not unified."
    };
}

static PROFILES: [Target; 10] = [
    Target {
        name: "orin-agx-64",
        description: "NVIDIA Jetson AGX Orin 64GB (unified LPDDR5)",
        total_bytes: 64 * GIB,
        reserve_bytes: 4608 * MIB,
        unified_memory: true,
        source: concat!(
            "Memory: 64GB 256-bit LPDDR5, NVIDIA Jetson AGX Orin Series Data Sheet \
             and developer.nvidia.com/embedded/jetson-modules.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "orin-agx-32",
        description: "NVIDIA Jetson AGX Orin 32GB (unified LPDDR5)",
        total_bytes: 32 * GIB,
        reserve_bytes: 4 * GIB,
        unified_memory: true,
        source: concat!(
            "Memory: 32GB 256-bit LPDDR5, NVIDIA Jetson AGX Orin Series Data Sheet \
             and developer.nvidia.com/embedded/jetson-modules.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "orin-nx-16",
        description: "NVIDIA Jetson Orin NX 16GB (unified LPDDR5)",
        total_bytes: 16 * GIB,
        reserve_bytes: 3584 * MIB,
        unified_memory: true,
        source: concat!(
            "Memory: 16GB 128-bit LPDDR5, NVIDIA Jetson Orin NX Series Modules Data Sheet \
             (DS-10712-001) and developer.nvidia.com/embedded/jetson-modules.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "orin-nx-8",
        description: "NVIDIA Jetson Orin NX 8GB (unified LPDDR5)",
        total_bytes: 8 * GIB,
        reserve_bytes: 3328 * MIB,
        unified_memory: true,
        source: concat!(
            "Memory: 8GB 128-bit LPDDR5, NVIDIA Jetson Orin NX Series Modules Data Sheet \
             (DS-10712-001) and developer.nvidia.com/embedded/jetson-modules.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "orin-nano-8",
        description:
            "NVIDIA Jetson Orin Nano 8GB (unified LPDDR5; also the Orin Nano Super dev kit)",
        total_bytes: 8 * GIB,
        reserve_bytes: 3328 * MIB,
        unified_memory: true,
        source: concat!(
            "Memory: 'ON 8GB: 8GB 128-bit LPDDR5 DRAM', NVIDIA Jetson Orin Nano Series Data Sheet \
             and developer.nvidia.com/embedded/jetson-modules.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "orin-nano-4",
        description: "NVIDIA Jetson Orin Nano 4GB (unified LPDDR5)",
        total_bytes: 4 * GIB,
        reserve_bytes: 1536 * MIB,
        unified_memory: true,
        source: concat!(
            "Memory: 'ON 4GB: 4GB 64-bit LPDDR5 DRAM', NVIDIA Jetson Orin Nano Series Data Sheet \
             and developer.nvidia.com/embedded/jetson-modules. The 4 GB reserve \
             is an estimate for a headless image (carve-outs + 512 MiB CMA + ~0.5 GiB OS): a full \
             desktop leaves no useful room for a model on 4 GB.",
            jetson_reserve_note!()
        ),
    },
    Target {
        name: "cuda-8gb",
        description: "Discrete CUDA GPU with 8 GB VRAM (e.g. RTX 3070, RTX 4060)",
        total_bytes: 8 * GIB,
        reserve_bytes: GIB,
        unified_memory: false,
        source: concat!(
            "VRAM: 8 GB GDDR6 per NVIDIA GeForce RTX 3070 / RTX 4060 product specifications \
             (nvidia.com/geforce).",
            cuda_reserve_note!()
        ),
    },
    Target {
        name: "cuda-12gb",
        description: "Discrete CUDA GPU with 12 GB VRAM (e.g. RTX 3060 12GB, RTX 4070)",
        total_bytes: 12 * GIB,
        reserve_bytes: GIB,
        unified_memory: false,
        source: concat!(
            "VRAM: 12 GB GDDR6/GDDR6X per NVIDIA GeForce RTX 3060 / RTX 4070 product \
             specifications (nvidia.com/geforce).",
            cuda_reserve_note!()
        ),
    },
    Target {
        name: "cuda-16gb",
        description: "Discrete CUDA GPU with 16 GB VRAM (e.g. RTX 4060 Ti 16GB, RTX 4080)",
        total_bytes: 16 * GIB,
        reserve_bytes: GIB,
        unified_memory: false,
        source: concat!(
            "VRAM: 16 GB GDDR6/GDDR6X per NVIDIA GeForce RTX 4060 Ti 16GB / RTX 4080 product \
             specifications (nvidia.com/geforce).",
            cuda_reserve_note!()
        ),
    },
    Target {
        name: "cuda-24gb",
        description: "Discrete CUDA GPU with 24 GB VRAM (e.g. RTX 3090, RTX 4090)",
        total_bytes: 24 * GIB,
        reserve_bytes: GIB,
        unified_memory: false,
        source: concat!(
            "VRAM: 24 GB GDDR6X per NVIDIA GeForce RTX 3090 / RTX 4090 product specifications \
             (nvidia.com/geforce).",
            cuda_reserve_note!()
        ),
    },
];

/// The built-in device profiles (everything except `host`, which is read at run time).
pub fn profiles() -> &'static [Target] {
    &PROFILES
}

/// Names accepted by [`by_name`]: every profile plus `host`.
pub fn names() -> Vec<&'static str> {
    PROFILES
        .iter()
        .map(|t| t.name)
        .chain(std::iter::once("host"))
        .collect()
}

/// Look a target up by name (`orin-nano-8`, `cuda-24gb`, `host`, ...).
///
/// Matching ignores ASCII case and surrounding whitespace. `host` calls [`host`].
/// An unknown name yields [`TargetError::UnknownName`], whose message lists valid names.
pub fn by_name(name: &str) -> Result<Target, TargetError> {
    let key = name.trim().to_ascii_lowercase();
    if key == "host" {
        return host();
    }
    PROFILES
        .iter()
        .find(|t| t.name == key)
        .copied()
        .ok_or_else(|| TargetError::UnknownName {
            name: name.to_string(),
            valid: names(),
        })
}

const HOST_SOURCE: &str = "/proc/meminfo at start-up: total = MemTotal, reserve = MemTotal - \
     MemAvailable, i.e. usable = MemAvailable (the kernel's estimate of memory available \
     without swapping, proc(5)). Weights are counted because they share the same RAM.";

/// The machine we are running on, from `/proc/meminfo` (Linux only).
///
/// `usable_bytes()` equals `MemAvailable`: what other processes already hold is the reserve.
/// On other operating systems this returns [`TargetError::Unsupported`].
pub fn host() -> Result<Target, TargetError> {
    if !cfg!(target_os = "linux") {
        return Err(TargetError::Unsupported(
            "reading host memory needs /proc/meminfo (Linux)",
        ));
    }
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| TargetError::Meminfo(format!("reading /proc/meminfo: {e}")))?;
    host_from_meminfo(&text)
}

/// Build the `host` target from the text of `/proc/meminfo`.
///
/// Needs the `MemTotal` and `MemAvailable` lines (values in `kB`, which the kernel means
/// as KiB). Errors name the missing or malformed field.
pub fn host_from_meminfo(text: &str) -> Result<Target, TargetError> {
    let field = |key: &str| -> Result<u64, TargetError> {
        let line = text
            .lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(key))
            .ok_or_else(|| TargetError::Meminfo(format!("no `{key}` line in /proc/meminfo")))?;
        let value = line.split_once(':').map(|x| x.1).unwrap_or("").trim();
        let mut parts = value.split_whitespace();
        let bad = || TargetError::Meminfo(format!("malformed `{key}` line: `{line}`"));
        let n: u64 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let mult = match parts.next() {
            None => 1,
            Some(u) if u.eq_ignore_ascii_case("kb") => 1024,
            Some(_) => return Err(bad()),
        };
        n.checked_mul(mult).ok_or_else(bad)
    };
    let total = field("MemTotal")?;
    let available = field("MemAvailable")?;
    Ok(Target {
        name: "host",
        description: "This machine's RAM (CPU backend), read from /proc/meminfo",
        total_bytes: total,
        reserve_bytes: total.saturating_sub(available),
        unified_memory: true,
        source: HOST_SOURCE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_set_is_complete_and_consistent() {
        let want = [
            "orin-agx-64",
            "orin-agx-32",
            "orin-nx-16",
            "orin-nx-8",
            "orin-nano-8",
            "orin-nano-4",
            "cuda-8gb",
            "cuda-12gb",
            "cuda-16gb",
            "cuda-24gb",
        ];
        let got: Vec<_> = profiles().iter().map(|t| t.name).collect();
        assert_eq!(got, want);
        for t in profiles() {
            assert!(
                t.reserve_bytes > 0 && t.reserve_bytes < t.total_bytes / 2,
                "{t:?}"
            );
            assert_eq!(t.usable_bytes(), t.total_bytes - t.reserve_bytes);
            assert_eq!(t.unified_memory, t.name.starts_with("orin"), "{}", t.name);
            assert!(t.source.contains("Reserve"), "{} cites its reserve", t.name);
            assert!(
                t.source.contains("nvidia"),
                "{} cites a vendor source",
                t.name
            );
            assert!(!t.description.is_empty());
        }
    }

    #[test]
    fn sizes_match_names() {
        let gib = |n: &str| by_name(n).unwrap().total_bytes / GIB;
        assert_eq!(gib("orin-agx-64"), 64);
        assert_eq!(gib("orin-agx-32"), 32);
        assert_eq!(gib("orin-nx-16"), 16);
        assert_eq!(gib("orin-nx-8"), 8);
        assert_eq!(gib("orin-nano-8"), 8);
        assert_eq!(gib("orin-nano-4"), 4);
        assert_eq!(gib("cuda-8gb"), 8);
        assert_eq!(gib("cuda-12gb"), 12);
        assert_eq!(gib("cuda-16gb"), 16);
        assert_eq!(gib("cuda-24gb"), 24);
        assert_eq!(by_name("orin-nano-8").unwrap().usable_bytes(), 4864 * MIB);
    }

    #[test]
    fn by_name_is_forgiving_about_case() {
        assert_eq!(by_name(" ORIN-NANO-8 ").unwrap().name, "orin-nano-8");
    }

    #[test]
    fn unknown_name_lists_valid_names() {
        let e = by_name("orin-nano-16").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`orin-nano-16`"), "{msg}");
        for n in names() {
            assert!(msg.contains(n), "{msg} lists {n}");
        }
        assert!(msg.contains("host"));
    }

    const SAMPLE: &str = "MemTotal:       16323860 kB\n\
                          MemFree:         1234567 kB\n\
                          MemAvailable:   12000000 kB\n\
                          Buffers:          100000 kB\n\
                          HugePages_Total:       0\n";

    #[test]
    fn meminfo_parses() {
        let t = host_from_meminfo(SAMPLE).unwrap();
        assert_eq!(t.name, "host");
        assert_eq!(t.total_bytes, 16_323_860 * 1024);
        assert_eq!(t.usable_bytes(), 12_000_000 * 1024);
        assert_eq!(t.reserve_bytes, (16_323_860 - 12_000_000) * 1024);
        assert!(t.unified_memory);
    }

    #[test]
    fn meminfo_available_above_total_is_clamped() {
        let t = host_from_meminfo("MemTotal: 100 kB\nMemAvailable: 200 kB\n").unwrap();
        assert_eq!(t.reserve_bytes, 0);
        assert_eq!(t.usable_bytes(), 100 * 1024);
    }

    #[test]
    fn meminfo_errors_name_the_field() {
        let e = host_from_meminfo("MemTotal: 100 kB\n").unwrap_err();
        assert!(e.to_string().contains("MemAvailable"), "{e}");
        let e = host_from_meminfo("MemTotal: lots kB\nMemAvailable: 1 kB\n").unwrap_err();
        assert!(e.to_string().contains("malformed `MemTotal`"), "{e}");
        let e = host_from_meminfo("MemTotal: 1 MB\nMemAvailable: 1 kB\n").unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
        assert!(host_from_meminfo("").is_err());
        // A field whose name merely starts with the key is not the key.
        let e = host_from_meminfo("MemTotalX: 1 kB\nMemAvailable: 1 kB\n").unwrap_err();
        assert!(e.to_string().contains("no `MemTotal`"), "{e}");
    }

    #[test]
    fn host_reads_this_machine() {
        if cfg!(target_os = "linux") {
            let t = host().unwrap();
            assert!(t.total_bytes > 0);
            assert!(t.usable_bytes() <= t.total_bytes);
            assert_eq!(by_name("host").unwrap().name, "host");
        } else {
            let e = host().unwrap_err();
            assert!(e.to_string().contains("/proc/meminfo"), "{e}");
        }
    }
}
