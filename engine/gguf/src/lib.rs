//! GGUF files: a reader (zero-copy over a memory map), a writer (for tests and tools), huge
//! pages for the mapped weights, and [`types`]: the one table of ggml tensor types (id, name,
//! block layout, activation type, the backends that compute with it) that the kernels and the
//! engine both read.
//!
//! Reads GGUF versions 2 and 3 (little-endian). The whole header — metadata and tensor infos —
//! is parsed and validated in [`Gguf::open`] / [`Gguf::from_bytes`]; afterwards every accessor is
//! infallible and [`Gguf::tensor_data`] is a plain slice into the mapping.
//!
//! Validation never panics on file content: every length and count is checked against the bytes
//! that remain before anything is allocated, all arithmetic on file values is checked, arrays nest
//! at most [`MAX_ARRAY_DEPTH`] levels, and all strings (keys and values) must be valid UTF-8 (every
//! reference file and model we ship is, so invalid UTF-8 is reported as
//! [`GgufError::InvalidUtf8`] rather than silently replaced).
//!
//! Layout: magic `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count, the metadata
//! key/value pairs, the tensor infos, then the data section at the next multiple of
//! `general.alignment` (default [`DEFAULT_ALIGNMENT`]). Tensor offsets are relative to the data
//! section and must be multiples of the alignment.

#![warn(missing_docs)]

mod error;
mod file;
mod format;
pub mod huge_pages;
mod parse;
pub mod types;
mod value;
mod writer;

#[cfg(test)]
mod tests;

pub use error::GgufError;
pub use file::Gguf;
pub use format::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use huge_pages::HugePages;
pub use parse::TensorInfo;
pub use types::{GgmlType, TypeInfo};
pub use value::MetaValue;
pub use writer::GgufWriter;
