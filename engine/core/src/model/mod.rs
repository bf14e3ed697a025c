//! A loaded model: the memory-mapped GGUF, its hyper-parameters ([`hparams`]), its weight
//! table ([`weights`]), its architecture's weight layout ([`crate::arch`]) and its tokenizer
//! ([`vocab`]). Loaded once, shared (read-only, `Send + Sync`) by any number of sessions.

pub mod hparams;
pub mod vocab;
pub mod weights;

use std::path::Path;

use edge_gguf::Gguf;
use edge_tokenizers::Tokenizer;

use crate::arch::{self, Layout};
use crate::constrain::{Constraint, ConstraintError, ConstraintVocab};
use crate::error::{EngineError, Hint, Result, Setting};
use crate::graph::{Graph, WeightId};
use crate::hint;
pub use hparams::{FfnActivation, HyperParams};
pub use weights::Weight;

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
    /// The token trie for constrained decoding, built on first use
    /// ([`Model::constraint_vocab`]).
    pub(crate) constraint_vocab: std::sync::OnceLock<ConstraintVocab>,
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
        if !arch::is_supported_architecture(&arch) {
            return Err(EngineError::UnsupportedArchitecture {
                arch,
                supported: arch::SUPPORTED_ARCHITECTURES,
            });
        }
        let params = hparams::read_hyper_params(&gguf, &arch)?;
        let before = mark.0;
        let mut weights = Vec::new();
        let layout = arch::bind(&gguf, &params, &mut weights)?;
        // The tokenizer takes the vocabulary arrays out of the metadata: one copy, not two.
        let vocab = vocab::take_vocab_config(&mut gguf)?;
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
            constraint_vocab: std::sync::OnceLock::new(),
        })
    }

    /// Why a context shift cannot run on this model, if it cannot: sliding-window layers
    /// (ring-buffer caches) or rotary frequency factors, which the shift does not apply.
    pub fn context_shift_unsupported(&self) -> Option<Hint> {
        if let Some(reason) = self.params.context_shift_unsupported() {
            return Some(reason);
        }
        match &self.layout {
            Layout::Decoder(w) if w.rope_freqs.is_some() => Some(hint![
                format!(
                    "context shift is not supported for {} models with rope frequency factors (rope_freqs.weight); use a larger ",
                    self.params.arch
                ),
                Setting::Ctx
            ]),
            _ => None,
        }
    }

    /// The forward pass for up to `ubatch` tokens per run, as the model's architecture builds
    /// it (see [`crate::arch`]).
    pub fn build_graph(&self, ubatch: usize) -> Graph {
        arch::build_graph(&self.params, &self.weights, &self.layout, ubatch)
    }

    /// The forward pass for up to `rows` tokens of different sequences, each row with its
    /// logits ([`arch::build_every_row_graph`]); `None` for an encoder.
    pub fn build_every_row_graph(&self, rows: usize) -> Option<Graph> {
        arch::build_every_row_graph(&self.params, &self.weights, &self.layout, rows)
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
    /// uses, so [`crate::plan::MemoryReport`] reports it.
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

impl Model {
    /// The vocabulary prepared for constrained decoding: built on first use (tens of
    /// milliseconds), then shared.
    pub fn constraint_vocab(&self) -> Result<&ConstraintVocab, ConstraintError> {
        if let Some(v) = self.constraint_vocab.get() {
            return Ok(v);
        }
        let v = ConstraintVocab::new(&self.tokenizer, self.params.n_vocab)?;
        Ok(self.constraint_vocab.get_or_init(|| v))
    }

    /// Compiles `constraint` against this model's vocabulary without generating: a bad grammar,
    /// an invalid regex or an unsupported schema keyword is reported here, with its name.
    pub fn check_constraint(&self, constraint: &Constraint) -> Result<(), ConstraintError> {
        self.constraint_vocab()?.compile(constraint).map(|_| ())
    }
}
