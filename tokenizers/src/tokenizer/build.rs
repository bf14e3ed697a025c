//! Building a [`Tokenizer`] from [`VocabConfig`]: special tokens, attributes, the rendered
//! pieces and the BPE model.

use std::collections::HashSet;

use super::{Algo, Kind, Tokenizer};
use crate::config::{VocabConfig, SUPPORTED_MODELS};
use crate::error::TokenizerError;
use crate::vocab::{
    attr_of_type, TokenTable, Vocab, ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_RSTRIP,
    ATTR_UNKNOWN, ATTR_USER_DEFINED,
};
use crate::{pretok, unicode};

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
