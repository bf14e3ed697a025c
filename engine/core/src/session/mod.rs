//! A session: one conversation's state over a shared [`Model`]: its KV cache and its arena
//! (allocated once, as planned before the first token: [`plan`]) on a [`Backend`], and its
//! position in the conversation. Generation on a session is [`crate::generate`].

mod cache;
mod chunks;
pub mod group;
pub mod plan;
pub mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use edge_kernels::Kernels;

use crate::backend::{self, Backend};
use crate::device::Device;
pub use crate::error::StateError;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::plan::{MemoryReport, PlannedGraph};
pub use plan::{SessionConfig, SessionPlan, DEFAULT_CTX, DEFAULT_UBATCH, MAX_THREADS};

/// What a session does when a run needs more positions than its context holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextPolicy {
    /// Refuse the run with [`EngineError::ContextFull`] (the default): the caller decides.
    #[default]
    Stop,
    /// Shift the context as llama.cpp's `--context-shift` does: keep the first `keep`
    /// positions (e.g. 1 for the BOS token, or the tokens of a system prompt), drop the oldest
    /// half of the rest, move the remaining positions down and re-rotate their keys, then go
    /// on. The model then no longer sees the dropped tokens.
    Shift {
        /// Positions at the start that are never dropped.
        keep: usize,
    },
}

/// One conversation's state: KV cache, arena, threads; the model is shared.
pub struct Session {
    model: Arc<Model>,
    backend: Box<dyn Backend>,
    ctx: usize,
    decode: PlannedGraph,
    prefill: Option<PlannedGraph>,
    ubatch: usize,
    /// The tokens whose keys and values the KV cache holds, position by position: its length
    /// is the number of positions in use. Reserved for `ctx` tokens when the session opens, so
    /// that appending never allocates.
    tokens: Vec<u32>,
    /// How many of the first `tokens` hold exactly what a fresh session that processed them
    /// would hold: all of them, until a context shift re-rotates the keys after the kept ones
    /// (and those were computed while the dropped tokens were in view).
    n_exact: usize,
    /// Tokens of the last run (0 once its logits are gone): a loaded state runs its last
    /// tokens again as one chunk of this size, which reproduces the logits bit for bit.
    last_run: usize,
    kv_type: crate::kv::KvType,
    report: MemoryReport,
    /// Whether the last run produced logits that can be read.
    has_logits: bool,
    last_graph_is_prefill: bool,
    policy: ContextPolicy,
    /// Context shifts done since the last reset.
    n_shifts: usize,
    /// Raised by the caller to stop a long run between ubatch chunks.
    interrupt: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ctx", &self.ctx)
            .field("ubatch", &self.ubatch)
            .field("n_past", &self.n_past())
            .finish()
    }
}

impl Session {
    /// Opens a session: builds and plans the graphs ([`SessionPlan`]), then allocates the KV
    /// cache and the arena, once.
    pub fn new(model: Arc<Model>, cfg: &SessionConfig) -> Result<Session> {
        let plan = SessionPlan::new(&model, cfg)?;
        Session::from_plan(model, plan)
    }

    /// Opens a session from a plan made for this model (e.g. by
    /// [`SessionPlan::within_budget`]): allocates exactly what the plan's report says.
    pub fn from_plan(model: Arc<Model>, plan: SessionPlan) -> Result<Session> {
        let kernels = match plan.device {
            Device::Cpu => {
                crate::backend::cpu::tune::choose(&model, Kernels::detect(), plan.threads)
            }
            Device::Cuda(_) => Kernels::detect(),
        };
        Session::from_plan_with_kernels(model, plan, kernels)
    }

    /// [`Session::from_plan`] with the given kernels instead of [`Kernels::detect`]'s (to run
    /// one instruction set in tests and benchmarks without `EDGE_RUN_ISA`).
    pub fn from_plan_with_kernels(
        model: Arc<Model>,
        plan: SessionPlan,
        kernels: Kernels,
    ) -> Result<Session> {
        let p = &model.params;
        if plan.ctx > p.n_ctx_train {
            log::warn!(
                "context {} is larger than the {} tokens the model was trained for; quality may drop",
                plan.ctx,
                p.n_ctx_train
            );
        }
        let backend = backend::open(&model, &plan.allocation(), kernels)?;
        Ok(Session::with_backend(model, plan, backend))
    }

