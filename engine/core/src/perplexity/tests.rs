//! The numerics against closed forms; the base file's layout against its specification.

use super::base_file::{BaseHeader, BaseReader, BaseWriter};
use super::numerics::*;
use super::report::{final_estimate, running_ppl};
use super::*;

#[test]
fn nll_is_the_negative_log_softmax() {
    // p = (1/4, 3/4)
    let logits = [0.0f32, 3.0f32.ln()];
    assert!((nll(&logits, 1) - -(0.75f64).ln()).abs() < 1e-7);
    assert!((nll(&logits, 0) - 4.0f64.ln()).abs() < 1e-7);
    // Shift invariance: the maximum is subtracted first.
    let shifted = [1000.0f32, 1000.0 + 3.0f32.ln()];
    assert!((nll(&shifted, 1) - -(0.75f64).ln()).abs() < 1e-4);
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for (x, want) in [
        (0.5f32, 0),
        (1.5, 2),
        (2.5, 2),
        (3.49, 3),
        (65534.6, 65535),
        (0.0, 0),
    ] {
        assert_eq!(nearest_int(x), want, "{x}");
    }
    let mut x = 0.013f32;
    while x < 65535.0 {
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
        x = x * 1.37 + 0.11;
    }
}

#[test]
fn rows_are_padded_to_an_even_vocabulary() {
    assert_eq!(row_len(49152), 49156);
    assert_eq!(row_len(5), 10);
}

#[test]
fn quantized_rows_hold_the_log_probabilities() {
    let logits: Vec<f32> = (0..101)
        .map(|i| ((i * 37) % 101) as f32 * 0.3 - 12.0)
        .collect();
    let mut row = vec![0xffffu16; row_len(logits.len())];
    let v = quantize_row(&logits, 7, &mut row);
    let max = logits.iter().copied().fold(f32::MIN, f32::max);
    let lse: f64 = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>()
        .ln();
    let (scale, min_log_prob) = row_header(&row);
    assert!((scale - 16.0 / 65535.0).abs() < 1e-9, "{scale}");
    for (i, &l) in logits.iter().enumerate() {
        let exact = f64::from(l - max) - lse;
        let got = f64::from(scale * f32::from(row[4 + i]) + min_log_prob);
        if exact > -16.0 - lse {
            assert!(
                (got - exact).abs() <= f64::from(scale) * 0.5 + 1e-5,
                "{i}: {got} vs {exact}"
            );
        } else {
            assert_eq!(row[4 + i], 0, "{i}: clamped to the lowest level");
        }
    }
    assert_eq!(row[4 + 101], 0, "padding");
    assert!((v - nll(&logits, 7)).abs() < 1e-5);
}

#[test]
fn kld_against_closed_forms() {
    // Base p = (1/2, 1/2) (equal logits: scale 0, every level the smallest log-probability),
    // model q = (1/4, 3/4): KL(p || q) = 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3).
    let mut base = vec![0u16; row_len(2)];
    quantize_row(&[0.0, 0.0], 0, &mut base);
    let mut sums = KldSums::default();
    let (kld, p_diff) = kld_position(&[0.0, 3.0f32.ln()], &base, 1, &mut sums);
    assert!((kld - 0.5 * (4.0f64 / 3.0).ln()).abs() < 1e-6, "{kld}");
    assert!((f64::from(p_diff) - 0.25).abs() < 1e-6);
    assert!((sums.sum_nll - -(0.75f64).ln()).abs() < 1e-6);
    assert!((sums.sum_nll_base - 2.0f64.ln()).abs() < 1e-6);
    assert_eq!(
        (sums.count, sums.n_same_top),
        (1, 0),
        "top: token 0 for the base (first of a tie), 1 for the model"
    );
    // A model against its own quantized row: KLD ~ 0, off by at most the quantization's half
    // step (a range of 16 in 65535 levels) in the log-probabilities; same top.
    let logits: Vec<f32> = (0..500)
        .map(|i| ((i * 7919) % 500) as f32 * 0.04 - 9.0)
        .collect();
    let mut row = vec![0u16; row_len(500)];
    quantize_row(&logits, 3, &mut row);
    let mut sums = KldSums::default();
    let (kld, p_diff) = kld_position(&logits, &row, 3, &mut sums);
    let half_step = 0.5 * 16.0 / 65535.0;
    assert!(kld.abs() < half_step, "{kld}");
    assert!(f64::from(p_diff.abs()) < half_step);
    assert_eq!(sums.n_same_top, 1);
}

