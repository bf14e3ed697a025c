//! The tool-call syntaxes against the formats the models' own chat templates document
//! (Llama 3.1/3.2/3.3: `{"name": function name, "parameters": dictionary of argument name and
//! its value}`, one call per message; Mistral Nemo / Small: `[TOOL_CALLS][{"name": ...,
//! "arguments": {...}, "id": "<9 letters or digits>"}, ...]`; Hermes / Qwen2.5:
//! `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`), and the streamed reading of
//! calls against the whole-output parser.

use serde_json::{json, Value};

use super::*;
use crate::constrain::tools::*;

fn tools() -> Vec<ToolFunction> {
    parse_tools(&json!([
        {"type": "function", "function": {"name": "get_weather", "parameters":
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "stop", "parameters": {"type": "object", "properties": {}}}},
    ]))
    .unwrap()
}

/// What the fragments of the Llama 3.2 and Mistral Nemo templates edge-run keys on look like.
#[test]
fn the_syntaxes_are_detected_from_the_templates_markers() {
    let llama = "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools is not none %}Environment: ipython{% endif %}";
    assert_eq!(
        ToolCallSyntax::detect(llama).unwrap(),
        ToolCallSyntax::Llama3
    );
    let mistral = "{%- if tools is not none %}[AVAILABLE_TOOLS]{% endif %}{{- \"[TOOL_CALLS][\" }}";
    assert_eq!(
        ToolCallSyntax::detect(mistral).unwrap(),
        ToolCallSyntax::Mistral
    );
    let hermes = "{{- '\\n<tool_call>\\n{\"name\": \"' }}";
    assert_eq!(
        ToolCallSyntax::detect(hermes).unwrap(),
        ToolCallSyntax::Hermes
    );
    let e = ToolCallSyntax::detect("{{ messages[0].content }}").unwrap_err();
    assert!(e.to_string().contains("Mistral [TOOL_CALLS]"), "{e}");
}

fn args(c: &ToolCall) -> Value {
    serde_json::from_str(&c.arguments).unwrap()
}

