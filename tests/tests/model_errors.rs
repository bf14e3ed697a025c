//! Bad models and bad session input at the library level: tiny synthetic Llama GGUFs written
//! with `GgufWriter` (a complete valid one that loads and runs, then one defect at a time), each
//! of which must give its specific `EngineError` variant naming the tensor or key, never a
//! panic; and a session's limits (context, vocabulary) as errors.

use std::path::Path;
use std::sync::Arc;

use edge_engine::error::{EngineError, Setting};
use edge_engine::gguf::GgmlType;
use edge_engine::gguf::{GgufError, MetaValue};
use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::tiny::*;

/// Writes `parts` to a file and loads it the way the CLI does.
fn load(parts: &Parts) -> Result<Model, EngineError> {
    let dir = TempDir::new("model-errors");
    let path = dir.write("model.gguf", &parts.bytes());
    Model::load(&path)
}

fn load_err(parts: &Parts) -> EngineError {
    match load(parts) {
        Ok(m) => panic!("expected an error, the model loaded: {m:?}"),
        Err(e) => e,
    }
}

fn with(f: impl FnOnce(&mut Parts)) -> Parts {
    let mut p = Parts::llama(DIMS);
    f(&mut p);
    p
}

fn session(model: &Arc<Model>, ctx: usize, ubatch: usize) -> Session {
    Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(ctx),
            ubatch: Some(ubatch),
            threads: Some(1),
            ..Default::default()
        },
    )
    .expect("session")
}

fn tiny_model() -> Arc<Model> {
    Arc::new(load(&Parts::llama(DIMS)).expect("the tiny model loads"))
}

fn assert_finite(logits: &[f32], n_vocab: usize) {
    assert_eq!(logits.len(), n_vocab);
    assert!(logits.iter().all(|x| x.is_finite()), "{logits:?}");
    assert!(logits.iter().any(|&x| x != logits[0]), "constant logits");
}

// ---------------------------------------------------------------- the valid model

#[test]
fn tiny_model_loads_and_runs() {
    let model = tiny_model();
    let p = &model.params;
    assert_eq!(
        (
            p.n_layer,
            p.n_embd,
            p.n_head,
            p.n_head_kv,
            p.head_dim,
            p.n_ff
        ),
        (2, 64, 4, 2, 16, 128)
    );
    assert_eq!(p.n_vocab, vocab().tokens.len());
    assert_eq!(p.n_ctx_train, 64);

    let ids = model
        .tokenizer
        .encode("the cat is the cat", false, false)
        .unwrap();
    assert!(ids.len() >= 5, "{ids:?}");
    assert_eq!(model.tokenizer.decode(&ids), "the cat is the cat");

    // the prompt in chunks of 4 (prefill graph), then decode steps
    let mut s = session(&model, 32, 4);
    let logits = s.prefill(&ids).unwrap().to_vec();
    assert_finite(&logits, p.n_vocab);
    assert_eq!(s.n_past(), ids.len());
    for t in [3u32, 100, 255] {
        let l = s.step(t).unwrap();
        assert_finite(l, p.n_vocab);
    }
    assert_eq!(s.n_past(), ids.len() + 3);

    // the same prompt again gives the same logits, in one chunk or token by token
    s.reset();
    assert_eq!(s.prefill(&ids).unwrap(), &logits[..]);
    let mut one = session(&model, 32, 1);
    let mut last = Vec::new();
    for &t in &ids {
        last = one.step(t).unwrap().to_vec();
    }
    let diff = last
        .iter()
        .zip(&logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        diff < 1e-3,
        "prefill and token-by-token logits differ by {diff}"
    );
}

// ---------------------------------------------------------------- defects, one at a time

