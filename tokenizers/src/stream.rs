//! Streaming detokenization: bytes of generated tokens in, complete UTF-8 text out.

use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into text, holding back the bytes of a UTF-8 character until the
/// token that completes it arrives (byte-level BPE and `<0xXX>` tokens split characters).
/// Bytes that can never form a character become U+FFFD. Its buffers are sized up front for
/// pieces of up to [`StreamDecoder::RESERVED`] bytes and reused: no allocation per token.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    out: String,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    /// Bytes reserved for pending and emitted text: more than any real token piece (a longer
    /// one still works; the buffer grows once).
    pub const RESERVED: usize = 256;

    /// A decoder with nothing pending.
    pub fn new() -> Self {
        StreamDecoder {
            pending: Vec::with_capacity(Self::RESERVED),
            out: String::with_capacity(Self::RESERVED * 3),
        }
    }

    /// Adds token `id`; returns the text completed by it (`None` when nothing is complete yet).
    pub fn push(&mut self, id: u32, tokenizer: &Tokenizer) -> Option<&str> {
        self.push_bytes(tokenizer.piece(id))
    }

    /// Adds raw bytes (a token's piece); returns the text they complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Option<&str> {
        self.out.clear();
        self.pending.extend_from_slice(bytes);
        let consumed = drain_utf8(&self.pending, &mut self.out, false);
        self.pending.drain(..consumed);
        (!self.out.is_empty()).then_some(self.out.as_str())
    }

    /// Ends the stream: whatever is still pending, incomplete characters as U+FFFD.
    pub fn flush(&mut self) -> Option<&str> {
        self.out.clear();
        let consumed = drain_utf8(&self.pending, &mut self.out, true);
        self.pending.drain(..consumed);
        (!self.out.is_empty()).then_some(self.out.as_str())
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Forgets anything pending.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.out.clear();
    }
}

/// Appends the decodable prefix of `buf` to `out`; returns how many bytes were used. An
/// incomplete trailing sequence is kept unless `finish`.
fn drain_utf8(buf: &[u8], out: &mut String, finish: bool) -> usize {
    let mut pos = 0;
    while pos < buf.len() {
        match std::str::from_utf8(&buf[pos..]) {
            Ok(s) => {
                out.push_str(s);
                pos = buf.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // SAFETY-free: the prefix was just validated
                out.push_str(std::str::from_utf8(&buf[pos..pos + valid]).unwrap_or_default());
                pos += valid;
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        pos += n;
                    }
                    None => {
                        if finish {
                            out.push('\u{FFFD}');
                            pos = buf.len();
                        }
                        break;
                    }
                }
            }
        }
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        let bytes = "a€😀".as_bytes(); // 1 + 3 + 4 bytes
        let mut got = String::new();
        let mut outputs = Vec::new();
        for b in bytes {
            let o = d.push_bytes(std::slice::from_ref(b)).map(str::to_string);
            if let Some(s) = &o {
                got.push_str(s);
            }
            outputs.push(o);
        }
        assert_eq!(got, "a€😀");
        assert_eq!(outputs[0].as_deref(), Some("a"));
        assert_eq!(outputs[1], None);
        assert_eq!(outputs[2], None);
        assert_eq!(outputs[3].as_deref(), Some("€"));
        assert_eq!(outputs[7].as_deref(), Some("😀"));
        assert!(d.flush().is_none());
    }

    #[test]
    fn invalid_and_truncated_bytes_become_replacement() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push_bytes(&[0xE2, 0x82]), None);
        // 'A' cannot continue the sequence
        assert_eq!(d.push_bytes(b"A"), Some("\u{FFFD}A"));
        assert_eq!(d.push_bytes(&[0xF0, 0x9F]), None);
        assert!(d.has_pending());
        assert_eq!(d.flush(), Some("\u{FFFD}"));
        assert!(!d.has_pending());
    }

    #[test]
    fn multibyte_char_split_across_byte_tokens() {
        // A SentencePiece vocabulary with byte tokens: '€' = E2 82 AC arrives as three tokens.
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..256 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        tokens.push("\u{2581}a".into());
        types.push(1);
        let n = tokens.len();
        let tok = Tokenizer::from_config(crate::VocabConfig {
            model: "llama".into(),
            tokens,
            token_types: Some(types),
            scores: Some(vec![0.0; n]),
            ..Default::default()
        })
        .unwrap();
        let ids = tok.encode("a€", false, false).unwrap();
        assert_eq!(ids, vec![259, 3 + 0xE2, 3 + 0x82, 3 + 0xAC]);
        let mut d = StreamDecoder::new();
        let outs: Vec<Option<String>> = ids
            .iter()
            .map(|&id| d.push(id, &tok).map(str::to_string))
            .collect();
        assert_eq!(
            outs,
            vec![Some(" a".to_string()), None, None, Some("€".to_string())]
        );
        assert_eq!(tok.decode(&ids), " a€");
    }
}
