//! Tool calls ([`super::tools`]) read from the output as it is generated ([`ToolCallStream`]): text before a call
//! goes out as text, each call as soon as its name is known, then its arguments in fragments,
//! as OpenAI's streamed `delta.tool_calls` carry them. The whole output run through it gives
//! the same calls, so a streamed answer and a whole one agree.
//!
//! It relies on what the tool-call constraint guarantees: after the syntax's opening, the
//! output is a sequence of JSON objects `{"name": ..., "arguments": ...}` (name first), with
//! only the syntax's separators (`</tool_call>`, `, `, `; `, brackets) between them.

use serde_json::Value;

use super::tools::{call_id_from_seed, ToolCallSyntax, ToolFunction};
use super::ConstraintError;

#[cfg(test)]
mod tests;

/// What a piece of output amounts to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolStreamEvent {
    /// Text outside calls (the message's `content`).
    Text(String),
    /// A call begins: its index among the calls, its id and the function's name.
    CallStart {
        /// 0 for the first call of the output.
        index: usize,
        /// The call's id (see [`ToolCallStream::new`]).
        id: String,
        /// The function called.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text; the fragments joined are the arguments).
    Arguments {
        /// Which call.
        index: usize,
        /// The text.
        fragment: String,
    },
}

/// A call as the stream saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamedCall {
    /// Its id.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
    /// Whether the call's JSON object was closed (false for one cut by the token limit).
    pub complete: bool,
}

/// Where the scan of a call object stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Before the arguments' value (the name is read here).
    Head,
    /// Inside the arguments' value.
    Arguments,
    /// After it, until the object closes.
    Tail,
}

/// The call object being read.
struct Object {
    /// Its text up to the arguments' value.
    head: String,
    part: Part,
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl Object {
    fn new() -> Object {
        Object {
            head: String::from("{"),
            part: Part::Head,
            depth: 1,
            in_string: false,
            escaped: false,
        }
    }

    /// Moves the JSON scanner past `c`.
    fn step(&mut self, c: char) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
            }
            return;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }

    /// Whether the head ends with the arguments' key and its colon (at the object's level).
    fn at_arguments(&self, key: &str) -> bool {
        let h = self.head.trim_end();
        h.strip_suffix(':')
            .map(str::trim_end)
            .and_then(|h| h.strip_suffix('"'))
            .and_then(|h| h.strip_suffix(key))
            .is_some_and(|h| h.ends_with('"'))
    }

    /// The function's name, from the head.
    fn name(&self) -> String {
        let Some(at) = self.head.find("\"name\"") else {
            return String::new();
        };
        let rest = self.head[at + 6..].trim_start();
        let Some(rest) = rest.strip_prefix(':') else {
            return String::new();
        };
        serde_json::Deserializer::from_str(rest.trim_start())
            .into_iter::<String>()
            .next()
            .and_then(Result::ok)
            .unwrap_or_default()
    }
}

/// Splits a model's output, piece by piece, into text and tool calls (see the module's doc).
pub struct ToolCallStream {
    syntax: ToolCallSyntax,
    id_seed: u64,
    /// In text mode: the output not yet sent that could be the start of the trigger.
    held: String,
    /// Whether the calls have begun (always, from the start, for a forced call).
    in_calls: bool,
    object: Option<Object>,
    calls: Vec<StreamedCall>,
    text: String,
}

/// Opens call number `calls.len()` named `name`: its id (from `id_seed` and the index), and the
/// event that announces it.
fn start_call(
    calls: &mut Vec<StreamedCall>,
    syntax: ToolCallSyntax,
    id_seed: u64,
    name: String,
    out: &mut Vec<ToolStreamEvent>,
) {
    let index = calls.len();
    let id = call_id_from_seed(syntax, id_seed, index);
    out.push(ToolStreamEvent::CallStart {
        index,
        id: id.clone(),
        name: name.clone(),
    });
    calls.push(StreamedCall {
        id,
        name,
        arguments: String::new(),
        complete: false,
    });
}

impl ToolCallStream {
    /// A stream for one output. `forced`: the output is calls from its first token
    /// (`tool_choice` "required" or a named function); otherwise it is text until the syntax's
    /// opening. Call ids are derived from `id_seed` (one per request) and the call's index:
    /// `call_` and 24 hex digits, or for Mistral 9 letters and digits (what its template
    /// requires).
    pub fn new(syntax: ToolCallSyntax, forced: bool, id_seed: u64) -> ToolCallStream {
        ToolCallStream {
            syntax,
            id_seed,
            held: String::new(),
            in_calls: forced,
            object: None,
            calls: Vec::new(),
            text: String::new(),
        }
    }

