//! Constrained decoding: a grammar (llama.cpp's GBNF), a JSON schema or a regular expression
//! that every generated token must keep the output inside, so that the output parses by
//! construction.
//!
//! The work is done by [llguidance](https://github.com/guidance-ai/llguidance) (the library
//! llama.cpp and mistral.rs use): its token trie ([`toktrie`]) is built once per model from
//! edge-run's own vocabulary ([`ConstraintVocab`], cached in the [`Model`]), and at each step the
//! grammar's parser computes the set of tokens allowed next. The generator
//! ([`crate::generate`]) then
//! - masks the logits (disallowed tokens become -inf) before any sampler, greedy included;
//! - takes the token without sampling when exactly one is allowed (a forced token);
//! - allows an end-of-generation token only where the grammar accepts, and ends generation
//!   when the grammar admits nothing more.
//!
//! A constraint is a value ([`Constraint`]) attached to
//! [`GenerateOptions::constraint`](crate::generate::GenerateOptions::constraint), so each
//! generation (each request of a server) may carry its own. [`Model::check_constraint`]
//! compiles one up front, to refuse a bad grammar or an unsupported schema keyword before
//! anything runs. [`Constraint::lazy`] makes a constraint start only once a trigger text appears
//! (tool calls in "auto" mode, see [`tools`]).
//!
//! Per token, llguidance allocates: the mask it returns (a bit set of `n_vocab` bits, 6 KiB for
//! SmolLM2's 49,152 tokens) and its parser's working state. The unconstrained path allocates
//! nothing per token, as before.

mod gbnf;
mod guide;
pub mod tools;

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};

use crate::model::Model;

pub use gbnf::gbnf_to_lark;
pub(crate) use guide::Guide;

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
/// [`Model::check_constraint`]).
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

/// A model's vocabulary as llguidance sees it: the token trie and the grammar compiler, built
/// once per model ([`Model::constraint_vocab`]) and shared by every constrained generation.
pub struct ConstraintVocab {
    factory: ParserFactory,
    /// Every end-of-generation token of the model (the trie's EOS set).
    eog: Vec<u32>,
}

impl std::fmt::Debug for ConstraintVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintVocab")
            .field("n_vocab", &self.trie().vocab_size())
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

/// The prefix toktrie gives special tokens' bytes, so that no text can spell them.
const SPECIAL_MARKER: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

impl ConstraintVocab {
    /// Builds the trie from `model`'s tokenizer: each token's bytes; control tokens (and tokens
    /// that render to nothing) marked special, reachable only through a grammar naming them.
    pub fn new(model: &Model) -> Result<ConstraintVocab, ConstraintError> {
        let tok = &model.tokenizer;
        let n = model.params.n_vocab;
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = tok.piece(id);
            if tok.is_control(id) || piece.is_empty() {
                let mut w = vec![SPECIAL_MARKER];
                match tok.token_text(id) {
                    Some(t) if !t.is_empty() => w.extend_from_slice(t.as_bytes()),
                    _ => w.extend_from_slice(format!("<[unused {id}]>").as_bytes()),
                }
                words.push(w);
            } else {
                words.push(piece.to_vec());
            }
        }
        let mut eog: Vec<u32> = (0..n as u32).filter(|&i| tok.is_eog(i)).collect();
        if eog.is_empty() {
            eog.extend(tok.eos_id());
        }
        let Some(&first_eog) = eog.first() else {
            return Err(ConstraintError::new(
                "constrained decoding",
                "the model has no end-of-generation token, so a grammar could never end",
            ));
        };
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: first_eog,
            tok_bos: tok.bos_id(),
            tok_pad: tok.pad_id(),
            tok_unk: tok.unk_id(),
            tok_end_of_turn: tok.eot_id(),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::new("constrained decoding", e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(ConstraintVocab { factory, eog })
    }

    fn trie(&self) -> &TokTrie {
        self.factory.tok_env().tok_trie()
    }

    /// The model's end-of-generation tokens.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Compiles `c` into a matcher at the start of the output; the error names the problem.
    pub(crate) fn compile(&self, c: &Constraint) -> Result<Matcher, ConstraintError> {
        let what = c.kind.name();
        let grammar = match c.kind {
            ConstraintKind::Gbnf => {
                let lark = gbnf_to_lark(&c.source).map_err(|m| ConstraintError::new(what, m))?;
                TopLevelGrammar::from_lark(lark)
            }
            ConstraintKind::Lark => TopLevelGrammar::from_lark(c.source.clone()),
            ConstraintKind::Regex => TopLevelGrammar::from_regex(&c.source),
            ConstraintKind::JsonSchema => {
                let mut schema: serde_json::Value = serde_json::from_str(&c.source)
                    .map_err(|e| ConstraintError::new(what, format!("not valid JSON: {e}")))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(ConstraintError::new(
                        what,
                        "must be a JSON object (or true/false), e.g. {\"type\": \"object\"}",
                    ));
                }
                json_options().apply_to(&mut schema);
                TopLevelGrammar::from_json_schema(schema)
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::new(what, explain(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::new(what, explain(&e)));
        }
        Ok(matcher)
    }

    /// Greedy tokenization of `bytes` over the trie (text tokens only).
    pub(crate) fn tokenize_text(&self, bytes: &[u8]) -> Vec<u32> {
        self.trie().greedy_tokenize(bytes)
    }
}

/// How JSON is written under a schema: one line, with Python `json.dumps`'s separators (what
/// chat templates show models), no free whitespace (a small model would pad forever).
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

/// llguidance's message, with the fix for its most common refusal.
fn explain(msg: &str) -> String {
    let msg = msg.trim();
    if msg.contains("Unimplemented keys") || msg.contains("Unknown keys") {
        format!("{msg}: this schema keyword is not supported; remove it or express it with the supported ones (type, properties, required, enum, const, items, minItems/maxItems, minimum/maximum, pattern, minLength/maxLength, $ref/$defs, anyOf/oneOf/allOf)")
    } else {
        msg.to_string()
    }
}

impl Model {
    /// The vocabulary prepared for constrained decoding: built on first use (tens of
    /// milliseconds), then shared.
    pub fn constraint_vocab(&self) -> Result<&ConstraintVocab, ConstraintError> {
        if let Some(v) = self.constraint_vocab.get() {
            return Ok(v);
        }
        let v = ConstraintVocab::new(self)?;
        Ok(self.constraint_vocab.get_or_init(|| v))
    }

    /// Compiles `constraint` against this model's vocabulary without generating: a bad grammar,
    /// an invalid regex or an unsupported schema keyword is reported here, with its name.
    pub fn check_constraint(&self, constraint: &Constraint) -> Result<(), ConstraintError> {
        self.constraint_vocab()?.compile(constraint).map(|_| ())
    }
}
