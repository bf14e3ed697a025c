//! [`VocabConfig`]: the vocabulary metadata a tokenizer is built from.

/// Everything a GGUF's `tokenizer.*` (and a little `general.*`) metadata says about the
/// vocabulary. `None` means the key is absent: llama.cpp's default for the model type applies.
#[derive(Debug, Clone, Default)]
pub struct VocabConfig {
    /// `tokenizer.ggml.model`: `"gpt2"` (BPE), `"llama"` (SentencePiece) or `"bert"` (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer (e.g. `"llama-bpe"`, `"qwen2"`, `"smollm"`);
    /// ignored for `llama` and `bert`; missing means `"default"`, as in llama.cpp.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: per-token scores (SentencePiece merge priorities).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: BPE merges, `"left right"`, in priority order.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic, as llama.cpp spells the key)
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.cls_token_id` (llama.cpp uses BOS as CLS; this is the fallback for BOS
    /// in `bert` vocabularies)
    pub cls_id: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`
    pub mask_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_sep_token`
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece: prefix the text with a space)
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp keys a few per-model token attributes on it (Phi-3: special
    /// tokens strip following whitespace).
    pub model_name: Option<String>,
}

/// The model families supported (`tokenizer.ggml.model`).
pub const SUPPORTED_MODELS: &[&str] = &["gpt2", "llama", "bert"];
