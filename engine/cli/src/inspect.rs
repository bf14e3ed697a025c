//! The commands that read a GGUF file without running it: `tokenize` and `inspect`.

use std::io::Write;
use std::path::Path;

use edge_tokenizers::Tokenizer;

use crate::args::{InspectArgs, TokenizeArgs};
use crate::errors::{engine_error, open_gguf, CliResult};

fn tokenizer_of(path: &Path) -> CliResult<Tokenizer> {
    let gguf = open_gguf(path)?;
    let cfg = edge_engine::model::vocab::vocab_config_from_gguf(&gguf)
        .map_err(|e| engine_error(path, e))?;
    Tokenizer::from_config(cfg).map_err(|e| format!("{}: tokenizer: {e}", path.display()).into())
}

/// `edge-run tokenize`: the ids of a text as a JSON array.
pub fn tokenize(a: TokenizeArgs) -> CliResult {
    let text = if a.stdin {
        crate::output::read_text(std::io::stdin().lock(), "standard input")?
    } else {
        a.text.unwrap_or_default()
    };
    let tok = tokenizer_of(&a.model)?;
    let ids = tok
        .encode(&text, a.add_special, a.special)
        .map_err(|e| format!("{}: tokenizer: {e}", a.model.display()))?;
    let json = serde_json::to_string(&ids).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}

/// `edge-run inspect`: a GGUF file's metadata and tensor table.
pub fn inspect(a: InspectArgs) -> CliResult {
    let g = open_gguf(&a.model)?;
    let mut lines = Vec::new();
    lines.push(format!(
        "{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}, {} bytes",
        a.model.display(),
        g.version(),
        g.metadata().len(),
        g.tensors().len(),
        g.alignment(),
        g.data_offset(),
        g.file_size()
    ));
    lines.push(String::new());
    lines.push("metadata:".into());
    for (key, value) in g.metadata() {
        let shown = match value {
            edge_engine::gguf::MetaValue::Array(items) if a.full => {
                format!("{} {:?}", value.type_name(), items)
            }
            edge_engine::gguf::MetaValue::String(s) if a.full => format!("{s:?}"),
            _ => value.to_string(),
        };
        let shown = if !a.full && shown.chars().count() > 160 {
            let cut: String = shown.chars().take(157).collect();
            format!("{cut}...")
        } else {
            shown
        };
        lines.push(format!("  {key:<42} {}", shown.replace('\n', "\\n")));
    }
    if g.tensors().is_empty() {
        lines.push(String::new());
        lines.push("no tensors (a vocabulary-only file)".into());
    } else {
        lines.push(String::new());
        lines.push(format!(
            "  {:<40} {:<8} {:<22} {:>12} {:>12}",
            "tensor", "type", "dims", "bytes", "offset"
        ));
        let mut by_type: std::collections::BTreeMap<&'static str, (usize, u64)> =
            Default::default();
        for t in g.tensors() {
            let dims = format!("{:?}", t.dims);
            lines.push(format!(
                "  {:<40} {:<8} {:<22} {:>12} {:>12}",
                t.name,
                t.ggml_type.name(),
                dims,
                t.n_bytes,
                t.offset
            ));
            let e = by_type.entry(t.ggml_type.name()).or_default();
            e.0 += 1;
            e.1 += t.n_bytes;
        }
        lines.push(String::new());
        let total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
        let types: Vec<String> = by_type
            .iter()
            .map(|(ty, (n, b))| format!("{ty}: {n} tensors, {:.1} MiB", *b as f64 / 1048576.0))
            .collect();
        lines.push(format!(
            "weights: {:.1} MiB ({})",
            total as f64 / 1048576.0,
            types.join("; ")
        ));
    }
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| format!("writing output: {e}"))?;
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}
