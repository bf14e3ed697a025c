//! Perplexity and KL divergence of a model over a text, as llama.cpp's `llama-perplexity`
//! computes them, so that its figures and ours can be compared and its base-logits files read
//! and written by either tool.
//!
//! The method (llama.cpp's): the text's tokens are cut into `n_chunks = tokens / ctx` chunks of
//! `ctx` tokens (the rest is dropped); each chunk is evaluated from an empty context, its first
//! token replaced by BOS when the model adds one; only the second half is scored (the logits at
//! positions `ctx/2 ..= ctx-2`, each predicting the next token), so that every scored token has
//! at least `ctx/2` tokens of context. The perplexity is `exp(mean NLL)`; its uncertainty is
//! `PPL · sqrt(var(NLL) / (n - 1))`. With a base file ([`base_file`]) the same positions are
//! compared with a base model's log-probabilities (KL divergence, Δp, same top token).
//!
//! Each chunk's unscored first half runs in passes of the session's ubatch; the scored half
//! runs one token per pass ([`Session::step`]), the path that reproduces llama.cpp's
//! single-token logits bit for bit. A session with a ubatch of 1 thus reproduces
//! `llama-perplexity -b 1` exactly; a larger ubatch computes the context half batched (faster,
//! with logits that differ in the last bits).

pub mod base_file;
pub mod numerics;
pub mod report;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::session::Session;
pub use base_file::{BaseHeader, BaseReader, BaseWriter};
pub use numerics::KldSums;

/// The smallest chunk: two positions of context and at least one scored.
pub const MIN_CTX: usize = 4;

/// Tokens a text needs for a perplexity run with chunks of `ctx`: llama.cpp refuses fewer than
/// two chunks' worth.
pub fn min_tokens(ctx: usize) -> usize {
    2 * ctx
}

/// Chunks a text of `n_tokens` gives with chunks of `ctx` tokens, at most `max_chunks`; an
/// error naming how many tokens are needed when the text is too short.
pub fn n_chunks(n_tokens: usize, ctx: usize, max_chunks: Option<usize>) -> Result<usize> {
    if ctx < MIN_CTX {
        return Err(EngineError::InvalidArgument(format!(
            "a chunk of {ctx} tokens is too short: perplexity needs chunks of at least {MIN_CTX} tokens"
        )));
    }
    if n_tokens < min_tokens(ctx) {
        return Err(EngineError::InvalidArgument(format!(
            "the text has {n_tokens} tokens, but perplexity with chunks of {ctx} tokens needs at least {} (two chunks): give a longer text or smaller chunks",
            min_tokens(ctx)
        )));
    }
    let n = n_tokens / ctx;
    Ok(max_chunks.map_or(n, |m| m.min(n)))
}

/// What a run reports after each chunk.
#[derive(Debug, Clone, Copy)]
pub struct ChunkDone<'a> {
    /// The chunk just done, from 1.
    pub index: usize,
    /// Chunks in the run.
    pub n_chunks: usize,
    /// Seconds this chunk took.
    pub seconds: f64,
    /// Perplexity over the chunks so far.
    pub ppl: f64,
    /// KL-divergence runs: the sums over the chunks so far.
    pub kld: Option<&'a KldSums>,
}

/// The sums of a perplexity run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerplexityResult {
    /// Chunks evaluated.
    pub n_chunks: usize,
    /// Tokens scored.
    pub count: usize,
    /// Σ negative log-likelihood of the scored tokens.
    pub nll: f64,
    /// Σ NLL².
    pub nll2: f64,
}

impl PerplexityResult {
    /// `exp(mean NLL)`.
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The perplexity's uncertainty (`None` when the NLLs' variance is not positive).
    pub fn uncertainty(&self) -> Option<f64> {
        numerics::ppl_estimate(self.nll, self.nll2, self.count).1
    }

    /// llama.cpp's `Final estimate: PPL = X +/- Y` line.
    pub fn final_line(&self) -> String {
        report::final_estimate(self.nll, self.nll2, self.count)
    }
}

