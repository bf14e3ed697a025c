//! edge-run's CPU kernels and threads: what the engine's CPU backend computes with.
//!
//! - [`cpu`]: per tensor type, the block layout's decoding, the activation quantizers and the
//!   dot products and matrix-vector products, with a scalar reference and SIMD variants
//!   (AVX2, AVX-512, NEON) chosen once at run time ([`Kernels::detect`]); plus the f32 helpers
//!   (norms, RoPE, activations) and the ggml-ordered attention arithmetic.
//! - [`threads`]: a persistent pool of workers, its barrier and the split of work among them;
//!   [`steal`]: work stealing of matmul rows and attention heads; [`phases`]: ops cut into parts
//!   any thread runs, for runs that must not wait for a descheduled thread.
//! - [`bandwidth`]: the memory read bandwidth, measured the way decoding reads weights.
//!
//! This crate knows tensor types (from [`edge_gguf::types`]) and byte slices, never a model,
//! a graph or a session.

#![warn(missing_docs)]

pub mod balance;
pub mod bandwidth;
pub mod cpu;
pub mod phases;
pub mod steal;
pub mod testutil;
pub mod threads;
pub mod wait;

pub use cpu::{KernelError, Kernels, Q8Rounding};
