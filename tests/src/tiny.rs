//! A tiny synthetic Llama model to break one piece at a time: a byte-level BPE vocabulary,
//! f32 embedding and norms, q8_0 projections, all written with `GgufWriter` from [`Parts`]
//! (metadata and tensors a test edits before writing), and a temp dir to write it to. The
//! library's error tests (`model_errors.rs`, `hostile_input.rs`) and the CLI's robustness tests
//! build their bad files from it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use edge_engine::gguf::GgmlType;
use edge_engine::gguf::{GgufWriter, MetaValue};

/// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest to U+0100...
pub fn byte_to_unicode() -> Vec<char> {
    let mut map = vec!['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    map
}

/// A small byte-level BPE vocabulary: the 256 byte symbols, a few merges, `<|endoftext|>`.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub eos: u32,
}

pub fn vocab() -> Vocab {
    let mut tokens: Vec<String> = byte_to_unicode().into_iter().map(String::from).collect();
    let mut types = vec![1; 256];
    let merges: Vec<String> = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at", "i s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<|endoftext|>".into());
    types.push(3);
    let eos = tokens.len() as u32 - 1;
    Vocab {
        tokens,
        types,
        merges,
        eos,
    }
}

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

pub fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// Random q8_0 data for `n` elements (n a multiple of 32): scale 2^-10 (exact in f16, bits
/// 0x1400), quants in [-100, 100], so values lie in about [-0.1, 0.1].
pub fn q8_0_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    assert_eq!(n % 32, 0);
    let mut out = Vec::with_capacity(n / 32 * 34);
    for _ in 0..n / 32 {
        out.extend_from_slice(&0x1400u16.to_le_bytes());
        for _ in 0..32 {
            out.push(((rng.next_u64() % 201) as i32 - 100) as i8 as u8);
        }
    }
    out
}

/// Hyper-parameters of the synthetic model.
#[derive(Clone, Copy)]
pub struct Dims {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
}

pub const DIMS: Dims = Dims {
    n_layer: 2,
    n_embd: 64,
    n_head: 4,
    n_head_kv: 2,
    n_ff: 128,
    n_ctx_train: 64,
};

pub struct T {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// A model's metadata and tensors, to be changed by a test before writing.
pub struct Parts {
    pub meta: Vec<(String, MetaValue)>,
    pub tensors: Vec<T>,
}

impl Parts {
    /// A complete, valid Llama model: f32 embedding table (tied output head) and norms, q8_0
    /// projections.
    pub fn llama(d: Dims) -> Parts {
        let v = vocab();
        let n_vocab = v.tokens.len();
        let mut meta: Vec<(String, MetaValue)> = Vec::new();
        let mut kv = |k: &str, val: MetaValue| meta.push((k.to_string(), val));
        let u = |x: usize| MetaValue::U32(x as u32);
        kv("general.architecture", MetaValue::String("llama".into()));
        kv("general.name", MetaValue::String("tiny-test-llama".into()));
        kv("llama.block_count", u(d.n_layer));
        kv("llama.context_length", u(d.n_ctx_train));
        kv("llama.embedding_length", u(d.n_embd));
        kv("llama.feed_forward_length", u(d.n_ff));
        kv("llama.attention.head_count", u(d.n_head));
        kv("llama.attention.head_count_kv", u(d.n_head_kv));
        kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        );
        kv("llama.rope.freq_base", MetaValue::F32(10000.0));
        kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
        kv("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()));
        let strings = |xs: &[String]| {
            MetaValue::Array(xs.iter().map(|s| MetaValue::String(s.clone())).collect())
        };
        kv("tokenizer.ggml.tokens", strings(&v.tokens));
        kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array(v.types.iter().map(|&t| MetaValue::I32(t)).collect()),
        );
        kv("tokenizer.ggml.merges", strings(&v.merges));
        kv("tokenizer.ggml.bos_token_id", MetaValue::U32(v.eos));
        kv("tokenizer.ggml.eos_token_id", MetaValue::U32(v.eos));

        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (e, ff) = (d.n_embd as u64, d.n_ff as u64);
        let head_dim = d.n_embd / d.n_head;
        let q = (d.n_head * head_dim) as u64;
        let kvd = (d.n_head_kv * head_dim) as u64;
        let mut tensors = Vec::new();
        let embd: Vec<f32> = (0..d.n_embd * n_vocab).map(|_| 0.5 * rng.unit()).collect();
        tensors.push(T {
            name: "token_embd.weight".into(),
            dims: vec![e, n_vocab as u64],
            ty: GgmlType::F32,
            data: f32_bytes(embd),
        });
        for l in 0..d.n_layer {
            let norm = |name: &str| T {
                name: format!("blk.{l}.{name}.weight"),
                dims: vec![e],
                ty: GgmlType::F32,
                data: f32_bytes(std::iter::repeat_n(1.0, d.n_embd)),
            };
            tensors.push(norm("attn_norm"));
            for (name, dims) in [
                ("attn_q", [e, q]),
                ("attn_k", [e, kvd]),
                ("attn_v", [e, kvd]),
                ("attn_output", [q, e]),
            ] {
                tensors.push(T {
                    name: format!("blk.{l}.{name}.weight"),
                    dims: dims.to_vec(),
                    ty: GgmlType::Q8_0,
                    data: q8_0_bytes(&mut rng, (dims[0] * dims[1]) as usize),
                });
            }
            tensors.push(norm("ffn_norm"));
            for (name, dims) in [
                ("ffn_gate", [e, ff]),
                ("ffn_up", [e, ff]),
                ("ffn_down", [ff, e]),
            ] {
                tensors.push(T {
                    name: format!("blk.{l}.{name}.weight"),
                    dims: dims.to_vec(),
                    ty: GgmlType::Q8_0,
                    data: q8_0_bytes(&mut rng, (dims[0] * dims[1]) as usize),
                });
            }
        }
        tensors.push(T {
            name: "output_norm.weight".into(),
            dims: vec![e],
            ty: GgmlType::F32,
            data: f32_bytes(std::iter::repeat_n(1.0, d.n_embd)),
        });
        Parts { meta, tensors }
    }

    pub fn set(&mut self, key: &str, value: MetaValue) -> &mut Self {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.meta.push((key.to_string(), value)),
        }
        self
    }

    pub fn remove(&mut self, key: &str) -> &mut Self {
        let before = self.meta.len();
        self.meta.retain(|(k, _)| k != key);
        assert_eq!(self.meta.len(), before - 1, "no key {key}");
        self
    }

    pub fn tensor(&mut self, name: &str) -> &mut T {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_eq!(self.tensors.len(), before - 1, "no tensor {name}");
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.writer().to_bytes()
    }

    /// A writer holding the model, for defects below the metadata level.
    pub fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in &self.meta {
            w.add(k, v.clone());
        }
        for t in &self.tensors {
            w.add_tensor(&t.name, &t.dims, t.ty, t.data.clone());
        }
        w
    }
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory; `tag` goes into its name.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "edge-run-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
