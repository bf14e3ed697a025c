#!/usr/bin/env python3
"""Writes a random-weight F16 GGUF with the shape of a current small model, for the benchmark
matrix (scripts/make-bench-models.sh quantizes it with llama.cpp's llama-quantize). Output text
is meaningless; shapes, tensor types after quantization and memory traffic are a real model's.
Deterministic for a given seed.

  make-bench-model.py --arch gemma3 --donor SmolLM2-135M-Instruct.Q4_1.gguf --out g.F16.gguf
  make-bench-model.py --arch qwen3  --donor SmolLM2-135M-Instruct.Q4_1.gguf --out q.F16.gguf

Shapes (--arch):
  gemma3: Gemma-3-270M's: width 640, 18 layers, 4 query heads / 1 KV head of size 256
          (attention.key_length/value_length), FFN 2048 (GELU), sliding window 512 on five of
          every six layers (both engines' Gemma 3 default pattern), q/k and post-attention /
          post-FFN norms, output head tied to token_embd, 262,144-token vocabulary.
  qwen3:  Qwen3-0.6B's: width 1024, 28 layers, 16 query / 8 KV heads of size 128, FFN 3072,
          per-head q/k RMSNorm (attn_q_norm/attn_k_norm), tied output head, 151,936-token
          vocabulary.
The tokenizer is the donor's (so prompts tokenize normally), its token list padded to the
model's vocabulary with unused filler tokens (token type 5, score 0) that no text produces.
Needs: pip install gguf numpy
"""
import argparse

import gguf
import numpy as np

SHAPES = {
    "gemma3": dict(
        name="synthetic-gemma3-270m",
        hidden=640,
        layers=18,
        heads=4,
        kv_heads=1,
        head_dim=256,
        ffn=2048,
        vocab=262_144,
        ctx=32_768,
        rope_base=1_000_000.0,
        rms_eps=1e-6,
        sliding_window=512,
    ),
    "qwen3": dict(
        name="synthetic-qwen3-0.6b",
        hidden=1024,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        ffn=3072,
        vocab=151_936,
        ctx=40_960,
        rope_base=1_000_000.0,
        rms_eps=1e-6,
        sliding_window=None,
    ),
}

TOKEN_TYPE_UNUSED = 5

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--arch", required=True, choices=sorted(SHAPES))
ap.add_argument("--donor", required=True, help="GGUF whose tokenizer metadata is copied")
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=1234)
a = ap.parse_args()
s = SHAPES[a.arch]
gemma = a.arch == "gemma3"

donor = gguf.GGUFReader(a.donor)
w = gguf.GGUFWriter(a.out, a.arch)
w.add_name(s["name"])
w.add_block_count(s["layers"])
w.add_context_length(s["ctx"])
w.add_embedding_length(s["hidden"])
w.add_feed_forward_length(s["ffn"])
w.add_head_count(s["heads"])
w.add_head_count_kv(s["kv_heads"])
w.add_key_length(s["head_dim"])
w.add_value_length(s["head_dim"])
w.add_rope_freq_base(s["rope_base"])
w.add_layer_norm_rms_eps(s["rms_eps"])
if s["sliding_window"]:
    w.add_sliding_window(s["sliding_window"])
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

# The donor's tokenizer, every per-token array padded to the model's vocabulary.
fields = {k: f for k, f in donor.fields.items() if k.startswith("tokenizer.")}
tokens = list(fields["tokenizer.ggml.tokens"].contents())
n_donor = len(tokens)
if n_donor > s["vocab"]:
    raise SystemExit(f"error: the donor has {n_donor} tokens, more than {a.arch}'s {s['vocab']}")
n_pad = s["vocab"] - n_donor
taken = set(tokens)
filler = []
i = 0
while len(filler) < n_pad:
    t = f"<unused{i}>"
    if t not in taken:
        filler.append(t)
    i += 1
pad_with = {
    "tokenizer.ggml.tokens": filler,
    "tokenizer.ggml.token_type": [TOKEN_TYPE_UNUSED] * n_pad,
    "tokenizer.ggml.scores": [0.0] * n_pad,
}
for key, field in fields.items():
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        val = list(field.contents())
        if key in pad_with:
            if len(val) != n_donor:
                raise SystemExit(f"error: donor {key} has {len(val)} entries for {n_donor} tokens")
            val += pad_with[key]
        w.add_key_value(key, val, vtype, sub_type=field.types[-1])
    else:
        w.add_key_value(key, field.contents(), vtype)

rng = np.random.default_rng(a.seed)


def rand(rows, cols):
    """A (rows = outputs, cols = inputs) F16 matrix; GGUF's shape is [cols, rows]."""
    return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)


def ones(n):
    return np.ones(n, dtype=np.float32)


d, hd, ff = s["hidden"], s["head_dim"], s["ffn"]
q_dim, kv_dim = s["heads"] * hd, s["kv_heads"] * hd
w.add_tensor("token_embd.weight", rand(s["vocab"], d))
w.add_tensor("output_norm.weight", ones(d))
# No output.weight: both shapes tie the output head to token_embd, as the real models do.
for layer in range(s["layers"]):
    p = f"blk.{layer}."
    w.add_tensor(p + "attn_norm.weight", ones(d))
    w.add_tensor(p + "attn_q.weight", rand(q_dim, d))
    w.add_tensor(p + "attn_k.weight", rand(kv_dim, d))
    w.add_tensor(p + "attn_v.weight", rand(kv_dim, d))
    w.add_tensor(p + "attn_q_norm.weight", ones(hd))
    w.add_tensor(p + "attn_k_norm.weight", ones(hd))
    w.add_tensor(p + "attn_output.weight", rand(d, q_dim))
    if gemma:
        w.add_tensor(p + "post_attention_norm.weight", ones(d))
    w.add_tensor(p + "ffn_norm.weight", ones(d))
    w.add_tensor(p + "ffn_gate.weight", rand(ff, d))
    w.add_tensor(p + "ffn_up.weight", rand(ff, d))
    w.add_tensor(p + "ffn_down.weight", rand(d, ff))
    if gemma:
        w.add_tensor(p + "post_ffw_norm.weight", ones(d))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(a.out)
