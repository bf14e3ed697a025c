//! GGUF reader (zero-copy over a memory map) and a GGUF writer for tests.
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

pub mod huge_pages;
mod writer;

#[cfg(test)]
mod tests;

pub use huge_pages::HugePages;
pub use writer::GgufWriter;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::tensor::GgmlType;

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

/// Errors from reading a GGUF file. Every variant says what went wrong and where: the key or
/// tensor name concerned and the byte offset in the file.
#[derive(thiserror::Error, Debug)]
pub enum GgufError {
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

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `uint8` (type 0).
    U8(u8),
    /// `int8` (type 1).
    I8(i8),
    /// `uint16` (type 2).
    U16(u16),
    /// `int16` (type 3).
    I16(i16),
    /// `uint32` (type 4).
    U32(u32),
    /// `int32` (type 5).
    I32(i32),
    /// `uint64` (type 10).
    U64(u64),
    /// `int64` (type 11).
    I64(i64),
    /// `float32` (type 6).
    F32(f32),
    /// `float64` (type 12).
    F64(f64),
    /// `bool` (type 7).
    Bool(bool),
    /// `string` (type 8).
    String(String),
    /// `array` (type 9); GGUF arrays are homogeneous and may nest. An empty array does not
    /// remember its element type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// GGUF's name for the value's type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        use value_type as t;
        match self {
            MetaValue::U8(_) => t::U8,
            MetaValue::I8(_) => t::I8,
            MetaValue::U16(_) => t::U16,
            MetaValue::I16(_) => t::I16,
            MetaValue::U32(_) => t::U32,
            MetaValue::I32(_) => t::I32,
            MetaValue::U64(_) => t::U64,
            MetaValue::I64(_) => t::I64,
            MetaValue::F32(_) => t::F32,
            MetaValue::F64(_) => t::F64,
            MetaValue::Bool(_) => t::BOOL,
            MetaValue::String(_) => t::STRING,
            MetaValue::Array(_) => t::ARRAY,
        }
    }

    /// The value as an `i128` if it is an integer of any width (bools and floats are not).
    fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a `u64` if it is an integer of any width whose value fits.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    /// The value as a `u32` if it is an integer of any width whose value fits.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_int().and_then(|v| u32::try_from(v).ok())
    }

    /// The value as an `i64` if it is an integer of any width whose value fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_int().and_then(|v| i64::try_from(v).ok())
    }

    /// The value as an `i32` if it is an integer of any width whose value fits.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_int().and_then(|v| i32::try_from(v).ok())
    }

    /// The value as an `f32`: floats (f64 rounded) and integers (rounded to nearest).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => self.as_int().map(|v| v as f32),
        }
    }

    /// The value if it is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Longest string shown in full by `Display`; longer ones are cut with `…`.
const DISPLAY_STR_MAX: usize = 64;
/// Array elements shown by `Display`.
const DISPLAY_ARRAY_ITEMS: usize = 5;

