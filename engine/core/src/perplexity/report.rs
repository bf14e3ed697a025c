//! The lines llama.cpp's `llama-perplexity` prints, with its printf formats: the running
//! perplexity after each chunk, the final estimate, the KL-divergence table rows and its final
//! statistics.

use super::numerics::{
    covariance, mean_and_uncertainty, median, percentile, ppl_estimate, KldSums,
};

/// The running perplexity after chunk `index` (1-based), as llama.cpp prints it: `[1]12.3456,`.
pub fn running_ppl(index: usize, ppl: f64) -> String {
    format!("[{index}]{ppl:.4},")
}

/// `Final estimate: PPL = X +/- Y` from the NLL sums, or llama.cpp's error line when the
/// variance is not positive.
pub fn final_estimate(nll: f64, nll2: f64, count: usize) -> String {
    match ppl_estimate(nll, nll2, count) {
        (ppl, Some(unc)) => format!("Final estimate: PPL = {ppl:.4} +/- {unc:.5}"),
        (_, None) => "Unexpected negative standard deviation of log(prob)".to_string(),
    }
}

/// The header of the per-chunk KL-divergence table.
pub const KLD_TABLE_HEADER: &str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

struct Figures {
    log_ppl: (f64, f64),
    log_ppl_base: (f64, f64),
    log_ppl_cov: f64,
    kl_div: (f64, f64),
    p_diff_rms: (f64, f64),
    same_top: (f64, f64),
}

fn figures(s: &KldSums) -> Figures {
    let log_ppl = mean_and_uncertainty(s.sum_nll, s.sum_nll2, s.count);
    let log_ppl_base = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, s.count);
    let log_ppl_cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count);
    let kl_div = mean_and_uncertainty(s.sum_kld, s.sum_kld2, s.count);
    let p_diff_mse = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, s.count);
    let rms = p_diff_mse.0.sqrt();
    let p_top = s.n_same_top as f64 / s.count as f64;
    Figures {
        log_ppl,
        log_ppl_base,
        log_ppl_cov,
        kl_div,
        p_diff_rms: (rms, 0.5 / rms * p_diff_mse.1),
        same_top: (
            p_top,
            (p_top * (1.0 - p_top) / (s.count as f64 - 1.0)).sqrt(),
        ),
    }
}

fn log_ratio(f: &Figures) -> (f64, f64) {
    let (a, b) = (f.log_ppl, f.log_ppl_base);
    (
        a.0 - b.0,
        (a.1 * a.1 + b.1 * b.1 - 2.0 * f.log_ppl_cov).sqrt(),
    )
}

/// One row of the table after chunk `index` (1-based), from the sums so far.
pub fn kld_chunk_line(index: usize, s: &KldSums) -> String {
    let f = figures(s);
    let ppl = f.log_ppl.0.exp();
    let ratio = log_ratio(&f);
    format!(
        "{index:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
        ppl,
        ppl * f.log_ppl.1,
        ratio.0,
        ratio.1,
        f.kl_div.0,
        f.kl_div.1,
        100.0 * f.p_diff_rms.0,
        100.0 * f.p_diff_rms.1,
        100.0 * f.same_top.0,
        100.0 * f.same_top.1,
    )
}

/// The final statistics (perplexity, KL divergence, token probability), as llama.cpp prints
/// them; `kld_values` and `p_diff_values` are every position's values, sorted here. Empty for
/// fewer than 100 positions (llama.cpp prints none then either).
pub fn kld_summary(s: &KldSums, kld_values: &mut [f32], p_diff_values: &mut [f32]) -> Vec<String> {
    if s.count < 100 || kld_values.is_empty() || p_diff_values.is_empty() {
        return Vec::new();
    }
    kld_values.sort_by(f32::total_cmp);
    p_diff_values.sort_by(f32::total_cmp);
    let f = figures(s);
    let mut out = Vec::with_capacity(48);
    out.push("====== Perplexity statistics ======".to_string());
    let ppl = f.log_ppl.0.exp();
    let ppl_unc = ppl * f.log_ppl.1;
    out.push(format!(
        "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
    ));
    let ppl_base = f.log_ppl_base.0.exp();
    let ppl_base_unc = ppl_base * f.log_ppl_base.1;
    out.push(format!(
        "Mean PPL(base)                : {ppl_base:10.6} ± {ppl_base_unc:10.6}"
    ));
    let cor = f.log_ppl_cov / (f.log_ppl.1 * f.log_ppl_base.1);
    out.push(format!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * cor
    ));
    let ratio = log_ratio(&f);
    out.push(format!(
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
        ratio.0, ratio.1
    ));
    let ppl_ratio = ratio.0.exp();
    out.push(format!(
        "Mean PPL(Q)/PPL(base)         : {ppl_ratio:10.6} ± {:10.6}",
        ppl_ratio * ratio.1
    ));
    let ppl_cov = ppl * ppl_base * f.log_ppl_cov;
    let diff_unc = (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt();
    out.push(format!(
        "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
        ppl - ppl_base
    ));
    out.push(String::new());

    out.push("====== KL divergence statistics ======".to_string());
    out.push(format!(
        "Mean    KLD: {:10.6} ± {:10.6}",
        f.kl_div.0, f.kl_div.1
    ));
    let k = &*kld_values;
    out.push(format!("Maximum KLD: {:10.6}", k[k.len() - 1]));
    for (label, fr) in [
        ("99.9%", 0.999f32),
        ("99.0%", 0.990),
        ("95.0%", 0.950),
        ("90.0%", 0.900),
    ] {
        out.push(format!("{label}   KLD: {:10.6}", percentile(k, fr)));
    }
    out.push(format!("Median  KLD: {:10.6}", median(k)));
    for (label, fr) in [
        ("10.0%", 0.100f32),
        (" 5.0%", 0.050),
        (" 1.0%", 0.010),
        (" 0.1%", 0.001),
    ] {
        out.push(format!("{label}   KLD: {:10.6}", percentile(k, fr)));
    }
    out.push(format!("Minimum KLD: {:10.6}", k[0]));
    out.push(String::new());

    out.push("====== Token probability statistics ======".to_string());
    let p_diff = mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2, s.count);
    out.push(format!(
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * p_diff.0,
        100.0 * p_diff.1
    ));
    let p = &*p_diff_values;
    let pct = |v: f32| 100.0 * f64::from(v);
    out.push(format!("Maximum Δp: {:6.3}%", pct(p[p.len() - 1])));
    for (label, fr) in [
        ("99.9%", 0.999f32),
        ("99.0%", 0.990),
        ("95.0%", 0.950),
        ("90.0%", 0.900),
        ("75.0%", 0.750),
    ] {
        out.push(format!("{label}   Δp: {:6.3}%", pct(percentile(p, fr))));
    }
    out.push(format!("Median  Δp: {:6.3}%", pct(median(p))));
    for (label, fr) in [
        ("25.0%", 0.250f32),
        ("10.0%", 0.100),
        (" 5.0%", 0.050),
        (" 1.0%", 0.010),
        (" 0.1%", 0.001),
    ] {
        out.push(format!("{label}   Δp: {:6.3}%", pct(percentile(p, fr))));
    }
    out.push(format!("Minimum Δp: {:6.3}%", pct(p[0])));
    out.push(format!(
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * f.p_diff_rms.0,
        100.0 * f.p_diff_rms.1
    ));
    out.push(format!(
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * f.same_top.0,
        100.0 * f.same_top.1
    ));
    out
}
