//! [`Tokenizer`]: the type, and what it answers about its vocabulary. Building it from
//! metadata is in `build`, text to ids in `encode`.

mod build;
mod encode;

use std::collections::HashSet;

use crate::pretok;
use crate::vocab::{Vocab, ATTR_CONTROL};

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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Spm,
    Bpe,
    Wpm,
}

impl Tokenizer {
    fn kind(&self) -> Kind {
        match self.algo {
            Algo::Spm => Kind::Spm,
            Algo::Bpe { .. } => Kind::Bpe,
            Algo::Wpm => Kind::Wpm,
        }
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
