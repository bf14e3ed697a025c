//! One constrained generation's state: the grammar's matcher, the trigger it waits for, and the
//! buffer the masked logits are written to.

use llguidance::Matcher;

use super::spec::{Constraint, ConstraintError};
use super::vocab::ConstraintVocab;
use crate::sampling::{Sampler, Verdict};

/// Candidates a sampled step asks the grammar about beyond top-k before it computes the mask.
const EXTRA_CHECKS: usize = 16;
/// After a step whose best candidates did not decide it, the next steps go straight to the
/// mask: 1, 2, 4, ... up to this many (a grammar that refuses what the model prefers).
const MAX_SKIP: u32 = 8;

/// Where a lazy constraint stands.
enum Phase {
    /// Free text until `trigger` appears; `text` holds the output so far (bounded: only the
    /// last bytes that could start the trigger are kept).
    Waiting { trigger: Vec<u8>, text: Vec<u8> },
    /// Every token must keep the output inside the grammar.
    Active,
}

/// The last run's output where a backend holds it (a GPU's logits): what
/// [`Guide::sample_on`] asks of it.
pub(crate) trait OutputOnDevice {
    /// The output's argmax (the lowest id on ties), computed where it lies.
    fn argmax(&self) -> crate::error::Result<u32>;
    /// `sampler`'s token from the output with the tokens `allowed` clears at -inf
    /// ([`crate::backend::Backend::sample_masked`]); `None`: to be done on the host.
    fn sample_masked(
        &self,
        allowed: &[u32],
        sampler: &mut Sampler,
    ) -> crate::error::Result<Option<u32>>;
    /// The output, copied to the host.
    fn host(&self) -> crate::error::Result<&[f32]>;
}

/// What [`Guide::choose`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The logits must be sampled, unmasked (a lazy constraint still waiting).
    Free,
    /// The grammar allows this token only: take it without sampling.
    Forced(u32),
    /// Sample the masked logits the guide wrote.
    Masked,
}

/// What asking the grammar about the best candidates gave ([`Guide::sample`]).
enum Checked {
    /// The step's token.
    Token(u32),
    /// The grammar forces bytes here, and llguidance may force tokens: the mask decides (it
    /// holds their canonical token).
    BytesForced,
    /// The candidates asked did not decide the step.
    Undecided,
}

/// A constraint being applied to one generation (see [`crate::constrain`]).
pub(crate) struct Guide {
    matcher: Matcher,
    phase: Phase,
    /// The logits with every disallowed token at -inf; `n_vocab` long, allocated once.
    masked: Vec<f32>,
    /// The last mask computed, end-of-generation tokens set as the grammar decides (bit
    /// `i % 32` of word `i / 32`); `n_vocab` bits, allocated once. A GPU uploads it.
    words: Vec<u32>,
    eog: Vec<u32>,
    /// Steps that computed a mask, and the time spent in the constraint (masks and commits).
    n_masks: u32,
    busy: std::time::Duration,
    /// Steps decided by asking about the best candidates (see [`Guide::sample`]).
    n_checked: u32,
    /// Steps left that go straight to the mask, and the next such run's length.
    skip: u32,
    backoff: u32,
    /// The fast path off (`EDGE_RUN_CONSTRAINT_CHECKS=0`): every step computes the mask.
    mask_only: bool,
    /// Whether llguidance may force tokens (a canonical tokenizer environment; see
    /// [`Guide::sample`]).
    may_force: bool,
}

impl Guide {
    /// Compiles `c` for a generation over `vocab`.
    pub(crate) fn new(vocab: &ConstraintVocab, c: &Constraint) -> Result<Guide, ConstraintError> {
        let matcher = vocab.compile(c)?;
        let phase = match &c.trigger {
            Some(t) if !t.is_empty() => Phase::Waiting {
                trigger: t.as_bytes().to_vec(),
                text: Vec::with_capacity(4 * t.len() + 64),
            },
            _ => Phase::Active,
        };
        Ok(Guide {
            phase,
            masked: vec![f32::NEG_INFINITY; vocab.trie().vocab_size()],
            words: vec![0; vocab.trie().vocab_size().div_ceil(32)],
            eog: vocab.eog_tokens().to_vec(),
            n_masks: 0,
            busy: std::time::Duration::ZERO,
            n_checked: 0,
            skip: 0,
            backoff: 0,
            mask_only: std::env::var("EDGE_RUN_CONSTRAINT_CHECKS").is_ok_and(|v| v == "0"),
            may_force: matcher
                .tok_env()
                .map_or(true, |e| e.tokenize_is_canonical()),
            matcher,
        })
    }

