//! The `tojson` filter: what Python's `json.dumps` writes with transformers' defaults.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// JSON output settings of `tojson`, as Python's `json.dumps` takes them.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// How deep `tojson` descends before giving up (values can be self-referential).
const MAX_JSON_DEPTH: usize = 128;

/// The most `tojson` writes: an indent string repeated per level and item multiplies the input,
/// so the output is checked as it grows, not after (16 MiB, the default cap of a whole render).
const MAX_JSON_BYTES: usize = 16 << 20;

fn too_large() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: output larger than {MAX_JSON_BYTES} bytes"),
    )
}

/// `tojson`: transformers' `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_owned())
            } else if let Some(n) = v.as_i64() {
                Some(" ".repeat(n.clamp(0, 64) as usize))
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn json_newline(out: &mut String, style: &JsonStyle, level: usize) -> Result<(), Error> {
    if let Some(ind) = &style.indent {
        if out.len() + 1 + level.saturating_mul(ind.len()) > MAX_JSON_BYTES {
            return Err(too_large());
        }
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
    Ok(())
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, level: usize) -> Result<(), Error> {
    if level > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    if out.len() > MAX_JSON_BYTES {
        return Err(too_large());
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_json_number(out, v),
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, level + 1)?;
                match k.as_str() {
                    Some(s) => write_json_str(out, s, style),
                    None => {
                        // Python turns non-string keys into strings: 1 -> "1", None -> "null".
                        let mut key = String::new();
                        write_json(&mut key, k, style, level + 1)?;
                        let key = key.trim_matches('"').to_owned();
                        write_json_str(out, &key, style);
                    }
                }
                out.push_str(&style.key_sep);
                let item = v.get_item(k)?;
                write_json(out, &item, style, level + 1)?;
            }
            json_newline(out, style, level)?;
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut first = true;
            out.push('[');
            for item in v.try_iter()? {
                if !first {
                    out.push_str(&style.item_sep);
                }
                first = false;
                json_newline(out, style, level + 1)?;
                write_json(out, &item, style, level + 1)?;
            }
            if !first {
                json_newline(out, style, level)?;
            }
            out.push(']');
        }
        // bytes, plain objects, ...: their string form.
        _ => write_json_str(out, &v.to_string(), style),
    }
    Ok(())
}

fn write_json_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        // any width, including i128 / u128
        let _ = write!(out, "{v}");
        return;
    }
    let Ok(f) = f64::try_from(v.clone()) else {
        let _ = write!(out, "{v}");
        return;
    };
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        // Python's repr of an integral float keeps ".0".
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f}");
    }
}

fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
