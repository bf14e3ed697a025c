//! `edge-run chat MODEL`: an interactive multi-turn chat. Each line read from stdin is a user
//! message (a line ending with `\` continues on the next); the conversation is rendered through
//! the model's chat template and generated with the library's prompt cache
//! ([`Session::generator_cached`]), so the history stays in the KV cache and each turn only
//! processes its new tokens. The answer streams to stdout; the prompt, notices and errors go to
//! stderr (the prompt only when stdin is a terminal), so piped input gives just the answers.
//!
//! Commands: `/reset`, `/save FILE`, `/load FILE`, `/help`, `/exit` (or Ctrl-D). Ctrl-C stops
//! the current answer and returns to the prompt.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use edge_engine::error::EngineError;
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::model::Model;
use edge_engine::session::Session;
use edge_tokenizers::chat::{ChatMessage, ChatTemplate};

use crate::args::ChatArgs;
use crate::errors::{hint, load_model, refuse_encoder, CliError, CliResult};
use crate::output::MAX_TEXT_BYTES;
use crate::session::open_session;
use crate::signals::interrupt_flag;

/// What `/help` prints.
const HELP: &str = "\
Type a message and press Enter (end a line with \\ to continue it on the next).
  /reset       forget the conversation (the system message stays)
  /save FILE   save the conversation and its KV cache to FILE
  /load FILE   continue a conversation saved with /save (same model and settings)
  /help        this list
  /exit        quit (or Ctrl-D)
Ctrl-C stops the current answer.";

/// Runs the chat until end of input or `/exit`; returns the exit status.
pub fn chat(a: ChatArgs) -> CliResult<u8> {
    let sampling = a.sampling.config()?;
    let model = Arc::new(load_model(&a.model)?);
    refuse_encoder(&a.model, &model)?;
    a.session.check_ctx(&model)?;
    let template = chat_template(&a.model, &model)?;
    let cfg = a.session.config(&model)?;
    let budget = a.session.memory.budget()?;
    let mut session = open_session(&model, &cfg, budget.as_ref())?;
    let interrupted = interrupt_flag()?;
    session.set_interrupt(Arc::clone(&interrupted));
    let system: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let mut chat = Chat {
        model,
        session,
        template,
        messages: system.clone(),
        system,
        options: GenerateOptions {
            max_tokens: a.n_predict,
            sampling,
            stop_at_eog: true,
            // As the one-shot `--chat`: control tokens the model writes are shown.
            render_special: true,
            constraint: None,
        },
        interrupted,
    };
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!(
            "edge-run chat: {} (context {} tokens). /help lists the commands; Ctrl-D or /exit quits.",
            a.model.display(),
            chat.session.ctx()
        );
    }
    let mut input = stdin.lock();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = read_message(&mut input)? else {
            break;
        };
        // A Ctrl-C at the prompt does not stop the next answer.
        chat.interrupted.store(false, Ordering::Relaxed);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            let (name, arg) = command
                .split_once(char::is_whitespace)
                .map_or((command, ""), |(n, a)| (n, a.trim()));
            match name {
                "exit" | "quit" => break,
                "help" => eprintln!("{HELP}"),
                "reset" => chat.reset(),
                "save" | "load" if arg.is_empty() => {
                    eprintln!("error: /{name} needs a file: /{name} FILE")
                }
                "save" => chat.save(Path::new(arg)),
                "load" => chat.load(Path::new(arg)),
                _ => eprintln!("error: unknown command /{name}: /help lists the commands"),
            }
            continue;
        }
        chat.answer(line)?;
    }
    Ok(0)
}

/// The conversation: its messages, and the session whose KV cache holds their rendering.
struct Chat {
    model: Arc<Model>,
    session: Session,
    template: ChatTemplate,
    /// The system message given with --system (kept by /reset).
    system: Vec<ChatMessage>,
    messages: Vec<ChatMessage>,
    options: GenerateOptions,
    interrupted: Arc<AtomicBool>,
}

