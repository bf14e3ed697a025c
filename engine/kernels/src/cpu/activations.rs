//! Elementwise activations of the feed-forward blocks and soft-capping, as ggml computes them.

use half::f16;

/// One row of `silu(gate) * up` with ggml's SiLU (its own exp polynomial; see
/// [`super::ggml_order`]), with hardware FMA where the CPU has it (the same exactly rounded
/// results either way: without it every `mul_add` is a call to libm's `fmaf`).
pub fn swiglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked), the only feature it enables.
        return unsafe { swiglu_row_fma(gate, up, out) };
    }
    swiglu_row_body(gate, up, out)
}

/// [`swiglu_row`] with the gate in `x`, overwritten by the result (an in-place op).
pub fn swiglu_row_inplace(x: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked), the only feature it enables.
        return unsafe { swiglu_row_inplace_fma(x, up) };
    }
    swiglu_row_inplace_body(x, up)
}

/// 8 lanes at a time where the CPU has AVX2 (the same bits: `silu`'s operations in each lane;
/// the scalar loop, whose `expf` scales in f64, did not vectorize: SwiGLU was 2% of a SmolLM2
/// prefill on Zen 3, llama.cpp's 0.8%), the rest one by one.
#[inline(always)]
fn swiglu_row_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let done = super::ggml_order::silu_mul_simd(gate, up, out);
    for ((o, &g), &u) in out[done..].iter_mut().zip(&gate[done..]).zip(&up[done..]) {
        *o = super::ggml_order::silu(g) * u;
    }
}

#[inline(always)]
fn swiglu_row_inplace_body(x: &mut [f32], up: &[f32]) {
    let done = super::ggml_order::silu_mul_inplace_simd(x, up);
    for (o, &u) in x[done..].iter_mut().zip(&up[done..]) {
        *o = super::ggml_order::silu(*o) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_row_fma(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_row_body(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_row_inplace_fma(x: &mut [f32], up: &[f32]) {
    swiglu_row_inplace_body(x, up)
}

/// ggml's GELU (tanh approximation) of the gate times `up`, as its CPU GeGLU computes it: the
/// gate rounded to f16, GELU from a table of f16 results ([`gelu_f16_table`]), 0 below -10 and
/// the identity above 10.
#[inline(always)]
pub fn geglu(gate: f32, up: f32) -> f32 {
    if gate <= -10.0 {
        0.0
    } else if gate >= 10.0 {
        gate * up
    } else {
        gelu_f16(gate) * up
    }
}

/// One row of [`geglu`]: `out[i] = geglu(gate[i], up[i])`, 8 at a time with F16C where the
/// CPU has it (the same bits: the f16 roundings are the same round-to-nearest-even either way).
pub fn geglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    #[allow(unused_mut)] // no SIMD path off x86-64
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C (checked); lengths are n for all three.
        done = unsafe { geglu_row_f16c(&gate[..n], &up[..n], &mut out[..n]) };
    }
    for ((o, &g), &u) in out[done..n]
        .iter_mut()
        .zip(&gate[done..n])
        .zip(&up[done..n])
    {
        *o = geglu(g, u);
    }
}

/// [`geglu_row`] with the gate in `x`, overwritten by the result (an in-place op).
pub fn geglu_row_inplace(x: &mut [f32], up: &[f32]) {
    let n = x.len().min(up.len());
    for chunk in (0..n).step_by(64) {
        let end = (chunk + 64).min(n);
        let mut gate = [0.0f32; 64];
        gate[..end - chunk].copy_from_slice(&x[chunk..end]);
        geglu_row(&gate[..end - chunk], &up[chunk..end], &mut x[chunk..end]);
    }
}

/// [`geglu_row`]'s whole 8-lane chunks with AVX2 + F16C; returns how many elements it did.
///
/// # Safety
/// The CPU has AVX2 and F16C; `gate`, `up` and `out` have one length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu_row_f16c(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let t = gelu_f16_table();
    let full = out.len() - out.len() % 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= full <= every length; loadu/storeu need no alignment.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let mut h = [0u16; 8];
            _mm_storeu_si128(
                h.as_mut_ptr().cast(),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(g),
            );
            let looked = h.map(|b| t[usize::from(b)]);
            let v = _mm256_cvtph_ps(_mm_loadu_si128(looked.as_ptr().cast()));
            // In range: table * up; at or above 10: gate * up; at or below -10: 0 (NaN
            // compares false both ways and takes the table, as `geglu` does).
            let r = _mm256_blendv_ps(
                _mm256_mul_ps(v, u),
                _mm256_mul_ps(g, u),
                _mm256_cmp_ps::<_CMP_GE_OQ>(g, hi),
            );
            let r = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(g, lo), r);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), r);
        }
        i += 8;
    }
    full
}

/// `f16(gelu_tanh(f16(x)))` widened to f32, looked up in [`gelu_f16_table`].
#[inline(always)]
pub fn gelu_f16(x: f32) -> f32 {
    let t = gelu_f16_table();
    super::block::f16_bits_to_f32(t[usize::from(f16::from_f32(x).to_bits())])
}

