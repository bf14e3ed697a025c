//! `edge-run`: run a GGUF language model on this machine.
//!
//! `edge-run MODEL.gguf -p PROMPT` generates text (streamed to stdout; logs go to stderr);
//! `edge-run tokenize`, `edge-run inspect` work on any GGUF; `edge-run plan` prints the memory a
//! session would hold (without allocating it) and `edge-run bench` measures prompt processing and
//! generation speed; `edge-run embed` prints sentence embeddings from an encoder (BERT) model. Every error is one line on stderr and a non-zero exit status (2 for a bad
//! command line, 1 for anything else).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use edge_engine::device::Device;
use edge_engine::error::EngineError;
use edge_engine::gguf::{Gguf, GgufError};
use edge_engine::model::Model;
use edge_engine::sampling::{Sampler, SamplerConfig};
use edge_engine::session::{Session, SessionConfig, SessionPlan};
use edge_tokenizers::chat::{ChatMessage, ChatTemplate};
use edge_tokenizers::{StreamDecoder, Tokenizer};

/// Run a quantized language model from a GGUF file on this machine.
///
/// Only the generated text goes to stdout; logs and the timing summary go to stderr.
///
/// Examples:
///   edge-run models/SmolLM2-135M-Instruct.Q4_1.gguf -p "The capital of France is" -n 32 --temp 0
///   edge-run -m model.gguf --chat -p "Write a haiku about robots"
///   edge-run tokenize model.gguf "Hello world"
///   edge-run inspect model.gguf
///   edge-run plan model.gguf --ctx 8192
///   edge-run bench model.gguf -p 512 -n 128
///   edge-run embed models/all-MiniLM-L6-v2.f16.gguf "A sentence" "Another one" --json
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
    /// Print the memory a session would hold (weights, KV cache, arena, scratch), without
    /// allocating it.
    Plan(PlanArgs),
    /// Measure prompt processing (pp) and generation (tg) speed in tokens/s, like llama-bench.
    Bench(BenchArgs),
    /// Print sentence embeddings of texts from an encoder (BERT) model: one line of numbers per
    /// text, or JSON with --json.
    Embed(EmbedArgs),
}

#[derive(Args, Debug)]
struct EmbedArgs {
    /// The GGUF model file (an encoder such as all-MiniLM-L6-v2).
    model: PathBuf,
    /// The texts; each gives one embedding, in order.
    #[arg(value_name = "TEXT", required = true)]
    texts: Vec<String>,
    /// L2-normalise each embedding (the default).
    #[arg(long, overrides_with = "no_normalize")]
    normalize: bool,
    /// Print the raw pooled vectors, not normalised (what llama.cpp's llama_get_embeddings_seq
    /// returns).
    #[arg(long = "no-normalize", overrides_with = "normalize")]
    no_normalize: bool,
    /// Pooling: mean, cls or last [default: the model's pooling_type].
    #[arg(long, value_name = "KIND", value_parser = pooling_arg)]
    pooling: Option<edge_engine::embed::Pooling>,
    /// Longest text in tokens, [CLS] and [SEP] included [default: the model's context length].
    #[arg(long = "max-tokens", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    max_tokens: Option<usize>,
    /// Threads [default: the available cores].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    threads: Option<usize>,
    /// Device: only cpu runs encoder models [default: cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    device: Option<Device>,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Print a JSON array of {"text", "n_tokens", "embedding"} objects.
    #[arg(long)]
    json: bool,
}

fn pooling_arg(s: &str) -> Result<edge_engine::embed::Pooling, String> {
    edge_engine::embed::Pooling::from_name(s).ok_or_else(|| "expected mean, cls or last".into())
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// The GGUF model file.
    #[arg(value_name = "MODEL")]
    model_pos: Option<PathBuf>,
    /// The GGUF model file (same as the positional MODEL).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "MODEL",
        conflicts_with = "model_pos"
    )]
    model: Option<PathBuf>,
    /// The prompt. Special-token text (e.g. `<|im_start|>`) is parsed as special tokens.
    #[arg(short = 'p', long, value_name = "TEXT", allow_hyphen_values = true)]
    prompt: Option<String>,
    /// Read the prompt from a file instead (UTF-8 text, used verbatim).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "PATH",
        conflicts_with = "prompt"
    )]
    prompt_file: Option<PathBuf>,
    /// Tokens to generate at most (generation also stops at an end-of-generation token).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256, value_name = "N",
          allow_negative_numbers = true, value_parser = count)]
    n_predict: usize,
    /// Context size in tokens (KV cache positions); the prompt and the output must fit
    /// [default: min(4096, the model's trained context)].
    #[arg(short = 'c', long = "ctx", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    ctx: Option<usize>,
    /// Prompt tokens processed per forward pass [default: min(512, ctx)].
    #[arg(long = "ubatch", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    ubatch: Option<usize>,
    /// Threads [default: the available cores].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    threads: Option<usize>,
    /// Sampling temperature; 0 = greedy (argmax).
    #[arg(long = "temp", default_value_t = 0.8, value_name = "T", allow_negative_numbers = true, value_parser = number)]
    temp: f32,
    /// Keep only the K most likely tokens; 0 = off.
    #[arg(long = "top-k", default_value_t = 40, value_name = "K", allow_negative_numbers = true, value_parser = count)]
    top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to P; 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, value_name = "P", allow_negative_numbers = true, value_parser = number)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, value_name = "P", allow_negative_numbers = true, value_parser = number)]
    min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens; 1 = off.
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_name = "X", allow_negative_numbers = true, value_parser = number)]
    repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    repeat_last_n: usize,
    /// Random seed: the same seed gives the same tokens.
    #[arg(long = "seed", default_value_t = 42, value_name = "N", allow_negative_numbers = true, value_parser = seed)]
    seed: u64,
    /// Wrap the prompt in the model's chat template (tokenizer.chat_template) as a user message.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message (otherwise the template's default, if any).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    system: Option<String>,
    /// Device: cpu, cuda or cuda:N [default: cuda if this build has CUDA support and a GPU is
    /// present, else cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    device: Option<Device>,
    /// When the context is full, shift it instead of stopping: keep the first --keep tokens,
    /// drop the oldest half of the rest and go on (the model forgets the dropped tokens).
    #[arg(long = "ctx-shift")]
    ctx_shift: bool,
    /// With --ctx-shift: prompt tokens never dropped [default: the BOS token, and with --chat
    /// --system the system message]; at most the prompt's length.
    #[arg(long = "keep", value_name = "N", allow_negative_numbers = true, value_parser = count)]
    keep: Option<usize>,
    #[command(flatten)]
    budget: BudgetArgs,
    /// More logging on stderr (-v info: memory plan, timings; -vv debug). RUST_LOG overrides.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Args, Debug)]
