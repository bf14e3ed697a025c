//! Text generation, the command without a subcommand: the prompt (plain, or through the
//! model's chat template) goes through the library's [`Generator`](edge_engine::generate::Generator),
//! as the C API's does; the text streams to stdout and a timing summary ends on stderr.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use edge_engine::error::EngineError;
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::session::ContextPolicy;
use edge_tokenizers::chat::{ChatMessage, ChatTemplate};
use edge_tokenizers::Tokenizer;

use crate::args::GenerateArgs;
use crate::constrain::{constraint_from_args, tool_calls_json, tools_from_args};
use crate::errors::{hint_text, load_model, refuse_encoder, CliError, CliResult};
use crate::output::read_text;
use crate::session::open_session;
use crate::signals::{interrupt_flag, EXIT_INTERRUPTED};

/// Generates text; returns the exit status (0, or [`EXIT_INTERRUPTED`] after Ctrl-C).
pub fn generate(a: GenerateArgs) -> CliResult<u8> {
    let path = a.model.clone().or(a.model_pos.clone()).ok_or_else(|| {
        CliError::usage("no model given: edge-run MODEL.gguf -p PROMPT (see edge-run --help)")
    })?;
    if a.keep.is_some() && !a.ctx_shift {
        return Err(CliError::usage(
            "--keep only applies to context shifting: add --ctx-shift",
        ));
    }
    if a.system.is_some() && !a.chat {
        return Err(CliError::usage(
            "--system only applies to chat: add --chat (or put the instructions in the prompt)",
        ));
    }
    if a.prompt_cache_ro && a.prompt_cache.is_none() {
        return Err(CliError::usage(
            "--prompt-cache-ro only applies to a prompt cache: add --prompt-cache FILE",
        ));
    }
    let prompt = read_prompt(&a)?;
    let sampling = a.sampling.config()?;

    let t_load = Instant::now();
    let model = Arc::new(load_model(&path)?);
    refuse_encoder(&path, &model)?;
    log::info!(
        "loaded {} in {:.0} ms",
        path.display(),
        t_load.elapsed().as_secs_f64() * 1e3
    );
    a.session.check_ctx(&model)?;
    let n_ctx_train = model.params.n_ctx_train;
    let tok = &model.tokenizer;
    // --chat-template-file replaces the model's template; --tools needs one with a syntax.
    let template_source = match &a.chat_template_file {
        Some(f) if !a.chat => {
            return Err(CliError::usage(format!(
                "--chat-template-file {} only applies to chat: add --chat",
                f.display()
            )))
        }
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| {
            CliError::usage(format!(
                "--chat-template-file: cannot read {}: {e}",
                f.display()
            ))
        })?),
        None => model.chat_template.clone(),
    };
    let tools = tools_from_args(&a, template_source.as_deref().unwrap_or(""))?;
    // With --chat --system, the text of the system message alone: kept by --ctx-shift.
    let (text, system_text) = if a.chat {
        let source = template_source.as_deref().ok_or_else(|| {
            format!(
                "--chat: {} has no tokenizer.chat_template; run without --chat and format the prompt yourself",
                path.display()
            )
        })?;
        let tools_value = tools.as_ref().map(|t| &t.value);
        chat_prompt(&model, source, tools_value, a.system.as_deref(), prompt)?
    } else {
        (prompt, None)
    };
    let constraint = constraint_from_args(&a, &model, tools.as_ref())?;
    let ids = tok
        .encode(&text, tok.add_bos(), true)
        .map_err(|e| format!("tokenizing the prompt: {e}"))?;
    if ids.is_empty() {
        return Err(CliError::usage(
            "the prompt has no tokens: give some text with -p",
        ));
    }
    let cfg = a.session.config(&model)?;
    let budget = a.session.memory.budget()?;
    let mut session = open_session(&model, &cfg, budget.as_ref())?;
    if budget.is_some() {
        log::info!("memory budget: context {} tokens", session.ctx());
    }
    if ids.len() > session.ctx() {
        let want = (ids.len() + a.n_predict.max(1)).min(n_ctx_train);
        let fix = if ids.len() < n_ctx_train {
            format!("use --ctx {want} or more (the model supports up to {n_ctx_train}) or shorten the prompt")
        } else {
            format!("shorten the prompt (the model supports at most {n_ctx_train} tokens)")
        };
        return Err(CliError::usage(format!(
            "the prompt has {} tokens but the context holds {}: {fix}",
            ids.len(),
            session.ctx()
        )));
    }
    if a.ctx_shift {
        // Refused up front rather than when the context fills mid-generation.
        if let Some(reason) = model.context_shift_unsupported() {
            return Err(CliError::usage(format!(
                "--ctx-shift: {}",
                hint_text(&reason)
            )));
        }
        let keep = match a.keep {
            Some(n) => n.min(ids.len()),
            None => default_keep(tok, &ids, &text, system_text.as_deref()),
        };
        if keep >= session.ctx() {
            return Err(CliError::usage(format!(
                "--keep {keep} keeps the whole context of {} tokens, leaving nothing to shift: use a smaller --keep or a larger --ctx",
                session.ctx()
            )));
        }
        log::info!("context shift: keeping the first {keep} tokens");
        session.set_context_policy(ContextPolicy::Shift { keep });
    }
    let options = GenerateOptions {
        max_tokens: a.n_predict,
        sampling,
        stop_at_eog: true,
        // Control tokens the model writes are shown, as llama.cpp's completion tool does.
        render_special: true,
        constraint,
    };
    // With --tools the output is one JSON object printed at the end.
    let mut tool_output = tools.as_ref().map(|_| String::new());
    let interrupted = interrupt_flag()?;
    // A long prompt stops between its chunks on the first Ctrl-C, too.
    session.set_interrupt(Arc::clone(&interrupted));
    // --prompt-cache: the prefix of the prompt the saved state holds is not processed again.
    let mut reused = None;
    if let Some(cache) = &a.prompt_cache {
        crate::prompt_cache::load(&mut session, cache, a.prompt_cache_ro)?;
        reused = Some(session.reuse_prefix(&ids));
    }
    let mut stdout = std::io::stdout().lock();
    let write_err = |e: std::io::Error| CliError::from(format!("writing output: {e}"));

    // The generator prefills the prompt and samples the first token (on a GPU the logits stay
    // there unless the settings need them on the host).
    let t_prompt = Instant::now();
    let started = match reused {
        Some(_) => session.generator_cached(&ids, &options),
        None => session.generator(&ids, &options),
    };
    let mut gen = match started {
        Ok(gen) => gen,
        Err(EngineError::Interrupted {
            processed,
            requested,
        }) => {
            eprintln!(
                "\n[edge-run] prompt: interrupted after {processed} of {requested} tokens in {:.0} ms; generated: 0 tokens; stopped: interrupted (Ctrl-C)",
                t_prompt.elapsed().as_secs_f64() * 1e3
            );
            return Ok(EXIT_INTERRUPTED);
        }
        Err(e) => return Err(e.into()),
    };
    let prompt_s = t_prompt.elapsed().as_secs_f64();
    let t_gen = Instant::now();
    while let Some(token) = gen.next() {
        token?;
        if let Some(out) = &mut tool_output {
            out.push_str(gen.text());
            continue;
        }
        stdout.write_all(gen.text().as_bytes()).map_err(write_err)?;
        stdout.flush().map_err(write_err)?;
        if interrupted.load(Ordering::Relaxed) {
            gen.stop();
        }
    }
    // Bytes of a character the last token left incomplete.
    if let (Some(out), Some(t)) = (&mut tool_output, &tools) {
        out.push_str(gen.text());
        let line = tool_calls_json(t, out)?;
        writeln!(stdout, "{line}").map_err(write_err)?;
    }
    stdout.write_all(gen.text().as_bytes()).map_err(write_err)?;
    stdout.flush().map_err(write_err)?;
    let done = gen.result();
    drop(gen);
    let gen_s = t_gen.elapsed().as_secs_f64();
    // A Ctrl-C during the prompt or after the last token still counts as an interruption.
    let was_interrupted = interrupted.load(Ordering::Relaxed);
    let stop = match done.stop_reason {
        _ if was_interrupted => "interrupted (Ctrl-C)",
        StopReason::MaxTokens => "token limit (-n)",
        StopReason::EndOfGeneration(_) => "end-of-generation token",
        StopReason::ContextFull => "context full (use a larger --ctx, or --ctx-shift)",
        StopReason::Stopped => "interrupted (Ctrl-C)",
    };
    if let (Some(cache), false) = (&a.prompt_cache, a.prompt_cache_ro) {
        crate::prompt_cache::save(&mut session, cache)?;
    }
    let cached = reused.map_or(String::new(), |n| format!(", {n} from the prompt cache"));
    let shifts = if a.ctx_shift {
        format!("; context shifts: {}", session.n_shifts())
    } else {
        String::new()
    };
    eprintln!(
        "\n[edge-run] prompt: {} tokens{cached} in {:.0} ms ({:.1} tok/s); generated: {} tokens in {:.0} ms ({:.1} tok/s); stopped: {stop}{shifts}",
        ids.len(),
        prompt_s * 1e3,
        (ids.len() - reused.unwrap_or(0)) as f64 / prompt_s.max(1e-9),
        done.n_tokens,
        gen_s * 1e3,
        done.n_tokens as f64 / gen_s.max(1e-9)
    );
    Ok(if was_interrupted { EXIT_INTERRUPTED } else { 0 })
}

