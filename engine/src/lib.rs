//! edge-run's engine: GGUF loading, tensor types and kernels, graph building, planned execution,
//! sampling and the session API.

pub mod arch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod error;
pub mod exec;
pub mod gguf;
pub mod graph;
pub mod model;
pub mod sampling;
pub mod session;
pub mod tensor;
pub mod threads;
pub mod vocab;
