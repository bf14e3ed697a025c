//! SentencePiece-style (llama.cpp "SPM") tokenization: starting from UTF-8 characters, repeatedly
//! merge the adjacent pair whose concatenation is the vocabulary entry with the highest score
//! (leftmost first on ties); symbols left that are not vocabulary entries fall back to `<0xXX>`
//! byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes already space-escaped text, appending ids to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let n_chars = text.chars().count();
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: if i + 1 < n_chars { Some(i + 1) } else { None },
        });
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>,
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (a, b) = (&symbols[l], &symbols[r]);
        let piece = &text[a.start..a.start + a.len + b.len];
        if let Some(id) = vocab.id(piece) {
            queue.push(Bigram {
                left: l,
                right: r,
                score: vocab.score(id),
                size: piece.len(),
            });
        }
    };

    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }

    while let Some(bg) = queue.pop() {
        let (l, r) = (symbols[bg.left], symbols[bg.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
            continue;
        }
        symbols[bg.left].len += r.len;
        symbols[bg.right].len = 0;
        symbols[bg.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(bg.left);
        }
        let left = symbols[bg.left];
        try_add(&symbols, &mut queue, left.prev, Some(bg.left));
        try_add(&symbols, &mut queue, Some(bg.left), left.next);
    }

    let mut i = Some(0);
    while let Some(k) = i {
        let s = symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    if let Some(id) = vocab.byte_token(b) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