    /// A session of `plan` over a backend opened for it (on its own, or as a member of a
    /// group: [`group`]).
    fn with_backend(model: Arc<Model>, plan: SessionPlan, backend: Box<dyn Backend>) -> Session {
        let report = plan.report;
        log::info!(
            "session: ctx {}, ubatch {}, {}; KV {:.1} MiB, arena {:.2} MiB (lower bound {:.2} MiB), scratch {} KiB",
            plan.ctx,
            plan.ubatch,
            backend.description(),
            report.kv_bytes as f64 / 1048576.0,
            report.arena_bytes as f64 / 1048576.0,
            report.arena_lower_bound_bytes as f64 / 1048576.0,
            report.scratch_bytes / 1024
        );
        Session {
            model,
            backend,
            ctx: plan.ctx,
            decode: plan.decode,
            prefill: plan.prefill,
            ubatch: plan.ubatch,
            tokens: Vec::with_capacity(plan.ctx),
            n_exact: 0,
            last_run: 0,
            kv_type: plan.kv_type,
            report,
            has_logits: false,
            last_graph_is_prefill: false,
            policy: ContextPolicy::Stop,
            n_shifts: 0,
            interrupt: None,
        }
    }

    /// The model this session runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context size in tokens.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Tokens per prefill run.
    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    /// Threads per op (a CUDA session's threads only feed the GPU).
    pub fn n_threads(&self) -> usize {
        self.backend.n_threads()
    }

    /// Where the session runs.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// What computes: the CPU kernel set (`avx2`, `scalar`) or `cuda`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Positions already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// The element type of the session's KV cache.
    pub fn kv_type(&self) -> crate::kv::KvType {
        self.kv_type
    }

    /// The session's memory, from its plan.
    pub fn memory(&self) -> MemoryReport {
        self.report
    }

