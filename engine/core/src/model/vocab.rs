//! Reads a GGUF's `tokenizer.ggml.*` metadata into the tokenizer crate's plain-data
//! [`VocabConfig`].

use edge_tokenizers::{Tokenizer, VocabConfig};

use crate::error::{EngineError, Result};
use edge_gguf::Gguf;

fn bad_type(key: &str, what: &str) -> EngineError {
    EngineError::Metadata {
        key: key.to_string(),
        problem: format!("present but not {what}; the GGUF is malformed"),
    }
}

/// A key that is either absent (`Ok(None)`) or of the expected type.
fn opt<T>(
    g: &Gguf,
    key: &str,
    what: &str,
    get: impl Fn(&Gguf, &str) -> Option<T>,
) -> Result<Option<T>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    get(g, key).map(Some).ok_or_else(|| bad_type(key, what))
}

fn opt_u32(g: &Gguf, key: &str) -> Result<Option<u32>> {
    opt(g, key, "an unsigned 32-bit integer", Gguf::get_u32)
}

fn opt_bool(g: &Gguf, key: &str) -> Result<Option<bool>> {
    opt(g, key, "a bool", Gguf::get_bool)
}

/// Everything `tokenizer.ggml.*` (and `general.name`) says about the vocabulary.
pub fn vocab_config_from_gguf(g: &Gguf) -> Result<VocabConfig> {
    vocab_config(g, None, None)
}

/// As [`vocab_config_from_gguf`], but moves the token and merge strings out of the GGUF's
/// metadata instead of copying them (the keys are left holding empty arrays): a model keeps
/// its tokenizer, and the second copy of a large vocabulary would be pure overhead.
pub fn take_vocab_config(g: &mut Gguf) -> Result<VocabConfig> {
    let tokens = g.take_str_array("tokenizer.ggml.tokens");
    let merges = g.take_str_array("tokenizer.ggml.merges");
    vocab_config(g, tokens, merges)
}

/// Reads the vocabulary; `tokens` / `merges`, when given, were already taken out of `g`.
fn vocab_config(
    g: &Gguf,
    tokens: Option<Vec<String>>,
    merges: Option<Vec<String>>,
) -> Result<VocabConfig> {
    const MODEL: &str = "tokenizer.ggml.model";
    const TOKENS: &str = "tokenizer.ggml.tokens";
    let model = g
        .get_str(MODEL)
        .ok_or_else(|| EngineError::Metadata {
            key: MODEL.into(),
            problem: "missing: the GGUF has no tokenizer (convert the model with its tokenizer)"
                .into(),
        })?
        .to_string();
    let tokens: Vec<String> = match tokens {
        Some(t) => t,
        None => g
            .get_str_array(TOKENS)
            .ok_or_else(|| EngineError::Metadata {
                key: TOKENS.into(),
                problem: "missing or not an array of strings: the GGUF has no vocabulary".into(),
            })?
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    let strings = |key: &str| -> Result<Option<Vec<String>>> {
        opt(g, key, "an array of strings", |g, k| {
            g.get_str_array(k)
                .map(|v| v.into_iter().map(str::to_string).collect())
        })
    };
    Ok(VocabConfig {
        model,
        pre: opt(g, "tokenizer.ggml.pre", "a string", |g, k| {
            g.get_str(k).map(str::to_string)
        })?,
        tokens,
        scores: opt(
            g,
            "tokenizer.ggml.scores",
            "an array of numbers",
            Gguf::get_f32_array,
        )?,
        token_types: opt(
            g,
            "tokenizer.ggml.token_type",
            "an array of 32-bit integers",
            Gguf::get_i32_array,
        )?,
        merges: match merges {
            Some(m) => Some(m),
            None => strings("tokenizer.ggml.merges")?,
        },
        bos_id: opt_u32(g, "tokenizer.ggml.bos_token_id")?,
        eos_id: opt_u32(g, "tokenizer.ggml.eos_token_id")?,
        eot_id: opt_u32(g, "tokenizer.ggml.eot_token_id")?,
        eom_id: opt_u32(g, "tokenizer.ggml.eom_token_id")?,
        unk_id: opt_u32(g, "tokenizer.ggml.unknown_token_id")?,
        sep_id: opt_u32(g, "tokenizer.ggml.seperator_token_id")?,
        pad_id: opt_u32(g, "tokenizer.ggml.padding_token_id")?,
        cls_id: opt_u32(g, "tokenizer.ggml.cls_token_id")?,
        mask_id: opt_u32(g, "tokenizer.ggml.mask_token_id")?,
        add_bos: opt_bool(g, "tokenizer.ggml.add_bos_token")?,
        add_eos: opt_bool(g, "tokenizer.ggml.add_eos_token")?,
        add_sep: opt_bool(g, "tokenizer.ggml.add_sep_token")?,
        add_space_prefix: opt_bool(g, "tokenizer.ggml.add_space_prefix")?,
        model_name: g.get_str("general.name").map(str::to_string),
    })
}

/// Builds the tokenizer a GGUF describes.
pub fn tokenizer_from_gguf(g: &Gguf) -> Result<Tokenizer> {
    Ok(Tokenizer::from_config(vocab_config_from_gguf(g)?)?)
}
