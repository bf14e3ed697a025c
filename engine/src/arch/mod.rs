//! Graph builders, one per architecture. Each reads its hyper-parameters from metadata, binds
//! its weights (checking names and shapes), and builds the forward pass as a [`crate::graph::Graph`].

pub mod llama;
