//! Unicode facts the llama.cpp tokenizers depend on: per-codepoint category flags (as Python's
//! `regex` module reports them), whitespace, simple lowercasing, the first codepoint of the
//! canonical decomposition, and GPT-2's byte <-> printable-character mapping.
//!
//! The category tables are built once, lazily, from `regex-syntax`'s Unicode tables.

use std::sync::OnceLock;

/// `\p{N}`
pub(crate) const NUMBER: u8 = 1;
/// `\p{L}`
pub(crate) const LETTER: u8 = 2;
/// `\p{Z}`
pub(crate) const SEPARATOR: u8 = 4;
/// `\p{M}`
pub(crate) const ACCENT_MARK: u8 = 8;
/// `\p{P}`
pub(crate) const PUNCTUATION: u8 = 16;
/// `\p{S}`
pub(crate) const SYMBOL: u8 = 32;
/// `\p{C}` (including unassigned codepoints)
pub(crate) const CONTROL: u8 = 64;
/// `\s` (the Unicode White_Space property)
pub(crate) const WHITESPACE: u8 = 128;

/// The category bits (everything but whitespace).
pub(crate) const CATEGORY_MASK: u8 =
    NUMBER | LETTER | SEPARATOR | ACCENT_MARK | PUNCTUATION | SYMBOL | CONTROL;

const MAX_CODEPOINTS: usize = 0x11_0000;

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new()
        .parse(pattern)
        .expect("a built-in Unicode class parses");
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => cls
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

fn flags_table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![0u8; MAX_CODEPOINTS];
        for (pat, bit) in [
            (r"\p{N}", NUMBER),
            (r"\p{L}", LETTER),
            (r"\p{Z}", SEPARATOR),
            (r"\p{M}", ACCENT_MARK),
            (r"\p{P}", PUNCTUATION),
            (r"\p{S}", SYMBOL),
            (r"\p{C}", CONTROL),
            (r"\s", WHITESPACE),
        ] {
            for (a, b) in class_ranges(pat) {
                for f in &mut t[a as usize..=b as usize] {
                    *f |= bit;
                }
            }
        }
        // Surrogates are no `char`s, but they are `\p{C}` (Cs).
        for f in &mut t[0xD800..=0xDFFF] {
            *f |= CONTROL;
        }
        t
    })
}

/// The flags of one codepoint.
#[inline]
pub(crate) fn flags(c: char) -> u8 {
    flags_table()[c as usize]
}

/// Whitespace as llama.cpp's tables say (`\s` of Python's `regex`: Unicode White_Space).
#[inline]
pub(crate) fn is_whitespace(c: char) -> bool {
    flags(c) & WHITESPACE != 0
}

/// The first codepoint of the full lowercase mapping (llama.cpp's `unicode_tolower`).
#[inline]
pub(crate) fn to_lower(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    c.to_lowercase().next().unwrap_or(c)
}

/// The first codepoint of the canonical decomposition (llama.cpp's NFD table keeps only that).
pub(crate) fn nfd_first(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let mut first = None;
    unicode_normalization_alignments::char::decompose_canonical(c, |d| {
        if first.is_none() {
            first = Some(d);
        }
    });
    first.unwrap_or(c)
}

/// GPT-2's byte -> printable character table.
pub(crate) fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = ['\0'; 256];
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut n = 0u32;
        for b in 0..256u32 {
            t[b as usize] = if printable(b) {
                char::from_u32(b).unwrap_or('\0')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('\0')
            };
        }
        t
    })
}

/// The inverse of [`byte_to_char_table`]: the byte a printable character stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[i16; 0x144]> = OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [-1i16; 0x144];
        for (b, &c) in byte_to_char_table().iter().enumerate() {
            t[c as usize] = b as i16;
        }
        t
    });
    match t.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

/// Encodes UTF-8 bytes as GPT-2 printable characters, appending to `out`.
pub(crate) fn byte_encode_into(text: &str, out: &mut String) {
    let t = byte_to_char_table();
    for b in text.bytes() {
        out.push(t[b as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_roundtrips() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn categories() {
        assert_eq!(flags('a') & CATEGORY_MASK, LETTER);
        assert_eq!(flags('7') & CATEGORY_MASK, NUMBER);
        assert_eq!(flags('½') & CATEGORY_MASK, NUMBER);
        assert!(is_whitespace('\u{3000}'));
        assert!(!is_whitespace('\u{200B}'));
        assert_eq!(flags('~') & CATEGORY_MASK, SYMBOL);
        assert_eq!(flags('\u{0301}') & CATEGORY_MASK, ACCENT_MARK);
        assert_eq!(nfd_first('ử'), 'u');
        assert_eq!(to_lower('Ä'), 'ä');
    }
}