    /// Reads `piece`, the next text of the output; appends what it amounts to to `out`.
    pub fn push(&mut self, piece: &str, out: &mut Vec<ToolStreamEvent>) {
        if self.in_calls {
            return self.scan(piece, out);
        }
        self.held.push_str(piece);
        let trigger = self.syntax.trigger();
        if let Some(at) = self.held.find(trigger) {
            let rest = self.held.split_off(at);
            let before = std::mem::take(&mut self.held);
            self.emit_text(before, out);
            self.in_calls = true;
            return self.scan(&rest, out);
        }
        // The longest end of the held text that begins the trigger stays held.
        let keep = (1..trigger.len().min(self.held.len() + 1))
            .rev()
            .find(|&k| self.held.ends_with(&trigger[..k]))
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        let send = std::mem::replace(&mut self.held, rest);
        self.emit_text(send, out);
    }

    fn emit_text(&mut self, t: String, out: &mut Vec<ToolStreamEvent>) {
        if !t.is_empty() {
            self.text.push_str(&t);
            out.push(ToolStreamEvent::Text(t));
        }
    }

    fn scan(&mut self, piece: &str, out: &mut Vec<ToolStreamEvent>) {
        let key = self.syntax.arguments_key();
        let mut fragment = String::new();
        for c in piece.chars() {
            let Some(obj) = &mut self.object else {
                // Between calls only the syntax's separators: a call starts at `{`.
                if c == '{' {
                    self.object = Some(Object::new());
                }
                continue;
            };
            let top = obj.depth == 1 && !obj.in_string;
            match obj.part {
                Part::Head if top && !c.is_whitespace() && obj.at_arguments(key) => {
                    obj.part = Part::Arguments;
                    start_call(&mut self.calls, self.syntax, self.id_seed, obj.name(), out);
                    if c == ',' || c == '}' {
                        // No value (not something the grammar allows): arguments end here.
                        obj.part = Part::Tail;
                    } else {
                        obj.step(c);
                        fragment.push(c);
                        continue;
                    }
                }
                Part::Arguments if top && (c == ',' || c == '}') => {
                    obj.part = Part::Tail;
                }
                Part::Arguments => {
                    if !(top && c.is_whitespace()) {
                        fragment.push(c);
                    }
                    obj.step(c);
                    continue;
                }
                Part::Head => obj.head.push(c),
                Part::Tail => {}
            }
            obj.step(c);
            if obj.depth == 0 {
                let obj = self.object.take().expect("an object is being read");
                if obj.part == Part::Head {
                    // A call without arguments: its name, and `{}`.
                    start_call(&mut self.calls, self.syntax, self.id_seed, obj.name(), out);
                    fragment.push_str("{}");
                }
                self.flush(&mut fragment, out);
                if let Some(last) = self.calls.last_mut() {
                    last.complete = true;
                }
            }
        }
        self.flush(&mut fragment, out);
    }

    fn flush(&mut self, fragment: &mut String, out: &mut Vec<ToolStreamEvent>) {
        if fragment.is_empty() {
            return;
        }
        let index = self.calls.len() - 1;
        self.calls[index].arguments.push_str(fragment);
        out.push(ToolStreamEvent::Arguments {
            index,
            fragment: std::mem::take(fragment),
        });
    }

    /// The end of the output: appends the text still held back to `out`.
    pub fn end(&mut self, out: &mut Vec<ToolStreamEvent>) {
        let held = std::mem::take(&mut self.held);
        self.emit_text(held, out);
    }

    /// The calls seen so far.
    pub fn calls(&self) -> &[StreamedCall] {
        &self.calls
    }

    /// The text outside calls sent so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Checks the complete calls against `tools`: each names one of them and its arguments
    /// are a JSON object (what a constrained generation guarantees; an error means a bug).
    pub fn check(&self, tools: &[ToolFunction]) -> Result<(), ConstraintError> {
        let fail = |m: String| ConstraintError::new("tool call output", m);
        for c in self.calls.iter().filter(|c| c.complete) {
            if !tools.iter().any(|t| t.name == c.name) {
                return Err(fail(format!(
                    "a call names an unknown function \"{}\"",
                    c.name
                )));
            }
            match serde_json::from_str::<Value>(&c.arguments) {
                Ok(Value::Object(_)) => {}
                _ => {
                    return Err(fail(format!(
                        "the arguments of \"{}\" are not a JSON object: {}",
                        c.name, c.arguments
                    )))
                }
            }
        }
        Ok(())
    }
}
