//! What can be wrong with a GGUF file, each error naming the key or tensor and the byte offset.

use std::path::PathBuf;

use crate::format::{MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::types::GgmlType;

/// Errors from reading a GGUF file. Every variant says what went wrong and where: the key or
/// tensor name concerned and the byte offset in the file.
#[derive(thiserror::Error, Debug)]
pub enum GgufError {
    /// The mapped file was truncated or rewritten in place after it was opened
    /// ([`crate::Gguf::check_unchanged`]).
    #[error(
        "{} was truncated or rewritten while in use: replace model files by writing a new file \
         and renaming it over the old one",
        .path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be opened, inspected or mapped.
    #[error("cannot read GGUF file {}: {source}", .path.display())]
    Io {
        /// The path that was opened.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The file does not start with `"GGUF"`.
    #[error("not a GGUF file: magic at offset 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first bytes of the file (up to four).
        found: Vec<u8>,
    },
    /// Only GGUF versions 2 and 3 are read.
    #[error(
        "unsupported GGUF version {version} at offset 4: only versions 2 and 3 are read{}",
        if *.version == 1 { " (v1 files must be re-converted with a current converter)" } else { "" }
    )]
    UnsupportedVersion {
        /// The version found in the header.
        version: u32,
    },
    /// The file ended in the middle of a field.
    #[error(
        "file truncated at offset {offset} reading {what}: need {needed} bytes, {available} left"
    )]
    Truncated {
        /// The field being read.
        what: String,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A count or length cannot possibly fit in the rest of the file.
    #[error(
        "{what} at offset {offset} is {count}, but the {remaining} bytes left in the file \
         cannot hold that many"
    )]
    CountTooLarge {
        /// What was counted (tensor count, metadata count, array length, string length).
        what: String,
        /// The count or length read.
        count: u64,
        /// Byte offset of the count field.
        offset: u64,
        /// Bytes left in the file after the count field.
        remaining: u64,
    },
    /// A key, string value or tensor name is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string (e.g. a key, the value of key `x`, a tensor name).
        what: String,
        /// Byte offset of the string's bytes.
        offset: u64,
    },
    /// A metadata value has a type id GGUF does not define.
    #[error("metadata key `{key}`: unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key whose value (or array element type) is bad.
        key: String,
        /// The type id read.
        type_id: u32,
        /// Byte offset of the type id.
        offset: u64,
    },
    /// A bool value is neither 0 nor 1.
    #[error(
        "metadata key `{key}`: bool at offset {offset} has byte value {value}, expected 0 or 1"
    )]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte read.
        value: u8,
        /// Byte offset of the byte.
        offset: u64,
    },
    /// Arrays are nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("metadata key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH} levels at offset {offset}")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// Byte offset of the too-deep array.
        offset: u64,
    },
    /// A metadata key appears twice.
    #[error("duplicate metadata key `{key}` at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },
    /// `general.alignment` is not an integer, is zero, or is not a power of two.
    #[error(
        "metadata key `general.alignment` at offset {offset} is {value}: \
         it must be a non-zero power of two (u32)"
    )]
    BadAlignment {
        /// The value found, as displayed.
        value: String,
        /// Byte offset of the key/value pair.
        offset: u64,
    },
    /// A tensor name appears twice.
    #[error("duplicate tensor name `{name}` at offset {offset}")]
    DuplicateTensor {
        /// The tensor name.
        name: String,
        /// Byte offset of the second tensor info.
        offset: u64,
    },
    /// A tensor has zero or more than [`MAX_DIMS`] dimensions.
    #[error("tensor `{name}` (info at offset {offset}) has {n_dims} dimensions; 1 to {MAX_DIMS} are allowed")]
    BadDimCount {
        /// The tensor name.
        name: String,
        /// The dimension count read.
        n_dims: u32,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor has a zero dimension.
    #[error("tensor `{name}` (info at offset {offset}) has a zero dimension: {dims:?}")]
    ZeroDim {
        /// The tensor name.
        name: String,
        /// Its dimensions.
        dims: Vec<u64>,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's element count or byte size overflows 64 bits.
    #[error("tensor `{name}` (info at offset {offset}): dimensions {dims:?} overflow 64 bits")]
    DimsOverflow {
        /// The tensor name.
        name: String,
        /// Its dimensions.
        dims: Vec<u64>,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's type id is not one GGUF defines.
    #[error("tensor `{name}` (info at offset {offset}) has unknown ggml type id {type_id}")]
    UnknownTensorType {
        /// The tensor name.
        name: String,
        /// The type id read.
        type_id: u32,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's type is one ggml has removed, whose block layout is unknown, so its size
    /// cannot be computed.
    #[error(
        "tensor `{name}` (info at offset {offset}) has ggml type id {type_id}, which ggml has \
         removed; its layout is unknown"
    )]
    TypeWithoutLayout {
        /// The tensor name.
        name: String,
        /// The type id read.
        type_id: u32,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's row length (`dims[0]`) is not a whole number of blocks of its type.
    #[error(
        "tensor `{name}` (info at offset {offset}): row length {row} is not a multiple of \
         the {ggml_type} block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor name.
        name: String,
        /// `dims[0]`.
        row: u64,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// The type's block size.
        block_size: u64,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's data offset is not a multiple of the alignment.
    #[error(
        "tensor `{name}` (info at offset {offset}): data offset {data_offset} is not a \
         multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor name.
        name: String,
        /// The offset read (relative to the data section).
        data_offset: u64,
        /// The file's alignment.
        alignment: u64,
        /// Byte offset of the tensor info.
        offset: u64,
    },
    /// A tensor's data does not lie inside the file.
    #[error(
        "tensor `{name}` (info at offset {offset}): data at file bytes {start}..{end} runs \
         past the end of the file ({file_size} bytes)"
    )]
    TensorOutOfRange {
        /// The tensor name.
        name: String,
        /// Absolute start of the data (saturated at `u64::MAX`).
        start: u64,
        /// Absolute end of the data (saturated at `u64::MAX`).
        end: u64,
        /// The file size.
        file_size: u64,
        /// Byte offset of the tensor info.
        offset: u64,
    },
}
