//! What a constraint is ([`Constraint`]) and why one can be refused ([`ConstraintError`]).

/// What language a [`Constraint`]'s source is written in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConstraintKind {
    /// llama.cpp's GBNF grammar format (`root ::= ...`).
    Gbnf,
    /// A JSON Schema (as JSON text): the output is one JSON value valid for it.
    JsonSchema,
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex,
    /// llguidance's Lark-like grammar format (what GBNF and tool calls are translated to).
    Lark,
}

impl ConstraintKind {
    /// The name used in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            ConstraintKind::Gbnf => "grammar",
            ConstraintKind::JsonSchema => "JSON schema",
            ConstraintKind::Regex => "regex",
            ConstraintKind::Lark => "Lark grammar",
        }
    }
}

/// A constraint on a generation's output: its language and source text, and optionally a
/// trigger (see [`Constraint::lazy`]). Cheap to build; compiled when generation starts (or by
/// [`crate::model::Model::check_constraint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    /// The source's language.
    pub kind: ConstraintKind,
    /// The grammar, schema or pattern.
    pub source: String,
    /// With a trigger the output is free until this text appears; from the trigger's first
    /// byte on, the output must follow the constraint (whose language starts with the trigger).
    pub trigger: Option<String>,
}

impl Constraint {
    /// A llama.cpp GBNF grammar (its `root` rule is the output).
    pub fn gbnf(source: impl Into<String>) -> Constraint {
        Constraint::new(ConstraintKind::Gbnf, source)
    }

    /// A JSON Schema given as JSON text.
    pub fn json_schema(schema: impl Into<String>) -> Constraint {
        Constraint::new(ConstraintKind::JsonSchema, schema)
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    pub fn json_object() -> Constraint {
        Constraint::json_schema(r#"{"type": "object"}"#)
    }

    /// A regular expression the whole output matches.
    pub fn regex(pattern: impl Into<String>) -> Constraint {
        Constraint::new(ConstraintKind::Regex, pattern)
    }

    /// An llguidance Lark grammar.
    pub fn lark(source: impl Into<String>) -> Constraint {
        Constraint::new(ConstraintKind::Lark, source)
    }

    fn new(kind: ConstraintKind, source: impl Into<String>) -> Constraint {
        Constraint {
            kind,
            source: source.into(),
            trigger: None,
        }
    }

    /// This constraint applied only from the first appearance of `trigger` in the output (a
    /// lazy grammar, as llama.cpp's tool calls use): before it the output is free.
    pub fn lazy(mut self, trigger: impl Into<String>) -> Constraint {
        self.trigger = Some(trigger.into());
        self
    }
}

/// Why a constraint cannot be used: the message names the problem (for a JSON schema, the
/// unsupported keyword) and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {message}")]
pub struct ConstraintError {
    /// What was being compiled or checked ("JSON schema", "grammar", "regex", "tool call").
    pub what: String,
    /// The problem.
    pub message: String,
}

impl ConstraintError {
    pub(crate) fn new(what: impl Into<String>, message: impl Into<String>) -> ConstraintError {
        ConstraintError {
            what: what.into(),
            message: message.into(),
        }
    }
}

impl From<ConstraintError> for crate::error::EngineError {
    fn from(e: ConstraintError) -> Self {
        crate::error::EngineError::InvalidArgument(e.to_string())
    }
}
