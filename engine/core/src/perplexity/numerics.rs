//! The per-position arithmetic of llama.cpp's `llama-perplexity`, operation for operation (which
//! sums are `f32` and which `f64`, where a value is rounded to `f32`), so that the same logits
//! give the same figures: the negative log-likelihood of the next token, the `u16` quantization
//! of a row of log-probabilities in a base-logits file, and the KL-divergence terms against such
//! a row. `expf` and `log` are the C library's, as llama.cpp's are (`f32::exp`, `f64::ln`).

/// `u16` values per row of a base-logits file for a vocabulary of `n_vocab` tokens: two `f32`
/// (the scale and the smallest log-probability, as four `u16`) and the vocabulary padded to
/// an even count.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// The largest logit and the first position holding it (strictly greater wins, as llama.cpp's
/// loops compare).
fn max_and_argmax(logits: &[f32]) -> (f32, usize) {
    let mut max = logits[0];
    let mut imax = 0;
    for (i, &v) in logits.iter().enumerate().skip(1) {
        if v > max {
            max = v;
            imax = i;
        }
    }
    (max, imax)
}

/// Σ exp(logit - max) accumulated in `f64`, each term an `f32` `expf`.
fn sum_exp(logits: &[f32], max: f32) -> f64 {
    logits.iter().map(|&v| f64::from((v - max).exp())).sum()
}

/// The negative log-likelihood of `token` under `logits` as llama.cpp's perplexity (without a
/// base file) computes it: `-(logit - max - ln Σ)`, the subtraction of the `f64` logarithm done
/// in `f64`.
pub fn nll(logits: &[f32], token: usize) -> f64 {
    let (max, _) = max_and_argmax(logits);
    let sum = sum_exp(logits, max);
    -(f64::from(logits[token] - max) - sum.ln())
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even, through the `f32` magic-number
/// trick (valid for |x| < 2^22, the range the quantization uses).
pub fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Writes `row` (of [`row_len`] values) as llama.cpp's base-logits rows are written from
/// `logits` (log-probabilities more than 16 below the largest are clamped to the smallest
/// level), and returns the negative log-likelihood of `token` as that path computes it (in
/// `f32`, unlike [`nll`]).
pub fn quantize_row(logits: &[f32], token: usize, row: &mut [u16]) -> f64 {
    let n_vocab = logits.len();
    let mut max = logits[0];
    let mut min = logits[0];
    for &v in &logits[1..] {
        max = max.max(v);
        min = min.min(v);
    }
    let min = min.max(max - 16.0);
    let log_sum_exp = sum_exp(logits, max).ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0f32;
    let (head, q) = row.split_at_mut(4);
    let s = scale.to_bits();
    let m = min_log_prob.to_bits();
    head.copy_from_slice(&[s as u16, (s >> 16) as u16, m as u16, (m >> 16) as u16]);
    if scale != 0.0 {
        let inv_scale = 1.0f32 / scale;
        for (out, &v) in q[..n_vocab].iter_mut().zip(logits) {
            // `as u16` wraps as C's conversion to uint16_t does.
            *out = if v > min {
                nearest_int(inv_scale * (v - min)) as u16
            } else {
                0
            };
        }
    } else {
        q[..n_vocab].fill(0);
    }
    q[n_vocab..].fill(0);
    f64::from(max + log_sum_exp - logits[token])
}

/// A row's scale and smallest log-probability (its first two `f32`).
pub fn row_header(row: &[u16]) -> (f32, f32) {
    let f = |lo: u16, hi: u16| f32::from_bits(u32::from(lo) | (u32::from(hi) << 16));
    (f(row[0], row[1]), f(row[2], row[3]))
}

/// The sums llama.cpp's KL-divergence statistics are computed from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KldSums {
    /// Σ NLL of the model evaluated.
    pub sum_nll: f64,
    /// Σ NLL².
    pub sum_nll2: f64,
    /// Σ NLL of the base model (from the file).
    pub sum_nll_base: f64,
    /// Σ NLL(base)².
    pub sum_nll_base2: f64,
    /// Σ NLL · NLL(base).
    pub sum_nll_nll_base: f64,
    /// Σ KL divergence.
    pub sum_kld: f64,
    /// Σ KL divergence².
    pub sum_kld2: f64,
    /// Σ Δp (probability of the next token, model minus base).
    pub sum_p_diff: f64,
    /// Σ Δp².
    pub sum_p_diff2: f64,
    /// Σ Δp⁴.
    pub sum_p_diff4: f64,
    /// Largest |Δp|.
    pub max_p_diff: f32,
    /// Positions where both models' most likely token is the same.
    pub n_same_top: usize,
    /// Positions.
    pub count: usize,
}

