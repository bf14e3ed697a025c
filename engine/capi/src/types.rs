//! The types C sees: the status and stop-reason enums, the opaque handles, the parameter and
//! result structs, the callback and the constants (all in the header).

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::session::Session;

/// What a call returns: `EDGERUN_OK` or the kind of failure; the message is in
/// `edgerun_last_error_message`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum edgerun_status {
    /// Success.
    EDGERUN_OK = 0,
    /// A bad argument: a NULL pointer, a string that is not UTF-8, a value out of range, a token
    /// id outside the vocabulary, bad sampler settings.
    EDGERUN_ERR_INVALID_ARGUMENT = 1,
    /// The model file could not be opened or read.
    EDGERUN_ERR_IO = 2,
    /// The model file is malformed, or its architecture or tensor types are not supported.
    EDGERUN_ERR_MODEL = 3,
    /// The tokenizer failed (bad tokenizer metadata, or text it cannot tokenize).
    EDGERUN_ERR_TOKENIZER = 4,
    /// The tokens do not fit in the session's context.
    EDGERUN_ERR_CONTEXT_FULL = 5,
    /// The session's memory could not be allocated (or exceeds a budget).
    EDGERUN_ERR_OUT_OF_MEMORY = 6,
    /// An output buffer is too small; the size needed was written to the length output.
    EDGERUN_ERR_BUFFER_TOO_SMALL = 7,
    /// A bug in edge-run (a caught panic, an internal check): please report the message.
    EDGERUN_ERR_INTERNAL = 8,
    /// The compute device failed or is missing (e.g. CUDA asked for on a build or machine
    /// without it).
    EDGERUN_ERR_DEVICE = 9,
    /// A saved session state cannot be loaded: it is from another model or a session of
    /// another shape (context, KV type), or the file is truncated or damaged. The session is
    /// unchanged.
    EDGERUN_ERR_STATE = 10,
}

/// Why `edgerun_generate` stopped.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum edgerun_stop_reason {
    /// `max_tokens` tokens were generated.
    EDGERUN_STOP_MAX_TOKENS = 0,
    /// The model produced an end-of-generation token (EOS, end of turn); it was not emitted.
    EDGERUN_STOP_END_OF_GENERATION = 1,
    /// The callback returned false.
    EDGERUN_STOP_STOPPED = 2,
    /// The context is full.
    EDGERUN_STOP_CONTEXT_FULL = 3,
}

/// "No token": the token of the callback's final flush, and a result's `pending_token` when
/// there is none.
pub const EDGERUN_TOKEN_NONE: u32 = u32::MAX;
/// KV cache of f16 values (llama.cpp's default; outputs identical to llama.cpp's).
pub const EDGERUN_KV_F16: u32 = 0;
/// KV cache of q8_0 blocks (47% smaller, slightly different outputs).
pub const EDGERUN_KV_Q8_0: u32 = 1;

/// `edgerun_session_set_constraint`: no constraint (clears one).
pub const EDGERUN_CONSTRAINT_NONE: u32 = 0;
/// `edgerun_session_set_constraint`: a llama.cpp GBNF grammar.
pub const EDGERUN_CONSTRAINT_GBNF: u32 = 1;
/// `edgerun_session_set_constraint`: a JSON Schema (JSON text).
pub const EDGERUN_CONSTRAINT_JSON_SCHEMA: u32 = 2;
/// `edgerun_session_set_constraint`: a regular expression the whole output matches.
pub const EDGERUN_CONSTRAINT_REGEX: u32 = 3;

/// A loaded model (opaque). Thread-safe: any number of sessions on any threads may share it.
pub struct edgerun_model {
    pub(crate) model: Arc<Model>,
}

/// A session (opaque): one conversation's KV cache, arena and threads. Use it from one thread
/// at a time. A call on it while another is running (from a generation callback, or from
/// another thread) fails instead of corrupting it: see `session_lock` in `engine/capi/src/ptr.rs`.
pub struct edgerun_session {
    /// Set while a call holds the session.
    pub(crate) busy: AtomicBool,
    /// Reached only through [`crate::ptr::SessionGuard`], which holds `busy`.
    pub(crate) inner: UnsafeCell<SessionState>,
}

/// What a session handle holds.
pub(crate) struct SessionState {
    pub(crate) session: Session,
    /// The text handed to the callback, NUL-terminated; reused so a token allocates nothing.
    pub(crate) text: Vec<u8>,
    /// The constraint `edgerun_generate` applies (`edgerun_session_set_constraint`).
    pub(crate) constraint: Option<edge_engine::constrain::Constraint>,
}

impl edgerun_session {
    pub(crate) fn new(session: Session) -> edgerun_session {
        edgerun_session {
            busy: AtomicBool::new(false),
            inner: UnsafeCell::new(SessionState {
                session,
                text: Vec::with_capacity(1024),
                constraint: None,
            }),
        }
    }
}

/// How to size a session; 0 in a field means its default. Get the defaults from
/// `edgerun_session_params_default`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct edgerun_session_params {
    /// Context size in tokens (KV cache positions); 0: min(4096, the model's trained context).
    pub n_ctx: u32,
    /// Prompt tokens per forward pass; 0: min(512, n_ctx).
    pub n_ubatch: u32,
    /// Threads; 0: the available cores.
    pub n_threads: u32,
    /// `EDGERUN_KV_F16` or `EDGERUN_KV_Q8_0`.
    pub kv_type: u32,
}

/// Sampler settings. `edgerun_sampling_params_default` gives llama.cpp's defaults; a
/// temperature of 0 is greedy decoding. The same settings and seed give the same tokens.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct edgerun_sampling_params {
    /// Softmax temperature; 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: u32,
    /// Nucleus sampling threshold in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely, in [0, 1]; 0 = off.
    pub min_p: f32,
    /// Repetition penalty (> 0); 1 = off.
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back at; 0 = off.
    pub repeat_last_n: u32,
    /// Random seed.
    pub seed: u64,
}

/// What `edgerun_generate` does; get the defaults from `edgerun_generate_params_default`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct edgerun_generate_params {
    /// Most tokens to generate; 0 only processes the prompt.
    pub max_tokens: u32,
    /// Sampler settings.
    pub sampling: edgerun_sampling_params,
    /// Stop at an end-of-generation token (default true).
    pub stop_at_eog: bool,
    /// Stream the text of control tokens such as `<|im_start|>` (default false).
    pub render_special: bool,
}

/// What `edgerun_generate` did.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct edgerun_generate_result {
    /// Why it stopped.
    pub stop_reason: edgerun_stop_reason,
    /// Tokens generated (passed to the callback).
    pub n_tokens: u32,
    /// The last token sampled but not yet in the KV cache (the last generated token, or the
    /// end-of-generation token): prefill it before the next input to continue the
    /// conversation. `EDGERUN_TOKEN_NONE` if none.
    pub pending_token: u32,
}

/// Called by `edgerun_generate` for every generated token with the text it completes
/// (`len` bytes of UTF-8, NUL-terminated, possibly empty; valid only during the call). Return
/// true to continue, false to stop. If generation ends with bytes of an incomplete character
/// held back, a last call passes `token` = `EDGERUN_TOKEN_NONE` and their lossy text; its
/// return value is ignored. The callback must not unwind (throw a C++ exception or longjmp)
/// out of itself. A call on the session it was called for (reset, step, generate, free, ...)
/// fails with `EDGERUN_ERR_INVALID_ARGUMENT` and changes nothing: return false to stop, then
/// make the call.
pub type edgerun_token_callback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        token: u32,
        text: *const c_char,
        len: usize,
    ) -> bool,
>;
