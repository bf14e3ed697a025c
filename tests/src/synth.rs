//! Deterministic random-weight decoder models of every supported architecture, written as GGUF
//! with [`edge_engine::gguf::GgufWriter`], for comparing edge-run with llama.cpp on the very same
//! bytes (`make-arch-model ARCH OUT.gguf` writes one for `shared/peer/llama-ref.py`; the tests
//! build them in memory and check the SHA-256 recorded with the reference data).
//!
//! Small shapes (width 128, 3 to 6 layers, GQA), f16 matrices and f32 vectors, weights drawn
//! from a fixed-seed generator with scales that give logits clear top-1 margins; the tokenizer
//! metadata is copied from a donor GGUF (SmolLM2), so prompts tokenize normally. Each model
//! switches on its architecture's features: Qwen2 q/k/v biases; Qwen3 q/k norms and a head size
//! other than width / heads; Llama 3 rope frequency factors; Phi-3 fused qkv and gate+up and
//! partial rotary; Gemma 2 post-norms, soft-capping (a small attention cap, so that it matters)
//! and alternating 8-token sliding windows; Gemma 3 q/k norms, five local layers to one global
//! one with their own rope base, and linear rope scaling on the global layer.

use edge_engine::gguf::GgmlType;
use edge_engine::gguf::{Gguf, GgufWriter};

/// The models [`make_arch_model`] builds, by name (`llama3` is the `llama` architecture with
/// Llama 3's rope frequency factors).
pub const ARCH_MODELS: [&str; 6] = ["qwen2", "qwen3", "llama3", "phi3", "gemma2", "gemma3"];

/// Sliding window of the Gemma models: shorter than the reference prompts.
pub const WINDOW: u32 = 8;

/// A SplitMix64 generator: deterministic on every platform.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// Shapes and features of one synthetic model.
struct Spec {
    arch: &'static str,
    n_embd: u64,
    n_layer: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    n_ff: u64,
    n_rot: u64,
    tied_output: bool,
}

fn spec(name: &str) -> Option<Spec> {
    let base = |arch| Spec {
        arch,
        n_embd: 128,
        n_layer: 3,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 256,
        n_rot: 32,
        tied_output: true,
    };
    Some(match name {
        "qwen2" => Spec {
            tied_output: false,
            ..base("qwen2")
        },
        "qwen3" => Spec {
            head_dim: 64,
            n_rot: 64,
            tied_output: false,
            ..base("qwen3")
        },
        "llama3" => Spec {
            tied_output: false,
            ..base("llama")
        },
        "phi3" => Spec {
            n_rot: 16,
            tied_output: false,
            ..base("phi3")
        },
        "gemma2" => Spec {
            n_layer: 4,
            ..base("gemma2")
        },
        "gemma3" => Spec {
            n_layer: 6,
            tied_output: false,
            ..base("gemma3")
        },
        _ => return None,
    })
}