/// Short, one-line rendering for `inspect`: scalars as-is, strings quoted (long ones cut),
/// arrays as `[<elem type>; <len>] [first items, ...]`.
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) => {
                if s.chars().count() > DISPLAY_STR_MAX {
                    let cut: String = s.chars().take(DISPLAY_STR_MAX).collect();
                    write!(f, "{:?}…", cut)
                } else {
                    write!(f, "{s:?}")
                }
            }
            MetaValue::Array(items) => {
                let elem = items.first().map_or("?", MetaValue::type_name);
                write!(f, "[{elem}; {}] [", items.len())?;
                for (i, item) in items.iter().take(DISPLAY_ARRAY_ITEMS).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if items.len() > DISPLAY_ARRAY_ITEMS {
                    f.write_str(", ...")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// One tensor's description, validated at open.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (contiguous). 1 to 4 entries, none
    /// zero.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Absolute file offset of the tensor's data.
    pub offset: u64,
    /// Number of elements (product of `dims`).
    pub n_elements: u64,
    /// Number of bytes of data.
    pub n_bytes: u64,
}

/// The bytes behind a [`Gguf`]: a read-only file mapping or an owned buffer.
enum Storage {
    /// The mapping, and the file (for page-cache advice: see [`Gguf::settle_huge_pages`]).
    Mmap(memmap2::Mmap, std::fs::File),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m, _) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed, validated GGUF file. Owns its bytes (a read-only memory map or a buffer);
/// tensor data is served zero-copy by [`Gguf::tensor_data`].
pub struct Gguf {
    storage: Storage,
    /// What [`Gguf::settle_huge_pages`] did, once.
    huge_pages: std::sync::OnceLock<HugePages>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Maps the file at `path` read-only and parses and validates it. Errors name the path
    /// (I/O) or the key / tensor and byte offset (format).
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a GGUF file",
            )));
        }
        let len = meta.len();
        let storage = if len == 0 {
            // Mapping zero bytes is not portable; an empty file is simply too short.
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only and we hand out only shared slices of it. Rust's
            // aliasing guarantees for those slices hold as long as no one modifies or truncates
            // the file while it is mapped; model files are treated as immutable inputs (this is
            // the documented contract of `memmap2::Mmap::map`). All content is validated as
            // untrusted bytes, so any *content* is safe.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
            Storage::Mmap(map, file)
        };
        Gguf::parse(storage)
    }

    /// Parses and validates GGUF bytes held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Gguf::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Gguf, GgufError> {
        let header = parse_header(storage.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Gguf {
            storage,
            huge_pages: std::sync::OnceLock::new(),
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            metadata: header.metadata,
            key_index,
            tensors: header.tensors,
            tensor_index,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data-section alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section (the end of the header rounded up to the
    /// alignment). With no tensors it may lie past the end of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An integer value of any integer type, if it fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// An integer value of any integer type, if it fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// A float value: `f32`, `f64` (rounded) or any integer.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_str)
            .collect()
    }

    /// Moves the strings of a string array out, leaving an empty array under the key: a
    /// consumer of a large array (the tokenizer's 50k-250k tokens and merges) takes it instead
    /// of copying it, so the process does not hold the vocabulary twice. `None` (and nothing
    /// moved) if the key is absent or not an array of strings.
    pub fn take_str_array(&mut self, key: &str) -> Option<Vec<String>> {
        let &i = self.key_index.get(key)?;
        let MetaValue::Array(items) = &mut self.metadata.get_mut(i)?.1 else {
            return None;
        };
        if !items.iter().all(|v| matches!(v, MetaValue::String(_))) {
            return None;
        }
        Some(
            std::mem::take(items)
                .into_iter()
                .filter_map(|v| match v {
                    MetaValue::String(s) => Some(s),
                    _ => None,
                })
                .collect(),
        )
    }

    /// An array whose elements are all numbers (see [`MetaValue::as_f32`]), as `f32`.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_f32)
            .collect()
    }

    /// An array whose elements are all integers that fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_i32)
            .collect()
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    /// The whole file as mapped, when the bytes are a file mapping (not an owned buffer): the
    /// CUDA backend registers this range for zero-copy device access on integrated GPUs.
    pub fn mapped_bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Mmap(m, _) => Some(m),
            Storage::Owned(_) => None,
        }
    }

    /// Has the kernel hold the mapped file in 2 MiB pages where it can, re-reading it once if
    /// it sits in small ones (see [`huge_pages`]): decoding, which streams every weight each
    /// token, reads huge pages faster. Done once per file opened; later calls return the first
    /// outcome. The mapping stays the file's, read-only, with the same bytes.
    pub fn settle_huge_pages(&self) -> HugePages {
        *self.huge_pages.get_or_init(|| match &self.storage {
            Storage::Mmap(m, file) => huge_pages::settle(m, file).unwrap_or_else(|e| {
                log::debug!("huge pages for the weights: {e}");
                HugePages::NotAttempted
            }),
            Storage::Owned(_) => HugePages::NotAttempted,
        })
    }

    /// Drops this process's resident pages of the file mapping (`madvise(MADV_DONTNEED)`), for a
    /// backend that has copied the weights elsewhere (a GPU's memory, a managed buffer): the
    /// mapping stays valid, and a later read faults the same bytes back in from the file. A
    /// no-op for an owned buffer and off Unix.
    pub fn release_resident_pages(&self) -> std::io::Result<()> {
        #[cfg(unix)]
        if let Storage::Mmap(m, _) = &self.storage {
            // SAFETY: the mapping is a shared, read-only map of a file (`Mmap::map`). For such a
            // map MADV_DONTNEED only unmaps the pages from this process; their contents are the
            // file's, so every later read (through any live slice) sees the same bytes again.
            // Nothing writes the mapping, so no modification can be discarded.
            unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }?;
        }
        Ok(())
    }

    /// The tensor's bytes, zero-copy. The range of every tensor of this file was validated at
    /// open; for a `TensorInfo` not from this file whose range lies outside it, the slice is
    /// empty (never a panic).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.storage.bytes();
        let range = usize::try_from(t.offset).ok().and_then(|start| {
            let len = usize::try_from(t.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        });
        range.and_then(|r| bytes.get(r)).unwrap_or(&[])
    }
}

