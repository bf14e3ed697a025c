#!/usr/bin/env python3
"""Writes cases.bin: random and extreme weight rows of every quant type with NEON kernels, each
with an activation row of its vec_dot type, for ggml-arm-dots.c (run by make-ggml-arm-dots.sh).

Format, all little-endian: u32 case count; per case: u32 ggml type id, u32 n (elements),
u32 weight byte count, the weight bytes, u32 activation byte count, the activation bytes.
Deterministic (seed 20261130); numpy only.
"""
import struct
import sys

import numpy as np

# ggml type id: (name, block elements, block bytes, f16 offsets, extreme fill byte, act type)
TYPES = {
    2: ("q4_0", 32, 18, [0], 0x00, "q8_0"),
    3: ("q4_1", 32, 20, [0, 2], 0xFF, "q8_1"),
    6: ("q5_0", 32, 22, [0], 0x00, "q8_0"),
    7: ("q5_1", 32, 24, [0, 2], 0xFF, "q8_1"),
    8: ("q8_0", 32, 34, [0], 0x80, "q8_0"),
    10: ("q2_k", 256, 84, [80, 82], 0xFF, "q8_k"),
    11: ("q3_k", 256, 110, [108], 0x00, "q8_k"),
    12: ("q4_k", 256, 144, [0, 2], 0xFF, "q8_k"),
    13: ("q5_k", 256, 176, [0, 2], 0xFF, "q8_k"),
    14: ("q6_k", 256, 210, [208], 0xFF, "q8_k"),
    20: ("iq4_nl", 32, 18, [0], 0x00, "q8_0"),
    23: ("iq4_xs", 256, 136, [0], 0x00, "q8_k"),
}

rng = np.random.default_rng(20261130)


def f16(v):
    return np.float16(v).tobytes()


def weights(tid, nb, extreme):
    _, _, bb, offs, fill, _ = TYPES[tid]
    out = bytearray()
    for i in range(nb):
        blk = bytearray(rng.integers(0, 256, bb, dtype=np.uint8).tobytes())
        if extreme:
            blk[:] = bytes([fill]) * bb
            if tid == 14:  # q6_k scales at -128
                blk[192:208] = b"\x80" * 16
        for o in offs:
            d = 0.0 if (extreme and i % 3 == 1) else rng.uniform(-0.05, 0.05)
            blk[o:o + 2] = f16(d)
        out += blk
    return bytes(out)


def activations(act, nb, extreme):
    out = bytearray()
    for i in range(nb):
        n = 256 if act == "q8_k" else 32
        q = np.full(n, -128, np.int8) if extreme else rng.integers(-128, 128, n, dtype=np.int8)
        d = 0.0 if (extreme and i % 4 == 2) else rng.uniform(0.001, 0.05)
        if act == "q8_k":
            bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype("<i2")
            out += np.float32(d).tobytes() + q.tobytes() + bsums.tobytes()
        elif act == "q8_1":
            s = float(np.float16(d)) * int(q.astype(np.int32).sum())
            out += f16(d) + f16(s) + q.tobytes()
        else:
            out += f16(d) + q.tobytes()
    return bytes(out)


cases = []
for tid, (name, be, bb, offs, fill, act) in TYPES.items():
    counts = [1, 2, 3, 4, 7, 9, 33] if be == 32 else [1, 2, 3, 7]
    for nb in counts:
        for extreme in (False, True):
            cases.append((tid, nb * be, weights(tid, nb, extreme), activations(act, nb, extreme)))
    # More random rows: enough block pairs that each fused-or-rounded choice shows.
    for nb in [16, 17, 24, 33, 48, 49] if be == 32 else [2, 4, 5, 8]:
        cases.append((tid, nb * be, weights(tid, nb, False), activations(act, nb, False)))

with open(sys.argv[1] if len(sys.argv) > 1 else "cases.bin", "wb") as f:
    f.write(struct.pack("<I", len(cases)))
    for tid, n, w, x in cases:
        f.write(struct.pack("<III", tid, n, len(w)) + w + struct.pack("<I", len(x)) + x)
print(f"{len(cases)} cases")
