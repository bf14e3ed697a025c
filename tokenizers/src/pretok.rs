//! BPE pre-tokenization as llama.cpp does it: a list of regexes applied in turn, each one splitting
//! the pieces the previous one produced (matches and the text between matches both become
//! pieces). The GPT-2 and Llama-3 regexes use hand-written splitters (as llama.cpp does, whose
//! splitters are the reference); every other regex runs on llama.cpp's "collapsed" text, where
//! each non-ASCII codepoint stands for its Unicode category, so `\p{..}` classes behave exactly
//! as there.

use crate::error::TokenizerError;
use crate::unicode::{self, CATEGORY_MASK, LETTER, NUMBER, WHITESPACE};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_ORIG: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
const DEEPSEEK_LLM_PUNCT: &str =
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+";
const CJK_HANGUL: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` value selects: the regex list and the per-type switches
/// llama.cpp attaches to it.
#[derive(Debug, Clone)]
pub(crate) struct PreSpec {
    /// The regexes, applied in order.
    pub regexes: Vec<&'static str>,
    /// Words that are whole vocabulary entries skip the merges (Llama-3 style).
    pub ignore_merges: bool,
    /// The default for adding BOS (metadata overrides it).
    pub add_bos: bool,
    /// The type sets no BOS token at all (ChatGLM-4).
    pub no_bos: bool,
}

/// The `tokenizer.ggml.pre` values this crate knows.
pub(crate) const SUPPORTED_PRE: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "dbrx",
    "smaug-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "mpt",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "jina-v1-en",
    "jina-v2-es",
    "jina-v2-de",
    "jina-v2-code",
    "roberta-bpe",
    "olmo",
    "jais",
    "gigachat",
    "exaone4",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "chatglm-bpe",
    "glm4",
    "tekken",
    "gpt-4o",
    "llama4",
];

/// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: missing, which llama.cpp treats
/// as "default").
pub(crate) fn pre_spec(pre: Option<&str>) -> Result<PreSpec, TokenizerError> {
    let spec = |regexes: Vec<&'static str>| PreSpec {
        regexes,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    };
    let pre = match pre {
        None | Some("") => {
            log::warn!("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer (generation quality may suffer)");
            "default"
        }
        Some(p) => p,
    };
    Ok(match pre {
        "default" => spec(vec![
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec(vec![LLAMA3])
        },
        "dbrx" | "smaug-bpe" => spec(vec![LLAMA3]),
        "deepseek-llm" => spec(vec![
            "[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            DEEPSEEK_LLM_PUNCT,
            "\\s+$",
            CJK_HANGUL,
            r"\p{N}+",
        ]),
        "deepseek-coder" => spec(vec![
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            CJK_HANGUL,
            r"\p{N}",
        ]),
        "falcon" => spec(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            spec(vec![r"\p{N}", GPT2])
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
        | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "gigachat" | "exaone4" => {
            spec(vec![GPT2])
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => spec(vec![QWEN2]),
        "poro-chat" | "bloom" | "gpt3-finnish" => spec(vec![" ?[^(\\s|.,!?…。，、।۔،)]+"]),
        "chatglm-bpe" | "glm4" => PreSpec {
            no_bos: true,
            ..spec(vec![LLAMA3])
        },
        "tekken" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec(vec![TEKKEN])
        },
        "gpt-4o" | "llama4" => spec(vec![GPT4O]),
        other => {
            return Err(TokenizerError::UnknownPreTokenizer {
                pre: other.to_string(),
                supported: SUPPORTED_PRE.join(", "),
            })
        }
    })
}

enum Step {
    Gpt2,
    Llama3,
    /// A general regex; `collapsed`: it uses `\p{..}` classes and runs on the collapsed text.
    Regex {
        re: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// A compiled regex list.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    any_collapsed: bool,
}

/// Stand-ins for non-ASCII codepoints in the collapsed text (private-use characters).
const REP_NUMBER: char = '\u{E0D1}';
const REP_LETTER: char = '\u{E0D2}';
const REP_PUNCT: char = '\u{E0D3}';
const REP_ACCENT: char = '\u{E0D4}';
const REP_SYMBOL: char = '\u{E0D5}';
const REP_OTHER: char = '\u{E0D0}';

/// `\p{..}` names llama.cpp collapses, with the stand-in and the ASCII members of the class.
const UCATS: &[(&str, char, &str)] = &[
    (r"\p{N}", REP_NUMBER, r"0-9"),
    (r"\p{L}", REP_LETTER, r"A-Za-z"),
    (
        r"\p{P}",
        REP_PUNCT,
        r"\x{21}-\x{23}\x{25}-\x{2A}\x{2C}-\x{2F}\x{3A}-\x{3B}\x{3F}-\x{40}\x{5B}-\x{5D}\x{5F}\x{7B}\x{7D}",
    ),
    (r"\p{M}", REP_ACCENT, ""),
    // llama.cpp's ASCII symbol set has no `~`.
    (
        r"\p{S}",
        REP_SYMBOL,
        r"\x{24}\x{2B}\x{3C}-\x{3E}\x{5E}\x{60}\x{7C}",
    ),
    (r"\p{Lu}", REP_LETTER, r"A-Za-z"),
    (r"\p{Ll}", REP_LETTER, r"A-Za-z"),
    (r"\p{Lt}", REP_LETTER, r"A-Za-z"),
    (r"\p{Lm}", REP_LETTER, r"A-Za-z"),
    (r"\p{Lo}", REP_LETTER, r"A-Za-z"),
];

fn uses_categories(expr: &str) -> bool {
    UCATS.iter().any(|(name, _, _)| expr.contains(name))
}

/// Rewrites `\p{..}` classes to classes over the collapsed alphabet.
fn collapse_regex(expr: &str) -> Result<String, TokenizerError> {
    if !expr.is_ascii() {
        return Err(TokenizerError::Regex {
            pattern: expr.to_string(),
            message: "a regex with Unicode categories must be ASCII (as in llama.cpp)".to_string(),
        });
    }
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(close) = expr[i + 3..].find('}').map(|k| k + i + 3) {
                let name = &expr[i..=close];
                if let Some((_, rep, ascii)) = UCATS.iter().find(|(n, _, _)| *n == name) {
                    if !inside {
                        out.push('[');
                    }
                    out.push_str(&format!("\\x{{{:X}}}", *rep as u32));
                    out.push_str(ascii);
                    if !inside {
                        out.push(']');
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    Ok(out)
}

fn collapse_char(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let f = unicode::flags(c);
    if f & WHITESPACE != 0 {
        return '\u{0B}';
    }
    match f & CATEGORY_MASK {
        unicode::NUMBER => REP_NUMBER,
        unicode::LETTER => REP_LETTER,
        unicode::PUNCTUATION => REP_PUNCT,
        unicode::ACCENT_MARK => REP_ACCENT,
        unicode::SYMBOL => REP_SYMBOL,
        _ => REP_OTHER,
    }
}

fn plain_char(c: char) -> char {
    if !c.is_ascii() && unicode::is_whitespace(c) {
        '\u{0B}'
    } else {
        c
    }
}

impl PreTokenizer {
    /// Compiles a regex list.
    pub(crate) fn new(regexes: &[&str]) -> Result<Self, TokenizerError> {
        let mut steps = Vec::with_capacity(regexes.len());
        let mut any_collapsed = false;
        for &expr in regexes {
            if expr == GPT2 {
                steps.push(Step::Gpt2);
                continue;
            }
            if expr == LLAMA3 || expr == LLAMA3_ORIG {
                steps.push(Step::Llama3);
                continue;
            }
            let collapsed = uses_categories(expr);
            let pattern = if collapsed {
                collapse_regex(expr)?
            } else {
                expr.to_string()
            };
            any_collapsed |= collapsed;
            let re = fancy_regex::Regex::new(&pattern).map_err(|e| TokenizerError::Regex {
                pattern: expr.to_string(),
                message: e.to_string(),
            })?;
            steps.push(Step::Regex { re, collapsed });
        }
        Ok(PreTokenizer {
            steps,
            any_collapsed,
        })
    }

    /// Splits `text` into words; returns byte ranges into `text`.
    pub(crate) fn split(&self, text: &str) -> Result<Vec<(usize, usize)>, TokenizerError> {
        let cps: Vec<char> = text.chars().collect();
        let n = cps.len();
        // byte offset of every char index (and of the end)
        let mut boff = Vec::with_capacity(n + 1);
        for (i, _) in text.char_indices() {
            boff.push(i);
        }
        boff.push(text.len());

        let mut collapsed: Option<(String, Vec<usize>)> = None;
        let mut plain: Option<(String, Vec<usize>)> = None;
        if self.any_collapsed {
            collapsed = Some(haystack(&cps, collapse_char));
        }

        let mut offsets: Vec<usize> = vec![n];
        for step in &self.steps {
            let mut next = Vec::with_capacity(offsets.len() * 2);
            let mut start = 0usize;
            for &len in &offsets {
                let end = start + len;
                match step {
                    Step::Gpt2 => split_gpt2(&cps, start, end, &mut next),
                    Step::Llama3 => split_llama3(&cps, start, end, &mut next),
                    Step::Regex { re, collapsed: c } => {
                        let (hay, hoff) = if *c {
                            collapsed
                                .as_ref()
                                .expect("collapsed text is built when needed")
                        } else {
                            &*plain.get_or_insert_with(|| haystack(&cps, plain_char))
                        };
                        split_regex(re, hay, hoff, start, end, &mut next)?;
                    }
                }
                start = end;
            }
            offsets = next;
        }

        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0usize;
        for len in offsets {
            if len > 0 {
                words.push((boff[start], boff[start + len]));
            }
            start += len;
        }
        Ok(words)
    }
}

fn haystack(cps: &[char], map: fn(char) -> char) -> (String, Vec<usize>) {
    let mut s = String::with_capacity(cps.len());
    let mut off = Vec::with_capacity(cps.len() + 1);
    for &c in cps {
        off.push(s.len());
        s.push(map(c));
    }
    off.push(s.len());
    (s, off)
}

fn split_regex(
    re: &fancy_regex::Regex,
    hay: &str,
    hoff: &[usize],
    start: usize,
    end: usize,
    out: &mut Vec<usize>,
) -> Result<(), TokenizerError> {
    let base = hoff[start];
    let slice = &hay[base..hoff[end]];
    // char index (relative to `start`) of a byte offset within `slice`
    let to_char =
        |byte: usize| -> usize { hoff[start..=end].partition_point(|&o| o < base + byte) };
    let mut prev = 0usize; // in chars, relative
    for m in re.find_iter(slice) {
        let m = m.map_err(|e| TokenizerError::Regex {
            pattern: re.as_str().to_string(),
            message: e.to_string(),
        })?;
        let ms = to_char(m.start());
        let me = to_char(m.end());
        if ms > prev {
            out.push(ms - prev);
        }
        if me > ms {
            out.push(me - ms);
        }
        prev = me;
    }
    if prev < end - start {
        out.push(end - start - prev);
    }
    Ok(())
}

/// Cursor over one chunk `[ini, end)` of codepoints: out-of-chunk positions have no flags.
struct Chunk<'a> {
    cps: &'a [char],
    end: usize,
    prev_end: usize,
}

impl Chunk<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        if pos < self.end {
            Some(self.cps[pos])
        } else {
            None
        }
    }
    #[inline]
    fn flags(&self, pos: usize) -> u8 {
        if pos < self.end {
            unicode::flags(self.cps[pos])
        } else {
            0
        }
    }
    /// Ends the current word at `end`; returns its length.
    #[inline]
    fn add(&mut self, end: usize, out: &mut Vec<usize>) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            out.push(len);
        }
        self.prev_end = end;
        len
    }
    /// Length of a contraction ('s 't 're 've 'm 'll 'd) at `pos`, case-folded if `fold`.
    fn contraction(&self, pos: usize, fold: bool) -> usize {
        if self.cps[pos] != '\'' || pos + 1 >= self.end {
            return 0;
        }
        let low = |c: char| if fold { unicode::to_lower(c) } else { c };
        let n1 = low(self.cps[pos + 1]);
        if matches!(n1, 's' | 't' | 'm' | 'd') {
            return 2;
        }
        if pos + 2 < self.end {
            let n2 = low(self.cps[pos + 2]);
            if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return 3;
            }
        }
        0
    }
    /// Count of whitespace codepoints from `pos`, and the end of the last `\r`/`\n` among them.
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_nl = 0;
        while self.flags(pos + n) & WHITESPACE != 0 {
            if matches!(self.cps[pos + n], '\r' | '\n') {
                last_nl = pos + n + 1;
            }
            n += 1;
        }
        (n, last_nl)
    }
}

const WLN: u8 = WHITESPACE | LETTER | NUMBER;

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut ch = Chunk {
        cps,
        end,
        prev_end: ini,
    };
    let mut pos = ini;
    while pos < end {
        let c = cps[pos];
        let k = ch.contraction(pos, false);
        if k > 0 {
            pos += ch.add(pos + k, out);
            continue;
        }
        let f2 = if c == ' ' {
            ch.flags(pos + 1)
        } else {
            ch.flags(pos)
        };
        let space = usize::from(c == ' ');
        if f2 & LETTER != 0 {
            pos += space;
            while ch.flags(pos) & LETTER != 0 {
                pos += 1;
            }
            ch.add(pos, out);
            continue;
        }
        if f2 & NUMBER != 0 {
            pos += space;
            while ch.flags(pos) & NUMBER != 0 {
                pos += 1;
            }
            ch.add(pos, out);
            continue;
        }
        if f2 & WLN == 0 && f2 != 0 {
            pos += space;
            loop {
                let f = ch.flags(pos);
                if f & WLN != 0 || f == 0 {
                    break;
                }
                pos += 1;
            }
            ch.add(pos, out);
            continue;
        }
        let (nws, _) = ch.whitespace_run(pos);
        if nws > 1 && ch.cpt(pos + nws).is_some() {
            pos += nws - 1;
            ch.add(pos, out);
            continue;
        }
        if nws > 0 {
            pos += nws;
            ch.add(pos, out);
            continue;
        }
        pos += 1;
        ch.add(pos, out);
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut ch = Chunk {
        cps,
        end,
        prev_end: ini,
    };
    let mut pos = ini;
    while pos < end {
        let c = cps[pos];
        let f = ch.flags(pos);
        let k = ch.contraction(pos, true);
        if k > 0 {
            pos += ch.add(pos + k, out);
            continue;
        }
        if !(c == '\r' || c == '\n' || f & NUMBER != 0)
            && (f & LETTER != 0 || ch.flags(pos + 1) & LETTER != 0)
        {
            pos += 1;
            while ch.flags(pos) & LETTER != 0 {
                pos += 1;
            }
            ch.add(pos, out);
            continue;
        }
        if f & NUMBER != 0 {
            let mut run = pos;
            while ch.flags(pos) & NUMBER != 0 {
                pos += 1;
                if pos - run >= 3 {
                    ch.add(pos, out);
                    run = pos;
                }
            }
            ch.add(pos, out);
            continue;
        }
        let f2 = if c == ' ' { ch.flags(pos + 1) } else { f };
        if f2 & WLN == 0 && f != 0 {
            pos += usize::from(c == ' ');
            loop {
                let g = ch.flags(pos);
                if g & WLN != 0 || g == 0 {
                    break;
                }
                pos += 1;
            }
            while matches!(ch.cpt(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            ch.add(pos, out);
            continue;
        }
        let (nws, last_nl) = ch.whitespace_run(pos);
        if last_nl > 0 {
            pos = last_nl;
            ch.add(pos, out);
            continue;
        }
        if nws > 1 && ch.cpt(pos + nws).is_some() {
            pos += nws - 1;
            ch.add(pos, out);
            continue;
        }
        if nws > 0 {
            pos += nws;
            ch.add(pos, out);
            continue;
        }
        pos += 1;
        ch.add(pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(&pre_spec(Some(pre)).unwrap().regexes).unwrap();
        p.split(text)
            .unwrap()
            .into_iter()
            .map(|(a, b)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn gpt2_split() {
        assert_eq!(
            words("gpt-2", "Hello world  x's 12"),
            ["Hello", " world", " ", " x", "'s", " 12"]
        );
    }

    #[test]
    fn llama3_split() {
        assert_eq!(
            words("llama-bpe", "Hello 12345\n\n x"),
            ["Hello", " ", "123", "45", "\n\n", " x"]
        );
    }

    #[test]
    fn collapsed_regex() {
        assert_eq!(words("qwen2", "ab 12"), ["ab", " ", "1", "2"]);
        assert_eq!(words("smollm", "a1234"), ["a", "1", "2", "3", "4"]);
    }
}