/// The outcome of a KL-divergence run: the sums and every scored position's values.
#[derive(Debug, Clone, Default)]
pub struct KldResult {
    /// Chunks evaluated.
    pub n_chunks: usize,
    /// The sums the statistics are computed from.
    pub sums: KldSums,
    /// Each position's KL divergence, in order.
    pub kld_values: Vec<f32>,
    /// Each position's Δp, in order.
    pub p_diff_values: Vec<f32>,
}

impl KldResult {
    /// llama.cpp's final statistics (none for fewer than 100 positions).
    pub fn summary(&mut self) -> Vec<String> {
        report::kld_summary(&self.sums, &mut self.kld_values, &mut self.p_diff_values)
    }
}

/// Evaluates chunks on one session: the input buffer with BOS substituted, the interrupt flag
/// and the count of tokens processed.
struct ChunkRunner<'s, 'i> {
    session: &'s mut Session,
    ctx: usize,
    bos: Option<u32>,
    input: Vec<u32>,
    interrupt: Option<&'i AtomicBool>,
    processed: usize,
    requested: usize,
}

impl<'s, 'i> ChunkRunner<'s, 'i> {
    fn new(
        session: &'s mut Session,
        ctx: usize,
        n_chunks: usize,
        interrupt: Option<&'i AtomicBool>,
    ) -> Result<Self> {
        if session.ctx() < ctx {
            return Err(EngineError::InvalidArgument(format!(
                "the session's context of {} tokens is smaller than the chunks of {ctx}: open it with a context of {ctx}",
                session.ctx()
            )));
        }
        let tok = &session.model().tokenizer;
        let bos = if tok.add_bos() { tok.bos_id() } else { None };
        // Tokens evaluated per chunk: the last position's logits are never scored.
        let per_chunk = ctx - 1;
        Ok(ChunkRunner {
            session,
            ctx,
            bos,
            input: Vec::with_capacity(ctx / 2),
            interrupt,
            processed: 0,
            requested: per_chunk * n_chunks,
        })
    }

    /// Runs `chunk` (of `ctx` tokens) from an empty context and calls `on_row(i, logits,
    /// next)` for each scored position `i` (0-based within the second half).
    fn run(
        &mut self,
        chunk: &[u32],
        mut on_row: impl FnMut(usize, &[f32], usize) -> Result<()>,
    ) -> Result<()> {
        let first = self.ctx / 2;
        self.check_interrupt()?;
        self.session.reset();
        self.input.clear();
        self.input.extend_from_slice(&chunk[..first]);
        if let Some(bos) = self.bos {
            self.input[0] = bos;
        }
        self.session.advance(&self.input).map_err(|e| match e {
            EngineError::Interrupted { processed, .. } => EngineError::Interrupted {
                processed: self.processed + processed,
                requested: self.requested,
            },
            e => e,
        })?;
        self.processed += first;
        for j in first..self.ctx - 1 {
            self.check_interrupt()?;
            let logits = self.session.step(chunk[j])?;
            self.processed += 1;
            on_row(j - first, logits, chunk[j + 1] as usize)?;
        }
        Ok(())
    }

    fn check_interrupt(&self) -> Result<()> {
        if self.interrupt.is_some_and(|f| f.load(Ordering::Relaxed)) {
            return Err(EngineError::Interrupted {
                processed: self.processed,
                requested: self.requested,
            });
        }
        Ok(())
    }
}

fn check_finite(v: f64, position: usize) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(EngineError::NonFinite {
            what: "the logits",
            position,
        })
    }
}

