//! An opened GGUF file: its bytes (a read-only mapping or an owned buffer), the validated
//! metadata and tensor table, and zero-copy access to tensor data.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::GgufError;
use crate::huge_pages::{self, HugePages};
use crate::parse::{parse_header, TensorInfo};
use crate::value::MetaValue;

/// The bytes behind a [`Gguf`]: a read-only file mapping or an owned buffer.
enum Storage {
    /// The mapping, and the file (for page-cache advice: see [`Gguf::settle_huge_pages`], and
    /// to see whether it changed: [`Gguf::check_unchanged`]).
    Mmap(memmap2::Mmap, std::fs::File, Stamp),
    Owned(Vec<u8>),
}

/// What a mapped file looked like when it was opened.
struct Stamp {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(path: &Path, meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            path: path.to_path_buf(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m, ..) => m,
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
            let stamp = Stamp::of(path, &meta);
            Storage::Mmap(map, file, stamp)
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

    /// The path the file was opened from (`None` for bytes held in memory).
    pub fn path(&self) -> Option<&Path> {
        match &self.storage {
            Storage::Mmap(_, _, stamp) => Some(&stamp.path),
            Storage::Owned(_) => None,
        }
    }

    /// Whether the mapped file is as it was when opened: its length and modification time, read
    /// from the open file (one `fstat`). A file truncated or rewritten in place gives
    /// [`GgufError::Changed`]: reading the mapping past a truncation would fault the process
    /// (SIGBUS), and rewritten bytes are not the ones validated at open. A file *replaced* by
    /// renaming a new one over its path is not changed: the mapping still holds the old file,
    /// which the kernel keeps until it is unmapped, and that is how to update a model while it
    /// is in use. Bytes held in memory never change.
    ///
    /// The engine checks before each run; a truncation that lands during a run still faults.
    /// A host that must survive that installs a SIGBUS handler for the range
    /// [`Gguf::mapped_bytes`] covers (the `edge-run` CLI does: it prints one line and exits 3).
    pub fn check_unchanged(&self) -> Result<(), GgufError> {
        let Storage::Mmap(_, file, stamp) = &self.storage else {
            return Ok(());
        };
        let changed = match file.metadata() {
            Ok(meta) => meta.len() != stamp.len || meta.modified().ok() != stamp.modified,
            Err(_) => true,
        };
        if changed {
            return Err(GgufError::Changed {
                path: stamp.path.clone(),
            });
        }
        Ok(())
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

    /// The header's bytes: everything before the data section (magic, metadata, tensor
    /// table), e.g. to fingerprint the file without reading its weights.
    pub fn header_bytes(&self) -> &[u8] {
        let bytes = self.storage.bytes();
        let end = usize::try_from(self.data_offset).map_or(bytes.len(), |o| o.min(bytes.len()));
        &bytes[..end]
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
            Storage::Mmap(m, ..) => Some(m),
            Storage::Owned(_) => None,
        }
    }

    /// Has the kernel hold the mapped file in 2 MiB pages where it can, re-reading it once if
    /// it sits in small ones (see [`huge_pages`]): decoding, which streams every weight each
    /// token, reads huge pages faster. Done once per file opened; later calls return the first
    /// outcome. The mapping stays the file's, read-only, with the same bytes.
    pub fn settle_huge_pages(&self) -> HugePages {
        *self.huge_pages.get_or_init(|| match &self.storage {
            Storage::Mmap(m, file, _) => huge_pages::settle(m, file).unwrap_or_else(|e| {
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
        if let Storage::Mmap(m, ..) = &self.storage {
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
