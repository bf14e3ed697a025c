//! The command line: the commands, their flags, and the parsers of flag values. Generation and
//! `plan` share one set of session flags ([`SessionFlags`]), and every command that runs a
//! model shares the compute flags ([`ComputeFlags`]), so a flag means the same everywhere.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use edge_engine::device::Device;
use edge_engine::embed::Pooling;
use edge_engine::kv::KvType;

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
///   edge-run chat models/SmolLM2-135M-Instruct.Q4_1.gguf
///   edge-run perplexity model.gguf -f text.txt
#[derive(Parser, Debug)]
#[command(name = "edge-run", version, verbatim_doc_comment)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub generate: GenerateArgs,
}

/// The subcommands; without one, `edge-run` generates text.
#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Chat with the model interactively: one message per line on stdin, answers streamed
    /// through its chat template, the history kept in the KV cache (/help lists the commands).
    Chat(ChatArgs),
    /// Serve the model over HTTP with an OpenAI-compatible API (chat, completions, embeddings,
    /// models, health, metrics); every slot's memory is planned before the port opens.
    Serve(ServeArgs),
    /// Perplexity of a model over a text, and KL divergence from a base model, as llama.cpp's
    /// llama-perplexity computes them (same chunks, same scored positions, same base-logits
    /// files).
    Perplexity(PerplexityArgs),
}

/// Where a model runs and on how many threads: every command that runs one.
#[derive(Args, Debug)]
pub struct ComputeFlags {
    /// Threads [default: the CPUs this process may use, less those other processes keep busy].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    pub threads: Option<usize>,
    /// Device: cpu, cuda or cuda:N [default: cuda if this build has CUDA support and a GPU is
    /// present, else cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    pub device: Option<Device>,
}

/// How a session is sized: generation and `plan` read the same flags.
#[derive(Args, Debug)]
pub struct SessionFlags {
    /// Context size in tokens (KV cache positions); the prompt and the output must fit
    /// [default: min(4096, the model's trained context)].
    #[arg(short = 'c', long = "ctx", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    pub ctx: Option<usize>,
    /// Prompt tokens processed per forward pass [default: min(512, ctx)].
    #[arg(long = "ubatch", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    pub ubatch: Option<usize>,
    #[command(flatten)]
    pub compute: ComputeFlags,
    #[command(flatten)]
    pub memory: MemoryFlags,
}

/// The memory a run may hold and how its KV cache and attention are laid out: generation,
/// `plan` and `embed` (which refuses the KV flags: an encoder has no cache).
#[derive(Args, Debug)]
pub struct MemoryFlags {
    /// Cap on the memory the engine owns (KV cache + arena + scratch, and the weights with
    /// --count-weights or a unified-memory --target), e.g. 512MiB or 2GB. Without --ctx the
    /// largest context that fits is chosen; with --ctx a run that does not fit is refused before
    /// anything is allocated.
    // Hyphen values allowed so that `-5MiB` is reported as a bad size, not an unknown flag.
    #[arg(long = "mem-budget", value_name = "SIZE", allow_hyphen_values = true, value_parser = mem_size)]
    pub mem_budget: Option<u64>,
    /// Count the mapped weights against --mem-budget (always so on unified-memory targets).
    #[arg(long = "count-weights")]
    pub count_weights: bool,
    /// Device profile whose usable memory is the budget unless --mem-budget is given:
    /// orin-agx-64, orin-agx-32, orin-nx-16, orin-nx-8, orin-nano-8, orin-nano-4, cuda-8gb,
    /// cuda-12gb, cuda-16gb, cuda-24gb, host.
    #[arg(long = "target", value_name = "NAME")]
    pub target: Option<String>,
    /// KV cache type: f16 (default; outputs identical to llama.cpp's) or q8_0 (47% smaller,
    /// flash-style attention; logits differ slightly, see the README).
    #[arg(long = "kv-type", value_name = "TYPE", default_value = "f16", value_parser = kv_type)]
    pub kv_type: KvType,
    /// Tiled attention with an online softmax (flash-style) for an f16 cache too: per-thread
    /// scratch no longer grows with the context; logits differ slightly from llama.cpp's.
    #[arg(long = "flash-attn", visible_alias = "fa")]
    pub flash_attn: bool,
}