/// Builds the GGUF bytes of synthetic model `name` (one of [`ARCH_MODELS`]), with the tokenizer
/// metadata of `donor`.
pub fn make_arch_model(name: &str, donor: &Gguf) -> Result<Vec<u8>, String> {
    let s = spec(name).ok_or_else(|| {
        format!(
            "unknown synthetic model '{name}'; use one of {}",
            ARCH_MODELS.join(", ")
        )
    })?;
    let n_vocab = donor
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or("the donor GGUF has no tokenizer.ggml.tokens")?
        .len() as u64;
    let a = s.arch;
    let mut w = GgufWriter::new();
    // No architecture in the name: llama.cpp changes token attributes for names containing
    // "phi3" (and fails on a vocabulary without Phi-3's tokens).
    w.add_str("general.architecture", a)
        .add_str("general.name", "synthetic random-weight model");
    let k = |key: &str| format!("{a}.{key}");
    for (key, v) in [
        ("block_count", s.n_layer),
        ("context_length", 4096),
        ("embedding_length", s.n_embd),
        ("feed_forward_length", s.n_ff),
        ("attention.head_count", s.n_head),
        ("attention.head_count_kv", s.n_head_kv),
        ("attention.key_length", s.head_dim),
        ("attention.value_length", s.head_dim),
        ("rope.dimension_count", s.n_rot),
    ] {
        w.add_u32(&k(key), v as u32);
    }
    w.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
    match name {
        "llama3" => {
            w.add_f32(&k("rope.freq_base"), 500_000.0);
        }
        "gemma2" => {
            w.add_f32(&k("rope.freq_base"), 10_000.0)
                .add_u32(&k("attention.sliding_window"), WINDOW)
                .add_f32(&k("attn_logit_softcapping"), 4.0)
                .add_f32(&k("final_logit_softcapping"), 30.0);
        }
        "gemma3" => {
            w.add_f32(&k("rope.freq_base"), 1_000_000.0)
                .add_u32(&k("attention.sliding_window"), WINDOW)
                .add_str(&k("rope.scaling.type"), "linear")
                .add_f32(&k("rope.scaling.factor"), 8.0);
        }
        _ => {
            w.add_f32(&k("rope.freq_base"), 10_000.0);
        }
    }
    for (key, v) in donor.metadata() {
        if key.starts_with("tokenizer.") {
            w.add(key, v.clone());
        }
    }
    let mut rng = Rng(0x5eed_0000 + name.bytes().map(u64::from).sum::<u64>());
    let (d, hd, ff) = (s.n_embd, s.head_dim, s.n_ff);
    let q_dim = s.n_head * hd;
    let kv_dim = s.n_head_kv * hd;
    // Matrices: f16, std 1/sqrt(inputs) so that activations keep unit scale; the embedding
    // (also the tied output head) std 0.5, which spreads the logits by several units.
    let mut mat = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64, std: f32| {
        let data: Vec<u8> = (0..cols * rows)
            .flat_map(|_| half::f16::from_f32(rng.normal() * std).to_le_bytes())
            .collect();
        w.add_tensor(name, &[cols, rows], GgmlType::F16, data);
    };
    let mut vecs = Rng(rng_seed_for_vectors(name));
    let mut vector = |w: &mut GgufWriter, name: &str, n: u64, mean: f32, std: f32| {
        let data: Vec<u8> = (0..n)
            .flat_map(|_| (mean + vecs.normal() * std).to_le_bytes())
            .collect();
        w.add_tensor(name, &[n], GgmlType::F32, data);
    };
    let inv = |n: u64| 1.0 / (n as f32).sqrt();
    mat(&mut w, "token_embd.weight", d, n_vocab, 0.5);
    if !s.tied_output {
        mat(&mut w, "output.weight", d, n_vocab, 0.5);
    }
    vector(&mut w, "output_norm.weight", d, 1.0, 0.1);
    if name == "llama3" {
        // Llama 3's factors run from 1 (high frequencies) to 8 (low ones); random here.
        let mut f = Rng(7);
        let data: Vec<u8> = (0..s.n_rot / 2)
            .flat_map(|_| (1.0 + 7.0 * f.uniform() as f32).to_le_bytes())
            .collect();
        w.add_tensor("rope_freqs.weight", &[s.n_rot / 2], GgmlType::F32, data);
    }
    let gemma = a.starts_with("gemma");
    // The blocks' outputs outweigh the embedding in the residual stream (larger output
    // projections; on Gemma, whose embeddings are scaled by sqrt(n_embd), larger post-norm
    // weights): otherwise a tied output head mostly predicts the input token again, and greedy
    // decoding repeats one token. Only Gemma 2 (which llama.cpp always ties) keeps it tied.
    let out_gain = 3.0;
    let post_norm = 8.0;
    for l in 0..s.n_layer {
        let p = |t: &str| format!("blk.{l}.{t}");
        vector(&mut w, &p("attn_norm.weight"), d, 1.0, 0.1);
        if a == "phi3" {
            mat(&mut w, &p("attn_qkv.weight"), d, q_dim + 2 * kv_dim, inv(d));
        } else {
            mat(&mut w, &p("attn_q.weight"), d, q_dim, inv(d));
            mat(&mut w, &p("attn_k.weight"), d, kv_dim, inv(d));
            mat(&mut w, &p("attn_v.weight"), d, kv_dim, inv(d));
        }
        if a == "qwen2" {
            vector(&mut w, &p("attn_q.bias"), q_dim, 0.0, 0.5);
            vector(&mut w, &p("attn_k.bias"), kv_dim, 0.0, 0.5);
            vector(&mut w, &p("attn_v.bias"), kv_dim, 0.0, 0.5);
        }
        if a == "qwen3" || a == "gemma3" {
            vector(&mut w, &p("attn_q_norm.weight"), hd, 1.0, 0.2);
            vector(&mut w, &p("attn_k_norm.weight"), hd, 1.0, 0.2);
        }
        mat(
            &mut w,
            &p("attn_output.weight"),
            q_dim,
            d,
            out_gain * inv(q_dim),
        );
        if gemma {
            vector(&mut w, &p("post_attention_norm.weight"), d, post_norm, 0.5);
        }
        vector(&mut w, &p("ffn_norm.weight"), d, 1.0, 0.1);
        if a == "phi3" {
            mat(&mut w, &p("ffn_up.weight"), d, 2 * ff, inv(d));
        } else {
            mat(&mut w, &p("ffn_gate.weight"), d, ff, inv(d));
            mat(&mut w, &p("ffn_up.weight"), d, ff, inv(d));
        }
        mat(&mut w, &p("ffn_down.weight"), ff, d, out_gain * inv(ff));
        if gemma {
            vector(&mut w, &p("post_ffw_norm.weight"), d, post_norm, 0.5);
        }
    }
    Ok(w.to_bytes())
}

fn rng_seed_for_vectors(name: &str) -> u64 {
    0xb1a5_0000 + name.len() as u64
}

/// SHA-256 of `data` as lowercase hex (FIPS 180-4), to tie a generated model to the reference
/// data made from it.
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for (a, b) in h.iter_mut().zip(v) {
            *a = a.wrapping_add(b);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_strings() {
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
