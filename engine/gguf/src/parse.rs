//! Parsing and validating the header: metadata, tensor infos and the data section's bounds,
//! every count and length checked against the bytes left before anything is allocated.

use std::collections::HashSet;

use crate::error::GgufError;
use crate::format::{
    value_type, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
use crate::types::GgmlType;
use crate::value::MetaValue;

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

/// The parsed header.
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, MetaValue)>,
    pub(crate) tensors: Vec<TensorInfo>,
}

/// Smallest encoding of one metadata pair: empty key (8) + type (4) + 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4)
/// + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header, GgufError> {
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