/// Text generation (the command without a subcommand).
/// The sampler's flags, shared by one-shot generation and `chat`.
#[derive(Args, Debug)]
pub struct SamplingFlags {
    /// Sampling temperature; 0 = greedy (argmax).
    #[arg(long = "temp", default_value_t = 0.8, value_name = "T", allow_negative_numbers = true, value_parser = number)]
    pub temp: f32,
    /// Keep only the K most likely tokens; 0 = off.
    #[arg(long = "top-k", default_value_t = 40, value_name = "K", allow_negative_numbers = true, value_parser = count)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to P; 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, value_name = "P", allow_negative_numbers = true, value_parser = number)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, value_name = "P", allow_negative_numbers = true, value_parser = number)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens; 1 = off.
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_name = "X", allow_negative_numbers = true, value_parser = number)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub repeat_last_n: usize,
    /// Random seed: the same seed gives the same output.
    #[arg(long = "seed", default_value_t = 42, value_name = "N", allow_negative_numbers = true, value_parser = seed)]
    pub seed: u64,
}

impl SamplingFlags {
    /// The sampler settings, or the usage error that says which flag is wrong.
    pub fn config(&self) -> Result<edge_engine::sampling::SamplerConfig, crate::errors::CliError> {
        let sampling = edge_engine::sampling::SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        };
        sampling
            .validate()
            .map_err(|e| crate::errors::CliError::usage(crate::errors::hint(&e)))?;
        Ok(sampling)
    }
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The GGUF model file.
    #[arg(value_name = "MODEL")]
    pub model_pos: Option<PathBuf>,
    /// The GGUF model file (same as the positional MODEL).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "MODEL",
        conflicts_with = "model_pos"
    )]
    pub model: Option<PathBuf>,
    /// The prompt. Special-token text (e.g. `<|im_start|>`) is parsed as special tokens.
    #[arg(short = 'p', long, value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from a file instead (UTF-8 text, used verbatim).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "PATH",
        conflicts_with = "prompt"
    )]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate at most (generation also stops at an end-of-generation token).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256, value_name = "N",
          allow_negative_numbers = true, value_parser = count)]
    pub n_predict: usize,
    #[command(flatten)]
    pub session: SessionFlags,
    #[command(flatten)]
    pub sampling: SamplingFlags,
    /// Wrap the prompt in the model's chat template (tokenizer.chat_template) as a user message.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system message (otherwise the template's default, if any).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    pub system: Option<String>,
    /// When the context is full, shift it instead of stopping: keep the first --keep tokens,
    /// drop the oldest half of the rest and go on (the model forgets the dropped tokens).
    #[arg(long = "ctx-shift")]
    pub ctx_shift: bool,
    /// With --ctx-shift: prompt tokens never dropped [default: the BOS token, and with --chat
    /// --system the system message]; at most the prompt's length.
    #[arg(long = "keep", value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub keep: Option<usize>,
    /// Prompt cache file (as llama.cpp's): if it holds the state of a session of this model and
    /// these session settings, the prompt's prefix it already covers is not processed again;
    /// the state after the run is saved to it.
    #[arg(long = "prompt-cache", value_name = "FILE")]
    pub prompt_cache: Option<PathBuf>,
    /// With --prompt-cache: use the file but never write it.
    #[arg(long = "prompt-cache-ro")]
    pub prompt_cache_ro: bool,
    /// Constrain the output to a llama.cpp GBNF grammar (its text; `root` is the output).
    #[arg(long = "grammar", value_name = "GRAMMAR", allow_hyphen_values = true,
          conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file", "regex", "tools"])]
    pub grammar: Option<String>,
    /// Constrain the output to the GBNF grammar in FILE (e.g. llama.cpp's grammars/json.gbnf).
    #[arg(long = "grammar-file", value_name = "FILE",
          conflicts_with_all = ["json_schema", "json_schema_file", "regex", "tools"])]
    pub grammar_file: Option<PathBuf>,
    /// Constrain the output to one JSON value valid for this JSON Schema, e.g.
    /// '{"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}'.
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA", allow_hyphen_values = true,
          conflicts_with_all = ["json_schema_file", "regex", "tools"])]
    pub json_schema: Option<String>,
    /// Constrain the output to the JSON Schema in FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", conflicts_with_all = ["regex", "tools"])]
    pub json_schema_file: Option<PathBuf>,
    /// Constrain the output to match a regular expression (Rust regex syntax), as a whole.
    #[arg(
        long = "regex",
        value_name = "PATTERN",
        allow_hyphen_values = true,
        conflicts_with = "tools"
    )]
    pub regex: Option<String>,
    /// With --chat: the tools the model may call, a JSON file in OpenAI's format ([{"type":
    /// "function", "function": {"name", "description", "parameters"}}]); prints one JSON object
    /// {"content", "tool_calls"} instead of the text.
    #[arg(long = "tools", value_name = "FILE")]
    pub tools: Option<PathBuf>,
    /// With --tools: auto (text or calls; a started call is constrained), required (a call
    /// valid for one of the tools), none, or a function's name (a call of it).
    #[arg(long = "tool-choice", value_name = "CHOICE", default_value = "auto")]
    pub tool_choice: String,
    /// With --chat: use the Jinja chat template in FILE instead of the model's
    /// tokenizer.chat_template (e.g. one with a tool-call syntax).
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// More logging on stderr (-v info: memory plan, timings; -vv debug). RUST_LOG overrides.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// `edge-run tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The GGUF file (a model or a vocabulary-only file).
    pub model: PathBuf,
    /// The text (or use --stdin).
    #[arg(
        required_unless_present = "stdin",
        conflicts_with = "stdin",
        allow_hyphen_values = true
    )]
    pub text: Option<String>,
    /// Read the text from standard input, verbatim (no trimming; must be UTF-8).
    #[arg(long)]
    pub stdin: bool,
    /// Parse special-token text (e.g. `<|im_start|>`) as special tokens.
    #[arg(long)]
    pub special: bool,
    /// Add BOS/EOS as the model's metadata says.
    #[arg(long = "add-special")]
    pub add_special: bool,
}