    /// Whether the grammar applies now (a lazy one has seen its trigger).
    pub(crate) fn is_active(&self) -> bool {
        matches!(self.phase, Phase::Active)
    }

    /// Decides how the next token is picked from `logits`: computes the grammar's mask and
    /// writes the masked logits, unless one token is forced or the constraint still waits.
    pub(crate) fn choose(&mut self, logits: &[f32]) -> Result<Choice, ConstraintError> {
        let t0 = std::time::Instant::now();
        let choice = self.choose_inner(logits);
        self.busy += t0.elapsed();
        choice
    }

    /// Masks computed, steps decided without one, and the time the constraint took (masks,
    /// checks and token commits), so far.
    pub(crate) fn stats(&self) -> (u32, u32, std::time::Duration) {
        (self.n_masks, self.n_checked, self.busy)
    }

    fn choose_inner(&mut self, logits: &[f32]) -> Result<Choice, ConstraintError> {
        let choice = self.decide()?;
        if choice == Choice::Masked {
            self.write_masked(logits);
        }
        Ok(choice)
    }

    /// Decides a step without the logits where the grammar can: a waiting constraint, one
    /// token allowed, or the end forced. Otherwise computes the mask into `words`, every
    /// end-of-generation token of the model allowed where the grammar accepts (not only the
    /// one the trie calls EOS) and refused elsewhere, and says [`Choice::Masked`].
    fn decide(&mut self) -> Result<Choice, ConstraintError> {
        if !self.is_active() {
            return Ok(Choice::Free);
        }
        if self.matcher.is_stopped() {
            // The grammar is complete and admits nothing more: end here.
            return Ok(Choice::Forced(self.eog[0]));
        }
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstraintError::new("constrained decoding", e.to_string()))?;
        self.n_masks += 1;
        let eos_allowed = self.eog.iter().any(|&t| mask.is_allowed(t));
        let n_text = mask.num_set() - self.eog.iter().filter(|&&t| mask.is_allowed(t)).count();
        if n_text == 0 {
            if eos_allowed {
                return Ok(Choice::Forced(self.eog[0]));
            }
            return Err(ConstraintError::new(
                "constrained decoding",
                "the grammar allows no token here (a grammar whose strings this vocabulary cannot spell?)",
            ));
        }
        if n_text == 1 && !eos_allowed {
            let mut only = 0u32;
            mask.iter_set_entries(|i| only = i as u32);
            return Ok(Choice::Forced(only));
        }
        let src = mask.as_slice();
        let n = self.words.len().min(src.len());
        self.words[..n].copy_from_slice(&src[..n]);
        self.words[n..].fill(0);
        for &t in &self.eog {
            let (w, bit) = (t as usize / 32, 1u32 << (t % 32));
            if let Some(word) = self.words.get_mut(w) {
                *word = if eos_allowed {
                    *word | bit
                } else {
                    *word & !bit
                };
            }
        }
        // Bits past the vocabulary (the last word's tail) allow nothing.
        let n_vocab = self.masked.len();
        if !n_vocab.is_multiple_of(32) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << (n_vocab % 32)) - 1;
            }
        }
        Ok(Choice::Masked)
    }

    /// Writes `logits` under the mask in `words` to `masked`: disallowed tokens at -inf.
    fn write_masked(&mut self, logits: &[f32]) {
        let n = self.masked.len().min(logits.len());
        self.masked[..n].fill(f32::NEG_INFINITY);
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = w * 32 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i < n {
                    self.masked[i] = logits[i];
                }
            }
        }
    }

    /// Samples with `sampler` from `logits` under the constraint (the CPU path; a waiting lazy
    /// constraint samples the logits as they are).
    ///
    /// A vocabulary-wide mask costs from 0.1 ms to several (a grammar with a lexeme per
    /// character), while asking the grammar about one token costs microseconds. So an active
    /// step first asks about the best candidates ([`Sampler::sample_checked`]: greedy's
    /// argmax; with top-k, the best until `top_k` are allowed) and computes the mask only
    /// where they do not decide the step. Both give the same token and the same generator
    /// state (tested: `sample_checked_equals_sampling_the_masked_logits`). That needs the mask
    /// to be the byte-level relation `validate_tokens` checks, which it is with edge-run's
    /// vocabulary: an approximate, non-canonical tokenizer environment, for which llguidance
    /// never forces tokens (its forcing is gated on a canonical tokenizer). With a canonical
    /// one (`may_force`), a step where the grammar forces bytes gets a mask of only their
    /// canonical token, which single-token questions would not reproduce: such steps would
    /// take the mask. Asking llguidance for the forced bytes pushes them into its parser, so
    /// that is done only then.
    pub(crate) fn sample(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
    ) -> Result<u32, ConstraintError> {
        if self.is_active() && !self.matcher.is_stopped() && !self.mask_only {
            if self.skip > 0 {
                self.skip -= 1;
            } else {
                let t0 = std::time::Instant::now();
                let checked = self.sample_checked(logits, sampler);
                self.busy += t0.elapsed();
                match checked? {
                    Checked::Token(t) => {
                        self.n_checked += 1;
                        self.backoff = 0;
                        return Ok(t);
                    }
                    // Forced bytes make a cheap mask: no reason to skip the next steps' checks.
                    Checked::BytesForced => {}
                    Checked::Undecided => {
                        self.backoff = (self.backoff * 2).clamp(1, MAX_SKIP);
                        self.skip = self.backoff;
                    }
                }
            }
        }
        Ok(match self.choose(logits)? {
            Choice::Free => sampler.sample(logits),
            Choice::Forced(t) => t,
            Choice::Masked => sampler.sample(&self.masked),
        })
    }

    /// The step decided from the best candidates, where they decide it (see [`Guide::sample`]).
    fn sample_checked(
        &mut self,
        logits: &[f32],
        sampler: &mut Sampler,
    ) -> Result<Checked, ConstraintError> {
        if self.forces_bytes()? {
            return Ok(Checked::BytesForced);
        }
        let (matcher, eog) = (&mut self.matcher, &self.eog);
        let n_vocab = self.masked.len();
        // Whether the grammar accepts here (the mask then allows every EOG token), asked once.
        let mut accepts: Option<bool> = None;
        sampler
            .sample_checked(logits, EXTRA_CHECKS, |token| {
                verdict(matcher, eog, n_vocab, &mut accepts, token)
            })
            .map(|t| t.map_or(Checked::Undecided, Checked::Token))
    }

    /// [`Guide::sample`] where the logits stay with the backend (a GPU, `out`): the same token
    /// and the same generator state as `sample` of the host copy, with one token id copied
    /// back per step instead of the logits. Greedy asks the grammar about the device's
    /// argmax first (the masked argmax where it is allowed text, as `sample`'s first check);
    /// otherwise the mask is computed without the logits and handed to the backend, which
    /// masks and samples where they lie ([`crate::backend::Backend::sample_masked`]). A
    /// sampler that must see the logits (a repetition penalty with history) or a backend
    /// that declines gets the host copy.
    pub(crate) fn sample_on(
        &mut self,
        out: &impl OutputOnDevice,
        sampler: &mut Sampler,
    ) -> crate::error::Result<u32> {
        // Greedy without a penalty to apply: its token is the (masked) argmax.
        let greedy = match sampler.device_sampling(1, 1) {
            None => return Ok(self.sample(out.host()?, sampler)?),
            Some(ds) => ds.greedy,
        };
        if !self.is_active() {
            return Ok(self.sample(out.host()?, sampler)?);
        }
        if greedy && !self.matcher.is_stopped() && !self.mask_only {
            let best = out.argmax()?;
            let t0 = std::time::Instant::now();
            let checked = self.check_one(best);
            self.busy += t0.elapsed();
            if checked? {
                self.n_checked += 1;
                return Ok(best);
            }
        }
        let t0 = std::time::Instant::now();
        let choice = self.decide();
        self.busy += t0.elapsed();
        Ok(match choice? {
            Choice::Forced(t) => t,
            Choice::Free => sampler.sample(out.host()?),
            Choice::Masked => match out.sample_masked(&self.words, sampler)? {
                Some(t) => t,
                None => {
                    let logits = out.host()?;
                    self.write_masked(logits);
                    sampler.sample(&self.masked)
                }
            },
        })
    }

    /// Whether `token`, the unmasked argmax, is the step's token: allowed text, and no bytes
    /// forced here that llguidance would turn into its own token (see [`Guide::sample`]).
    fn check_one(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.forces_bytes()? {
            return Ok(false);
        }
        let n_vocab = self.masked.len();
        let v = verdict(&mut self.matcher, &self.eog, n_vocab, &mut None, token)?;
        Ok(v == Verdict::Text)
    }

    /// Whether a step must take the mask before asking about candidates: the grammar forces
    /// bytes here and llguidance may turn them into its own token (see [`Guide::sample`]).
    /// An error the matcher has met is returned instead.
    fn forces_bytes(&mut self) -> Result<bool, ConstraintError> {
        if self.may_force && !self.matcher.compute_ff_bytes().is_empty() {
            return Ok(true);
        }
        match self.matcher.get_error() {
            Some(e) => Err(ConstraintError::new("constrained decoding", e)),
            None => Ok(false),
        }
    }

    /// Whether `token` ends generation under the grammar (an EOG token).
    pub(crate) fn is_eog(&self, token: u32) -> bool {
        self.eog.contains(&token)
    }

    /// Records the emitted `token` (whose bytes are `piece`): advances the grammar, or for a
    /// waiting constraint looks for the trigger and, once seen, feeds the grammar the output
    /// from the trigger's first byte.
    pub(crate) fn accept(
        &mut self,
        vocab: &ConstraintVocab,
        token: u32,
        piece: &[u8],
        is_control: bool,
    ) -> Result<(), ConstraintError> {
        let t0 = std::time::Instant::now();
        let r = self.accept_inner(vocab, token, piece, is_control);
        self.busy += t0.elapsed();
        r
    }

    fn accept_inner(
        &mut self,
        vocab: &ConstraintVocab,
        token: u32,
        piece: &[u8],
        is_control: bool,
    ) -> Result<(), ConstraintError> {
        let fail = |m: String| ConstraintError::new("constrained decoding", m);
        match &mut self.phase {
            Phase::Active => {
                if self.is_eog(token) {
                    return Ok(());
                }
                self.matcher
                    .consume_token(token)
                    .map_err(|e| fail(e.to_string()))
            }
            Phase::Waiting { trigger, text } => {
                if is_control && piece == trigger.as_slice() {
                    // A special token that is the trigger: the grammar starts with it.
                    self.phase = Phase::Active;
                    return self
                        .matcher
                        .consume_token(token)
                        .map_err(|e| fail(e.to_string()));
                }
                text.extend_from_slice(piece);
                let Some(at) = find(text, trigger) else {
                    // Keep only what could still be the start of the trigger.
                    let keep = trigger.len().saturating_sub(1).min(text.len());
                    let cut = text.len() - keep;
                    text.drain(..cut);
                    return Ok(());
                };
                let rest = text[at..].to_vec();
                self.phase = Phase::Active;
                let tokens = vocab.tokenize_text(&rest);
                self.matcher.consume_tokens(&tokens).map_err(|e| {
                    fail(format!(
                        "the output after the trigger does not follow the grammar: {e}"
                    ))
                })
            }
        }
    }
}

