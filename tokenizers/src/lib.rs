//! Tokenizers built from GGUF vocabulary metadata, behaving exactly as llama.cpp's, and chat
//! templates.
//!
//! The input is plain data ([`VocabConfig`], what a GGUF's `tokenizer.*` keys say); the engine
//! fills it from the file. Three model families are supported, as `tokenizer.ggml.model` names
//! them:
//! - `gpt2`: byte-level BPE (the merges run on the HF `tokenizers` crate's BPE model) after
//!   llama.cpp's pre-tokenizer for `tokenizer.ggml.pre`;
//! - `llama`: SentencePiece-style score-ordered merging with `<0xXX>` byte fallback;
//! - `bert`: WordPiece with llama.cpp's normalisation.
//!
//! Special (control, user-defined, unknown) tokens are split out of the text first, longest first,
//! as llama.cpp does. [`StreamDecoder`] turns generated ids into text without ever splitting a
//! UTF-8 character.
#![warn(missing_docs)]

pub mod chat;
mod config;
mod error;
mod pretok;
mod spm;
mod stream;
mod tokenizer;
mod unicode;
mod vocab;
mod wpm;

pub use config::{VocabConfig, SUPPORTED_MODELS};
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;

#[cfg(test)]
mod tests;
