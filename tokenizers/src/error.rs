//! The crate's error type.

/// What went wrong building or running a tokenizer, and what to do about it.
#[derive(thiserror::Error, Debug)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a family this crate does not implement.
    #[error("unsupported tokenizer model '{model}' (tokenizer.ggml.model); supported: {supported}. Use a GGUF whose vocabulary is one of these")]
    UnsupportedModel {
        /// The model named in the metadata.
        model: String,
        /// The supported names, comma-separated.
        supported: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unknown pre-tokenizer '{pre}' (tokenizer.ggml.pre); known: {supported}. Add its regex list (from llama.cpp's llama-vocab.cpp) to edge-tokenizers' pretok.rs")]
    UnknownPreTokenizer {
        /// The value in the metadata.
        pre: String,
        /// The known values, comma-separated.
        supported: String,
    },
    /// The vocabulary has no tokens.
    #[error("the vocabulary is empty (tokenizer.ggml.tokens); the GGUF has no usable tokenizer")]
    EmptyVocab,
    /// A BPE vocabulary without merges.
    #[error("BPE vocabulary without merges (tokenizer.ggml.merges); re-convert the model with a current llama.cpp convert script")]
    MissingMerges,
    /// A per-token metadata array is shorter than the vocabulary.
    #[error(
        "{key} has {len} entries but the vocabulary has {n_vocab} tokens; the GGUF is inconsistent"
    )]
    ArrayTooShort {
        /// The metadata key.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// Metadata asks for a special token it does not define.
    #[error("tokenizer.ggml.{flag} is set, but tokenizer.ggml.{key} is missing or out of range; fix the metadata")]
    MissingSpecialToken {
        /// The flag asking for the token.
        flag: &'static str,
        /// The id key that is missing.
        key: &'static str,
    },
    /// Other inconsistent metadata.
    #[error("invalid tokenizer metadata: {what}")]
    Metadata {
        /// What is wrong.
        what: String,
    },
    /// A pre-tokenizer regex failed to compile or to run.
    #[error("pre-tokenizer regex {pattern:?}: {message}")]
    Regex {
        /// The regex as llama.cpp writes it.
        pattern: String,
        /// The regex engine's message.
        message: String,
    },
    /// The BPE model could not be built or failed on a word.
    #[error("BPE model: {message}")]
    Bpe {
        /// The HF tokenizers message.
        message: String,
    },
}