/// A separate `output.weight` is used instead of the embedding table: with it set to twice the
/// table, every logit doubles exactly (f32 weights; scaling by 2 is exact).
#[test]
fn separate_output_head_is_used() {
    let tied = tiny_model();
    let separate = with(|p| {
        let embd = p.tensor("token_embd.weight");
        let doubled: Vec<f32> = embd
            .data
            .chunks_exact(4)
            .map(|b| 2.0 * f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let dims = embd.dims.clone();
        p.tensors.push(T {
            name: "output.weight".into(),
            dims,
            ty: GgmlType::F32,
            data: f32_bytes(doubled),
        });
    });
    let separate = Arc::new(load(&separate).expect("a model with its own output head loads"));
    let edge_engine::arch::Layout::Decoder(layout) = &separate.layout else {
        panic!("a llama model has a decoder layout")
    };
    assert_ne!(layout.output, layout.token_embd);
    let prompt = [3u32, 1, 4, 1, 5];
    let want: Vec<f32> = session(&tied, 16, 8)
        .prefill(&prompt)
        .unwrap()
        .iter()
        .map(|x| 2.0 * x)
        .collect();
    let mut s = session(&separate, 16, 8);
    assert_eq!(s.prefill(&prompt).unwrap(), &want[..]);
}

#[test]
fn missing_tensor_is_named() {
    let e = load_err(&with(|p| {
        p.remove_tensor("blk.1.ffn_up.weight");
    }));
    match &e {
        EngineError::MissingTensor { name, arch } => {
            assert_eq!(name, "blk.1.ffn_up.weight");
            assert_eq!(arch, "llama");
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    assert!(e.to_string().contains("blk.1.ffn_up.weight"), "{e}");

    let e = load_err(&with(|p| {
        p.remove_tensor("token_embd.weight");
    }));
    assert!(
        matches!(&e, EngineError::MissingTensor { name, .. } if name == "token_embd.weight"),
        "{e:?}"
    );
    let e = load_err(&with(|p| {
        p.remove_tensor("output_norm.weight");
    }));
    assert!(
        matches!(&e, EngineError::MissingTensor { name, .. } if name == "output_norm.weight"),
        "{e:?}"
    );
}

#[test]
fn wrongly_shaped_tensor_is_named() {
    // attn_k of a 2-kv-head model is [64, 32]; give it [64, 64]
    let e = load_err(&with(|p| {
        let mut rng = Rng(7);
        let t = p.tensor("blk.0.attn_k.weight");
        t.dims = vec![64, 64];
        t.data = q8_0_bytes(&mut rng, 64 * 64);
    }));
    match &e {
        EngineError::TensorShape {
            name,
            got,
            expected,
        } => {
            assert_eq!(name, "blk.0.attn_k.weight");
            assert_eq!(got, &vec![64, 64]);
            assert_eq!(expected, &vec![64, 32]);
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
    assert!(e.to_string().contains("blk.0.attn_k.weight"), "{e}");

    // a norm of the wrong length
    let e = load_err(&with(|p| {
        let t = p.tensor("blk.1.ffn_norm.weight");
        t.dims = vec![32];
        t.data = f32_bytes(std::iter::repeat_n(1.0, 32));
    }));
    assert!(
        matches!(&e, EngineError::TensorShape { name, .. } if name == "blk.1.ffn_norm.weight"),
        "{e:?}"
    );
}

#[test]
fn unsupported_tensor_type_is_named() {
    // mxfp4 (id 39, 32-element blocks) projections: a valid GGUF type without kernels here
    let e = load_err(&with(|p| {
        let t = p.tensor("blk.0.attn_q.weight");
        t.ty = GgmlType::Unsupported(39);
        t.data = vec![0u8; 64 * 2 * 17];
    }));
    match &e {
        EngineError::UnsupportedTensorType { name, ty } => {
            assert_eq!(name, "blk.0.attn_q.weight");
            assert_eq!(ty.id(), 39);
        }
        other => panic!("expected UnsupportedTensorType, got {other:?}"),
    }
    assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");

    // iq2_xxs (id 16, 256-element blocks): a model with n_ff = 256 so ffn_down rows are one block
    let d = Dims { n_ff: 256, ..DIMS };
    let mut p = Parts::llama(d);
    let t = p.tensor("blk.1.ffn_down.weight");
    t.ty = GgmlType::Unsupported(16);
    t.data = vec![0u8; 64 * 66];
    let e = load_err(&p);
    match &e {
        EngineError::UnsupportedTensorType { name, ty } => {
            assert_eq!(name, "blk.1.ffn_down.weight");
            assert_eq!(ty.id(), 16);
        }
        other => panic!("expected UnsupportedTensorType, got {other:?}"),
    }
    assert!(
        e.to_string().contains("iq2_xxs") || e.to_string().contains("IQ2_XXS"),
        "{e}"
    );

    // norms must be f32
    let e = load_err(&with(|p| {
        let t = p.tensor("blk.0.attn_norm.weight");
        t.ty = GgmlType::F16;
        t.data = vec![0u8; 64 * 2];
    }));
    assert!(
        matches!(&e, EngineError::UnsupportedTensorType { name, .. } if name == "blk.0.attn_norm.weight"),
        "{e:?}"
    );
}

#[test]
fn unknown_architecture_is_named() {
    let e = load_err(&with(|p| {
        p.set("general.architecture", MetaValue::String("mamba".into()));
    }));
    match &e {
        EngineError::UnsupportedArchitecture { arch, supported } => {
            assert_eq!(arch, "mamba");
            for a in ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"] {
                assert!(supported.contains(a), "{a} missing from {supported}");
                assert!(e.to_string().contains(a), "{e}");
            }
        }
        other => panic!("expected UnsupportedArchitecture, got {other:?}"),
    }
    assert!(e.to_string().contains("mamba"), "{e}");
}

#[test]
fn missing_metadata_key_is_named() {
    for key in [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.context_length",
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
    ] {
        let e = load_err(&with(|p| {
            p.remove(key);
        }));
        match &e {
            EngineError::Metadata { key: k, .. } => assert_eq!(k, key, "{e}"),
            other => panic!("removing {key}: expected Metadata, got {other:?}"),
        }
        assert!(e.to_string().contains(key), "{e}");
    }
    // a key of the wrong type is named too
    let e = load_err(&with(|p| {
        p.set("llama.block_count", MetaValue::String("two".into()));
    }));
    assert!(
        matches!(&e, EngineError::Metadata { key, .. } if key == "llama.block_count"),
        "{e:?}"
    );
    // zero is out of range
    let e = load_err(&with(|p| {
        p.set("llama.attention.head_count", MetaValue::U32(0));
    }));
    assert!(
        matches!(&e, EngineError::Metadata { key, .. } if key == "llama.attention.head_count"),
        "{e:?}"
    );
}

#[test]
fn head_counts_that_do_not_divide_are_named() {
    // 3 kv heads do not divide 4 query heads
    let e = load_err(&with(|p| {
        p.set("llama.attention.head_count_kv", MetaValue::U32(3));
    }));
    match &e {
        EngineError::Metadata { key, problem } => {
            assert_eq!(key, "llama.attention.head_count_kv");
            assert!(problem.contains('3') && problem.contains('4'), "{problem}");
        }
        other => panic!("expected Metadata, got {other:?}"),
    }
    // 5 heads do not divide the width 64
    let e = load_err(&with(|p| {
        p.set("llama.attention.head_count", MetaValue::U32(5));
        p.set("llama.attention.head_count_kv", MetaValue::U32(5));
    }));
    assert!(
        matches!(&e, EngineError::Metadata { key, .. } if key == "llama.attention.head_count"),
        "{e:?}"
    );
}

#[test]
fn vocabulary_and_embedding_must_agree() {
    let e = load_err(&with(|p| {
        let v = vocab();
        let fewer: Vec<MetaValue> = v.tokens[..v.tokens.len() - 1]
            .iter()
            .map(|s| MetaValue::String(s.clone()))
            .collect();
        let types: Vec<MetaValue> = v.types[..v.types.len() - 1]
            .iter()
            .map(|&t| MetaValue::I32(t))
            .collect();
        p.set("tokenizer.ggml.tokens", MetaValue::Array(fewer));
        p.set("tokenizer.ggml.token_type", MetaValue::Array(types));
        p.remove("tokenizer.ggml.bos_token_id");
        p.remove("tokenizer.ggml.eos_token_id");
    }));
    assert!(
        matches!(&e, EngineError::Metadata { key, .. } if key == "tokenizer.ggml.tokens"),
        "{e:?}"
    );
}

#[test]
fn vocabulary_only_and_truncated_files_are_errors() {
    // a llama vocabulary without tensors
    let mut p = Parts::llama(DIMS);
    p.tensors.clear();
    let e = load_err(&p);
    assert!(
        matches!(&e, EngineError::MissingTensor { name, .. } if name == "token_embd.weight"),
        "{e:?}"
    );
    // llama.cpp's gpt-2 vocabulary file
    let vocab_file = edge_tests::shared_dir().join("reference/tokenizer/ggml-vocab-gpt-2.gguf");
    let e = Model::load(&vocab_file).unwrap_err();
    assert!(
        matches!(&e, EngineError::UnsupportedArchitecture { arch, .. } if arch == "gpt2"),
        "{e:?}"
    );

    // cut anywhere: a GGUF error, never a panic; cut in the data: the tensor is named
    let bytes = Parts::llama(DIMS).bytes();
    let dir = TempDir::new("model-errors");
    for cut in [0, 3, 10, 100, 1000, 5000, bytes.len() / 2, bytes.len() - 1] {
        let path: &Path = &dir.write(&format!("cut-{cut}.gguf"), &bytes[..cut]);
        let e = Model::load(path).unwrap_err();
        assert!(matches!(e, EngineError::Gguf(_)), "cut at {cut}: {e:?}");
    }
    let e = Model::load(dir.write("cut-last.gguf", &bytes[..bytes.len() - 1])).unwrap_err();
    assert!(
        matches!(&e, EngineError::Gguf(GgufError::TensorOutOfRange { name, .. }) if name == "output_norm.weight"),
        "{e:?}"
    );
    let e = Model::load(dir.0.join("does-not-exist.gguf")).unwrap_err();
    assert!(
        matches!(&e, EngineError::Gguf(GgufError::Io { .. })),
        "{e:?}"
    );
}

// ---------------------------------------------------------------- session limits

#[test]
fn prompt_longer_than_the_context_is_context_full() {
    let model = tiny_model();
    let mut s = session(&model, 8, 4);
    let prompt: Vec<u32> = (0..9).collect();
    match s.prefill(&prompt) {
        Err(EngineError::ContextFull {
            what,
            needed,
            ctx,
            max,
        }) => {
            assert_eq!((what, needed, ctx, max), ("prompt", 9, 8, 64));
        }
        other => panic!("expected ContextFull, got {:?}", other.map(<[f32]>::len)),
    }
    // nothing was consumed: a prompt that fits still works
    assert_eq!(s.n_past(), 0);
    assert_finite(s.prefill(&prompt[..8]).unwrap(), model.params.n_vocab);
}

#[test]
fn token_outside_the_vocabulary_is_invalid_argument() {
    let model = tiny_model();
    let n_vocab = model.params.n_vocab as u32;
    let mut s = session(&model, 16, 4);
    for bad in [vec![1, 2, n_vocab], vec![u32::MAX]] {
        match s.prefill(&bad) {
            Err(EngineError::InvalidArgument(msg)) => {
                assert!(msg.contains(&bad.last().unwrap().to_string()), "{msg}")
            }
            other => panic!(
                "expected InvalidArgument, got {:?}",
                other.map(<[f32]>::len)
            ),
        }
    }
    assert_eq!(s.n_past(), 0);
    s.prefill(&[1, 2, 3]).unwrap();
    assert!(matches!(
        s.step(n_vocab),
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.prefill(&[]),
        Err(EngineError::InvalidArgument(_))
    ));
    assert_eq!(s.n_past(), 3);
    assert_finite(s.step(n_vocab - 1).unwrap(), model.params.n_vocab);
}

#[test]
fn generating_past_the_context_is_context_full() {
    let model = tiny_model();
    let mut s = session(&model, 8, 4);
    s.prefill(&[10, 20, 30, 40, 50]).unwrap();
    for t in [60, 70, 80] {
        s.step(t).unwrap();
    }
    assert_eq!(s.n_past(), 8);
    for _ in 0..2 {
        match s.step(90) {
            Err(EngineError::ContextFull {
                what, needed, ctx, ..
            }) => {
                assert_eq!((what, needed, ctx), ("generation", 9, 8));
            }
            other => panic!("expected ContextFull, got {:?}", other.map(<[f32]>::len)),
        }
    }
    assert!(matches!(
        s.prefill(&[1, 2]),
        Err(EngineError::ContextFull { what: "prompt", .. })
    ));
    // after a reset the session runs again
    s.reset();
    assert_finite(s.prefill(&[10, 20, 30]).unwrap(), model.params.n_vocab);
}

/// A session setting out of range is an invalid-setting error that names the setting (the C
/// API reports it as an invalid argument).
#[test]
fn bad_session_config_is_invalid_argument() {
    let model = tiny_model();
    for (cfg, setting) in [
        (
            SessionConfig {
                ctx: Some(0),
                ubatch: None,
                threads: Some(1),
                ..Default::default()
            },
            Setting::Ctx,
        ),
        (
            SessionConfig {
                ctx: Some(8),
                ubatch: Some(0),
                threads: Some(1),
                ..Default::default()
            },
            Setting::Ubatch,
        ),
        (
            SessionConfig {
                ctx: Some(8),
                ubatch: None,
                threads: Some(0),
                ..Default::default()
            },
            Setting::Threads,
        ),
    ] {
        let e = Session::new(model.clone(), &cfg).unwrap_err();
        assert!(
            matches!(e, EngineError::InvalidSetting { setting: s, .. } if s == setting),
            "{cfg:?}: {e:?}"
        );
    }
}

// ---------------------------------------------------------------- the malformed-file corpus

/// Bytes a metadata value takes after its type id.
fn value_len(v: &MetaValue) -> usize {
    match v {
        MetaValue::U8(_) | MetaValue::I8(_) | MetaValue::Bool(_) => 1,
        MetaValue::U16(_) | MetaValue::I16(_) => 2,
        MetaValue::U32(_) | MetaValue::I32(_) | MetaValue::F32(_) => 4,
        MetaValue::U64(_) | MetaValue::I64(_) | MetaValue::F64(_) => 8,
        MetaValue::String(s) => 8 + s.len(),
        MetaValue::Array(items) => 12 + items.iter().map(value_len).sum::<usize>(),
    }
}

/// Every field of a valid GGUF file, in file order, as (the name the reader gives it, start,
/// end): header, each metadata pair (key length, key, value type, value), each tensor info
/// (name, n_dims, dims, type, offset), the alignment padding and each tensor's data.
fn layout(bytes: &[u8]) -> Vec<(String, usize, usize)> {
    fn field(fields: &mut Vec<(String, usize, usize)>, name: String, len: usize) {
        let at = fields.last().map_or(0, |f| f.2);
        fields.push((name, at, at + len));
    }
    let g = edge_engine::gguf::Gguf::from_bytes(bytes.to_vec()).expect("a valid file");
    let f = &mut Vec::new();
    field(f, "magic".into(), 4);
    field(f, "version".into(), 4);
    field(f, "tensor count".into(), 8);
    field(f, "metadata count".into(), 8);
    for (i, (k, v)) in g.metadata().iter().enumerate() {
        field(f, format!("length of key of metadata pair {i}"), 8);
        field(f, format!("key of metadata pair {i}"), k.len());
        field(f, format!("value type of key `{k}`"), 4);
        match v {
            MetaValue::String(s) => {
                field(f, format!("length of value of key `{k}`"), 8);
                field(f, format!("value of key `{k}`"), s.len());
            }
            MetaValue::Array(items) => {
                field(f, format!("array element type of key `{k}`"), 4);
                field(f, format!("array length of key `{k}`"), 8);
                // elements (strings: a length and bytes each) are all "value of key `k`"
                let len = items.iter().map(value_len).sum();
                field(f, format!("value of key `{k}`"), len);
            }
            v => field(f, format!("value of key `{k}`"), value_len(v)),
        }
    }
    for (i, t) in g.tensors().iter().enumerate() {
        field(f, format!("length of name of tensor {i}"), 8);
        field(f, format!("name of tensor {i}"), t.name.len());
        let name = &t.name;
        field(f, format!("n_dims of tensor `{name}`"), 4);
        for d in 0..t.dims.len() {
            field(f, format!("dim {d} of tensor `{name}`"), 8);
        }
        field(f, format!("type of tensor `{name}`"), 4);
        field(f, format!("data offset of tensor `{name}`"), 8);
    }
    let header_end = f.last().map_or(0, |x| x.2);
    field(
        f,
        "alignment padding".into(),
        g.data_offset() as usize - header_end,
    );
    for t in g.tensors() {
        assert_eq!(
            t.offset as usize,
            f.last().unwrap().2,
            "tensors are written in order"
        );
        field(
            f,
            format!("data of tensor `{}`", t.name),
            t.n_bytes as usize,
        );
    }
    assert_eq!(f.last().unwrap().2, bytes.len());
    std::mem::take(f)
}

/// A model file cut inside each of its fields — the header, every metadata pair, every tensor
/// info, the alignment padding, every tensor's data — gives the error that names that very
/// field (and never a panic): `Truncated` with the field's name and offset while reading the
/// header, or the first tensor whose data the cut leaves incomplete. Where a count read earlier
/// (the tensor or metadata count, an array or string length) can no longer fit in what is
/// left, the reader refuses that count first (`CountTooLarge`, before allocating for it).
#[test]
fn truncated_inside_every_field_names_the_field() {
    let bytes = Parts::llama(DIMS).bytes();
    let fields = layout(&bytes);
    assert!(fields.len() > 60, "{} fields", fields.len());
    let first_tensor = edge_engine::gguf::Gguf::from_bytes(bytes.clone())
        .unwrap()
        .tensors()[0]
        .name
        .clone();
    let (mut checked, mut counts) = (0, 0);
    for (name, start, end) in &fields {
        if start == end {
            continue; // no padding, or an empty key
        }
        let cut = start + (end - start) / 2;
        let e = edge_engine::gguf::Gguf::from_bytes(bytes[..cut].to_vec()).unwrap_err();
        let msg = e.to_string();
        let ok = match &e {
            GgufError::BadMagic { .. } => name == "magic",
            GgufError::Truncated { what, offset, .. } => what == name && *offset as usize == *start,
            // A count read before the cut (tensor/metadata count, a string or array length)
            // that the bytes left can no longer hold: the reader refuses it before allocating.
            GgufError::CountTooLarge { offset, what, .. } => {
                counts += 1;
                let same_key = what
                    .split_once(" of key ")
                    .is_some_and(|(_, key)| name.ends_with(&format!(" of key {key}")));
                (*offset as usize) <= *start
                    && (same_key
                        || *what == format!("length of {name}")
                        || what == "metadata count"
                        || (what == "tensor count" && name.contains(" of tensor ")))
            }
            GgufError::TensorOutOfRange { name: t, .. } => {
                if let Some(data_of) = name.strip_prefix("data of tensor ") {
                    data_of == format!("`{t}`")
                } else {
                    name == "alignment padding" && t == &first_tensor
                }
            }
            _ => false,
        };
        assert!(ok, "cut at {cut} inside {name} ({start}..{end}): {msg}");
        assert!(!msg.contains('\n'), "{msg}");
        checked += 1;
    }
    eprintln!("{checked} truncations checked, {counts} refused by a count");
    // The others are reported as the very field they fall in.
    assert!(counts * 3 < checked, "{counts} of {checked}");
}

/// One defect at a time in an otherwise complete model file, loaded as the CLI loads it: each
/// gives its own error variant naming the key, tensor or field. (The GGUF reader's unit tests,
/// `engine/gguf/src/tests.rs`, cover the same defects on minimal files, value type by value
/// type.)
#[test]
fn malformed_model_files_give_their_specific_errors() {
    // GGUF value type ids (the spec's; the reader's constants are crate-private).
    mod value_type {
        pub const U8: u32 = 0;
        pub const STRING: u32 = 8;
        pub const ARRAY: u32 = 9;
    }
    type Check = fn(&EngineError) -> bool;
    let base = Parts::llama(DIMS);
    let tokens_len = 264u32; // 256 bytes + 7 merges + <|endoftext|>
    let mut cases: Vec<(&str, Vec<u8>, Check)> = Vec::new();
    let mut w = base.writer();
    w.magic(*b"GGML");
    cases.push((
        "wrong magic",
        w.to_bytes(),
        |e| matches!(e, EngineError::Gguf(GgufError::BadMagic { found }) if found == b"GGML"),
    ));
    for v in [1u32, 4] {
        let mut w = base.writer();
        w.version(v);
        cases.push(("wrong version", w.to_bytes(), |e| {
            matches!(e, EngineError::Gguf(GgufError::UnsupportedVersion { .. }))
        }));
    }
    for count in [u64::MAX, 1 << 40, 1 << 20] {
        let mut w = base.writer();
        w.tensor_count(count);
        cases.push(("absurd tensor count", w.to_bytes(), |e| {
            matches!(e, EngineError::Gguf(GgufError::CountTooLarge { what, offset: 8, .. }) if what == "tensor count")
        }));
    }
    let mut w = base.writer();
    w.kv_count(1 << 40);
    cases.push(("absurd metadata count", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::CountTooLarge { what, offset: 16, .. }) if what == "metadata count")
    }));
    // an array claiming more strings than the file holds
    let mut v = value_type::STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let mut w = base.writer();
    w.add_raw_kv(b"z.huge_array", value_type::ARRAY, &v);
    cases.push(("absurd array length", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::CountTooLarge { what, .. }) if what.contains("z.huge_array"))
    }));
    let mut v = u64::MAX.to_le_bytes().to_vec();
    v.extend_from_slice(b"abc");
    let mut w = base.writer();
    w.add_raw_kv(b"z.huge_string", value_type::STRING, &v);
    cases.push(("absurd string length", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::CountTooLarge { what, count: u64::MAX, .. }) if what.contains("z.huge_string"))
    }));
    let mut w = base.writer();
    w.add_raw_kv(b"z.bad_type", 13, &[0; 8]);
    cases.push(("unknown value type", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::UnknownValueType { key, type_id: 13, .. }) if key == "z.bad_type")
    }));
    let mut w = base.writer();
    w.add_raw_kv(b"z.key\xff", value_type::U8, &[1]);
    cases.push(("non-UTF-8 key", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::InvalidUtf8 { what, .. }) if what.contains("key of metadata pair"))
    }));
    let mut v = 2u64.to_le_bytes().to_vec();
    v.extend_from_slice(b"\xc3\x28");
    let mut w = base.writer();
    w.add_raw_kv(b"general.name", value_type::STRING, &v);
    cases.push(("non-UTF-8 string value", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::InvalidUtf8 { what, .. }) if what.contains("general.name"))
    }));
    let mut w = base.writer();
    w.add_u32("llama.block_count", 2);
    cases.push(("duplicate key", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::DuplicateKey { key, .. }) if key == "llama.block_count")
    }));
    let mut w = base.writer();
    w.add_tensor("output_norm.weight", &[64], GgmlType::F32, vec![0; 256]);
    cases.push(("duplicate tensor", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::DuplicateTensor { name, .. }) if name == "output_norm.weight")
    }));
    let mut w = base.writer();
    w.add_tensor_raw(b"z.\x80", &[4], 0, None, vec![0; 16]);
    cases.push(("non-UTF-8 tensor name", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::InvalidUtf8 { what, .. }) if what.contains("name of tensor 20"))
    }));
    let mut w = base.writer();
    w.add_tensor(
        "z.overflow",
        &[1 << 32, 1 << 32],
        GgmlType::F32,
        vec![0; 16],
    );
    cases.push(("dims overflow", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::DimsOverflow { name, .. }) if name == "z.overflow")
    }));
    let mut w = base.writer();
    w.add_tensor_raw(b"z.type", &[32], 99, None, vec![0; 128]);
    cases.push(("unknown tensor type", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::UnknownTensorType { name, type_id: 99, .. }) if name == "z.type")
    }));
    let mut w = base.writer();
    w.add_tensor_raw(b"z.misaligned", &[4], 0, Some(4), vec![0; 16]);
    cases.push(("misaligned offset", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::MisalignedTensor { name, data_offset: 4, .. }) if name == "z.misaligned")
    }));
    let mut w = base.writer();
    w.add_tensor_raw(b"z.far", &[4], 0, Some(1 << 40), vec![0; 16]);
    cases.push(("out-of-range offset", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::TensorOutOfRange { name, .. }) if name == "z.far")
    }));
    let mut w = base.writer();
    w.add_tensor_raw(b"z.wrap", &[4], 0, Some(u64::MAX - 31), vec![0; 16]);
    cases.push(("offset that wraps", w.to_bytes(), |e| {
        matches!(e, EngineError::Gguf(GgufError::TensorOutOfRange { name, start: u64::MAX, .. }) if name == "z.wrap")
    }));
    // model level: missing and wrongly shaped tensors, unknown tokenizer, bad token list
    cases.push((
        "missing tensor",
        with(|p| {
            p.remove_tensor("blk.1.ffn_down.weight");
        })
        .bytes(),
        |e| matches!(e, EngineError::MissingTensor { name, .. } if name == "blk.1.ffn_down.weight"),
    ));
    cases.push((
        "wrongly shaped tensor",
        with(|p| p.tensor("output_norm.weight").dims = vec![32, 2]).bytes(),
        |e| matches!(e, EngineError::TensorShape { name, .. } if name == "output_norm.weight"),
    ));
    cases.push((
        "unknown tokenizer model",
        with(|p| {
            p.set("tokenizer.ggml.model", MetaValue::String("foo".into()));
        })
        .bytes(),
        |e| {
            matches!(e, EngineError::Tokenizer(edge_tokenizers::TokenizerError::UnsupportedModel { model, .. }) if model == "foo")
                && e.to_string().contains("tokenizer.ggml.model")
        },
    ));
    cases.push((
        "token list of numbers",
        with(|p| {
            p.set(
                "tokenizer.ggml.tokens",
                MetaValue::Array((0..tokens_len).map(MetaValue::U32).collect()),
            );
        })
        .bytes(),
        |e| e.to_string().contains("tokenizer.ggml.tokens"),
    ));
    let dir = TempDir::new("model-errors");
    for (i, (what, bytes, check)) in cases.iter().enumerate() {
        let path = dir.write(&format!("case-{i}.gguf"), bytes);
        let e = match Model::load(&path) {
            Ok(_) => panic!("{what}: the model loaded"),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert!(check(&e), "{what}: unexpected error {e:?}: {msg}");
        assert!(!msg.is_empty() && !msg.contains('\n'), "{what}: {msg}");
    }
}

