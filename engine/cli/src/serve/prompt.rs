//! From a request's prompt to tokens: chat messages through the model's chat template (as
//! `edge-run --chat` renders them), a completion's text verbatim; special-token text is parsed
//! as special tokens and BOS added as the model's metadata says, as the CLI does.

use std::sync::Arc;

use axum::http::StatusCode;
use edge_engine::model::Model;
use edge_tokenizers::chat::ChatTemplate;

use super::error::ApiError;
use super::request::Prompt;

/// Renders and tokenizes prompts for one model.
pub struct Prompter {
    model: Arc<Model>,
    /// The compiled chat template, or why there is none.
    template: Result<ChatTemplate, String>,
}

impl Prompter {
    /// Compiles the model's chat template, if it has one (a model without one can still serve
    /// `/v1/completions`).
    pub fn new(model: Arc<Model>) -> Prompter {
        let tok = &model.tokenizer;
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i)).into_owned())
                .unwrap_or_default()
        };
        let template = match model.chat_template.as_deref() {
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
        Prompter { model, template }
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

    /// The prompt's tokens.
    pub fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
        let (text, param) = match prompt {
            Prompt::Text(t) => (std::borrow::Cow::Borrowed(t.as_str()), "prompt"),
            Prompt::Chat(messages) => {
                let template = self.template.as_ref().map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, "no_chat_template", e.clone())
                })?;
                let text = template
                    .render(messages, true)
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