/// What the grammar says of `token` next (without consuming it): refused, text, or an allowed
/// end of generation. `accepts` caches whether the grammar accepts here, asked once a step.
fn verdict(
    matcher: &mut Matcher,
    eog: &[u32],
    n_vocab: usize,
    accepts: &mut Option<bool>,
    token: u32,
) -> Result<Verdict, ConstraintError> {
    if (token as usize) >= n_vocab {
        Ok(Verdict::Refused)
    } else if eog.contains(&token) {
        let ok = match *accepts {
            Some(ok) => ok,
            None => *accepts.insert(accepts_end(matcher, eog, n_vocab)?),
        };
        Ok(if ok {
            Verdict::EndOfGeneration
        } else {
            Verdict::Refused
        })
    } else if valid(matcher, token)? {
        Ok(Verdict::Text)
    } else {
        Ok(Verdict::Refused)
    }
}

/// Whether the grammar allows `token` next (without consuming it).
fn valid(matcher: &mut Matcher, token: u32) -> Result<bool, ConstraintError> {
    matcher
        .validate_tokens(&[token])
        .map(|n| n == 1)
        .map_err(|e| ConstraintError::new("constrained decoding", e.to_string()))
}

/// Whether the grammar allows one of the end-of-generation tokens `eog` next, as the mask
/// decides it: any of them (the mask path then allows all).
fn accepts_end(
    matcher: &mut Matcher,
    eog: &[u32],
    n_vocab: usize,
) -> Result<bool, ConstraintError> {
    for &e in eog {
        if (e as usize) < n_vocab && valid(matcher, e)? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
#[path = "guide_tests.rs"]
mod tests;
