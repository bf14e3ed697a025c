//! `edge-run`: run a GGUF language model on this machine.
//!
//! `edge-run MODEL.gguf -p PROMPT` generates text (streamed to stdout; logs go to stderr);
//! `edge-run tokenize`, `edge-run inspect` work on any GGUF. Every error is one line on stderr
//! and a non-zero exit status.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use edge_engine::gguf::Gguf;
use edge_engine::model::Model;
use edge_engine::sampling::{Sampler, SamplerConfig};
use edge_engine::session::{Session, SessionConfig};
use edge_tokenizers::chat::{ChatMessage, ChatTemplate};
use edge_tokenizers::{StreamDecoder, Tokenizer};

/// Run a quantized language model from a GGUF file on this machine.
///
/// Examples:
///   edge-run models/SmolLM2-135M-Instruct.Q4_1.gguf -p "The capital of France is" -n 32 --temp 0
///   edge-run -m model.gguf --chat -p "Write a haiku about robots"
///   edge-run tokenize model.gguf "Hello world"
///   edge-run inspect model.gguf
#[derive(Parser, Debug)]
#[command(name = "edge-run", version, verbatim_doc_comment)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    generate: GenerateArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the token ids of a text as a JSON array (works on vocabulary-only GGUF files too).
    Tokenize(TokenizeArgs),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(InspectArgs),
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// The GGUF model file.
    #[arg(value_name = "MODEL")]
    model_pos: Option<PathBuf>,
    /// The GGUF model file (same as the positional MODEL).
    #[arg(short = 'm', long = "model", value_name = "MODEL", conflicts_with = "model_pos")]
    model: Option<PathBuf>,
    /// The prompt. Special-token text (e.g. `<|im_start|>`) is parsed as special tokens.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Read the prompt from a file instead.
    #[arg(short = 'f', long = "file", value_name = "PATH", conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// Tokens to generate at most (generation also stops at an end-of-generation token).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256, value_name = "N")]
    n_predict: usize,
    /// Context size in tokens (KV cache positions) [default: min(4096, the model's trained context)].
    #[arg(short = 'c', long = "ctx", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    ctx: Option<u32>,
    /// Prompt tokens processed per forward pass [default: min(512, ctx)].
    #[arg(long = "ubatch", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    ubatch: Option<u32>,
    /// Threads [default: the available cores].
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Sampling temperature; 0 = greedy (argmax).
    #[arg(long = "temp", default_value_t = 0.8, value_name = "T")]
    temp: f32,
    /// Keep only the K most likely tokens; 0 = off.
    #[arg(long = "top-k", default_value_t = 40, value_name = "K")]
    top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to P; 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, value_name = "P")]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, value_name = "P")]
    min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens; 1 = off.
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_name = "X")]
    repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64, value_name = "N")]
    repeat_last_n: usize,
    /// Random seed: the same seed gives the same tokens.
    #[arg(long = "seed", default_value_t = 42, value_name = "N")]
    seed: u64,
    /// Wrap the prompt in the model's chat template (tokenizer.chat_template) as a user message.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message (otherwise the template's default, if any).
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    /// More logging on stderr (-v info, -vv debug).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Args, Debug)]
struct TokenizeArgs {
    /// The GGUF file (a model or a vocabulary-only file).
    model: PathBuf,
    /// The text (or use --stdin).
    #[arg(required_unless_present = "stdin", conflicts_with = "stdin")]
    text: Option<String>,
    /// Read the text from standard input, verbatim (no trimming).
    #[arg(long)]
    stdin: bool,
    /// Parse special-token text (e.g. `<|im_start|>`) as special tokens.
    #[arg(long)]
    special: bool,
    /// Add BOS/EOS as the model's metadata says.
    #[arg(long = "add-special")]
    add_special: bool,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The GGUF file.
    model: PathBuf,
    /// Show every element of long arrays (default: the first few).
    #[arg(long)]
    full: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.render().to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
            eprintln!("{first} (see edge-run --help)");
            return ExitCode::from(2);
        }
    };
    let level = match cli.generate.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .init();
    let result = match cli.command {
        Some(Command::Tokenize(a)) => tokenize(a),
        Some(Command::Inspect(a)) => inspect(a),
        None => generate(cli.generate),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

type CliResult = Result<(), String>;

fn tokenizer_of(path: &PathBuf) -> Result<Tokenizer, String> {
    let gguf = Gguf::open(path).map_err(|e| e.to_string())?;
    let cfg = edge_engine::vocab::vocab_config_from_gguf(&gguf).map_err(|e| e.to_string())?;
    Tokenizer::from_config(cfg).map_err(|e| format!("{}: {e}", path.display()))
}

fn tokenize(a: TokenizeArgs) -> CliResult {
    let text = if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("reading standard input: {e}"))?;
        String::from_utf8(buf).map_err(|_| "standard input is not valid UTF-8 text".to_string())?
    } else {
        a.text.unwrap_or_default()
    };
    let tok = tokenizer_of(&a.model)?;
    let ids = tok
        .encode(&text, a.add_special, a.special)
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string(&ids).map_err(|e| e.to_string())?);
    Ok(())
}

