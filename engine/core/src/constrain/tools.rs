//! Tool calls (OpenAI function calling): the tool-call syntax a model's chat template teaches
//! it, a [`Constraint`] that makes its calls valid for the given functions' parameter schemas,
//! and the parser of its output into [`ToolCall`]s.
//!
//! Render the conversation with the tools in the template's `tools` variable
//! ([`edge_tokenizers::chat::ChatTemplate::render_with_tools`]), generate under
//! [`tool_call_constraint`], then [`parse_tool_calls`]:
//! - [`ToolChoice::Required`] (or [`ToolChoice::Function`]) constrains the output from its
//!   first token: it is one call (or several, with `parallel`) of a given function, with
//!   arguments valid for that function's schema;
//! - [`ToolChoice::Auto`] lets the model answer in text; once it writes the syntax's opening
//!   (`<tool_call>`, `[TOOL_CALLS]`, `{"name"`), the call is constrained (a lazy grammar).

use serde_json::{json, Value};

use super::spec::{Constraint, ConstraintError};

/// The tool-call syntaxes edge-run knows, detected from a chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallSyntax {
    /// Hermes (Qwen2.5, Qwen3, SmolLM3, Hermes 2/3): `<tool_call>\n{"name": ..., "arguments":
    /// {...}}\n</tool_call>`.
    Hermes,
    /// Llama 3.1 / 3.2 / 3.3 JSON: `{"name": ..., "parameters": {...}}`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.
    Mistral,
}

impl ToolCallSyntax {
    /// The syntax `template` (a chat template's source) teaches; an error when it shows none
    /// edge-run knows.
    pub fn detect(template: &str) -> Result<ToolCallSyntax, ConstraintError> {
        if template.contains("<tool_call>") {
            Ok(ToolCallSyntax::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Ok(ToolCallSyntax::Mistral)
        } else if template.contains("<|start_header_id|>") && template.contains("tools") {
            Ok(ToolCallSyntax::Llama3)
        } else {
            Err(ConstraintError::new(
                "tool calls",
                "the model's chat template shows no tool-call syntax edge-run knows (Hermes <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS]): use a model whose template supports tools, or constrain the output with a JSON schema instead",
            ))
        }
    }

    /// What opens a call: the trigger of the lazy grammar in "auto" mode.
    pub fn trigger(self) -> &'static str {
        match self {
            ToolCallSyntax::Hermes => "<tool_call>",
            ToolCallSyntax::Mistral => "[TOOL_CALLS]",
            ToolCallSyntax::Llama3 => "{\"name\"",
        }
    }

    /// The key holding a call's arguments.
    pub(super) fn arguments_key(self) -> &'static str {
        match self {
            ToolCallSyntax::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolFunction {
    /// Its name.
    pub name: String,
    /// What it does (shown to the model by the template).
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// Which calls the model may or must make (OpenAI's `tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the output is not constrained.
    None,
    /// Text or calls, as the model chooses; a started call is constrained.
    Auto,
    /// At least one call of one of the functions.
    Required,
    /// A call of this function.
    Function(String),
}

impl ToolChoice {
    /// `none`, `auto`, `required`, or a function's name.
    pub fn parse(s: &str) -> ToolChoice {
        match s {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            name => ToolChoice::Function(name.to_string()),
        }
    }
}

/// A call parsed from the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// An id for the call (`call_` and 24 hex digits), to pair it with its result.
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

fn bad(msg: impl Into<String>) -> ConstraintError {
    ConstraintError::new("tools", msg)
}

/// Reads tools in OpenAI's format: a JSON array of `{"type": "function", "function": {"name",
/// "description", "parameters"}}` (a bare `{"name", ...}` object is accepted too).
pub fn parse_tools(tools: &Value) -> Result<Vec<ToolFunction>, ConstraintError> {
    let list = tools.as_array().ok_or_else(|| {
        bad("must be a JSON array of {\"type\": \"function\", \"function\": {...}}")
    })?;
    if list.is_empty() {
        return Err(bad("the list is empty: give at least one function"));
    }
    let mut out: Vec<ToolFunction> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let f = match t.get("type").and_then(Value::as_str) {
            Some("function") => t.get("function"),
            Some(other) => {
                return Err(bad(format!(
                    "tool {i} has type \"{other}\": only \"function\" tools are supported"
                )))
            }
            None => Some(t),
        }
        .filter(|f| f.is_object())
        .ok_or_else(|| bad(format!("tool {i} has no \"function\" object")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(format!("tool {i} has no \"name\"")))?;
        if out.iter().any(|o| o.name == name) {
            return Err(bad(format!("two tools are named \"{name}\"")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(bad(format!(
                    "the \"parameters\" of \"{name}\" must be a JSON Schema object"
                )))
            }
        };
        out.push(ToolFunction {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
        });
    }
    Ok(out)
}

/// The tools as the template's `tools` variable expects them (OpenAI's format).
pub fn tools_value(tools: &[ToolFunction]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                let mut f = json!({"name": t.name, "parameters": t.parameters});
                if let Some(d) = &t.description {
                    f["description"] = json!(d);
                }
                json!({"type": "function", "function": f})
            })
            .collect(),
    )
}

