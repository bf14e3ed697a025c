#!/usr/bin/env python3
"""Checks that every SIMD helper in the kernels is `#[inline]`.

A `#[target_feature]` function whose signature takes or returns a vector register type
(`__m256i`, `int8x16_t`, ...) is a helper of a kernel, not an entry point. Without `#[inline]`
Rust makes it available only in its own codegen unit, so a generic kernel (`_xn::<N>`)
instantiated in another unit calls it, passing every vector through memory: that alone made
the AVX2 Q5_0, Q5_1, Q5_K and Q6_K prefill kernels 1.7-3.5x slower. The benchmarks catch such
a loss only when someone runs them; this check catches it at lint time.

Exit status 1 with one line per helper missing `#[inline]`; 0 prints a count. Usage:
    scripts/check-kernel-inline.py
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "engine", "kernels", "src")
VECTOR = re.compile(r"\b(__m128i?|__m128d|__m256[id]?|__m512[id]?|u?int(8|16|32|64)x\d+_t|float(32|64)x\d+_t)\b")


def main():
    missing, checked = [], 0
    for dirpath, _, files in os.walk(KERNELS):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            lines = open(path).read().split("\n")
            for i, line in enumerate(lines):
                if not line.strip().startswith("#[target_feature"):
                    continue
                start = i
                while start > 0 and lines[start - 1].strip().startswith(("#[", "///")):
                    start -= 1
                end = i
                while end < len(lines) and not re.search(r"\bfn\b", lines[end]):
                    end += 1
                # The signature: from `fn` to the opening brace of the body.
                sig_end = end
                while sig_end < len(lines) and "{" not in lines[sig_end]:
                    sig_end += 1
                signature = " ".join(lines[end : sig_end + 1]).split("{")[0]
                if not VECTOR.search(signature):
                    continue
                checked += 1
                attrs = " ".join(lines[start:end])
                if "#[inline" not in attrs:
                    fn = re.search(r"fn\s+(\w+)", lines[end]).group(1)
                    rel = os.path.relpath(path, ROOT)
                    missing.append(f"{rel}:{end + 1}: SIMD helper `{fn}` is not #[inline]")
    for m in missing:
        print(m)
    if missing:
        return 1
    print(f"check-kernel-inline: {checked} SIMD helpers, all #[inline]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
