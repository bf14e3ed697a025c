//! Errors as the user sees them: one line on stderr naming the problem and the fix, exit
//! status 2 for a bad command line, [`EXIT_MODEL_CHANGED`] when the model file changed under a
//! running session, and 1 for anything else. Engine errors name settings as the
//! library does; here they are rendered with the flags that set them ([`flag`]).

use std::path::Path;

use edge_engine::error::{EngineError, Hint, Setting};
use edge_engine::gguf::{Gguf, GgufError};
use edge_engine::model::Model;

/// Exit status for a bad command line.
pub const EXIT_USAGE: u8 = 2;

/// Exit status when the model file was truncated or rewritten while a session used it (as an
/// error between runs, or from the SIGBUS handler of [`crate::signals`] during one).
pub const EXIT_MODEL_CHANGED: u8 = 3;

/// An error for the one line on stderr, and the exit status it ends with.
pub struct CliError {
    pub msg: String,
    pub code: u8,
}

impl CliError {
    /// A bad command line (exit status 2).
    pub fn usage(msg: impl Into<String>) -> CliError {
        CliError {
            msg: msg.into(),
            code: EXIT_USAGE,
        }
    }
}

impl From<String> for CliError {
    fn from(msg: String) -> CliError {
        CliError { msg, code: 1 }
    }
}

impl From<&str> for CliError {
    fn from(msg: &str) -> CliError {
        msg.to_string().into()
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;

/// One line from a clap error: the message, its context line(s) and any "similar argument"
/// tip, then where to look.
pub fn clap_error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut line = String::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if l.is_empty() || (l.starts_with("tip:") && l.contains("as a value, use '--")) {
            continue;
        }
        let l = l.strip_prefix("error: ").unwrap_or(l);
        if line.is_empty() {
            line.push_str(l);
        } else if line.ends_with(':') {
            line.push(' ');
            line.push_str(l);
        } else {
            line.push_str("; ");
            line.push_str(l);
        }
    }
    if line.is_empty() {
        line.push_str("invalid arguments");
    }
    // `edge-run MODEL "some text"`: clap reads the text as a subcommand name.
    if let Some(rest) = line.strip_prefix("the subcommand '") {
        if let Some((word, _)) = rest.split_once("' cannot be used with") {
            line = format!(
                "unexpected argument '{word}' after the model: give the prompt with -p (edge-run MODEL -p \"{word}\")"
            );
        }
    }
    let sub = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .filter(|a| {
            [
                "tokenize",
                "inspect",
                "plan",
                "bench",
                "embed",
                "chat",
                "serve",
                "perplexity",
            ]
            .contains(&a.as_str())
        });
    match sub {
        Some(sub) => format!("{line} (see edge-run {sub} --help)"),
        None => format!("{line} (see edge-run --help)"),
    }
}

/// Opens a GGUF, turning its errors into one line that names the file and the fix.
pub fn open_gguf(path: &Path) -> CliResult<Gguf> {
    if path.is_dir() {
        return Err(format!(
            "{} is a directory: give the path of a .gguf file",
            path.display()
        )
        .into());
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Err(format!(
            "{} is empty (0 bytes): the download or conversion failed; fetch the file again",
            path.display()
        )
        .into());
    }
    Gguf::open(path).map_err(|e| gguf_error(path, &e).into())
}

pub fn gguf_error(path: &Path, e: &GgufError) -> String {
    let p = path.display();
    match e {
        GgufError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            format!("{p}: no such file: check the path (scripts/fetch-model.sh downloads the default model)")
        }
        GgufError::Io { .. } => format!("{e}: give the path of a readable .gguf file"),
        GgufError::BadMagic { .. } => {
            format!("{p}: {e}: give a model in GGUF format (llama.cpp's converters write it)")
        }
        GgufError::UnsupportedVersion { .. } => format!("{p}: {e}"),
        GgufError::Truncated { .. }
        | GgufError::CountTooLarge { .. }
        | GgufError::TensorOutOfRange { .. } => {
            format!("{p}: {e}: the file is incomplete or damaged; download or convert it again")
        }
        _ => format!("{p}: {e}: the file is malformed; convert it again"),
    }
}

/// An engine error about the model file at `path`, as one line naming the file and the fix.
pub fn engine_error(path: &Path, e: EngineError) -> String {
    match e {
        EngineError::Gguf(g) => gguf_error(path, &g),
        EngineError::UnsupportedArchitecture { .. } => format!(
            "{}: {}: use a model of a supported architecture",
            path.display(),
            hint(&e)
        ),
        e => format!("{}: {}", path.display(), hint(&e)),
    }
}

/// The command-line flag that sets each engine setting.
pub fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Ctx => "--ctx",
        Setting::Ubatch => "--ubatch",
        Setting::Threads => "--threads",
        Setting::KvType => "--kv-type",
        Setting::FlashAttn => "--flash-attn",
        Setting::Device => "--device",
        Setting::ContextShift => "--ctx-shift",
        Setting::Keep => "--keep",
        Setting::MaxTokens => "--max-tokens",
        Setting::Pooling => "--pooling",
        Setting::Budget => "--mem-budget",
        Setting::Temperature => "--temp",
        Setting::TopK => "--top-k",
        Setting::TopP => "--top-p",
        Setting::MinP => "--min-p",
        Setting::RepeatPenalty => "--repeat-penalty",
        Setting::RepeatLastN => "--repeat-last-n",
        Setting::Seed => "--seed",
        other => other.name(),
    }
}

/// An engine error as the user sees it: its settings named by their flags (`--ctx`).
pub fn hint(e: &EngineError) -> String {
    e.render(&flag)
}

/// A [`Hint`] (a reason the engine gives) as the user sees it.
pub fn hint_text(h: &Hint) -> String {
    h.render(&flag)
}

/// Opens a model for a command that runs it: vocabulary-only files are refused with the
/// command that takes them; errors name the file and the fix.
pub fn load_model(path: &Path) -> CliResult<Model> {
    let mark = edge_engine::model::LoadMark::now();
    let gguf = open_gguf(path)?;
    if gguf.tensors().is_empty() {
        return Err(format!(
            "{} has no tensors: it is a vocabulary-only GGUF, not a model; give a model file \
             (a vocabulary works with `edge-run tokenize`)",
            path.display()
        )
        .into());
    }
    let model = Model::from_gguf_since(gguf, mark).map_err(|e| engine_error(path, e))?;
    crate::signals::exit_on_model_fault(path, model.gguf().mapped_bytes());
    Ok(model)
}

/// Generation and benchmarks need a decoder; an encoder gets the command that fits it.
pub fn refuse_encoder(path: &Path, model: &Model) -> CliResult {
    if model.layout.is_encoder() {
        return Err(format!(
            "{}: {} is an encoder (embedding) model: it computes embeddings, not text; use `edge-run embed {} TEXT...`",
            path.display(),
            model.params.arch,
            path.display()
        )
        .into());
    }
    Ok(())
}

impl From<EngineError> for CliError {
    fn from(e: EngineError) -> CliError {
        let code = match e {
            EngineError::Gguf(GgufError::Changed { .. }) => EXIT_MODEL_CHANGED,
            _ => 1,
        };
        CliError {
            msg: hint(&e),
            code,
        }
    }
}
