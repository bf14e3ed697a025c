//! The engine's error type: every variant says what went wrong, where, and how to fix it.
//!
//! A fix often names a setting ("use a larger ctx"). The library names settings as its own API
//! does ([`Setting::name`]: `ctx`, `kv_type`, `temperature`), never as a front end spells them:
//! an error keeps the setting as a [`Setting`] inside a [`Hint`], and each front end renders it
//! with its own names ([`EngineError::render`]): the `edge-run` CLI as its flags (`--ctx`), the
//! C API as its struct fields (`n_ctx`). `Display` uses the library's names.

use std::fmt;

use edge_gguf::GgmlType;

/// A setting of a session, an embedder, a sampler or a budget, as the library names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// `SessionConfig::ctx`: context size in tokens.
    Ctx,
    /// `SessionConfig::ubatch`: tokens per prefill run.
    Ubatch,
    /// `SessionConfig::threads` / `EmbedConfig::threads`.
    Threads,
    /// `SessionConfig::kv_type`: the KV cache's element type.
    KvType,
    /// `SessionConfig::flash_attn`: tiled attention.
    FlashAttn,
    /// `SessionConfig::device`: where a session runs.
    Device,
    /// `ContextPolicy::Shift`: shifting the context when it is full.
    ContextShift,
    /// `ContextPolicy::Shift { keep }`: positions a context shift never drops.
    Keep,
    /// `EmbedConfig::max_tokens`: the longest text an embedder takes.
    MaxTokens,
    /// `EmbedConfig::pooling`.
    Pooling,
    /// The memory budget (`edge_targets::Budget::limit_bytes`).
    Budget,
    /// `SamplerConfig::temperature`.
    Temperature,
    /// `SamplerConfig::top_k`.
    TopK,
    /// `SamplerConfig::top_p`.
    TopP,
    /// `SamplerConfig::min_p`.
    MinP,
    /// `SamplerConfig::repeat_penalty`.
    RepeatPenalty,
    /// `SamplerConfig::repeat_last_n`.
    RepeatLastN,
    /// `SamplerConfig::seed`.
    Seed,
}

impl Setting {
    /// The library's name: the field that holds the setting (`ctx`, `kv_type`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Setting::Ctx => "ctx",
            Setting::Ubatch => "ubatch",
            Setting::Threads => "threads",
            Setting::KvType => "kv_type",
            Setting::FlashAttn => "flash_attn",
            Setting::Device => "device",
            Setting::ContextShift => "context_shift",
            Setting::Keep => "keep",
            Setting::MaxTokens => "max_tokens",
            Setting::Pooling => "pooling",
            Setting::Budget => "budget",
            Setting::Temperature => "temperature",
            Setting::TopK => "top_k",
            Setting::TopP => "top_p",
            Setting::MinP => "min_p",
            Setting::RepeatPenalty => "repeat_penalty",
            Setting::RepeatLastN => "repeat_last_n",
            Setting::Seed => "seed",
        }
    }
}

/// How a reader names settings: [`Setting::name`] for the library's own messages; a front end
/// passes its own (the CLI its flags).
pub type SettingNames<'a> = &'a dyn Fn(Setting) -> &'static str;

/// Words that may name settings, kept apart so that each reader sees its own names (see the
/// module docs). Build one with [`hint!`](crate::hint) or [`Hint::text`] / [`Hint::setting`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hint(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Setting(Setting),
}

impl Hint {
    /// An empty hint.
    pub fn new() -> Hint {
        Hint::default()
    }

    /// Appends words.
    pub fn text(mut self, text: impl Into<String>) -> Hint {
        self.0.push(Piece::Text(text.into()));
        self
    }

    /// Appends the name of a setting.
    pub fn setting(mut self, setting: Setting) -> Hint {
        self.0.push(Piece::Setting(setting));
        self
    }

    /// Appends another hint.
    pub fn then(mut self, more: Hint) -> Hint {
        self.0.extend(more.0);
        self
    }

    /// The settings the hint names, in order.
    pub fn settings(&self) -> impl Iterator<Item = Setting> + '_ {
        self.0.iter().filter_map(|p| match p {
            Piece::Setting(s) => Some(*s),
            Piece::Text(_) => None,
        })
    }

    /// The text with settings named by `names`.
    pub fn render(&self, names: SettingNames<'_>) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Setting(s) => out.push_str(names(*s)),
            }
        }
        out
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&Setting::name))
    }
}