struct TokenizeArgs {
    /// The GGUF file (a model or a vocabulary-only file).
    model: PathBuf,
    /// The text (or use --stdin).
    #[arg(
        required_unless_present = "stdin",
        conflicts_with = "stdin",
        allow_hyphen_values = true
    )]
    text: Option<String>,
    /// Read the text from standard input, verbatim (no trimming; must be UTF-8).
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
    /// Show every element of long arrays and long strings (default: the first few).
    #[arg(long)]
    full: bool,
}

#[derive(Args, Debug)]
struct PlanArgs {
    /// The GGUF model file.
    model: PathBuf,
    /// Context size in tokens (KV cache positions)
    /// [default: min(4096, the model's trained context)].
    #[arg(short = 'c', long = "ctx", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    ctx: Option<usize>,
    /// Prompt tokens processed per forward pass [default: min(512, ctx)].
    #[arg(long = "ubatch", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    ubatch: Option<usize>,
    /// Threads (each has its own scratch) [default: the available cores].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    threads: Option<usize>,
    /// Device: cpu, cuda or cuda:N [default: cuda if this build has CUDA support and a GPU is
    /// present, else cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    device: Option<Device>,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Print one JSON object (byte counts) instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Memory budget flags, shared by generation and `plan`.
#[derive(Args, Debug)]
struct BudgetArgs {
    /// Cap on the memory the engine owns (KV cache + arena + scratch, and the weights with
    /// --count-weights or a unified-memory --target), e.g. 512MiB or 2GB. Without --ctx the
    /// largest context that fits is chosen; with --ctx a run that does not fit is refused before
    /// anything is allocated.
    // Hyphen values allowed so that `-5MiB` is reported as a bad size, not an unknown flag.
    #[arg(long = "mem-budget", value_name = "SIZE", allow_hyphen_values = true, value_parser = mem_size)]
    mem_budget: Option<u64>,
    /// Count the mapped weights against --mem-budget (always so on unified-memory targets).
    #[arg(long = "count-weights")]
    count_weights: bool,
    /// Device profile whose usable memory is the budget unless --mem-budget is given:
    /// orin-agx-64, orin-agx-32, orin-nx-16, orin-nx-8, orin-nano-8, orin-nano-4, cuda-8gb,
    /// cuda-12gb, cuda-16gb, cuda-24gb, host.
    #[arg(long = "target", value_name = "NAME")]
    target: Option<String>,
    /// KV cache type: f16 (default; outputs identical to llama.cpp's) or q8_0 (47% smaller,
    /// flash-style attention; logits differ slightly, see the README).
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = kv_type)]
    kv_type: edge_engine::exec::KvType,
    /// Tiled attention with an online softmax (flash-style) for an f16 cache too: per-thread
    /// scratch no longer grows with the context; logits differ slightly from llama.cpp's.
    #[arg(long = "flash-attn", visible_alias = "fa")]
    flash_attn: bool,
}

fn device_arg(s: &str) -> Result<Device, String> {
    Device::parse(s)
}

/// The device a command runs on: the one asked for, or the default (CUDA when built in and
/// present, else the CPU). Asking for CUDA on a build without it is an error that names the fix.
fn resolve_device(asked: Option<Device>, model: &Model) -> CliResult<Device> {
    match asked {
        Some(Device::Cuda(_)) if !edge_engine::device::cuda_compiled() => {
            Err(CliError::from(edge_engine::device::NO_CUDA_SUPPORT))
        }
        Some(d) => Ok(d),
        None => Ok(edge_engine::device::device_for(model)),
    }
}

/// The session that generation and `plan` describe with the same flags.
fn session_config(
    ctx: Option<usize>,
    ubatch: Option<usize>,
    threads: Option<usize>,
    budget: &BudgetArgs,
    device: Option<Device>,
    model: &Model,
) -> CliResult<SessionConfig> {
    Ok(SessionConfig {
        ctx,
        ubatch,
        threads,
        kv_type: budget.kv_type,
        flash_attn: budget.flash_attn,
        device: resolve_device(device, model)?,
        cuda_weights: None,
    })
}

fn kv_type(s: &str) -> Result<edge_engine::exec::KvType, String> {
    edge_engine::exec::KvType::from_name(s).ok_or_else(|| "use f16 or q8_0".to_string())
}

impl BudgetArgs {
    /// The budget these flags describe, if any.
    fn budget(&self) -> Result<Option<edge_targets::Budget>, CliError> {
        let target = match self.target.as_deref() {
            None => None,
            Some("host") => Some(edge_targets::host().map_err(|e| format!("--target host: {e}"))?),
            Some(name) => Some(
                edge_targets::by_name(name)
                    .map_err(|e| CliError::usage(format!("--target: {e}")))?,
            ),
        };
        Ok(match (&target, self.mem_budget) {
            (Some(t), limit) => Some(edge_targets::Budget::for_target(
                t,
                limit,
                self.count_weights,
            )),
            (None, Some(limit)) => Some(edge_targets::Budget {
                limit_bytes: limit,
                count_weights: self.count_weights,
            }),
            (None, None) if self.count_weights => {
                return Err(CliError::usage(
                    "--count-weights needs a budget: add --mem-budget SIZE or --target NAME",
                ))
            }
            (None, None) => None,
        })
    }
}

