//! llama.cpp's GBNF grammar format, translated to llguidance's Lark-like format.
//!
//! Supported: rules `name ::= alternatives` (names of letters, digits, `-` and `_`; `root` is
//! the output), string literals `"..."`, character classes `[...]` / `[^...]` with ranges,
//! `.` (any character), rule references, groups `( ... )`, the repetitions `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`, escapes `\t \n \r \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`, and `#`
//! comments. As in llama.cpp, a newline ends a rule's alternative except inside parentheses
//! or after `|`. Token references (`<[id]>`, `<token>`) are refused.
//!
//! Each literal and class becomes its own lexeme of the Lark grammar, so the language is the
//! GBNF one, read character by character.

use std::collections::HashMap;
use std::fmt::Write;

/// A GBNF parse position (bytes into the source) and the source, for error messages.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// GBNF rule name -> Lark rule name.
    names: HashMap<String, String>,
    /// Names referenced, with the byte offset of a first reference.
    used: Vec<(String, usize)>,
}

/// One element of a sequence: its Lark text and, for a regular one (no rule reference), the
/// same as a regex and the characters it can start with.
struct Piece {
    lark: String,
    /// The element as a regex, when it references no rule.
    rx: Option<String>,
    /// The characters it can start with (sorted disjoint ranges), when known and it cannot be
    /// empty.
    first: Option<Vec<(u32, u32)>>,
    /// A repetition (`*`, `+`, `{m,n}`) of a regular element: a candidate for one lexeme.
    repeat: Option<(String, usize, Option<usize>)>,
}

impl Piece {
    fn rule(lark: String) -> Piece {
        Piece {
            lark,
            rx: None,
            first: None,
            repeat: None,
        }
    }
}

