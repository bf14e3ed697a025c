//! Writes a random-weight Llama GGUF with Q4_0 matrices (default: TinyLlama-1.1B's shape), for
//! speed benchmarks on a machine without Python's `gguf` package or llama-quantize (the GPU run
//! of scripts/gpu-run.sh). The tokenizer metadata is copied from a donor GGUF so that prompts
//! tokenize; the output text is meaningless, the memory traffic is a real 1.1B model's.
//!
//!   synth_model DONOR.gguf OUT.gguf [LAYERS] [HIDDEN] [FFN] [HEADS] [KV_HEADS]

use edge_engine::gguf::GgmlType;
use edge_engine::gguf::{Gguf, GgufWriter};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: synth_model DONOR.gguf OUT.gguf [LAYERS HIDDEN FFN HEADS KV_HEADS]");
        std::process::exit(2);
    }
    let num = |i: usize, d: u64| args.get(i).map_or(d, |s| s.parse().expect("a number"));
    let (layers, hidden, ffn, heads, kv_heads) = (
        num(3, 22),
        num(4, 2048),
        num(5, 5632),
        num(6, 32),
        num(7, 4),
    );
    let donor = Gguf::open(&args[1]).expect("donor GGUF");
    let n_vocab = donor
        .get_str_array("tokenizer.ggml.tokens")
        .expect("donor has tokenizer.ggml.tokens")
        .len() as u64;
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_str("general.name", "synthetic-llama-q4_0");
    for (k, v) in [
        ("block_count", layers),
        ("context_length", 4096),
        ("embedding_length", hidden),
        ("feed_forward_length", ffn),
        ("attention.head_count", heads),
        ("attention.head_count_kv", kv_heads),
        ("rope.dimension_count", hidden / heads),
    ] {
        w.add_u32(&format!("llama.{k}"), v as u32);
    }
    w.add_f32("llama.rope.freq_base", 10000.0)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    for (k, v) in donor.metadata() {
        if k.starts_with("tokenizer.") {
            w.add(k, v.clone());
        }
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Q4_0 blocks: a small random f16 scale and random nibbles (what quantizing N(0, 0.02)
    // weights gives, statistically; exact values do not matter for speed).
    let mut q4 = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64| {
        let nb = cols / 32 * rows;
        let mut data = Vec::with_capacity(nb as usize * 18);
        for _ in 0..nb {
            let r = next();
            let d = half::f16::from_f32(0.002 + (r >> 40) as f32 / (1u64 << 24) as f32 * 0.004);
            data.extend_from_slice(&d.to_bits().to_le_bytes());
            let a = next().to_le_bytes();
            let b = next().to_le_bytes();
            data.extend_from_slice(&a);
            data.extend_from_slice(&b);
        }
        w.add_tensor(name, &[cols, rows], GgmlType::Q4_0, data);
    };
    let ones = |n: u64| {
        (0..n)
            .flat_map(|_| 1.0f32.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let head_dim = hidden / heads;
    let kv_dim = head_dim * kv_heads;
    q4(&mut w, "token_embd.weight", hidden, n_vocab);
    for l in 0..layers {
        w.add_tensor(
            &format!("blk.{l}.attn_norm.weight"),
            &[hidden],
            GgmlType::F32,
            ones(hidden),
        );
        q4(&mut w, &format!("blk.{l}.attn_q.weight"), hidden, hidden);
        q4(&mut w, &format!("blk.{l}.attn_k.weight"), hidden, kv_dim);
        q4(&mut w, &format!("blk.{l}.attn_v.weight"), hidden, kv_dim);
        q4(
            &mut w,
            &format!("blk.{l}.attn_output.weight"),
            hidden,
            hidden,
        );
        w.add_tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[hidden],
            GgmlType::F32,
            ones(hidden),
        );
        q4(&mut w, &format!("blk.{l}.ffn_gate.weight"), hidden, ffn);
        q4(&mut w, &format!("blk.{l}.ffn_up.weight"), hidden, ffn);
        q4(&mut w, &format!("blk.{l}.ffn_down.weight"), ffn, hidden);
    }
    w.add_tensor("output_norm.weight", &[hidden], GgmlType::F32, ones(hidden));
    q4(&mut w, "output.weight", hidden, n_vocab);
    let bytes = w.to_bytes();
    std::fs::write(&args[2], &bytes).expect("writing the model");
    eprintln!(
        "{}: {layers} layers x {hidden} hidden, ffn {ffn}, {heads}/{kv_heads} heads, vocab {n_vocab}: {:.1} MiB",
        args[2],
        bytes.len() as f64 / 1048576.0
    );
}
