use super::*;
use crate::format::value_type;

/// Every scalar type, a string, flat arrays and nested arrays.
fn all_values() -> Vec<(&'static str, MetaValue)> {
    use MetaValue::*;
    vec![
        ("t.u8", U8(200)),
        ("t.i8", I8(-100)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f32", F32(1.5e-5)),
        ("t.f64", F64(-2.25e100)),
        ("t.bool_t", Bool(true)),
        ("t.bool_f", Bool(false)),
        ("t.string", String("héllo ✓ <|im_start|>".into())),
        ("t.empty_string", String(std::string::String::new())),
        (
            "t.str_array",
            Array(vec![
                String("a".into()),
                String("Ġb".into()),
                String("".into()),
            ]),
        ),
        ("t.i32_array", Array(vec![I32(1), I32(-2), I32(3)])),
        ("t.f32_array", Array(vec![F32(0.5), F32(-1.0)])),
        ("t.u8_array", Array(vec![U8(1), U8(2)])),
        ("t.bool_array", Array(vec![Bool(true), Bool(false)])),
        ("t.empty_array", Array(vec![])),
        (
            "t.nested",
            Array(vec![
                Array(vec![U64(1), U64(2)]),
                Array(vec![U64(3)]),
                Array(vec![]),
            ]),
        ),
        (
            "t.nested3",
            Array(vec![Array(vec![Array(vec![String("deep".into())])])]),
        ),
    ]
}

fn err(bytes: Vec<u8>) -> GgufError {
    match Gguf::from_bytes(bytes) {
        Ok(g) => panic!("expected an error, opened {g:?}"),
        Err(e) => {
            // Every error renders to a one-line message.
            let msg = e.to_string();
            assert!(!msg.is_empty() && !msg.contains('\n'), "{msg}");
            e
        }
    }
}

/// A small valid file with metadata and two tensors; ends exactly at the end of tensor data.
fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_u32("llama.block_count", 2)
        .add_str_array("tokenizer.ggml.tokens", &["a", "b"])
        .add(
            "t.nested",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I8(1)])]),
        )
        .add_tensor("w", &[4, 2], GgmlType::F32, vec![1; 32])
        .add_tensor("q", &[32], GgmlType::Q8_0, vec![2; 34]);
    w.to_bytes()
}

#[test]
fn round_trips_every_value_type_v2_and_v3() {
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version(version);
        for (k, v) in all_values() {
            w.add(k, v);
        }
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), DEFAULT_ALIGNMENT);
        assert!(g.tensors().is_empty());
        let expected: Vec<(String, MetaValue)> = all_values()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(g.metadata(), &expected[..]);
        for (k, v) in &expected {
            assert_eq!(g.get(k), Some(v), "{k}");
        }
        assert_eq!(g.get("missing"), None);
    }
}

#[test]
fn typed_getters() {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add(k, v);
    }
    w.add("t.neg", MetaValue::I64(-1));
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.get_u32("t.u8"), Some(200));
    assert_eq!(g.get_u32("t.u32"), Some(4_000_000_000));
    assert_eq!(g.get_u32("t.u64"), None); // does not fit
    assert_eq!(g.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(g.get_u32("t.neg"), None);
    assert_eq!(g.get_u64("t.i8"), None);
    assert_eq!(g.get_u32("t.string"), None);
    assert_eq!(g.get_f32("t.f32"), Some(1.5e-5));
    assert_eq!(g.get_f32("t.f64"), Some(f32::NEG_INFINITY)); // f64 out of f32 range
    assert_eq!(g.get_f32("t.u16"), Some(60000.0));
    assert_eq!(g.get_bool("t.bool_t"), Some(true));
    assert_eq!(g.get_bool("t.u8"), None);
    assert_eq!(g.get_str("t.string"), Some("héllo ✓ <|im_start|>"));
    assert_eq!(g.get_str("t.u8"), None);
    assert_eq!(g.get_str_array("t.str_array"), Some(vec!["a", "Ġb", ""]));
    assert_eq!(g.get_str_array("t.i32_array"), None);
    assert_eq!(g.get_str_array("t.empty_array"), Some(vec![]));
    assert_eq!(g.get_i32_array("t.i32_array"), Some(vec![1, -2, 3]));
    assert_eq!(g.get_i32_array("t.u8_array"), Some(vec![1, 2]));
    assert_eq!(g.get_i32_array("t.f32_array"), None);
    assert_eq!(g.get_f32_array("t.f32_array"), Some(vec![0.5, -1.0]));
    assert_eq!(g.get_f32_array("t.i32_array"), Some(vec![1.0, -2.0, 3.0]));
    assert_eq!(g.get_f32_array("t.nested"), None);
}

