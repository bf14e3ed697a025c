//! Text generation on a [`Session`]: prefill a prompt, then sample, stream and feed back one token
//! at a time until a stop condition, with a callback ([`Session::generate`]) or an iterator
//! ([`Session::generator`]) that the caller can stop at any token.
//!
//! Generation allocates its sampler and text buffers once per call and nothing per token (the
//! session's arena and KV cache were allocated when it was opened).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Some(path) = std::env::var_os("EDGE_RUN_MODEL").map(std::path::PathBuf::from).or_else(|| {
//! #     let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
//! #     p.exists().then_some(p)
//! # }) else { return Ok(()) };
//! use std::ops::ControlFlow;
//! use std::sync::Arc;
//! use edge_engine::generate::{GenerateOptions, StopReason};
//! use edge_engine::model::Model;
//! use edge_engine::session::{Session, SessionConfig};
//!
//! let model = Arc::new(Model::load(&path)?);
//! let mut session = Session::new(model.clone(), &SessionConfig { ctx: Some(256), ..Default::default() })?;
//! let prompt = model.tokenize("The capital of France is", true, true)?;
//! let mut text = String::new();
//! let done = session.generate(&prompt, &GenerateOptions::greedy(8), |event| {
//!     text.push_str(event.text);
//!     // Stop at the first full stop; returning Continue goes on.
//!     if text.contains('.') { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
//! })?;
//! assert_eq!(text, " Paris.");
//! assert_eq!(done.stop_reason, StopReason::Stopped);
//! # Ok(())
//! # }
//! ```

use std::ops::ControlFlow;

use crate::constrain::{Constraint, Guide};
use crate::error::{EngineError, Result};
use crate::sampling::{Sampler, SamplerConfig};
use crate::session::Session;
use edge_tokenizers::StreamDecoder;

// A session is one conversation's state; it may be moved to (and used on) any one thread.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Session>();
};

/// How to generate: how much, how to sample, when to stop.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate; 0 only processes the prompt.
    pub max_tokens: usize,
    /// Sampler settings ([`SamplerConfig::default`]: llama.cpp's defaults, seed 42; a
    /// temperature of 0 is greedy). The same settings and seed give the same tokens.
    pub sampling: SamplerConfig,
    /// Stop at an end-of-generation token (EOS, end of turn); the token is not emitted but
    /// reported in [`StopReason::EndOfGeneration`]. Without it such tokens are generated like
    /// any other.
    pub stop_at_eog: bool,
    /// Stream the text of control tokens (`<|im_start|>`) too; by default they add no text, as
    /// llama.cpp's detokenizer does.
    pub render_special: bool,
    /// A grammar, JSON schema or regex the output must follow (see [`crate::constrain`]): the
    /// logits are masked before sampling, forced tokens skip it, and generation ends (with
    /// [`StopReason::EndOfGeneration`]) only where the constraint accepts, or when it admits
    /// nothing more. `None`: unconstrained.
    pub constraint: Option<Constraint>,
}

impl Default for GenerateOptions {
    /// 256 tokens, llama.cpp's default sampler, stop at end of generation, no special text.
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplerConfig::default(),
            stop_at_eog: true,
            render_special: false,
            constraint: None,
        }
    }
}

impl GenerateOptions {
    /// Greedy decoding (argmax at every step) of at most `max_tokens` tokens: deterministic,
    /// and what llama.cpp's reference outputs use.
    pub fn greedy(max_tokens: usize) -> Self {
        GenerateOptions {
            max_tokens,
            sampling: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            ..GenerateOptions::default()
        }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// [`GenerateOptions::max_tokens`] tokens were generated.
    MaxTokens,
    /// The model produced this end-of-generation token (not emitted).
    EndOfGeneration(u32),
    /// The caller stopped it (the callback returned [`ControlFlow::Break`]).
    Stopped,
    /// The context is full: no position is left for the next token.
    ContextFull,
}

/// One step of the stream handed to the callback of [`Session::generate`].
#[derive(Debug, Clone, Copy)]
pub struct GenerateEvent<'a> {
    /// The generated token; `None` only for the last event of a generation that stopped with
    /// bytes of an incomplete UTF-8 character held back, whose `text` is their lossy rendering
    /// (U+FFFD). That event cannot stop anything: its return value is ignored.
    pub token: Option<u32>,
    /// The text this token completes: may be empty (a token that starts a multi-byte
    /// character) or hold bytes of earlier tokens. The events' texts joined are the output.
    pub text: &'a str,
}

