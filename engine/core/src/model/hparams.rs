//! A model's hyper-parameters, read from its `{arch}.*` metadata with llama.cpp's keys and
//! defaults, each architecture's conventions included (Gemma's sliding windows and
//! soft-capping, Phi-3's and Gemma's query scaling, NeoX rotary order).

use edge_gguf::Gguf;

use crate::error::{EngineError, Hint, Result, Setting};
use crate::graph::{Rope, RopeOrdering};
use crate::hint;

/// Hyper-parameters of a decoder-only transformer, read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct HyperParams {
    /// `general.architecture`.
    pub arch: String,
    /// Model width (`embedding_length`).
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when < n_head).
    pub n_head_kv: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Hidden size of the feed-forward block.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding table).
    pub n_vocab: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rotary embedding (of every layer, or of the global layers when some use a sliding window).
    pub rope: Rope,
    /// Rotary embedding of the sliding-window layers (Gemma 3 gives them their own base and no
    /// scaling); equal to `rope` when the model has none.
    pub rope_swa: Rope,
    /// Sliding-window size: a query at position p sees keys at p - window + 1 ..= p on the
    /// layers [`HyperParams::swa_layers`] marks (`{arch}.attention.sliding_window`).
    pub window: Option<usize>,
    /// Per layer: whether it attends over the sliding window only.
    pub swa_layers: Vec<bool>,
    /// Factor the token embeddings are multiplied by (Gemma: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
    /// Factor the rotated queries are multiplied by before attention, which then scales by 1
    /// (Phi-3 and Gemma do this instead of scaling the scores by 1/sqrt(head_dim)).
    pub query_scale: Option<f32>,
    /// Attention scores become `cap * tanh(score / cap)` before the softmax (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Gated feed-forward activation.
    pub ffn_act: FfnActivation,
}

/// The activation of the gated feed-forward block: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU (SwiGLU): Llama, Qwen, Phi-3.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    Gelu,
}

impl HyperParams {
    /// The rotary embedding of layer `l`.
    pub fn layer_rope(&self, l: usize) -> Rope {
        if self.is_swa(l) {
            self.rope_swa
        } else {
            self.rope
        }
    }

    /// Whether layer `l` attends over a sliding window.
    pub fn is_swa(&self, l: usize) -> bool {
        self.window.is_some() && self.swa_layers.get(l).copied().unwrap_or(false)
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        if self.is_swa(l) {
            self.window
        } else {
            None
        }
    }

    /// KV rows each layer needs for a context of `ctx` positions run `ubatch` tokens at a time:
    /// `ctx` for a global layer; for a sliding-window layer only the window plus one ubatch
    /// (a ring buffer: the oldest key a token of the ubatch still sees is `window - 1`
    /// positions before it), at most `ctx`.
    pub fn kv_layer_rows(&self, ctx: usize, ubatch: usize) -> Vec<usize> {
        (0..self.n_layer)
            .map(|l| match self.layer_window(l) {
                Some(w) => ctx.min(w.saturating_add(ubatch)),
                None => ctx,
            })
            .collect()
    }

    /// Why a context shift cannot run on this model, if it cannot: the shift re-rotates every
    /// cached key with one rotary embedding over a cache laid out by position.
    pub fn context_shift_unsupported(&self) -> Option<Hint> {
        if self.swa_layers.iter().any(|&s| s) && self.window.is_some() {
            Some(hint![
                format!(
                    "context shift is not supported for {} models with sliding-window layers; use a larger ",
                    self.arch
                ),
                Setting::Ctx
            ])
        } else {
            None
        }
    }

