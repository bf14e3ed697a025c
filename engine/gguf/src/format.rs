//! The constants of the GGUF format: its magic, its alignment rule, the limits the reader
//! enforces, and the metadata value type ids.

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment used when a file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the data-section alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest array nesting accepted (an array of scalars is depth 1).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;

/// GGUF metadata value type ids.
pub(crate) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}
