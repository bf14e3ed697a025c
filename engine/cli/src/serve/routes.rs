//! The HTTP routes and their handlers. Handlers only parse, check and format: prompts are
//! tokenized on the runtime's blocking pool, generation and embeddings run on the slots'
//! engine threads ([`super::worker`], [`super::embedder`]). Every answer, errors included, is
//! JSON in OpenAI's shape (or server-sent events for `stream: true`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use edge_engine::constrain::tools::ToolCallSyntax;
use edge_engine::generate::GenerateOptions;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::embedder::{EmbedJob, EmbedPool};
use super::error::ApiError;
use super::metrics::Metrics;
use super::prompt::Prompter;
use super::request::{parse_embeddings, parse_generation, GenRequest};
use super::tools::CallReader;
use super::worker::{Event, Finish, Job, Scheduler};

/// The largest request body taken (413 beyond).
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// Events buffered between a slot and its client.
const EVENT_BUFFER: usize = 64;

/// What the handlers share.
pub struct AppState {
    /// The model's name in answers (`model`) and in `/v1/models`.
    pub model_id: String,
    /// Renders and tokenizes prompts (a decoder model).
    pub prompter: Option<Prompter>,
    /// The generation slots (a decoder model).
    pub sched: Option<Arc<Scheduler>>,
    /// The embedding slots (an encoder model).
    pub embed: Option<EmbedPool>,
    /// Each slot's context, in tokens.
    pub ctx: usize,
    /// Slots.
    pub slots: usize,
    /// Requests that may wait.
    pub queue: usize,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// `--metrics`.
    pub metrics_enabled: bool,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// When the server started (Unix seconds), the `created` of the model.
    pub started: u64,
}

type Shared = Arc<AppState>;

/// The router.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn next_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{:x}{:06}",
        now_secs(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Counts the response and returns it.
fn counted(st: &AppState, endpoint: &'static str, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    st.metrics.request(endpoint, resp.status().as_u16());
    resp
}

fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
    match given {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "this server needs an API key: send the header Authorization: Bearer KEY",
        )),
        // Compared in full (no early exit at the first differing byte).
        Some(g)
            if g.len() == key.len()
                && g.bytes().zip(key.bytes()).fold(0, |a, (x, y)| a | (x ^ y)) == 0 =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "invalid API key: send the key the server was started with (--api-key)",
        )),
    }
}

async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the request body is larger than {} MiB",
                MAX_BODY_BYTES >> 20
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            if e.to_string().contains("length limit") {
                too_large()
            } else {
                ApiError::bad_request(format!("cannot read the request body: {e}"))
            }
        })
}

/// Raises the job's cancel flag when the client's side (the handler or the stream) is
/// dropped: a client that went away stops its generation.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

async fn chat(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let r = generate(&st, &headers, body, true).await;
    counted(&st, "chat", r)
}

async fn completions(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let r = generate(&st, &headers, body, false).await;
    counted(&st, "completions", r)
}

