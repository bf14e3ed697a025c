//! Rotary position embeddings (RoPE) of one row of heads, in ggml's arithmetic: the angle of
//! pair i follows ggml's recurrence `theta_i = pos * theta_scale^i` and the rotation is fused
//! as GCC contracts ggml's C, so that rotated keys and queries equal llama.cpp's bit for bit.

/// Rotary position embedding variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeOrdering {
    /// Rotates adjacent pairs (`x[2i]`, `x[2i+1]`) — the original RoFormer/Llama layout in GGUF.
    Normal,
    /// Rotates (`x[i]`, `x[i + n_rot/2]`) — GPT-NeoX layout (Qwen2, Phi-3, Gemma, ...).
    NeoX,
}

/// Parameters of a rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Pair layout.
    pub ordering: RopeOrdering,
    /// Rotated dimensions per head (<= head_dim; the rest passes through).
    pub n_rot: usize,
    /// Base of the frequencies (theta).
    pub freq_base: f32,
    /// Position scale (1 / linear scaling factor).
    pub freq_scale: f32,
}

/// Rotary embedding of one row (all heads) at position `pos`: `dst` = `src` with pairs rotated
/// by `pos * freq_scale * freq_base^(-2i/n_rot)`, pairs adjacent (normal) or `n_rot/2` apart
/// (NeoX); dimensions past `n_rot` pass through.
pub fn rope_row(src: &[f32], dst: &mut [f32], pos: usize, head_dim: usize, rope: Rope) {
    rope_row_at(src, dst, pos as f32, head_dim, rope)
}

/// [`rope_row`] at a position given as f32, which may be negative: rotating by `-d` undoes
/// `d` positions of rotation (RoPE angles add), which is how a context shift moves cached keys.
pub fn rope_row_at(src: &[f32], dst: &mut [f32], pos: f32, head_dim: usize, rope: Rope) {
    rope_row_factors(src, dst, pos, head_dim, rope, None)
}

/// [`rope_row_at`] with optional per-frequency divisors (`factors[i]` divides the angle of pair
/// i before the position scale, as ggml applies Llama 3's `rope_freqs`; `n_rot / 2` values).
pub fn rope_row_factors(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked), the only feature it enables.
        return unsafe { rope_row_fma(src, dst, pos, head_dim, rope, factors) };
    }
    rope_row_body(src, dst, pos, head_dim, rope, factors)
}

/// [`rope_row_body`] compiled with hardware FMA: `mul_add` is one instruction instead of a call
/// to libm's `fmaf` (the same exactly rounded result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_row_fma(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    rope_row_body(src, dst, pos, head_dim, rope, factors)
}

/// The rotation itself (inlined into the FMA and baseline builds).
#[inline(always)]
fn rope_row_body(
    src: &[f32],
    dst: &mut [f32],
    pos: f32,
    head_dim: usize,
    rope: Rope,
    factors: Option<&[f32]>,
) {
    dst.copy_from_slice(src);
    let n_heads = src.len() / head_dim;
    let half = rope.n_rot / 2;
    let theta_scale = rope.freq_base.powf(-2.0 / rope.n_rot as f32);
    // theta_i by the same recurrence ggml uses, so the rounding matches the reference.
    let mut theta = pos;
    for i in 0..half {
        let angle = match factors {
            Some(f) => theta / f[i] * rope.freq_scale,
            None => theta * rope.freq_scale,
        };
        let (sin, cos) = angle.sin_cos();
        for h in 0..n_heads {
            let base = h * head_dim;
            let (a, b) = match rope.ordering {
                RopeOrdering::Normal => (base + 2 * i, base + 2 * i + 1),
                RopeOrdering::NeoX => (base + i, base + i + half),
            };
            let (x0, x1) = (src[a], src[b]);
            // Fused as GCC contracts ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`.
            dst[a] = x0.mul_add(cos, -(x1 * sin));
            dst[b] = x0.mul_add(sin, x1 * cos);
        }
        theta *= theta_scale;
    }
}

#[cfg(test)]
mod rope_tests {
    use super::*;

    fn rope(ordering: RopeOrdering, n_rot: usize, freq_scale: f32) -> Rope {
        Rope {
            ordering,
            n_rot,
            freq_base: 100.0,
            freq_scale,
        }
    }

    /// Rotating (1, 0) by theta gives (cos, sin): each pair's angle can be read back.
    fn angles(dst: &[f32], pairs: &[(usize, usize)]) -> Vec<f32> {
        pairs.iter().map(|&(a, b)| dst[b].atan2(dst[a])).collect()
    }

    #[test]
    fn normal_rotates_adjacent_pairs() {
        // head_dim 4, two heads: pairs (0,1), (2,3) in each; angles pos * 100^(-2i/4).
        let mut src = vec![0.0f32; 8];
        for a in [0, 2, 4, 6] {
            src[a] = 1.0;
        }
        let mut dst = vec![0.0; 8];
        rope_row(&src, &mut dst, 3, 4, rope(RopeOrdering::Normal, 4, 1.0));
        let got = angles(&dst, &[(0, 1), (2, 3), (4, 5), (6, 7)]);
        let want = [3.0f32, 0.3, 3.0, 0.3];
        for (g, w) in got.iter().zip(want) {
            let w = (w + std::f32::consts::PI).rem_euclid(2.0 * std::f32::consts::PI)
                - std::f32::consts::PI;
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
    }

    #[test]
    fn neox_rotates_halves_and_partial_rotary_passes_the_rest() {
        // head_dim 6, n_rot 4: pairs (0,2), (1,3); dims 4 and 5 untouched.
        let src = [1.0f32, 1.0, 0.0, 0.0, 7.0, -7.0];
        let mut dst = [0.0f32; 6];
        rope_row(&src, &mut dst, 1, 6, rope(RopeOrdering::NeoX, 4, 1.0));
        let got = angles(&dst, &[(0, 2), (1, 3)]);
        assert!(
            (got[0] - 1.0).abs() < 1e-6 && (got[1] - 0.1).abs() < 1e-6,
            "{got:?}"
        );
        assert_eq!(&dst[4..], &[7.0, -7.0]);
    }

    #[test]
    fn linear_scaling_divides_the_position() {
        let src = [1.0f32, 0.0];
        let (mut scaled, mut plain) = ([0.0f32; 2], [0.0f32; 2]);
        rope_row(&src, &mut scaled, 8, 2, rope(RopeOrdering::Normal, 2, 0.25));
        rope_row(&src, &mut plain, 2, 2, rope(RopeOrdering::Normal, 2, 1.0));
        assert_eq!(scaled, plain);
        // Position 0 is the identity.
        let mut zero = [0.0f32; 2];
        rope_row(
            &[0.3, -0.4],
            &mut zero,
            0,
            2,
            rope(RopeOrdering::NeoX, 2, 1.0),
        );
        assert_eq!(zero, [0.3, -0.4]);
    }
}
