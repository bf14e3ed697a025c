//! WordPiece as llama.cpp's "WPM" does it. The GGUF vocabulary marks word starts with `▁`
//! (not continuations with `##`). Text is normalised (canonical decomposition reduced to its first
//! codepoint, accent marks dropped, lowercased), split on whitespace, and punctuation, ASCII
//! symbols and CJK ideographs become words of their own; each word, prefixed with `▁`, is then
//! matched greedily, longest vocabulary entry first; a word that cannot be covered becomes UNK.

use crate::unicode::{self, ACCENT_MARK, CONTROL, PUNCTUATION, SYMBOL, WHITESPACE};
use crate::vocab::Vocab;

fn is_chinese_char(c: u32) -> bool {
    (0x4E00..=0x9FFF).contains(&c)
        || (0x3400..=0x4DBF).contains(&c)
        || (0x20000..=0x2A6DF).contains(&c)
        || (0x2A700..=0x2B73F).contains(&c)
        || (0x2B740..=0x2B81F).contains(&c)
        // (0x2B920, as the HF implementation has it, not 0x2B820)
        || (0x2B920..=0x2CEAF).contains(&c)
        || (0xF900..=0xFAFF).contains(&c)
        || (0x2F800..=0x2FA1F).contains(&c)
}

/// Normalises and splits text into words.
fn preprocess(text: &str) -> Vec<String> {
    let mut words: Vec<String> = vec![String::new()];
    for c in text.chars() {
        let c = unicode::nfd_first(c);
        let f = unicode::flags(c);
        if f & WHITESPACE != 0 {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || f & CONTROL != 0 {
            continue;
        }
        if f & ACCENT_MARK != 0 {
            continue;
        }
        let lc = unicode::to_lower(c);
        if f & PUNCTUATION != 0
            || ((c as u32) < 0x7F && f & SYMBOL != 0)
            || is_chinese_char(c as u32)
        {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(String::new());
            }
            if let Some(w) = words.last_mut() {
                w.push(lc);
            }
            words.push(String::new());
        } else if let Some(w) = words.last_mut() {
            w.push(lc);
        }
    }
    if words.last().is_some_and(|w| w.is_empty()) {
        words.pop();
    }
    words
}

/// Tokenizes one raw-text fragment, appending ids to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, unk: Option<u32>, out: &mut Vec<u32>) {
    let mut word1 = String::new();
    for word in preprocess(text) {
        if word.is_empty() {
            continue;
        }
        word1.clear();
        word1.push('\u{2581}');
        word1.push_str(&word);
        let n = word1.len();
        let mark = out.len();
        let mut i = 0;
        let mut ok = true;
        while i < n {
            let mut matched = false;
            let mut j = n.min(i + vocab.max_token_len() + 1);
            while j > i {
                if word1.is_char_boundary(j) {
                    if let Some(id) = vocab.id(&word1[i..j]) {
                        out.push(id);
                        matched = true;
                        i = j;
                        break;
                    }
                }
                j -= 1;
            }
            if !matched {
                ok = false;
                break;
            }
        }
        if !ok {
            out.truncate(mark);
        }
        if out.len() == mark {
            if let Some(u) = unk {
                out.push(u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_punctuation_and_lowercases() {
        assert_eq!(preprocess("Hello, World!"), ["hello", ",", "world", "!"]);
        assert_eq!(preprocess("Cửa Việt"), ["cua", "viet"]);
        assert_eq!(preprocess("我想a"), ["我", "想", "a"]);
    }
}
