//! Constrained decoding on the real model, judged by validators that know nothing of edge-run
//! (tests/reference/validate_constrained.py: Python's `jsonschema`, `json`, `ast`, regexes
//! written from the grammars):
//! - every JSON schema of tests/reference/json-schemas/ with its 5 prompts, greedy and sampled
//!   (seeded), one test each: 100% of the outputs must parse and validate;
//! - llama.cpp's example GBNF grammars (tests/reference/grammars/);
//! - tool calls with tool_choice "required", a named function, and "auto", for three tool sets,
//!   through a Hermes-style chat template (SmolLM2's own has no tools section);
//! - bad grammars and schemas are refused with errors that name the problem.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use edge_engine::constrain::tools::{
    parse_tool_calls, parse_tools, tool_call_constraint, ToolCall, ToolCallSyntax, ToolChoice,
};
use edge_engine::constrain::Constraint;
use edge_engine::device::Device;
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::model::Model;
use edge_engine::sampling::SamplerConfig;
use edge_engine::session::{Session, SessionConfig};
use edge_tests::{missing, smollm2_path};
use edge_tokenizers::chat::{ChatMessage, ChatTemplate};
use serde_json::{json, Value};

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference")
}

fn load() -> (Arc<Model>, Session) {
    load_on(Device::Cpu)
}

fn load_on(device: Device) -> (Arc<Model>, Session) {
    let model = Arc::new(Model::load(smollm2_path()).expect("model"));
    let session = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(4096),
            device,
            ..Default::default()
        },
    )
    .expect("session");
    (model, session)
}

fn template(model: &Model, source: &str) -> ChatTemplate {
    let tok = &model.tokenizer;
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.piece(i)).into_owned())
            .unwrap_or_default()
    };
    ChatTemplate::new(source, &piece(tok.bos_id()), &piece(tok.eos_id())).expect("template")
}

/// The greedy options and the seeded sampled ones (llama.cpp's default sampler, seed 7).
fn both_samplers(max_tokens: usize) -> [(&'static str, GenerateOptions); 2] {
    [
        ("greedy", GenerateOptions::greedy(max_tokens)),
        (
            "sampled",
            GenerateOptions {
                max_tokens,
                sampling: SamplerConfig {
                    seed: 7,
                    ..SamplerConfig::default()
                },
                ..GenerateOptions::default()
            },
        ),
    ]
}

/// Generates from `prompt` under `constraint`; the text and whether the constraint ended it.
fn run(
    session: &mut Session,
    prompt: &[u32],
    options: &GenerateOptions,
    constraint: &Constraint,
) -> (String, bool) {
    session.reset();
    let options = GenerateOptions {
        constraint: Some(constraint.clone()),
        ..options.clone()
    };
    let mut text = String::new();
    let done = session
        .generate(prompt, &options, |e| {
            text.push_str(e.text);
            std::ops::ControlFlow::Continue(())
        })
        .expect("generate");
    let complete = matches!(done.stop_reason, StopReason::EndOfGeneration(_));
    (text, complete)
}

/// Runs the validator on `records`; fails the test with its report unless all are valid.
/// Returns false (after `missing`) when Python or jsonschema is not there.
/// Parsed calls in OpenAI's `tool_calls` shape, for the validator's records.
fn calls_json(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

fn validate(name: &str, records: &[Value]) -> bool {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("constrained-{name}.jsonl"));
    let lines: Vec<String> = records.iter().map(Value::to_string).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = match Command::new("python3")
        .arg(reference().join("validate_constrained.py"))
        .arg(&path)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            missing("python3", format!("install Python 3 ({e})"));
            return false;
        }
    };
    let report = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(3) {
        missing("the Python package jsonschema", "pip install jsonschema");
        return false;
    }
    eprintln!("{name}: {}", report.lines().last().unwrap_or(""));
    assert!(
        out.status.success(),
        "{name}: invalid outputs ({}):\n{report}{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains(&format!("checked {} outputs", records.len())),
        "{report}"
    );
    true
}

fn chat_ids(
    model: &Model,
    t: &ChatTemplate,
    system: &str,
    user: &str,
    tools: Option<&Value>,
) -> Vec<u32> {
    let messages = [
        ChatMessage::new("system", system),
        ChatMessage::new("user", user),
    ];
    let text = t.render_with_tools(&messages, tools, true).expect("render");
    model.tokenize(&text, true, true).expect("tokenize")
}

