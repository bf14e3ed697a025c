//! An in-memory GGUF writer, for tests: builds well-formed files by default, and offers raw
//! escape hatches (magic, counts, offsets, arbitrary key/value bytes, trailing bytes) so tests
//! can build malformed ones.

use crate::format::{value_type, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::types::GgmlType;
use crate::value::MetaValue;

/// One metadata entry as it will be written.
enum Entry {
    /// A key and a value, encoded normally.
    Value(String, MetaValue),
    /// Raw key bytes, a type id and raw value bytes, written verbatim.
    Raw(Vec<u8>, u32, Vec<u8>),
}

/// One tensor as it will be written.
struct WTensor {
    name: Vec<u8>,
    dims: Vec<u64>,
    type_id: u32,
    /// `None`: placed at the next aligned offset after the previous tensor.
    offset: Option<u64>,
    data: Vec<u8>,
}

/// Builds GGUF bytes in memory (for tests and fuzz seeds).
///
/// Defaults: version 3, alignment 32, no metadata, no tensors. Tensors are laid out in order,
/// each at the next multiple of the alignment; the file ends right after the last tensor's data
/// (no trailing padding), so truncating it anywhere makes it invalid.
///
/// Arrays are written with the type of their first element (an empty array as `u8`); mixed
/// arrays therefore produce malformed files.
pub struct GgufWriter {
    magic: [u8; 4],
    version: u32,
    alignment: u64,
    entries: Vec<Entry>,
    tensors: Vec<WTensor>,
    kv_count: Option<u64>,
    tensor_count: Option<u64>,
    trailing: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment.
    pub fn new() -> GgufWriter {
        GgufWriter {
            magic: GGUF_MAGIC,
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            entries: Vec::new(),
            tensors: Vec::new(),
            kv_count: None,
            tensor_count: None,
            trailing: Vec::new(),
        }
    }

    /// Sets the version field (any value, for tests of rejected versions).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Adds `general.alignment = alignment` (u32) and lays the data out with it. A zero or
    /// non-power-of-two value is written as-is (readers must reject it); layout then keeps the
    /// previous alignment.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.add(ALIGNMENT_KEY, MetaValue::U32(alignment))
    }

    /// Adds a metadata pair. Adding `general.alignment` as a `u32` power of two also sets the
    /// layout alignment.
    pub fn add(&mut self, key: &str, value: MetaValue) -> &mut Self {
        if key == ALIGNMENT_KEY {
            if let MetaValue::U32(a) = value {
                if a.is_power_of_two() {
                    self.alignment = u64::from(a);
                }
            }
        }
        self.entries.push(Entry::Value(key.to_owned(), value));
        self
    }

    /// Adds a string value.
    pub fn add_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.add(key, MetaValue::String(value.to_owned()))
    }

    /// Adds a `u32` value.
    pub fn add_u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.add(key, MetaValue::U32(value))
    }

    /// Adds an `f32` value.
    pub fn add_f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.add(key, MetaValue::F32(value))
    }

    /// Adds a `bool` value.
    pub fn add_bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.add(key, MetaValue::Bool(value))
    }

    /// Adds an array of strings.
    pub fn add_str_array(&mut self, key: &str, values: &[&str]) -> &mut Self {
        let items = values.iter().map(|s| MetaValue::String((*s).to_owned()));
        self.add(key, MetaValue::Array(items.collect()))
    }

    /// Adds an array of `f32`.
    pub fn add_f32_array(&mut self, key: &str, values: &[f32]) -> &mut Self {
        let items = values.iter().map(|&v| MetaValue::F32(v));
        self.add(key, MetaValue::Array(items.collect()))
    }

    /// Adds an array of `i32`.
    pub fn add_i32_array(&mut self, key: &str, values: &[i32]) -> &mut Self {
        let items = values.iter().map(|&v| MetaValue::I32(v));
        self.add(key, MetaValue::Array(items.collect()))
    }

    /// Adds a pair verbatim: raw key bytes (need not be UTF-8), a value type id (need not be
    /// valid) and raw value bytes.
    pub fn add_raw_kv(&mut self, key: &[u8], type_id: u32, value: &[u8]) -> &mut Self {
        self.entries
            .push(Entry::Raw(key.to_vec(), type_id, value.to_vec()));
        self
    }

    /// Adds a tensor at the next aligned offset. `data` is written as given (its length is not
    /// checked against `dims`, so tests can write short data).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.add_tensor_raw(name.as_bytes(), dims, ggml_type.id(), None, data)
    }

    /// Adds a tensor with raw name bytes and type id, and optionally a forced data offset
    /// (relative to the data section; the data itself is still placed at the next aligned
    /// position).
    pub fn add_tensor_raw(
        &mut self,
        name: &[u8],
        dims: &[u64],
        type_id: u32,
        offset: Option<u64>,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(WTensor {
            name: name.to_vec(),
            dims: dims.to_vec(),
            type_id,
            offset,
            data,
        });
        self
    }

    /// Replaces the magic bytes.
    pub fn magic(&mut self, magic: [u8; 4]) -> &mut Self {
        self.magic = magic;
        self
    }

    /// Writes this metadata count instead of the real one.
    pub fn kv_count(&mut self, count: u64) -> &mut Self {
        self.kv_count = Some(count);
        self
    }

    /// Writes this tensor count instead of the real one.
    pub fn tensor_count(&mut self, count: u64) -> &mut Self {
        self.tensor_count = Some(count);
        self
    }

    /// Appends arbitrary bytes after the data section.
    pub fn trailing_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.trailing.extend_from_slice(bytes);
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        put_u32(&mut out, self.version);
        put_u64(
            &mut out,
            self.tensor_count.unwrap_or(self.tensors.len() as u64),
        );
        put_u64(&mut out, self.kv_count.unwrap_or(self.entries.len() as u64));
        for entry in &self.entries {
            match entry {
                Entry::Value(key, value) => {
                    put_str(&mut out, key.as_bytes());
                    put_u32(&mut out, value.type_id());
                    put_value(&mut out, value);
                }
                Entry::Raw(key, type_id, value) => {
                    put_str(&mut out, key);
                    put_u32(&mut out, *type_id);
                    out.extend_from_slice(value);
                }
            }
        }

        // Data layout: each tensor at the next aligned position.
        let align = self.alignment.max(1);
        let mut positions = Vec::with_capacity(self.tensors.len());
        let mut pos = 0u64;
        for t in &self.tensors {
            pos = pos.next_multiple_of(align);
            positions.push(pos);
            pos += t.data.len() as u64;
        }

        for (t, &p) in self.tensors.iter().zip(&positions) {
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.type_id);
            put_u64(&mut out, t.offset.unwrap_or(p));
        }

        if !self.tensors.is_empty() {
            let data_start = (out.len() as u64).next_multiple_of(align);
            for (t, &p) in self.tensors.iter().zip(&positions) {
                out.resize((data_start + p) as usize, 0);
                out.extend_from_slice(&t.data);
            }
        }
        out.extend_from_slice(&self.trailing);
        out
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// Writes a value's payload (without its type id).
fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_str(out, s.as_bytes()),
        MetaValue::Array(items) => {
            let elem = items.first().map_or(value_type::U8, MetaValue::type_id);
            put_u32(out, elem);
            put_u64(out, items.len() as u64);
            for item in items {
                // Nested arrays carry their own element type and length.
                put_value(out, item);
            }
        }
    }
}
