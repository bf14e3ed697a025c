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

pub mod chat;
mod error;
mod pretok;
mod spm;
mod stream;
mod unicode;
mod wpm;

use std::collections::HashSet;

pub use error::TokenizerError;
pub use stream::StreamDecoder;
use tokenizers::Model as _;

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

// llama.cpp token attributes
const ATTR_UNKNOWN: u16 = 1 << 0;
const ATTR_UNUSED: u16 = 1 << 1;
const ATTR_NORMAL: u16 = 1 << 2;
const ATTR_CONTROL: u16 = 1 << 3;
const ATTR_USER_DEFINED: u16 = 1 << 4;
const ATTR_BYTE: u16 = 1 << 5;
const ATTR_LSTRIP: u16 = 1 << 7;
const ATTR_RSTRIP: u16 = 1 << 8;

fn attr_of_type(t: i32) -> u16 {
    match t {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0,
    }
}

/// The vocabulary tables shared by every algorithm.
pub(crate) struct Vocab {
    tokens: TokenTable,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    max_token_len: usize,
    /// `<0xXX>` (or raw single-byte) token of every byte, for SentencePiece byte fallback.
    byte_tokens: [Option<u32>; 256],
}

impl Vocab {
    #[inline]
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.tokens.id(text)
    }
    #[inline]
    pub(crate) fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    #[inline]
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
    }
    #[inline]
    pub(crate) fn max_token_len(&self) -> usize {
        self.max_token_len
    }
}

/// Every token's text in one buffer, with an index sorted by text for lookups.
///
/// A vocabulary of 50k-250k short strings stored as `Vec<String>` plus a `HashMap<String, u32>`
/// costs two heap blocks and a hash slot per token (about 6 MiB for 49k tokens); one buffer, its
/// offsets and a sorted id list cost under 1 MiB. Lookups are a binary search: they happen for
/// special tokens and SentencePiece merges, never per weight or per decoded token.
pub(crate) struct TokenTable {
    text: String,
    /// `off[id]..off[id + 1]` is token `id`'s text.
    off: Vec<u32>,
    /// Ids ordered by (text, id).
    sorted: Vec<u32>,
}

impl TokenTable {
    /// Packs `tokens` (at most `u32::MAX` bytes of text in all).
    fn new(tokens: Vec<String>) -> Result<TokenTable, TokenizerError> {
        let total: usize = tokens.iter().map(String::len).sum();
        if total > u32::MAX as usize {
            return Err(TokenizerError::Metadata {
                what: format!("vocabulary text of {total} bytes is too large"),
            });
        }
        let mut text = String::with_capacity(total);
        let mut off = Vec::with_capacity(tokens.len() + 1);
        for t in tokens {
            off.push(text.len() as u32);
            text.push_str(&t);
        }
        off.push(text.len() as u32);
        let mut table = TokenTable {
            text,
            off,
            sorted: Vec::new(),
        };
        let mut sorted: Vec<u32> = (0..table.len() as u32).collect();
        sorted.sort_unstable_by(|&a, &b| table.get(a).cmp(table.get(b)).then(a.cmp(&b)));
        for w in sorted.windows(2) {
            if table.get(w[0]) == table.get(w[1]) {
                log::warn!(
                    "duplicate token {:?} at ids {} and {}: the text maps to {}",
                    table.get(w[0]),
                    w[0],
                    w[1],
                    w[1]
                );
            }
        }
        table.sorted = sorted;
        Ok(table)
    }

    fn len(&self) -> usize {
        self.off.len() - 1
    }

    /// Token `id`'s text (empty for an id out of range).
    fn get(&self, id: u32) -> &str {
        let i = id as usize;
        match (self.off.get(i), self.off.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.text[a as usize..b as usize],
            _ => "",
        }
    }

    /// The id of `text`; of several tokens with the same text, the last (as llama.cpp's map
    /// keeps the last insert).
    fn id(&self, text: &str) -> Option<u32> {
        let end = self.sorted.partition_point(|&i| self.get(i) <= text);
        let &id = self.sorted.get(end.checked_sub(1)?)?;
        (self.get(id) == text).then_some(id)
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len() as u32).map(|i| self.get(i))
    }
}

enum Algo {
    Spm,
    Bpe {
        model: Box<tokenizers::models::bpe::BPE>,
        pre: pretok::PreTokenizer,
    },
    Wpm,
}