impl From<String> for Hint {
    fn from(text: String) -> Hint {
        Hint::new().text(text)
    }
}

impl From<&str> for Hint {
    fn from(text: &str) -> Hint {
        Hint::new().text(text)
    }
}

impl From<Setting> for Hint {
    fn from(s: Setting) -> Hint {
        Hint::new().setting(s)
    }
}

/// A [`Hint`] from pieces: strings (`&str`, `String`) and [`Setting`]s, in order:
/// `hint!["use a larger ", Setting::Ctx, " or a shorter prompt"]`.
#[macro_export]
macro_rules! hint {
    ($($piece:expr),* $(,)?) => {
        $crate::error::Hint::new()$(.then($crate::error::Hint::from($piece)))*
    };
}

/// Errors from loading a model, planning memory or running a session.
#[derive(Debug)]
pub enum EngineError {
    /// The GGUF file could not be read or is malformed.
    Gguf(edge_gguf::GgufError),
    /// The tokenizer could not be built or used.
    Tokenizer(edge_tokenizers::TokenizerError),
    /// The model's architecture has no graph builder.
    UnsupportedArchitecture {
        /// What the file says.
        arch: String,
        /// The architectures this build supports.
        supported: &'static str,
    },
    /// A metadata key the architecture needs is missing or has the wrong type.
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor the architecture needs is not in the file.
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Architecture that needs it.
        arch: String,
    },
    /// A tensor has the wrong shape for the hyper-parameters.
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape in the file (ggml order).
        got: Vec<u64>,
        /// Shape the metadata implies.
        expected: Vec<u64>,
    },
    /// A tensor's type has no kernels in this build.
    UnsupportedTensorType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A run asked for more positions than the context holds.
    ContextFull {
        /// What overflowed ("prompt", "generation").
        what: &'static str,
        /// Tokens needed.
        needed: usize,
        /// The session's context size.
        ctx: usize,
        /// The model's trained context.
        max: usize,
    },
    /// A context shift cannot make room: the kept positions leave nothing to drop.
    ContextShift {
        /// What needed room ("prompt", "generation").
        what: &'static str,
        /// Positions needed.
        needed: usize,
        /// Positions kept at the start.
        keep: usize,
        /// The session's context size.
        ctx: usize,
    },
    /// The session would not fit in the memory budget; nothing was allocated.
    Budget(Box<edge_targets::BudgetError>),
    /// A setting has a value the library cannot use: names the setting, its value, the
    /// problem and the fix.
    InvalidSetting {
        /// The setting.
        setting: Setting,
        /// Its value, as given.
        value: String,
        /// What is wrong and what to do, naming settings through the [`Hint`].
        message: Hint,
    },
    /// What the model or this build cannot do (a context shift of a sliding-window model, an
    /// architecture the CUDA backend lacks): the reason and the way around it.
    Unsupported(Hint),
    /// A bad argument to a library call that is no setting (a token id outside the
    /// vocabulary, an empty prompt).
    InvalidArgument(String),
    /// The memory planner failed (a bug, reported instead of panicking).
    Plan(String),
    /// A kernel reported an error (a bug, reported instead of panicking).
    Kernel(String),
    /// The compute device failed or is unavailable (CUDA: no driver or device, an allocation
    /// that does not fit, a kernel error), or this build lacks its backend.
    Device(Hint),
    /// The session's memory could not be allocated.
    OutOfMemory(Hint),
    /// The caller's interrupt flag ([`crate::session::Session::set_interrupt`]) was raised
    /// during a run; the positions processed before it are kept.
    Interrupted {
        /// Positions of this call processed before the interrupt was seen.
        processed: usize,
        /// Positions this call was asked to process.
        requested: usize,
    },
    /// A run produced values that are not finite (NaN or infinite): the weights or the
    /// hyper-parameters cannot be computed with. Nothing is sampled from them.
    NonFinite {
        /// What was not finite ("the logits", "the embedding").
        what: &'static str,
        /// The position of the token they were computed for.
        position: usize,
    },
    /// A saved session state cannot be loaded into this session (another model or session
    /// shape, a truncated or damaged file); the session is unchanged.
    State {
        /// The state file.
        path: String,
        /// What is wrong with it.
        error: StateError,
    },
    /// An I/O error with the file it concerns.
    Io {
        /// File path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<edge_gguf::GgufError> for EngineError {
    fn from(e: edge_gguf::GgufError) -> EngineError {
        EngineError::Gguf(e)
    }
}

