//! Device profiles and the memory budget policy for edge-run.
//!
//! This crate knows nothing about models: it answers "how much memory may the engine
//! own on this device?" and "does this demand fit?". The engine computes a [`Demand`]
//! (weights, KV cache, arena, scratch) from the model and ctx/ubatch, and asks this
//! crate. It depends on `std` only.
//!
//! # What a profile is
//!
//! A [`Target`] names a device class and gives its memory: `total_bytes` (physical
//! memory the engine's data lives in: shared LPDDR5 on Jetson, VRAM on a discrete card,
//! RAM on the host), `reserve_bytes` (what is not ours to take), and `unified_memory`
//! (weights compete with activations for the same RAM). `usable_bytes() = total - reserve`
//! is the default budget. Every profile carries a `source` string citing where its
//! numbers come from.
//!
//! | name          | total  | reserve  | usable   | unified | memory source |
//! |---------------|--------|----------|----------|---------|---------------|
//! | `orin-agx-64` | 64 GiB | 4.5 GiB  | 59.5 GiB | yes | Jetson AGX Orin Series Data Sheet (256-bit LPDDR5) |
//! | `orin-agx-32` | 32 GiB | 4 GiB    | 28 GiB   | yes | Jetson AGX Orin Series Data Sheet (256-bit LPDDR5) |
//! | `orin-nx-16`  | 16 GiB | 3.5 GiB  | 12.5 GiB | yes | Jetson Orin NX Series Modules Data Sheet DS-10712-001 (128-bit LPDDR5) |
//! | `orin-nx-8`   | 8 GiB  | 3.25 GiB | 4.75 GiB | yes | Jetson Orin NX Series Modules Data Sheet DS-10712-001 (128-bit LPDDR5) |
//! | `orin-nano-8` | 8 GiB  | 3.25 GiB | 4.75 GiB | yes | Jetson Orin Nano Series Data Sheet ("ON 8GB: 8GB 128-bit LPDDR5") |
//! | `orin-nano-4` | 4 GiB  | 1.5 GiB  | 2.5 GiB  | yes | Jetson Orin Nano Series Data Sheet ("ON 4GB: 4GB 64-bit LPDDR5") |
//! | `cuda-8gb`    | 8 GiB  | 1 GiB    | 7 GiB    | no  | GeForce RTX 3070 / 4060 specifications |
//! | `cuda-12gb`   | 12 GiB | 1 GiB    | 11 GiB   | no  | GeForce RTX 3060 12GB / 4070 specifications |
//! | `cuda-16gb`   | 16 GiB | 1 GiB    | 15 GiB   | no  | GeForce RTX 4060 Ti 16GB / 4080 specifications |
//! | `cuda-24gb`   | 24 GiB | 1 GiB    | 23 GiB   | no  | GeForce RTX 3090 / 4090 specifications |
//! | `host`        | `MemTotal` | `MemTotal - MemAvailable` | `MemAvailable` | yes | `/proc/meminfo` at start-up ([`host`]) |
//!
//! # How the reserve was chosen
//!
//! **Jetson (unified memory).** CPU, GPU and the media engines share one LPDDR5 pool, so
//! the engine competes with everything else on the board. Three things are gone before
//! the engine starts: firmware and GPU carve-outs (the capture below sees 7772 MB of
//! 8192 MiB), the default 512 MiB CMA pool, and the JetPack Ubuntu desktop at idle. The one published measurement we use: a tegrastats capture of an
//! idle 8 GB Orin on the stock desktop image reads `RAM 2847/7772MB` (proventusnova.com,
//! "Jetson Orin high RAM usage at idle"), so 8192 - (7772 - 2847) = 3267 MiB are not
//! available to us; rounded up, the 8 GB boards reserve 3.25 GiB. The larger boards are
//! extrapolated from it (the desktop's share stays roughly constant, carve-outs and page
//! tables grow a little with DRAM): 3.5 GiB on 16 GB, 4 GiB on 32 GB, 4.5 GiB on 64 GB.
//! The 4 GB Nano reserves 1.5 GiB and assumes a headless image (carve-outs + CMA +
//! ~0.5 GiB OS), since a full desktop leaves no useful room for a model there.
//! These are defaults for a stock desktop image: a headless deployment can pass an
//! explicit `--mem-budget` larger than `usable_bytes()`, which then wins (see
//! [`Budget::for_target`]).
//!
//! **Discrete CUDA cards.** Weights live in VRAM, separate from host RAM (`unified_memory
//! = false`). We reserve 1 GiB: the CUDA context (driver state, loaded module images,
//! per-SM local memory; typically a few hundred MiB for an idle process as seen in
//! `nvidia-smi`, less with `CUDA_MODULE_LOADING=LAZY`) plus a display server on a
//! desktop card. This is an engineering estimate, not a vendor figure.
//!
//! **Host.** What other processes already hold is the reserve: usable = `MemAvailable`,
//! the kernel's own estimate of memory available without swapping (proc(5)).
//!
//! # How the engine uses it
//!
//! 1. Resolve the target: `--target NAME` via [`by_name`] (default `host`), and parse
//!    `--mem-budget SIZE` with [`parse_size`].
//! 2. Build the [`Budget`] with [`Budget::for_target`]: `--mem-budget` if given, else the
//!    target's usable bytes; weights count with `--count-weights` or on a
//!    unified-memory target.
//! 3. If `--ctx`/`--ubatch` are not given, call [`largest_fitting`] with a closure that
//!    maps ctx to a [`Demand`] and use the ctx it returns (error if `None`).
//! 4. If they are given, call [`Budget::check`] **before allocating anything**; on error,
//!    attach [`largest_fitting`]'s answer with [`BudgetError::with_largest_fitting_ctx`]
//!    and print it: the message shows needed vs budget per component and the total.
//!
//! Sizes in messages are printed with [`format_size`] (`1.50 GiB`).
#![deny(missing_docs)]

mod budget;
mod profiles;
mod size;

pub use budget::{largest_fitting, Budget, BudgetError, Demand};
pub use profiles::{by_name, host, host_from_meminfo, names, profiles, Target, TargetError};
pub use size::{format_size, parse_size, SizeError};