/// Which models the CUDA backend refuses, decided without a GPU: a head size its attention
/// kernel lacks, or a weight type without CUDA kernels (none of the types the loader accepts
/// since the k-quant and IQ4 kernels). The default device falls back to the CPU for such a model (`device_for`); an explicit `--device cuda` reports the reason.
#[test]
fn cuda_support_is_decided_from_the_model() {
    use edge_engine::backend::cuda::cuda_unsupported;
    // DIMS has heads of 16: below the kernel's multiple of 32.
    let reason = cuda_unsupported(&tiny_model())
        .expect("head size 16 is refused")
        .to_string();
    assert!(
        reason.contains("head size") && reason.contains("16"),
        "{reason}"
    );
    // Heads of 32 and only q8_0/f32 tensors: supported.
    let d = Dims {
        n_embd: 128,
        n_ff: 256,
        ..DIMS
    };
    let m = load(&Parts::llama(d)).expect("loads");
    assert_eq!(cuda_unsupported(&m), None);
    // Every weight type the loader accepts has CUDA kernels (the k-quants and IQ4 included): a
    // model is refused for its head size only.
    for (ty, block_bytes) in [
        (GgmlType::Q5_0, 8 * 22),
        (GgmlType::Q5_1, 8 * 24),
        (GgmlType::IQ4_NL, 8 * 18),
        (GgmlType::Q2_K, 84),
        (GgmlType::Q3_K, 110),
        (GgmlType::Q4_K, 144),
        (GgmlType::Q5_K, 176),
        (GgmlType::Q6_K, 210),
        (GgmlType::IQ4_XS, 136),
    ] {
        let mut p = Parts::llama(d);
        let t = p.tensor("blk.1.ffn_down.weight");
        t.ty = ty;
        t.data = vec![0u8; 128 * block_bytes]; // 128 rows of 256 values
        let m = load(&p).expect("the tensor loads");
        assert_eq!(cuda_unsupported(&m), None, "{ty}");
    }
    // Without CUDA compiled in (or without a GPU) the default device is the CPU either way.
    if !edge_engine::backend::cuda::COMPILED {
        assert_eq!(
            edge_engine::backend::device_for(&m),
            edge_engine::device::Device::Cpu
        );
    }
}
