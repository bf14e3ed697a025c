//! The vocabulary tables every algorithm reads: token texts ([`TokenTable`]), scores and
//! llama.cpp's token attributes.

use crate::error::TokenizerError;

// llama.cpp token attributes
pub(crate) const ATTR_UNKNOWN: u16 = 1 << 0;
const ATTR_UNUSED: u16 = 1 << 1;
pub(crate) const ATTR_NORMAL: u16 = 1 << 2;
pub(crate) const ATTR_CONTROL: u16 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u16 = 1 << 4;
pub(crate) const ATTR_BYTE: u16 = 1 << 5;
pub(crate) const ATTR_LSTRIP: u16 = 1 << 7;
pub(crate) const ATTR_RSTRIP: u16 = 1 << 8;

pub(crate) fn attr_of_type(t: i32) -> u16 {
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
    pub(crate) tokens: TokenTable,
    pub(crate) scores: Vec<f32>,
    pub(crate) attrs: Vec<u16>,
    pub(crate) max_token_len: usize,
    /// `<0xXX>` (or raw single-byte) token of every byte, for SentencePiece byte fallback.
    pub(crate) byte_tokens: [Option<u32>; 256],
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
    pub(crate) fn new(tokens: Vec<String>) -> Result<TokenTable, TokenizerError> {
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

    pub(crate) fn len(&self) -> usize {
        self.off.len() - 1
    }

    /// Token `id`'s text (empty for an id out of range).
    pub(crate) fn get(&self, id: u32) -> &str {
        let i = id as usize;
        match (self.off.get(i), self.off.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.text[a as usize..b as usize],
            _ => "",
        }
    }

    /// The id of `text`; of several tokens with the same text, the last (as llama.cpp's map
    /// keeps the last insert).
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        let end = self.sorted.partition_point(|&i| self.get(i) <= text);
        let &id = self.sorted.get(end.checked_sub(1)?)?;
        (self.get(id) == text).then_some(id)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len() as u32).map(|i| self.get(i))
    }
}