fn mem_size(s: &str) -> Result<u64, String> {
    match edge_targets::parse_size(s) {
        Ok(0) => Err("must be more than 0 bytes".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e
            .to_string()
            .lines()
            .next()
            .unwrap_or("not a size")
            .to_string()),
    }
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// The GGUF model file.
    model: PathBuf,
    /// Prompt processing test: tokens prefilled at once (test "ppN").
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    n_prompt: usize,
    /// Generation test: tokens generated one at a time, greedy (test "tgN").
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    n_gen: usize,
    /// Timed repetitions of each test (after one untimed warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    repetitions: usize,
    /// Threads [default: the available cores].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    threads: Option<usize>,
    /// Device: cpu, cuda or cuda:N [default: cuda if this build has CUDA support and a GPU is
    /// present, else cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    device: Option<Device>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also measure the memory read bandwidth (the decoded weights streamed by the same number
    /// of threads) and report the decode speed it allows and the share of it reached.
    #[arg(long)]
    bandwidth: bool,
}

// ---- flag value parsers: each error names what is expected (clap adds the flag and value) ----

fn count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| "expected a whole number >= 0".to_string())
}

fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > u32::MAX as usize => Err(format!("must be at most {}", u32::MAX)),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a whole number >= 1".into()),
    }
}

fn threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err("expected a number of threads from 1 to 1024".into()),
    }
}

fn number(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err("expected a finite number such as 0.5".into()),
    }
}

fn seed(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("expected a whole number from 0 to {}", u64::MAX))
}

// ---- errors ----

/// An error for the one line on stderr; `usage` errors (a bad command line) exit with 2.
struct CliError {
    msg: String,
    usage: bool,
}

impl CliError {
    fn usage(msg: impl Into<String>) -> CliError {
        CliError {
            msg: msg.into(),
            usage: true,
        }
    }
}

impl From<String> for CliError {
    fn from(msg: String) -> CliError {
        CliError { msg, usage: false }
    }
}

impl From<&str> for CliError {
    fn from(msg: &str) -> CliError {
        msg.to_string().into()
    }
}

type CliResult<T = ()> = Result<T, CliError>;

/// One line from a clap error: the message, its context line(s) and any "similar argument"
/// tip, then where to look.
fn clap_error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut line = String::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if l.is_empty() || (l.starts_with("tip:") && l.contains("as a value, use '--")) {
            continue;
        }
        let l = l.strip_prefix("error: ").unwrap_or(l);
        if line.is_empty() {
            line.push_str(l);
        } else if line.ends_with(':') {
            line.push(' ');
            line.push_str(l);
        } else {
            line.push_str("; ");
            line.push_str(l);
        }
    }
    if line.is_empty() {
        line.push_str("invalid arguments");
    }
    // `edge-run MODEL "some text"`: clap reads the text as a subcommand name.
    if let Some(rest) = line.strip_prefix("the subcommand '") {
        if let Some((word, _)) = rest.split_once("' cannot be used with") {
            line = format!(
                "unexpected argument '{word}' after the model: give the prompt with -p (edge-run MODEL -p \"{word}\")"
            );
        }
    }
    let sub = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .filter(|a| ["tokenize", "inspect", "plan", "bench", "embed"].contains(&a.as_str()));
    match sub {
        Some(sub) => format!("{line} (see edge-run {sub} --help)"),
        None => format!("{line} (see edge-run --help)"),
    }
}

/// Opens a GGUF, turning its errors into one line that names the file and the fix.
fn open_gguf(path: &Path) -> CliResult<Gguf> {
    if path.is_dir() {
        return Err(format!(
            "{} is a directory: give the path of a .gguf file",
            path.display()
        )
        .into());
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Err(format!(
            "{} is empty (0 bytes): the download or conversion failed; fetch the file again",
            path.display()
        )
        .into());
    }
    Gguf::open(path).map_err(|e| gguf_error(path, &e).into())
}

fn gguf_error(path: &Path, e: &GgufError) -> String {
    let p = path.display();
    match e {
        GgufError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            format!("{p}: no such file: check the path (scripts/fetch-model.sh downloads the default model)")
        }
        GgufError::Io { .. } => format!("{e}: give the path of a readable .gguf file"),
        GgufError::BadMagic { .. } => {
            format!("{p}: {e}: give a model in GGUF format (llama.cpp's converters write it)")
        }
        GgufError::UnsupportedVersion { .. } => format!("{p}: {e}"),
        GgufError::Truncated { .. }
        | GgufError::CountTooLarge { .. }
        | GgufError::TensorOutOfRange { .. } => {
            format!("{p}: {e}: the file is incomplete or damaged; download or convert it again")
        }
        _ => format!("{p}: {e}: the file is malformed; convert it again"),
    }
}

fn engine_error(path: &Path, e: EngineError) -> String {
    match e {
        EngineError::Gguf(g) => gguf_error(path, &g),
        EngineError::UnsupportedArchitecture { .. } => format!(
            "{}: {e}: use a model of a supported architecture",
            path.display()
        ),
        e => format!("{}: {e}", path.display()),
    }
}

fn install_panic_hook() {
    // A panic is a bug; still, report it as one line rather than a multi-line trace.
    std::panic::set_hook(Box::new(|info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "panic".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error{at}: {}: this is a bug in edge-run, please report it",
            msg.replace('\n', " ")
        );
    }));
}

fn main() -> ExitCode {
    install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", clap_error_line(&e));
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
    let result = std::panic::catch_unwind(move || match cli.command {
        Some(Command::Tokenize(a)) => tokenize(a).map(|()| 0),
        Some(Command::Inspect(a)) => inspect(a).map(|()| 0),
        Some(Command::Plan(a)) => plan(a).map(|()| 0),
        Some(Command::Bench(a)) => bench(a).map(|()| 0),
        Some(Command::Embed(a)) => embed(a).map(|()| 0),
        None => generate(cli.generate),
    });
    match result {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(e)) => {
            eprintln!("error: {}", e.msg.replace('\n', " "));
            ExitCode::from(if e.usage { 2 } else { 1 })
        }
        // the panic hook has printed the line
        Err(_) => ExitCode::from(101),
    }
}

// ---- tokenize ----

fn tokenizer_of(path: &Path) -> CliResult<Tokenizer> {
    let gguf = open_gguf(path)?;
    let cfg =
        edge_engine::vocab::vocab_config_from_gguf(&gguf).map_err(|e| engine_error(path, e))?;
    Tokenizer::from_config(cfg).map_err(|e| format!("{}: tokenizer: {e}", path.display()).into())
}

