//! The engine's error type: every variant says what went wrong, where, and how to fix it.

use crate::tensor::GgmlType;

/// Errors from loading a model, planning memory or running a session.
#[derive(thiserror::Error, Debug)]
pub enum EngineError {
    /// The GGUF file could not be read or is malformed.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] edge_tokenizers::TokenizerError),
    /// The model's architecture has no graph builder.
    #[error("unsupported architecture '{arch}' (general.architecture); supported: {supported}")]
    UnsupportedArchitecture {
        /// What the file says.
        arch: String,
        /// The architectures this build supports.
        supported: &'static str,
    },
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("metadata key '{key}': {problem}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("tensor '{name}' is missing: the file is not a complete {arch} model")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Architecture that needs it.
        arch: String,
    },
    /// A tensor has the wrong shape for the hyper-parameters.
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?} from the model's metadata")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape in the file (ggml order).
        got: Vec<u64>,
        /// Shape the metadata implies.
        expected: Vec<u64>,
    },
    /// A tensor's type has no kernels in this build.
    #[error("tensor '{name}' has type {ty}, which this build cannot compute with yet (supported: f32, f16, bf16, q8_0, q4_0, q4_1)")]
    UnsupportedTensorType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A run asked for more positions than the context holds.
    #[error("{what}: {needed} tokens do not fit in the context of {ctx} tokens; use a larger --ctx (the model supports up to {max}) or a shorter prompt")]
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
    #[error("{what}: the context of {ctx} tokens is full and a shift cannot make room for {needed} more: the first {keep} positions are kept; use a smaller --keep or a larger --ctx")]
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
    #[error("{}", budget_line(.0))]
    Budget(Box<edge_targets::BudgetError>),
    /// A bad argument to the library or the CLI.
    #[error("{0}")]
    InvalidArgument(String),
    /// The memory planner failed (a bug, reported instead of panicking).
    #[error("memory plan: {0}")]
    Plan(String),
    /// A kernel reported an error (a bug, reported instead of panicking).
    #[error("kernel: {0}")]
    Kernel(String),
    /// The compute device failed or is unavailable (CUDA: no driver or device, an allocation
    /// that does not fit, a kernel error), or this build lacks its backend.
    #[error("{0}")]
    Device(String),
    /// An I/O error with the file it concerns.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// One line: needed vs budget per component, and the fix.
fn budget_line(e: &edge_targets::BudgetError) -> String {
    use edge_targets::format_size as fs;
    let d = &e.demand;
    let weights = if e.budget.count_weights {
        format!(" + weights {}", fs(d.weights))
    } else {
        String::new()
    };
    let fix = match e.largest_fitting_ctx {
        Some(ctx) => format!("use --ctx {ctx} or less, or a larger --mem-budget"),
        None => "even the smallest context does not fit: use a larger --mem-budget".to_string(),
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

/// Result with [`EngineError`].
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
