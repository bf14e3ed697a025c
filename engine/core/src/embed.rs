//! Sentence embeddings from an encoder model (BERT): [`Embedder`] runs each text through the
//! encoder in one pass and pools the token states into one vector (mean, CLS or last token,
//! as the model's `{arch}.pooling_type` says), L2-normalised unless asked not to.
//!
//! The memory is planned like a session's ([`EmbedPlan`]): one arena for a graph of
//! `max_tokens` positions, per-thread scratch, no KV cache (an encoder sees its whole input at
//! once). The embedder allocates it once and reuses it for every text; texts of a batch run one
//! after another through the same plan.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let Some(path) = std::env::var_os("EDGE_RUN_EMBED_MODEL").map(std::path::PathBuf::from).or_else(|| {
//! #     let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2.f16.gguf");
//! #     p.exists().then_some(p)
//! # }) else { return Ok(()) };
//! use std::sync::Arc;
//! use edge_engine::embed::{EmbedConfig, Embedder};
//! use edge_engine::model::Model;
//!
//! let model = Arc::new(Model::load(&path)?);
//! let mut embedder = Embedder::new(model, &EmbedConfig { threads: Some(1), ..Default::default() })?;
//! let v = embedder.embed(&["A cat sits on the mat.", "A kitten rests on a rug."])?;
//! let cosine: f32 = v[0].iter().zip(&v[1]).map(|(a, b)| a * b).sum(); // unit vectors
//! assert!(cosine > 0.5);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use edge_kernels::Kernels;

use crate::arch::bert::{build_graph_pooled, BertWeights};
use crate::arch::Layout;
use crate::backend::cpu::{scratch_bytes_per_thread, Executor, RunArgs};
use crate::error::{EngineError, Hint, Result, Setting};
pub use crate::graph::Pooling;
use crate::hint;
use crate::kv::{KvCache, KvType};
use crate::memory::ALIGN;
use crate::model::Model;
use crate::plan::{plan_within_budget, MemoryReport, PlannedGraph};
use crate::session::plan::{check_threads, default_threads};

/// How to size and run an [`Embedder`].
#[derive(Debug, Clone)]
pub struct EmbedConfig {
    /// Most tokens of one text (its `[CLS]` and `[SEP]` included); `None`: the model's
    /// context length (the rows of its position table, 512 for BERT models).
    pub max_tokens: Option<usize>,
    /// Threads; `None`: the available cores.
    pub threads: Option<usize>,
    /// Pooling; `None`: the model's `{arch}.pooling_type`.
    pub pooling: Option<Pooling>,
    /// L2-normalise each embedding (the default, as llama.cpp's `llama-embedding` and
    /// sentence-transformers do). Off: the raw pooled vector, as llama.cpp's
    /// `llama_get_embeddings_seq` returns it.
    pub normalize: bool,
}

impl Default for EmbedConfig {
    fn default() -> EmbedConfig {
        EmbedConfig {
            max_tokens: None,
            threads: None,
            pooling: None,
            normalize: true,
        }
    }
}

/// The encoder weights of `model`, or the error that says it is no embedding model.
fn encoder_weights(model: &Model) -> Result<&BertWeights> {
    match &model.layout {
        Layout::Encoder(w) => Ok(w),
        Layout::Decoder(_) => Err(EngineError::InvalidArgument(format!(
            "this is a decoder (text generation) model ({}): embeddings need an encoder model such as a BERT sentence-embedding model (e.g. all-MiniLM-L6-v2; scripts/fetch-embed-model.sh fetches one)",
            model.params.arch
        ))),
    }
}

/// Everything an [`Embedder`] will own, planned but not allocated (`edge-run plan` and budget
/// checks use it before anything is allocated).
pub struct EmbedPlan {
    /// Most tokens of one text.
    pub max_tokens: usize,
    /// Threads.
    pub threads: usize,
    /// The pooling the graph computes.
    pub pooling: Pooling,
    /// L2-normalise the embeddings.
    pub normalize: bool,
    /// Memory the embedder will hold (`kv_bytes` is 0: encoders have no KV cache).
    pub report: MemoryReport,
    graph: PlannedGraph,
}

impl std::fmt::Debug for EmbedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedPlan")
            .field("max_tokens", &self.max_tokens)
            .field("threads", &self.threads)
            .field("pooling", &self.pooling)
            .field("report", &self.report)
            .finish()
    }
}

