//! Request bodies: JSON parsed and every field checked, so that a bad one is a 400 naming it
//! rather than a surprise later. Fields OpenAI's clients send that change nothing here
//! (`user`, `frequency_penalty: 0`, ...) are accepted; those that would change the output in a
//! way this server cannot honour (`logprobs`, `n > 1`) are refused by name. An output
//! constraint (`response_format`, `grammar`) becomes a [`Constraint`] for the engine's sampler;
//! `tools` are checked by [`super::tools`].

use edge_engine::constrain::tools::ToolChoice;
use edge_engine::constrain::Constraint;
use edge_engine::sampling::SamplerConfig;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::tools::{history_tool_calls, parse_tool_request, ToolRequest};

/// Most stop strings one request may give.
pub const MAX_STOP: usize = 16;

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// `/v1/chat/completions`: messages for the model's chat template (`role` and `content`
    /// text, and as given `tool_calls`, `tool_call_id`, `name`).
    Chat(Vec<Value>),
    /// `/v1/completions`: the text, used verbatim.
    Text(String),
}

/// A generation request, checked.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Answer as server-sent events.
    pub stream: bool,
    /// With `stream`: end with a chunk holding `usage` (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Most tokens to generate (`max_tokens` / `max_completion_tokens`); `None`: until the
    /// context is full.
    pub max_tokens: Option<usize>,
    /// The sampler settings.
    pub sampling: SamplerConfig,
    /// Texts that end the generation where they first appear (not included in the output).
    pub stop: Vec<String>,
    /// Generate past end-of-generation tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// What the output must follow (`response_format`, or llama-server's `grammar` /
    /// `json_schema`), with the field it came from; compiled against the model before the
    /// request is queued.
    pub constraint: Option<(Constraint, &'static str)>,
    /// The tools the model may call (chat only).
    pub tools: Option<ToolRequest>,
}

/// Parses a JSON body into an object, or the 400 that says why it is not one.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty: send a JSON object (Content-Type: application/json)",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// A field's value, `null` counting as absent.
fn get<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn opt_bool(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match get(o, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::field(name, "must be true or false")),
    }
}

/// A number in `[lo, hi]`.
fn opt_num(o: &Map<String, Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match get(o, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
            _ if hi == f64::MAX => Err(ApiError::field(
                name,
                format!("must be a number of at least {lo}"),
            )),
            _ => Err(ApiError::field(
                name,
                format!("must be a number from {lo} to {hi}"),
            )),
        },
    }
}

/// A whole number in `[lo, hi]`.
fn opt_int(o: &Map<String, Value>, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
    match get(o, name) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) if x >= lo && x <= hi => Ok(Some(x)),
            _ => Err(ApiError::field(
                name,
                format!("must be a whole number from {lo} to {hi}"),
            )),
        },
    }
}

/// Fields that would change the answer in ways not supported yet: refused by name.
fn refuse_unsupported(o: &Map<String, Value>) -> Result<(), ApiError> {
    if opt_int(o, "n", 1, u64::MAX)?.is_some_and(|n| n != 1) {
        return Err(ApiError::field("n", "only n = 1 is supported"));
    }
    if opt_bool(o, "logprobs")? == Some(true) || get(o, "top_logprobs").is_some() {
        return Err(ApiError::field(
            "logprobs",
            "log-probabilities are not supported yet",
        ));
    }
    if let Some(Value::Number(_)) = get(o, "logprobs") {
        return Err(ApiError::field(
            "logprobs",
            "log-probabilities are not supported yet",
        ));
    }
    for name in ["frequency_penalty", "presence_penalty"] {
        if opt_num(o, name, -2.0, 2.0)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::field(
                name,
                "not supported (only 0); use repeat_penalty instead",
            ));
        }
    }
    if get(o, "logit_bias").is_some_and(|v| v.as_object().is_none_or(|m| !m.is_empty())) {
        return Err(ApiError::field("logit_bias", "not supported yet"));
    }
    Ok(())
}

