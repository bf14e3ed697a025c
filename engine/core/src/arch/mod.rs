//! The architectures: for each family, its weights (found in the file and checked against the
//! hyper-parameters) and its graph builder, which writes the forward pass as a list of ops
//! over named values ([`crate::graph::Graph`]).
//!
//! - [`decoder`]: decoder-only transformers of the Llama family (`llama`, `qwen2`, `qwen3`,
//!   `phi3`, `gemma2`, `gemma3`), one builder whose optional parts the weights switch on;
//! - [`bert`]: BERT encoders (`bert`), pooled into sentence embeddings.
//!
//! A builder sees the hyper-parameters and the weight table, never a loaded model: the model
//! asks its architecture for its graph ([`crate::model::Model::build_graph`]).

pub mod bert;
pub mod decoder;

use edge_gguf::Gguf;

use crate::error::Result;
use crate::graph::Graph;
use crate::model::hparams::HyperParams;
use crate::model::weights::Weight;

/// Architectures with a graph builder (`general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &str = "llama, qwen2, qwen3, phi3, gemma2, gemma3, bert";

/// Whether `arch` (`general.architecture`) has a graph builder.
pub fn is_supported_architecture(arch: &str) -> bool {
    SUPPORTED_ARCHITECTURES.split(", ").any(|a| a == arch)
}

/// Which kind of network a model is, with its bound weights.
#[derive(Debug, Clone)]
pub enum Layout {
    /// A decoder-only (causal) language model.
    Decoder(decoder::DecoderWeights),
    /// An encoder (BERT): bidirectional attention, embeddings out (see [`crate::embed`]).
    Encoder(bert::BertWeights),
}

impl Layout {
    /// Whether this is an encoder (an embedding model, run with [`crate::embed::Embedder`]
    /// rather than a [`crate::session::Session`]).
    pub fn is_encoder(&self) -> bool {
        matches!(self, Layout::Encoder(_))
    }
}

/// Finds and checks every tensor the architecture of `p` needs, appending them to `weights`.
pub fn bind(g: &Gguf, p: &HyperParams, weights: &mut Vec<Weight>) -> Result<Layout> {
    Ok(match p.arch.as_str() {
        "bert" => Layout::Encoder(bert::bind_weights(g, p, weights)?),
        _ => Layout::Decoder(decoder::bind_weights(g, p, weights)?),
    })
}

/// The forward pass for up to `ubatch` tokens per run, built by the layout's architecture.
pub fn build_graph(p: &HyperParams, weights: &[Weight], layout: &Layout, ubatch: usize) -> Graph {
    match layout {
        Layout::Decoder(w) => decoder::build_graph(p, weights, w, ubatch, false),
        Layout::Encoder(w) => bert::build_graph(p, weights, w, ubatch),
    }
}

/// A decoder's forward pass for up to `rows` tokens that each get their logits (the next
/// tokens of `rows` sequences decoded together); `None` for an encoder.
pub fn build_every_row_graph(
    p: &HyperParams,
    weights: &[Weight],
    layout: &Layout,
    rows: usize,
) -> Option<Graph> {
    match layout {
        Layout::Decoder(w) => Some(decoder::build_graph(p, weights, w, rows, true)),
        Layout::Encoder(_) => None,
    }
}