fn tokenize(a: TokenizeArgs) -> CliResult {
    let text = if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("reading standard input: {e}"))?;
        String::from_utf8(buf).map_err(|e| {
            format!(
                "standard input is not UTF-8 text (invalid byte at offset {}): convert it to UTF-8",
                e.utf8_error().valid_up_to()
            )
        })?
    } else {
        a.text.unwrap_or_default()
    };
    let tok = tokenizer_of(&a.model)?;
    let ids = tok
        .encode(&text, a.add_special, a.special)
        .map_err(|e| format!("{}: tokenizer: {e}", a.model.display()))?;
    let json = serde_json::to_string(&ids).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}

// ---- inspect ----

fn inspect(a: InspectArgs) -> CliResult {
    let g = open_gguf(&a.model)?;
    let mut lines = Vec::new();
    lines.push(format!(
        "{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}, {} bytes",
        a.model.display(),
        g.version(),
        g.metadata().len(),
        g.tensors().len(),
        g.alignment(),
        g.data_offset(),
        g.file_size()
    ));
    lines.push(String::new());
    lines.push("metadata:".into());
    for (key, value) in g.metadata() {
        let shown = match value {
            edge_engine::gguf::MetaValue::Array(items) if a.full => {
                format!("{} {:?}", value.type_name(), items)
            }
            edge_engine::gguf::MetaValue::String(s) if a.full => format!("{s:?}"),
            _ => value.to_string(),
        };
        let shown = if !a.full && shown.chars().count() > 160 {
            let cut: String = shown.chars().take(157).collect();
            format!("{cut}...")
        } else {
            shown
        };
        lines.push(format!("  {key:<42} {}", shown.replace('\n', "\\n")));
    }
    if g.tensors().is_empty() {
        lines.push(String::new());
        lines.push("no tensors (a vocabulary-only file)".into());
    } else {
        lines.push(String::new());
        lines.push(format!(
            "  {:<40} {:<8} {:<22} {:>12} {:>12}",
            "tensor", "type", "dims", "bytes", "offset"
        ));
        let mut by_type: std::collections::BTreeMap<&'static str, (usize, u64)> =
            Default::default();
        for t in g.tensors() {
            let dims = format!("{:?}", t.dims);
            lines.push(format!(
                "  {:<40} {:<8} {:<22} {:>12} {:>12}",
                t.name,
                t.ggml_type.name(),
                dims,
                t.n_bytes,
                t.offset
            ));
            let e = by_type.entry(t.ggml_type.name()).or_default();
            e.0 += 1;
            e.1 += t.n_bytes;
        }
        lines.push(String::new());
        let total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
        let types: Vec<String> = by_type
            .iter()
            .map(|(ty, (n, b))| format!("{ty}: {n} tensors, {:.1} MiB", *b as f64 / 1048576.0))
            .collect();
        lines.push(format!(
            "weights: {:.1} MiB ({})",
            total as f64 / 1048576.0,
            types.join("; ")
        ));
    }
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| format!("writing output: {e}"))?;
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}

// ---- generate ----

/// Generation and benchmarks need a decoder; an encoder gets the command that fits it.
fn refuse_encoder(path: &Path, model: &Model) -> CliResult {
    if model.layout.is_encoder() {
        return Err(format!(
            "{}: {} is an encoder (embedding) model: it computes embeddings, not text; use `edge-run embed {} TEXT...`",
            path.display(),
            model.params.arch,
            path.display()
        )
        .into());
    }
    Ok(())
}

fn load_model(path: &Path) -> CliResult<Model> {
    let mark = edge_engine::model::LoadMark::now();
    let gguf = open_gguf(path)?;
    if gguf.tensors().is_empty() {
        return Err(format!(
            "{} has no tensors: it is a vocabulary-only GGUF, not a model; give a model file \
             (a vocabulary works with `edge-run tokenize`)",
            path.display()
        )
        .into());
    }
    Model::from_gguf_since(gguf, mark).map_err(|e| engine_error(path, e).into())
}

/// Exit status after Ctrl-C stopped a generation (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

/// Makes the first Ctrl-C (SIGINT) set the returned flag, which the generation loop checks after
/// each token; a second Ctrl-C, once the flag is set, exits at once with status 130.
fn interrupt_flag() -> CliResult<Arc<std::sync::atomic::AtomicBool>> {
    use signal_hook::{consts::SIGINT, flag};
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let err = |e: std::io::Error| CliError::from(format!("cannot install the Ctrl-C handler: {e}"));
    // Registered first so that it sees the flag as the first Ctrl-C left it.
    flag::register_conditional_shutdown(SIGINT, i32::from(EXIT_INTERRUPTED), Arc::clone(&stop))
        .map_err(err)?;
    flag::register(SIGINT, Arc::clone(&stop)).map_err(err)?;
    Ok(stop)
}