    /// Forgets the conversation (the KV cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.n_exact = 0;
        self.last_run = 0;
        self.has_logits = false;
        self.n_shifts = 0;
    }

    /// What to do when the context is full ([`ContextPolicy::Stop`] unless set).
    pub fn context_policy(&self) -> ContextPolicy {
        self.policy
    }

    /// Sets what to do when the context is full; applies to the following runs.
    pub fn set_context_policy(&mut self, policy: ContextPolicy) {
        self.policy = policy;
    }

    /// Context shifts done since the session was opened or reset.
    pub fn n_shifts(&self) -> usize {
        self.n_shifts
    }

    /// Drops `n_discard` positions after the first `keep` ones: the later positions move down
    /// and their keys are re-rotated (see [`crate::kv::KvCache::shift`]); [`Session::n_past`] drops by
    /// `n_discard`. The logits of the last run stay readable. [`ContextPolicy::Shift`] calls this
    /// with half of the positions after `keep` when a run would overflow the context.
    pub fn shift_context(&mut self, keep: usize, n_discard: usize) -> Result<()> {
        if keep
            .checked_add(n_discard)
            .is_none_or(|end| end > self.n_past())
        {
            return Err(EngineError::InvalidArgument(format!(
                "context shift: cannot drop {n_discard} positions after the first {keep}: only {} are in the context",
                self.n_past()
            )));
        }
        if let Some(reason) = self.model.context_shift_unsupported() {
            return Err(EngineError::Unsupported(reason));
        }
        self.backend
            .shift_context(&self.model, self.n_past(), keep, n_discard)?;
        // Draining moves the tail down in place: no allocation.
        self.tokens.drain(keep..keep + n_discard);
        self.n_exact = self.n_exact.min(keep);
        self.n_shifts += 1;
        Ok(())
    }

    /// Under [`ContextPolicy::Shift`], shifts until `n` more positions fit (a no-op when they
    /// already do, or under [`ContextPolicy::Stop`]).
    fn make_room(&mut self, n: usize, what: &'static str) -> Result<()> {
        let ContextPolicy::Shift { keep } = self.policy else {
            return Ok(());
        };
        while self.n_past() + n > self.ctx() {
            let keep = keep.min(self.n_past());
            let n_discard = (self.n_past() - keep) / 2;
            if n_discard == 0 {
                return Err(EngineError::ContextShift {
                    what,
                    needed: n,
                    keep,
                    ctx: self.ctx(),
                });
            }
            self.shift_context(keep, n_discard)?;
        }
        Ok(())
    }

    /// Appends `tokens` to the context, in chunks of the ubatch, and returns the logits of the
    /// last one.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.advance_as(tokens, "prompt")?;
        self.try_logits()
    }

    /// Appends one token and returns the logits for the next.
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        self.advance_as(&[token], "generation")?;
        self.try_logits()
    }

    /// Appends `tokens` (in chunks of the ubatch) without fetching the logits: on a GPU they
    /// stay on the device until [`Session::logits`] or [`Session::argmax`] asks.
    pub fn advance(&mut self, tokens: &[u32]) -> Result<()> {
        let what = if tokens.len() == 1 && self.n_past() > 0 {
            "generation"
        } else {
            "prompt"
        };
        self.advance_as(tokens, what)
    }

    fn advance_as(&mut self, tokens: &[u32], what: &'static str) -> Result<()> {
        self.advance_chunked(tokens, what, None)
    }

    /// [`Session::advance_as`]; with `exact` = `Some(final_single)` the chunks are sized by
    /// [`chunks::exact_chunk`] (see [`Session::reuse_prefix`]) instead of whole ubatches.
    fn advance_chunked(
        &mut self,
        tokens: &[u32],
        what: &'static str,
        exact: Option<bool>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidArgument(
                "nothing to process: the prompt has no tokens".into(),
            ));
        }
        self.check_vocab(tokens)?;
        if let ContextPolicy::Shift { keep } = self.policy {
            // Shifting only drops context already processed: a prompt itself (and the kept
            // tokens) must fit. A generated token that cannot is make_room's error (--keep).
            let kept = keep.min(self.n_past());
            if what == "prompt" && kept + tokens.len() > self.ctx() {
                return Err(EngineError::ContextFull {
                    what,
                    needed: kept + tokens.len(),
                    ctx: self.ctx(),
                    max: self.model.params.n_ctx_train,
                });
            }
        } else {
            // Refused before anything runs: a prompt is processed whole or not at all.
            self.check_fits(tokens.len(), what)?;
        }
        let ubatch = self.ubatch;
        let mut done = 0;
        while done < tokens.len() {
            if done > 0 && self.interrupted() {
                return Err(EngineError::Interrupted {
                    processed: done,
                    requested: tokens.len(),
                });
            }
            let rest = tokens.len() - done;
            let n = match exact {
                None => rest.min(ubatch),
                Some(final_single) => chunks::exact_chunk(rest, final_single, ubatch),
            };
            let chunk = &tokens[done..done + n];
            self.make_room(chunk.len(), what)?;
            self.check_fits(chunk.len(), what)?;
            self.run(chunk)?;
            done += n;
        }
        Ok(())
    }

    /// The most likely next token after the last run (the first on ties), as
    /// [`crate::sampling::argmax`] of the logits. On a GPU it is computed there and only the id
    /// is copied back.
    pub fn argmax(&self) -> Result<u32> {
        if !self.has_logits {
            return Err(EngineError::InvalidArgument(
                "no logits yet: process some tokens first".into(),
            ));
        }
        let token = self.backend.argmax(self.last_graph())?;
        self.check_finite(token)?;
        Ok(token)
    }

    /// Says that no decode step follows for now (a generation ended): in a group of sessions
    /// that decode together ([`group`]), the others stop waiting for this one's steps.
    pub fn end_steps(&mut self) {
        self.backend.end_steps();
    }

    /// For a session of a group ([`group`]): how the group's decode steps have been batched
    /// so far; `None` for a session on its own.
    pub fn decode_batches(&self) -> Option<crate::backend::DecodeBatches> {
        self.backend.decode_batches()
    }

    /// An interrupt flag: while it is raised, a run of several ubatch chunks (a long prompt)
    /// stops before its next chunk with [`EngineError::Interrupted`], keeping the chunks already
    /// processed. A signal handler may raise it; the session never lowers it. The first chunk of
    /// a call always runs, so a caller that stops between tokens on the same flag loses nothing.
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }

    fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Refuses a token picked from logits that are not finite: a broken model must end with
    /// an error, not with whatever token NaN comparisons leave (often an end of generation).
    fn check_finite(&self, token: u32) -> Result<()> {
        if self.backend.output_finite(self.last_graph(), token)? {
            Ok(())
        } else {
            Err(EngineError::NonFinite {
                what: "the logits",
                position: self.n_past().saturating_sub(1),
            })
        }
    }

    /// The next token from the last run's logits with `sampler`: the token
    /// `sampler.sample(self.logits())` gives, with the sampler's generator advanced the same way.
    /// On a GPU the logits stay there when the sampler allows it
    /// ([`crate::sampling::Sampler::device_sampling`]: no active repetition penalty, top-k at
    /// most the CUDA backend's `SAMPLE_MAX_TOP_K`): greedy settings use the device argmax, others the
    /// device sampler (same arithmetic as the CPU's, fed the CPU generator's uniform draw), and
    /// only the token id is copied back. Otherwise, and on the CPU, the logits are sampled here.
    pub fn sample(&mut self, sampler: &mut crate::sampling::Sampler) -> Result<u32> {
        if !self.has_logits {
            return Err(EngineError::InvalidArgument(
                "no logits yet: process some tokens first".into(),
            ));
        }
        let token = self.backend.sample(self.last_graph(), sampler)?;
        self.check_finite(token)?;
        Ok(token)
    }

    /// [`Session::sample`] under a constraint: the logits (copied to the host on a GPU) masked
    /// by `guide`, or its forced token.
    pub(crate) fn sample_guided(
        &mut self,
        sampler: &mut crate::sampling::Sampler,
        guide: &mut crate::constrain::Guide,
    ) -> Result<u32> {
        if !self.has_logits {
            return Err(EngineError::InvalidArgument(
                "no logits yet: process some tokens first".into(),
            ));
        }
        let token = if self.backend.device().is_cuda() {
            // The logits stay on the device: the mask goes up, one token id comes back.
            let out = BackendOutput {
                backend: &*self.backend,
                graph: self.last_graph(),
            };
            guide.sample_on(&out, sampler)?
        } else {
            guide.sample(self.try_logits()?, sampler)?
        };
        self.check_finite(token)?;
        Ok(token)
    }

    /// Logits of the last processed position (empty before any run, or if copying them from
    /// the device failed; [`Session::prefill`] and [`Session::step`] report such errors).
    pub fn logits(&self) -> &[f32] {
        self.try_logits().unwrap_or_else(|e| {
            log::error!("{e}");
            &[]
        })
    }

    fn try_logits(&self) -> Result<&[f32]> {
        if !self.has_logits {
            return Ok(&[]);
        }
        self.backend.output(self.last_graph())
    }

    /// The graph of the last run.
    fn last_graph(&self) -> &PlannedGraph {
        if self.last_graph_is_prefill {
            self.prefill.as_ref().unwrap_or(&self.decode)
        } else {
            &self.decode
        }
    }

    /// Refuses, before anything changes, a whole-context prompt that cannot run: an id
    /// outside the vocabulary, or more tokens than the context holds.
    pub(crate) fn check_prompt(&self, prompt: &[u32]) -> Result<()> {
        self.check_vocab(prompt)?;
        if prompt.len() > self.ctx() {
            return Err(EngineError::ContextFull {
                what: "prompt",
                needed: prompt.len(),
                ctx: self.ctx(),
                max: self.model.params.n_ctx_train,
            });
        }
        Ok(())
    }

    fn check_vocab(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.params.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        Ok(())
    }

    fn check_fits(&self, n: usize, what: &'static str) -> Result<()> {
        if self.n_past() + n > self.ctx() {
            return Err(EngineError::ContextFull {
                what,
                needed: self.n_past() + n,
                ctx: self.ctx(),
                max: self.model.params.n_ctx_train,
            });
        }
        Ok(())
    }

    fn run(&mut self, chunk: &[u32]) -> Result<()> {
        let use_prefill = chunk.len() > 1;
        let pg = if use_prefill {
            self.prefill.as_ref().unwrap_or(&self.decode)
        } else {
            &self.decode
        };
        self.has_logits = false;
        // A file truncated or rewritten in place would fault (SIGBUS) or feed unvalidated
        // bytes to the kernels: refuse to run on it (one fstat; a run is milliseconds).
        self.model.gguf().check_unchanged()?;
        self.backend
            .run(&self.model, pg, chunk, self.n_past(), !use_prefill)?;
        // Within the capacity reserved at open (check_fits ran): no allocation.
        let exact = self.n_exact == self.tokens.len();
        self.tokens.extend_from_slice(chunk);
        if exact {
            self.n_exact = self.tokens.len();
        }
        self.last_run = chunk.len();
        self.has_logits = true;
        self.last_graph_is_prefill = use_prefill && self.prefill.is_some();
        Ok(())
    }
}

/// A session's last output where its backend holds it, for a constrained step
/// ([`crate::constrain::Guide::sample_on`]).
struct BackendOutput<'a> {
    backend: &'a dyn Backend,
    graph: &'a PlannedGraph,
}

impl crate::constrain::OutputOnDevice for BackendOutput<'_> {
    fn argmax(&self) -> Result<u32> {
        self.backend.argmax(self.graph)
    }

    fn sample_masked(
        &self,
        allowed: &[u32],
        sampler: &mut crate::sampling::Sampler,
    ) -> Result<Option<u32>> {
        self.backend.sample_masked(self.graph, allowed, sampler)
    }

    fn host(&self) -> Result<&[f32]> {
        self.backend.output(self.graph)
    }
}