async fn generate(
    st: &Shared,
    headers: &HeaderMap,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    authorize(st, headers)?;
    let body = read_body(headers, body).await?;
    let req = parse_generation(&body, chat)?;
    let (Some(sched), Some(_)) = (&st.sched, &st.prompter) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "model_not_generative",
            "the model is an encoder (embedding) model: it serves /v1/embeddings only",
        ));
    };
    let st2 = Arc::clone(st);
    let req = Arc::new(req);
    let req2 = Arc::clone(&req);
    let prepared =
        tokio::task::spawn_blocking(move || st2.prompter.as_ref().map(|p| p.prepare(&req2)))
            .await
            .map_err(|_| ApiError::internal("tokenizing the prompt failed"))?
            .ok_or_else(|| ApiError::internal("no prompter"))??;
    let tokens = prepared.tokens;
    if tokens.len() >= st.ctx {
        return Err(ApiError {
            param: Some(if chat { "messages" } else { "prompt" }.into()),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "context_length_exceeded",
                format!(
                    "the prompt has {} tokens but a slot's context holds {} (with room for at least one generated token): shorten the prompt, or restart the server with a larger --ctx",
                    tokens.len(),
                    st.ctx
                ),
            )
        });
    }
    let n_prompt = tokens.len();
    let options = GenerateOptions {
        max_tokens: req.max_tokens.unwrap_or(st.ctx - n_prompt),
        sampling: req.sampling.clone(),
        stop_at_eog: !req.ignore_eos,
        // Mistral's [TOOL_CALLS] is a control token: its text must reach the call reader.
        render_special: prepared.syntax == Some(ToolCallSyntax::Mistral),
        constraint: prepared.constraint,
    };
    let (tx, mut rx) = mpsc::channel(EVENT_BUFFER);
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(Arc::clone(&cancel));
    let job = Job {
        tokens,
        options,
        stop: req.stop.clone(),
        events: tx,
        cancel,
        arrived,
    };
    if sched.submit(job).is_err() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_busy",
            format!(
                "all {} slots are busy and {} requests are waiting (the most --queue allows): retry later",
                st.slots, st.queue
            ),
        ));
    }
    // The first event: an error becomes the response's status; otherwise the answer begins.
    let first = match rx.recv().await {
        Some(Event::Error(e)) => return Err(e),
        Some(ev) => ev,
        None => return Err(ApiError::internal("the generation ended without an answer")),
    };
    let id = next_id(if chat { "chatcmpl" } else { "cmpl" });
    let calls = match (&req.tools, prepared.syntax) {
        (Some(t), Some(syntax)) => Some(CallReader::new(t, syntax, id_seed(&id))),
        _ => None,
    };
    let fmt = Formatter {
        id,
        created: now_secs(),
        model: st.model_id.clone(),
        chat,
    };
    if req.stream {
        Ok(sse(fmt, &req, first, rx, guard, calls))
    } else {
        let mut text = String::new();
        let mut ev = Some(first);
        loop {
            match ev {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Done(f)) => {
                    drop(guard);
                    let answer = match calls {
                        Some(c) => {
                            let (message, called) = c.message(&text)?;
                            fmt.whole_message(message, finish_reason(&f, called), &f)
                        }
                        None => fmt.whole(&text, &f),
                    };
                    return Ok(Json(answer).into_response());
                }
                Some(Event::Error(e)) => return Err(e),
                None => return Err(ApiError::internal("the generation ended without an answer")),
            }
            ev = rx.recv().await;
        }
    }
}

/// Formats answers and chunks of one request.
struct Formatter {
    id: String,
    created: u64,
    model: String,
    chat: bool,
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

/// The id of a request's calls, from its id.
fn id_seed(id: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(id.as_bytes());
    h.finish()
}

/// OpenAI's finish reason: "tool_calls" when the answer ended after making calls.
fn finish_reason(f: &Finish, called: bool) -> &'static str {
    match f.reason {
        super::worker::FinishReason::Stop if called => "tool_calls",
        r => r.name(),
    }
}

impl Formatter {
    fn whole(&self, text: &str, f: &Finish) -> Value {
        if self.chat {
            let message = json!({"role": "assistant", "content": text});
            return self.whole_message(message, f.reason.name(), f);
        }
        let choice =
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": f.reason.name()});
        self.answer(choice, f)
    }

    /// A chat answer holding `message`.
    fn whole_message(&self, message: Value, finish: &str, f: &Finish) -> Value {
        let choice =
            json!({"index": 0, "message": message, "logprobs": null, "finish_reason": finish});
        self.answer(choice, f)
    }

