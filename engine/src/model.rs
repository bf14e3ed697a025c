//! A loaded model: the memory-mapped GGUF, its hyper-parameters, its weight table and its
//! tokenizer. Loaded once, shared (read-only, `Send + Sync`) by any number of sessions.

use std::path::Path;

use crate::arch;
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;
use crate::graph::{Rope, RopeOrdering, WeightId};
use crate::tensor::GgmlType;
use edge_tokenizers::Tokenizer;

/// Hyper-parameters of a decoder-only transformer, read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct HyperParams {
    /// `general.architecture`.
    pub arch: String,
    /// Model width (`embedding_length`).
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when < n_head).
    pub n_head_kv: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Hidden size of the feed-forward block.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding table).
    pub n_vocab: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rotary embedding (of every layer, or of the global layers when some use a sliding window).
    pub rope: Rope,
    /// Rotary embedding of the sliding-window layers (Gemma 3 gives them their own base and no
    /// scaling); equal to `rope` when the model has none.
    pub rope_swa: Rope,
    /// Sliding-window size: a query at position p sees keys at p - window + 1 ..= p on the
    /// layers [`HyperParams::swa_layers`] marks (`{arch}.attention.sliding_window`).
    pub window: Option<usize>,
    /// Per layer: whether it attends over the sliding window only.
    pub swa_layers: Vec<bool>,
    /// Factor the token embeddings are multiplied by (Gemma: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
    /// Factor the rotated queries are multiplied by before attention, which then scales by 1
    /// (Phi-3 and Gemma do this instead of scaling the scores by 1/sqrt(head_dim)).
    pub query_scale: Option<f32>,
    /// Attention scores become `cap * tanh(score / cap)` before the softmax (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Gated feed-forward activation.
    pub ffn_act: FfnActivation,
}

/// The activation of the gated feed-forward block: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU (SwiGLU): Llama, Qwen, Phi-3.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    Gelu,
}

impl HyperParams {
    /// The rotary embedding of layer `l`.
    pub fn layer_rope(&self, l: usize) -> Rope {
        if self.is_swa(l) {
            self.rope_swa
        } else {
            self.rope
        }
    }

    /// Whether layer `l` attends over a sliding window.
    pub fn is_swa(&self, l: usize) -> bool {
        self.window.is_some() && self.swa_layers.get(l).copied().unwrap_or(false)
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        if self.is_swa(l) {
            self.window
        } else {
            None
        }
    }

    /// KV rows each layer needs for a context of `ctx` positions run `ubatch` tokens at a time:
    /// `ctx` for a global layer; for a sliding-window layer only the window plus one ubatch
    /// (a ring buffer: the oldest key a token of the ubatch still sees is `window - 1`
    /// positions before it), at most `ctx`.
    pub fn kv_layer_rows(&self, ctx: usize, ubatch: usize) -> Vec<usize> {
        (0..self.n_layer)
            .map(|l| match self.layer_window(l) {
                Some(w) => ctx.min(w.saturating_add(ubatch)),
                None => ctx,
            })
            .collect()
    }

    /// Why a context shift cannot run on this model, if it cannot: the shift re-rotates every
    /// cached key with one rotary embedding over a cache laid out by position.
    pub fn context_shift_unsupported(&self) -> Option<String> {
        if self.swa_layers.iter().any(|&s| s) && self.window.is_some() {
            Some(format!(
                "context shift is not supported for {} models with sliding-window layers; use a larger --ctx",
                self.arch
            ))
        } else {
            None
        }
    }