/// The result of a finished generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generated {
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Tokens generated (emitted to the caller).
    pub n_tokens: usize,
    /// The last token sampled but not yet in the KV cache: the last emitted token, or the
    /// end-of-generation token. Every earlier token (prompt and output) is in the cache; to
    /// continue the conversation, prefill this token before the next input. `None` when
    /// nothing was sampled (`max_tokens` 0).
    pub pending_token: Option<u32>,
}

impl Session {
    /// Generates from `prompt` (appended to what the session already holds), calling
    /// `on_event` with every token and the text it completes, until `options.max_tokens`, an
    /// end-of-generation token, a full context, or `on_event` returning
    /// [`ControlFlow::Break`].
    ///
    /// An empty `prompt` continues from the logits of the last prefill/step. Errors (a prompt
    /// that does not fit the context, an out-of-vocabulary id, bad sampler settings) are
    /// returned before anything is generated; a full context during generation is a stop
    /// reason, not an error. Each call starts a fresh sampler from `options` (so a seed
    /// reproduces its tokens); the repetition penalty sees this call's prompt and output. A
    /// constraint that does not compile is an error before anything runs.
    pub fn generate<F>(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_event: F,
    ) -> Result<Generated>
    where
        F: FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
    {
        let g = self.generator(prompt, options)?;
        drive(g, on_event)
    }

    /// Prefills `prompt` and returns an iterator over the generated tokens; see
    /// [`Session::generate`] for the stop conditions. [`Generator::text`] is the text the last
    /// token completed. Dropping the iterator early stops generation.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Some(path) = std::env::var_os("EDGE_RUN_MODEL").map(std::path::PathBuf::from).or_else(|| {
    /// #     let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    /// #     p.exists().then_some(p)
    /// # }) else { return Ok(()) };
    /// use std::sync::Arc;
    /// use edge_engine::generate::{GenerateOptions, StopReason};
    /// use edge_engine::{model::Model, session::{Session, SessionConfig}};
    ///
    /// let model = Arc::new(Model::load(&path)?);
    /// let mut session = Session::new(model.clone(), &SessionConfig { ctx: Some(64), ..Default::default() })?;
    /// let prompt = model.tokenize("The capital of France is", true, true)?;
    /// let mut gen = session.generator(&prompt, &GenerateOptions::greedy(4))?;
    /// let mut tokens = Vec::new();
    /// while let Some(token) = gen.next() {
    ///     tokens.push(token?);
    ///     print!("{}", gen.text());
    /// }
    /// assert_eq!(gen.result().stop_reason, StopReason::MaxTokens);
    /// assert_eq!(model.detokenize(&tokens, false), " Paris.\n\n");
    /// # Ok(())
    /// # }
    /// ```
    pub fn generator(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
    ) -> Result<Generator<'_>> {
        self.start_generator(prompt, prompt, options)
    }

    /// Like [`Session::generate`], but `prompt` is the whole context wanted (a conversation
    /// rendered from its start, a system prompt followed by a request) rather than tokens to
    /// append: the longest prefix it shares with what the session holds is reused and only
    /// the rest is processed ([`Session::reuse_prefix`]), so each turn of a chat costs only
    /// its new tokens. The tokens, text and logits are those of a fresh session given
    /// `prompt`. The repetition penalty sees the whole prompt. An empty prompt is an error.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let Some(path) = std::env::var_os("EDGE_RUN_MODEL").map(std::path::PathBuf::from).or_else(|| {
    /// #     let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    /// #     p.exists().then_some(p)
    /// # }) else { return Ok(()) };
    /// use std::sync::Arc;
    /// use edge_engine::generate::GenerateOptions;
    /// use edge_engine::{model::Model, session::{Session, SessionConfig}};
    ///
    /// let model = Arc::new(Model::load(&path)?);
    /// let mut session = Session::new(model.clone(), &SessionConfig { ctx: Some(128), ..Default::default() })?;
    /// let first = model.tokenize("The capital of France is", true, true)?;
    /// session.generate_cached(&first, &GenerateOptions::greedy(2), |_| std::ops::ControlFlow::Continue(()))?;
    /// // The second prompt starts with the first: only its new tokens are processed.
    /// let second = model.tokenize("The capital of France is Paris. The capital of Italy is", true, true)?;
    /// let mut text = String::new();
    /// session.generate_cached(&second, &GenerateOptions::greedy(2), |e| {
    ///     text.push_str(e.text);
    ///     std::ops::ControlFlow::Continue(())
    /// })?;
    /// assert_eq!(text, " Rome.");
    /// # Ok(())
    /// # }
    /// ```
    pub fn generate_cached<F>(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_event: F,
    ) -> Result<Generated>
    where
        F: FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
    {
        let g = self.generator_cached(prompt, options)?;
        drive(g, on_event)
    }

    /// The iterator of [`Session::generate_cached`]: reuses the prefix `prompt` shares with the
    /// session's tokens, processes the rest and generates; see [`Session::generator`].
    pub fn generator_cached(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
    ) -> Result<Generator<'_>> {
        if prompt.is_empty() {
            return Err(EngineError::InvalidArgument(
                "nothing to process: the prompt has no tokens".into(),
            ));
        }
        // Checked before the session's tokens are dropped, so that a bad call keeps them.
        options.sampling.validate()?;
        self.check_prompt(prompt)?;
        let kept = self.reuse_prefix(prompt);
        self.start_generator(prompt, &prompt[kept..], options)
    }

    /// Starts generation: the sampler sees `context` (the prompt as the caller gave it), the
    /// session processes `new` (its tail that is not in the KV cache yet).
    fn start_generator(
        &mut self,
        context: &[u32],
        prompt: &[u32],
        options: &GenerateOptions,
    ) -> Result<Generator<'_>> {
        options.sampling.validate()?;
        let mut guide = match &options.constraint {
            Some(c) => Some(Guide::new(self.model().constraint_vocab()?, c)?),
            None => None,
        };
        let n_vocab = self.model().params.n_vocab;
        let mut sampler = Sampler::new(options.sampling.clone(), n_vocab);
        // The repetition penalty looks at the prompt too, as llama.cpp's does.
        for &t in context {
            sampler.accept(t);
        }
        // A cached prompt's rest runs in the chunks that reproduce a fresh session's bits.
        let cached = context.len() != prompt.len();
        let prefill = |s: &mut Session| {
            if cached {
                s.prefill_rest(prompt, context.len()).map(|_| ())
            } else {
                s.prefill(prompt).map(|_| ())
            }
        };
        let next = if options.max_tokens == 0 {
            if !prompt.is_empty() {
                prefill(self)?;
            }
            None
        } else {
            if prompt.is_empty() {
                if self.logits().is_empty() {
                    return Err(EngineError::InvalidArgument(
                        "nothing to generate from: give a prompt (the session has processed no tokens)"
                            .into(),
                    ));
                }
            } else {
                prefill(self)?;
            }
            // On a GPU the sampling runs there when the settings allow (Session::sample).
            Some(pick(self, &mut sampler, guide.as_mut())?)
        };
        Ok(Generator {
            session: self,
            sampler,
            guide,
            stream: StreamDecoder::new(),
            options: options.clone(),
            next,
            n_tokens: 0,
            stop: next.is_none().then_some(StopReason::MaxTokens),
            last_emitted: None,
            text: String::with_capacity(StreamDecoder::RESERVED * 3),
            failed: false,
        })
    }
}