    fn answer(&self, choice: Value, f: &Finish) -> Value {
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(f),
        })
    }

    /// One chunk; `delta` is the chat delta or the completion text.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let choice = if self.chat {
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": delta, "logprobs": null, "finish_reason": finish})
        };
        let v = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        format!("data: {v}\n\n")
    }

    fn text(&self, t: &str) -> String {
        if self.chat {
            self.chunk(json!({"content": t}), None)
        } else {
            self.chunk(json!(t), None)
        }
    }

    fn end(&self, f: &Finish, finish: &str, include_usage: bool) -> String {
        let delta = if self.chat { json!({}) } else { json!("") };
        let mut out = self.chunk(delta, Some(finish));
        if include_usage {
            let v = json!({
                "id": self.id,
                "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(f),
            });
            out.push_str(&format!("data: {v}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}

struct Stream {
    fmt: Formatter,
    include_usage: bool,
    first: Option<Event>,
    opening: bool,
    rx: mpsc::Receiver<Event>,
    done: bool,
    /// With tools: the reader that turns the text into content and `tool_calls` deltas.
    calls: Option<CallReader>,
    _guard: CancelOnDrop,
}

impl Stream {
    /// The chunks of `piece` of the text (`None`: its end).
    fn text(&mut self, piece: Option<&str>, out: &mut String) {
        match (&mut self.calls, piece) {
            (Some(c), p) => {
                for delta in c.deltas(p) {
                    out.push_str(&self.fmt.chunk(delta, None));
                }
            }
            (None, Some(t)) => out.push_str(&self.fmt.text(t)),
            (None, None) => {}
        }
    }
}

fn sse(
    fmt: Formatter,
    req: &GenRequest,
    first: Event,
    rx: mpsc::Receiver<Event>,
    guard: CancelOnDrop,
    calls: Option<CallReader>,
) -> Response {
    let state = Stream {
        fmt,
        include_usage: req.include_usage,
        first: Some(first),
        opening: true,
        rx,
        done: false,
        calls,
        _guard: guard,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = String::new();
        if s.opening && s.fmt.chat {
            out.push_str(
                &s.fmt
                    .chunk(json!({"role": "assistant", "content": ""}), None),
            );
        }
        s.opening = false;
        let ev = match s.first.take() {
            Some(ev) => Some(ev),
            None => s.rx.recv().await,
        };
        match ev {
            Some(Event::Text(t)) => s.text(Some(&t), &mut out),
            Some(Event::Done(f)) => {
                s.done = true;
                s.text(None, &mut out);
                let called = s.calls.as_ref().is_some_and(CallReader::called);
                out.push_str(&s.fmt.end(&f, finish_reason(&f, called), s.include_usage));
            }
            Some(Event::Error(e)) => {
                s.done = true;
                out.push_str(&format!("data: {}\n\ndata: [DONE]\n\n", e.body()));
            }
            None => {
                s.done = true;
                out.push_str("data: [DONE]\n\n");
            }
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), s))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn embeddings(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let r = embed(&st, &headers, body).await;
    counted(&st, "embeddings", r)
}

async fn embed(st: &Shared, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    authorize(st, headers)?;
    let body = read_body(headers, body).await?;
    let (texts, base64) = parse_embeddings(&body)?;
    let Some(pool) = &st.embed else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "model_not_embedding",
            "the model is a text-generation model, not an encoder: /v1/embeddings needs an embedding model such as all-MiniLM-L6-v2 (edge-run serve MODEL.gguf with that file)",
        ));
    };
    let (reply, answer) = oneshot::channel();
    if pool.submit(EmbedJob { texts, reply }).is_err() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_busy",
            "all embedding slots are busy and the queue is full: retry later",
        ));
    }
    let (vectors, n_tokens) = answer
        .await
        .map_err(|_| ApiError::internal("the embedding ended without an answer"))??;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                json!(base64_f32(v))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// Little-endian f32s in base64 (what OpenAI's `encoding_format: "base64"` returns).
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(ABC[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn model_object(st: &AppState) -> Value {
    json!({
        "id": st.model_id,
        "object": "model",
        "created": st.started,
        "owned_by": "edge-run",
        "meta": {"slots": st.slots, "n_ctx": st.ctx},
    })
}

async fn models(State(st): State<Shared>, headers: HeaderMap) -> Response {
    let r = authorize(&st, &headers)
        .map(|()| Json(json!({"object": "list", "data": [model_object(&st)]})).into_response());
    counted(&st, "models", r)
}

async fn model(State(st): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let r = authorize(&st, &headers).and_then(|()| {
        if id == st.model_id {
            Ok(Json(model_object(&st)).into_response())
        } else {
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("no model '{id}': this server serves '{}'", st.model_id),
            ))
        }
    });
    counted(&st, "models", r)
}

async fn health(State(st): State<Shared>) -> Response {
    let busy = st.metrics.slots_busy.load(Ordering::Relaxed);
    let resp = Json(json!({
        "status": "ok",
        "slots": st.slots,
        "slots_busy": busy,
        "queued": st.metrics.queued.load(Ordering::Relaxed),
    }))
    .into_response();
    counted(&st, "health", Ok(resp))
}

async fn metrics(State(st): State<Shared>, headers: HeaderMap) -> Response {
    let r = if !st.metrics_enabled {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "metrics_disabled",
            "metrics are off: start the server with --metrics",
        ))
    } else {
        authorize(&st, &headers).map(|()| {
            let mut resp = st.metrics.render().into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        })
    };
    counted(&st, "metrics", r)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route {}: the endpoints are POST /v1/chat/completions, /v1/completions, /v1/embeddings and GET /v1/models, /health, /metrics",
            uri.path()
        ),
    )
    .into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
    .into_response()
}