fn inspect(a: InspectArgs) -> CliResult {
    let g = Gguf::open(&a.model).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let w = |out: &mut std::io::StdoutLock, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    w(
        &mut out,
        format!(
            "{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}, {} bytes",
            a.model.display(),
            g.version(),
            g.metadata().len(),
            g.tensors().len(),
            g.alignment(),
            g.data_offset(),
            g.file_size()
        ),
    )?;
    w(&mut out, String::new())?;
    w(&mut out, "metadata:".into())?;
    for (key, value) in g.metadata() {
        let shown = match value {
            edge_engine::gguf::MetaValue::Array(items) if a.full => {
                format!("{} {:?}", value.type_name(), items)
            }
            _ => value.to_string(),
        };
        let shown = if !a.full && shown.chars().count() > 160 {
            let cut: String = shown.chars().take(157).collect();
            format!("{cut}...")
        } else {
            shown
        };
        w(&mut out, format!("  {key:<42} {}", shown.replace('\n', "\\n")))?;
    }
    w(&mut out, String::new())?;
    w(&mut out, format!("  {:<40} {:<8} {:<22} {:>12} {:>12}", "tensor", "type", "dims", "bytes", "offset"))?;
    let mut by_type: std::collections::BTreeMap<&'static str, (usize, u64)> = Default::default();
    for t in g.tensors() {
        let dims = format!("{:?}", t.dims);
        w(
            &mut out,
            format!("  {:<40} {:<8} {:<22} {:>12} {:>12}", t.name, t.ggml_type.name(), dims, t.n_bytes, t.offset),
        )?;
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    w(&mut out, String::new())?;
    let total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    let types: Vec<String> = by_type
        .iter()
        .map(|(ty, (n, b))| format!("{ty}: {n} tensors, {:.1} MiB", *b as f64 / 1048576.0))
        .collect();
    w(&mut out, format!("weights: {:.1} MiB ({})", total as f64 / 1048576.0, types.join("; ")))?;
    Ok(())
}

fn generate(a: GenerateArgs) -> CliResult {
    let path = a
        .model
        .or(a.model_pos)
        .ok_or("no model given: edge-run MODEL.gguf -p PROMPT (see edge-run --help)")?;
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?,
        (None, None) => return Err("no prompt given: use -p PROMPT or -f FILE".into()),
    };
    let sampling = SamplerConfig {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        seed: a.seed,
    };
    sampling.validate()?;
    let t_load = Instant::now();
    let model = Arc::new(Model::load(&path).map_err(|e| e.to_string())?);
    log::info!("loaded {} in {:.0} ms", path.display(), t_load.elapsed().as_secs_f64() * 1e3);
    let tok = &model.tokenizer;
    let text = if a.chat {
        let source = model
            .chat_template
            .as_deref()
            .ok_or("--chat: the model has no tokenizer.chat_template; run without --chat and format the prompt yourself")?;
        let piece = |id: Option<u32>| id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned());
        let template = ChatTemplate::new(source, &piece(tok.bos_id()).unwrap_or_default(), &piece(tok.eos_id()).unwrap_or_default())
            .map_err(|e| format!("chat template: {e}"))?;
        let mut messages = Vec::new();
        if let Some(system) = &a.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: system.clone(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: prompt,
        });
        template
            .render(&messages, true)
            .map_err(|e| format!("chat template: {e}"))?
    } else {
        prompt
    };
    let add_special = tok.add_bos();
    let ids = tok.encode(&text, add_special, true).map_err(|e| e.to_string())?;
    if ids.is_empty() {
        return Err("the prompt is empty: give some text with -p".into());
    }
    let cfg = SessionConfig {
        ctx: a.ctx.map(|c| c as usize),
        ubatch: a.ubatch.map(|u| u as usize),
        threads: a.threads.map(|t| t as usize),
    };
    let mut session = Session::new(Arc::clone(&model), &cfg).map_err(|e| e.to_string())?;
    if ids.len() > session.ctx() {
        return Err(format!(
            "the prompt has {} tokens but the context holds {}: use --ctx {} or more (the model supports {}), or shorten the prompt",
            ids.len(),
            session.ctx(),
            ids.len() + a.n_predict,
            model.params.n_ctx_train
        ));
    }
    let mut sampler = Sampler::new(sampling, model.params.n_vocab);
    for &id in &ids {
        sampler.accept(id);
    }
    let mut stdout = std::io::stdout().lock();
    let mut stream = StreamDecoder::new();
    let t_prompt = Instant::now();
    let mut next = sampler.sample(session.prefill(&ids).map_err(|e| e.to_string())?);
    let prompt_s = t_prompt.elapsed().as_secs_f64();
    let t_gen = Instant::now();
    let mut n_gen = 0usize;
    let mut stop = "token limit (-n)";
    while n_gen < a.n_predict {
        if tok.is_eog(next) {
            stop = "end-of-generation token";
            break;
        }
        sampler.accept(next);
        n_gen += 1;
        if let Some(s) = stream.push(next, tok) {
            stdout.write_all(s.as_bytes()).map_err(|e| format!("writing output: {e}"))?;
            stdout.flush().map_err(|e| format!("writing output: {e}"))?;
        }
        if n_gen == a.n_predict {
            break;
        }
        if session.n_past() >= session.ctx() {
            stop = "context full (use a larger --ctx)";
            break;
        }
        next = sampler.sample(session.step(next).map_err(|e| e.to_string())?);
    }
    if let Some(rest) = stream.flush() {
        stdout.write_all(rest.as_bytes()).map_err(|e| format!("writing output: {e}"))?;
    }
    stdout.flush().map_err(|e| format!("writing output: {e}"))?;
    let gen_s = t_gen.elapsed().as_secs_f64();
    eprintln!(
        "\n[edge-run] prompt: {} tokens in {:.0} ms ({:.1} tok/s); generated: {} tokens in {:.0} ms ({:.1} tok/s); stopped: {stop}",
        ids.len(),
        prompt_s * 1e3,
        ids.len() as f64 / prompt_s.max(1e-9),
        n_gen,
        gen_s * 1e3,
        n_gen as f64 / gen_s.max(1e-9)
    );
    Ok(())
}