#[test]
fn statistics_against_hand_computed_values() {
    // NLLs 1, 2, 3: mean 2, variance 2/3, uncertainty sqrt(2/3 / 2) · e².
    let (ppl, unc) = ppl_estimate(6.0, 14.0, 3);
    let e2 = 2.0f64.exp();
    assert!((ppl - e2).abs() < 1e-12);
    assert!((unc.unwrap() - (1.0f64 / 3.0).sqrt() * e2).abs() < 1e-12);
    assert_eq!(ppl_estimate(6.0, 12.0, 3).1, None, "no variance");
    let v = [1.0f32, 2.0, 3.0, 4.0, 5.0];
    assert_eq!(percentile(&v, 0.5), 3.0);
    assert!((percentile(&v, 0.9) - 4.6).abs() < 1e-5);
    assert_eq!(percentile(&v, 0.0), 1.0);
    assert_eq!(percentile(&v, 1.0), 5.0);
    assert_eq!(median(&v), 3.0);
    assert_eq!(median(&v[..4]), 2.5);
    // Fewer than 11 values: no uncertainty.
    assert_eq!(mean_and_uncertainty(10.0, 30.0, 5), (2.0, 0.0));
    let (m, u) = mean_and_uncertainty(66.0, 506.0, 11); // 1..=11
    assert_eq!(m, 6.0);
    assert!((u - (10.0f64 / 10.0).sqrt()).abs() < 1e-12, "{u}");
    assert_eq!(covariance(1.0, 1.0, 1.0, 9), 0.0);
}

#[test]
fn lines_use_llama_cpps_formats() {
    assert_eq!(running_ppl(3, 12.345_67), "[3]12.3457,");
    assert_eq!(
        final_estimate(6.0, 14.0, 3),
        "Final estimate: PPL = 7.3891 +/- 4.26607"
    );
}

#[test]
fn chunking_needs_two_chunks_of_text() {
    assert_eq!(n_chunks(2599, 512, None).unwrap(), 5);
    assert_eq!(n_chunks(2599, 512, Some(2)).unwrap(), 2);
    assert_eq!(n_chunks(1024, 512, None).unwrap(), 2);
    let e = n_chunks(1023, 512, None).unwrap_err().to_string();
    assert!(
        e.contains("1023 tokens") && e.contains("at least 1024"),
        "{e}"
    );
    assert!(n_chunks(100, 2, None).is_err());
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("edge-run-ppl-{}-{name}", std::process::id()))
}

#[test]
fn base_files_have_llama_cpps_layout() {
    let header = BaseHeader {
        n_ctx: 8,
        n_vocab: 5,
        n_chunks: 2,
    };
    let tokens: Vec<u32> = (0..17).map(|i| i % 5).collect();
    let path = temp_path("layout");
    let mut w = BaseWriter::create(&path, &header, &tokens).unwrap();
    let rows = header.rows_per_chunk() * header.n_chunks;
    assert_eq!(header.rows_per_chunk(), 3);
    for r in 0..rows {
        let row: Vec<u16> = (0..row_len(5)).map(|i| (r * 100 + i) as u16).collect();
        w.write_row(&row).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, header.file_size().unwrap());
    assert_eq!(bytes.len(), 20 + 4 * 16 + 2 * 10 * rows);
    assert_eq!(&bytes[..8], b"_logits_");
    assert_eq!(&bytes[8..20], &[8, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(&bytes[20..28], &[0, 0, 0, 0, 1, 0, 0, 0]);
    let first_row = 20 + 64;
    assert_eq!(&bytes[first_row..first_row + 4], &[0, 0, 1, 0]);
    let mut r = BaseReader::open(&path, 5).unwrap();
    assert_eq!(r.header, header);
    assert_eq!(r.tokens, &tokens[..16]);
    let mut row = vec![0u16; 10];
    r.read_row(&mut row).unwrap();
    assert_eq!(row, (0..10).collect::<Vec<u16>>());
    let e = BaseReader::open(&path, 6).unwrap_err().to_string();
    assert!(
        e.contains("vocabulary of 5 tokens") && e.contains("has 6"),
        "{e}"
    );
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let e = BaseReader::open(&path, 5).unwrap_err().to_string();
    assert!(e.contains("implies") && e.contains("truncated"), "{e}");
    std::fs::write(&path, b"_logitz_AAAAAAAAAAAAAAAAAA").unwrap();
    let e = BaseReader::open(&path, 5).unwrap_err().to_string();
    assert!(e.contains("_logits_"), "{e}");
    std::fs::write(&path, b"short").unwrap();
    assert!(BaseReader::open(&path, 5).is_err());
    let _ = std::fs::remove_file(&path);
}