/// The constraint that makes the model's calls valid: `None` for [`ToolChoice::None`]. With
/// `parallel`, several calls may follow each other.
pub fn tool_call_constraint(
    syntax: ToolCallSyntax,
    tools: &[ToolFunction],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<Constraint>, ConstraintError> {
    let chosen: Vec<&ToolFunction> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Function(name) => {
            let f = tools.iter().find(|t| &t.name == name).ok_or_else(|| {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                bad(format!(
                    "tool_choice names \"{name}\", which is not among the tools ({})",
                    names.join(", ")
                ))
            })?;
            vec![f]
        }
    };
    if chosen.is_empty() {
        return Err(bad("no functions given"));
    }
    let mut lark = String::new();
    let calls: Vec<String> = (0..chosen.len()).map(|i| format!("fn_{i}")).collect();
    let call = calls.join(" | ");
    let start = match syntax {
        ToolCallSyntax::Hermes => {
            let one = "\"<tool_call>\\n\" call \"\\n</tool_call>\"";
            if parallel {
                format!("{one} (\"\\n\" {one})*")
            } else {
                one.to_string()
            }
        }
        ToolCallSyntax::Llama3 => {
            if parallel {
                "call (\"; \" call)*".to_string()
            } else {
                "call".to_string()
            }
        }
        ToolCallSyntax::Mistral => {
            if parallel {
                "\"[TOOL_CALLS][\" call (\", \" call)* \"]\"".to_string()
            } else {
                "\"[TOOL_CALLS][\" call \"]\"".to_string()
            }
        }
    };
    lark.push_str(&format!("start: {start}\ncall: {call}\n"));
    for (i, f) in chosen.iter().enumerate() {
        let schema = call_schema(syntax, f);
        lark.push_str(&format!("fn_{i}: %json {schema}\n"));
    }
    let c = Constraint::lark(lark);
    Ok(Some(match choice {
        ToolChoice::Auto => c.lazy(syntax.trigger()),
        _ => c,
    }))
}

/// The JSON Schema of one call of `f`: its name, then its arguments.
fn call_schema(syntax: ToolCallSyntax, f: &ToolFunction) -> Value {
    let mut params = f.parameters.clone();
    // Its $defs stay where its $refs point: this schema's root.
    let defs = params.as_object_mut().and_then(|o| o.remove("$defs"));
    let definitions = params.as_object_mut().and_then(|o| o.remove("definitions"));
    let args = syntax.arguments_key();
    let mut schema = json!({
        "type": "object",
        "properties": {"name": {"const": f.name}, args: params},
        "required": ["name", args],
        "additionalProperties": false,
    });
    if let Some(d) = defs {
        schema["$defs"] = d;
    }
    if let Some(d) = definitions {
        schema["definitions"] = d;
    }
    // $refs into the parameters' root ("#/properties/...") would now miss; rewrite them.
    rewrite_refs(&mut schema["properties"][args], args);
    super::vocab::json_options().apply_to(&mut schema);
    schema
}

