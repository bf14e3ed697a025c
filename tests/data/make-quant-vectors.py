#!/usr/bin/env python3
"""Test vectors for edge-run's quantized block types, made independently of the engine.

How the data is made (rerun to regenerate; the output is deterministic):
  * weights: for each type, 7 blocks of uniformly random bytes (numpy PCG64, seed 20261130 + the
    type id), then every f16 scale field (d, dmin, m) overwritten with a finite f16 of a random
    magnitude in [2^-14, 2^-4) (sign random for Q5_1's m, positive for d/dmin as llama-quantize
    writes them) so that no value is inf/NaN. All other bits (quants, packed 6-bit scales, high-bit
    masks) stay random, so every code path of the unpacking is exercised.
  * expected values: gguf-py's numpy dequantizer, `gguf.quants.dequantize(bytes, type)`
    (gguf 0.17+ / numpy), which is written from ggml's C code by other people, not from ours.
  * activations (for vec_dot tests of the K/IQ4_XS types): 7*256 f32 values uniform in [-3, 3)
    (one block of them scaled by 1e-3, one all zero) and their Q8_K quantization computed here
    in numpy from ggml's `quantize_row_q8_K_ref` formula: amax/max over the block,
    iscale = -127/max (f32), q = min(127, round-half-even(iscale * x)), bsums = sums of 16,
    d = 1/iscale (f32); an all-zero block has d = 0.

Files, in tests/data/quant-vectors/ (little-endian):
  <type>.bin : u32 n_blocks, u32 block_elems, u32 block_bytes, then n_blocks * block_bytes raw
               bytes, then n_blocks * block_elems f32 expected values.
  q8_k-act.bin : u32 n (elements), n f32 inputs, then n/256 * 292 bytes of Q8_K blocks.
"""
import os, struct, sys
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant-vectors")
NB = 7

# type -> (block elems, block bytes, offsets of f16 scale fields, offsets of signed f16 fields)
TYPES = {
    "q5_0": (T.Q5_0, 32, 22, [0], []),
    "q5_1": (T.Q5_1, 32, 24, [0], [2]),
    "q2_k": (T.Q2_K, 256, 84, [80, 82], []),
    "q3_k": (T.Q3_K, 256, 110, [108], []),
    "q4_k": (T.Q4_K, 256, 144, [0, 2], []),
    "q5_k": (T.Q5_K, 256, 176, [0, 2], []),
    "q6_k": (T.Q6_K, 256, 210, [208], []),
    "iq4_nl": (T.IQ4_NL, 32, 18, [0], []),
    "iq4_xs": (T.IQ4_XS, 256, 136, [0], []),
}


def rand_f16(rng, signed):
    v = np.float16(2.0 ** rng.uniform(-14, -4))
    if signed and rng.integers(2):
        v = -v
    return np.array([v], dtype="<f2").tobytes()


def q8_k(x):
    x = x.astype(np.float32).reshape(-1, 256)
    out = bytearray()
    for b in x:
        a = np.abs(b)
        j = int(np.argmax(a))  # first index of the max, as ggml's strict '>' scan
        amax, mx = a[j], b[j]
        if amax == 0:
            out += struct.pack("<f", 0.0) + bytes(256) + bytes(32)
            continue
        iscale = np.float32(-127.0) / np.float32(mx)
        q = np.minimum(127, np.rint((iscale * b).astype(np.float32))).astype(np.int8)
        bsums = q.astype(np.int16).reshape(16, 16).sum(axis=1).astype("<i2")
        d = np.float32(1.0) / iscale
        out += np.array([d], dtype="<f4").tobytes() + q.tobytes() + bsums.tobytes()
    return bytes(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (t, be, bb, f16s, signed) in TYPES.items():
        rng = np.random.Generator(np.random.PCG64(20261130 + int(t)))
        raw = bytearray(rng.integers(0, 256, size=NB * bb, dtype=np.uint8).tobytes())
        for b in range(NB):
            for off in f16s:
                raw[b * bb + off : b * bb + off + 2] = rand_f16(rng, False)
            for off in signed:
                raw[b * bb + off : b * bb + off + 2] = rand_f16(rng, True)
        vals = dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), t).astype("<f4")
        assert vals.shape == (NB * be,), vals.shape
        assert np.all(np.isfinite(vals))
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(struct.pack("<III", NB, be, bb) + bytes(raw) + vals.tobytes())
    rng = np.random.Generator(np.random.PCG64(20261130))
    x = rng.uniform(-3, 3, size=NB * 256).astype(np.float32)
    x[256:512] *= np.float32(1e-3)
    x[512:768] = 0
    with open(os.path.join(OUT, "q8_k-act.bin"), "wb") as f:
        f.write(struct.pack("<I", x.size) + x.astype("<f4").tobytes() + q8_k(x))
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
