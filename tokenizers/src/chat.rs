//! Chat templates: the Jinja template a model ships (`tokenizer.chat_template`), rendered the way
//! HF transformers' `apply_chat_template` renders it (which is what llama.cpp's Jinja path mimics).
//!
//! The template is compiled once, with minijinja, in an environment set up like transformers':
//!
//! - `trim_blocks` and `lstrip_blocks` on; a single trailing newline of the source dropped;
//! - undefined values lenient, as jinja2's default `Undefined` (print empty, iterate empty, falsy);
//! - variables `messages` (a list of `{role, content}` maps), `add_generation_prompt`,
//!   `bos_token`, `eos_token`, and `tools` when given ([`ChatTemplate::render_with_tools`]);
//! - `raise_exception(msg)` fails the render with [`ChatTemplateError::Raised`];
//! - `strftime_now(fmt)` formats the current UTC time (strftime subset: `%Y %y %m %d %e %H %M %S
//!   %j %b %B %a %A %%`, and `%-d`-style unpadded forms);
//! - Python string / dict / list methods (`.strip()`, `.startswith()`, `.split()`, `.items()`,
//!   ...) through `minijinja-contrib`'s pycompat;
//! - a `tojson` filter that writes what Python's `json.dumps` writes with transformers' defaults
//!   (`ensure_ascii=False`, separators `", "` / `": "`, keys in insertion order, no HTML
//!   escaping), accepting `indent`, `ensure_ascii`, `separators` and `sort_keys`.
//!
//! A hostile template cannot hang, recurse or allocate without bound: each render runs with a
//! fuel budget that pays for instructions *and* for the data they create (minijinja 3 charges
//! strings and lists built by operators, filters and methods, ahead of building them where their
//! size is known: `'x' * n`, `indent(n)`, format widths, `.replace`), a recursion limit and a
//! cap on the output size (see [`ChatTemplateLimits`]); our `tojson` checks its own output as it
//! grows. A string doubled in a loop runs out of fuel at about `64 * fuel` bytes.

mod json;
mod time;

use std::io;

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use crate::chat::json::tojson;
use crate::chat::time::strftime_now;

/// The name the template is registered under; minijinja's error locations name it.
const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (whatever the template expects).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Resource limits applied to every render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatTemplateLimits {
    /// The fuel one render may use: about one unit per instruction executed and per 64 bytes
    /// of data it creates (strings and lists from operators, literals, filters, methods; its
    /// output), paid before a value whose size is known ahead is built. It bounds both time and
    /// memory: `n` fuel allocate at most about `64 n` bytes.
    pub fuel: u64,
    /// Nesting depth (loops, macro calls, recursive loops); at most 500, minijinja's maximum.
    pub recursion: usize,
    /// Bytes one render may output.
    pub max_output_bytes: usize,
}

impl Default for ChatTemplateLimits {
    /// 2,000,000 fuel, depth 128, 16 MiB of output: far above what real templates need for
    /// long conversations, small enough to stop a runaway template within a second and to keep
    /// what it can allocate near 128 MB (fuel pays for data too: see [`ChatTemplateLimits::fuel`]).
    fn default() -> Self {
        ChatTemplateLimits {
            fuel: 2_000_000,
            recursion: 128,
            max_output_bytes: 16 << 20,
        }
    }
}