/// The GELU (tanh approximation) of every f16 value, rounded to f16, by bit pattern: what
/// ggml's `ggml_table_gelu_f16` holds. Built on first use (65,536 `tanhf`, about a millisecond)
/// in static storage, so that a GeGLU costs a lookup per element instead of a `tanhf` (which was
/// a seventh of a Gemma-class model's prefill).
pub fn gelu_f16_table() -> &'static [u16; 1 << 16] {
    static TABLE: std::sync::OnceLock<[u16; 1 << 16]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0u16; 1 << 16];
        for (bits, e) in t.iter_mut().enumerate() {
            let x = f16::from_bits(bits as u16).to_f32();
            *e = f16::from_f32(gelu_tanh_f32(x)).to_bits();
        }
        t
    })
}

/// `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))` in f32, operation by operation as ggml's
/// `ggml_gelu_f32`.
#[inline(always)]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// `cap * tanh(score / cap)` as ggml computes it (scale by 1/cap, tanh, scale by cap), or the
/// score unchanged without a cap.
#[inline(always)]
pub fn soft_cap(score: f32, cap: Option<f32>) -> f32 {
    match cap {
        Some(c) => (score * (1.0 / c)).tanh() * c,
        None => score,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The in-place and the out-of-place SwiGLU (8 lanes at a time where the CPU has AVX2)
    /// both equal `silu(g) * u` computed one element at a time, bit for bit: odd lengths, gates
    /// from -120 to 120 (exponentials that overflow, underflow and go subnormal), zeros,
    /// infinities and NaN.
    #[test]
    fn swiglu_in_place_equals_out_of_place() {
        let mut r = Rng::new(5);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for n in [1usize, 7, 16, 33, 1000] {
            for scale in [8.0f32, 120.0] {
                let (mut g, u) = (r.vec(n, scale), r.vec(n, 2.0));
                if n > 8 {
                    g[..6].copy_from_slice(&[
                        0.0,
                        -0.0,
                        f32::INFINITY,
                        -f32::INFINITY,
                        1e-40,
                        -88.5,
                    ]);
                    g[n - 1] = f32::NAN;
                }
                let mut out = vec![0.0; n];
                swiglu_row(&g, &u, &mut out);
                let mut x = g.clone();
                swiglu_row_inplace(&mut x, &u);
                let want: Vec<f32> = (0..n)
                    .map(|i| super::super::ggml_order::silu(g[i]) * u[i])
                    .collect();
                assert_eq!(bits(&out), bits(&want), "out of place, n {n}");
                assert_eq!(bits(&x), bits(&want), "in place, n {n}");
            }
        }
    }

    #[test]
    fn soft_cap_bounds_and_passes_through() {
        assert_eq!(soft_cap(3.0, None), 3.0);
        assert!(soft_cap(1e6, Some(30.0)) <= 30.0);
        assert!((soft_cap(0.5, Some(50.0)) - 0.5).abs() < 1e-4);
        assert_eq!(geglu(-11.0, 2.0), 0.0);
        assert_eq!(geglu(11.0, 2.0), 22.0);
    }

    /// The table gives, for every gate in (-10, 10), what computing the f16-rounded GELU
    /// directly gives (the formula this file had before the table).
    #[test]
    fn geglu_table_equals_the_direct_formula() {
        let direct = |gate: f32, up: f32| {
            let x = f16::from_f32(gate).to_f32();
            f16::from_f32(gelu_tanh_f32(x)).to_f32() * up
        };
        let mut r = Rng::new(17);
        for _ in 0..20_000 {
            let (g, u) = (r.f32(12.0), r.f32(2.0));
            let want = if g <= -10.0 {
                0.0
            } else if g >= 10.0 {
                g * u
            } else {
                direct(g, u)
            };
            assert_eq!(geglu(g, u).to_bits(), want.to_bits(), "gate {g} up {u}");
        }
        // Every f16 gate in range, exactly.
        for bits in 0..=u16::MAX {
            let g = f16::from_bits(bits).to_f32();
            if g > -10.0 && g < 10.0 {
                assert_eq!(
                    geglu(g, 1.5).to_bits(),
                    direct(g, 1.5).to_bits(),
                    "{bits:#x}"
                );
            }
        }
        // Rows (SIMD chunks and tails, in place or not) equal the element function, edges
        // included.
        for n in [1usize, 7, 8, 17, 64, 100, 2048] {
            let mut g = r.vec(n, 12.0);
            let u = r.vec(n, 2.0);
            for (k, e) in [
                -10.0f32, 10.0, -10.000001, 9.99999, 0.0, -0.0, 65504.0, -7e4,
            ]
            .into_iter()
            .enumerate()
            {
                if k < n {
                    g[k] = e;
                }
            }
            let want: Vec<u32> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| geglu(a, b).to_bits())
                .collect();
            let mut out = vec![f32::NAN; n];
            geglu_row(&g, &u, &mut out);
            assert_eq!(
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want,
                "n {n}"
            );
            let mut x = g.clone();
            geglu_row_inplace(&mut x, &u);
            assert_eq!(
                x.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want,
                "in place n {n}"
            );
        }
    }
}
