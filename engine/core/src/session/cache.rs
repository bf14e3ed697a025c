//! The prompt cache of a session: the tokens its KV cache holds, truncation to a prefix, and
//! the reuse of the longest prefix a new prompt shares with them, so that a prompt repeating
//! what the session already processed (a system prompt, the earlier turns of a chat) only
//! costs its new tokens.

use super::chunks::{final_chunk_is_single, rerun_matches_fresh};
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
        self.last_run = 0;
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

    /// How many tokens of `prompt` [`Session::reuse_prefix`] would keep, without changing
    /// anything: e.g. to send a request to the session (of several) that shares most of it.
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let limit = self.n_reusable().min(prompt.len().saturating_sub(1));
        let mut common = self.tokens[..limit]
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // A one-token run takes the decode graph, whose rounding differs from the prompt
        // graph's; runs of several tokens give the same bits however they are split. So the
        // rest is re-run in chunks of two or more, plus a last single token exactly where a
        // fresh session's last chunk is one token: a few more tokens run again at most.
        while common > 0 && !rerun_matches_fresh(prompt.len() - common, prompt.len(), self.ubatch) {
            common -= 1;
        }
        if self.can_truncate(common) {
            common
        } else {
            0
        }
    }

    /// Prepares the session for `prompt`, the whole context wanted (e.g. a conversation
    /// rendered from its start): keeps the longest prefix of [`Session::tokens`] that
    /// `prompt` starts with (at most [`Session::n_reusable`] tokens, and never the whole
    /// prompt: its last token always runs again, for its logits), drops the rest, and returns
    /// how many tokens were kept. The caller then processes `prompt[kept..]` with
    /// [`Session::prefill_rest`]; [`Session::generate_cached`] does all this. When the kept
    /// rows were computed from a prompt (not generated one token at a time), the logits are
    /// those of a fresh session processing `prompt`, bit for bit; rows of generated tokens come
    /// from the one-token graph, whose rounding differs slightly from the prompt graph's, so
    /// reusing them (as llama.cpp's server does) gives logits that may differ in their last
    /// bits from a fresh session's.
    ///
    /// Where the prefix cannot be cut there (a sliding-window model whose ring rows were
    /// overwritten by later positions), the session is reset and 0 returned. Allocates nothing.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self.reusable_prefix(prompt);
        if self.truncate(common).is_err() {
            self.reset();
            return 0;
        }
        common
    }
}

impl Session {
    /// Processes `rest`, the tail of a prompt of `prompt_len` tokens whose head
    /// [`Session::reuse_prefix`] kept, in the chunks that give a fresh session's bits (see
    /// there), and returns the logits of its last token.
    pub fn prefill_rest(&mut self, rest: &[u32], prompt_len: usize) -> Result<&[f32]> {
        let final_single = final_chunk_is_single(prompt_len, self.ubatch);
        self.advance_chunked(rest, "prompt", Some(final_single))?;
        self.try_logits()
    }
}