/// Generates text; returns the exit status (0, or [`EXIT_INTERRUPTED`] after Ctrl-C).
fn generate(a: GenerateArgs) -> CliResult<u8> {
    let path = a.model.or(a.model_pos).ok_or_else(|| {
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
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let bytes = std::fs::read(f)
                .map_err(|e| format!("{}: cannot read the prompt file: {e}", f.display()))?;
            String::from_utf8(bytes).map_err(|e| {
                format!(
                    "{}: the prompt file is not UTF-8 text (invalid byte at offset {}): convert it to UTF-8",
                    f.display(),
                    e.utf8_error().valid_up_to()
                )
            })?
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
    let sampling = SamplerConfig {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        seed: a.seed,
    };
    sampling.validate().map_err(CliError::usage)?;

    let t_load = Instant::now();
    let model = Arc::new(load_model(&path)?);
    refuse_encoder(&path, &model)?;
    log::info!(
        "loaded {} in {:.0} ms",
        path.display(),
        t_load.elapsed().as_secs_f64() * 1e3
    );
    let n_ctx_train = model.params.n_ctx_train;
    if let Some(ctx) = a.ctx {
        if ctx > n_ctx_train {
            return Err(CliError::usage(format!(
                "--ctx {ctx} is more than the {n_ctx_train} tokens the model was trained for: use --ctx {n_ctx_train} or less"
            )));
        }
    }
    let tok = &model.tokenizer;
    // With --chat --system, the text of the system message alone: kept by --ctx-shift.
    let mut system_text = None;
    let text = if a.chat {
        let source = model.chat_template.as_deref().ok_or_else(|| {
            format!(
                "--chat: {} has no tokenizer.chat_template; run without --chat and format the prompt yourself",
                path.display()
            )
        })?;
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned())
        };
        let template = ChatTemplate::new(
            source,
            &piece(tok.bos_id()).unwrap_or_default(),
            &piece(tok.eos_id()).unwrap_or_default(),
        )
        .map_err(|e| format!("--chat: the model's chat template: {e}"))?;
        let mut messages = Vec::new();
        if let Some(system) = &a.system {
            messages.push(ChatMessage::new("system", system.clone()));
            system_text = template.render(&messages, false).ok();
        }
        messages.push(ChatMessage::new("user", prompt));
        template
            .render(&messages, true)
            .map_err(|e| format!("--chat: the model's chat template: {e}"))?
    } else {
        prompt
    };
    let ids = tok
        .encode(&text, tok.add_bos(), true)
        .map_err(|e| format!("tokenizing the prompt: {e}"))?;
    if ids.is_empty() {
        return Err(CliError::usage(
            "the prompt has no tokens: give some text with -p",
        ));
    }
    let cfg = session_config(a.ctx, a.ubatch, a.threads, &a.budget, a.device, &model)?;
    let budget = a.budget.budget()?;
    let mut session = match &budget {
        None => Session::new(Arc::clone(&model), &cfg),
        Some(b) => SessionPlan::within_budget(&model, &cfg, b)
            .and_then(|plan| Session::from_plan(Arc::clone(&model), plan)),
    }
    .map_err(|e| match e {
        EngineError::Budget(_) => CliError::from(e.to_string()),
        EngineError::Device(e) => CliError::from(format!(
            "cannot set up the session on {}: {e} (use --device cpu)",
            cfg.device.name()
        )),
        e => CliError::from(format!(
            "cannot set up the session: {e} (try a smaller --ctx or --ubatch)"
        )),
    })?;
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
    let mut shifting = false;
    if a.ctx_shift {
        // Refused up front rather than when the context fills mid-generation.
        if let Some(reason) = model.context_shift_unsupported() {
            return Err(CliError::usage(format!("--ctx-shift: {reason}")));
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
        session.set_context_policy(edge_engine::session::ContextPolicy::Shift { keep });
        shifting = true;
    }
    let mut sampler = Sampler::new(sampling, model.params.n_vocab);
    for &id in &ids {
        sampler.accept(id);
    }
    let mut stdout = std::io::stdout().lock();
    let write_err = |e: std::io::Error| CliError::from(format!("writing output: {e}"));
    let mut stream = StreamDecoder::new();
    let interrupted = interrupt_flag()?;
    let t_prompt = Instant::now();
    // Session::sample: on a GPU the logits stay there (greedy: the device argmax; sampling:
    // the device sampler, the CPU sampler's token for the same draw) and only the token id
    // comes back, unless the settings need the logits on the host (a repetition penalty).
    let mut next_token = |session: &mut Session, tokens: &[u32]| -> CliResult<u32> {
        if tokens.len() == 1 && session.n_past() > 0 {
            // A generated token joins the penalty window before the next sample.
            sampler.accept(tokens[0]);
        }
        session.advance(tokens).map_err(|e| e.to_string())?;
        Ok(session.sample(&mut sampler).map_err(|e| e.to_string())?)
    };
    let mut next = next_token(&mut session, &ids)?;
    let prompt_s = t_prompt.elapsed().as_secs_f64();
    let t_gen = Instant::now();
    let mut n_gen = 0usize;
    let mut stop = "token limit (-n)";
    while n_gen < a.n_predict {
        if tok.is_eog(next) {
            stop = "end-of-generation token";
            break;
        }
        n_gen += 1;
        if let Some(s) = stream.push(next, tok) {
            stdout.write_all(s.as_bytes()).map_err(write_err)?;
            stdout.flush().map_err(write_err)?;
        }
        if n_gen == a.n_predict {
            break;
        }
        if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        if !shifting && session.n_past() >= session.ctx() {
            stop = "context full (use a larger --ctx, or --ctx-shift)";
            break;
        }
        next = next_token(&mut session, &[next])?;
    }
    if let Some(rest) = stream.flush() {
        stdout.write_all(rest.as_bytes()).map_err(write_err)?;
    }
    stdout.flush().map_err(write_err)?;
    let gen_s = t_gen.elapsed().as_secs_f64();
    // A Ctrl-C during the prompt or after the last token still counts as an interruption.
    let was_interrupted = interrupted.load(std::sync::atomic::Ordering::Relaxed);
    if was_interrupted {
        stop = "interrupted (Ctrl-C)";
    }
    let shifts = if shifting {
        format!("; context shifts: {}", session.n_shifts())
    } else {
        String::new()
    };
    eprintln!(
        "\n[edge-run] prompt: {} tokens in {:.0} ms ({:.1} tok/s); generated: {} tokens in {:.0} ms ({:.1} tok/s); stopped: {stop}{shifts}",
        ids.len(),
        prompt_s * 1e3,
        ids.len() as f64 / prompt_s.max(1e-9),
        n_gen,
        gen_s * 1e3,
        n_gen as f64 / gen_s.max(1e-9)
    );
    Ok(if was_interrupted { EXIT_INTERRUPTED } else { 0 })
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

// ---- plan ----

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / 1048576.0)
}

/// `--ctx N` above the trained context is a bad command line.
fn check_ctx(model: &Model, ctx: Option<usize>) -> CliResult {
    let n_ctx_train = model.params.n_ctx_train;
    match ctx {
        Some(ctx) if ctx > n_ctx_train => Err(CliError::usage(format!(
            "--ctx {ctx} is more than the {n_ctx_train} tokens the model was trained for: use --ctx {n_ctx_train} or less"
        ))),
        _ => Ok(()),
    }
}

fn write_lines(lines: &[String]) -> CliResult {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| format!("writing output: {e}"))?;
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    Ok(())
}

