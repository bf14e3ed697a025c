//! What the commands print: lines on stdout, sizes in MiB, and the memory report shared by
//! `plan` for decoders and encoders; and the one way they read text from a file or stdin.

use std::io::{Read, Write};

use edge_engine::plan::MemoryReport;

use crate::errors::CliResult;

/// The most text read from a file or standard input: no context holds more (a million tokens
/// are a few MiB of text), and `-f /dev/zero` must not read until memory runs out.
pub const MAX_TEXT_BYTES: u64 = 16 << 20;

/// Reads at most [`MAX_TEXT_BYTES`] of UTF-8 text from `input`; `what` names it in errors
/// ("the prompt file x.txt", "standard input").
pub fn read_text(input: impl Read, what: &str) -> CliResult<String> {
    let mut buf = Vec::new();
    input
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if buf.len() as u64 > MAX_TEXT_BYTES {
        return Err(format!(
            "{what} is larger than {} MiB, more text than any context holds: give a shorter text",
            MAX_TEXT_BYTES >> 20
        )
        .into());
    }
    String::from_utf8(buf).map_err(|e| {
        format!(
            "{what} is not UTF-8 text (invalid byte at offset {}): convert it to UTF-8",
            e.utf8_error().valid_up_to()
        )
        .into()
    })
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / 1048576.0)
}

/// Writes `lines` to stdout and flushes.
pub fn write_lines(lines: &[String]) -> CliResult {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| format!("writing output: {e}"))?;
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}

/// The fields `plan --json` prints for every kind of model: the budget, the largest context
/// that fits it, and the memory report.
pub fn memory_json(
    r: &MemoryReport,
    max_ctx: Option<usize>,
    budget: Option<&edge_targets::Budget>,
) -> serde_json::Value {
    serde_json::json!({
        "max_ctx": max_ctx,
        "budget_bytes": budget.map(|b| b.limit_bytes),
        "budget_counts_weights": budget.map(|b| b.count_weights),
        "weights_bytes": r.weights_bytes,
        "kv_bytes": r.kv_bytes,
        "arena_bytes": r.arena_bytes,
        "arena_lower_bound_bytes": r.arena_lower_bound_bytes,
        "scratch_bytes": r.scratch_bytes,
        "runtime_bytes": r.runtime_bytes,
        "owned_bytes": r.owned_bytes(),
        "total_bytes": r.total_bytes(),
    })
}

/// Adds the fields of the object `more` to the object `v`.
pub fn extend_json(v: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(v), serde_json::Value::Object(more)) = (v.as_object_mut(), more) {
        v.extend(more);
    }
}

/// One line of `plan`'s memory table: name, MiB, bytes, and what it is.
pub fn memory_row(name: &str, bytes: u64, note: String) -> String {
    format!("  {name:<28} {:>12} {bytes:>14} B  {note}", mib(bytes))
}
