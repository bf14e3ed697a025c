//! Tool calls over HTTP, as OpenAI's API shapes them: the request's `tools`, `tool_choice`
//! and `parallel_tool_calls` checked ([`parse_tool_request`]); assistant messages carrying
//! `tool_calls` in the history made ready for the chat template ([`history_tool_calls`]); and
//! the answer's `tool_calls`, whole or as streamed `delta.tool_calls` chunks, from the
//! library's [`ToolCallStream`].

use edge_engine::constrain::tool_stream::{ToolCallStream, ToolStreamEvent};
use edge_engine::constrain::tools::{
    parse_tools, tool_call_constraint, tools_value, ToolCallSyntax, ToolChoice, ToolFunction,
};
use edge_engine::constrain::Constraint;
use serde_json::{json, Map, Value};

use super::error::ApiError;

/// The tools a request gives the model, checked.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The functions.
    pub functions: Vec<ToolFunction>,
    /// The tools as the chat template's `tools` variable gets them.
    pub value: Value,
    /// `tool_choice` (default "auto").
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: several calls in one answer (default false, as llama-server: a
    /// small model given room for more tends to repeat its call until the token limit).
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether the answer is calls from its first token ("required" or a named function).
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// The constraint on the answer for the template's `syntax`; `None` for "none".
    pub fn constraint(&self, syntax: ToolCallSyntax) -> Result<Option<Constraint>, ApiError> {
        tool_call_constraint(syntax, &self.functions, &self.choice, self.parallel)
            .map_err(|e| ApiError::field("tools", e.message))
    }
}

const CHOICE_FORMS: &str = "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";

fn choice(v: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    let bad = || ApiError::field("tool_choice", CHOICE_FORMS);
    Ok(Some(match v {
        None => return Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "none" | "auto" | "required" => ToolChoice::parse(s),
            _ => return Err(bad()),
        },
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad());
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(bad)?;
            ToolChoice::Function(name.to_string())
        }
        Some(_) => return Err(bad()),
    }))
}

/// The request's tools, if it gives any (`tools` absent, `null` or with `tool_choice: "none"`
/// and no tools: `None`).
pub fn parse_tool_request(o: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let get = |name: &str| o.get(name).filter(|v| !v.is_null());
    for name in ["functions", "function_call"] {
        if get(name).is_some() {
            return Err(ApiError::field(
                name,
                "the deprecated functions API is not supported: send tools and tool_choice instead",
            ));
        }
    }
    let choice = choice(get("tool_choice"))?;
    let parallel = match get("parallel_tool_calls") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::field(
                "parallel_tool_calls",
                "must be true or false",
            ))
        }
    };
    let Some(tools) = get("tools") else {
        return match choice {
            None | Some(ToolChoice::None) | Some(ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::field(
                "tool_choice",
                "asks for a tool call but the request has no tools: add tools, or leave tool_choice out",
            )),
        };
    };
    let functions = parse_tools(tools).map_err(|e| ApiError::field("tools", e.message))?;
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Function(name) = &choice {
        if !functions.iter().any(|f| &f.name == name) {
            let names: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
            return Err(ApiError::field(
                "tool_choice",
                format!(
                    "names the function \"{name}\", which is not among the tools ({})",
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(Some(ToolRequest {
        value: tools_value(&functions),
        functions,
        choice,
        parallel,
    }))
}

/// The `tool_calls` of history message `i`, as chat templates expect them: `arguments` as a
/// JSON object (OpenAI sends it as JSON text; templates write it with `tojson`).
pub fn history_tool_calls(i: usize, calls: &Value) -> Result<Value, ApiError> {
    let field = |j: Option<usize>, rest: &str| match j {
        None => format!("messages[{i}].tool_calls"),
        Some(j) => format!("messages[{i}].tool_calls[{j}]{rest}"),
    };
    let list = calls.as_array().ok_or_else(|| {
        ApiError::field(
            &field(None, ""),
            "must be an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
        )
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let f = c.get("function").filter(|f| f.is_object()).ok_or_else(|| {
            ApiError::field(
                &field(Some(j), ".function"),
                "is required: {\"name\", \"arguments\"}",
            )
        })?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::field(
                    &field(Some(j), ".function.name"),
                    "must be a non-empty string",
                )
            })?;
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                ApiError::field(
                    &field(Some(j), ".function.arguments"),
                    format!("must be JSON text (as the call returned it): {e}"),
                )
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => {
                return Err(ApiError::field(
                    &field(Some(j), ".function.arguments"),
                    "must be a string of JSON",
                ))
            }
        };
        let mut call =
            json!({"type": "function", "function": {"name": name, "arguments": arguments}});
        if let Some(id) = c.get("id").and_then(Value::as_str) {
            call["id"] = json!(id);
        }
        out.push(call);
    }
    Ok(Value::Array(out))
}

/// How the answer's tool calls are read: the template's syntax, and the request's tools.
pub struct CallReader {
    /// The reader of the output.
    pub stream: ToolCallStream,
    /// The functions (to check the calls against).
    pub functions: Vec<ToolFunction>,
}

impl CallReader {
    /// A reader for the answer to `req`, whose call ids derive from `id_seed`.
    pub fn new(req: &ToolRequest, syntax: ToolCallSyntax, id_seed: u64) -> CallReader {
        CallReader {
            stream: ToolCallStream::new(syntax, req.forced(), id_seed),
            functions: req.functions.clone(),
        }
    }

    /// The chat message of the whole `text`: its content (null when there are calls and no
    /// other text) and its `tool_calls` (complete ones; one cut by the token limit is left
    /// out), and whether it has calls.
    pub fn message(mut self, text: &str) -> Result<(Value, bool), ApiError> {
        let mut events = Vec::new();
        self.stream.push(text, &mut events);
        self.stream.end(&mut events);
        self.check()?;
        let calls: Vec<Value> = self
            .stream
            .calls()
            .iter()
            .filter(|c| c.complete)
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let content = self.stream.text().trim();
        let mut m = json!({"role": "assistant", "content": content});
        let called = !calls.is_empty();
        if called {
            if content.is_empty() {
                m["content"] = Value::Null;
            }
            m["tool_calls"] = Value::Array(calls);
        }
        Ok((m, called))
    }

    /// Whether the answer made a complete call (its finish reason is then "tool_calls").
    pub fn called(&self) -> bool {
        self.stream.calls().iter().any(|c| c.complete)
    }

    fn check(&self) -> Result<(), ApiError> {
        self.stream
            .check(&self.functions)
            .map_err(|e| ApiError::internal(format!("{e} (a bug in edge-run's tool calls)")))
    }

    /// The chat deltas of streamed text `piece` (`None`: the end of the output).
    pub fn deltas(&mut self, piece: Option<&str>) -> Vec<Value> {
        let mut events = Vec::new();
        match piece {
            Some(p) => self.stream.push(p, &mut events),
            None => self.stream.end(&mut events),
        }
        events
            .into_iter()
            .map(|e| match e {
                ToolStreamEvent::Text(t) => json!({"content": t}),
                ToolStreamEvent::CallStart { index, id, name } => json!({"tool_calls": [{
                    "index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}),
                ToolStreamEvent::Arguments { index, fragment } => json!({"tool_calls": [{
                    "index": index, "function": {"arguments": fragment},
                }]}),
            })
            .collect()
    }
}
