//! The constraint flags of generation (`--grammar`, `--grammar-file`, `-j/--json-schema`,
//! `--json-schema-file`, `--regex`) and tool calls (`--tools`, `--tool-choice`): what they
//! ask the library for, and the JSON object printed for tool calls.

use std::path::Path;

use edge_engine::constrain::tools::{
    parse_tool_calls, parse_tools, tool_call_constraint, ToolCallSyntax, ToolChoice, ToolFunction,
};
use edge_engine::constrain::Constraint;
use edge_engine::model::Model;
use serde_json::{json, Value};

use crate::args::GenerateArgs;
use crate::errors::{CliError, CliResult};

/// Tool calling as the flags ask for it.
pub struct Tools {
    pub syntax: ToolCallSyntax,
    pub functions: Vec<ToolFunction>,
    /// The tools as the chat template's `tools` variable gets them.
    pub value: Value,
}

fn read(path: &Path, flag: &str) -> CliResult<String> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{flag}: cannot read {}: {e}", path.display())))
}

/// The constraint the flags give (none without them), compiled against `model` so that a bad
/// grammar or an unsupported schema keyword is refused (exit 2) before generation.
pub fn constraint_from_args(
    a: &GenerateArgs,
    model: &Model,
    tools: Option<&Tools>,
) -> CliResult<Option<Constraint>> {
    let (flag, c) = if let Some(g) = &a.grammar {
        ("--grammar", Constraint::gbnf(g.clone()))
    } else if let Some(f) = &a.grammar_file {
        (
            "--grammar-file",
            Constraint::gbnf(read(f, "--grammar-file")?),
        )
    } else if let Some(s) = &a.json_schema {
        ("--json-schema", Constraint::json_schema(s.clone()))
    } else if let Some(f) = &a.json_schema_file {
        (
            "--json-schema-file",
            Constraint::json_schema(read(f, "--json-schema-file")?),
        )
    } else if let Some(r) = &a.regex {
        ("--regex", Constraint::regex(r.clone()))
    } else if let Some(t) = tools {
        let choice = ToolChoice::parse(&a.tool_choice);
        // One call per reply: a small model given room for more tends to repeat its call.
        let Some(c) = tool_call_constraint(t.syntax, &t.functions, &choice, false)
            .map_err(|e| CliError::usage(format!("--tool-choice: {e}")))?
        else {
            return Ok(None);
        };
        ("--tools", c)
    } else {
        return Ok(None);
    };
    model
        .check_constraint(&c)
        .map_err(|e| CliError::usage(format!("{flag}: {e}")))?;
    Ok(Some(c))
}

/// The tools of `--tools` for the chat template `template` (whose tool-call syntax is
/// detected); `None` without the flag.
pub fn tools_from_args(a: &GenerateArgs, template: &str) -> CliResult<Option<Tools>> {
    let Some(path) = &a.tools else {
        if a.tool_choice != "auto" {
            return Err(CliError::usage(
                "--tool-choice only applies to tool calls: add --tools FILE",
            ));
        }
        return Ok(None);
    };
    if !a.chat {
        return Err(CliError::usage(
            "--tools only applies to chat: add --chat (the chat template shows the tools to the model)",
        ));
    }
    let text = read(path, "--tools")?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("--tools: {} is not JSON: {e}", path.display())))?;
    let functions = parse_tools(&value).map_err(|e| CliError::usage(format!("--tools: {e}")))?;
    let syntax =
        ToolCallSyntax::detect(template).map_err(|e| CliError::usage(format!("--tools: {e}")))?;
    Ok(Some(Tools {
        syntax,
        functions,
        value,
    }))
}

/// The generated `output` as an OpenAI assistant message: `{"content", "tool_calls"}`.
pub fn tool_calls_json(tools: &Tools, output: &str) -> CliResult<String> {
    let (content, calls) =
        parse_tool_calls(tools.syntax, &tools.functions, output).map_err(|e| e.to_string())?;
    let calls: Vec<Value> = calls
        .into_iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let content = if content.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(content)
    };
    Ok(json!({"role": "assistant", "content": content, "tool_calls": calls}).to_string())
}
