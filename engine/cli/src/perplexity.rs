//! `edge-run perplexity`: a model's perplexity over a text, or its KL divergence from a base
//! model's saved log-probabilities, through the library's [`edge_engine::perplexity`]. Results
//! go to stdout in llama-perplexity's format; progress goes to stderr.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use edge_engine::error::EngineError;
use edge_engine::kv::KvType;
use edge_engine::model::Model;
use edge_engine::perplexity::{self as ppl, report, BaseReader, ChunkDone};
use edge_engine::session::SessionConfig;

use crate::args::{PerplexityArgs, PERPLEXITY_DEFAULT_CTX};
use crate::errors::{hint, load_model, CliError, CliResult};
use crate::output::read_text;
use crate::session::{open_session, resolve_device};
use crate::signals::{interrupt_flag, EXIT_INTERRUPTED};

fn write_err(e: std::io::Error) -> CliError {
    CliError::from(format!("writing output: {e}"))
}

/// The text of `-f`, tokenized as llama-perplexity does (BOS as the model adds it; special-token
/// text is plain text).
fn read_tokens(model: &Model, file: Option<&Path>) -> CliResult<Vec<u32>> {
    let Some(f) = file else {
        return Err(CliError::usage(
            "no text given: use -f FILE (or --kl-divergence with --kl-divergence-base FILE)",
        ));
    };
    let handle = std::fs::File::open(f)
        .map_err(|e| format!("{}: cannot read the text file: {e}", f.display()))?;
    let text = read_text(handle, &format!("the text file {}", f.display()))?;
    model
        .tokenize(&text, true, false)
        .map_err(|e| format!("tokenizing {}: {}", f.display(), hint(&e)).into())
}

/// A progress line on stderr after each chunk: time per chunk and what is left.
fn progress(done: &ChunkDone, started: std::time::Instant) {
    let elapsed = started.elapsed().as_secs_f64();
    let left = elapsed / done.index as f64 * (done.n_chunks - done.index) as f64;
    eprintln!(
        "[edge-run] perplexity: chunk {}/{} in {:.2} s; {:.1} s elapsed, about {:.0} s left",
        done.index, done.n_chunks, done.seconds, elapsed, left
    );
}