fn plan(a: PlanArgs) -> CliResult {
    let model = load_model(&a.model)?;
    if model.layout.is_encoder() {
        return plan_encoder(&a, &model);
    }
    check_ctx(&model, a.ctx)?;
    let cfg = session_config(a.ctx, a.ubatch, a.threads, &a.budget, a.device, &model)?;
    let budget = a.budget.budget()?;
    let plan = match &budget {
        None => SessionPlan::new(&model, &cfg),
        Some(b) => SessionPlan::within_budget(&model, &cfg, b),
    }
    .map_err(|e| match e {
        EngineError::Budget(_) => CliError::from(e.to_string()),
        e => CliError::from(format!(
            "cannot plan the session: {e} (try a smaller --ctx or --ubatch)"
        )),
    })?;
    // The largest context the budget allows (with these ubatch and threads).
    // Without --ctx the budgeted plan already is the largest fitting one; search only otherwise.
    let max_ctx = budget.as_ref().and_then(|b| {
        if a.ctx.is_none() {
            return Some(plan.ctx);
        }
        let probe = SessionConfig {
            ctx: None,
            ..cfg.clone()
        };
        SessionPlan::within_budget(&model, &probe, b)
            .ok()
            .map(|p| p.ctx)
    });
    let r = plan.report;
    if a.json {
        let mut v = memory_json(&r, max_ctx, budget.as_ref());
        extend_json(
            &mut v,
            serde_json::json!({
                "ctx": plan.ctx,
                "ubatch": plan.ubatch,
                "threads": plan.threads,
                "kv_type": plan.kv_type.name(),
                "flash_attn": plan.flash_attn,
                "device": plan.device.name(),
                "cuda": plan.cuda.map(|c| serde_json::json!({
                    "arena_bytes": c.arena_bytes,
                    "kv_bytes": c.kv_bytes,
                    "weights_upload_bytes": c.weights_upload_bytes,
                    "scratch_bytes": c.scratch_bytes,
                    "device_total_bytes": c.device_total_bytes(),
                })),
            }),
        );
        return write_lines(&[v.to_string()]);
    }
    let p = &model.params;
    let mut by_type: std::collections::BTreeMap<&'static str, (usize, u64)> = Default::default();
    for t in model.gguf().tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let in_file: u64 = by_type.values().map(|(_, b)| b).sum();
    let mut lines = vec![format!(
        "{}: {}, {} layers; ctx {}, ubatch {}, {} threads",
        a.model.display(),
        p.arch,
        p.n_layer,
        plan.ctx,
        plan.ubatch,
        plan.threads
    )];
    lines.push(String::new());
    let row = memory_row;
    let weights_note = if in_file == r.weights_bytes {
        "mapped from the file, not copied".to_string()
    } else {
        format!(
            "mapped from the file, not copied ({} of the file's tensors are read)",
            mib(r.weights_bytes)
        )
    };
    lines.push(row("weights", r.weights_bytes, weights_note));
    for (ty, (n, b)) in &by_type {
        lines.push(format!(
            "    {ty:<26} {:>12} {b:>14} B  {n} tensor{}",
            mib(*b),
            if *n == 1 { "" } else { "s" }
        ));
    }
    lines.push(row("KV cache", r.kv_bytes, {
        // Sliding-window layers hold only their window plus one ubatch.
        let rows = p.kv_layer_rows(plan.ctx, plan.ubatch);
        let n_full = rows.iter().filter(|&&r| r == plan.ctx).count();
        let mut layers = format!("{n_full} layers x {} ctx", plan.ctx);
        if n_full < rows.len() {
            let ring = rows
                .iter()
                .copied()
                .filter(|&r| r < plan.ctx)
                .max()
                .unwrap_or(0);
            layers += &format!(
                " + {} sliding-window layers x {ring} rows",
                rows.len() - n_full
            );
        }
        format!(
            "{}, K and V: {layers} x {} kv_dim",
            plan.kv_type.name(),
            p.kv_dim()
        )
    }));
    let ratio = r.arena_bytes as f64 / (r.arena_lower_bound_bytes.max(1)) as f64;
    lines.push(row(
        "arena (activations)",
        r.arena_bytes,
        format!(
            "planned; lower bound {} ({:.3}x the lower bound)",
            mib(r.arena_lower_bound_bytes),
            ratio
        ),
    ));
    let scratch_note = if plan.cuda.is_some() {
        "attention partials + parameter block (on the device)".to_string()
    } else {
        format!(
            "{} threads x {}",
            plan.threads,
            mib(r.scratch_bytes / plan.threads.max(1) as u64)
        )
    };
    lines.push(row("scratch", r.scratch_bytes, scratch_note));
    lines.push(row(
        "total owned",
        r.owned_bytes(),
        "KV cache + arena + scratch: allocated by the session".into(),
    ));
    lines.push(row(
        "total with weights",
        r.owned_with_weights_bytes(),
        "owned + mapped weights".into(),
    ));
    lines.push(row(
        "model runtime",
        r.runtime_bytes,
        "tokenizer and metadata heap, measured at load (shared by sessions)".into(),
    ));
    lines.push(row(
        "total",
        r.total_bytes(),
        "what the process holds: weights + runtime + owned".into(),
    ));
    if let Some(c) = &plan.cuda {
        lines.push(String::new());
        lines.push(format!(
            "device allocations on {} (one each, sized by the plan):",
            plan.device.name()
        ));
        lines.push(row(
            "arena",
            c.arena_bytes,
            "one allocation; values at the plan's offsets".into(),
        ));
        lines.push(row("KV cache", c.kv_bytes, "one allocation, f16".into()));
        lines.push(row(
            "weights",
            c.weights_upload_bytes,
            "one upload on a discrete GPU; integrated GPUs register the file mapping (0 B extra) or fill one managed buffer".into(),
        ));
        lines.push(row(
            "scratch",
            c.scratch_bytes,
            "attention partials + parameters".into(),
        ));
        lines.push(row(
            "total on the device",
            c.device_total_bytes(),
            "discrete GPU: arena + KV + scratch + weights".into(),
        ));
    }
    if let Some(b) = &budget {
        let charged = if b.count_weights {
            r.owned_with_weights_bytes()
        } else {
            r.owned_bytes()
        };
        lines.push(String::new());
        lines.push(format!(
            "budget: {} ({}), {} charged; largest ctx that fits: {}",
            mib(b.limit_bytes),
            if b.count_weights {
                "weights counted"
            } else {
                "weights not counted"
            },
            mib(charged),
            max_ctx.map_or("none".to_string(), |c| c.to_string())
        ));
    }
    write_lines(&lines)
}