fn rewrite_refs(v: &mut Value, args: &str) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                if r == "#" {
                    *r = format!("#/properties/{args}");
                } else if let Some(rest) = r.strip_prefix("#/properties/") {
                    *r = format!("#/properties/{args}/properties/{rest}");
                }
            }
            for (_, x) in o.iter_mut() {
                rewrite_refs(x, args);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, args)),
        _ => {}
    }
}

/// The text and the calls in a model's output under `syntax`: calls of functions not in
/// `tools`, or whose JSON does not parse, are an error (they cannot come from a constrained
/// generation). `text` is the output with the calls removed, trimmed.
pub fn parse_tool_calls(
    syntax: ToolCallSyntax,
    tools: &[ToolFunction],
    output: &str,
) -> Result<(String, Vec<ToolCall>), ConstraintError> {
    let fail = |m: String| ConstraintError::new("tool call output", m);
    let mut objects: Vec<Value> = Vec::new();
    let mut text = String::new();
    match syntax {
        ToolCallSyntax::Hermes => {
            let mut rest = output;
            while let Some(at) = rest.find("<tool_call>") {
                text.push_str(&rest[..at]);
                let body = &rest[at + "<tool_call>".len()..];
                let end = body.find("</tool_call>").unwrap_or(body.len());
                objects.push(
                    serde_json::from_str(body[..end].trim())
                        .map_err(|e| fail(format!("a <tool_call> is not JSON: {e}")))?,
                );
                rest = body.get(end + "</tool_call>".len()..).unwrap_or("");
            }
            text.push_str(rest);
        }
        ToolCallSyntax::Mistral => match output.find("[TOOL_CALLS]") {
            Some(at) => {
                text.push_str(&output[..at]);
                let v: Value = serde_json::from_str(output[at + 12..].trim())
                    .map_err(|e| fail(format!("the [TOOL_CALLS] list is not JSON: {e}")))?;
                match v {
                    Value::Array(a) => objects.extend(a),
                    o => objects.push(o),
                }
            }
            None => text.push_str(output),
        },
        ToolCallSyntax::Llama3 => match output.find("{\"name\"") {
            Some(at) => {
                text.push_str(&output[..at]);
                for part in output[at..].split("; ") {
                    objects.push(
                        serde_json::from_str(part.trim())
                            .map_err(|e| fail(format!("a call is not JSON: {e}")))?,
                    );
                }
            }
            None => text.push_str(output),
        },
    }
    let mut calls = Vec::new();
    for (i, o) in objects.into_iter().enumerate() {
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| fail("a call has no \"name\"".into()))?;
        if !tools.iter().any(|t| t.name == name) {
            return Err(fail(format!("a call names an unknown function \"{name}\"")));
        }
        let args = o
            .get(syntax.arguments_key())
            .cloned()
            .unwrap_or_else(|| json!({}));
        let arguments = args.to_string();
        calls.push(ToolCall {
            id: call_id(syntax, output, i),
            name: name.to_string(),
            arguments,
        });
    }
    Ok((text.trim().to_string(), calls))
}

/// The id of call `index` of `output` (see [`crate::constrain::tool_stream::ToolCallStream::new`] for its form), from a
/// hash of the output (FNV-1a): distinct for the calls of a response, stable for an output.
fn call_id(syntax: ToolCallSyntax, output: &str, index: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in output.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    call_id_from_seed(syntax, h, index)
}

/// The id of call `index` of the output whose calls derive from `seed`.
pub(super) fn call_id_from_seed(syntax: ToolCallSyntax, seed: u64, index: usize) -> String {
    // splitmix64: distinct, well-spread values for consecutive indices.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    match syntax {
        ToolCallSyntax::Mistral => {
            const ABC: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            let mut x = next();
            (0..9)
                .map(|_| {
                    let c = ABC[(x % ABC.len() as u64) as usize] as char;
                    x /= ABC.len() as u64;
                    c
                })
                .collect()
        }
        _ => format!("call_{:016x}{:08x}", next(), next() as u32),
    }
}