impl EmbedPlan {
    /// Resolves the configuration's defaults, builds and plans the encoder graph, and computes
    /// the memory report.
    pub fn new(model: &Model, cfg: &EmbedConfig) -> Result<EmbedPlan> {
        let w = encoder_weights(model)?;
        let p = &model.params;
        let max_tokens = cfg.max_tokens.unwrap_or(p.n_ctx_train);
        if max_tokens == 0 || max_tokens > p.n_ctx_train {
            return Err(EngineError::invalid_setting(
                Setting::MaxTokens,
                max_tokens,
                hint![
                    Setting::MaxTokens,
                    format!(
                        " {max_tokens}: use 1 to {} (the model's position table has {} rows)",
                        p.n_ctx_train, p.n_ctx_train
                    )
                ],
            ));
        }
        let threads = check_threads(cfg.threads.unwrap_or_else(default_threads))?;
        let pooling = match (cfg.pooling, w.pooling()) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => {
                let what = match w.pooling_type {
                    0 => "none (per-token states)",
                    4 => "rank (a reranker's score)",
                    _ => "unknown",
                };
                return Err(EngineError::invalid_setting(
                    Setting::Pooling,
                    what,
                    hint![
                        format!(
                            "the model's {}.pooling_type is {what}, which gives no sentence embedding; choose one with ",
                            p.arch
                        ),
                        Setting::Pooling,
                        " mean|cls|last"
                    ],
                ));
            }
        };
        let scratch_bytes = scratch_bytes_per_thread(max_tokens, p.head_dim, 1)
            .checked_next_multiple_of(ALIGN)
            .and_then(|b| b.checked_mul(threads))
            .ok_or_else(|| {
                EngineError::invalid_setting(
                    Setting::Threads,
                    threads,
                    hint!["too many ", Setting::Threads],
                )
            })?;
        let graph = PlannedGraph::plan(build_graph_pooled(
            &model.params,
            &model.weights,
            w,
            max_tokens,
            pooling,
        ))?;
        let (arena_bytes, lower_bound) = (graph.arena_bytes, graph.lower_bound_bytes);
        Ok(EmbedPlan {
            max_tokens,
            threads,
            pooling,
            normalize: cfg.normalize,
            report: MemoryReport {
                weights_bytes: model.weight_bytes_total(),
                kv_bytes: 0,
                arena_bytes: arena_bytes as u64,
                arena_lower_bound_bytes: lower_bound as u64,
                scratch_bytes: scratch_bytes as u64,
                runtime_bytes: model.runtime_bytes(),
            },
            graph,
        })
    }

    /// What the budget would be charged for this plan.
    pub fn demand(&self) -> edge_targets::Demand {
        edge_targets::Demand {
            weights: self.report.weights_bytes,
            kv: 0,
            arena: self.report.arena_bytes,
            scratch: self.report.scratch_bytes,
        }
    }

    /// Plans an embedder within `budget`. With `cfg.max_tokens` given, refuses (before
    /// allocating anything) if it does not fit, naming each component and the largest
    /// `max_tokens` that would; without it, picks the largest that fits (up to the model's
    /// context length).
    pub fn within_budget(
        model: &Model,
        cfg: &EmbedConfig,
        budget: &edge_targets::Budget,
    ) -> Result<EmbedPlan> {
        // The search is over max_tokens, which the budget error calls the context.
        plan_within_budget(
            cfg.max_tokens,
            model.params.n_ctx_train as u64,
            budget,
            |n| {
                EmbedPlan::new(
                    model,
                    &EmbedConfig {
                        max_tokens: Some(n),
                        ..cfg.clone()
                    },
                )
            },
            EmbedPlan::demand,
        )
    }
}

/// An encoder ready to embed texts: the shared model, its planned arena and threads.
pub struct Embedder {
    model: Arc<Model>,
    exec: Executor,
    /// An empty cache (no layers): the executor's interface wants one; encoders keep nothing.
    kv: KvCache,
    graph: PlannedGraph,
    max_tokens: usize,
    pooling: Pooling,
    normalize: bool,
    report: MemoryReport,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("max_tokens", &self.max_tokens)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .finish()
    }
}

impl Embedder {
    /// Plans ([`EmbedPlan::new`]) and allocates an embedder for `model`.
    pub fn new(model: Arc<Model>, cfg: &EmbedConfig) -> Result<Embedder> {
        let plan = EmbedPlan::new(&model, cfg)?;
        Embedder::from_plan(model, plan)
    }