impl Chat {
    /// Answers `text`: renders the conversation with it, generates (reusing the KV cache of
    /// the turns before) and streams the answer. Errors of this turn are reported and the
    /// turn dropped; only errors that end the program (the model file changed, a write to
    /// stdout failed) are returned.
    fn answer(&mut self, text: &str) -> CliResult {
        self.messages
            .push(ChatMessage::new("user", text.to_string()));
        match self.generate() {
            Ok(Some(answer)) => {
                self.messages.push(ChatMessage::new("assistant", answer));
                Ok(())
            }
            Ok(None) => {
                self.messages.pop();
                Ok(())
            }
            Err(Fail::Turn(e)) if e.code == 1 => {
                self.messages.pop();
                eprintln!("error: {}", e.msg);
                Ok(())
            }
            Err(Fail::Turn(e) | Fail::Fatal(e)) => Err(e),
        }
    }

    /// Generates the answer to the conversation; `None` when the turn did not run (a notice
    /// was printed).
    fn generate(&mut self) -> Result<Option<String>, Fail> {
        let rendered = self
            .template
            .render(&self.messages, true)
            .map_err(|e| Fail::Turn(format!("the model's chat template: {e}").into()))?;
        let tok = &self.model.tokenizer;
        let ids = tok
            .encode(&rendered, tok.add_bos(), true)
            .map_err(|e| Fail::Turn(format!("tokenizing the conversation: {e}").into()))?;
        let ctx = self.session.ctx();
        if ids.len() >= ctx {
            eprintln!(
                "error: the conversation would take {} tokens and the context holds {ctx}: /reset to start over, or restart with a larger --ctx",
                ids.len()
            );
            return Ok(None);
        }
        let t_prompt = Instant::now();
        let reused = self.session.reuse_prefix(&ids);
        let mut gen = match self.session.generator_cached(&ids, &self.options) {
            Ok(gen) => gen,
            Err(EngineError::Interrupted { .. }) => {
                eprintln!("[interrupted]");
                // The chunks processed stay in the cache, matching the conversation's tokens.
                return Ok(None);
            }
            Err(e) => return Err(Fail::Turn(e.into())),
        };
        let prompt_s = t_prompt.elapsed().as_secs_f64();
        let t_gen = Instant::now();
        let mut stdout = std::io::stdout().lock();
        let write_err = |e: std::io::Error| Fail::Fatal(format!("writing output: {e}").into());
        let mut answer = String::new();
        while let Some(token) = gen.next() {
            token.map_err(|e| Fail::Turn(e.into()))?;
            stdout.write_all(gen.text().as_bytes()).map_err(write_err)?;
            stdout.flush().map_err(write_err)?;
            answer.push_str(gen.text());
            if self.interrupted.load(Ordering::Relaxed) {
                gen.stop();
            }
        }
        answer.push_str(gen.text());
        stdout.write_all(gen.text().as_bytes()).map_err(write_err)?;
        stdout.write_all(b"\n").map_err(write_err)?;
        stdout.flush().map_err(write_err)?;
        let done = gen.result();
        drop(gen);
        match done.stop_reason {
            _ if self.interrupted.load(Ordering::Relaxed) => eprintln!("[stopped]"),
            StopReason::ContextFull => {
                eprintln!(
                    "[the context is full: /reset to start over, or restart with a larger --ctx]"
                )
            }
            _ => {}
        }
        log::info!(
            "prompt: {} tokens, {reused} of them from the cache, in {:.0} ms; answer: {} tokens in {:.0} ms ({:.1} tok/s)",
            ids.len(),
            prompt_s * 1e3,
            done.n_tokens,
            t_gen.elapsed().as_secs_f64() * 1e3,
            done.n_tokens as f64 / t_gen.elapsed().as_secs_f64().max(1e-9)
        );
        Ok(Some(answer))
    }

    fn reset(&mut self) {
        self.messages = self.system.clone();
        self.session.reset();
        eprintln!("[conversation reset]");
    }