    /// Width of the key (and value) rows of one layer: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// One weight tensor of the model, by its index in the GGUF tensor table.
#[derive(Debug, Clone)]
pub struct Weight {
    /// Tensor name in the file.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row (ggml ne[0]).
    pub row_len: usize,
    /// Number of rows (product of the other dims).
    pub n_rows: usize,
    /// Index into [`Gguf::tensors`].
    pub(crate) tensor_index: usize,
}

/// The query, key and value projections of a block.
#[derive(Debug, Clone)]
pub enum QkvWeights {
    /// Three matrices (`attn_q`, `attn_k`, `attn_v`).
    Separate {
        /// Query projection.
        wq: WeightId,
        /// Key projection.
        wk: WeightId,
        /// Value projection.
        wv: WeightId,
    },
    /// One matrix whose output rows are q, then k, then v (`attn_qkv`, Phi-3).
    Fused(WeightId),
}

/// The gate and up projections of a gated feed-forward block.
#[derive(Debug, Clone)]
pub enum GateUpWeights {
    /// Two matrices (`ffn_gate`, `ffn_up`).
    Separate {
        /// Gate projection (goes through the activation).
        gate: WeightId,
        /// Up projection.
        up: WeightId,
    },
    /// One `ffn_up` matrix of 2 x n_ff rows: the gate, then the up projection (Phi-3).
    Fused(WeightId),
}

/// The weights of one decoder block. The optional ones exist in some architectures only.
#[derive(Debug, Clone)]
pub struct DecoderLayerWeights {
    /// RMSNorm before attention.
    pub attn_norm: WeightId,
    /// Query, key and value projections.
    pub qkv: QkvWeights,
    /// Biases of q, k and v (Qwen2).
    pub qkv_bias: Option<[WeightId; 3]>,
    /// Per-head RMSNorm of the queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: Option<[WeightId; 2]>,
    /// Attention output projection.
    pub wo: WeightId,
    /// RMSNorm of the attention output before the residual add (Gemma 2/3).
    pub post_attn_norm: Option<WeightId>,
    /// RMSNorm before the feed-forward block.
    pub ffn_norm: WeightId,
    /// Gate and up projections.
    pub gate_up: GateUpWeights,
    /// Feed-forward down projection.
    pub w_down: WeightId,
    /// RMSNorm of the feed-forward output before the residual add (Gemma 2/3).
    pub post_ffn_norm: Option<WeightId>,
}

/// The weights of a decoder-only model (Llama family).
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Token embedding table [n_vocab rows of n_embd].
    pub token_embd: WeightId,
    /// Blocks.
    pub layers: Vec<DecoderLayerWeights>,
    /// Final RMSNorm.
    pub output_norm: WeightId,
    /// Output head; the embedding table when the model ties them.
    pub output: WeightId,
    /// Llama 3 rotary frequency factors (`rope_freqs.weight`, n_rot / 2 values): frequency i
    /// is divided by factor i.
    pub rope_freqs: Option<WeightId>,
}

/// Which kind of network a model is, with its bound weights.
#[derive(Debug, Clone)]
pub enum Layout {
    /// A decoder-only (causal) language model.
    Decoder(DecoderWeights),
    /// An encoder (BERT): bidirectional attention, embeddings out (see [`crate::embed`]).
    Encoder(crate::arch::bert::BertWeights),
}

impl Layout {
    /// Whether this is an encoder (an embedding model, run with [`crate::embed::Embedder`]
    /// rather than a [`crate::session::Session`]).
    pub fn is_encoder(&self) -> bool {
        matches!(self, Layout::Encoder(_))
    }
}

/// A model ready to run: mapped weights, hyper-parameters, tokenizer.
pub struct Model {
    gguf: Gguf,
    /// Hyper-parameters.
    pub params: HyperParams,
    /// Weight table, indexed by [`WeightId`].
    pub weights: Vec<Weight>,
    /// The architecture's weight layout.
    pub layout: Layout,
    /// Tokenizer built from the file's metadata.
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
    /// Heap the loaded model holds besides its mapped weights (see [`Model::runtime_bytes`]).
    runtime_bytes: u64,
}

/// Anonymous (heap and stack) resident bytes of this process, where the OS says (Linux).
fn anon_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The process's anonymous resident memory at one moment, taken before a model's file is opened
/// so that [`Model::from_gguf_since`] can count what loading it left resident.
#[derive(Clone, Copy, Debug)]
pub struct LoadMark(Option<u64>);

impl LoadMark {
    /// The memory now (unknown off Linux: the load then estimates from the vocabulary size).
    pub fn now() -> LoadMark {
        LoadMark(anon_resident_bytes())
    }
}

