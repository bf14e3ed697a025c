//! A model's vocabulary as llguidance sees it ([`ConstraintVocab`]) and the compilation of a
//! [`Constraint`] into a matcher.

use std::sync::Arc;

use edge_tokenizers::Tokenizer;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};

use super::gbnf::gbnf_to_lark;
use super::spec::{Constraint, ConstraintError, ConstraintKind};

/// A model's vocabulary as llguidance sees it: the token trie and the grammar compiler, built
/// once per model ([`crate::model::Model::constraint_vocab`]) and shared by every constrained generation.
pub struct ConstraintVocab {
    factory: ParserFactory,
    /// Every end-of-generation token of the model (the trie's EOS set).
    eog: Vec<u32>,
}

impl std::fmt::Debug for ConstraintVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintVocab")
            .field("n_vocab", &self.trie().vocab_size())
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

/// The prefix toktrie gives special tokens' bytes, so that no text can spell them.
const SPECIAL_MARKER: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

impl ConstraintVocab {
    /// Builds the trie from a model's tokenizer (`n` tokens, as many as its logits): each
    /// token's bytes; control tokens (and tokens that render to nothing) marked special,
    /// reachable only through a grammar naming them.
    pub fn new(tok: &Tokenizer, n: usize) -> Result<ConstraintVocab, ConstraintError> {
        let t0 = std::time::Instant::now();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = tok.piece(id);
            if tok.is_control(id) || piece.is_empty() {
                let mut w = vec![SPECIAL_MARKER];
                match tok.token_text(id) {
                    Some(t) if !t.is_empty() => w.extend_from_slice(t.as_bytes()),
                    _ => w.extend_from_slice(format!("<[unused {id}]>").as_bytes()),
                }
                words.push(w);
            } else {
                words.push(piece.to_vec());
            }
        }
        let mut eog: Vec<u32> = (0..n as u32).filter(|&i| tok.is_eog(i)).collect();
        if eog.is_empty() {
            eog.extend(tok.eos_id());
        }
        let Some(&first_eog) = eog.first() else {
            return Err(ConstraintError::new(
                "constrained decoding",
                "the model has no end-of-generation token, so a grammar could never end",
            ));
        };
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: first_eog,
            tok_bos: tok.bos_id(),
            tok_pad: tok.pad_id(),
            tok_unk: tok.unk_id(),
            tok_end_of_turn: tok.eot_id(),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::new("constrained decoding", e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        log::info!(
            "constraint: token trie of {n} tokens built in {:.1} ms (once per model)",
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(ConstraintVocab { factory, eog })
    }

    pub(super) fn trie(&self) -> &TokTrie {
        self.factory.tok_env().tok_trie()
    }

    /// The model's end-of-generation tokens.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Compiles `c` into a matcher at the start of the output; the error names the problem.
    pub(crate) fn compile(&self, c: &Constraint) -> Result<Matcher, ConstraintError> {
        let what = c.kind.name();
        let grammar = match c.kind {
            ConstraintKind::Gbnf => {
                let lark = gbnf_to_lark(&c.source).map_err(|m| ConstraintError::new(what, m))?;
                TopLevelGrammar::from_lark(lark)
            }
            ConstraintKind::Lark => TopLevelGrammar::from_lark(c.source.clone()),
            ConstraintKind::Regex => TopLevelGrammar::from_regex(&c.source),
            ConstraintKind::JsonSchema => {
                let mut schema: serde_json::Value = serde_json::from_str(&c.source)
                    .map_err(|e| ConstraintError::new(what, format!("not valid JSON: {e}")))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(ConstraintError::new(
                        what,
                        "must be a JSON object (or true/false), e.g. {\"type\": \"object\"}",
                    ));
                }
                json_options().apply_to(&mut schema);
                TopLevelGrammar::from_json_schema(schema)
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::new(what, explain(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::new(what, explain(&e)));
        }
        Ok(matcher)
    }

    /// Greedy tokenization of `bytes` over the trie (text tokens only).
    pub(crate) fn tokenize_text(&self, bytes: &[u8]) -> Vec<u32> {
        self.trie().greedy_tokenize(bytes)
    }
}

/// How JSON is written under a schema: one line, with Python `json.dumps`'s separators (what
/// chat templates show models), no free whitespace (a small model would pad forever).
pub(super) fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

/// llguidance's message, with the fix for its most common refusal.
fn explain(msg: &str) -> String {
    let msg = msg.trim();
    if msg.contains("Unimplemented keys") || msg.contains("Unknown keys") {
        format!("{msg}: this schema keyword is not supported; remove it or express it with the supported ones (type, properties, required, enum, const, items, minItems/maxItems, minimum/maximum, pattern, minLength/maxLength, $ref/$defs, anyOf/oneOf/allOf)")
    } else {
        msg.to_string()
    }
}