// ---- bench ----

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

/// The fields `plan --json` prints for every kind of model: the budget, the largest context
/// that fits it, and the memory report.
fn memory_json(
    r: &edge_engine::session::MemoryReport,
    max_ctx: Option<usize>,
    budget: Option<&edge_targets::Budget>,
) -> serde_json::Value {
    serde_json::json!({
        "max_ctx": max_ctx,
        "budget_bytes": budget.map(|b| b.limit_bytes),
        "budget_counts_weights": budget.map(|b| b.count_weights),
        "weights_bytes": r.weights_bytes,
        "kv_bytes": r.kv_bytes,
        "arena_bytes": r.arena_bytes,
        "arena_lower_bound_bytes": r.arena_lower_bound_bytes,
        "scratch_bytes": r.scratch_bytes,
        "runtime_bytes": r.runtime_bytes,
        "owned_bytes": r.owned_bytes(),
        "total_bytes": r.total_bytes(),
    })
}

/// Adds the fields of the object `more` to the object `v`.
fn extend_json(v: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(v), serde_json::Value::Object(more)) = (v.as_object_mut(), more) {
        v.extend(more);
    }
}

/// One line of `plan`'s memory table: name, MiB, bytes, and what it is.
fn memory_row(name: &str, bytes: u64, note: String) -> String {
    format!("  {name:<28} {:>12} {bytes:>14} B  {note}", mib(bytes))
}

fn bench(a: BenchArgs) -> CliResult {
    let model = Arc::new(load_model(&a.model)?);
    refuse_encoder(&a.model, &model)?;
    let n_ctx_train = model.params.n_ctx_train;
    let need = a.n_prompt.max(a.n_gen + 1);
    if need > n_ctx_train {
        return Err(CliError::usage(format!(
            "-p {} / -n {} need {need} context positions but the model was trained for {n_ctx_train}: use smaller values",
            a.n_prompt, a.n_gen
        )));
    }
    let ctx = (a.n_prompt + a.n_gen + 16).min(n_ctx_train);
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
    let prompt: Vec<u32> = first
        .into_iter()
        .chain(text_ids.iter().copied().cycle())
        .take(a.n_prompt)
        .collect();
    let gen_start = first.unwrap_or(text_ids[0]);
    let cfg = SessionConfig {
        ctx: Some(ctx),
        ubatch: None,
        threads: a.threads,
        device: resolve_device(a.device, &model)?,
        ..Default::default()
    };
    let mut session = Session::new(Arc::clone(&model), &cfg).map_err(|e| match e {
        EngineError::Device(e) => format!(
            "cannot set up the session on {}: {e} (use --device cpu)",
            cfg.device.name()
        ),
        e => format!("cannot set up the session: {e} (try smaller -p/-n)"),
    })?;
    let threads = session.n_threads();
    let run_err = |e: EngineError| CliError::from(e.to_string());

    let mut pp_rates = Vec::with_capacity(a.repetitions);
    let mut tg_rates = Vec::with_capacity(a.repetitions);
    // repetition 0 is the untimed warm-up
    for rep in 0..=a.repetitions {
        session.reset();
        let t = Instant::now();
        // No logits are fetched (on a GPU they stay on the device), as llama-bench's pp test.
        session.advance(&prompt).map_err(run_err)?;
        let s = t.elapsed().as_secs_f64();
        if rep > 0 {
            pp_rates.push(a.n_prompt as f64 / s.max(1e-9));
        }
        log::info!("pp{} run {rep}: {:.1} ms", a.n_prompt, s * 1e3);
    }
    for rep in 0..=a.repetitions {
        session.reset();
        // Greedy: Session::argmax is sampling::argmax of the logits (on a GPU, computed there).
        session.advance(&[gen_start]).map_err(run_err)?;
        let mut next = session.argmax().map_err(run_err)?;
        let t = Instant::now();
        for _ in 0..a.n_gen {
            session.advance(&[next]).map_err(run_err)?;
            next = session.argmax().map_err(run_err)?;
        }
        let s = t.elapsed().as_secs_f64();
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
        let graph = edge_engine::arch::build_graph(&model, 1);
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
    let rows: Vec<[String; 7]> = [
        (format!("pp{}", a.n_prompt), pp, pp_sd),
        (format!("tg{}", a.n_gen), tg, tg_sd),
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
            "decode reads {} of weights per token; streaming them with {threads} thread(s) reads {:.2} GB/s: a limit of {limit:.1} tok/s, tg{} reaches {:.0}% of it",
            mib(bytes as u64),
            bw / 1e9,
            a.n_gen,
            frac * 100.0
        ));
    }
    write_lines(&lines)
}

/// The embedder's settings from the command line, refusing the flags that do not apply to an
/// encoder (it has no KV cache and runs on the CPU).
fn embed_config(
    model: &Model,
    flag: &str,
    max_tokens: Option<usize>,
    threads: Option<usize>,
    device: Option<Device>,
    budget: &BudgetArgs,
) -> CliResult<edge_engine::embed::EmbedConfig> {
    if let Some(Device::Cuda(_)) = device {
        let reason = edge_engine::device::cuda_unsupported(model)
            .unwrap_or_else(|| "encoder models run on the CPU; use --device cpu".into());
        return Err(CliError::usage(format!("--device cuda: {reason}")));
    }
    if budget.kv_type != edge_engine::exec::KvType::F16 || budget.flash_attn {
        return Err(CliError::usage(
            "--kv-type and --flash-attn do not apply to an encoder model (it has no KV cache); leave them out",
        ));
    }
    let n_ctx = model.params.n_ctx_train;
    if let Some(n) = max_tokens.filter(|&n| n > n_ctx) {
        return Err(CliError::usage(format!(
            "{flag} {n}: the model takes at most {n_ctx} tokens per text (its position table); use at most {n_ctx}"
        )));
    }
    Ok(edge_engine::embed::EmbedConfig {
        max_tokens,
        threads,
        ..Default::default()
    })
}