/// Heap per vocabulary entry when it cannot be measured: SmolLM2's 49,152-token BPE
/// tokenizer measured 8.8 MiB on Linux, about 190 bytes a token.
const RUNTIME_BYTES_PER_TOKEN: u64 = 190;

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("params", &self.params)
            .field("n_weights", &self.weights.len())
            .finish()
    }
}

/// Architectures with a graph builder.
pub const SUPPORTED_ARCHITECTURES: &str = "llama, qwen2, qwen3, phi3, gemma2, gemma3, bert";

/// Whether `arch` (`general.architecture`) has a graph builder.
pub fn is_supported_architecture(arch: &str) -> bool {
    SUPPORTED_ARCHITECTURES.split(", ").any(|a| a == arch)
}

impl Model {
    /// Opens and validates a GGUF model: metadata, every tensor the architecture needs (names,
    /// shapes, types), and the tokenizer. Weights stay in the file mapping.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let mark = LoadMark::now();
        let gguf = Gguf::open(path.as_ref())?;
        Model::from_gguf_since(gguf, mark)
    }

    /// Builds a model from an opened GGUF. [`Model::runtime_bytes`] then counts only what this
    /// call allocates; [`Model::from_gguf_since`] also counts the metadata parse.
    pub fn from_gguf(gguf: Gguf) -> Result<Model> {
        Model::from_gguf_since(gguf, LoadMark::now())
    }

    /// [`Model::from_gguf`] for a GGUF opened after `mark` was taken: the heap the parse of its
    /// metadata left resident counts in [`Model::runtime_bytes`] too (the allocator keeps the
    /// freed pages of the parse for later allocations, but they stay resident).
    pub fn from_gguf_since(mut gguf: Gguf, mark: LoadMark) -> Result<Model> {
        let arch = gguf
            .get_str("general.architecture")
            .ok_or_else(|| EngineError::Metadata {
                key: "general.architecture".into(),
                problem: "missing: the file is not a model (a vocabulary-only file?)".into(),
            })?
            .to_string();
        if !is_supported_architecture(&arch) {
            return Err(EngineError::UnsupportedArchitecture {
                arch,
                supported: SUPPORTED_ARCHITECTURES,
            });
        }
        let params = read_hyper_params(&gguf, &arch)?;
        let before = mark.0;
        let mut weights = Vec::new();
        let layout = match arch.as_str() {
            "bert" => Layout::Encoder(arch::bert::bind_weights(&gguf, &params, &mut weights)?),
            _ => Layout::Decoder(arch::llama::bind_weights(&gguf, &params, &mut weights)?),
        };
        // The tokenizer takes the vocabulary arrays out of the metadata: one copy, not two.
        let vocab = crate::vocab::take_vocab_config(&mut gguf)?;
        let tokenizer = Tokenizer::from_config(vocab)?;
        if tokenizer.n_vocab() != params.n_vocab {
            return Err(EngineError::Metadata {
                key: "tokenizer.ggml.tokens".into(),
                problem: format!(
                    "has {} tokens but the embedding table has {} rows",
                    tokenizer.n_vocab(),
                    params.n_vocab
                ),
            });
        }
        let chat_template = gguf.get_str("tokenizer.chat_template").map(str::to_string);
        let runtime_bytes = match (before, anon_resident_bytes()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => params.n_vocab as u64 * RUNTIME_BYTES_PER_TOKEN,
        };
        Ok(Model {
            runtime_bytes,
            gguf,
            params,
            weights,
            layout,
            tokenizer,
            chat_template,
        })
    }

    /// Why a context shift cannot run on this model, if it cannot: sliding-window layers
    /// (ring-buffer caches) or rotary frequency factors, which the shift does not apply.
    pub fn context_shift_unsupported(&self) -> Option<String> {
        if let Some(reason) = self.params.context_shift_unsupported() {
            return Some(reason);
        }
        match &self.layout {
            Layout::Decoder(w) if w.rope_freqs.is_some() => Some(format!(
                "context shift is not supported for {} models with rope frequency factors (rope_freqs.weight); use a larger --ctx",
                self.params.arch
            )),
            _ => None,
        }
    }

    /// The raw bytes of a weight, straight from the file mapping.
    pub fn weight_bytes(&self, id: WeightId) -> &[u8] {
        let w = &self.weights[id.0];
        self.gguf.tensor_data(&self.gguf.tensors()[w.tensor_index])
    }

    /// An f32 weight (a norm vector) as floats; empty if the tensor is not f32 (checked at load).
    pub fn weight_f32(&self, id: WeightId) -> &[f32] {
        bytemuck::try_cast_slice(self.weight_bytes(id)).unwrap_or(&[])
    }

    /// A weight's table entry.
    pub fn weight(&self, id: WeightId) -> &Weight {
        &self.weights[id.0]
    }

    /// Heap the loaded model holds besides its mapped weights — the tokenizer's tables, the
    /// metadata, and the pages the allocator kept from parsing them — measured as the growth
    /// of the process's anonymous resident memory while the model loaded (on Linux; elsewhere
    /// an estimate from the vocabulary size). Not planned memory, but part of what the process
    /// uses, so [`crate::session::MemoryReport`] reports it.
    pub fn runtime_bytes(&self) -> u64 {
        self.runtime_bytes
    }

    /// The opened GGUF (metadata and tensor table). The vocabulary's token and merge arrays
    /// were moved into [`Model::tokenizer`]; their keys hold empty arrays here.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// Bytes of all weights the graph reads (mapped, not copied).
    pub fn weight_bytes_total(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.weights
            .iter()
            .filter(|w| seen.insert(w.tensor_index))
            .map(|w| self.gguf.tensors()[w.tensor_index].n_bytes)
            .sum()
    }

    /// Tokenizes `text` with the model's tokenizer. `add_special`: add BOS/EOS as the model's
    /// metadata says (what a prompt that starts a conversation needs); `parse_special`:
    /// special-token text such as `<|im_start|>` becomes its token instead of plain text.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, add_special, parse_special)?)
    }

    /// The text of `tokens`; invalid UTF-8 becomes U+FFFD. `special`: render control tokens
    /// (`<|im_end|>`) as their text; without it they are left out, as llama.cpp's detokenizer
    /// does by default. Ids outside the vocabulary render to nothing.
    pub fn detokenize(&self, tokens: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &t in tokens {
            bytes.extend_from_slice(self.token_piece(t, special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` renders to (possibly part of a UTF-8 character); empty for ids
    /// outside the vocabulary, and for control tokens unless `special`. Does not allocate.
    pub fn token_piece(&self, id: u32, special: bool) -> &[u8] {
        if !special && self.tokenizer.is_control(id) {
            return &[];
        }
        self.tokenizer.piece(id)
    }

    /// Whether generation ends at token `id` (EOS, end of turn, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.tokenizer.is_eog(id)
    }

    /// Vocabulary size: valid token ids are `0..n_vocab()`.
    pub fn n_vocab(&self) -> usize {
        self.params.n_vocab
    }
}

// A model is loaded once and shared read-only by sessions on any thread: keep it so.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
};

/// Looks up a tensor, checks its shape (ggml order) and that kernels exist for its type, and
/// appends it to the weight table.
pub(crate) fn bind(
    gguf: &Gguf,
    weights: &mut Vec<Weight>,
    arch: &str,
    name: &str,
    shape: &[u64],
) -> Result<WeightId> {
    let index = gguf
        .tensors()
        .iter()
        .position(|t| t.name == name)
        .ok_or_else(|| EngineError::MissingTensor {
            name: name.to_string(),
            arch: arch.to_string(),
        })?;
    let info = &gguf.tensors()[index];
    let mut dims: Vec<u64> = info.dims.clone();
    while dims.len() > shape.len() && dims.last() == Some(&1) {
        dims.pop();
    }
    if dims != shape {
        return Err(EngineError::TensorShape {
            name: name.to_string(),
            got: info.dims.clone(),
            expected: shape.to_vec(),
        });
    }
    if !info.ggml_type.is_supported() || matches!(info.ggml_type, GgmlType::Q8_1 | GgmlType::Q8_K) {
        return Err(EngineError::UnsupportedTensorType {
            name: name.to_string(),
            ty: info.ggml_type,
        });
    }
    if info.ggml_type == GgmlType::F32
        && bytemuck::try_cast_slice::<u8, f32>(gguf.tensor_data(info)).is_err()
    {
        return Err(EngineError::Metadata {
            key: name.to_string(),
            problem: "f32 tensor data is not 4-byte aligned in memory".into(),
        });
    }
    let row_len = shape[0] as usize;
    let n_rows = shape[1..].iter().product::<u64>() as usize;
    weights.push(Weight {
        name: name.to_string(),
        ty: info.ggml_type,
        row_len,
        n_rows,
        tensor_index: index,
    });
    Ok(WeightId(weights.len() - 1))
}

fn meta_usize(g: &Gguf, key: &str) -> Result<usize> {
    match g.get_u64(key) {
        Some(v) if v > 0 && v <= (1 << 31) => Ok(v as usize),
        Some(v) => Err(EngineError::Metadata {
            key: key.into(),
            problem: format!("value {v} is out of range"),
        }),
        None => Err(EngineError::Metadata {
            key: key.into(),
            problem: "missing or not an integer".into(),
        }),
    }
}

fn read_hyper_params(g: &Gguf, arch: &str) -> Result<HyperParams> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_embd = meta_usize(g, &k("embedding_length"))?;
    let n_layer = meta_usize(g, &k("block_count"))?;
    let n_head = meta_usize(g, &k("attention.head_count"))?;
    let n_head_kv = match g.get(&k("attention.head_count_kv")) {
        Some(_) => meta_usize(g, &k("attention.head_count_kv"))?,
        None => n_head,
    };
    if n_head % n_head_kv != 0 {
        return Err(EngineError::Metadata {
            key: k("attention.head_count_kv"),
            problem: format!("{n_head_kv} does not divide the {n_head} query heads"),
        });
    }
    let head_dim = match g.get(&k("attention.key_length")) {
        Some(_) => meta_usize(g, &k("attention.key_length"))?,
        None => {
            if n_embd % n_head != 0 {
                return Err(EngineError::Metadata {
                    key: k("attention.head_count"),
                    problem: format!("{n_head} heads do not divide the width {n_embd}"),
                });
            }
            n_embd / n_head
        }
    };
    let n_ff = meta_usize(g, &k("feed_forward_length"))?;
    let n_ctx_train = meta_usize(g, &k("context_length"))?;
    let rms_eps = g
        .get_f32(&k("attention.layer_norm_rms_epsilon"))
        .unwrap_or(1e-5);
    let n_rot = match g.get(&k("rope.dimension_count")) {
        Some(_) => meta_usize(g, &k("rope.dimension_count"))?,
        None => head_dim,
    };
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(EngineError::Metadata {
            key: k("rope.dimension_count"),
            problem: format!("{n_rot} must be even and at most the head size {head_dim}"),
        });
    }
    let freq_base = g.get_f32(&k("rope.freq_base")).unwrap_or(10_000.0);
    // llama.cpp's default scaling type is linear: a factor applies unless the type says none.
    let scaling = g.get_str(&k("rope.scaling.type"));
    let freq_scale = match scaling {
        Some("none") => 1.0,
        None | Some("linear") => {
            let factor = g
                .get_f32(&k("rope.scaling.factor"))
                .or_else(|| g.get_f32(&k("rope.scale_linear")))
                .unwrap_or(0.0);
            if factor == 0.0 {
                1.0
            } else if !(factor > 0.0 && factor.is_finite()) {
                return Err(EngineError::Metadata {
                    key: k("rope.scaling.factor"),
                    problem: format!("{factor} must be a positive number"),
                });
            } else {
                1.0 / factor
            }
        }
        Some(other) => {
            return Err(EngineError::Metadata {
                key: k("rope.scaling.type"),
                problem: format!("'{other}' is not supported yet (supported: none, linear)"),
            })
        }
    };
    let n_vocab = g
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| EngineError::MissingTensor {
            name: "token_embd.weight".into(),
            arch: arch.into(),
        })? as usize;
    let ordering = match arch {
        "llama" => RopeOrdering::Normal,
        _ => RopeOrdering::NeoX,
    };
    let rope = Rope {
        ordering,
        n_rot,
        freq_base,
        freq_scale,
    };
    let positive = |key: &str| -> Result<Option<f32>> {
        match g.get(&k(key)) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
                Some(0.0) => Ok(None),
                _ => Err(EngineError::Metadata {
                    key: k(key),
                    problem: "must be a positive number".into(),
                }),
            },
        }
    };
    // Sliding-window layers (llama.cpp's defaults and keys per architecture).
    let mut window = None;
    let mut swa_layers = vec![false; n_layer];
    let mut rope_swa = rope;
    let swa_pattern = match arch {
        "gemma2" => Some((2, Some(4096))),
        "gemma3" => Some((6, None)),
        _ => None,
    };
    if let Some((default_pattern, default_window)) = swa_pattern {
        window = match g.get(&k("attention.sliding_window")) {
            Some(_) => Some(meta_usize(g, &k("attention.sliding_window"))?),
            None => default_window,
        };
        if window.is_some() {
            let key = k("attention.sliding_window_pattern");
            match g.get(&key).map(|v| (v.as_array(), v.as_u64())) {
                Some((Some(arr), _)) => {
                    if arr.len() < n_layer {
                        return Err(EngineError::Metadata {
                            key,
                            problem: format!("has {} entries for {n_layer} layers", arr.len()),
                        });
                    }
                    for (s, v) in swa_layers.iter_mut().zip(arr) {
                        *s = v.as_bool().unwrap_or(false);
                    }
                }
                other => {
                    let n = match other {
                        Some((_, Some(n))) => n as usize,
                        Some(_) => {
                            return Err(EngineError::Metadata {
                                key,
                                problem: "must be an integer or an array of booleans".into(),
                            })
                        }
                        None => default_pattern,
                    };
                    // llama.cpp: layer l slides when l % n < n - 1 (n = 0: every layer).
                    for (l, s) in swa_layers.iter_mut().enumerate() {
                        *s = n == 0 || l % n < n - 1;
                    }
                }
            }
            // Gemma 2 keeps the global rope on its local layers; Gemma 3's local layers use
            // base 10000 without scaling. Both read an explicit base when the file has one.
            let (base, scale) = match arch {
                "gemma2" => (freq_base, freq_scale),
                _ => (10_000.0, 1.0),
            };
            rope_swa = Rope {
                freq_base: g.get_f32(&k("rope.freq_base_swa")).unwrap_or(base),
                freq_scale: scale,
                ..rope
            };
        }
    }
    let gemma = matches!(arch, "gemma2" | "gemma3");
    let (attn_softcap, final_softcap) = match arch {
        "gemma2" => (
            Some(positive("attn_logit_softcapping")?.unwrap_or(50.0)),
            Some(positive("final_logit_softcapping")?.unwrap_or(30.0)),
        ),
        "gemma3" => (None, positive("final_logit_softcapping")?),
        _ => (None, None),
    };
    // llama.cpp scales Gemma 27B queries by 1/sqrt(n_embd / n_head) (its type is known by
    // its layer count), every other Gemma and Phi-3 by 1/sqrt(head_dim).
    let query_scale = match arch {
        "phi3" => Some(1.0 / (head_dim as f32).sqrt()),
        "gemma2" | "gemma3" => {
            let big = (arch == "gemma2" && n_layer == 46) || (arch == "gemma3" && n_layer == 62);
            let d = if big { n_embd / n_head } else { head_dim };
            Some(1.0 / (d as f32).sqrt())
        }
        _ => None,
    };
    Ok(HyperParams {
        arch: arch.to_string(),
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        n_ctx_train,
        rms_eps,
        rope,
        rope_swa,
        window,
        swa_layers,
        embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
        query_scale,
        attn_softcap,
        final_softcap,
        ffn_act: if gemma {
            FfnActivation::Gelu
        } else {
            FfnActivation::Silu
        },
    })
}
