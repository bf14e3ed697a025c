//! Constrained decoding: a grammar (llama.cpp's GBNF), a JSON schema or a regular expression
//! that every generated token must keep the output inside, so that the output parses by
//! construction.
//!
//! The work is done by [llguidance](https://github.com/guidance-ai/llguidance) (the library
//! llama.cpp and mistral.rs use): its token trie ([`toktrie`]) is built once per model from
//! edge-run's own vocabulary ([`ConstraintVocab`], cached in the [`crate::model::Model`]), and at each step the
//! grammar's parser computes the set of tokens allowed next. The generator
//! ([`crate::generate`]) then
//! - masks the logits (disallowed tokens become -inf) before any sampler, greedy included;
//! - takes the token without sampling when exactly one is allowed (a forced token);
//! - allows an end-of-generation token only where the grammar accepts, and ends generation
//!   when the grammar admits nothing more.
//!
//! A constraint is a value ([`Constraint`]) attached to
//! [`GenerateOptions::constraint`](crate::generate::GenerateOptions::constraint), so each
//! generation (each request of a server) may carry its own. [`crate::model::Model::check_constraint`]
//! compiles one up front, to refuse a bad grammar or an unsupported schema keyword before
//! anything runs. [`Constraint::lazy`] makes a constraint start only once a trigger text appears
//! (tool calls in "auto" mode, see [`tools`]).
//!
//! Per token, llguidance allocates: the mask it returns (a bit set of `n_vocab` bits, 6 KiB for
//! SmolLM2's 49,152 tokens) and its parser's working state. The unconstrained path allocates
//! nothing per token, as before.

mod gbnf;
mod guide;
mod spec;
pub mod tool_stream;
pub mod tools;
mod vocab;

pub use gbnf::gbnf_to_lark;
pub(crate) use guide::{Guide, OutputOnDevice};
pub use spec::{Constraint, ConstraintError, ConstraintKind};
pub use vocab::ConstraintVocab;
