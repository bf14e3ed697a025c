//! `edge-run bench`: prompt processing (ppN: one prefill of N tokens) and generation (tgN: N
//! single-token steps, greedy) in tokens/s, mean and standard deviation over repetitions, as
//! llama-bench reports them, optionally after D tokens of context (`-d`, "ppN @ dD");
//! `--bandwidth` adds the decode speed memory allows.

use std::sync::Arc;
use std::time::Instant;

use edge_engine::error::EngineError;
use edge_engine::generate::GenerateOptions;
use edge_engine::session::{Session, SessionConfig};

use crate::args::BenchArgs;
use crate::errors::{hint, load_model, refuse_encoder, CliError, CliResult};
use crate::output::{mib, write_lines};
use crate::session::resolve_device;

/// Text cycled for the prompt processing test (its token ids; no sampling involved).
const BENCH_TEXT: &str =
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles \
begins with a single step. To be or not to be, that is the question. All that glitters is not \
gold, and not all those who wander are lost. In the beginning the universe was created. ";

/// Mean and sample standard deviation (n - 1; 0 for one sample), as llama-bench reports them.
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// `edge-run bench`: prompt processing and generation speed, as llama-bench measures them.
pub fn bench(a: BenchArgs) -> CliResult {
    let model = Arc::new(load_model(&a.model)?);
    refuse_encoder(&a.model, &model)?;
    let n_ctx_train = model.params.n_ctx_train;
    let need = a.n_depth + a.n_prompt.max(a.n_gen + 1);
    if need > n_ctx_train {
        return Err(CliError::usage(format!(
            "-d {} / -p {} / -n {} need {need} context positions but the model was trained for {n_ctx_train}: use smaller values",
            a.n_depth, a.n_prompt, a.n_gen
        )));
    }
    let ctx = (a.n_depth + a.n_prompt.max(a.n_gen + 1) + 16).min(n_ctx_train);
    let tok = &model.tokenizer;
    let text_ids = tok
        .encode(BENCH_TEXT, false, false)
        .map_err(|e| format!("tokenizing the benchmark text: {e}"))?;
    if text_ids.is_empty() {
        return Err(format!(
            "{}: the tokenizer gives no tokens for the benchmark text",
            a.model.display()
        )
        .into());
    }
    let first = if tok.add_bos() { tok.bos_id() } else { None };
    // The depth's tokens (BOS first), then the test's: the text continues where it stopped.
    let tokens: Vec<u32> = first
        .into_iter()
        .chain(text_ids.iter().copied().cycle())
        .take(a.n_depth + a.n_prompt)
        .collect();
    let (depth, prompt) = tokens.split_at(a.n_depth);
    let gen_start = if a.n_depth == 0 {
        first.unwrap_or(text_ids[0])
    } else {
        prompt[0]
    };
    let cfg = SessionConfig {
        ctx: Some(ctx),
        ubatch: None,
        threads: a.compute.threads,
        device: resolve_device(a.compute.device, &model)?,
        ..Default::default()
    };
    let mut session = Session::new(Arc::clone(&model), &cfg).map_err(|e| match e {
        EngineError::Device(_) => format!(
            "cannot set up the session on {}: {} (use --device cpu)",
            cfg.device.name(),
            hint(&e)
        ),
        e => format!(
            "cannot set up the session: {} (try smaller -p/-n)",
            hint(&e)
        ),
    })?;
    let threads = session.n_threads();

    let mut pp_rates = Vec::new();
    let mut tg_rates = Vec::new();
    // repetition 0 is the untimed warm-up
    // The context every test starts from: prefilled once (untimed), each repetition cut back
    // to it, as llama-bench's `-d`.
    // A sliding-window model may refuse the cut once its ring rows were overwritten: then the
    // depth is processed again.
    let at_depth = |session: &mut Session| -> Result<(), EngineError> {
        let n = depth.len();
        if n > 0 && session.n_past() >= n && session.truncate(n).is_ok() {
            return Ok(());
        }
        session.reset();
        if n > 0 {
            session.advance(depth)?;
        }
        Ok(())
    };
    for rep in 0..=a.repetitions {
        at_depth(&mut session)?;
        let t = Instant::now();
        // No logits are fetched (on a GPU they stay on the device), as llama-bench's pp test.
        session.advance(prompt)?;
        let s = t.elapsed().as_secs_f64();
        if rep > 0 {
            pp_rates.push(a.n_prompt as f64 / s.max(1e-9));
        }
        log::info!("pp{} run {rep}: {:.1} ms", a.n_prompt, s * 1e3);
    }
    // tgN: N single-token steps after a one-token prompt, greedy, through the generator (the
    // token it samples from the prompt is emitted first, without a step: untimed).
    let greedy = GenerateOptions {
        stop_at_eog: false,
        ..GenerateOptions::greedy(a.n_gen + 1)
    };
    for rep in 0..=a.repetitions {
        at_depth(&mut session)?;
        let mut gen = session.generator(&[gen_start], &greedy)?;
        gen.next().transpose()?;
        let t = Instant::now();
        for token in gen.by_ref() {
            token?;
        }
        let s = t.elapsed().as_secs_f64();
        if gen.n_tokens() != a.n_gen + 1 {
            return Err(format!(
                "the generation test stopped after {} of {} tokens ({:?})",
                gen.n_tokens().saturating_sub(1),
                a.n_gen,
                gen.result().stop_reason
            )
            .into());
        }
        if rep > 0 {
            tg_rates.push(a.n_gen as f64 / s.max(1e-9));
        }
        log::info!("tg{} run {rep}: {:.1} ms", a.n_gen, s * 1e3);
    }
    let (pp, pp_sd) = mean_sd(&pp_rates);
    let (tg, tg_sd) = mean_sd(&tg_rates);
    let isa = session.backend_name();
    // Decode reads every matmul weight once per token: bandwidth / those bytes is its limit.
    let bandwidth = a.bandwidth.then(|| {
        let graph = model.build_graph(1);
        let regions = edge_engine::bandwidth::matmul_weights(&model, &graph);
        let bytes: usize = regions.iter().map(|r| r.len()).sum();
        let bw = edge_engine::bandwidth::read_bandwidth(&regions, threads, 5);
        let limit = bw / bytes.max(1) as f64;
        (bytes, bw, limit, tg / limit.max(1e-9))
    });
    let size: u64 = model.gguf().tensors().iter().map(|t| t.n_bytes).sum();
    let n_params: u64 = model.gguf().tensors().iter().map(|t| t.n_elements).sum();
    let name = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.model.display().to_string());
    if a.json {
        let v = serde_json::json!({
            "model": name,
            "size_bytes": size,
            "n_params": n_params,
            "threads": threads,
            "isa": isa,
            "p": a.n_prompt,
            "n": a.n_gen,
            "d": a.n_depth,
            "r": a.repetitions,
            "ctx": ctx,
            "pp": pp,
            "pp_sd": pp_sd,
            "tg": tg,
            "tg_sd": tg_sd,
            "pp_samples": pp_rates,
            "tg_samples": tg_rates,
        });
        let mut v = v;
        if let Some((bytes, bw, limit, frac)) = bandwidth {
            v["weights_per_token_bytes"] = bytes.into();
            v["read_bandwidth_gbs"] = (bw / 1e9).into();
            v["tg_limit"] = limit.into();
            v["tg_fraction_of_limit"] = frac.into();
        }
        return write_lines(&[v.to_string()]);
    }
    let header = ["model", "size", "params", "isa", "threads", "test", "t/s"];
    // llama-bench's test names: "pp512", or "pp512 @ d4096" at a depth.
    let at = if a.n_depth > 0 {
        format!(" @ d{}", a.n_depth)
    } else {
        String::new()
    };
    let rows: Vec<[String; 7]> = [
        (format!("pp{}{at}", a.n_prompt), pp, pp_sd),
        (format!("tg{}{at}", a.n_gen), tg, tg_sd),
    ]
    .into_iter()
    .map(|(test, mean, sd)| {
        [
            name.clone(),
            mib(size),
            format!("{:.2} M", n_params as f64 / 1e6),
            isa.to_string(),
            threads.to_string(),
            test,
            format!("{mean:.2} ± {sd:.2}"),
        ]
    })
    .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let fmt_row = |cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                let pad = w - c.chars().count();
                if i == 0 {
                    format!("{c}{}", " ".repeat(pad))
                } else {
                    format!("{}{c}", " ".repeat(pad))
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    let mut lines = vec![fmt_row(header.iter().map(|h| h.to_string()).collect())];
    lines.push(format!(
        "|{}|",
        widths
            .iter()
            .enumerate()
            .map(|(i, &w)| if i == 0 {
                format!(" {} ", "-".repeat(w))
            } else {
                format!(" {}: ", "-".repeat(w - 1))
            })
            .collect::<Vec<_>>()
            .join("|")
    ));
    for r in rows {
        lines.push(fmt_row(r.to_vec()));
    }
    if let Some((bytes, bw, limit, frac)) = bandwidth {
        lines.push(format!(
            "decode reads {} of weights per token; streaming them with {threads} thread(s) reads {:.2} GB/s: a limit of {limit:.1} tok/s, tg{}{at} reaches {:.0}% of it",
            mib(bytes as u64),
            bw / 1e9,
            a.n_gen,
            frac * 100.0
        ));
    }
    write_lines(&lines)
}