/// Plans an embedder, within the budget if there is one.
fn embed_plan(
    model: &Model,
    cfg: &edge_engine::embed::EmbedConfig,
    budget: Option<&edge_targets::Budget>,
) -> CliResult<edge_engine::embed::EmbedPlan> {
    use edge_engine::embed::EmbedPlan;
    match budget {
        None => EmbedPlan::new(model, cfg),
        Some(b) => EmbedPlan::within_budget(model, cfg, b),
    }
    .map_err(|e| match e {
        EngineError::Budget(_) => CliError::from(format!(
            "{e} (for an encoder the context is the longest text: --max-tokens / --ctx)"
        )),
        e => CliError::from(format!("cannot plan the embedder: {e}")),
    })
}

/// `edge-run plan` for an encoder model: the embedder's memory (`--ctx` is the longest text).
fn plan_encoder(a: &PlanArgs, model: &Model) -> CliResult {
    if a.ubatch.is_some() {
        return Err(CliError::usage(
            "--ubatch does not apply to an encoder model (it runs each text in one pass of up to --ctx tokens); leave it out",
        ));
    }
    let cfg = embed_config(model, "--ctx", a.ctx, a.threads, a.device, &a.budget)?;
    let budget = a.budget.budget()?;
    let plan = embed_plan(model, &cfg, budget.as_ref())?;
    let max_ctx = budget.as_ref().and_then(|b| {
        if a.ctx.is_none() {
            return Some(plan.max_tokens);
        }
        let probe = edge_engine::embed::EmbedConfig {
            max_tokens: None,
            ..cfg.clone()
        };
        edge_engine::embed::EmbedPlan::within_budget(model, &probe, b)
            .ok()
            .map(|p| p.max_tokens)
    });
    let r = plan.report;
    if a.json {
        let mut v = memory_json(&r, max_ctx, budget.as_ref());
        extend_json(
            &mut v,
            serde_json::json!({
                "ctx": plan.max_tokens,
                "ubatch": plan.max_tokens,
                "threads": plan.threads,
                "device": "cpu",
                "encoder": true,
                "pooling": plan.pooling.name(),
            }),
        );
        return write_lines(&[v.to_string()]);
    }
    let p = &model.params;
    let row = memory_row;
    let ratio = r.arena_bytes as f64 / (r.arena_lower_bound_bytes.max(1)) as f64;
    let mut lines = vec![
        format!(
            "{}: {} encoder (embeddings, {} pooling), {} layers; up to {} tokens per text, {} threads",
            a.model.display(),
            p.arch,
            plan.pooling.name(),
            p.n_layer,
            plan.max_tokens,
            plan.threads
        ),
        String::new(),
        row("weights", r.weights_bytes, "mapped from the file, not copied".into()),
        row("KV cache", 0, "none: an encoder sees each text in one pass".into()),
        row(
            "arena (activations)",
            r.arena_bytes,
            format!(
                "planned for {} tokens; lower bound {} ({ratio:.3}x the lower bound)",
                plan.max_tokens,
                mib(r.arena_lower_bound_bytes)
            ),
        ),
        row(
            "scratch",
            r.scratch_bytes,
            format!(
                "{} threads x {}",
                plan.threads,
                mib(r.scratch_bytes / plan.threads.max(1) as u64)
            ),
        ),
        row("total owned", r.owned_bytes(), "arena + scratch: allocated by the embedder".into()),
        row(
            "total with weights",
            r.owned_with_weights_bytes(),
            "owned + mapped weights".into(),
        ),
        row(
            "model runtime",
            r.runtime_bytes,
            "tokenizer and metadata heap, measured at load".into(),
        ),
        row(
            "total",
            r.total_bytes(),
            "what the process holds: weights + runtime + owned".into(),
        ),
    ];
    if let (Some(b), Some(m)) = (&budget, max_ctx) {
        lines.push(format!(
            "budget {} ({}): the longest text that fits is {m} tokens",
            mib(b.limit_bytes),
            if b.count_weights {
                "weights counted"
            } else {
                "weights not counted"
            }
        ));
    }
    write_lines(&lines)
}

fn embed(a: EmbedArgs) -> CliResult {
    let model = load_model(&a.model)?;
    if !model.layout.is_encoder() {
        return Err(format!(
            "{}: {} is a decoder (text generation) model; `edge-run embed` needs an encoder (embedding) model such as all-MiniLM-L6-v2 (scripts/fetch-embed-model.sh fetches it)",
            a.model.display(),
            model.params.arch
        )
        .into());
    }
    let mut cfg = embed_config(
        &model,
        "--max-tokens",
        a.max_tokens,
        a.threads,
        a.device,
        &a.budget,
    )?;
    cfg.pooling = a.pooling;
    // The two flags override each other: the last one given wins.
    cfg.normalize = !a.no_normalize;
    let budget = a.budget.budget()?;
    let plan = embed_plan(&model, &cfg, budget.as_ref())?;
    let model = Arc::new(model);
    let mut embedder = edge_engine::embed::Embedder::from_plan(Arc::clone(&model), plan)
        .map_err(|e| format!("cannot set up the embedder: {e}"))?;
    let mut lines = Vec::with_capacity(a.texts.len());
    let mut records = Vec::new();
    for (i, text) in a.texts.iter().enumerate() {
        let n_tokens = model
            .tokenize(text, true, false)
            .map_err(|e| format!("text {}: {e}", i + 1))?
            .len();
        let v = embedder.embed(&[text.as_str()]).map_err(|e| match e {
            EngineError::InvalidArgument(m) => {
                m.replacen("text 1 ", &format!("text {} ", i + 1), 1)
            }
            e => format!("text {}: {e}", i + 1),
        })?;
        let v = v.into_iter().next().unwrap_or_default();
        if a.json {
            records.push(serde_json::json!({
                "text": text,
                "n_tokens": n_tokens,
                "embedding": v,
            }));
        } else {
            lines.push(
                v.iter()
                    .map(|x| format!("{x:.6}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
    }
    if a.json {
        lines.push(serde_json::Value::Array(records).to_string());
    }
    write_lines(&lines)
}
