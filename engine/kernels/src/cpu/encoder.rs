//! f32 helpers of encoder (BERT) models: LayerNorm with bias, GELU, bidirectional attention of
//! one (token, head), and pooling. Plain scalar loops, each following ggml's CPU operator where
//! the order of operations can change the result.

/// LayerNorm with weight and bias: `out[i] = ((x[i] - mean) * scale) * w[i] + b[i]` with
/// `scale = 1 / sqrtf(var + eps)` and `var` the mean of the centred squares.
///
/// As ggml's `norm` followed by `mul` and `add` (llama.cpp's `build_norm` with `LLM_NORM`): the
/// sum and the squares are accumulated in f64 and narrowed to f32 for the mean, the variance
/// and the scale. All slices must have the same length.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        w.len() == x.len() && b.len() == x.len() && out.len() == x.len(),
        "layer_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let n = x.len() as f64;
    let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
    let mean = (sum / n) as f32;
    let mut sq = 0.0f64;
    for &v in x {
        let c = v - mean;
        sq += f64::from(c * c);
    }
    let var = (sq / n) as f32;
    let scale = 1.0f32 / (var + eps).sqrt();
    for (((o, &v), &g), &bias) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = ((v - mean) * scale) * g + bias;
    }
}

/// GELU, tanh approximation, in f32: `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU as ggml's CPU backend computes it (the operator llama.cpp's BERT uses): the tanh
/// approximation, looked up at the f16 rounding of `x` and rounded to f16 (ggml keeps a
/// 65536-entry f16 table), except that `x <= -10` gives 0 and `x >= 10` gives `x`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        // The table holds f16(gelu_tanh(h)) for every f16 h (the same formula as `gelu_tanh`).
        super::activations::gelu_f16(x)
    }
}

/// Bidirectional (unmasked) attention of one query head over `n` keys and values:
/// `out = sum_j softmax_j(scale * q . k_j) v_j`, with `k_j`/`v_j` the `head_dim` values that
/// `k(j)`/`v(j)` return. `scores` is scratch of at least `n` floats. The softmax subtracts the
/// largest score first and sums in f64, as ggml's `soft_max` does.
pub fn attend_all<'a>(
    q: &[f32],
    n: usize,
    k: &dyn Fn(usize) -> &'a [f32],
    v: &dyn Fn(usize) -> &'a [f32],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let scores = &mut scores[..n];
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        let dot: f32 = q.iter().zip(k(j)).map(|(a, b)| a * b).sum();
        *s = dot * scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += f64::from(*s);
    }
    let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(v(j)) {
            *o += p * x;
        }
    }
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;
    use half::f16;

    #[test]
    fn layer_norm_matches_the_formula() {
        let mut r = Rng::new(5);
        let x = r.vec(384, 3.0);
        let w = r.vec(384, 1.0);
        let b = r.vec(384, 0.5);
        let mut out = vec![0.0; 384];
        layer_norm(&x, &w, &b, 1e-12, &mut out);
        // Straightforward f64 formula.
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        for i in 0..384 {
            let want = (x[i] as f64 - mean) / (var + 1e-12).sqrt() * w[i] as f64 + b[i] as f64;
            assert!(
                (out[i] as f64 - want).abs() < 1e-5,
                "{i}: {} vs {want}",
                out[i]
            );
        }
        // Constant rows normalise to the bias.
        let mut o = vec![0.0; 4];
        layer_norm(&[2.0; 4], &[1.0; 4], &[0.25; 4], 1e-5, &mut o);
        assert_eq!(o, [0.25; 4]);
    }

    #[test]
    fn gelu_is_the_tanh_approximation_at_f16_precision() {
        // Known values of the tanh approximation (computed in f64).
        let exact = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        for x in [
            -9.5f32, -3.0, -1.0, -0.5, -0.01, 0.0, 0.01, 0.5, 1.0, 2.5, 9.9,
        ] {
            let want = exact(f64::from(x));
            assert!((f64::from(gelu_tanh(x)) - want).abs() < 1e-6, "{x}");
            // f16 rounding of input and output: relative error ~1e-3.
            assert!(
                (f64::from(gelu(x)) - want).abs() < 2e-3 * want.abs().max(0.05),
                "{x}: {} vs {want}",
                gelu(x)
            );
        }
        assert_eq!(gelu(-10.0), 0.0);
        assert_eq!(gelu(-30.0), 0.0);
        assert_eq!(gelu(10.0), 10.0);
        assert_eq!(gelu(123.5), 123.5);
        // 1.0 is exact in f16: gelu(1) is the f16 rounding of 0.8411920.
        assert_eq!(gelu(1.0), f16::from_f32(0.841_192).to_f32());
    }

    #[test]
    fn attention_is_a_softmax_weighted_mean_of_the_values() {
        let mut r = Rng::new(9);
        let (n, d) = (7usize, 8usize);
        let q = r.vec(d, 1.0);
        let ks: Vec<Vec<f32>> = (0..n).map(|_| r.vec(d, 1.0)).collect();
        let vs: Vec<Vec<f32>> = (0..n).map(|_| r.vec(d, 1.0)).collect();
        let mut scores = vec![0.0; n + 3];
        let mut out = vec![0.0; d];
        attend_all(&q, n, &|j| &ks[j], &|j| &vs[j], 0.35, &mut scores, &mut out);
        let logits: Vec<f64> = ks
            .iter()
            .map(|k| 0.35 * q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>())
            .collect();
        let z: f64 = logits.iter().map(|l| l.exp()).sum();
        for i in 0..d {
            let want: f64 = (0..n).map(|j| logits[j].exp() / z * vs[j][i] as f64).sum();
            assert!((out[i] as f64 - want).abs() < 1e-5, "{i}");
        }
        // One key: the output is its value.
        attend_all(&q, 1, &|_| &ks[3], &|_| &vs[3], 1.0, &mut scores, &mut out);
        for (o, v) in out.iter().zip(&vs[3]) {
            assert!((o - v).abs() < 1e-6);
        }
    }
}
