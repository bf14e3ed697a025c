//! The prompt cache of a session: the tokens its KV cache holds, truncation to a prefix, and
//! the reuse of the longest prefix a new prompt shares with them, so that a prompt repeating
//! what the session already processed (a system prompt, the earlier turns of a chat) only
//! costs its new tokens.

use super::Session;
use crate::error::{EngineError, Result};

impl Session {
    /// The tokens the KV cache holds, position by position (`n_past` of them). After a context
    /// shift ([`Session::shift_context`]) they are the tokens that remain, in their new
    /// positions.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many of the first [`Session::tokens`] [`Session::reuse_prefix`] may reuse: the
    /// prefix whose keys and values are exactly what a fresh session processing those tokens
    /// computes. That is all of them, except after a context shift: the keys after the kept
    /// positions were re-rotated and computed while the dropped tokens were in view, so only
    /// the kept ones remain exact.
    pub fn n_reusable(&self) -> usize {
        self.n_exact.min(self.tokens.len())
    }

    /// Keeps only the first `n` positions of the context (the later ones are forgotten; their
    /// rows are overwritten by the next tokens). The logits of the last run are no longer
    /// readable: process at least one token before sampling.
    ///
    /// Errors: `n` above [`Session::n_past`], or (on models with sliding-window layers) a cut
    /// so deep that the ring rows of the window before position `n` were already overwritten by
    /// later positions ([`EngineError::Unsupported`]; [`Session::reset`] always works).
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        let n_past = self.n_past();
        if n > n_past {
            return Err(EngineError::InvalidArgument(format!(
                "cannot truncate the context to {n} positions: it holds {n_past}"
            )));
        }
        if n == n_past {
            return Ok(());
        }
        if !self.can_truncate(n) {
            return Err(EngineError::Unsupported(
                format!(
                    "cannot truncate the context from {n_past} to {n} positions: the sliding-window \
                     layers' ring rows before position {n} were overwritten by later positions; \
                     reset the session and process the prompt again"
                )
                .into(),
            ));
        }
        self.tokens.truncate(n);
        self.n_exact = self.n_exact.min(n);
        self.has_logits = false;
        Ok(())
    }

    /// Whether the rows of the positions a token at `n` still sees are intact in every
    /// sliding-window layer: a ring of `rows` rows keeps position p until position p + rows is
    /// written, and the token at n sees back to n + 1 - window.
    fn can_truncate(&self, n: usize) -> bool {
        let p = &self.model.params;
        let n_past = self.n_past();
        (0..p.n_layer).all(|l| match p.layer_window(l) {
            None => true,
            Some(window) => {
                let rows = self.ctx.min(window.saturating_add(self.ubatch));
                rows == self.ctx || n_past - n + window <= rows
            }
        })
    }

    /// Prepares the session for `prompt`, the whole context wanted (e.g. a conversation
    /// rendered from its start): keeps the longest prefix of [`Session::tokens`] that
    /// `prompt` starts with (at most [`Session::n_reusable`] tokens, and never the whole
    /// prompt: its last token always runs again, for its logits), drops the rest, and returns
    /// how many tokens were kept. The caller then processes `prompt[kept..]`;
    /// [`Session::generate_cached`] does both. The result is that of a fresh session
    /// processing `prompt` (the kept rows are the ones it would compute).
    ///
    /// Where the prefix cannot be cut there (a sliding-window model whose ring rows were
    /// overwritten), the session is reset and 0 returned. Allocates nothing.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let limit = self.n_reusable().min(prompt.len().saturating_sub(1));
        let common = self.tokens[..limit]
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if self.truncate(common).is_err() {
            self.reset();
            return 0;
        }
        common
    }
}