/// The parsed header.
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
}

/// Smallest encoding of one metadata pair: empty key (8) + type (4) + 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4)
/// + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

fn parse_header(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut r = Reader { bytes, pos: 0 };
    if bytes.get(..4) != Some(&GGUF_MAGIC[..]) {
        return Err(GgufError::BadMagic {
            found: bytes.iter().take(4).copied().collect(),
        });
    }
    r.pos = 4;
    let version = r.u32(|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    // The tensor count is checked against the bytes left once the metadata is read (see
    // below): checked here, a file cut short in its metadata would be reported as a bad tensor
    // count rather than as the field where it ends.
    let tensor_count_offset = r.offset();
    let tensor_count = r.u64(|| "tensor count".into())?;
    let kv_count = r.count(MIN_KV_BYTES, || "metadata count".into())?;

    // Metadata.
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(kv_count);
    let mut seen = HashSet::with_capacity(kv_count);
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..kv_count {
        let kv_offset = r.offset();
        let key = r.string(|| format!("key of metadata pair {i}"))?;
        let value = r.value(&key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: kv_offset,
            });
        }
        if key == ALIGNMENT_KEY {
            alignment = match value.as_u32() {
                Some(a) if a.is_power_of_two() => u64::from(a),
                _ => {
                    return Err(GgufError::BadAlignment {
                        value: format!("{value} ({})", value.type_name()),
                        offset: kv_offset,
                    })
                }
            };
        }
        metadata.push((key, value));
    }

    // Tensor infos. A count the rest of the file cannot hold is refused as such when nothing
    // follows the metadata; otherwise the infos are read until the file ends, so that a file
    // cut inside them is reported at the field where it ends. Either way the allocation is
    // bounded by what the file can hold.
    let remaining = r.remaining();
    let plausible = tensor_count
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .is_some_and(|need| need <= remaining);
    if !plausible && remaining == 0 {
        return Err(GgufError::CountTooLarge {
            what: "tensor count".into(),
            count: tensor_count,
            offset: tensor_count_offset,
            remaining,
        });
    }
    // remaining <= usize::MAX (it is a length of a slice)
    let capacity = tensor_count.min(remaining / MIN_TENSOR_INFO_BYTES) as usize;
    let mut raw = Vec::with_capacity(capacity);
    let mut names = HashSet::with_capacity(capacity);
    let infos = (|| {
        for i in 0..tensor_count {
            let info_offset = r.offset();
            let name = r.string(|| format!("name of tensor {i}"))?;
            let n_dims = r.u32(|| format!("n_dims of tensor `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadDimCount {
                    name,
                    n_dims,
                    offset: info_offset,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(r.u64(|| format!("dim {d} of tensor `{name}`"))?);
            }
            let type_id = r.u32(|| format!("type of tensor `{name}`"))?;
            let rel_offset = r.u64(|| format!("data offset of tensor `{name}`"))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor {
                    name,
                    offset: info_offset,
                });
            }
            raw.push((name, dims, type_id, rel_offset, info_offset));
        }
        Ok(())
    })();
    if let Err(e) = infos {
        // An implausible count whose infos do not end where the file does (they ran into
        // tensor data, say) is a bad count, not a damaged info.
        return Err(match e {
            GgufError::Truncated { .. } => e,
            _ if !plausible => GgufError::CountTooLarge {
                what: "tensor count".into(),
                count: tensor_count,
                offset: tensor_count_offset,
                remaining,
            },
            e => e,
        });
    }

    let header_end = r.offset();
    let file_size = bytes.len() as u64;
    // alignment is a power of two <= 2^31, so this only overflows for absurd header ends.
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);

    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dims, type_id, rel_offset, offset) in raw {
        tensors.push(check_tensor(
            name,
            dims,
            type_id,
            rel_offset,
            offset,
            alignment,
            data_offset,
            file_size,
        )?);
    }

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}