/// The prompt text from `-p` or `-f` (UTF-8, not empty).
fn read_prompt(a: &GenerateArgs) -> CliResult<String> {
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let file = std::fs::File::open(f)
                .map_err(|e| format!("{}: cannot read the prompt file: {e}", f.display()))?;
            read_text(file, &format!("the prompt file {}", f.display()))?
        }
        (None, None) => {
            return Err(CliError::usage(
                "no prompt given: use -p PROMPT or -f FILE (see edge-run --help)",
            ))
        }
    };
    if prompt.is_empty() {
        let how = if a.prompt.is_some() {
            "-p"
        } else {
            "the -f file"
        };
        return Err(CliError::usage(format!(
            "the prompt is empty: give some text with {how}"
        )));
    }
    Ok(prompt)
}

/// `prompt` as a user message through the model's chat template (after `system`, if given),
/// and the rendering of the system message alone (what `--ctx-shift` keeps by default).
fn chat_prompt(
    model: &edge_engine::model::Model,
    source: &str,
    tools: Option<&serde_json::Value>,
    system: Option<&str>,
    prompt: String,
) -> CliResult<(String, Option<String>)> {
    let tok = &model.tokenizer;
    let piece =
        |id: Option<u32>| id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned());
    let template = ChatTemplate::new(
        source,
        &piece(tok.bos_id()).unwrap_or_default(),
        &piece(tok.eos_id()).unwrap_or_default(),
    )
    .map_err(|e| format!("--chat: the model's chat template: {e}"))?;
    let mut messages = Vec::new();
    let mut system_text = None;
    if let Some(system) = system {
        messages.push(ChatMessage::new("system", system.to_string()));
        system_text = template.render(&messages, false).ok();
    }
    messages.push(ChatMessage::new("user", prompt));
    let text = template
        .render_with_tools(&messages, tools, true)
        .map_err(|e| format!("--chat: the model's chat template: {e}"))?;
    Ok((text, system_text))
}

/// What `--ctx-shift` keeps without `--keep`: the BOS token if the prompt starts with one, or
/// with `--chat --system` the system message (when its rendering is where the prompt starts
/// and tokenizes to the prompt's first tokens).
fn default_keep(tok: &Tokenizer, ids: &[u32], text: &str, system_text: Option<&str>) -> usize {
    let bos = usize::from(
        tok.add_bos() && tok.bos_id().is_some() && ids.first() == tok.bos_id().as_ref(),
    );
    let system = system_text
        .filter(|s| text.starts_with(s))
        .and_then(|s| tok.encode(s, tok.add_bos(), true).ok())
        .filter(|sys| ids.starts_with(sys))
        .map_or(0, |sys| sys.len());
    bos.max(system).min(ids.len())
}
