//! Metadata values as GGUF stores them, with typed accessors and a short display form.

use std::fmt;

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
        use crate::format::value_type as t;
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
