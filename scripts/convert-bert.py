#!/usr/bin/env python3
"""Converts a Hugging Face BERT sentence-embedding model (safetensors + vocab.txt, e.g.
all-MiniLM-L6-v2) to a GGUF file that llama.cpp loads as architecture `bert`.

Why not llama.cpp's convert_hf_to_gguf.py: it imports torch and transformers (for the
tokenizer), which CI does not have. This writes the same tensor names, metadata and tensor
types that converter writes with `--outtype f16` (2-D weights f16; 1-D tensors, norms, the
position and token-type tables f32), with only `gguf` and `numpy`:

  convert-bert.py MODEL_DIR OUT.gguf

Facts taken from llama.cpp's conversion/bert.py and conversion/base.py (read, not copied):
vocabulary in "phantom space" form (word starts get U+2581, `##` continuations lose the `##`,
special tokens unchanged), special tokens marked CONTROL, `tokenizer.ggml.model` = "bert",
`bert.attention.causal` = false, the pooling type from sentence-transformers' Pooling config,
the pooler and `position_ids` tensors dropped.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf


def read_safetensors(path: Path) -> dict:
    """name -> float32 array, from a safetensors file (F32/F16/BF16 tensors only)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a : base + b]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif dtype == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue  # position_ids (I64) and the like: not weights
        out[name] = arr.reshape(info["shape"])
    return out


def tensor_name(hf: str):
    """GGUF name of a Hugging Face BERT tensor, or None to drop it."""
    hf = hf.removeprefix("bert.")
    fixed = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    if len(parts) < 5 or parts[0] != "encoder" or parts[1] != "layer":
        return None  # pooler.*, cls.*: not used for embeddings
    bid, rest = parts[2], ".".join(parts[3:])
    per_layer = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    stem, kind = rest.rsplit(".", 1)
    if stem not in per_layer or kind not in ("weight", "bias"):
        return None
    return f"blk.{bid}.{per_layer[stem]}.{kind}"


def pooling_type(model_dir: Path) -> int:
    """llama.cpp's enum: 1 mean, 2 cls, 3 last (from sentence-transformers' Pooling module)."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return 0
    for mod in json.loads(modules.read_text()):
        if mod["type"].endswith("Pooling"):
            cfg = json.loads((model_dir / mod["path"] / "config.json").read_text())
            if cfg.get("pooling_mode_mean_tokens"):
                return int(gguf.PoolingType.MEAN)
            if cfg.get("pooling_mode_cls_token"):
                return int(gguf.PoolingType.CLS)
            if cfg.get("pooling_mode_lasttoken"):
                return int(gguf.PoolingType.LAST)
    return 0


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: convert-bert.py MODEL_DIR OUT.gguf")
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    hp = json.loads((model_dir / "config.json").read_text())
    if hp.get("model_type") != "bert":
        sys.exit(f"error: {model_dir} is a '{hp.get('model_type')}' model, not bert")

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(model_dir.name)
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_causal_attention(False)
    pool = pooling_type(model_dir)
    if pool:
        w.add_pooling_type(gguf.PoolingType(pool))

    # Vocabulary: vocab.txt in id order; the tokenizer's added special tokens are CONTROL.
    tokens = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    added = {}
    tj = model_dir / "tokenizer.json"
    if tj.is_file():
        added = {t["content"]: t for t in json.loads(tj.read_text())["added_tokens"]}
    toktypes = []
    for t in tokens:
        special = t in added and added[t].get("special", False)
        toktypes.append(int(gguf.TokenType.CONTROL if special else gguf.TokenType.NORMAL))

    def phantom(tok, ty):
        if ty == gguf.TokenType.CONTROL:
            return tok
        return tok[2:] if tok.startswith("##") else "\u2581" + tok

    w.add_token_type_count(hp.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    # The vocabulary of bert-base-uncased, whose pre-tokenizer hash llama.cpp names bert-bge
    # (llama.cpp's WordPiece tokenizer does not depend on it).
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list([phantom(t, ty) for t, ty in zip(tokens, toktypes)])
    w.add_token_types(toktypes)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(w)

    f32_tables = ("position_embd.weight", "token_types.weight")
    for hf, arr in read_safetensors(model_dir / "model.safetensors").items():
        name = tensor_name(hf)
        if name is None:
            continue
        if arr.ndim <= 1 or name.endswith("_norm.weight") or name in f32_tables:
            data = arr.astype(np.float32)
        else:
            data = arr.astype(np.float16)
        w.add_tensor(name, data)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


if __name__ == "__main__":
    main()
