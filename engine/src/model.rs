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
    /// Rotary embedding.
    pub rope: Rope,
}

impl HyperParams {
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

/// The weights of one decoder block (Llama family).
#[derive(Debug, Clone)]
pub struct DecoderLayerWeights {
    /// RMSNorm before attention.
    pub attn_norm: WeightId,
    /// Query projection.
    pub wq: WeightId,
    /// Key projection.
    pub wk: WeightId,
    /// Value projection.
    pub wv: WeightId,
    /// Attention output projection.
    pub wo: WeightId,
    /// RMSNorm before the feed-forward block.
    pub ffn_norm: WeightId,
    /// SwiGLU gate projection.
    pub w_gate: WeightId,
    /// SwiGLU up projection.
    pub w_up: WeightId,
    /// Feed-forward down projection.
    pub w_down: WeightId,
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
pub const SUPPORTED_ARCHITECTURES: &str = "llama, bert";

impl Model {
    /// Opens and validates a GGUF model: metadata, every tensor the architecture needs (names,
    /// shapes, types), and the tokenizer. Weights stay in the file mapping.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let before = anon_resident_bytes();
        let gguf = Gguf::open(path.as_ref())?;
        let mut model = Model::from_gguf(gguf)?;
        // Parsing the metadata counts too: the allocator keeps the freed pages of the parse
        // for later allocations, but they stay resident.
        if let (Some(a), Some(b)) = (before, anon_resident_bytes()) {
            model.runtime_bytes = b.saturating_sub(a);
        }
        Ok(model)
    }

    /// Builds a model from an opened GGUF.
    pub fn from_gguf(mut gguf: Gguf) -> Result<Model> {
        let arch = gguf
            .get_str("general.architecture")
            .ok_or_else(|| EngineError::Metadata {
                key: "general.architecture".into(),
                problem: "missing: the file is not a model (a vocabulary-only file?)".into(),
            })?
            .to_string();
        if arch != "llama" && arch != "bert" {
            return Err(EngineError::UnsupportedArchitecture {
                arch,
                supported: SUPPORTED_ARCHITECTURES,
            });
        }
        let params = read_hyper_params(&gguf, &arch)?;
        let before = anon_resident_bytes();
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
    let scaling = g.get_str(&k("rope.scaling.type")).unwrap_or("none");
    let freq_scale = match scaling {
        "none" => 1.0,
        "linear" => {
            let factor = g.get_f32(&k("rope.scaling.factor")).unwrap_or(1.0);
            if !(factor > 0.0 && factor.is_finite()) {
                return Err(EngineError::Metadata {
                    key: k("rope.scaling.factor"),
                    problem: format!("{factor} must be a positive number"),
                });
            }
            1.0 / factor
        }
        other => {
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
        rope: Rope {
            ordering,
            n_rot,
            freq_base,
            freq_scale,
        },
    })
}
