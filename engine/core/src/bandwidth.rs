//! The weights a decode step streams, for the memory-bandwidth view of decoding
//! (`edge-run bench --bandwidth`): bandwidth / bytes per token is the decode speed memory
//! allows. The measurement itself is [`read_bandwidth`], in the kernels crate.

use std::collections::HashSet;

use crate::graph::{Graph, Op};
use crate::model::Model;
pub use edge_kernels::bandwidth::read_bandwidth;

/// The weights one run of `graph` reads in full: every matmul's weight matrix, once (the
/// embedding table is read one row per token, so it counts only where it is also the output
/// head).
pub fn matmul_weights<'m>(model: &'m Model, graph: &Graph) -> Vec<&'m [u8]> {
    let mut seen = HashSet::new();
    graph
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::MatMul { weight, .. } => Some(*weight),
            _ => None,
        })
        .filter(|w| seen.insert(model.weight(*w).tensor_index))
        .map(|w| model.weight_bytes(w))
        .collect()
}
