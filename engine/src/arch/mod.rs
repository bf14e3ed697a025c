//! Graph builders, one per architecture. Each reads its hyper-parameters from metadata, binds
//! its weights (checking names and shapes), and builds the forward pass as a [`crate::graph::Graph`].

pub mod bert;
pub mod llama;

use crate::graph::Graph;
use crate::model::{Layout, Model};

/// The forward pass of `model` for up to `ubatch` tokens per run, built by its architecture.
pub fn build_graph(model: &Model, ubatch: usize) -> Graph {
    match &model.layout {
        Layout::Decoder(w) => llama::build_graph(model, w, ubatch),
        Layout::Encoder(w) => bert::build_graph(model, w, ubatch),
    }
}