    /// Allocates exactly what `plan` (made for this model) says.
    pub fn from_plan(model: Arc<Model>, plan: EmbedPlan) -> Result<Embedder> {
        let p = &model.params;
        let kv = KvCache::new(0, plan.max_tokens, p.kv_dim(), KvType::F16)
            .map_err(|e| crate::backend::allocation_error("embedder", e))?;
        let exec = Executor::new(
            plan.report.arena_bytes as usize,
            plan.threads,
            plan.max_tokens,
            p.head_dim,
            1,
            false,
            Kernels::detect(),
        )
        .map_err(|e| crate::backend::allocation_error("embedder", e))?;
        debug_assert_eq!(exec.scratch_bytes() as u64, plan.report.scratch_bytes);
        log::info!(
            "embedder: up to {} tokens, {} pooling, {} threads, kernels {}; arena {:.2} MiB, scratch {} KiB",
            plan.max_tokens,
            plan.pooling.name(),
            plan.threads,
            exec.kernels().isa_name(),
            plan.report.arena_bytes as f64 / 1048576.0,
            plan.report.scratch_bytes / 1024
        );
        Ok(Embedder {
            model,
            exec,
            kv,
            graph: plan.graph,
            max_tokens: plan.max_tokens,
            pooling: plan.pooling,
            normalize: plan.normalize,
            report: plan.report,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Values per embedding.
    pub fn n_embd(&self) -> usize {
        self.model.params.n_embd
    }

    /// Most tokens of one text.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are L2-normalised.
    pub fn normalize(&self) -> bool {
        self.normalize
    }

    /// The embedder's memory, from its plan.
    pub fn memory(&self) -> MemoryReport {
        self.report
    }

    /// Embeds each text (tokenized with `[CLS]`/`[SEP]` as the model's tokenizer adds them,
    /// special-token text not parsed), one after another through the same buffers.
    pub fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let tokens = self.model.tokenize(text, true, false)?;
            if tokens.len() > self.max_tokens {
                let n_ctx = self.model.params.n_ctx_train;
                let limit = if self.max_tokens == n_ctx {
                    hint!["the model's context length"]
                } else {
                    hint![Setting::MaxTokens]
                };
                let raise = if self.max_tokens < n_ctx {
                    hint![
                        ", or raise ",
                        Setting::MaxTokens,
                        format!(" (up to {n_ctx})")
                    ]
                } else {
                    Hint::new()
                };
                return Err(EngineError::invalid_setting(
                    Setting::MaxTokens,
                    self.max_tokens,
                    hint![
                        format!(
                            "text {} has {} tokens, more than the {} this embedder takes (",
                            i + 1,
                            tokens.len(),
                            self.max_tokens
                        ),
                        limit,
                        "); shorten or split the text",
                        raise
                    ],
                ));
            }
            out.push(self.embed_tokens(&tokens)?);
        }
        Ok(out)
    }

    /// Embeds one already-tokenized text (include `[CLS]`/`[SEP]` as the model expects).
    pub fn embed_tokens(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidArgument(
                "no tokens to embed: give a text (the tokenizer adds [CLS] and [SEP])".into(),
            ));
        }
        if tokens.len() > self.max_tokens {
            return Err(EngineError::InvalidArgument(format!(
                "{} tokens are more than the {} this embedder takes; shorten the input",
                tokens.len(),
                self.max_tokens
            )));
        }
        let n_vocab = self.model.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        self.model.gguf().check_unchanged()?;
        let args = RunArgs::one_sequence(tokens, 0);
        if !self.exec.run(&self.model, &self.kv, &self.graph, args) {
            return Err(EngineError::Kernel(
                "a worker thread panicked; this is a bug".into(),
            ));
        }
        let mut v = self
            .exec
            .read_f32(&self.graph, self.graph.graph.output, 1)
            .to_vec();
        if !v.iter().all(|x| x.is_finite()) {
            return Err(EngineError::NonFinite {
                what: "the embedding",
                position: tokens.len() - 1,
            });
        }
        if self.normalize {
            l2_normalize(&mut v);
        }
        Ok(v)
    }
}

/// Scales `v` to unit length (sum of squares in f64, as llama.cpp's `common_embd_normalize`
/// with norm 2); a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        for x in v.iter_mut() {
            *x *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_normalize_gives_unit_length() {
        let mut v = vec![3.0f32, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = vec![0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