/// Runs `edge-run perplexity`; returns the exit status (0, or 130 after Ctrl-C).
pub fn perplexity(a: PerplexityArgs) -> CliResult<u8> {
    let model = Arc::new(load_model(&a.model)?);
    let n_ctx_train = model.params.n_ctx_train;
    // With --kl-divergence the chunks are the base file's.
    let mut base = None;
    let (tokens, ctx) = if a.kl_divergence {
        let path = a.kl_divergence_base.as_deref().unwrap_or(Path::new(""));
        let reader = BaseReader::open(path, model.n_vocab()).map_err(|e| match e {
            EngineError::InvalidArgument(_) => CliError::usage(hint(&e)),
            e => CliError::from(format!("--kl-divergence-base: {}", hint(&e))),
        })?;
        let ctx = reader.header.n_ctx;
        if let Some(c) = a.ctx.filter(|&c| c != ctx) {
            return Err(CliError::usage(format!(
                "-c {c}: {} was written with chunks of {ctx} tokens; leave -c out (or use -c {ctx})",
                path.display()
            )));
        }
        if a.file.is_some() {
            log::warn!("-f is not read with --kl-divergence: the base file holds the tokens");
        }
        base = Some(reader);
        (Vec::new(), ctx)
    } else {
        let ctx = a.ctx.unwrap_or(PERPLEXITY_DEFAULT_CTX);
        (read_tokens(&model, a.file.as_deref())?, ctx)
    };
    if ctx < ppl::MIN_CTX || ctx > n_ctx_train {
        return Err(CliError::usage(format!(
            "-c {ctx}: chunks must be {} to {n_ctx_train} tokens (the model's trained context)",
            ppl::MIN_CTX
        )));
    }
    let n_chunks = match &base {
        Some(b) => a
            .chunks
            .map_or(b.header.n_chunks, |c| c.min(b.header.n_chunks)),
        None => {
            if tokens.len() < ppl::min_tokens(ctx) {
                let f = a.file.as_deref().unwrap_or(Path::new("")).display();
                return Err(CliError::usage(format!(
                    "{f} has {} tokens, but perplexity with -c {ctx} needs at least {} (two chunks of {ctx}): give a longer text or a smaller -c",
                    tokens.len(),
                    ppl::min_tokens(ctx)
                )));
            }
            ppl::n_chunks(tokens.len(), ctx, a.chunks).map_err(|e| CliError::usage(hint(&e)))?
        }
    };
    let cfg = SessionConfig {
        ctx: Some(ctx),
        ubatch: Some(a.batch.min(ctx)),
        threads: a.compute.threads,
        kv_type: KvType::F16,
        flash_attn: false,
        device: resolve_device(a.compute.device, &model)?,
        cuda_weights: None,
    };
    let mut session = open_session(&model, &cfg, None)?;
    let interrupted = interrupt_flag()?;
    session.set_interrupt(Arc::clone(&interrupted));
    eprintln!(
        "[edge-run] perplexity: {} chunks of {ctx} tokens ({} scored each), {} per pass for the context half, {} threads, {}",
        n_chunks,
        ctx - 1 - ctx / 2,
        session.ubatch(),
        session.n_threads(),
        session.backend_name()
    );
    let started = std::time::Instant::now();
    let mut stdout = std::io::stdout().lock();
    let mut write_failed = None;
    let outcome = if let Some(reader) = base.as_mut() {
        writeln!(stdout, "{}", report::KLD_TABLE_HEADER).map_err(write_err)?;
        ppl::kl_divergence(&mut session, reader, a.chunks, Some(&interrupted), |done| {
            progress(done, started);
            if let Some(s) = done.kld {
                let r = writeln!(stdout, "{}", report::kld_chunk_line(done.index, s))
                    .and_then(|()| stdout.flush());
                if let Err(e) = r {
                    write_failed.get_or_insert(e);
                }
            }
        })
        .map(|mut r| {
            let mut lines = vec![String::new()];
            lines.extend(r.summary());
            lines
        })
    } else {
        let out_path = a.kl_divergence_base.as_deref();
        let r = ppl::perplexity(
            &mut session,
            &tokens,
            ctx,
            a.chunks,
            out_path,
            Some(&interrupted),
            |done| {
                progress(done, started);
                let r = write!(stdout, "{}", report::running_ppl(done.index, done.ppl))
                    .and_then(|()| stdout.flush());
                if let Err(e) = r {
                    write_failed.get_or_insert(e);
                }
            },
        );
        if r.is_err() {
            // A partial file would disagree with its header: leave none.
            if let Some(p) = out_path {
                let _ = std::fs::remove_file(p);
            }
        }
        // The end of the running values, then a blank line, as llama-perplexity prints them.
        r.map(|r| vec![String::new(), String::new(), r.final_line()])
    };
    if let Some(e) = write_failed {
        return Err(write_err(e));
    }
    let seconds = started.elapsed().as_secs_f64();
    match outcome {
        Ok(lines) => {
            for l in lines {
                writeln!(stdout, "{l}").map_err(write_err)?;
            }
            stdout.flush().map_err(write_err)?;
            if let (false, Some(p)) = (a.kl_divergence, &a.kl_divergence_base) {
                eprintln!(
                    "[edge-run] perplexity: base logits written to {}",
                    p.display()
                );
            }
            eprintln!("[edge-run] perplexity: {n_chunks} chunks in {seconds:.2} s");
            Ok(0)
        }
        Err(EngineError::Interrupted {
            processed,
            requested,
        }) => {
            let _ = writeln!(stdout);
            eprintln!(
                "[edge-run] perplexity: interrupted (Ctrl-C) after {processed} of {requested} tokens in {seconds:.1} s; no estimate"
            );
            Ok(EXIT_INTERRUPTED)
        }
        Err(e) => Err(CliError::from(format!("perplexity: {}", hint(&e)))),
    }
}
