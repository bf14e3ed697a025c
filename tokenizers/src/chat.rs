//! Chat templates: the Jinja template a model ships (`tokenizer.chat_template`), rendered the way
//! HF transformers' `apply_chat_template` renders it (which is what llama.cpp's Jinja path mimics).
//!
//! The template is compiled once, with minijinja, in an environment set up like transformers':
//!
//! - `trim_blocks` and `lstrip_blocks` on; a single trailing newline of the source dropped;
//! - undefined values lenient, as jinja2's default `Undefined` (print empty, iterate empty, falsy);
//! - variables `messages` (a list of `{role, content}` maps), `add_generation_prompt`,
//!   `bos_token`, `eos_token`;
//! - `raise_exception(msg)` fails the render with [`ChatTemplateError::Raised`];
//! - `strftime_now(fmt)` formats the current UTC time (strftime subset: `%Y %y %m %d %e %H %M %S
//!   %j %b %B %a %A %%`, and `%-d`-style unpadded forms);
//! - Python string / dict / list methods (`.strip()`, `.startswith()`, `.split()`, `.items()`,
//!   ...) through `minijinja-contrib`'s pycompat;
//! - a `tojson` filter that writes what Python's `json.dumps` writes with transformers' defaults
//!   (`ensure_ascii=False`, separators `", "` / `": "`, keys in insertion order, no HTML
//!   escaping), accepting `indent`, `ensure_ascii`, `separators` and `sort_keys`.
//!
//! A hostile template cannot hang or recurse without bound: each render runs with a fuel budget
//! (instructions), a recursion limit and a cap on the output size (see [`ChatTemplateLimits`]).
//! Not bounded: a template can still build a large string in few instructions (say by doubling
//! it in a loop); the fuel budget only limits how many such steps it takes.

use std::fmt::Write as _;
use std::io;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};

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
    /// Template instructions one render may execute.
    pub fuel: u64,
    /// Nesting depth (loops, macro calls, recursive loops); at most 500, minijinja's maximum.
    pub recursion: usize,
    /// Bytes one render may output.
    pub max_output_bytes: usize,
}

impl Default for ChatTemplateLimits {
    /// 5,000,000 instructions, depth 128, 16 MiB of output: far above what real templates need
    /// for long conversations, small enough to stop a runaway template within a second.
    fn default() -> Self {
        ChatTemplateLimits {
            fuel: 5_000_000,
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
    /// The render executed more instructions than [`ChatTemplateLimits::fuel`] allows.
    #[error("chat template stopped: it ran more than {limit} instructions (runaway loop?)")]
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
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
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
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.convert(e, false))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
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

/// `raise_exception(msg)`: fails the render with `msg`, as transformers' helper does.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

/// `strftime_now(fmt)`: the current time (UTC) formatted with a strftime subset.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &fmt)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Formats Unix time `secs` (UTC); unknown directives are copied through.
fn strftime(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let jan1 = days - civil_days_before(y, m, d);
    let yday = days - jan1 + 1;
    let wday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hh, mm, ss) = (tod / 3600, tod / 60 % 60, tod % 60);
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[wday];

    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |out: &mut String, v: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match spec {
            Some('Y') => {
                let _ = write!(out, "{y}");
            }
            Some('y') => num(&mut out, y.rem_euclid(100), 2),
            Some('m') => num(&mut out, m.into(), 2),
            Some('d') => num(&mut out, d.into(), 2),
            Some('e') => {
                let _ = write!(out, "{d:>2}");
            }
            Some('H') => num(&mut out, hh, 2),
            Some('M') => num(&mut out, mm, 2),
            Some('S') => num(&mut out, ss, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(day),
            Some('a') => out.push_str(&day[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days from January 1st of year `y` to (y, m, d).
fn civil_days_before(y: i64, m: u32, d: u32) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    CUM[(m - 1) as usize] + i64::from(leap && m > 2) + i64::from(d) - 1
}

/// JSON output settings of `tojson`, as Python's `json.dumps` takes them.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// How deep `tojson` descends before giving up (values can be self-referential).
const MAX_JSON_DEPTH: usize = 128;

/// `tojson`: transformers' `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_owned())
            } else if let Some(n) = v.as_i64() {
                Some(" ".repeat(n.clamp(0, 64) as usize))
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn json_newline(out: &mut String, style: &JsonStyle, level: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, level: usize) -> Result<(), Error> {
    if level > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_json_number(out, v),
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, level + 1);
                match k.as_str() {
                    Some(s) => write_json_str(out, s, style),
                    None => {
                        // Python turns non-string keys into strings: 1 -> "1", None -> "null".
                        let mut key = String::new();
                        write_json(&mut key, k, style, level + 1)?;
                        let key = key.trim_matches('"').to_owned();
                        write_json_str(out, &key, style);
                    }
                }
                out.push_str(&style.key_sep);
                let item = v.get_item(k)?;
                write_json(out, &item, style, level + 1)?;
            }
            json_newline(out, style, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut first = true;
            out.push('[');
            for item in v.try_iter()? {
                if !first {
                    out.push_str(&style.item_sep);
                }
                first = false;
                json_newline(out, style, level + 1);
                write_json(out, &item, style, level + 1)?;
            }
            if !first {
                json_newline(out, style, level);
            }
            out.push(']');
        }
        // bytes, plain objects, ...: their string form.
        _ => write_json_str(out, &v.to_string(), style),
    }
    Ok(())
}

fn write_json_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        // any width, including i128 / u128
        let _ = write!(out, "{v}");
        return;
    }
    let Ok(f) = f64::try_from(v.clone()) else {
        let _ = write!(out, "{v}");
        return;
    };
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        // Python's repr of an integral float keeps ".0".
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f}");
    }
}

fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tokenizer.chat_template` of models/SmolLM2-135M-Instruct.Q4_1.gguf, verbatim.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Meta-Llama-3-8B-Instruct's template.
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    /// A ChatML template written over several lines, Qwen-style, with a default system prompt
    /// and a `raise_exception` guard.
    const CHATML: &str = r#"{%- if messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a helpful assistant.' %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}
{%- for message in rest %}
    {%- if message.role not in ['user', 'assistant'] %}
        {{- raise_exception('Unexpected role: ' + message.role) }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    fn render(src: &str, m: &[(&str, &str)], gen: bool) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(src, "<s>", "</s>")?.render(&msgs(m), gen)
    }

    #[test]
    fn smollm2_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "Hi")]), true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs(&[("user", "Hi")]), false).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn smollm2_own_system_prompt_and_turns() {
        let out = render(
            SMOLLM2,
            &[
                ("system", "Be brief."),
                ("user", "Hi"),
                ("assistant", "Hello."),
                ("user", "2+2?"),
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_with_system_and_bos() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let out = t
            .render(
                &msgs(&[("system", "You are terse."), ("user", "  Hi \n")]),
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn chatml_with_and_without_system() {
        let out = render(CHATML, &[("system", "Be brief."), ("user", " Hi ")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = render(CHATML, &[("user", "Hi"), ("assistant", "Yo")], false).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
        );
    }

    #[test]
    fn trim_blocks_and_lstrip_blocks_like_transformers() {
        // No `-` modifiers: the block-only lines must vanish entirely, indentation included.
        let src = "{% for m in messages %}\n    {% if m.role == 'system' %}\n<<SYS>>{{ m.content }}<</SYS>>\n    {% else %}\n[{{ m.role | upper }}] {{ m.content }}\n    {% endif %}\n{% endfor %}\n";
        let out = render(src, &[("system", "Be brief."), ("user", "Hi")], false).unwrap();
        assert_eq!(out, "<<SYS>>Be brief.<</SYS>>\n[USER] Hi\n");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let err = render(CHATML, &[("tool", "x")], true).unwrap_err();
        match &err {
            ChatTemplateError::Raised(m) => assert_eq!(m, "Unexpected role: tool"),
            other => panic!("expected Raised, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "chat template raised an exception: Unexpected role: tool"
        );
        // also from inside a macro
        let src = "{% macro f() %}{{ raise_exception('deep') }}{% endmacro %}{{ f() }}";
        assert!(
            matches!(render(src, &[], false), Err(ChatTemplateError::Raised(m)) if m == "deep")
        );
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = ChatTemplate::new(
            "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
            "",
            "",
        )
        .unwrap_err();
        match &err {
            ChatTemplateError::Syntax { line, .. } => assert_eq!(*line, Some(2)),
            other => panic!("expected Syntax, got {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.starts_with("chat template syntax error at line 2: "),
            "{text}"
        );
        let err = ChatTemplate::new("a\nb\n{% if x %}\nfoo\n", "", "").unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Syntax { line: Some(_), .. }),
            "{err}"
        );
    }

    #[test]
    fn undefined_is_lenient() {
        let src = "[{{ nothing }}]{% for x in nothing %}x{% endfor %}{% if nothing %}y{% endif %}{{ messages[7] }}{{ messages[0].missing }}{% if tools is not defined %}ok{% endif %}";
        assert_eq!(render(src, &[("user", "Hi")], false).unwrap(), "[]ok");
    }

    #[test]
    fn python_string_methods() {
        let src = "{% for m in messages %}{{ m.content.strip() }}|{% if m.content.startswith(' a') %}yes{% endif %}|{{ m.content.split(',') | length }}|{{ m.content.lstrip().upper() }}|{{ m.content.replace('b', 'B') }}|{% if m.role.endswith('er') %}yes{% endif %}{% endfor %}";
        let out = render(src, &[("user", " a,b,c ")], false).unwrap();
        assert_eq!(out, "a,b,c|yes|3|A,B,C | a,B,c |yes");
    }

    #[test]
    fn tojson_like_python_json_dumps() {
        let src = "{{ messages | tojson }}";
        let out = render(src, &[("user", "Hi \"there\" <b> é\n")], false).unwrap();
        assert_eq!(
            out,
            r#"[{"role": "user", "content": "Hi \"there\" <b> é\n"}]"#
        );
        let src = "{{ {'b': 1, 'a': [true, none, 1.5, 2.0], 'c': {}} | tojson }}";
        assert_eq!(
            render(src, &[], false).unwrap(),
            r#"{"b": 1, "a": [true, null, 1.5, 2.0], "c": {}}"#
        );
        let src = "{{ {'b': 1, 'a': [1, 2], 'c': []} | tojson(indent=2) }}";
        assert_eq!(
            render(src, &[], false).unwrap(),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ],\n  \"c\": []\n}"
        );
        let src = "{{ {'b': 'é', 'a': 1} | tojson(sort_keys=true, ensure_ascii=true, separators=[',', ':']) }}";
        assert_eq!(render(src, &[], false).unwrap(), r#"{"a":1,"b":"\u00e9"}"#);
    }

    #[test]
    fn hostile_loop_runs_out_of_fuel() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let start = std::time::Instant::now();
        let err = render(src, &[], false).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::OutOfFuel { limit: 5_000_000 }),
            "{err:?}"
        );
        assert!(err.to_string().contains("instructions"), "{err}");
        assert!(start.elapsed().as_secs() < 20);
    }

    #[test]
    fn hostile_recursion_is_stopped() {
        let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let err = render(src, &[], false).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::RecursionLimit { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("recursion"), "{err}");
        let src = "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}";
        let err = render(src, &[("user", "x")], false).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::RecursionLimit { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn hostile_output_is_capped() {
        let src = "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}";
        let err = render(src, &[], false).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::OutputTooLarge { limit } if limit == 16 << 20),
            "{err:?}"
        );
        // custom limits
        let limits = ChatTemplateLimits {
            max_output_bytes: 10,
            ..ChatTemplateLimits::default()
        };
        let t = ChatTemplate::with_limits("{{ 'x' * 11 }}", "", "", limits).unwrap();
        assert!(matches!(
            t.render(&[], false),
            Err(ChatTemplateError::OutputTooLarge { limit: 10 })
        ));
        let t = ChatTemplate::with_limits("{{ 'x' * 10 }}", "", "", limits).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "xxxxxxxxxx");
    }

    #[test]
    fn other_errors_are_render_errors_with_line() {
        let err = render("ok\n{{ 1 + 'a' }}", &[], false).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Render { line: Some(2), .. }),
            "{err:?}"
        );
    }

    #[test]
    fn strftime_subset() {
        assert_eq!(strftime(0, "%d %b %Y"), "01 Jan 1970");
        // 2024-07-26 13:05:09 UTC, a Friday, day 208
        let t = 1_721_999_109;
        assert_eq!(strftime(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(t, "%A %a %B %m/%-d/%y %H:%M:%S %j %% %Q"),
            "Friday Fri July 07/26/24 13:05:09 208 % %Q"
        );
        // 2000-02-29, leap day
        assert_eq!(strftime(951_782_400, "%Y-%m-%d %j"), "2000-02-29 060");
        let t = ChatTemplate::new("{{ strftime_now('%Y') | length }}", "", "").unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "4");
    }
}
