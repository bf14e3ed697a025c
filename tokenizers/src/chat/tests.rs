use super::*;
use crate::chat::time::strftime;

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
    assert!(matches!(render(src, &[], false), Err(ChatTemplateError::Raised(m)) if m == "deep"));
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
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let start = std::time::Instant::now();
    let err = render(src, &[], false).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::OutOfFuel { limit: 2_000_000 }),
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

/// Templates that build large strings in few instructions, one per line (the red-team's list:
/// `indent`, `format` widths, `%`-format widths, `.replace` and `join` doubling in a loop, and
/// the operators and recursion that double a string too).
const MEMORY_HOSTILE: [&str; 13] = [
    "{{ 'x'|indent(20000000000) }}",
    "{{ 'x'|indent('y' * 100000000) }}",
    "{{ '{:>20000000000}'.format('x') }}",
    "{{ '%20000000000s'|format('x') }}",
    "{{ 'x'|center(20000000000) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s]|join(ns.s) %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% macro f(s, n) %}{% if n > 0 %}{{ f(s ~ s, n - 1)|length }}{% endif %}{% endmacro %}{{ f('ab', 60) }}",
    "{% set s = 'y' * 10000000 %}{{ {'a': [1, 2, 3, [4, [5]]]}|tojson(indent=s) }}",
    "{{ ([1] * 100000000)|list|length }}",
];

/// Set by [`memory_hostile_templates_fail_within_bounds`] in its child processes: which line of
/// [`MEMORY_HOSTILE`] to render.
const HOSTILE_CASE_VAR: &str = "EDGE_RUN_HOSTILE_TEMPLATE";

/// The child's side: renders one hostile template with the default limits and checks that it
/// fails, quickly. Run only by the parent test, under an address-space limit.
#[test]
#[ignore = "a child process of memory_hostile_templates_fail_within_bounds (which runs it)"]
fn memory_hostile_template_child() {
    let case: usize = std::env::var(HOSTILE_CASE_VAR)
        .expect("run by memory_hostile_templates_fail_within_bounds")
        .parse()
        .unwrap();
    let start = std::time::Instant::now();
    let result = render(MEMORY_HOSTILE[case], &[("user", "hi")], false);
    let err = result.expect_err("a hostile template must fail");
    println!("error: {err}");
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
}

/// Each memory-hostile template fails with an error in a child process whose address space is
/// capped at 1 GiB (without the bounds each one allocates gigabytes and aborts). The fuel
/// budget charges data too (about 64 bytes per unit): 2M fuel is about 128 MB, plus the
/// output cap; measured peak resident size 5-211 MB per case (2 cores, AMD EPYC).
#[cfg(unix)]
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "spawns its own binary under ulimit -v: qemu-user cannot exec it (run it natively)"
)]
fn memory_hostile_templates_fail_within_bounds() {
    let exe = std::env::current_exe().unwrap();
    for (case, src) in MEMORY_HOSTILE.iter().enumerate() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
            .arg(&exe)
            .args([
                "--exact",
                "chat::tests::memory_hostile_template_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOSTILE_CASE_VAR, case.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "template {case} `{src}`: {:?}\n{stdout}\n{stderr}",
            out.status
        );
        assert!(stdout.contains("error: chat template"), "{src}: {stdout}");
    }
}

#[test]
fn tools_reach_the_template_as_python_would_dump_them() {
    // Expected text: Python's `json.dumps(tool, ensure_ascii=False)` of the same tool, which
    // is what transformers' `tojson` gives the template.
    let src = "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% else %}no tools{% endif %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let tools: serde_json::Value = serde_json::from_str(
        r#"[{"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": -5}}, "required": ["x"]}}}]"#,
    )
    .unwrap();
    let out = t.render_with_tools(&[], Some(&tools), false).unwrap();
    assert_eq!(
        out,
        "{\"type\": \"function\", \"function\": {\"name\": \"move\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\", \"minimum\": -5}}, \"required\": [\"x\"]}}}\n"
    );
    assert_eq!(t.render_with_tools(&[], None, false).unwrap(), "no tools");
}

#[test]
fn json_messages_carry_tool_calls_and_tool_results_to_the_template() {
    // The fragment of Qwen2.5's template that writes an assistant's calls and a tool's result;
    // the expected text is that template's documented output for this conversation.
    let src = concat!(
        "{%- for m in messages %}",
        "{%- if m.role == 'assistant' and m.tool_calls %}",
        "{%- for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}",
        "{%- elif m.role == 'tool' %}<tool_response id={{ m.tool_call_id }}>\n{{ m.content }}\n</tool_response>",
        "{%- else %}{{ m.role }}: {{ m.content }}{{ '\n' }}",
        "{%- endif %}",
        "{%- endfor %}",
    );
    let t = ChatTemplate::new(src, "", "").unwrap();
    let messages: Vec<serde_json::Value> = serde_json::from_str(
        r#"[{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 3}"}]"#,
    )
    .unwrap();
    let out = t.render_json_messages(&messages, None, false).unwrap();
    assert_eq!(
        out,
        "user: Weather in Oslo?\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><tool_response id=call_1>\n{\"temp_c\": 3}\n</tool_response>"
    );
}