#[test]
fn llama3_calls_use_parameters_and_parse() {
    let out = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    let (text, calls) = parse_tool_calls(ToolCallSyntax::Llama3, &tools(), out).unwrap();
    assert_eq!(text, "");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(args(&calls[0]), json!({"city": "Paris"}));
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
    // "arguments" is not Llama 3's key: the call's arguments are missing, not these.
    let (_, calls) = parse_tool_calls(
        ToolCallSyntax::Llama3,
        &tools(),
        r#"{"name": "stop", "arguments": {"x": 1}}"#,
    )
    .unwrap();
    assert_eq!(args(&calls[0]), json!({}));
    // The grammar writes `{"name": "<name>", "parameters": ...}` (name first, Python's separators).
    let c = tool_call_constraint(
        ToolCallSyntax::Llama3,
        &tools(),
        &ToolChoice::Required,
        false,
    )
    .unwrap()
    .unwrap();
    assert!(
        c.source.contains(r#""required":["name","parameters"]"#),
        "{}",
        c.source
    );
    assert!(c.source.starts_with("start: call\n"), "{}", c.source);
    assert_eq!(c.trigger, None);
    let auto = tool_call_constraint(ToolCallSyntax::Llama3, &tools(), &ToolChoice::Auto, false)
        .unwrap()
        .unwrap();
    assert_eq!(auto.trigger.as_deref(), Some("{\"name\""));
}

#[test]
fn mistral_calls_are_a_list_after_the_tool_calls_token_with_nine_character_ids() {
    let out = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "stop", "arguments": {}}]"#;
    let (text, calls) = parse_tool_calls(ToolCallSyntax::Mistral, &tools(), out).unwrap();
    assert_eq!(text, "");
    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["get_weather", "stop"]);
    assert_eq!(args(&calls[0]), json!({"city": "Oslo"}));
    for c in &calls {
        // Mistral's template refuses ids that are not 9 letters or digits.
        assert_eq!(c.id.len(), 9, "{}", c.id);
        assert!(
            c.id.chars().all(|ch| ch.is_ascii_alphanumeric()),
            "{}",
            c.id
        );
    }
    assert_ne!(calls[0].id, calls[1].id);
    let c = tool_call_constraint(
        ToolCallSyntax::Mistral,
        &tools(),
        &ToolChoice::Required,
        true,
    )
    .unwrap()
    .unwrap();
    assert!(
        c.source
            .starts_with(r#"start: "[TOOL_CALLS][" call (", " call)* "]""#),
        "{}",
        c.source
    );
    // An unknown function is an error, never a call.
    let e = parse_tool_calls(
        ToolCallSyntax::Mistral,
        &tools(),
        r#"[TOOL_CALLS][{"name": "fly", "arguments": {}}]"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown function \"fly\""), "{e}");
}

/// Runs `output` through a stream in pieces of `step` characters.
fn streamed(
    syntax: ToolCallSyntax,
    forced: bool,
    output: &str,
    step: usize,
) -> (String, Vec<StreamedCall>, Vec<ToolStreamEvent>) {
    let mut s = ToolCallStream::new(syntax, forced, 42);
    let mut events = Vec::new();
    let chars: Vec<char> = output.chars().collect();
    for piece in chars.chunks(step) {
        s.push(&piece.iter().collect::<String>(), &mut events);
    }
    s.end(&mut events);
    s.check(&tools()).unwrap();
    (s.text().to_string(), s.calls().to_vec(), events)
}

#[test]
fn streamed_calls_equal_the_whole_outputs_calls_in_every_syntax() {
    let cases = [
        (
            ToolCallSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"S\\\"o {x}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"stop\", \"arguments\": {}}\n</tool_call>",
        ),
        (
            ToolCallSyntax::Llama3,
            r#"{"name": "get_weather", "parameters": {"city": "Rome, [IT]"}}"#,
        ),
        (
            ToolCallSyntax::Mistral,
            r#"[TOOL_CALLS][{"name": "stop", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "}"}}]"#,
        ),
    ];
    for (syntax, out) in cases {
        let (_, whole) = parse_tool_calls(syntax, &tools(), out).unwrap();
        for forced in [true, false] {
            for step in [1, 2, 3, 7, 1000] {
                let (text, calls, events) = streamed(syntax, forced, out, step);
                assert_eq!(text, "", "{syntax:?} {step}");
                assert_eq!(calls.len(), whole.len(), "{syntax:?} {step}: {calls:?}");
                for (c, w) in calls.iter().zip(&whole) {
                    assert!(c.complete);
                    assert_eq!(c.name, w.name);
                    assert_eq!(
                        serde_json::from_str::<Value>(&c.arguments).unwrap(),
                        args(w),
                        "{syntax:?} {step}"
                    );
                }
                // Each call starts (id and name) before any of its arguments.
                let mut started = Vec::new();
                for e in &events {
                    match e {
                        ToolStreamEvent::CallStart { index, .. } => started.push(*index),
                        ToolStreamEvent::Arguments { index, .. } => {
                            assert!(started.contains(index))
                        }
                        ToolStreamEvent::Text(t) => panic!("text {t:?}"),
                    }
                }
                assert_eq!(started, (0..whole.len()).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn auto_text_goes_out_until_the_call_opens() {
    let out = "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>";
    for step in [1, 4, 100] {
        let (text, calls, events) = streamed(ToolCallSyntax::Hermes, false, out, step);
        assert_eq!(text, "Let me check. ");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, r#"{"city": "Lyon"}"#);
        // No text event holds a piece of the opening.
        for e in &events {
            if let ToolStreamEvent::Text(t) = e {
                assert!(!t.contains('<'), "{t:?}");
            }
        }
    }
    // Text that only looks like the start of the opening is released at the end.
    let (text, calls, _) = streamed(ToolCallSyntax::Hermes, false, "a < b <tool", 1);
    assert_eq!((text.as_str(), calls.len()), ("a < b <tool", 0));
    // A call cut by the token limit is incomplete and not checked.
    let (_, calls, _) = streamed(
        ToolCallSyntax::Mistral,
        true,
        r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci"#,
        3,
    );
    assert_eq!(calls.len(), 1);
    assert!(!calls[0].complete);
    assert_eq!(calls[0].arguments, r#"{"ci"#);
}