    /// `/save FILE`: the session's state, with the messages as JSON in its data.
    fn save(&mut self, path: &Path) {
        let messages: Vec<_> = self
            .messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let data = serde_json::Value::Array(messages).to_string();
        match self.session.save_state_with_data(path, data.as_bytes()) {
            Ok(()) => eprintln!(
                "[saved {} messages, {} tokens to {}]",
                self.messages.len(),
                self.session.n_past(),
                path.display()
            ),
            Err(e) => eprintln!("error: /save: {}", hint(&e)),
        }
    }

    /// `/load FILE`: a conversation saved by `/save`; on any error the current one stays.
    fn load(&mut self, path: &Path) {
        let data = match self.session.load_state_with_data(path) {
            Ok(data) => data,
            Err(e) => {
                eprintln!("error: /load: {}", hint(&e));
                return;
            }
        };
        match parse_messages(&data) {
            Some(messages) => {
                eprintln!(
                    "[loaded {} messages, {} tokens from {}]",
                    messages.len(),
                    self.session.n_past(),
                    path.display()
                );
                self.messages = messages;
            }
            None => {
                // The state itself was fine (a --prompt-cache file, say), but not a chat.
                self.reset();
                eprintln!(
                    "error: /load: {} holds no chat messages (it was not written by /save); the conversation was reset",
                    path.display()
                );
            }
        }
    }
}

/// A turn that failed: reported and dropped (`Turn`, unless the model file changed), or the
/// end of the program (`Fatal`: stdout cannot be written).
enum Fail {
    Turn(CliError),
    Fatal(CliError),
}

/// The messages `/save` stored: a JSON array of {"role", "content"} strings.
fn parse_messages(data: &[u8]) -> Option<Vec<ChatMessage>> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    value
        .as_array()?
        .iter()
        .map(|m| {
            Some(ChatMessage::new(
                m.get("role")?.as_str()?,
                m.get("content")?.as_str()?,
            ))
        })
        .collect()
}

/// Reads one message: a line, or several when each but the last ends with `\`. `None` at the
/// end of input. A line that is not UTF-8 or longer than [`MAX_TEXT_BYTES`] is reported and
/// skipped.
fn read_message(input: &mut impl BufRead) -> CliResult<Option<String>> {
    let mut message = String::new();
    loop {
        let mut line = Vec::new();
        let n = std::io::Read::take(&mut *input, MAX_TEXT_BYTES)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("reading standard input: {e}"))?;
        if n == 0 {
            return Ok((!message.is_empty()).then_some(message));
        }
        if !line.ends_with(b"\n") && n as u64 == MAX_TEXT_BYTES {
            eprintln!(
                "error: a line longer than {} MiB was skipped",
                MAX_TEXT_BYTES >> 20
            );
            skip_line(input)?;
            return Ok(Some(String::new()));
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            eprintln!("error: the line is not UTF-8 text; it was skipped");
            return Ok(Some(String::new()));
        };
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        match text.strip_suffix('\\') {
            Some(head) => {
                message.push_str(head);
                message.push('\n');
            }
            None => {
                message.push_str(text);
                return Ok(Some(message));
            }
        }
    }
}

/// Drops the rest of an over-long line.
fn skip_line(input: &mut impl BufRead) -> CliResult {
    loop {
        let buf = input
            .fill_buf()
            .map_err(|e| format!("reading standard input: {e}"))?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// The model's chat template, or the error that it has none.
fn chat_template(path: &Path, model: &Model) -> CliResult<ChatTemplate> {
    let tok = &model.tokenizer;
    let source = model.chat_template.as_deref().ok_or_else(|| {
        CliError::usage(format!(
            "chat: {} has no tokenizer.chat_template; use `edge-run MODEL -p PROMPT` and format the prompt yourself",
            path.display()
        ))
    })?;
    let piece =
        |id: Option<u32>| id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned());
    ChatTemplate::new(
        source,
        &piece(tok.bos_id()).unwrap_or_default(),
        &piece(tok.eos_id()).unwrap_or_default(),
    )
    .map_err(|e| format!("chat: the model's chat template: {e}").into())
}
