//! [`Q8Rounding`]: how activations are rounded into Q8_0 / Q8_1 (a leaf: the quantizers of every
//! instruction set and the kernel dispatch import it).

/// How activations are rounded into Q8_0 / Q8_1. ggml has three variants; they agree except on
/// rare elements (exact .5 ties after scaling, and where `127/amax` and `1/(amax/127)` differ in
/// the last bit), which is about one element in 2^16 — roughly once per token for a 135M model.
/// To reproduce a llama.cpp run token for token, use the flavour of the machine it ran on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Q8Rounding {
    /// `quantize_row_q8_*_ref` (generic builds): `id = 1/d`, `roundf` (half away from zero).
    #[default]
    GgmlRef,
    /// ggml-cpu's ARM NEON `quantize_row_q8_*`: `id = 1/d`, round half to even (`vcvtnq`).
    GgmlArm,
    /// ggml-cpu's x86 AVX/AVX2 `quantize_row_q8_*`: `id = 127/amax`, round half to even.
    GgmlX86,
}

impl Q8Rounding {
    /// The flavour llama.cpp uses on this architecture: x86 on x86-64, ARM on aarch64, the
    /// reference elsewhere.
    pub fn host() -> Q8Rounding {
        if cfg!(target_arch = "x86_64") {
            Q8Rounding::GgmlX86
        } else if cfg!(target_arch = "aarch64") {
            Q8Rounding::GgmlArm
        } else {
            Q8Rounding::GgmlRef
        }
    }

    /// Parses `ref`, `arm` or `x86`.
    pub fn from_name(s: &str) -> Option<Q8Rounding> {
        match s {
            "ref" => Some(Q8Rounding::GgmlRef),
            "arm" => Some(Q8Rounding::GgmlArm),
            "x86" => Some(Q8Rounding::GgmlX86),
            _ => None,
        }
    }
}