#[test]
fn display_is_short() {
    let v = MetaValue::Array((0..100).map(MetaValue::I32).collect());
    assert_eq!(v.to_string(), "[i32; 100] [0, 1, 2, 3, 4, ...]");
    assert_eq!(v.type_name(), "array");
    assert_eq!(MetaValue::String("x\"y".into()).to_string(), r#""x\"y""#);
    let long = MetaValue::String("a".repeat(1000));
    assert!(long.to_string().len() < 80);
    assert_eq!(MetaValue::Array(vec![]).to_string(), "[?; 0] []");
    assert_eq!(MetaValue::F32(0.5).to_string(), "0.5");
    for (_, v) in all_values() {
        assert!(!v.to_string().contains('\n'));
    }
}

#[test]
fn tensors_round_trip_with_alignment() {
    for align in [1u32, 8, 32, 64, 4096] {
        let f32_data: Vec<u8> = (0..24u8).collect();
        let q41: Vec<u8> = (0..40).map(|i| i as u8 ^ 0x5a).collect();
        let q4k = vec![7u8; 66]; // one iq2_xxs block: an unsupported type still opens
        let mut w = GgufWriter::new();
        w.alignment(align)
            .add_str("general.architecture", "test")
            .add_tensor("a", &[3, 2], GgmlType::F32, f32_data.clone())
            .add_tensor("b.q4_1", &[32, 2, 1, 1], GgmlType::Q4_1, q41.clone())
            .add_tensor("c", &[256], GgmlType::Unsupported(16), q4k.clone())
            .add_tensor("d", &[5], GgmlType::F16, vec![9; 10]);
        let bytes = w.to_bytes();
        let len = bytes.len() as u64;
        let g = Gguf::from_bytes(bytes).unwrap();
        assert_eq!(g.alignment(), u64::from(align));
        assert_eq!(g.data_offset() % u64::from(align), 0);
        assert_eq!(g.file_size(), len);
        assert_eq!(g.tensors().len(), 4);
        let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b.q4_1", "c", "d"]);

        let a = g.tensor("a").unwrap();
        assert_eq!(a.dims, [3, 2]);
        assert_eq!(a.ggml_type, GgmlType::F32);
        assert_eq!((a.n_elements, a.n_bytes), (6, 24));
        assert_eq!(a.offset, g.data_offset());
        assert_eq!(g.tensor_data(a), &f32_data[..]);

        let b = g.tensor("b.q4_1").unwrap();
        assert_eq!(b.ggml_type, GgmlType::Q4_1);
        assert_eq!((b.n_elements, b.n_bytes), (64, 40));
        assert_eq!(g.tensor_data(b), &q41[..]);
        assert_eq!(b.offset % u64::from(align), 0);

        let c = g.tensor("c").unwrap();
        assert_eq!(c.ggml_type, GgmlType::Unsupported(16));
        assert!(!c.ggml_type.is_supported());
        assert_eq!(g.tensor_data(c), &q4k[..]);

        assert_eq!(g.tensor_data(g.tensor("d").unwrap()), &[9; 10]);
        assert!(g.tensor("e").is_none());
    }
}

#[test]
fn tensor_data_of_foreign_info_is_empty() {
    let g = Gguf::from_bytes(small_file()).unwrap();
    let mut t = g.tensor("w").unwrap().clone();
    t.offset = u64::MAX - 1;
    assert!(g.tensor_data(&t).is_empty());
    t.offset = 0;
    t.n_bytes = u64::MAX;
    assert!(g.tensor_data(&t).is_empty());
}

#[test]
fn empty_file_without_tensors() {
    let g = Gguf::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert_eq!(g.file_size(), 24);
    assert_eq!(g.data_offset(), 32); // past the end; fine with no tensors
    assert!(g.metadata().is_empty());
}

#[test]
fn open_file_from_disk_and_missing_path() {
    let path = std::env::temp_dir().join(format!("edge-gguf-test-{}.gguf", std::process::id()));
    std::fs::write(&path, small_file()).unwrap();
    let g = Gguf::open(&path);
    std::fs::remove_file(&path).ok();
    let g = g.unwrap();
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.tensor_data(g.tensor("q").unwrap()), &[2; 34]);

    let missing = std::env::temp_dir().join("edge-gguf-definitely-missing.gguf");
    let e = Gguf::open(&missing).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    assert!(
        e.to_string().contains("edge-gguf-definitely-missing.gguf"),
        "{e}"
    );

    let empty = std::env::temp_dir().join(format!("edge-gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let e = Gguf::open(&empty);
    std::fs::remove_file(&empty).ok();
    assert!(matches!(e, Err(GgufError::BadMagic { .. })));
}

#[test]
fn reference_tokenizer_files_open() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/tokenizer");
    let dir = if dir.exists() {
        dir
    } else {
        std::path::PathBuf::from("/work/shared/reference/tokenizer")
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "skipping: no reference tokenizer directory at {}",
            dir.display()
        );
        return;
    };
    // (file, general.architecture, tokenizer.ggml.model, vocab size)
    let known = [
        ("ggml-vocab-bert-bge.gguf", "bert", "bert", 30522),
        ("ggml-vocab-deepseek-llm.gguf", "llama", "gpt2", 102400),
        ("ggml-vocab-falcon.gguf", "falcon", "gpt2", 65024),
        ("ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", 50257),
        ("ggml-vocab-llama-bpe.gguf", "llama", "gpt2", 128256),
        ("ggml-vocab-llama-spm.gguf", "llama", "llama", 32000),
        ("ggml-vocab-phi-3.gguf", "phi3", "llama", 32064),
        ("ggml-vocab-qwen2.gguf", "qwen2", "gpt2", 151936),
        ("ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", 49152),
    ];
    let mut opened = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            continue;
        }
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(g.version(), 3);
        let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
        let file = path.file_name().unwrap().to_str().unwrap();
        if let Some(&(_, arch, model, n)) = known.iter().find(|k| k.0 == file) {
            assert_eq!(g.get_str("general.architecture"), Some(arch), "{file}");
            assert_eq!(g.get_str("tokenizer.ggml.model"), Some(model), "{file}");
            assert_eq!(tokens.len(), n, "{file}");
        }
        opened += 1;
    }
    assert!(
        opened >= known.len(),
        "only {opened} reference files found in {}",
        dir.display()
    );
}