    /// Width of the key (and value) rows of one layer: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

fn meta_usize(g: &Gguf, key: &str) -> Result<usize> {
    match g.get_u64(key) {
        Some(v) if v > 0 && v <= (1 << 31) => Ok(v as usize),
        Some(v) => Err(EngineError::Metadata {
            key: key.into(),
            problem: format!("value {v} is out of range"),
        }),
        None => Err(EngineError::Metadata {
            key: key.into(),
            problem: "missing or not an integer".into(),
        }),
    }
}

/// A float that must be finite and positive (an epsilon, a rope base): `default` when the key
/// is absent, an error naming the key and the value otherwise. NaN or a negative epsilon would
/// make every logit NaN, and a run that "ends" at whatever token NaN comparisons pick.
pub(crate) fn finite_positive(g: &Gguf, key: &str, default: f32) -> Result<f32> {
    match g.get(key) {
        None => Ok(default),
        Some(v) => match v.as_f32() {
            Some(x) if x > 0.0 && x.is_finite() => Ok(x),
            Some(x) => Err(EngineError::Metadata {
                key: key.into(),
                problem: format!("{x} must be a finite positive number"),
            }),
            None => Err(EngineError::Metadata {
                key: key.into(),
                problem: "must be a number".into(),
            }),
        },
    }
}

pub(crate) fn read_hyper_params(g: &Gguf, arch: &str) -> Result<HyperParams> {
    let k = |s: &str| format!("{arch}.{s}");
    // First: a file without it is no model at all (a vocabulary-only file, say).
    let n_vocab = g
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| EngineError::MissingTensor {
            name: "token_embd.weight".into(),
            arch: arch.into(),
        })? as usize;
    let n_embd = meta_usize(g, &k("embedding_length"))?;
    let n_layer = meta_usize(g, &k("block_count"))?;
    // Every layer has tensors: a count above the file's is a lie, refused before anything is
    // sized by it (2^31 layers in a 352-byte file).
    if n_layer > g.tensors().len() {
        return Err(EngineError::Metadata {
            key: k("block_count"),
            problem: format!(
                "{n_layer} layers, but the file holds only {} tensors: the file is damaged",
                g.tensors().len()
            ),
        });
    }
    let n_head = meta_usize(g, &k("attention.head_count"))?;
    let n_head_kv = match g.get(&k("attention.head_count_kv")) {
        Some(_) => meta_usize(g, &k("attention.head_count_kv"))?,
        None => n_head,
    };
    if n_head % n_head_kv != 0 {
        return Err(EngineError::Metadata {
            key: k("attention.head_count_kv"),
            problem: format!("{n_head_kv} does not divide the {n_head} query heads"),
        });
    }
    let head_dim = match g.get(&k("attention.key_length")) {
        Some(_) => meta_usize(g, &k("attention.key_length"))?,
        None => {
            if n_embd % n_head != 0 {
                return Err(EngineError::Metadata {
                    key: k("attention.head_count"),
                    problem: format!("{n_head} heads do not divide the width {n_embd}"),
                });
            }
            n_embd / n_head
        }
    };
    let n_ff = meta_usize(g, &k("feed_forward_length"))?;
    let n_ctx_train = meta_usize(g, &k("context_length"))?;
    let rms_eps = finite_positive(g, &k("attention.layer_norm_rms_epsilon"), 1e-5)?;
    let n_rot = match g.get(&k("rope.dimension_count")) {
        Some(_) => meta_usize(g, &k("rope.dimension_count"))?,
        None => head_dim,
    };
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(EngineError::Metadata {
            key: k("rope.dimension_count"),
            problem: format!("{n_rot} must be even and at most the head size {head_dim}"),
        });
    }
    let freq_base = finite_positive(g, &k("rope.freq_base"), 10_000.0)?;
    // llama.cpp's default scaling type is linear: a factor applies unless the type says none.
    let scaling = g.get_str(&k("rope.scaling.type"));
    let freq_scale = match scaling {
        Some("none") => 1.0,
        None | Some("linear") => {
            let factor = g
                .get_f32(&k("rope.scaling.factor"))
                .or_else(|| g.get_f32(&k("rope.scale_linear")))
                .unwrap_or(0.0);
            if factor == 0.0 {
                1.0
            } else if !(factor > 0.0 && factor.is_finite()) {
                return Err(EngineError::Metadata {
                    key: k("rope.scaling.factor"),
                    problem: format!("{factor} must be a positive number"),
                });
            } else {
                1.0 / factor
            }
        }
        Some(other) => {
            return Err(EngineError::Metadata {
                key: k("rope.scaling.type"),
                problem: format!("'{other}' is not supported yet (supported: none, linear)"),
            })
        }
    };
    let ordering = match arch {
        "llama" => RopeOrdering::Normal,
        _ => RopeOrdering::NeoX,
    };
    let rope = Rope {
        ordering,
        n_rot,
        freq_base,
        freq_scale,
    };
    let positive = |key: &str| -> Result<Option<f32>> {
        match g.get(&k(key)) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
                Some(0.0) => Ok(None),
                _ => Err(EngineError::Metadata {
                    key: k(key),
                    problem: "must be a positive number".into(),
                }),
            },
        }
    };
    // Sliding-window layers (llama.cpp's defaults and keys per architecture).
    let mut window = None;
    let mut swa_layers = vec![false; n_layer];
    let mut rope_swa = rope;
    let swa_pattern = match arch {
        "gemma2" => Some((2, Some(4096))),
        "gemma3" => Some((6, None)),
        _ => None,
    };
    if let Some((default_pattern, default_window)) = swa_pattern {
        window = match g.get(&k("attention.sliding_window")) {
            Some(_) => Some(meta_usize(g, &k("attention.sliding_window"))?),
            None => default_window,
        };
        if window.is_some() {
            let key = k("attention.sliding_window_pattern");
            match g.get(&key).map(|v| (v.as_array(), v.as_u64())) {
                Some((Some(arr), _)) => {
                    if arr.len() < n_layer {
                        return Err(EngineError::Metadata {
                            key,
                            problem: format!("has {} entries for {n_layer} layers", arr.len()),
                        });
                    }
                    for (s, v) in swa_layers.iter_mut().zip(arr) {
                        *s = v.as_bool().unwrap_or(false);
                    }
                }
                other => {
                    let n = match other {
                        Some((_, Some(n))) => n as usize,
                        Some(_) => {
                            return Err(EngineError::Metadata {
                                key,
                                problem: "must be an integer or an array of booleans".into(),
                            })
                        }
                        None => default_pattern,
                    };
                    // llama.cpp: layer l slides when l % n < n - 1 (n = 0: every layer).
                    for (l, s) in swa_layers.iter_mut().enumerate() {
                        *s = n == 0 || l % n < n - 1;
                    }
                }
            }
            // Gemma 2 keeps the global rope on its local layers; Gemma 3's local layers use
            // base 10000 without scaling. Both read an explicit base when the file has one.
            let (base, scale) = match arch {
                "gemma2" => (freq_base, freq_scale),
                _ => (10_000.0, 1.0),
            };
            rope_swa = Rope {
                freq_base: finite_positive(g, &k("rope.freq_base_swa"), base)?,
                freq_scale: scale,
                ..rope
            };
        }
    }
    let gemma = matches!(arch, "gemma2" | "gemma3");
    let (attn_softcap, final_softcap) = match arch {
        "gemma2" => (
            Some(positive("attn_logit_softcapping")?.unwrap_or(50.0)),
            Some(positive("final_logit_softcapping")?.unwrap_or(30.0)),
        ),
        "gemma3" => (None, positive("final_logit_softcapping")?),
        _ => (None, None),
    };
    // llama.cpp scales Gemma 27B queries by 1/sqrt(n_embd / n_head) (its type is known by
    // its layer count), every other Gemma and Phi-3 by 1/sqrt(head_dim).
    let query_scale = match arch {
        "phi3" => Some(1.0 / (head_dim as f32).sqrt()),
        "gemma2" | "gemma3" => {
            let big = (arch == "gemma2" && n_layer == 46) || (arch == "gemma3" && n_layer == 62);
            let d = if big { n_embd / n_head } else { head_dim };
            Some(1.0 / (d as f32).sqrt())
        }
        _ => None,
    };
    Ok(HyperParams {
        arch: arch.to_string(),
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
        n_ctx_train,
        rms_eps,
        rope,
        rope_swa,
        window,
        swa_layers,
        embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
        query_scale,
        attn_softcap,
        final_softcap,
        ffn_act: if gemma {
            FfnActivation::Gelu
        } else {
            FfnActivation::Silu
        },
    })
}