/// Perplexity of the session's model over `tokens` (the whole text, tokenized with BOS as the
/// model adds it) in chunks of `ctx`, at most `max_chunks`. With `base_out`, also writes
/// llama.cpp's base-logits file there (the NLLs are then computed as llama.cpp computes them on
/// that path, in `f32`). `on_chunk` is called after each chunk; a raised `interrupt` stops the
/// run between tokens with [`EngineError::Interrupted`].
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    base_out: Option<&Path>,
    interrupt: Option<&AtomicBool>,
    mut on_chunk: impl FnMut(&ChunkDone),
) -> Result<PerplexityResult> {
    let n_chunks = n_chunks(tokens.len(), ctx, max_chunks)?;
    let n_vocab = session.model().n_vocab();
    let mut writer = match base_out {
        Some(path) => {
            let header = BaseHeader {
                n_ctx: ctx,
                n_vocab,
                n_chunks,
            };
            Some(BaseWriter::create(path, &header, tokens)?)
        }
        None => None,
    };
    let mut row = vec![0u16; numerics::row_len(n_vocab)];
    let mut runner = ChunkRunner::new(session, ctx, n_chunks, interrupt)?;
    let mut result = PerplexityResult {
        n_chunks,
        ..Default::default()
    };
    for i in 0..n_chunks {
        let t = Instant::now();
        let chunk = &tokens[i * ctx..(i + 1) * ctx];
        let first = ctx / 2;
        runner.run(chunk, |j, logits, next| {
            let v = match writer.as_mut() {
                Some(w) => {
                    let v = numerics::quantize_row(logits, next, &mut row);
                    w.write_row(&row)?;
                    v
                }
                None => numerics::nll(logits, next),
            };
            check_finite(v, first + j)?;
            result.nll += v;
            result.nll2 += v * v;
            result.count += 1;
            Ok(())
        })?;
        on_chunk(&ChunkDone {
            index: i + 1,
            n_chunks,
            seconds: t.elapsed().as_secs_f64(),
            ppl: result.ppl(),
            kld: None,
        });
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    Ok(result)
}

/// KL divergence of the session's model from the base model whose log-probabilities `base`
/// holds, over the file's tokens and chunks (at most `max_chunks`). `on_chunk` and `interrupt`
/// as for [`perplexity`].
pub fn kl_divergence(
    session: &mut Session,
    base: &mut BaseReader,
    max_chunks: Option<usize>,
    interrupt: Option<&AtomicBool>,
    mut on_chunk: impl FnMut(&ChunkDone),
) -> Result<KldResult> {
    let header = base.header.clone();
    let n_vocab = session.model().n_vocab();
    if header.n_vocab != n_vocab {
        return Err(EngineError::InvalidArgument(format!(
            "the base file has a vocabulary of {} tokens but the model has {n_vocab}",
            header.n_vocab
        )));
    }
    let ctx = header.n_ctx;
    let n_chunks = max_chunks.map_or(header.n_chunks, |m| m.min(header.n_chunks));
    let rows = header.rows_per_chunk();
    let tokens = std::mem::take(&mut base.tokens);
    let mut row = vec![0u16; header.row_len()];
    let mut out = KldResult {
        n_chunks,
        sums: KldSums::default(),
        kld_values: Vec::with_capacity(rows * n_chunks),
        p_diff_values: Vec::with_capacity(rows * n_chunks),
    };
    let mut runner = ChunkRunner::new(session, ctx, n_chunks, interrupt)?;
    let result = (|| {
        for i in 0..n_chunks {
            let t = Instant::now();
            let chunk = &tokens[i * ctx..(i + 1) * ctx];
            let first = ctx / 2;
            runner.run(chunk, |j, logits, next| {
                base.read_row(&mut row)?;
                let (kld, p_diff) = numerics::kld_position(logits, &row, next, &mut out.sums);
                check_finite(kld, first + j)?;
                out.kld_values.push(kld as f32);
                out.p_diff_values.push(p_diff);
                Ok(())
            })?;
            let ppl =
                numerics::mean_and_uncertainty(out.sums.sum_nll, out.sums.sum_nll2, out.sums.count)
                    .0
                    .exp();
            on_chunk(&ChunkDone {
                index: i + 1,
                n_chunks,
                seconds: t.elapsed().as_secs_f64(),
                ppl,
                kld: Some(&out.sums),
            });
        }
        Ok(())
    })();
    base.tokens = tokens;
    result.map(|()| out)
}