/// The most bytes a JSON value valid for `schema` can take as llguidance writes it (one line,
/// `", "` and `": "` separators, a string character at most 6 bytes: `\uXXXX`), or `None`
/// when nothing bounds it (a `number`'s fraction digits, a string without `maxLength`, an
/// array without `maxItems`, an open object). Every token is at least one byte, so this many
/// tokens (and one for the end) always fit the whole value: no output of the set can be cut.
fn max_output_bytes(schema: &Value, root: &Value) -> Option<usize> {
    let o = schema.as_object()?;
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let def = r.strip_prefix("#/$defs/")?;
        return max_output_bytes(&root["$defs"][def], root);
    }
    if let Some(v) = o.get("const") {
        return Some(v.to_string().len() * 2);
    }
    if let Some(list) = o.get("enum").and_then(Value::as_array) {
        return list.iter().map(|v| v.to_string().len() * 2).max();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = o.get(key).and_then(Value::as_array) {
            let mut rest = o.clone();
            rest.remove(key);
            let mut most = 0;
            for branch in list {
                let mut merged = rest.clone();
                for (k, v) in branch.as_object()? {
                    merged.insert(k.clone(), v.clone());
                }
                most = most.max(max_output_bytes(&Value::Object(merged), root)?);
            }
            return Some(most);
        }
    }
    if let Some(list) = o.get("allOf").and_then(Value::as_array) {
        let has_properties = |s: &Value| s.get("properties").is_some();
        if !has_properties(schema) && !list.iter().any(has_properties) {
            // The value satisfies every part: the part with the tightest bound bounds it.
            return list.iter().filter_map(|p| max_output_bytes(p, root)).min();
        }
        // Objects: each property satisfies all its schemas, and one closed part closes it.
        let mut merged = o.clone();
        merged.remove("allOf");
        let mut props: serde_json::Map<String, Value> = serde_json::Map::new();
        for part in std::iter::once(schema).chain(list) {
            for (k, v) in part.as_object()? {
                match k.as_str() {
                    "allOf" => {}
                    "properties" => {
                        for (pk, pv) in v.as_object()? {
                            let e = props
                                .entry(pk.clone())
                                .or_insert_with(|| json!({"allOf": []}));
                            e["allOf"].as_array_mut()?.push(pv.clone());
                        }
                    }
                    "additionalProperties" if v == &Value::Bool(false) => {
                        merged.insert(k.clone(), v.clone());
                    }
                    _ => {
                        merged.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        merged.insert("properties".into(), Value::Object(props));
        return max_output_bytes(&Value::Object(merged), root);
    }
    let digits = |v: &Value| v.as_i64().map(|n| n.to_string().len());
    match o.get("type")?.as_str()? {
        "boolean" => Some(5),
        "null" => Some(4),
        "integer" => Some(digits(o.get("minimum")?)?.max(digits(o.get("maximum")?)?)),
        "string" => {
            if let Some(p) = o.get("pattern").and_then(Value::as_str) {
                return pattern_max_chars(p).map(|n| 2 + 6 * n);
            }
            Some(2 + 6 * o.get("maxLength")?.as_u64()? as usize)
        }
        "array" => {
            let n = o.get("maxItems")?.as_u64()? as usize;
            let item = max_output_bytes(o.get("items")?, root)?;
            Some(2 + n * (item + 2))
        }
        "object" => {
            if o.get("additionalProperties") != Some(&Value::Bool(false)) {
                return None;
            }
            let props = o.get("properties")?.as_object()?;
            let mut n = 2;
            for (k, v) in props {
                n += k.len() * 6 + 2 + 2 + max_output_bytes(v, root)? + 2;
            }
            Some(n)
        }
        _ => None,
    }
}

/// The most characters a match of `pattern` has, for the patterns of the set (literals,
/// escapes, classes, `{m}`, `{m,n}`, `?`, anchors); `None` for anything unbounded or else.
fn pattern_max_chars(pattern: &str) -> Option<usize> {
    let b = pattern.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        let one = match b[i] {
            b'^' | b'$' => {
                i += 1;
                continue;
            }
            b'\\' => 2,
            b'[' => pattern[i..].find(']')? + 1,
            b'(' | b')' | b'|' | b'*' | b'+' | b'.' => return None,
            _ => 1,
        };
        i += one;
        let mut times = 1;
        if b.get(i) == Some(&b'{') {
            let end = i + pattern[i..].find('}')?;
            let spec = &pattern[i + 1..end];
            times = spec.rsplit(',').next()?.trim().parse().ok()?;
            i = end + 1;
        } else if b.get(i) == Some(&b'?') {
            i += 1;
        } else if matches!(b.get(i), Some(b'*' | b'+')) {
            return None;
        }
        n += times;
    }
    Some(n)
}

#[test]
fn the_output_bound_counts_what_the_schemas_allow() {
    let v = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(pattern_max_chars("^RB-[0-9]{4}-[A-Z]{2}$"), Some(10));
    assert_eq!(pattern_max_chars("^[0-9]{1,3}\\.[0-9]{1,3}$"), Some(7));
    assert_eq!(pattern_max_chars("^[0-9]+$"), None);
    let s = v(r#"{"type": "integer", "minimum": -180, "maximum": 90}"#);
    assert_eq!(max_output_bytes(&s, &s), Some(4));
    let s = v(r#"{"type": "number", "minimum": 0, "maximum": 1}"#);
    assert_eq!(max_output_bytes(&s, &s), None);
    let s = v(r#"{"type": "object", "properties": {"a": {"type": "boolean"}}}"#);
    assert_eq!(
        max_output_bytes(&s, &s),
        None,
        "an open object is unbounded"
    );
    let s = v(
        r#"{"type": "object", "properties": {"a": {}}, "additionalProperties": false,
            "allOf": [{"properties": {"a": {"type": "boolean"}}}]}"#,
    );
    assert_eq!(max_output_bytes(&s, &s), Some(2 + 6 + 4 + 5 + 2));
}

/// Every schema with its 5 prompts under `options`; the outputs go to the validator. Each
/// schema's token budget is [`max_output_bytes`] + 1: every schema of the set is bounded, and
/// its budget fits its longest output, so none can be cut.
fn json_schemas_validate(how: &str, options: &GenerateOptions) {
    json_schemas_validate_on(Device::Cpu, how, options)
}

fn json_schemas_validate_on(device: Device, how: &str, options: &GenerateOptions) {
    let (model, mut session) = load_on(device);
    let chat = template(&model, model.chat_template.as_deref().expect("template"));
    let dir = reference().join("json-schemas");
    let prompts: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    let mut names: Vec<String> = prompts.as_object().unwrap().keys().cloned().collect();
    names.sort();
    assert!(names.len() >= 20, "at least 20 schemas");
    let mut records = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        let schema: Value = serde_json::from_str(&text).unwrap();
        let constraint = Constraint::json_schema(text.clone());
        model.check_constraint(&constraint).expect(name);
        let bound = max_output_bytes(&schema, &schema)
            .unwrap_or_else(|| panic!("{name}: nothing bounds its output's length"));
        let options = GenerateOptions {
            max_tokens: bound + 1,
            ..options.clone()
        };
        let list = prompts[name].as_array().unwrap();
        assert_eq!(list.len(), 5, "{name}: 5 prompts");
        for p in list {
            let system = "You control a robot. Answer with one JSON value only.";
            let ids = chat_ids(&model, &chat, system, p.as_str().unwrap(), None);
            assert!(ids.len() + bound < session.ctx(), "{name}: the budget fits");
            let (output, complete) = run(&mut session, &ids, &options, &constraint);
            assert!(
                complete,
                "{name}/{how}: cut within its bound {bound}: {output}"
            );
            eprintln!("{name}/{how} (budget {} tokens): {output}", bound + 1);
            records.push(
                json!({"check": "schema", "name": format!("{name}/{how}: {p}"),
                "schema": schema, "output": output, "complete": complete}),
            );
        }
    }
    validate(&format!("json-schemas-{how}-{device}"), &records);
}

#[test]
fn json_schemas_greedy_outputs_validate() {
    let [(how, options), _] = both_samplers(0);
    json_schemas_validate(how, &options);
}

#[test]
fn json_schemas_sampled_outputs_validate() {
    let [_, (how, options)] = both_samplers(0);
    json_schemas_validate(how, &options);
}

/// The same on the CUDA backend, where a constrained step uploads the grammar's mask and
/// samples on the device (one token id copied back, never the logits): every output parses
/// and validates, greedy and sampled.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn json_schemas_validate_on_cuda() {
    for (how, options) in both_samplers(0) {
        json_schemas_validate_on(Device::Cuda(0), how, &options);
    }
}

#[test]
fn llama_cpp_gbnf_grammars_constrain_the_output() {
    let (model, mut session) = load();
    let chat = template(&model, model.chat_template.as_deref().expect("template"));
    let cases = [
        (
            "json",
            "Describe a robot as a JSON object with its name and its number of wheels.",
        ),
        ("json", "Give the position of the robot as JSON."),
        ("json_arr", "List three colours as a JSON array."),
        (
            "arithmetic",
            "Write some sums and their results, like 1+2=3.",
        ),
        ("arithmetic", "Compute 12*3."),
        ("list", "List three things a robot can do."),
        ("list", "Shopping list for a picnic."),
        ("chess", "Write the first moves of a chess game."),
        ("english", "Say hello to the robot."),
    ];
    let mut records = Vec::new();
    for (grammar, prompt) in cases {
        let path = reference().join("grammars").join(format!("{grammar}.gbnf"));
        let constraint = Constraint::gbnf(std::fs::read_to_string(&path).unwrap());
        let ids = chat_ids(&model, &chat, "You are a helpful assistant.", prompt, None);
        for (how, options) in both_samplers(160) {
            let (output, complete) = run(&mut session, &ids, &options, &constraint);
            records.push(json!({"check": "grammar", "grammar": grammar,
                "name": format!("{grammar}/{how}: {prompt}"), "output": output, "complete": complete}));
        }
    }
    validate("gbnf", &records);
}

#[test]
fn tool_calls_are_calls_of_given_functions_with_valid_arguments() {
    let (model, mut session) = load();
    let source =
        std::fs::read_to_string(reference().join("chat-templates/hermes-tools.jinja")).unwrap();
    let syntax = ToolCallSyntax::detect(&source).expect("syntax");
    assert_eq!(syntax, ToolCallSyntax::Hermes);
    let chat = template(&model, &source);
    let dir = reference().join("tool-sets");
    let prompts: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    let mut records = Vec::new();
    let mut n_auto_calls = 0;
    for (set, list) in prompts.as_object().unwrap() {
        let tools_value: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{set}.json"))).unwrap(),
        )
        .unwrap();
        let tools = parse_tools(&tools_value).expect("tools");
        let first = tools[0].name.clone();
        for p in list.as_array().unwrap() {
            let ids = chat_ids(
                &model,
                &chat,
                "You control a robot.",
                p.as_str().unwrap(),
                Some(&tools_value),
            );
            // "required" greedy and sampled; a named function and "auto" greedy.
            for (choice, must_call, n_samplers) in [
                (ToolChoice::Required, true, 2),
                (ToolChoice::Function(first.clone()), true, 1),
                (ToolChoice::Auto, false, 1),
            ] {
                // One call per reply: given room for more, SmolLM2 repeats its call until the
                // token limit.
                let constraint = tool_call_constraint(syntax, &tools, &choice, false)
                    .unwrap()
                    .unwrap();
                model.check_constraint(&constraint).expect("compiles");
                for (how, options) in both_samplers(160).into_iter().take(n_samplers) {
                    let (output, complete) = run(&mut session, &ids, &options, &constraint);
                    eprintln!("{set}/{choice:?}/{how}: {output}");
                    if !must_call && !complete {
                        // "auto" text cut by the token limit: nothing to parse.
                        continue;
                    }
                    let (_, calls) = parse_tool_calls(syntax, &tools, &output)
                        .unwrap_or_else(|e| panic!("{set} {choice:?} {how}: {e}: {output:?}"));
                    if must_call {
                        assert!(
                            complete,
                            "{set} {choice:?} {how}: the call was cut: {output:?}"
                        );
                    } else if calls.is_empty() {
                        continue;
                    } else {
                        n_auto_calls += 1;
                    }
                    let calls = calls_json(&calls);
                    let choice_name = match &choice {
                        ToolChoice::Function(f) => f.clone(),
                        ToolChoice::Required => "required".into(),
                        _ => "auto".into(),
                    };
                    // A forced call is read from the output by the validator itself too.
                    let syntax_name = if must_call {
                        json!("hermes")
                    } else {
                        Value::Null
                    };
                    records.push(json!({"check": "tool_call", "syntax": syntax_name, "name": format!("{set}/{choice_name}/{how}: {p}"),
                        "tools": tools_value, "choice": choice_name, "calls": calls,
                        "output": output, "complete": complete}));
                }
            }
        }
    }
    eprintln!("auto mode: {n_auto_calls} outputs with calls");
    validate("tool-calls", &records);
}

/// The Llama 3 and Mistral syntaxes on the real model: with `required` (greedy and sampled),
/// a named function, and for Mistral several calls (`parallel`), the output is what those
/// models' templates document, read by the validator itself (not by edge-run's parser), and
/// its calls are edge-run's parsed ones, valid for the given functions.
#[test]
fn llama3_and_mistral_tool_calls_follow_their_documented_formats() {
    let (model, mut session) = load();
    let source =
        std::fs::read_to_string(reference().join("chat-templates/hermes-tools.jinja")).unwrap();
    let chat = template(&model, &source);
    let dir = reference().join("tool-sets");
    let prompts: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    let mut records = Vec::new();
    for (set, list) in prompts.as_object().unwrap() {
        let tools_value: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{set}.json"))).unwrap(),
        )
        .unwrap();
        let tools = parse_tools(&tools_value).expect("tools");
        let last = tools.last().unwrap().name.clone();
        for p in list.as_array().unwrap().iter().take(2) {
            let ids = chat_ids(
                &model,
                &chat,
                "You control a robot.",
                p.as_str().unwrap(),
                Some(&tools_value),
            );
            for (syntax, name) in [
                (ToolCallSyntax::Llama3, "llama3"),
                (ToolCallSyntax::Mistral, "mistral"),
            ] {
                let mut cases = vec![
                    (ToolChoice::Required, false, 0),
                    (ToolChoice::Required, false, 1),
                    (ToolChoice::Function(last.clone()), false, 1),
                ];
                if syntax == ToolCallSyntax::Mistral {
                    cases.push((ToolChoice::Required, true, 0));
                }
                for (choice, parallel, sampler) in cases {
                    let constraint = tool_call_constraint(syntax, &tools, &choice, parallel)
                        .unwrap()
                        .unwrap();
                    let (how, options) = both_samplers(160)[sampler].clone();
                    let (output, complete) = run(&mut session, &ids, &options, &constraint);
                    eprintln!("{name}/{set}/{choice:?}/{how}: {output}");
                    if parallel && !complete {
                        // Several calls given room: SmolLM2 may repeat until the limit.
                        continue;
                    }
                    assert!(complete, "{name} {set} {choice:?} {how}: cut: {output:?}");
                    let (_, calls) = parse_tool_calls(syntax, &tools, &output)
                        .unwrap_or_else(|e| panic!("{name} {set} {choice:?}: {e}: {output:?}"));
                    let calls = calls_json(&calls);
                    let choice_name = match &choice {
                        ToolChoice::Function(f) => f.clone(),
                        _ => "required".into(),
                    };
                    records.push(json!({"check": "tool_call", "syntax": name,
                        "name": format!("{name}/{set}/{choice_name}/{how}/parallel={parallel}: {p}"),
                        "tools": tools_value, "choice": choice_name, "calls": calls,
                        "output": output, "complete": complete}));
                }
            }
        }
    }
    validate("tool-calls-llama3-mistral", &records);
}