/// Sorted, merged ranges.
fn normalize(mut r: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    r.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(r.len());
    for (lo, hi) in r {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn complement(r: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut next = 0u32;
    for &(lo, hi) in r {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = hi.saturating_add(1);
    }
    if next <= 0x10FFFF {
        out.push((next, 0x10FFFF));
    }
    out
}

fn disjoint(a: &[(u32, u32)], b: &[(u32, u32)]) -> bool {
    a.iter()
        .all(|&(lo, hi)| b.iter().all(|&(l2, h2)| hi < l2 || h2 < lo))
}

fn rx_char(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

/// Translates the GBNF grammar `src` to a Lark grammar for llguidance; the error names the
/// problem and its line.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser {
        src,
        pos: 0,
        names: HashMap::new(),
        used: Vec::new(),
    };
    let mut rules = Vec::new();
    p.skip_space(true);
    while p.pos < src.len() {
        let at = p.pos;
        let name = p.name().ok_or_else(|| p.err(at, "expected a rule name"))?;
        p.skip_space(false);
        if !p.rest().starts_with("::=") {
            return Err(p.err(
                p.pos,
                &format!("expected `::=` after the rule name `{name}`"),
            ));
        }
        p.pos += 3;
        p.skip_space(true);
        let body = p.alternates(false)?;
        let lark = p.lark_name(&name);
        if rules.iter().any(|(n, _): &(String, String)| n == &name) {
            return Err(p.err(at, &format!("the rule `{name}` is defined twice")));
        }
        rules.push((name, format!("{lark}: {body}")));
        p.skip_space(true);
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("the grammar has no `root` rule (the rule the output follows)".into());
    }
    for (name, at) in &p.used {
        if !rules.iter().any(|(n, _)| n == name) {
            return Err(p.err(*at, &format!("the rule `{name}` is used but not defined")));
        }
    }
    let mut out = format!("start: {}\n", p.names["root"]);
    for (_, r) in rules {
        out.push_str(&r);
        out.push('\n');
    }
    Ok(out)
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn err(&self, at: usize, msg: &str) -> String {
        let line = self.src[..at.min(self.src.len())].matches('\n').count() + 1;
        format!("line {line}: {msg}")
    }

    /// Skips spaces, tabs and comments, and newlines when `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    let end = self
                        .rest()
                        .find('\n')
                        .map_or(self.src.len(), |i| self.pos + i);
                    self.pos = end;
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(self.rest().len());
        if len == 0 {
            return None;
        }
        let name = self.rest()[..len].to_string();
        self.pos += len;
        Some(name)
    }

    /// The Lark name of GBNF rule `name`: lower case, `-` as `_`, prefixed so that no name
    /// meets a Lark keyword; unique.
    fn lark_name(&mut self, name: &str) -> String {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let base: String = name
            .chars()
            .map(|c| match c {
                '-' => '_',
                c => c.to_ascii_lowercase(),
            })
            .collect();
        let mut cand = format!("g_{base}");
        let mut i = 1;
        while self.names.values().any(|v| v == &cand) {
            cand = format!("g_{base}_{i}");
            i += 1;
        }
        self.names.insert(name.to_string(), cand.clone());
        cand
    }

    /// `seq | seq | ...`; inside parentheses when `nested` (newlines are spaces there).
    fn alternates(&mut self, nested: bool) -> Result<String, String> {
        Ok(self.alternates_piece(nested)?.lark)
    }

    /// The alternatives as one piece: regular when every alternative is.
    fn alternates_piece(&mut self, nested: bool) -> Result<Piece, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested)?);
        }
        let lark = alts
            .iter()
            .map(|a| a.lark.as_str())
            .collect::<Vec<_>>()
            .join(" | ");
        let rx = alts
            .iter()
            .map(|a| a.rx.clone())
            .collect::<Option<Vec<_>>>()
            .map(|v| format!("(?:{})", v.join("|")));
        let first = alts
            .iter()
            .map(|a| a.first.clone())
            .collect::<Option<Vec<_>>>()
            .map(|v| normalize(v.concat()));
        Ok(Piece {
            lark,
            rx,
            first,
            repeat: None,
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<Piece, String> {
        let mut items: Vec<Piece> = Vec::new();
        loop {
            let at = self.pos;
            let atom = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.pos += 1;
                    Piece {
                        lark: "/(?s:.)/".to_string(),
                        rx: Some("(?s:.)".to_string()),
                        first: Some(vec![(0, 0x10FFFF)]),
                        repeat: None,
                    }
                }
                Some('(') => {
                    self.pos += 1;
                    self.skip_space(true);
                    let inner = self.alternates_piece(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.err(self.pos, "expected `)`"));
                    }
                    self.pos += 1;
                    Piece {
                        lark: format!("({})", inner.lark),
                        ..inner
                    }
                }
                Some('<') => {
                    return Err(self.err(
                        at,
                        "token references (`<...>`) are not supported; spell the text with a string literal",
                    ))
                }
                Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let save = self.pos;
                    let name = self.name().unwrap_or_default();
                    // `name ::=` starts the next rule: this sequence has ended.
                    let mut look = Parser {
                        src: self.src,
                        pos: self.pos,
                        names: HashMap::new(),
                        used: Vec::new(),
                    };
                    look.skip_space(false);
                    if look.rest().starts_with("::=") {
                        self.pos = save;
                        break;
                    }
                    self.used.push((name.clone(), at));
                    Piece::rule(self.lark_name(&name))
                }
                _ => break,
            };
            self.skip_space(nested);
            let atom = self.repetition(atom)?;
            items.push(atom);
            self.skip_space(nested);
        }
        if items.is_empty() {
            // An empty alternative matches the empty string.
            return Ok(Piece {
                lark: "\"\"".into(),
                rx: Some(String::new()),
                first: None,
                repeat: None,
            });
        }
        // A repetition of a regular element becomes one lexeme (one regex) when what follows
        // cannot start the way it does: lexing it longest-match then splits the text exactly
        // where the character-level grammar must, and the mask costs far less than one lexeme
        // per character.
        for i in 0..items.len().saturating_sub(1) {
            let (Some((rx, min, max)), Some(base), Some(next)) = (
                items[i].repeat.clone(),
                items[i].first.clone(),
                items[i + 1].first.clone(),
            ) else {
                continue;
            };
            if !disjoint(&base, &next) {
                continue;
            }
            let max_s = max.map_or(String::new(), |m| m.to_string());
            items[i].lark = if min == 0 {
                match max {
                    Some(m) => format!("(/(?:{rx}){{1,{m}}}/)?"),
                    None => format!("(/(?:{rx})+/)?"),
                }
            } else {
                format!("/(?:{rx}){{{min},{max_s}}}/")
            };
        }
        let lark = items
            .iter()
            .map(|p| p.lark.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        let rx = items
            .iter()
            .map(|p| p.rx.clone())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.concat());
        // The first element's first characters, when it cannot be empty.
        let first = items[0]
            .first
            .clone()
            .filter(|_| items[0].repeat.as_ref().is_none_or(|&(_, min, _)| min > 0));
        Ok(Piece {
            lark,
            rx,
            first,
            repeat: None,
        })
    }

    /// A postfix repetition applied to `atom`, if one follows.
    fn repetition(&mut self, piece: Piece) -> Result<Piece, String> {
        let atom = piece.lark.clone();
        let regular =
            |min: usize, max: Option<usize>| piece.rx.as_ref().map(|rx| (rx.clone(), min, max));
        let (out, repeat) = match self.peek() {
            Some(op @ ('*' | '+' | '?')) => {
                self.pos += 1;
                let repeat = match op {
                    '*' => regular(0, None),
                    '+' => regular(1, None),
                    _ => None,
                };
                (format!("({atom}){op}"), repeat)
            }
            Some('{') => {
                let at = self.pos;
                let end = self
                    .rest()
                    .find('}')
                    .ok_or_else(|| self.err(at, "expected `}` closing a repetition"))?;
                let spec = self.rest()[1..end].replace([' ', '\t'], "");
                self.pos += end + 1;
                let bad = || self.err(at, "expected a repetition {m}, {m,} or {m,n}");
                let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
                let (min, max) = match spec.split_once(',') {
                    None => (num(&spec)?, Some(num(&spec)?)),
                    Some((a, "")) => (num(a)?, None),
                    Some((a, b)) => (num(a)?, Some(num(b)?)),
                };
                if max.is_some_and(|m| m < min) {
                    return Err(self.err(at, "a repetition's maximum is below its minimum"));
                }
                let one = format!("({atom})");
                let text = match max {
                    None => {
                        let mut parts = vec![one.clone(); min];
                        parts.push(format!("{one}*"));
                        format!("({})", parts.join(" "))
                    }
                    Some(0) => "\"\"".to_string(),
                    // Lark's own range, which llguidance expands without nesting: spelled out
                    // as nested optionals, x{0,40} went past its parser's nesting limit
                    // ("lark grammar too deeply nested").
                    Some(m) => format!("({one}{{{min},{m}}})"),
                };
                (text, regular(min, max).filter(|_| max != Some(0)))
            }
            _ => return Ok(piece),
        };
        let rx = piece.rx.as_ref().map(|rx| match &repeat {
            Some((_, min, max)) => match max {
                Some(m) => format!("(?:{rx}){{{min},{m}}}"),
                None => format!("(?:{rx}){{{min},}}"),
            },
            None => format!("(?:{rx})?"),
        });
        Ok(Piece {
            lark: out,
            rx,
            first: piece.first,
            repeat,
        })
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self, in_class: bool) -> Result<char, String> {
        let at = self.pos;
        let c = self
            .peek()
            .ok_or_else(|| self.err(at, "unexpected end of the grammar"))?;
        self.pos += c.len_utf8();
        if c != '\\' {
            return Ok(c);
        }
        let e = self
            .peek()
            .ok_or_else(|| self.err(at, "unexpected end after `\\`"))?;
        self.pos += e.len_utf8();
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let digits = p.rest().get(..n).unwrap_or("");
            let v = u32::from_str_radix(digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| p.err(at, &format!("expected {n} hex digits after `\\{e}`")))?;
            p.pos += n;
            Ok(v)
        };
        match e {
            'n' => Ok('\n'),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            '\\' | '"' | '[' | ']' => Ok(e),
            '-' if in_class => Ok('-'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            _ => Err(self.err(at, &format!("unknown escape `\\{e}`"))),
        }
    }

    fn literal(&mut self) -> Result<Piece, String> {
        let at = self.pos;
        self.pos += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return Err(self.err(at, "unterminated string literal")),
                Some('"') => {
                    self.pos += 1;
                    break;
                }
                _ => s.push(self.char(false)?),
            }
        }
        Ok(Piece {
            lark: serde_json::to_string(&s).unwrap_or_else(|_| "\"\"".into()),
            rx: Some(s.chars().map(rx_char).collect()),
            first: s.chars().next().map(|c| vec![(c as u32, c as u32)]),
            repeat: None,
        })
    }

    fn class(&mut self) -> Result<Piece, String> {
        let at = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut rx = String::from(if negated { "[^" } else { "[" });
        let mut empty = true;
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some('\n') => return Err(self.err(at, "unterminated character class")),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    let lo = self.char(true)?;
                    let mut hi_c = lo;
                    let _ = write!(rx, "\\x{{{:X}}}", lo as u32);
                    if self.peek() == Some('-') && !self.rest()[1..].starts_with(']') {
                        self.pos += 1;
                        let hi = self.char(true)?;
                        if hi < lo {
                            return Err(self.err(at, "a character range's end is below its start"));
                        }
                        let _ = write!(rx, "-\\x{{{:X}}}", hi as u32);
                        hi_c = hi;
                    }
                    ranges.push((lo as u32, hi_c as u32));
                    empty = false;
                }
            }
        }
        if empty {
            return Err(self.err(at, "empty character class `[]`"));
        }
        rx.push(']');
        let ranges = normalize(ranges);
        Ok(Piece {
            lark: format!("/{rx}/"),
            rx: Some(rx),
            first: Some(if negated { complement(&ranges) } else { ranges }),
            repeat: None,
        })
    }
}
