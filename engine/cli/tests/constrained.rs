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

/// A constrained step asks the grammar about the best candidates before it computes a mask
/// (the fast path); it must pick exactly the tokens the mask would. Compared here with the
/// mask on every step (`EDGE_RUN_CONSTRAINT_CHECKS=0`), greedy and sampled, on a grammar with a
/// lexeme per character, a list grammar and a schema with string lengths.
#[test]
fn asking_the_best_candidates_first_changes_no_token() {
    let m = model();
    let dir = repo().join("tests/reference");
    let grammar = |g: &str| dir.join("grammars").join(g).to_str().unwrap().to_string();
    let schema = dir.join("json-schemas/array_strings.json");
    let cases: [(&str, String); 3] = [
        ("--grammar-file", grammar("english.gbnf")),
        ("--grammar-file", grammar("list.gbnf")),
        ("--json-schema-file", schema.to_str().unwrap().to_string()),
    ];
    let mut decided_by_candidates = 0;
    for (flag, file) in &cases {
        for temp in ["0", "0.8"] {
            let args = [
                &m,
                "--chat",
                "-p",
                "Name some fruits.",
                "--temp",
                temp,
                "--seed",
                "7",
                "-n",
                "24",
                "-t",
                "2",
                "-v",
                flag,
                file,
            ];
            let out = |checks: &str| {
                let o = Command::new(BIN)
                    .args(args)
                    .env_remove("RUST_LOG")
                    .env("EDGE_RUN_CONSTRAINT_CHECKS", checks)
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(o.status.success(), "{file} --temp {temp}: {err}");
                (String::from_utf8_lossy(&o.stdout).into_owned(), err)
            };
            let (fast, log) = out("1");
            let (masked, _) = out("0");
            assert_eq!(fast, masked, "{file} --temp {temp}");
            let n: u32 = log
                .split("masks and ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no constraint line in the log: {log}"));
            decided_by_candidates += n;
        }
    }
    assert!(
        decided_by_candidates > 0,
        "the fast path never decided a step"
    );
}

/// Bounded repetitions of any length: `x{0,40}` of a class at the end of the grammar (no
/// lexeme can take it whole) and `(...){0,12}` of a group. Spelled out as nested optionals,
/// these went past llguidance's nesting limit ("lark grammar too deeply nested").
#[test]
fn long_bounded_repetitions_constrain_the_output() {
    let m = model();
    for (grammar, ok) in [
        (
            r#"root ::= "Fruits:" [a-z ]{0,40}"#,
            (|s: &str| {
                s.strip_prefix("Fruits:").is_some_and(|r| {
                    r.len() <= 40 && r.bytes().all(|b| b == b' ' || b.is_ascii_lowercase())
                })
            }) as fn(&str) -> bool,
        ),
        (r#"root ::= ([a-z]{1,10} ", "){0,12} "end""#, |s: &str| {
            let Some(items) = s.strip_suffix("end") else {
                return false;
            };
            let parts: Vec<&str> = items.split(", ").collect();
            let (last, rest) = parts.split_last().unwrap();
            last.is_empty()
                && rest.len() <= 12
                && rest.iter().all(|p| {
                    (1..=10).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_lowercase())
                })
        }),
    ] {
        let (code, out, err) = run(&[
            &m,
            "--chat",
            "-p",
            "Name some fruits.",
            "--temp",
            "0",
            "-n",
            "80",
            "-t",
            "2",
            "--grammar",
            grammar,
        ]);
        assert_eq!(code, Some(0), "{grammar}: {err}");
        assert!(ok(&out), "{grammar}: {out:?}");
    }
}
