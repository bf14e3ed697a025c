//! From a request's prompt to tokens: chat messages through the model's chat template (as
//! `edge-run --chat` renders them), a completion's text verbatim; special-token text is parsed
//! as special tokens and BOS added as the model's metadata says, as the CLI does.

use std::sync::Arc;

use axum::http::StatusCode;
use edge_engine::constrain::tools::{ToolCallSyntax, ToolChoice};
use edge_engine::constrain::Constraint;
use edge_engine::model::Model;
use edge_tokenizers::chat::ChatTemplate;

use super::error::ApiError;
use super::request::{GenRequest, Prompt};

/// Renders and tokenizes prompts for one model.
pub struct Prompter {
    model: Arc<Model>,
    /// The compiled chat template, or why there is none.
    template: Result<ChatTemplate, String>,
    /// The tool-call syntax the template teaches, or why there is none.
    syntax: Result<ToolCallSyntax, String>,
}

/// A request made ready for a slot.
pub struct Prepared {
    /// The prompt's tokens.
    pub tokens: Vec<u32>,
    /// What the output must follow (`response_format`, `grammar`, or the tool calls').
    pub constraint: Option<Constraint>,
    /// The tool-call syntax the answer is read with (a request with tools).
    pub syntax: Option<ToolCallSyntax>,
}

impl Prompter {
    /// Compiles the chat template (`template_file`'s, from `--chat-template-file`, or the
    /// model's), if there is one (a model without one can still serve `/v1/completions`).
    pub fn new(model: Arc<Model>, template_file: Option<String>) -> Prompter {
        let tok = &model.tokenizer;
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned())
                .unwrap_or_default()
        };
        let source = template_file.as_deref().or(model.chat_template.as_deref());
        let syntax = match source {
            None => Err("the model has no chat template to show the tools".to_string()),
            Some(s) => ToolCallSyntax::detect(s).map_err(|e| e.message),
        };
        let template = match source {
            None => Err(
                "the model has no tokenizer.chat_template: use /v1/completions and format the prompt yourself"
                    .to_string(),
            ),
            Some(source) => ChatTemplate::new(source, &piece(tok.bos_id()), &piece(tok.eos_id()))
                .map_err(|e| format!("the model's chat template does not compile: {e}")),
        };
        if let Err(e) = &template {
            log::warn!("{e}");
        }
        Prompter {
            model,
            template,
            syntax,
        }
    }

    /// Tokenizes `req`'s prompt and compiles its constraint (a request with tools: the tool
    /// calls' one), so that a bad schema, grammar or tool is a 400 naming the field before
    /// the request is queued.
    pub fn prepare(&self, req: &GenRequest) -> Result<Prepared, ApiError> {
        let mut constraint = None;
        if let Some((c, param)) = &req.constraint {
            self.check_constraint(c, param)?;
            constraint = Some(c.clone());
        }
        let mut syntax = None;
        if let Some(t) = req.tools.as_ref().filter(|t| t.choice != ToolChoice::None) {
            let s = self.syntax.clone().map_err(|e| {
                ApiError::field(
                    "tools",
                    format!("{e}; or start the server with --chat-template-file FILE, a template with one of these syntaxes"),
                )
            })?;
            let c = t.constraint(s)?;
            if let Some(c) = &c {
                if let Err(e) = self.model.check_constraint(c) {
                    return Err(self
                        .culprit(t)
                        .unwrap_or_else(|| ApiError::field("tools", e.to_string())));
                }
            }
            constraint = c;
            syntax = Some(s);
        }
        let tools = req.tools.as_ref().map(|t| &t.value);
        Ok(Prepared {
            tokens: self.tokens(&req.prompt, tools)?,
            constraint,
            syntax,
        })
    }

    /// The 400 naming the first function whose parameters schema does not compile.
    fn culprit(&self, t: &super::tools::ToolRequest) -> Option<ApiError> {
        t.functions.iter().enumerate().find_map(|(i, f)| {
            let c = Constraint::json_schema(f.parameters.to_string());
            self.model.check_constraint(&c).err().map(|e| {
                ApiError::field(
                    &format!("tools[{i}].function.parameters"),
                    format!("the parameters of \"{}\": {e}", f.name),
                )
            })
        })
    }

    /// Compiles `constraint` against the model's vocabulary, so that a bad schema or grammar
    /// is a 400 naming the field before the request is queued.
    pub fn check_constraint(
        &self,
        constraint: &edge_engine::constrain::Constraint,
        param: &str,
    ) -> Result<(), ApiError> {
        self.model
            .check_constraint(constraint)
            .map_err(|e| ApiError::field(param, e.to_string()))
    }

    /// The prompt's tokens; a chat's with `tools` in the template's `tools` variable.
    pub fn tokens(
        &self,
        prompt: &Prompt,
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, ApiError> {
        let (text, param) = match prompt {
            Prompt::Text(t) => (std::borrow::Cow::Borrowed(t.as_str()), "prompt"),
            Prompt::Chat(messages) => {
                let template = self.template.as_ref().map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, "no_chat_template", e.clone())
                })?;
                let text = template
                    .render_json_messages(messages, tools, true)
                    .map_err(|e| ApiError::field("messages", format!("the chat template: {e}")))?;
                (std::borrow::Cow::Owned(text), "messages")
            }
        };
        let tok = &self.model.tokenizer;
        let ids = tok
            .encode(&text, tok.add_bos(), true)
            .map_err(|e| ApiError::field(param, format!("cannot tokenize: {e}")))?;
        if ids.is_empty() {
            return Err(ApiError::field(param, "has no tokens"));
        }
        Ok(ids)
    }
}