/// `edge-run inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The GGUF file.
    pub model: PathBuf,
    /// Show every element of long arrays and long strings (default: the first few).
    #[arg(long)]
    pub full: bool,
}

/// `edge-run plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Print one JSON object (byte counts) instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// `edge-run bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Prompt processing test: tokens prefilled at once (test "ppN").
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    pub n_prompt: usize,
    /// Generation test: tokens generated one at a time, greedy (test "tgN").
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    pub n_gen: usize,
    /// Tokens already in the KV cache before each test (prefilled untimed), as llama-bench's
    /// `-d`: the tests become "ppN @ dD" and "tgN @ dD", the speed at that depth of context.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0, value_name = "N",
          allow_negative_numbers = true, value_parser = non_negative)]
    pub n_depth: usize,
    /// Timed repetitions of each test (after one untimed warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_name = "N",
          allow_negative_numbers = true, value_parser = repetitions)]
    pub repetitions: usize,
    #[command(flatten)]
    pub compute: ComputeFlags,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also measure the memory read bandwidth (the decoded weights streamed by the same number
    /// of threads) and report the decode speed it allows and the share of it reached.
    #[arg(long)]
    pub bandwidth: bool,
}

/// `edge-run embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// The GGUF model file (an encoder such as all-MiniLM-L6-v2).
    pub model: PathBuf,
    /// The texts; each gives one embedding, in order.
    #[arg(value_name = "TEXT", required = true)]
    pub texts: Vec<String>,
    /// L2-normalise each embedding (the default).
    #[arg(long, overrides_with = "no_normalize")]
    pub normalize: bool,
    /// Print the raw pooled vectors, not normalised (what llama.cpp's llama_get_embeddings_seq
    /// returns).
    #[arg(long = "no-normalize", overrides_with = "normalize")]
    pub no_normalize: bool,
    /// Pooling: mean, cls or last [default: the model's pooling_type].
    #[arg(long, value_name = "KIND", value_parser = pooling_arg)]
    pub pooling: Option<Pooling>,
    /// Longest text in tokens, `[CLS]` and `[SEP]` included [default: the model's context length].
    #[arg(long = "max-tokens", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    pub max_tokens: Option<usize>,
    /// Threads [default: the CPUs this process may use, less those other processes keep busy].
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = threads)]
    pub threads: Option<usize>,
    /// Device: only cpu runs encoder models [default: cpu].
    #[arg(long = "device", value_name = "DEVICE", value_parser = device_arg)]
    pub device: Option<Device>,
    #[command(flatten)]
    pub memory: MemoryFlags,
    /// Print a JSON array of {"text", "n_tokens", "embedding"} objects.
    #[arg(long)]
    pub json: bool,
}