/// Runs `g` to its end, handing each token and its text to `on_event`.
fn drive<F>(mut g: Generator<'_>, mut on_event: F) -> Result<Generated>
where
    F: FnMut(GenerateEvent<'_>) -> ControlFlow<()>,
{
    while let Some(token) = g.next() {
        let token = token?;
        let event = GenerateEvent {
            token: Some(token),
            text: g.text(),
        };
        if on_event(event).is_break() {
            g.stop();
        }
    }
    if !g.text().is_empty() {
        let _ = on_event(GenerateEvent {
            token: None,
            text: g.text(),
        });
    }
    Ok(g.result())
}

/// The next token from the session's logits: under an active constraint, masked on the host;
/// otherwise as [`Session::sample`] picks it (on a GPU without copying the logits).
fn pick(session: &mut Session, sampler: &mut Sampler, guide: Option<&mut Guide>) -> Result<u32> {
    match guide {
        Some(g) if g.is_active() => session.sample_guided(sampler, g),
        _ => session.sample(sampler),
    }
}

/// Generation as an iterator of token ids (made by [`Session::generator`]), each token sampled
/// from the logits of the one before and fed back into the session when the next is asked for.
/// After `next` returns `None`, [`Generator::result`] says why.
pub struct Generator<'s> {
    session: &'s mut Session,
    sampler: Sampler,
    /// The constraint being applied, if any.
    guide: Option<Guide>,
    stream: StreamDecoder,
    options: GenerateOptions,
    /// The sampled token to emit next (not yet in the KV cache).
    next: Option<u32>,
    n_tokens: usize,
    stop: Option<StopReason>,
    /// The last emitted token, not yet in the KV cache.
    last_emitted: Option<u32>,
    /// The text the last token completed; after the stop, the text held back until then.
    /// Reserved up front, so filling it does not allocate.
    text: String,
    /// An error was returned: nothing more is generated.
    failed: bool,
}

impl std::fmt::Debug for Generator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("n_tokens", &self.n_tokens)
            .field("stop", &self.stop)
            .finish()
    }
}