/// A tokenizer built from GGUF vocabulary metadata; `Send + Sync`, built once per model.
pub struct Tokenizer {
    vocab: Vocab,
    algo: Algo,
    /// Control, user-defined and unknown tokens, longest text first.
    special_cache: Vec<u32>,
    /// The bytes every token renders to, concatenated; `piece_off[id]..piece_off[id + 1]`.
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
    mask: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: HashSet<u32>,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Spm,
    Bpe,
    Wpm,
}

impl Tokenizer {
    /// Builds the tokenizer. Fails on an unsupported model family or pre-tokenizer, on missing
    /// merges for BPE, on metadata arrays shorter than the vocabulary, and when metadata asks for
    /// a BOS/EOS/SEP token it does not define.
    pub fn from_config(cfg: VocabConfig) -> Result<Tokenizer, TokenizerError> {
        let kind = match cfg.model.as_str() {
            "llama" => Kind::Spm,
            "gpt2" => Kind::Bpe,
            "bert" => Kind::Wpm,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_string(),
                    supported: SUPPORTED_MODELS.join(", "),
                })
            }
        };
        let n = cfg.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::Metadata {
                what: format!("vocabulary of {n} tokens is too large"),
            });
        }
        if let Some(s) = &cfg.scores {
            if s.len() < n {
                return Err(TokenizerError::ArrayTooShort {
                    key: "tokenizer.ggml.scores",
                    len: s.len(),
                    n_vocab: n,
                });
            }
        }
        if let Some(t) = &cfg.token_types {
            if t.len() < n {
                return Err(TokenizerError::ArrayTooShort {
                    key: "tokenizer.ggml.token_type",
                    len: t.len(),
                    n_vocab: n,
                });
            }
        }

        // defaults per family, as llama.cpp has them
        type Ids = [Option<u32>; 6];
        let [mut bos, mut eos, mut unk, mut sep, mut pad, mut mask]: Ids = match kind {
            Kind::Spm => [Some(1), Some(2), Some(0), None, None, None],
            Kind::Wpm => [Some(101), None, Some(100), Some(102), Some(0), Some(103)],
            Kind::Bpe => [Some(11), Some(11), None, None, None, None],
        };
        let mut add_bos;
        let mut add_eos = false;
        let mut add_space_prefix = false;
        let mut pre_spec = None;
        match kind {
            Kind::Spm => {
                add_bos = true;
                add_space_prefix = true;
            }
            Kind::Wpm => add_bos = true,
            Kind::Bpe => {
                let spec = pretok::pre_spec(cfg.pre.as_deref())?;
                add_bos = spec.add_bos;
                if spec.no_bos {
                    bos = None;
                }
                pre_spec = Some(spec);
            }
        }
        if let Some(v) = cfg.add_space_prefix {
            add_space_prefix = v;
        }

        // tokens
        let mut tokens = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        let mut max_token_len = 0;
        for (i, t) in cfg.tokens.into_iter().enumerate() {
            let t = if t.is_empty() {
                log::warn!("empty token at index {i}");
                format!("[EMPTY_{i}]")
            } else {
                t
            };
            max_token_len = max_token_len.max(t.len());
            attrs.push(match &cfg.token_types {
                Some(tt) => attr_of_type(tt[i]),
                None => ATTR_NORMAL,
            });
            tokens.push(t);
        }
        let tokens = TokenTable::new(tokens)?;
        let scores = cfg.scores.map(|mut s| {
            s.truncate(n);
            s
        });
        let scores = scores.unwrap_or_else(|| vec![0.0; n]);

        // special ids from metadata (out of range: keep the default, as llama.cpp does)
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |name: &str, default: Option<u32>, meta: Option<u32>| -> Option<u32> {
            let default = in_range(default);
            match meta {
                Some(m) if (m as usize) < n => Some(m),
                Some(m) => {
                    log::warn!(
                        "bad special token {name} = {m} (vocabulary has {n}): using the default"
                    );
                    default
                }
                None => default,
            }
        };
        if kind == Kind::Wpm && cfg.bos_id.is_none() {
            bos = cfg.cls_id.or(bos);
        }
        bos = pick("bos", bos, cfg.bos_id);
        eos = pick("eos", eos, cfg.eos_id);
        unk = pick("unk", unk, cfg.unk_id);
        sep = pick("sep", sep, cfg.sep_id);
        pad = pick("pad", pad, cfg.pad_id);
        mask = pick("mask", mask, cfg.mask_id);
        let mut eot = pick("eot", None, cfg.eot_id);
        let mut eom = pick("eom", None, cfg.eom_id);

        if let Some(v) = cfg.add_bos {
            add_bos = v;
        }
        if let Some(v) = cfg.add_eos {
            add_eos = v;
        }
        let add_sep = cfg.add_sep.unwrap_or(kind == Kind::Wpm);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "add_bos_token",
                key: "bos_token_id",
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "add_eos_token",
                key: "eos_token_id",
            });
        }
        if kind == Kind::Wpm && (add_sep && sep.is_none()) {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "add_sep_token",
                key: "seperator_token_id",
            });
        }
        if kind == Kind::Wpm && bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "bert (always adds CLS)",
                key: "bos_token_id",
            });
        }

        // text-detected EOT/EOM/FIM/EOG tokens (llama.cpp marks them control)
        let find =
            |texts: &[&str]| -> Option<u32> { texts.iter().filter_map(|t| tokens.id(t)).min() };
        let make_control = |id: u32, attrs: &mut Vec<u16>| {
            let a = &mut attrs[id as usize];
            if *a & ATTR_CONTROL == 0 {
                log::warn!(
                    "control-looking token {id} '{}' was not control-type; treating it as control",
                    tokens.get(id)
                );
                *a |= ATTR_CONTROL;
            }
        };
        if eot.is_none() {
            eot = find(EOT_TEXTS);
            if let Some(id) = eot {
                make_control(id, &mut attrs);
            }
        }
        if eom.is_none() {
            eom = tokens.id("<|eom_id|>");
            if let Some(id) = eom {
                make_control(id, &mut attrs);
            }
        }
        let mut eog = HashSet::new();
        for texts in [FIM_PAD_TEXTS, FIM_REP_TEXTS, FIM_SEP_TEXTS] {
            if let Some(id) = find(texts) {
                make_control(id, &mut attrs);
                eog.insert(id);
            }
        }
        for t in EOG_TEXTS {
            if let Some(id) = tokens.id(t) {
                make_control(id, &mut attrs);
                eog.insert(id);
            }
        }
        // gpt-oss: these always render
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = tokens.id(t) {
                attrs[id as usize] = ATTR_USER_DEFINED;
            }
        }
        for id in [eos, eot, eom].into_iter().flatten() {
            eog.insert(id);
        }
        // o200k_harmony: <|end|> is not end-of-generation when <|return|> and <|call|> exist
        if let (Some(r), Some(c), Some(e)) = (
            tokens.id("<|return|>"),
            tokens.id("<|call|>"),
            tokens.id("<|end|>"),
        ) {
            if eog.contains(&r) && eog.contains(&c) && eog.contains(&e) {
                eog.remove(&e);
                attrs[e as usize] = ATTR_USER_DEFINED;
            }
        }

        // special token cache, longest first
        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0
            })
            .collect();
        special_cache.sort_by_key(|&id| std::cmp::Reverse(tokens.get(id).len()));

        // per-model attributes keyed on the name (llama.cpp)
        let name = cfg.model_name.unwrap_or_default().to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &special_cache {
                attrs[id as usize] |= ATTR_RSTRIP;
            }
            if let Some(id) = tokens.id("</s>") {
                attrs[id as usize] |= ATTR_RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = tokens.id(t) {
                    attrs[id as usize] &= !ATTR_RSTRIP;
                }
            }
        }

        // byte tokens for SentencePiece fallback
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = tokens.id(&hex).or_else(|| {
                if b < 0x80 {
                    tokens.id((b as u8 as char).encode_utf8(&mut [0; 4]))
                } else {
                    None
                }
            });
        }

        let vocab = Vocab {
            tokens,
            scores,
            attrs,
            max_token_len,
            byte_tokens,
        };

        let algo = match kind {
            Kind::Spm => Algo::Spm,
            Kind::Wpm => Algo::Wpm,
            Kind::Bpe => {
                let spec = pre_spec.expect("BPE has a pre-tokenizer spec");
                let merges = cfg.merges.ok_or(TokenizerError::MissingMerges)?;
                let model = Box::new(build_bpe(&vocab, &merges, spec.ignore_merges)?);
                let pre = pretok::PreTokenizer::new(&spec.regexes)?;
                Algo::Bpe { model, pre }
            }
        };

        let mut tok = Tokenizer {
            vocab,
            algo,
            special_cache,
            pieces: Vec::new(),
            piece_off: Vec::new(),
            bos,
            eos,
            eot,
            unk,
            sep,
            pad,
            mask,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
        };
        tok.build_pieces();
        Ok(tok)
    }

    fn kind(&self) -> Kind {
        match self.algo {
            Algo::Spm => Kind::Spm,
            Algo::Bpe { .. } => Kind::Bpe,
            Algo::Wpm => Kind::Wpm,
        }
    }

    fn build_pieces(&mut self) {
        let kind = self.kind();
        let mut pieces = Vec::new();
        let mut off = Vec::with_capacity(self.vocab.tokens.len() + 1);
        for (id, text) in self.vocab.tokens.iter().enumerate() {
            off.push(pieces.len() as u32);
            let attr = self.vocab.attrs[id];
            if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
                pieces.extend_from_slice(text.as_bytes());
            } else if attr & ATTR_NORMAL != 0 {
                match kind {
                    Kind::Spm | Kind::Wpm => {
                        for c in text.chars() {
                            if c == '\u{2581}' {
                                pieces.push(b' ');
                            } else {
                                let mut buf = [0u8; 4];
                                pieces.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            }
                        }
                    }
                    Kind::Bpe => {
                        for c in text.chars() {
                            match unicode::char_to_byte(c) {
                                Some(b) => pieces.push(b),
                                None => {
                                    let mut buf = [0u8; 4];
                                    pieces.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                }
                            }
                        }
                    }
                }
            } else if attr & ATTR_BYTE != 0 {
                if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    pieces.push(b);
                }
            }
        }
        off.push(pieces.len() as u32);
        self.pieces = pieces;
        self.piece_off = off;
    }

    /// Tokenizes `text`. `add_special`: add BOS/EOS as the metadata says (`bert`: CLS ... SEP).
    /// `parse_special`: control tokens written in the text (e.g. `<|im_start|>`) become their ids;
    /// otherwise they are plain text. User-defined tokens are always matched, as in llama.cpp.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        match &self.algo {
            Algo::Spm => {
                let mut prev_special = true;
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Frag::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in text[a..b].chars() {
                                buf.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::tokenize(&self.vocab, &buf, &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Algo::Bpe { model, pre } => {
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                let mut word = String::new();
                for f in &frags {
                    match *f {
                        Frag::Text(a, b) => {
                            let frag = &text[a..b];
                            for (s, e) in pre.split(frag)? {
                                word.clear();
                                unicode::byte_encode_into(&frag[s..e], &mut word);
                                let toks =
                                    model.tokenize(&word).map_err(|e| TokenizerError::Bpe {
                                        message: e.to_string(),
                                    })?;
                                out.extend(toks.into_iter().map(|t| t.id));
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Algo::Wpm => {
                if add_special {
                    out.extend(self.bos);
                }
                for f in &frags {
                    match *f {
                        Frag::Text(a, b) => {
                            wpm::tokenize(&self.vocab, &text[a..b], self.unk, &mut out)
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special {
                    out.extend(self.sep);
                }
            }
        }
        Ok(out)
    }

    /// Splits text around special tokens (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Text(0, text.len()));
        for &id in &self.special_cache {
            let attr = self.vocab.attrs[id as usize];
            if !parse_special && attr & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let tok = self.vocab.tokens.get(id);
            if !text.contains(tok) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(mut a, b) = f else {
                    next.push(f);
                    continue;
                };
                loop {
                    let Some(rel) = text[a..b].find(tok) else {
                        next.push(Frag::Text(a, b));
                        break;
                    };
                    let m = a + rel;
                    if m > a {
                        let mut left_end = m;
                        if attr & ATTR_LSTRIP != 0 {
                            while left_end > a && is_c_space(text.as_bytes()[left_end - 1]) {
                                left_end -= 1;
                            }
                        }
                        if left_end > a {
                            next.push(Frag::Text(a, left_end));
                        }
                    }
                    next.push(Frag::Token(id));
                    let mut r = m + tok.len();
                    if r >= b {
                        break;
                    }
                    if attr & ATTR_RSTRIP != 0 {
                        while r < b && is_c_space(text.as_bytes()[r]) {
                            r += 1;
                        }
                        if r >= b {
                            break;
                        }
                    }
                    a = r;
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes token `id` renders to: byte-level BPE decoded, SentencePiece `▁` as a space and
    /// `<0xXX>` as its byte, special tokens as their text; unused tokens and unknown ids render
    /// to nothing.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    /// Like [`Tokenizer::token_to_piece`], without allocating.
    pub fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// The text of `ids` (pieces concatenated, special tokens included), invalid UTF-8 replaced
    /// by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The beginning-of-sequence token (for `bert`, CLS).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token (from metadata, else found by its text, e.g. `<|im_end|>`).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// The unknown token.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// The separator token (`bert`).
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }

    /// The padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// The mask token.
    pub fn mask_id(&self) -> Option<u32> {
        self.mask
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos || self.kind() == Kind::Wpm
    }

    /// Whether generation stops at `id`: EOS, EOT, EOM, and tokens llama.cpp recognises by text
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, FIM pad/repo/file-sep, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether `id` is a control token (rendered only when asked for, e.g. `<|im_start|>`).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab
            .attrs
            .get(id as usize)
            .is_some_and(|a| a & ATTR_CONTROL != 0)
    }

    /// The vocabulary text of token `id` as stored (byte-level or `▁`-escaped).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.vocab.tokens.len()).then(|| self.vocab.tokens.get(id))
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }
}

#[derive(Clone, Copy, Debug)]
enum Frag {
    /// A byte range of the input.
    Text(usize, usize),
    Token(u32),
}

/// C's `isspace` (ASCII whitespace).
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn build_bpe(
    vocab: &Vocab,
    merges: &[String],
    ignore_merges: bool,
) -> Result<tokenizers::models::bpe::BPE, TokenizerError> {
    use tokenizers::models::bpe::{Vocab as HfVocab, BPE};
    let hf_vocab: HfVocab = (0..vocab.tokens.len() as u32)
        .map(|id| (vocab.tokens.get(id).to_string(), id))
        .collect();
    let mut seen = HashSet::with_capacity(merges.len());
    let mut pairs = Vec::with_capacity(merges.len());
    let mut skipped = 0usize;
    let mut joined = String::new();
    for m in merges {
        // split at the first space after the first byte (llama.cpp)
        let Some(pos) = m
            .as_bytes()
            .iter()
            .skip(1)
            .position(|&b| b == b' ')
            .map(|p| p + 1)
        else {
            skipped += 1;
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        if vocab.id(a).is_none() || vocab.id(b).is_none() || vocab.id(&joined).is_none() {
            skipped += 1;
            continue;
        }
        if !seen.insert((a, b)) {
            continue;
        }
        pairs.push((a.to_string(), b.to_string()));
    }
    if skipped > 0 {
        log::warn!("{skipped} BPE merges refer to tokens outside the vocabulary; they are ignored");
    }
    BPE::builder()
        .vocab_and_merges(hf_vocab, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Bpe {
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(model: &str, pre: Option<&str>) -> VocabConfig {
        VocabConfig {
            model: model.to_string(),
            pre: pre.map(str::to_string),
            tokens: vec!["a".into(), "b".into(), "ab".into()],
            merges: Some(vec!["a b".into()]),
            ..Default::default()
        }
    }

    #[test]
    fn unknown_model_is_an_error() {
        let e = Tokenizer::from_config(cfg("rwkv", None))
            .err()
            .expect("error");
        let msg = e.to_string();
        assert!(
            msg.contains("rwkv")
                && msg.contains("gpt2")
                && msg.contains("llama")
                && msg.contains("bert"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_pre_is_an_error() {
        let e = Tokenizer::from_config(cfg("gpt2", Some("no-such-pre")))
            .err()
            .expect("error");
        let msg = e.to_string();
        assert!(
            msg.contains("no-such-pre") && msg.contains("llama-bpe"),
            "{msg}"
        );
    }

    #[test]
    fn bpe_needs_merges() {
        let mut c = cfg("gpt2", Some("gpt-2"));
        c.merges = None;
        assert!(matches!(
            Tokenizer::from_config(c),
            Err(TokenizerError::MissingMerges)
        ));
    }

    #[test]
    fn tiny_bpe_merges() {
        let t = Tokenizer::from_config(cfg("gpt2", Some("gpt-2"))).unwrap();
        assert_eq!(t.encode("ab", false, false).unwrap(), vec![2]);
        assert_eq!(t.decode(&[2, 0]), "aba");
    }

    #[test]
    fn tokenizer_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
    }
}