/// `edge-run chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The GGUF model file (with a tokenizer.chat_template).
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,
    /// A system message (otherwise the template's default, if any).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Tokens per answer at most (an answer also stops at the end of its turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024, value_name = "N",
          allow_negative_numbers = true, value_parser = positive)]
    pub n_predict: usize,
    #[command(flatten)]
    pub session: SessionFlags,
    #[command(flatten)]
    pub sampling: SamplingFlags,
}

/// `edge-run serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long = "host", default_value = "127.0.0.1", value_name = "ADDR")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (printed at start-up).
    #[arg(long = "port", default_value_t = 8080, value_name = "PORT")]
    pub port: u16,
    /// Requests generated at once: each slot is one session (a KV cache, planned and
    /// allocated at start-up) on its own thread; on the CPU the slots share one arena and
    /// run their decode steps together.
    #[arg(long = "slots", default_value_t = 1, value_name = "N", allow_negative_numbers = true, value_parser = slots)]
    pub slots: usize,
    /// Requests that may wait for a free slot; beyond that a request gets 503 with Retry-After.
    #[arg(long = "queue", default_value_t = 16, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub queue: usize,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Require `Authorization: Bearer KEY` on every request except GET /health.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// Serve GET /metrics (Prometheus text format).
    #[arg(long = "metrics")]
    pub metrics: bool,
    /// Save each slot's cached prompt (tokens and KV rows) in DIR on shutdown, as
    /// slot-N.state, and restore it at start-up.
    #[arg(long = "state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Use the Jinja chat template in FILE instead of the model's tokenizer.chat_template
    /// (e.g. one with a tool-call syntax, for requests with tools).
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
}

/// The most `serve --slots` takes (each slot is a session and a thread).
pub const MAX_SLOTS: usize = 256;

fn slots(s: &str) -> Result<usize, String> {
    match positive(s)? {
        n if n > MAX_SLOTS => Err(format!("must be at most {MAX_SLOTS}")),
        n => Ok(n),
    }
}

/// `edge-run perplexity`'s tokens per chunk without -c, as llama-perplexity's.
pub const PERPLEXITY_DEFAULT_CTX: usize = 512;

/// `edge-run perplexity`'s tokens per forward pass of the unscored half without -b.
pub const PERPLEXITY_DEFAULT_BATCH: usize = 512;

/// `edge-run perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    /// The text to score (UTF-8); not needed with --kl-divergence, whose base file holds the
    /// tokens.
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Tokens per chunk; the second half of each chunk is scored [default: 512; with
    /// --kl-divergence: the base file's].
    #[arg(short = 'c', long = "ctx", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    pub ctx: Option<usize>,
    /// Tokens per forward pass for the unscored first half of each chunk; 1 runs every token
    /// on its own, which reproduces llama-perplexity -b 1 bit for bit (the scored half always
    /// runs one token per pass).
    #[arg(short = 'b', long = "batch", value_name = "N", default_value_t = PERPLEXITY_DEFAULT_BATCH,
          allow_negative_numbers = true, value_parser = positive)]
    pub batch: usize,
    /// Evaluate at most N chunks [default: all the text holds].
    #[arg(long = "chunks", value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    pub chunks: Option<usize>,
    #[command(flatten)]
    pub compute: ComputeFlags,
    /// Without --kl-divergence: also write the base model's log-probabilities to FILE
    /// (llama.cpp's format). With it: read them from FILE.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare the model with the base model of --kl-divergence-base FILE: KL divergence,
    /// probability differences and same-top-token rate, as llama.cpp prints them.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
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

fn non_negative(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > u32::MAX as usize => Err(format!("must be at most {}", u32::MAX)),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a whole number >= 0".into()),
    }
}

/// The most `bench -r` takes: more adds nothing to a mean but hours of runtime.
pub const MAX_REPETITIONS: usize = 1000;

fn repetitions(s: &str) -> Result<usize, String> {
    match positive(s)? {
        n if n > MAX_REPETITIONS => Err(format!("must be at most {MAX_REPETITIONS}")),
        n => Ok(n),
    }
}

fn threads(s: &str) -> Result<usize, String> {
    let max = edge_engine::session::MAX_THREADS;
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a number of threads from 1 to {max}")),
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

fn device_arg(s: &str) -> Result<Device, String> {
    Device::parse(s)
}

fn kv_type(s: &str) -> Result<KvType, String> {
    KvType::from_name(s).ok_or_else(|| "use f16 or q8_0".to_string())
}

fn pooling_arg(s: &str) -> Result<Pooling, String> {
    Pooling::from_name(s).ok_or_else(|| "expected mean, cls or last".into())
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