#[test]
fn smollm2_model_opens() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: model file {} is missing", path.display());
        return;
    }
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count"), Some(30));
    assert_eq!(g.get_u32("llama.embedding_length"), Some(576));
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(g.tensors().len(), 272);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    assert_eq!(emb.dims, [576, 49152]);
    assert_eq!(emb.n_bytes, 576 / 32 * 34 * 49152);
    assert_eq!(g.tensor_data(emb).len() as u64, emb.n_bytes);
    let down = g.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        (down.ggml_type, &down.dims[..]),
        (GgmlType::Q4_1, &[1536, 576][..])
    );
    let norm = g.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!(
        (norm.ggml_type, &norm.dims[..]),
        (GgmlType::F32, &[576][..])
    );
    for t in g.tensors() {
        assert_eq!((t.offset - g.data_offset()) % g.alignment(), 0);
        assert!(t.offset + t.n_bytes <= g.file_size());
    }
}

#[test]
fn truncated_at_every_byte_errors() {
    let full = small_file();
    Gguf::from_bytes(full.clone()).unwrap();
    for len in 0..full.len() {
        let r = Gguf::from_bytes(full[..len].to_vec());
        assert!(r.is_err(), "truncated to {len} bytes still opened");
    }
}

#[test]
fn single_byte_corruptions_never_panic() {
    let full = small_file();
    for i in 0..full.len() {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut b = full.clone();
            b[i] = v;
            let _ = Gguf::from_bytes(b);
        }
    }
}

