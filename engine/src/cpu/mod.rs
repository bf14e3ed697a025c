//! CPU kernels (being written).