#[test]
fn bad_grammars_and_schemas_are_refused_with_the_problem_named() {
    let (model, _) = load();
    let cases: [(Constraint, &str); 8] = [
        (
            Constraint::json_schema("{\"type\": \"object\""),
            "not valid JSON",
        ),
        (Constraint::json_schema("[1, 2]"), "must be a JSON object"),
        (
            Constraint::json_schema(r#"{"type": "object", "not": {"required": ["a"]}}"#),
            "not",
        ),
        (
            Constraint::json_schema(
                r#"{"type": "string", "format": "x-unheard-of", "minLength": 5, "maxLength": 2}"#,
            ),
            "JSON schema",
        ),
        (
            Constraint::gbnf("root ::= \"a\" missing"),
            "`missing` is used but not defined",
        ),
        (Constraint::gbnf("start ::= \"a\""), "no `root` rule"),
        (
            Constraint::gbnf("root ::= \"a"),
            "unterminated string literal",
        ),
        (Constraint::regex("a(b"), "regex"),
    ];
    for (c, want) in cases {
        let e = model
            .check_constraint(&c)
            .expect_err(&format!("{c:?} was accepted"));
        let msg = e.to_string();
        assert!(msg.contains(want), "{c:?}: {msg:?} does not name {want:?}");
    }
    // A template without a tool-call syntax is refused, naming the syntaxes known.
    let e = ToolCallSyntax::detect(model.chat_template.as_deref().unwrap()).unwrap_err();
    assert!(e.to_string().contains("Hermes"), "{e}");
    // Generation refuses a bad constraint before anything runs.
    let (_, mut session) = load();
    let options = GenerateOptions {
        constraint: Some(Constraint::gbnf("root ::= (")),
        ..GenerateOptions::greedy(4)
    };
    let e = session.generator(&[1, 2, 3], &options).unwrap_err();
    assert!(e.to_string().contains("grammar"), "{e}");
    assert_eq!(session.n_past(), 0, "nothing was processed");
}