#[test]
fn bad_magic() {
    let mut w = GgufWriter::new();
    w.magic(*b"GGML");
    assert!(matches!(err(w.to_bytes()), GgufError::BadMagic { found } if found == b"GGML"));
    assert!(matches!(err(b"GG".to_vec()), GgufError::BadMagic { .. }));
    assert!(matches!(err(vec![]), GgufError::BadMagic { .. }));
}

#[test]
fn rejected_versions() {
    for v in [0, 1, 4, 99] {
        let mut w = GgufWriter::new();
        w.version(v);
        let e = err(w.to_bytes());
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version } if version == v),
            "{e}"
        );
        if v == 1 {
            assert!(e.to_string().contains("v1"), "{e}");
        }
    }
    // Version field cut short.
    assert!(matches!(
        err(b"GGUF\x03\x00".to_vec()),
        GgufError::Truncated { .. }
    ));
}

#[test]
fn absurd_counts() {
    for count in [u64::MAX, 1 << 40, 1000] {
        let mut w = GgufWriter::new();
        w.tensor_count(count);
        let e = err(w.to_bytes());
        assert!(
            matches!(e, GgufError::CountTooLarge { count: c, offset: 8, .. } if c == count),
            "{e}"
        );

        let mut w = GgufWriter::new();
        w.kv_count(count);
        let e = err(w.to_bytes());
        assert!(
            matches!(e, GgufError::CountTooLarge { count: c, offset: 16, .. } if c == count),
            "{e}"
        );
    }
    // More pairs claimed than present, but plausible for the size: runs off the end.
    let mut w = GgufWriter::new();
    w.add_str("a", "a long enough value")
        .add_str("b", "a long enough value")
        .kv_count(3);
    assert!(matches!(err(w.to_bytes()), GgufError::Truncated { .. }));
}

#[test]
fn absurd_lengths() {
    // String value length.
    let mut w = GgufWriter::new();
    let mut v = u64::MAX.to_le_bytes().to_vec();
    v.extend_from_slice(b"abc");
    w.add_raw_kv(b"k.s", value_type::STRING, &v);
    let e = err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::CountTooLarge { what, count: u64::MAX, .. } if what.contains("k.s")),
        "{e}"
    );

    // Key length.
    let mut b = GgufWriter::new().kv_count(1).to_bytes();
    b.extend_from_slice(&(1u64 << 50).to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert!(matches!(err(b), GgufError::CountTooLarge { .. }));

    // Array length, for each element size.
    for (elem, min) in [
        (value_type::U8, 1u64),
        (value_type::U64, 8),
        (value_type::STRING, 8),
        (value_type::ARRAY, 12),
    ] {
        let mut v = elem.to_le_bytes().to_vec();
        let len = 100u64;
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&vec![0; (len * min - 1) as usize]);
        let mut w = GgufWriter::new();
        w.add_raw_kv(b"k.arr", value_type::ARRAY, &v);
        let e = err(w.to_bytes());
        assert!(
            matches!(&e, GgufError::CountTooLarge { count: 100, what, .. } if what.contains("k.arr")),
            "{e}"
        );
    }
    let mut v = value_type::U32.to_le_bytes().to_vec();
    v.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"k.arr", value_type::ARRAY, &v);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::CountTooLarge {
            count: u64::MAX,
            ..
        }
    ));
}

