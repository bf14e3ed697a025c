//! edge-run's engine: models and their architectures, graphs planned into one arena, the CPU
//! and CUDA backends, the KV cache, sampling, sessions, generation and embeddings.
//!
//! The layers below it are their own crates, re-exported here so that an embedder needs only
//! this one: [`gguf`] (the file format and the table of tensor types) and [`kernels`] (the CPU
//! kernels and threads). The layers above it are clients of its API: the `edge-run` command
//! line (`engine/cli`) and the C API (`engine/capi`). This crate has no command-line, logging
//! or signal handling of its own: errors name settings as this API does ([`error::Setting`]),
//! and log lines go through the `log` facade to whatever logger the program installs.
//!
//! How data flows: [`model::Model`] (a mapped, validated GGUF) → [`arch`] builds a
//! [`graph::Graph`] → [`plan`] places its values in one arena → a [`session::Session`] opens a
//! [`backend::Backend`] (CPU or CUDA) with the KV cache ([`kv`]) and the arena → logits →
//! [`sampling::Sampler`] → [`generate::Generator`] streams text.
//! [`perplexity`] scores a model on a text (and against a base model's saved log-probabilities)
//! as llama.cpp's `llama-perplexity` does.
//!
//! # Library use
//!
//! Load a [`Model`](model::Model) once (it is `Send + Sync`: the weights stay mapped from the
//! file and are shared), open any number of [`Session`](session::Session)s on it — each owns
//! its KV cache and its arena, allocated once when it opens — and generate:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // The examples run on the test model when it is there (scripts/fetch-model.sh).
//! # let Some(path) = std::env::var_os("EDGE_RUN_MODEL").map(std::path::PathBuf::from).or_else(|| {
//! #     let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
//! #     p.exists().then_some(p)
//! # }) else { return Ok(()) };
//! use std::ops::ControlFlow;
//! use std::sync::Arc;
//! use edge_engine::generate::{GenerateOptions, StopReason};
//! use edge_engine::model::Model;
//! use edge_engine::session::{Session, SessionConfig};
//!
//! let model = Arc::new(Model::load(&path)?);
//! let config = SessionConfig { ctx: Some(512), threads: Some(1), ..Default::default() };
//! let mut session = Session::new(Arc::clone(&model), &config)?;
//!
//! // Tokenize with the model's tokenizer (BOS as the model wants, special tokens parsed).
//! let prompt = model.tokenize("The capital of France is", true, true)?;
//! let mut text = String::new();
//! let done = session.generate(&prompt, &GenerateOptions::greedy(6), |event| {
//!     text.push_str(event.text); // streamed text, complete UTF-8 characters only
//!     ControlFlow::Continue(())   // or Break(()) to stop here
//! })?;
//! assert_eq!(done.stop_reason, StopReason::MaxTokens);
//! assert_eq!(text, " Paris.\n\nThe United");
//!
//! // Lower level: prefill returns the logits of the last prompt token, step those of the next.
//! session.reset();
//! let logits = session.prefill(&prompt)?;
//! let first = edge_engine::sampling::argmax(logits);
//! assert_eq!(model.detokenize(&[first], false), " Paris");
//! let _logits = session.step(first)?;
//! assert_eq!(session.n_past(), prompt.len() + 1);
//! # Ok(())
//! # }
//! ```
//!
//! Sessions are independent: two sessions in two threads produce exactly the tokens each
//! produces alone. Errors are [`EngineError`](error::EngineError)s that name the problem; the
//! library does not panic on bad input. The C API is the `edge-run-capi` crate (`engine/capi`).

#![warn(missing_docs)]

pub mod arch;
pub mod backend;
pub mod bandwidth;
pub mod constrain;
pub mod device;
pub mod embed;
pub mod error;
pub mod generate;
pub mod graph;
pub mod kv;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod plan;
pub mod sampling;
pub mod session;

pub use edge_gguf as gguf;
pub use edge_kernels as kernels;
