//! Hyper-parameter and metadata *values*: a valid tiny model (from `edge_tests::tiny`) with
//! keys the loader reads set to values the input chooses — zero, huge, negative, NaN, infinite,
//! a string where a number belongs, an array where a scalar does, another architecture — must
//! load or give an error, and a model that loads must plan, run a few tokens and sample, or give
//! an error: never panic, abort or allocate without bound (the GGUF target covers structure).
//!
//! Input: one byte picks the architecture, then 10-byte records: a key (byte 0), a value type
//! (byte 1), the value's bits (bytes 2..10).
#![no_main]

use std::sync::Arc;

use edge_engine::generate::GenerateOptions;
use edge_engine::gguf::{Gguf, MetaValue};
use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::tiny::{Parts, DIMS};
use libfuzzer_sys::fuzz_target;

const ARCHS: [&str; 8] = [
    "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "bert", "mamba",
];

/// Keys under `{arch}.`, then global ones.
const ARCH_KEYS: [&str; 22] = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "pooling_type",
    "attention.causal",
    "vocab_size",
];
const GLOBAL_KEYS: [&str; 8] = [
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.chat_template",
    "general.architecture",
];
const STRINGS: [&str; 6] = ["", "none", "linear", "yarn", "gpt2", "llama"];

fn value(ty: u8, b: [u8; 8]) -> MetaValue {
    let u = u64::from_le_bytes(b);
    match ty % 11 {
        0 => MetaValue::U32(u as u32),
        1 => MetaValue::U64(u),
        2 => MetaValue::I32(u as i32),
        3 => MetaValue::I64(u as i64),
        4 => MetaValue::F32(f32::from_bits(u as u32)),
        5 => MetaValue::F64(f64::from_bits(u)),
        6 => MetaValue::Bool(u & 1 == 1),
        7 => MetaValue::String(STRINGS[(u % STRINGS.len() as u64) as usize].into()),
        8 => MetaValue::U32((u % 300) as u32), // near the real sizes
        9 => MetaValue::F32([0.0, -1.0, 1e-30, 1e30, f32::NAN, f32::INFINITY][(u % 6) as usize]),
        _ => MetaValue::Array(
            (0..(u % 9))
                .map(|i| MetaValue::Bool((u >> (8 + i)) & 1 == 1))
                .collect(),
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&a, records)) = data.split_first() else {
        return;
    };
    let arch = ARCHS[a as usize % ARCHS.len()];
    let mut parts = Parts::llama(DIMS);
    if arch != "llama" {
        for (k, _) in parts.meta.iter_mut() {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("{arch}.{rest}");
            }
        }
        parts.set("general.architecture", MetaValue::String(arch.into()));
    }
    for r in records.chunks_exact(10).take(16) {
        let n = ARCH_KEYS.len() + GLOBAL_KEYS.len();
        let i = r[0] as usize % n;
        let key = match ARCH_KEYS.get(i) {
            Some(k) => format!("{arch}.{k}"),
            None => GLOBAL_KEYS[i - ARCH_KEYS.len()].to_string(),
        };
        parts.set(&key, value(r[1], r[2..10].try_into().unwrap()));
    }
    let Ok(gguf) = Gguf::from_bytes(parts.bytes()) else {
        return;
    };
    let Ok(model) = Model::from_gguf(gguf) else {
        return;
    };
    let model = Arc::new(model);
    let cfg = SessionConfig {
        ctx: Some(16),
        ubatch: Some(4),
        threads: Some(1),
        ..Default::default()
    };
    let Ok(mut session) = Session::new(Arc::clone(&model), &cfg) else {
        return;
    };
    let options = GenerateOptions {
        max_tokens: 3,
        ..Default::default()
    };
    if let Ok(mut gen) = session.generator(&[1, 2, 3, 4, 5, 6], &options) {
        for t in gen.by_ref() {
            if t.is_err() {
                break;
            }
        }
    }
});