#[test]
fn bad_value_types() {
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"k.bad", 13, &[0; 8]);
    let e = err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 13, offset: 37 } if key == "k.bad"),
        "{e}"
    );

    let mut v = 99u32.to_le_bytes().to_vec();
    v.extend_from_slice(&1u64.to_le_bytes());
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"k.arr", value_type::ARRAY, &v);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::UnknownValueType { type_id: 99, .. }
    ));

    let mut w = GgufWriter::new();
    w.add_raw_kv(b"k.bool", value_type::BOOL, &[2]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::InvalidBool { value: 2, .. }
    ));
}

#[test]
fn nesting_depth_is_capped() {
    let nest = |depth: usize| {
        let mut v = MetaValue::U8(1);
        for _ in 0..depth {
            v = MetaValue::Array(vec![v]);
        }
        v
    };
    let mut w = GgufWriter::new();
    w.add("ok", nest(MAX_ARRAY_DEPTH));
    let g = Gguf::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.get("ok"), Some(&nest(MAX_ARRAY_DEPTH)));

    let mut w = GgufWriter::new();
    w.add("deep", nest(MAX_ARRAY_DEPTH + 1));
    assert!(matches!(err(w.to_bytes()), GgufError::NestingTooDeep { key, .. } if key == "deep"));

    // A hostile file nesting far deeper (no stack overflow).
    let mut v = Vec::new();
    for _ in 0..100_000 {
        v.extend_from_slice(&value_type::ARRAY.to_le_bytes());
        v.extend_from_slice(&1u64.to_le_bytes());
    }
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"bomb", value_type::ARRAY, &v);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn invalid_utf8() {
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"bad\xffkey", value_type::U8, &[1]);
    let e = err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { offset: 32, .. }),
        "{e}"
    );

    let mut v = 2u64.to_le_bytes().to_vec();
    v.extend_from_slice(b"\xc3\x28");
    let mut w = GgufWriter::new();
    w.add_raw_kv(b"k.s", value_type::STRING, &v);
    assert!(
        matches!(err(w.to_bytes()), GgufError::InvalidUtf8 { what, .. } if what.contains("k.s"))
    );

    let mut w = GgufWriter::new();
    w.add_tensor_raw(b"t\x80", &[4], 0, None, vec![0; 16]);
    assert!(matches!(err(w.to_bytes()), GgufError::InvalidUtf8 { .. }));
}

#[test]
fn duplicates() {
    let mut w = GgufWriter::new();
    w.add_u32("a", 1).add_str("b", "x").add_u32("a", 2);
    let e = err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::DuplicateKey { key, .. } if key == "a"),
        "{e}"
    );

    let mut w = GgufWriter::new();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0; 16])
        .add_tensor("t", &[4], GgmlType::F32, vec![0; 16]);
    assert!(matches!(err(w.to_bytes()), GgufError::DuplicateTensor { name, .. } if name == "t"));
}

