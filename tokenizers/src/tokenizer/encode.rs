//! Text to ids: splitting out special tokens, then the family's algorithm on each fragment.

use tokenizers::Model as _;

use super::{Algo, Tokenizer};
use crate::error::TokenizerError;
use crate::vocab::{ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN};
use crate::{spm, unicode, wpm};

impl Tokenizer {
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