/// Validates one tensor info against the file and computes its absolute range.
#[allow(clippy::too_many_arguments)]
fn check_tensor(
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    rel_offset: u64,
    offset: u64,
    alignment: u64,
    data_offset: u64,
    file_size: u64,
) -> Result<TensorInfo, GgufError> {
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim { name, dims, offset });
    }
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            name,
            type_id,
            offset,
        });
    };
    let block_size = ggml_type.block_size() as u64;
    if block_size == 0 {
        return Err(GgufError::TypeWithoutLayout {
            name,
            type_id,
            offset,
        });
    }
    let Some(n_elements) = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
        return Err(GgufError::DimsOverflow { name, dims, offset });
    };
    let row = dims.first().copied().unwrap_or(1);
    let Some(row_bytes) = ggml_type.row_bytes(row) else {
        if row % block_size != 0 {
            return Err(GgufError::RowNotBlockMultiple {
                name,
                row,
                ggml_type,
                block_size,
                offset,
            });
        }
        return Err(GgufError::DimsOverflow { name, dims, offset });
    };
    let n_rows = n_elements / row; // row > 0: zero dims were rejected above
    let Some(n_bytes) = row_bytes.checked_mul(n_rows) else {
        return Err(GgufError::DimsOverflow { name, dims, offset });
    };
    // alignment is a non-zero power of two (checked when read).
    if rel_offset & (alignment - 1) != 0 {
        return Err(GgufError::MisalignedTensor {
            name,
            data_offset: rel_offset,
            alignment,
            offset,
        });
    }
    let start = data_offset.checked_add(rel_offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_size => Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset: start,
            n_elements,
            n_bytes,
        }),
        _ => Err(GgufError::TensorOutOfRange {
            name,
            start: start.unwrap_or(u64::MAX),
            end: end.unwrap_or(u64::MAX),
            file_size,
            offset,
        }),
    }
}

/// A bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.bytes.len().saturating_sub(self.pos) as u64
    }

    /// Takes `n` bytes; `what` describes the field for the error.
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| Some(self.pos..self.pos.checked_add(n)?))
            .and_then(|range| self.bytes.get(range));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                available: self.remaining(),
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a `u64` count of items that take at least `min_item_bytes` each and checks that
    /// that many can fit in the rest of the file, so it is safe to allocate for them.
    fn count(
        &mut self,
        min_item_bytes: u64,
        what: impl Fn() -> String,
    ) -> Result<usize, GgufError> {
        let offset = self.offset();
        let count = self.u64(&what)?;
        let remaining = self.remaining();
        match count.checked_mul(min_item_bytes) {
            Some(need) if need <= remaining => {
                // need <= remaining <= usize::MAX, and min_item_bytes >= 1.
                Ok(count as usize)
            }
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset,
                remaining,
            }),
        }
    }

    /// Reads a GGUF string (u64 length + UTF-8 bytes).
    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.count(1, || format!("length of {}", what()))?;
        let offset = self.offset();
        let s = self.take(len as u64, &what)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    /// Reads a value of the type given by the next `u32`.
    fn value(&mut self, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let type_offset = self.offset();
        let type_id = self.u32(|| format!("value type of key `{key}`"))?;
        self.value_of_type(type_id, type_offset, key, depth)
    }

    fn value_of_type(
        &mut self,
        type_id: u32,
        type_offset: u64,
        key: &str,
        depth: usize,
    ) -> Result<MetaValue, GgufError> {
        use value_type as t;
        let what = || format!("value of key `{key}`");
        Ok(match type_id {
            t::U8 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            t::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            t::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            t::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            t::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            t::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            t::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            t::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            t::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            t::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            t::BOOL => {
                let offset = self.offset();
                match self.array::<1>(what)?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    value => {
                        return Err(GgufError::InvalidBool {
                            key: key.to_owned(),
                            value,
                            offset,
                        })
                    }
                }
            }
            t::STRING => MetaValue::String(self.string(what)?),
            t::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_owned(),
                        offset: type_offset,
                    });
                }
                let elem_offset = self.offset();
                let elem_type = self.u32(|| format!("array element type of key `{key}`"))?;
                let Some(min) = min_value_bytes(elem_type) else {
                    return Err(GgufError::UnknownValueType {
                        key: key.to_owned(),
                        type_id: elem_type,
                        offset: elem_offset,
                    });
                };
                let len = self.count(min, || format!("array length of key `{key}`"))?;
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    items.push(self.value_of_type(elem_type, elem_offset, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    type_id,
                    offset: type_offset,
                })
            }
        })
    }
}

/// Fewest bytes a value of GGUF type `type_id` can take, or `None` for an unknown type.
fn min_value_bytes(type_id: u32) -> Option<u64> {
    use value_type as t;
    Some(match type_id {
        t::U8 | t::I8 | t::BOOL => 1,
        t::U16 | t::I16 => 2,
        t::U32 | t::I32 | t::F32 => 4,
        t::U64 | t::I64 | t::F64 => 8,
        t::STRING => 8,
        t::ARRAY => 4 + 8,
        _ => return None,
    })
}
