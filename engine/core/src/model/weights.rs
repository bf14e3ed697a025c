//! The weight table: each tensor the graph reads, found in the GGUF, checked against the shape
//! the hyper-parameters imply and against the type table, and referred to by [`WeightId`].

use edge_gguf::{GgmlType, Gguf};

use crate::error::{EngineError, Result};
use crate::graph::WeightId;

/// One weight tensor of the model, by its index in the GGUF tensor table.
#[derive(Debug, Clone)]
pub struct Weight {
    /// Tensor name in the file.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row (ggml's `ne[0]`).
    pub row_len: usize,
    /// Number of rows (product of the other dims).
    pub n_rows: usize,
    /// Index into [`Gguf::tensors`] (a tied output head shares the embedding table's).
    pub tensor_index: usize,
}

/// Looks up a tensor, checks its shape (ggml order) and that kernels exist for its type, and
/// appends it to the weight table.
pub fn bind(
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
    if !info.ggml_type.backends().cpu {
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