/// What went wrong compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template does not compile.
    #[error("chat template syntax error{}: {message}", at_line(*line))]
    Syntax {
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// What the parser said.
        message: String,
    },
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// The render used more fuel (instructions and data) than [`ChatTemplateLimits::fuel`]
    /// allows.
    #[error(
        "chat template stopped: it used up its fuel of {limit} (instructions, and data it creates: a runaway loop, or a string or list grown too large?)"
    )]
    OutOfFuel {
        /// The budget that was exhausted.
        limit: u64,
    },
    /// The render nested deeper than [`ChatTemplateLimits::recursion`].
    #[error("chat template stopped{}: recursion deeper than {limit} (runaway recursion?)", at_line(*line))]
    RecursionLimit {
        /// The depth limit.
        limit: usize,
        /// 1-based line where it was exceeded, when known.
        line: Option<usize>,
    },
    /// The output grew past [`ChatTemplateLimits::max_output_bytes`].
    #[error("chat template stopped: output larger than {limit} bytes")]
    OutputTooLarge {
        /// The cap in bytes.
        limit: usize,
    },
    /// Any other failure while rendering (an invalid operation, a bad filter argument, ...).
    #[error("chat template render error{}: {message}", at_line(*line))]
    Render {
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// What went wrong.
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// The payload of `raise_exception`, attached to the minijinja error so that it can be told
/// apart from the engine's own errors.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// A compiled chat template, ready to render conversations.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    limits: ChatTemplateLimits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the default [`ChatTemplateLimits`]. A syntax error is returned as
    /// [`ChatTemplateError::Syntax`] with its line.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        Self::with_limits(source, bos_token, eos_token, ChatTemplateLimits::default())
    }

    /// Compiles `source`, rendering later under `limits`.
    pub fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: ChatTemplateLimits,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| ChatTemplateError::Syntax {
                    line: None,
                    message: detail(&e),
                })?,
        );
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion);
        env.set_unknown_method_callback(python_method);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax {
                line: e.line(),
                message: detail(&e),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            limits,
        })
    }

    /// The limits every render runs under.
    pub fn limits(&self) -> ChatTemplateLimits {
        self.limits
    }

    /// Renders the conversation; with `add_generation_prompt` the template appends the header
    /// that opens the assistant's reply.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders the conversation with `tools` (OpenAI function-calling tool definitions, a JSON
    /// array of `{"type": "function", "function": {...}}`) in the template's `tools` variable,
    /// as transformers' `apply_chat_template(tools=...)` does; `None` leaves it undefined.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let messages = messages
            .iter()
            .map(|m| {
                Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())])
            })
            .collect();
        self.render_values(messages, tools, add_generation_prompt)
    }

    /// Renders messages given as JSON objects, with whatever keys they carry (OpenAI's
    /// `tool_calls` on an assistant message, `tool_call_id` and `name` on a `tool` message),
    /// as transformers passes message dicts to the template.
    pub fn render_json_messages(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let messages = messages.iter().map(json_value).collect();
        self.render_values(messages, tools, add_generation_prompt)
    }

    fn render_values(
        &self,
        messages: Vec<Value>,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.convert(e, false))?;
        let ctx = minijinja::context! {
            messages => Value::from(messages),
            add_generation_prompt => add_generation_prompt,
            tools => tools.map_or(Value::UNDEFINED, json_value),
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: self.limits.max_output_bytes,
            overflowed: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.buf).map_err(|_| ChatTemplateError::Render {
                line: None,
                message: "output is not valid UTF-8".into(),
            }),
            Err(e) => Err(self.convert(e, out.overflowed)),
        }
    }

    fn convert(&self, e: Error, overflowed: bool) -> ChatTemplateError {
        if overflowed {
            return ChatTemplateError::OutputTooLarge {
                limit: self.limits.max_output_bytes,
            };
        }
        // raise_exception's payload, wherever it sits in the chain.
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = src {
            if let Some(r) = s.downcast_ref::<RaisedException>() {
                return ChatTemplateError::Raised(r.0.clone());
            }
            if let Some(inner) = s.downcast_ref::<Error>() {
                match inner.kind() {
                    ErrorKind::OutOfFuel => {
                        return ChatTemplateError::OutOfFuel {
                            limit: self.limits.fuel,
                        }
                    }
                    ErrorKind::InvalidOperation
                        if inner.detail() == Some("recursion limit exceeded") =>
                    {
                        return ChatTemplateError::RecursionLimit {
                            limit: self.env.recursion_limit(),
                            line: inner.line().or(e.line()),
                        }
                    }
                    _ => {}
                }
            }
            src = s.source();
        }
        ChatTemplateError::Render {
            line: e.line(),
            message: detail(&e),
        }
    }
}

/// A JSON value as a template value (objects keep their key order).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

/// The error's own message (minijinja's `Display` also appends the location).
fn detail(e: &Error) -> String {
    match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    }
}

/// An `io::Write` into memory that refuses to grow past `cap` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            self.overflowed = true;
            return Err(io::Error::other("chat template output too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The widest field `str.format` may pad to in a template: real templates pad nothing, and
/// minijinja's `str.format` (unlike its `format` filter) builds the padding before the fuel
/// budget sees it, so `'{:>20000000000}'.format(x)` would allocate 20 GB.
const MAX_FORMAT_WIDTH: u64 = 1 << 16;

/// Python's string, list and dict methods (minijinja-contrib's pycompat), with `str.format`'s
/// widths and precisions checked first.
fn python_method(
    state: &mut minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "format" {
        if let Some(s) = value.as_str() {
            check_format_widths(s)?;
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Refuses a `str.format` string whose replacement fields ask for a width or precision above
/// [`MAX_FORMAT_WIDTH`], or take one from an argument (a nested `{}`).
fn check_format_widths(format: &str) -> Result<(), Error> {
    let refuse = |what: String| {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "str.format: {what} (chat templates pad at most {MAX_FORMAT_WIDTH} characters)"
            ),
        ))
    };
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after; // `{{` is a literal brace
            continue;
        }
        let close = rest.find('}').unwrap_or(rest.len());
        let field = &rest[..close];
        rest = &rest[close.min(rest.len())..];
        let Some((_, spec)) = field.split_once(':') else {
            continue;
        };
        if spec.contains('{') {
            return refuse(format!("a width from an argument in '{{{field}}}'"));
        }
        for run in spec.split(|c: char| !c.is_ascii_digit()) {
            if !run.is_empty() && run.parse::<u64>().map_or(true, |n| n > MAX_FORMAT_WIDTH) {
                return refuse(format!("width or precision {run} in '{{{field}}}'"));
            }
        }
    }
    Ok(())
}

/// `raise_exception(msg)`: fails the render with `msg`, as transformers' helper does.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

#[cfg(test)]
mod tests;
