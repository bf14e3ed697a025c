//! Tokenizers built from GGUF vocabulary metadata (on the HF `tokenizers` crate), and chat templates.

pub mod chat;