impl Generator<'_> {
    /// The text completed by the token `next` returned last; once generation has stopped, the
    /// text of an incomplete UTF-8 character held back until then, as U+FFFD (usually empty).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Stops generation: `next` returns `None` from now on and the stop reason is
    /// [`StopReason::Stopped`] (unless it had already stopped).
    pub fn stop(&mut self) {
        self.finish(StopReason::Stopped);
    }

    /// Tokens generated so far.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// The stop reason, once generation has stopped.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// What generation produced; a generator still running counts as stopped by the caller.
    pub fn result(&self) -> Generated {
        let pending_token = match self.stop {
            Some(StopReason::EndOfGeneration(t)) => Some(t),
            _ => self.last_emitted,
        };
        Generated {
            stop_reason: self.stop.unwrap_or(StopReason::Stopped),
            n_tokens: self.n_tokens,
            pending_token,
        }
    }

    fn finish(&mut self, reason: StopReason) {
        if self.stop.is_some() {
            return;
        }
        self.stop = Some(reason);
        self.session.end_steps();
        if let Some(g) = &self.guide {
            let (n, checked, busy) = g.stats();
            log::info!(
                "constraint: {n} masks and {checked} steps decided by their best candidates over {} tokens, {:.1} µs per token in the constraint",
                self.n_tokens,
                busy.as_secs_f64() * 1e6 / self.n_tokens.max(1) as f64
            );
        }
        self.text.clear();
        if let Some(rest) = self.stream.flush() {
            self.text.push_str(rest);
        }
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<u32>;

    /// Feeds the previous token to the model (one decode step), samples the next and returns
    /// it; `None` once a stop condition is met (see [`Generator::result`]).
    fn next(&mut self) -> Option<Result<u32>> {
        if self.stop.is_some() || self.failed {
            return None;
        }
        if self.n_tokens >= self.options.max_tokens {
            self.finish(StopReason::MaxTokens);
            return None;
        }
        if let Some(prev) = self.last_emitted {
            // advance + sample rather than step: on a GPU, the logits are not copied back
            // unless the sampler needs them on the host (Session::sample).
            match self
                .session
                .advance(&[prev])
                .and_then(|()| pick(self.session, &mut self.sampler, self.guide.as_mut()))
            {
                Ok(token) => self.next = Some(token),
                // Checked before anything runs: the session is as it was, minus nothing.
                Err(EngineError::ContextFull { .. }) => {
                    self.finish(StopReason::ContextFull);
                    return None;
                }
                Err(e) => {
                    self.failed = true;
                    self.session.end_steps();
                    return Some(Err(e));
                }
            }
        }
        let token = self.next?;
        let model = self.session.model();
        if let Some(guide) = &mut self.guide {
            // Under an active constraint an end-of-generation token was allowed only where the
            // constraint accepts: it ends generation whatever `stop_at_eog` says.
            if guide.is_active() && guide.is_eog(token) {
                self.finish(StopReason::EndOfGeneration(token));
                return None;
            }
            if !(self.options.stop_at_eog && model.is_eog(token)) {
                let accepted = model.constraint_vocab().and_then(|vocab| {
                    guide.accept(
                        vocab,
                        token,
                        model.token_piece(token, true),
                        model.tokenizer.is_control(token),
                    )
                });
                if let Err(e) = accepted {
                    self.failed = true;
                    return Some(Err(e.into()));
                }
            }
        }
        if self.options.stop_at_eog && model.is_eog(token) {
            self.finish(StopReason::EndOfGeneration(token));
            return None;
        }
        self.sampler.accept(token);
        self.n_tokens += 1;
        self.last_emitted = Some(token);
        self.text.clear();
        if let Some(s) = self
            .stream
            .push_bytes(model.token_piece(token, self.options.render_special))
        {
            self.text.push_str(s);
        }
        Some(Ok(token))
    }
}