impl From<edge_tokenizers::TokenizerError> for EngineError {
    fn from(e: edge_tokenizers::TokenizerError) -> EngineError {
        EngineError::Tokenizer(e)
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Gguf(e) => e.source(),
            EngineError::Tokenizer(e) => Some(e),
            EngineError::Budget(e) => Some(e.as_ref()),
            EngineError::Io { source, .. } => Some(source),
            EngineError::State { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&Setting::name))
    }
}

impl EngineError {
    /// A setting whose value cannot be used; `message` says why, naming settings as hints do.
    pub fn invalid_setting(
        setting: Setting,
        value: impl fmt::Display,
        message: Hint,
    ) -> EngineError {
        EngineError::InvalidSetting {
            setting,
            value: value.to_string(),
            message,
        }
    }

    /// The setting this error is about, if it is about one (the fix may name others).
    pub fn setting(&self) -> Option<Setting> {
        match self {
            EngineError::InvalidSetting { setting, .. } => Some(*setting),
            EngineError::ContextFull { .. } => Some(Setting::Ctx),
            EngineError::ContextShift { .. } => Some(Setting::Keep),
            EngineError::Budget(_) => Some(Setting::Budget),
            EngineError::Unsupported(h) | EngineError::Device(h) | EngineError::OutOfMemory(h) => {
                h.settings().next()
            }
            _ => None,
        }
    }

    /// The message with settings named by `names` (the CLI passes its flags: `--ctx`); `Display`
    /// is this with [`Setting::name`].
    pub fn render(&self, names: SettingNames<'_>) -> String {
        match self {
            EngineError::Gguf(e) => e.to_string(),
            EngineError::Tokenizer(e) => format!("tokenizer: {e}"),
            EngineError::UnsupportedArchitecture { arch, supported } => format!(
                "unsupported architecture '{arch}' (general.architecture); supported: {supported}"
            ),
            EngineError::Metadata { key, problem } => format!("metadata key '{key}': {problem}"),
            EngineError::MissingTensor { name, arch } => {
                format!("tensor '{name}' is missing: the file is not a complete {arch} model")
            }
            EngineError::TensorShape {
                name,
                got,
                expected,
            } => format!(
                "tensor '{name}' has shape {got:?}, expected {expected:?} from the model's metadata"
            ),
            EngineError::UnsupportedTensorType { name, ty } => format!(
                "tensor '{name}' has type {ty}, which this build cannot compute with yet (supported: {})",
                GgmlType::names_where(|b| b.cpu)
            ),
            EngineError::ContextFull {
                what,
                needed,
                ctx,
                max,
            } => format!(
                "{what}: {needed} tokens do not fit in the context of {ctx} tokens; use a larger {} (the model supports up to {max}) or a shorter prompt",
                names(Setting::Ctx)
            ),
            EngineError::ContextShift {
                what,
                needed,
                keep,
                ctx,
            } => format!(
                "{what}: the context of {ctx} tokens is full and a shift cannot make room for {needed} more: the first {keep} positions are kept; use a smaller {} or a larger {}",
                names(Setting::Keep),
                names(Setting::Ctx)
            ),
            EngineError::Budget(e) => budget_line(e, names),
            EngineError::InvalidSetting { message, .. } => message.render(names),
            EngineError::Unsupported(h) | EngineError::Device(h) | EngineError::OutOfMemory(h) => {
                h.render(names)
            }
            EngineError::InvalidArgument(m) => m.clone(),
            EngineError::Plan(m) => format!("memory plan: {m}"),
            EngineError::Kernel(m) => format!("kernel: {m}"),
            EngineError::Interrupted { processed, requested } => format!(
                "interrupted after {processed} of {requested} tokens; the processed tokens are kept"
            ),
            EngineError::NonFinite { what, position } => format!(
                "{what} at position {position} are not finite (NaN or infinite): the model's weights or hyper-parameters are broken; re-download or re-convert the file"
            ),
            EngineError::Io { path, source } => format!("{path}: {source}"),
            EngineError::State { path, error } => format!("{path}: {error}"),
        }
    }
}

