//! edge-run's engine: GGUF loading, tensor types and kernels, graph building, planned execution,
//! sampling and the session API.

pub mod cpu;
pub mod gguf;
pub mod sampling;
pub mod tensor;