fn stop_strings(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::field(
            "stop",
            format!(
                "must be a non-empty string or an array of at most {MAX_STOP} non-empty strings"
            ),
        )
    };
    match get(o, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) if !s.is_empty() => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= MAX_STOP => a
            .iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(bad()),
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// A message's text: a string, or an array of `{"type": "text", "text": ...}` parts.
fn message_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some(kind), _) if kind != "text" => {
                        return Err(ApiError::field(
                            &param,
                            format!("content parts of type '{kind}' are not supported (text only)"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::field(
                            &param,
                            "each part must be {\"type\": \"text\", \"text\": \"...\"}",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::field(
            &param,
            "must be a string or an array of text parts",
        )),
    }
}

fn messages(o: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let list = match get(o, "messages") {
        None => {
            return Err(ApiError::field(
                "messages",
                "is required: an array of {\"role\", \"content\"} objects",
            ))
        }
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => {
            return Err(ApiError::field(
                "messages",
                "must be a non-empty array of {\"role\", \"content\"} objects",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m.as_object().ok_or_else(|| {
                ApiError::field(
                    &format!("messages[{i}]"),
                    "must be an object with role and content",
                )
            })?;
            let role = match m.get("role") {
                Some(Value::String(r)) if !r.is_empty() => r.clone(),
                _ => {
                    return Err(ApiError::field(
                        &format!("messages[{i}].role"),
                        "is required: system, user or assistant",
                    ))
                }
            };
            let mut out = json!({"role": role, "content": message_text(i, m.get("content"))?});
            if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
                out["tool_calls"] = history_tool_calls(i, calls)?;
            }
            for key in ["tool_call_id", "name"] {
                match m.get(key) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(v)) => out[key] = json!(v),
                    Some(_) => {
                        return Err(ApiError::field(
                            &format!("messages[{i}].{key}"),
                            "must be a string",
                        ))
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

fn completion_prompt(o: &Map<String, Value>) -> Result<String, ApiError> {
    let bad = || ApiError::field("prompt", "must be a non-empty string (or an array of one)");
    let text = match get(o, "prompt") {
        None => {
            return Err(ApiError::field(
                "prompt",
                "is required: the text to continue",
            ))
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 => a[0].as_str().ok_or_else(bad)?.to_string(),
        Some(Value::Array(a)) if a.len() > 1 => {
            return Err(ApiError::field(
                "prompt",
                "only one prompt per request is supported",
            ))
        }
        Some(_) => return Err(bad()),
    };
    if text.is_empty() {
        return Err(bad());
    }
    Ok(text)
}

/// A seed for a request that gives none: different for each request, as OpenAI's are.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Parses and checks a `/v1/chat/completions` (`chat`) or `/v1/completions` body.
pub fn parse_generation(body: &[u8], chat: bool) -> Result<GenRequest, ApiError> {
    let o = parse_object(body)?;
    if get(&o, "model").is_some_and(|m| !m.is_string()) {
        return Err(ApiError::field("model", "must be a string"));
    }
    refuse_unsupported(&o)?;
    let tools = match chat {
        true => parse_tool_request(&o)?,
        false => match ["tools", "tool_choice"].into_iter().find(|n| get(&o, n).is_some()) {
            Some(name) => {
                return Err(ApiError::field(
                    name,
                    "tool calls are for /v1/chat/completions (the chat template shows the tools to the model)",
                ))
            }
            None => None,
        },
    };
    let prompt = if chat {
        Prompt::Chat(messages(&o)?)
    } else {
        if get(&o, "suffix").is_some() {
            return Err(ApiError::field(
                "suffix",
                "not supported (no fill-in-the-middle)",
            ));
        }
        if opt_bool(&o, "echo")? == Some(true) {
            return Err(ApiError::field("echo", "not supported"));
        }
        Prompt::Text(completion_prompt(&o)?)
    };
    let stream = opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = match get(&o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")
            .map_err(|_| ApiError::field("stream_options.include_usage", "must be true or false"))?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::field("stream_options", "must be an object")),
    };
    let max = u32::MAX as u64;
    let max_tokens = match opt_int(&o, "max_completion_tokens", 1, max)? {
        Some(n) => Some(n),
        None => opt_int(&o, "max_tokens", 1, max)?,
    };
    let d = SamplerConfig::default();
    let sampling = SamplerConfig {
        temperature: opt_num(&o, "temperature", 0.0, 100.0)?.unwrap_or(d.temperature),
        top_k: opt_int(&o, "top_k", 0, max)?.map_or(d.top_k, |k| k as usize),
        top_p: opt_num(&o, "top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: opt_num(&o, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty: match opt_num(&o, "repeat_penalty", 0.0, f64::MAX)? {
            Some(x) if x <= 0.0 => {
                return Err(ApiError::field(
                    "repeat_penalty",
                    "must be more than 0 (1 = off)",
                ))
            }
            Some(x) => x,
            None => d.repeat_penalty,
        },
        repeat_last_n: opt_int(&o, "repeat_last_n", 0, max)?
            .map_or(d.repeat_last_n, |n| n as usize),
        seed: match get(&o, "seed") {
            None => fresh_seed(),
            Some(v) => match (v.as_u64(), v.as_i64()) {
                (Some(s), _) => s,
                // OpenAI's seeds are signed; a negative one is as good a seed as any.
                (None, Some(s)) => s as u64,
                _ => return Err(ApiError::field("seed", "must be a whole number")),
            },
        },
    };
    if let Err(e) = sampling.validate() {
        return Err(ApiError::bad_request(crate::errors::hint(&e)));
    }
    let constraint = constraint(&o)?;
    if let (Some(t), Some((_, field))) = (&tools, &constraint) {
        if t.choice != ToolChoice::None {
            return Err(ApiError::field(
                field,
                "give either tools or an output constraint, not both (or tool_choice \"none\")",
            ));
        }
    }
    Ok(GenRequest {
        prompt,
        stream,
        include_usage,
        max_tokens: max_tokens.map(|n| n as usize),
        sampling,
        stop: stop_strings(&o)?,
        ignore_eos: opt_bool(&o, "ignore_eos")?.unwrap_or(false),
        constraint,
        tools,
    })
}

/// The output constraint a request asks for: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema` with its `schema`), or llama-server's `grammar` (GBNF text) and
/// `json_schema` (a schema object); at most one of them.
fn constraint(o: &Map<String, Value>) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if let Some(rf) = get(o, "response_format") {
        let Value::Object(rf) = rf else {
            return Err(ApiError::field("response_format", "must be an object"));
        };
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push((Constraint::json_object(), "response_format")),
            Some("json_schema") => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        ApiError::field(
                            "response_format.json_schema.schema",
                            "must be a JSON Schema object ({\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}})",
                        )
                    })?;
                found.push((
                    Constraint::json_schema(schema.to_string()),
                    "response_format.json_schema.schema",
                ));
            }
            _ => {
                return Err(ApiError::field(
                    "response_format.type",
                    "must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        }
    }
    if let Some(g) = get(o, "grammar") {
        let g = g
            .as_str()
            .ok_or_else(|| ApiError::field("grammar", "must be a string (a GBNF grammar)"))?;
        found.push((Constraint::gbnf(g), "grammar"));
    }
    if let Some(s) = get(o, "json_schema") {
        if !(s.is_object() || s.is_boolean()) {
            return Err(ApiError::field(
                "json_schema",
                "must be a JSON Schema object",
            ));
        }
        found.push((Constraint::json_schema(s.to_string()), "json_schema"));
    }
    if found.len() > 1 {
        return Err(ApiError::field(
            found[1].1,
            format!(
                "give one constraint, not both {} and {}",
                found[0].1, found[1].1
            ),
        ));
    }
    Ok(found.pop())
}

/// Parses and checks a `/v1/embeddings` body: the texts (`input`: a string or an array of
/// strings) and whether to answer in base64 (`encoding_format`, which OpenAI's Python client
/// sets to "base64" by default).
pub fn parse_embeddings(body: &[u8]) -> Result<(Vec<String>, bool), ApiError> {
    let o = parse_object(body)?;
    let bad = || {
        ApiError::field(
            "input",
            "must be a non-empty string or an array of non-empty strings",
        )
    };
    let texts = match get(&o, "input") {
        None => {
            return Err(ApiError::field(
                "input",
                "is required: a string or an array of strings",
            ))
        }
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if texts.iter().any(String::is_empty) {
        return Err(bad());
    }
    let base64 = match get(&o, "encoding_format") {
        None => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => {
            return Err(ApiError::field(
                "encoding_format",
                "must be \"float\" or \"base64\"",
            ))
        }
    };
    Ok((texts, base64))
}