/// One line: needed vs budget per component, and the fix.
fn budget_line(e: &edge_targets::BudgetError, names: SettingNames<'_>) -> String {
    use edge_targets::format_size as fs;
    let d = &e.demand;
    let weights = if e.budget.count_weights {
        format!(" + weights {}", fs(d.weights))
    } else {
        String::new()
    };
    let (ctx, budget) = (names(Setting::Ctx), names(Setting::Budget));
    let fix = match e.largest_fitting_ctx {
        Some(c) => format!("use {ctx} {c} or less, or a larger {budget}"),
        None => format!("even the smallest context does not fit: use a larger {budget}"),
    };
    format!(
        "memory budget exceeded: need {} (kv cache {} + arena {} + scratch {}{weights}), budget {}; {fix}",
        fs(e.needed()),
        fs(d.kv),
        fs(d.arena),
        fs(d.scratch),
        fs(e.budget.limit_bytes)
    )
}

/// Why a state file cannot be loaded into this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The file does not start with [`crate::session::state::STATE_MAGIC`]: it is no saved
    /// session state.
    NotAState,
    /// The file was written in another format version.
    Version {
        /// The file's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The file is shorter than its header says (an interrupted copy or a full disk).
    Truncated {
        /// Bytes the header implies.
        expected: u64,
        /// Bytes the file has.
        found: u64,
    },
    /// The file's checksum does not match its bytes, or a field holds an impossible value.
    Damaged(String),
    /// The state was saved with another model file.
    OtherModel {
        /// The size of the model file the state was saved with.
        saved_size: u64,
        /// The size of this session's model file.
        model_size: u64,
        /// Whether the header hashes differ too (same size, other metadata or tensors).
        same_size: bool,
    },
    /// The state was saved by a session of another shape (context, KV type, ...).
    Shape {
        /// What differs: "context", "KV type", "layers", "KV heads", "head size",
        /// "layer rows (ubatch)".
        what: &'static str,
        /// The file's value.
        saved: String,
        /// This session's value.
        session: String,
    },
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::NotAState => {
                f.write_str("not an edge-run session state file (no EDGERUNS magic)")
            }
            StateError::Version { found, supported } => write!(
                f,
                "the state file has format version {found}, this build reads version {supported}: save the state again with this build"
            ),
            StateError::Truncated { expected, found } => write!(
                f,
                "the state file is truncated ({found} of {expected} bytes): save the state again"
            ),
            StateError::Damaged(what) => {
                write!(f, "the state file is damaged ({what}): save the state again")
            }
            StateError::OtherModel {
                saved_size,
                model_size,
                same_size,
            } => {
                if *same_size {
                    write!(f, "the state was saved with another model file (same size, {saved_size} bytes, but another header): load it with the model it was saved with")
                } else {
                    write!(f, "the state was saved with another model file ({saved_size} bytes; this model has {model_size}): load it with the model it was saved with")
                }
            }
            StateError::Shape {
                what,
                saved,
                session,
            } => write!(
                f,
                "the state was saved by a session with {what} {saved}, this session has {session}: open the session with the same settings"
            ),
        }
    }
}

impl std::error::Error for StateError {}

/// Result with [`EngineError`].
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: Setting) -> &'static str {
        match s {
            Setting::Ctx => "--ctx",
            Setting::Keep => "--keep",
            _ => "--other",
        }
    }

    #[test]
    fn settings_render_with_the_readers_names() {
        let h = hint!["use a larger ", Setting::Ctx, format!(" (up to {})", 8)];
        assert_eq!(h.to_string(), "use a larger ctx (up to 8)");
        assert_eq!(h.render(&flags), "use a larger --ctx (up to 8)");
        assert_eq!(h.settings().collect::<Vec<_>>(), [Setting::Ctx]);
        let e = EngineError::ContextShift {
            what: "generation",
            needed: 1,
            keep: 4,
            ctx: 4,
        };
        assert!(
            e.to_string()
                .ends_with("use a smaller keep or a larger ctx"),
            "{e}"
        );
        assert!(e
            .render(&flags)
            .ends_with("use a smaller --keep or a larger --ctx"));
        assert_eq!(e.setting(), Some(Setting::Keep));
        let e = EngineError::invalid_setting(
            Setting::Ctx,
            0,
            hint![Setting::Ctx, " must be at least 1"],
        );
        assert_eq!(e.render(&flags), "--ctx must be at least 1");
        assert_eq!(e.setting(), Some(Setting::Ctx));
    }
}
