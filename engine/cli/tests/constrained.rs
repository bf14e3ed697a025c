//! The constraint flags end to end: a schema-constrained run's stdout parses and validates
//! (checked by hand here), `--tools` prints an OpenAI-shaped message whose calls name a given
//! function, and bad schemas, grammars and flag combinations exit 2 with the problem named.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_edge-run");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> String {
    edge_tests::smollm2_path().to_str().unwrap().to_string()
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_json_schema_run_prints_valid_json() {
    let m = model();
    let schema = r#"{"type": "object", "properties": {"action": {"enum": ["move", "turn", "stop"]}, "distance": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["action", "distance"], "additionalProperties": false}"#;
    let (code, out, err) = run(&[
        &m,
        "--chat",
        "-p",
        "Move forward 2 meters",
        "--temp",
        "0",
        "-n",
        "64",
        "-t",
        "2",
        "-j",
        schema,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("stopped: end-of-generation token"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 2, "{out}");
    assert!(
        ["move", "turn", "stop"].contains(&o["action"].as_str().unwrap()),
        "{out}"
    );
    let d = o["distance"].as_f64().unwrap();
    assert!((0.0..=10.0).contains(&d), "{out}");
}

#[test]
fn tools_required_prints_calls_of_the_given_functions() {
    let m = model();
    let r = repo().join("tests/reference");
    let template = r.join("chat-templates/hermes-tools.jinja");
    let tools = r.join("tool-sets/robot_base.json");
    let (code, out, err) = run(&[
        &m,
        "--chat",
        "--chat-template-file",
        template.to_str().unwrap(),
        "--tools",
        tools.to_str().unwrap(),
        "--tool-choice",
        "required",
        "-p",
        "Turn left.",
        "--temp",
        "0",
        "-n",
        "100",
        "-t",
        "2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{out}");
    for c in calls {
        let name = c["function"]["name"].as_str().unwrap();
        assert!(["move", "turn", "stop"].contains(&name), "{out}");
        let args: serde_json::Value =
            serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{out}");
        assert!(c["id"].as_str().unwrap().starts_with("call_"), "{out}");
    }
}

#[test]
fn bad_constraints_exit_2_naming_the_problem() {
    let m = model();
    let r = repo().join("tests/reference");
    let tools = r.join("tool-sets/robot_base.json");
    let tools = tools.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["-j", r#"{"type": "object", "not": {}}"#],
            "Unimplemented keys: [\"not\"]",
        ),
        (&["-j", "{"], "--json-schema: JSON schema: not valid JSON"),
        (
            &["--json-schema-file", "/nonexistent.json"],
            "--json-schema-file: cannot read",
        ),
        (&["--grammar", "root ::= [a-"], "--grammar: grammar: line 1"),
        (
            &["--grammar", "root ::= x"],
            "the rule `x` is used but not defined",
        ),
        (&["--regex", "("], "--regex: regex"),
        (
            &["--grammar", "root ::= \"a\"", "-j", "{}"],
            "cannot be used with",
        ),
        (&["--tools", tools], "--tools only applies to chat"),
        (&["--chat", "--tools", tools], "no tool-call syntax"),
        (&["--tool-choice", "required"], "add --tools"),
    ];
    for (extra, want) in cases {
        let mut args = vec![m.as_str(), "-p", "hi", "-n", "1"];
        args.extend_from_slice(extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err:?} lacks {want:?}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}