#[test]
fn bad_alignment() {
    for bad in [0u32, 3, 48, u32::MAX] {
        let mut w = GgufWriter::new();
        w.alignment(bad);
        let e = err(w.to_bytes());
        assert!(
            matches!(e, GgufError::BadAlignment { offset: 24, .. }),
            "{e}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_str(ALIGNMENT_KEY, "32");
    assert!(matches!(err(w.to_bytes()), GgufError::BadAlignment { .. }));
    let mut w = GgufWriter::new();
    w.add(ALIGNMENT_KEY, MetaValue::I32(-32));
    assert!(matches!(err(w.to_bytes()), GgufError::BadAlignment { .. }));
}

#[test]
fn bad_dims() {
    for n in [0usize, 5] {
        let mut w = GgufWriter::new();
        w.add_tensor("t", &vec![2; n], GgmlType::F32, vec![0; 128]);
        let e = err(w.to_bytes());
        assert!(
            matches!(&e, GgufError::BadDimCount { name, n_dims, offset: 24 } if name == "t" && *n_dims == n as u32),
            "{e}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[4, 0], GgmlType::F32, vec![]);
    assert!(matches!(err(w.to_bytes()), GgufError::ZeroDim { .. }));

    let mut w = GgufWriter::new();
    w.add_tensor("t", &[1 << 32, 1 << 32], GgmlType::F32, vec![0; 16]);
    assert!(matches!(err(w.to_bytes()), GgufError::DimsOverflow { .. }));
    // Elements fit in u64 but bytes do not.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[1 << 32, 1 << 31], GgmlType::F32, vec![0; 16]);
    assert!(matches!(err(w.to_bytes()), GgufError::DimsOverflow { .. }));
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[u64::MAX], GgmlType::F32, vec![0; 16]);
    assert!(matches!(err(w.to_bytes()), GgufError::DimsOverflow { .. }));
    // n_dims claims 4, file ends inside the dims.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[2, 2], GgmlType::F32, vec![]);
    let mut b = w.to_bytes();
    b.truncate(24 + 9 + 4 + 16);
    b[24 + 9] = 4;
    assert!(matches!(err(b), GgufError::Truncated { .. }));
}

#[test]
fn bad_tensor_types() {
    for id in [4u32, 5, 37, 1000, u32::MAX] {
        let mut w = GgufWriter::new();
        w.add_tensor_raw(b"t", &[32], id, None, vec![0; 64]);
        let e = err(w.to_bytes());
        assert!(
            matches!(&e, GgufError::UnknownTensorType { name, type_id, .. } if name == "t" && *type_id == id),
            "{e}"
        );
    }
    // A removed id that GgmlType knows of but has no layout for.
    let mut w = GgufWriter::new();
    w.add_tensor_raw(b"t", &[32], 31, None, vec![0; 64]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::TypeWithoutLayout { type_id: 31, .. }
    ));

    let mut w = GgufWriter::new();
    w.add_tensor("t", &[48, 2], GgmlType::Q4_1, vec![0; 80]);
    let e = err(w.to_bytes());
    assert!(
        matches!(
            e,
            GgufError::RowNotBlockMultiple {
                row: 48,
                block_size: 32,
                ..
            }
        ),
        "{e}"
    );
    // Unsupported types are checked against their own block size too.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[32], GgmlType::Unsupported(14), vec![0; 210]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::RowNotBlockMultiple {
            block_size: 256,
            ..
        }
    ));
}

#[test]
fn bad_tensor_offsets() {
    let mut w = GgufWriter::new();
    w.add_tensor_raw(b"t", &[4], 0, Some(4), vec![0; 64]);
    let e = err(w.to_bytes());
    assert!(
        matches!(&e, GgufError::MisalignedTensor { name, data_offset: 4, alignment: 32, .. } if name == "t"),
        "{e}"
    );

    // With alignment 1 any offset is aligned.
    let mut w = GgufWriter::new();
    w.alignment(1)
        .add_tensor_raw(b"t", &[4], 0, Some(3), vec![0; 19]);
    assert_eq!(
        Gguf::from_bytes(w.to_bytes()).unwrap().tensors()[0].n_bytes,
        16
    );

    // Past the end of the file.
    let mut w = GgufWriter::new();
    w.add_tensor_raw(b"t", &[4], 0, Some(32), vec![0; 16]);
    let e = err(w.to_bytes());
    assert!(matches!(e, GgufError::TensorOutOfRange { .. }), "{e}");
    // Data shorter than the tensor.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0; 15]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::TensorOutOfRange { .. }
    ));
    // Offset overflows when added to the data offset.
    let mut w = GgufWriter::new();
    w.add_tensor_raw(b"t", &[4], 0, Some(u64::MAX - 31), vec![0; 16]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::TensorOutOfRange {
            start: u64::MAX,
            ..
        }
    ));
    // A large but non-overflowing size.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[1 << 20, 1 << 20], GgmlType::F32, vec![0; 16]);
    assert!(matches!(
        err(w.to_bytes()),
        GgufError::TensorOutOfRange { .. }
    ));
}