/// Adds one position to `sums`: `logits` of the model evaluated, `base` the base model's row
/// (of [`row_len`] values), `token` the next token. Returns the position's KL divergence and
/// Δp, as llama.cpp keeps them for its percentiles.
pub fn kld_position(logits: &[f32], base: &[u16], token: usize, sums: &mut KldSums) -> (f64, f32) {
    let (mut max, imax) = max_and_argmax(logits);
    let log_sum_exp = sum_exp(logits, max).ln() as f32;
    let (scale, min_log_prob) = row_header(base);
    let q = &base[4..];

    let nll = max + log_sum_exp - logits[token];
    sums.sum_nll += f64::from(nll);
    sums.sum_nll2 += f64::from(nll * nll);
    let nll_base = -(scale * f32::from(q[token]) + min_log_prob);
    sums.sum_nll_base += f64::from(nll_base);
    sums.sum_nll_base2 += f64::from(nll_base * nll_base);
    sums.sum_nll_nll_base += f64::from(nll * nll_base);

    max += log_sum_exp;
    let mut kld = 0.0f64;
    let mut imax_base = 0;
    let mut p_log_base_max = 0.0f32;
    for (i, (&v, &b)) in logits.iter().zip(q).enumerate() {
        let p_log_base = scale * f32::from(b) + min_log_prob;
        if i == 0 || p_log_base > p_log_base_max {
            p_log_base_max = p_log_base;
            imax_base = i;
        }
        if p_log_base > -16.0 {
            let p_base = p_log_base.exp();
            kld += f64::from(p_base * (p_log_base - v + max));
        }
    }
    sums.sum_kld += kld;
    sums.sum_kld2 += kld * kld;
    sums.count += 1;
    if imax == imax_base {
        sums.n_same_top += 1;
    }

    let p_diff = (-nll).exp() - (-nll_base).exp();
    sums.sum_p_diff += f64::from(p_diff);
    let p_diff2 = f64::from(p_diff * p_diff);
    sums.sum_p_diff2 += p_diff2;
    sums.sum_p_diff4 += p_diff2 * p_diff2;
    sums.max_p_diff = sums.max_p_diff.max(p_diff.abs());
    (kld, p_diff)
}

/// Mean and uncertainty of the mean from a sum and a sum of squares (0 for fewer than 11
/// values), as llama.cpp's KL-divergence statistics compute them.
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// Covariance of the means of two series (0 for fewer than 10 values).
pub fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// The `fraction` percentile of sorted `values`, interpolated in `f32` as llama.cpp does.
pub fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let mut p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// The median of sorted `values` (the mean of the middle two for an even count, in `f32`).
pub fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

/// Perplexity and its uncertainty from the NLL sums, as llama.cpp's final estimate:
/// `exp(mean)` and `exp(mean) · sqrt(var / (n - 1))`; `None` when the variance is not positive
/// (llama.cpp then prints an error instead of the estimate).
pub fn ppl_estimate(nll: f64, nll2: f64, count: usize) -> (f64, Option<f64>) {
    let n = count as f64;
    let mean = nll / n;
    let ppl = mean.exp();
    let var = nll2 / n - mean * mean;
    if var > 0.0 {
        (ppl, Some((var / (n - 1.0)).sqrt() * ppl))
    } else {
        (ppl, None)
    }
}
