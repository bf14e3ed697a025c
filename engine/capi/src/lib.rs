//! edge-run's C API: `libedgerun` (static and shared) and its header `include/edgerun.h`.
//!
//! The C side sees opaque handles — a model, loaded once and shared by any number of sessions
//! (on any threads), and sessions, each one conversation's KV cache and arena, used by one
//! thread at a time — and functions that return an `edgerun_status`. On failure
//! `edgerun_last_error_message` says what went wrong, on the calling thread.
//!
//! Rules every entry point keeps: no panic crosses the boundary (each call runs under
//! `catch_unwind`; a panic is a bug reported as `edgerun_status::EDGERUN_ERR_INTERNAL`), a
//! null pointer or a string that is not UTF-8 is an `edgerun_status::EDGERUN_ERR_INVALID_ARGUMENT`,
//! never undefined behaviour, and an output handle is set to NULL when the call fails.
//! What the C caller must keep is written in each function's `# Safety` section: pointers it
//! passes point to what they claim (or are NULL), and a handle is not used after it is freed.
//!
//! The header is generated from this file by cbindgen (config `cbindgen.toml`) and committed;
//! the test `header_is_up_to_date` fails when it is stale, and
//! `EDGERUN_BLESS=1 cargo test -p edge-run-capi --test c_api header` rewrites it.

// The exported names are C's: `edgerun_model`, `EDGERUN_OK`.
#![allow(non_camel_case_types)]
// Every unsafe operation sits in its own block with the invariant it relies on.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod cache;
mod failure;
mod ptr;
mod types;

use std::ffi::{c_char, c_void};
use std::ops::ControlFlow;
use std::sync::Arc;

use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::kv::KvType;
use edge_engine::model::Model;
use edge_engine::sampling::SamplerConfig;
use edge_engine::session::{Session, SessionConfig};

pub use cache::*;
use failure::{guard, guard_value, Failure, LAST_ERROR};
use ptr::{copy_out, model_ref, session_lock, token_slice, utf8, write_opt};
use types::edgerun_status::*;
pub use types::*;

// ---- library ----

/// The library's version, e.g. "0.1.0" (a static string).
#[no_mangle]
pub extern "C" fn edgerun_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the last call that failed on this thread (an empty string if none has).
/// The pointer stays valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn edgerun_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

// ---- model ----

/// Loads a GGUF model: maps the file and validates its metadata, tensors and tokenizer. On
/// success `*out_model` is the handle (free it with `edgerun_model_free`); on failure it is
/// set to NULL.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out_model` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_model_load(
    path: *const c_char,
    out_model: *mut *mut edgerun_model,
) -> edgerun_status {
    guard("edgerun_model_load", || {
        if out_model.is_null() {
            return Err(Failure::invalid("out_model is NULL"));
        }
        // SAFETY: checked non-NULL; writable (the caller's promise).
        unsafe { out_model.write(std::ptr::null_mut()) };
        // SAFETY: `path` is NULL or NUL-terminated (the caller's promise).
        let path = unsafe { utf8(path, "path") }?;
        let model = Model::load(path)?;
        let handle = Box::into_raw(Box::new(edgerun_model {
            model: Arc::new(model),
        }));
        // SAFETY: as above.
        unsafe { out_model.write(handle) };
        Ok(())
    })
}

/// Frees a model handle (NULL is ignored). Sessions opened on it stay valid: the model's
/// memory is released when the last of them is freed too.
///
/// # Safety
/// `model` is NULL or a handle from `edgerun_model_load` not freed before, and no other
/// thread uses it during or after the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_model_free(model: *mut edgerun_model) {
    guard("edgerun_model_free", || {
        if !model.is_null() {
            // SAFETY: a live box from `edgerun_model_load`, freed once (the caller's promise).
            drop(unsafe { Box::from_raw(model) });
        }
        Ok(())
    });
}

/// Vocabulary size of the model (valid token ids are 0 to n_vocab - 1); 0 if `model` is NULL.
///
/// # Safety
/// `model` is NULL or a live model handle.
#[no_mangle]
pub unsafe extern "C" fn edgerun_model_n_vocab(model: *const edgerun_model) -> u32 {
    // SAFETY: `model` is NULL or live (the caller's promise).
    guard_value("edgerun_model_n_vocab", 0, || {
        match unsafe { model_ref(model) } {
            Ok(m) => m.model.n_vocab() as u32,
            Err(_) => 0,
        }
    })
}

/// The context length the model was trained for; 0 if `model` is NULL.
///
/// # Safety
/// `model` is NULL or a live model handle.
#[no_mangle]
pub unsafe extern "C" fn edgerun_model_n_ctx_train(model: *const edgerun_model) -> u32 {
    // SAFETY: `model` is NULL or live (the caller's promise).
    guard_value("edgerun_model_n_ctx_train", 0, || {
        match unsafe { model_ref(model) } {
            Ok(m) => m.model.params.n_ctx_train as u32,
            Err(_) => 0,
        }
    })
}

/// Whether generation ends at `token` (EOS, end of turn, ...); false if `model` is NULL.
///
/// # Safety
/// `model` is NULL or a live model handle.
#[no_mangle]
pub unsafe extern "C" fn edgerun_token_is_eog(model: *const edgerun_model, token: u32) -> bool {
    // SAFETY: `model` is NULL or live (the caller's promise).
    guard_value("edgerun_token_is_eog", false, || {
        match unsafe { model_ref(model) } {
            Ok(m) => m.model.is_eog(token),
            Err(_) => false,
        }
    })
}

// ---- tokenizer ----

/// Tokenizes the NUL-terminated UTF-8 `text` into `tokens` (room for `capacity` ids) and
/// stores the count in `*out_n_tokens`. `add_special`: add BOS/EOS as the model's metadata
/// says (for the start of a conversation); `parse_special`: special-token text such as
/// `<|im_start|>` becomes its token. If `capacity` is too small, returns
/// `EDGERUN_ERR_BUFFER_TOO_SMALL` with the count needed in `*out_n_tokens` (call with
/// `capacity` 0 to ask).
///
/// # Safety
/// `model` is NULL or a live model handle; `text` is NULL or NUL-terminated; `tokens` is NULL
/// or has room for `capacity` ids; `out_n_tokens` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_tokenize(
    model: *const edgerun_model,
    text: *const c_char,
    add_special: bool,
    parse_special: bool,
    tokens: *mut u32,
    capacity: usize,
    out_n_tokens: *mut usize,
) -> edgerun_status {
    guard("edgerun_tokenize", || {
        // SAFETY: the caller's promises, as documented above.
        let (m, text) = unsafe { (model_ref(model)?, utf8(text, "text")?) };
        let ids = m.model.tokenize(text, add_special, parse_special)?;
        // SAFETY: NULL or writable.
        unsafe { write_opt(out_n_tokens, ids.len()) };
        if ids.len() > capacity {
            return Err(Failure {
                status: EDGERUN_ERR_BUFFER_TOO_SMALL,
                message: format!("the text has {} tokens, capacity is {capacity}", ids.len()),
            });
        }
        if ids.is_empty() {
            return Ok(());
        }
        if tokens.is_null() {
            return Err(Failure::invalid("tokens is NULL but capacity is not 0"));
        }
        // SAFETY: room for `capacity` >= ids.len() ids (the caller's promise, checked count);
        // the library's vector cannot overlap the caller's buffer.
        unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), tokens, ids.len()) };
        Ok(())
    })
}

/// Writes the text of `n_tokens` tokens, NUL-terminated, into `buf` (`capacity` bytes) and its
/// length without the NUL into `*out_len`. Invalid UTF-8 becomes U+FFFD; `special`: render
/// control tokens as their text (otherwise they are left out). If `capacity` is too small,
/// returns `EDGERUN_ERR_BUFFER_TOO_SMALL` with the length in `*out_len` (the buffer needs one
/// more byte).
///
/// # Safety
/// `model` is NULL or a live model handle; `tokens` is NULL or points to `n_tokens` ids; `buf`
/// is NULL or has room for `capacity` bytes; `out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_detokenize(
    model: *const edgerun_model,
    tokens: *const u32,
    n_tokens: usize,
    special: bool,
    buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> edgerun_status {
    guard("edgerun_detokenize", || {
        // SAFETY: the caller's promises, as documented above.
        let (m, ids) = unsafe { (model_ref(model)?, token_slice(tokens, n_tokens)?) };
        let n_vocab = m.model.n_vocab();
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Failure::invalid(format!(
                "token id {bad} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        let text = m.model.detokenize(ids, special);
        // SAFETY: the caller's promises about `buf`, `capacity` and `out_len`.
        unsafe { copy_out(text.as_bytes(), buf, capacity, out_len) }
    })
}

/// Writes the bytes of one token (possibly part of a UTF-8 character, as tokens split
/// characters), NUL-terminated, into `buf` and their count into `*out_len`, like
/// `edgerun_detokenize`. Control tokens give nothing unless `special`.
///
/// # Safety
/// As for `edgerun_detokenize`.
#[no_mangle]
pub unsafe extern "C" fn edgerun_token_to_piece(
    model: *const edgerun_model,
    token: u32,
    special: bool,
    buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> edgerun_status {
    guard("edgerun_token_to_piece", || {
        // SAFETY: `model` is NULL or live.
        let m = unsafe { model_ref(model) }?;
        let n_vocab = m.model.n_vocab();
        if token as usize >= n_vocab {
            return Err(Failure::invalid(format!(
                "token id {token} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        // SAFETY: the caller's promises about `buf`, `capacity` and `out_len`.
        unsafe { copy_out(m.model.token_piece(token, special), buf, capacity, out_len) }
    })
}

// ---- session ----

/// The default session parameters: every size 0 (its default), f16 KV cache.
#[no_mangle]
pub extern "C" fn edgerun_session_params_default() -> edgerun_session_params {
    edgerun_session_params {
        n_ctx: 0,
        n_ubatch: 0,
        n_threads: 0,
        kv_type: EDGERUN_KV_F16,
    }
}

/// Opens a session on `model` (`params` NULL: the defaults), allocating its KV cache, arena and
/// threads once. `n_ctx` may not exceed the model's trained context
/// (`edgerun_model_n_ctx_train`). On success `*out_session` is the handle (free it with
/// `edgerun_session_free`); on failure it is set to NULL. The session keeps the model alive.
///
/// # Safety
/// `model` is NULL or a live model handle; `params` is NULL or readable; `out_session` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_new(
    model: *const edgerun_model,
    params: *const edgerun_session_params,
    out_session: *mut *mut edgerun_session,
) -> edgerun_status {
    guard("edgerun_session_new", || {
        if out_session.is_null() {
            return Err(Failure::invalid("out_session is NULL"));
        }
        // SAFETY: checked non-NULL; writable (the caller's promise).
        unsafe { out_session.write(std::ptr::null_mut()) };
        // SAFETY: `model` is NULL or live; `params` is NULL or a readable, initialised struct
        // of plain integers (every bit pattern is valid).
        let (m, p) = unsafe { (model_ref(model)?, params.as_ref()) };
        let p = p
            .copied()
            .unwrap_or_else(|| edgerun_session_params_default());
        let size = |v: u32| (v != 0).then_some(v as usize);
        let kv_type = match p.kv_type {
            EDGERUN_KV_F16 => KvType::F16,
            EDGERUN_KV_Q8_0 => KvType::Q8_0,
            other => {
                return Err(Failure::invalid(format!(
                    "kv_type {other}: use EDGERUN_KV_F16 or EDGERUN_KV_Q8_0"
                )))
            }
        };
        let cfg = SessionConfig {
            ctx: size(p.n_ctx),
            ubatch: size(p.n_ubatch),
            threads: size(p.n_threads),
            kv_type,
            // The C API runs on the CPU for now; `--device` is the CLI's and Rust's.
            ..Default::default()
        };
        let session = Session::new(Arc::clone(&m.model), &cfg)?;
        let handle = Box::into_raw(Box::new(edgerun_session::new(session)));
        // SAFETY: as above.
        unsafe { out_session.write(handle) };
        Ok(())
    })
}

/// Frees a session (NULL is ignored): its memory, and its threads, which are joined before
/// this returns.
///
/// # Safety
/// `session` is NULL or a handle from `edgerun_session_new` not freed before, and no other
/// thread uses it during or after the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_free(session: *mut edgerun_session) {
    guard("edgerun_session_free", || {
        if !session.is_null() {
            // Refused while a call runs on it (a callback freeing its own session): freeing
            // then would pull the session from under that call.
            // SAFETY: a live handle (the caller's promise).
            drop(unsafe { session_lock(session) }?);
            // SAFETY: a live box from `edgerun_session_new`, freed once (the caller's promise),
            // and no call holds it (just checked; the caller uses it from this thread only).
            drop(unsafe { Box::from_raw(session) });
        }
        Ok(())
    });
}

/// Forgets the conversation: the next tokens start at position 0.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_reset(session: *mut edgerun_session) -> edgerun_status {
    guard("edgerun_session_reset", || {
        // SAFETY: the caller's promise.
        unsafe { session_lock(session) }?.session.reset();
        Ok(())
    })
}

/// Positions already in the session's KV cache; 0 if `session` is NULL.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_n_past(session: *mut edgerun_session) -> u32 {
    // SAFETY: the caller's promise.
    guard_value("edgerun_session_n_past", 0, || {
        match unsafe { session_lock(session) } {
            Ok(s) => s.session.n_past() as u32,
            Err(_) => 0,
        }
    })
}

/// The session's context size in tokens; 0 if `session` is NULL.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_n_ctx(session: *mut edgerun_session) -> u32 {
    // SAFETY: the caller's promise.
    guard_value("edgerun_session_n_ctx", 0, || {
        match unsafe { session_lock(session) } {
            Ok(s) => s.session.ctx() as u32,
            Err(_) => 0,
        }
    })
}

/// Appends `n_tokens` tokens to the context (in chunks of the ubatch); their logits are then
/// those of `edgerun_logits`. Fails with `EDGERUN_ERR_CONTEXT_FULL` if they do not fit, with
/// nothing processed.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call;
/// `tokens` is NULL or points to `n_tokens` ids.
#[no_mangle]
pub unsafe extern "C" fn edgerun_prefill(
    session: *mut edgerun_session,
    tokens: *const u32,
    n_tokens: usize,
) -> edgerun_status {
    guard("edgerun_prefill", || {
        // SAFETY: the caller's promises.
        let (mut s, ids) = unsafe { (session_lock(session)?, token_slice(tokens, n_tokens)?) };
        s.session.prefill(ids)?;
        Ok(())
    })
}

/// Appends one token; the logits for the next are then those of `edgerun_logits`.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_step(session: *mut edgerun_session, token: u32) -> edgerun_status {
    guard("edgerun_step", || {
        // SAFETY: the caller's promise.
        unsafe { session_lock(session) }?.session.step(token)?;
        Ok(())
    })
}

/// The logits of the last processed position (`*out_n` = the vocabulary size; 0 before any
/// prefill or step). The array belongs to the session and stays valid until the next call that
/// changes it (prefill, step, generate, reset, free).
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call;
/// `out_logits` and `out_n` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_logits(
    session: *mut edgerun_session,
    out_logits: *mut *const f32,
    out_n: *mut usize,
) -> edgerun_status {
    guard("edgerun_logits", || {
        if out_logits.is_null() || out_n.is_null() {
            return Err(Failure::invalid("out_logits or out_n is NULL"));
        }
        // SAFETY: the caller's promise.
        let s = unsafe { session_lock(session) }?;
        let logits = s.session.logits();
        // SAFETY: both checked non-NULL and writable (the caller's promise).
        unsafe {
            out_logits.write(logits.as_ptr());
            out_n.write(logits.len());
        }
        Ok(())
    })
}

// ---- generation ----

/// llama.cpp's sampler defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
/// repetition penalty 1 (off) over 64 tokens, seed 42.
#[no_mangle]
pub extern "C" fn edgerun_sampling_params_default() -> edgerun_sampling_params {
    let d = SamplerConfig::default();
    edgerun_sampling_params {
        temperature: d.temperature,
        top_k: d.top_k as u32,
        top_p: d.top_p,
        min_p: d.min_p,
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: d.repeat_last_n as u32,
        seed: d.seed,
    }
}

/// The default generation: at most 256 tokens, the default sampler, stop at end of generation,
/// no control-token text.
#[no_mangle]
pub extern "C" fn edgerun_generate_params_default() -> edgerun_generate_params {
    let d = GenerateOptions::default();
    edgerun_generate_params {
        max_tokens: d.max_tokens as u32,
        sampling: edgerun_sampling_params_default(),
        stop_at_eog: d.stop_at_eog,
        render_special: d.render_special,
    }
}

fn options_from(p: &edgerun_generate_params) -> GenerateOptions {
    let s = &p.sampling;
    GenerateOptions {
        max_tokens: p.max_tokens as usize,
        sampling: SamplerConfig {
            temperature: s.temperature,
            top_k: s.top_k as usize,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            repeat_last_n: s.repeat_last_n as usize,
            seed: s.seed,
        },
        stop_at_eog: p.stop_at_eog,
        render_special: p.render_special,
        constraint: None,
    }
}

/// Sets the constraint every later `edgerun_generate` on `session` applies: `kind` is
/// `EDGERUN_CONSTRAINT_GBNF` (a llama.cpp grammar), `EDGERUN_CONSTRAINT_JSON_SCHEMA` (JSON
/// text) or `EDGERUN_CONSTRAINT_REGEX`, and `source` its NUL-terminated UTF-8 text;
/// `EDGERUN_CONSTRAINT_NONE` (with `source` NULL or anything) removes it. The constraint is
/// compiled here: a grammar that does not parse or a schema keyword that is not supported fails
/// with `EDGERUN_ERR_INVALID_ARGUMENT` (the message names the problem) and leaves the session's
/// constraint as it was. Under a constraint the output follows it token by token and ends only
/// where it accepts.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call;
/// `source` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_set_constraint(
    session: *mut edgerun_session,
    kind: u32,
    source: *const c_char,
) -> edgerun_status {
    use edge_engine::constrain::Constraint;
    guard("edgerun_session_set_constraint", || {
        // SAFETY: the caller's promise about `session`.
        let mut s = unsafe { session_lock(session)? };
        let make: fn(String) -> Constraint = match kind {
            EDGERUN_CONSTRAINT_NONE => {
                s.constraint = None;
                return Ok(());
            }
            EDGERUN_CONSTRAINT_GBNF => Constraint::gbnf,
            EDGERUN_CONSTRAINT_JSON_SCHEMA => Constraint::json_schema,
            EDGERUN_CONSTRAINT_REGEX => Constraint::regex,
            k => {
                return Err(Failure::invalid(format!(
                    "constraint kind {k} is unknown: use EDGERUN_CONSTRAINT_NONE, _GBNF, _JSON_SCHEMA or _REGEX"
                )))
            }
        };
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let text = unsafe { utf8(source, "source")? };
        let c = make(text.to_string());
        s.session
            .model()
            .check_constraint(&c)
            .map_err(|e| Failure::invalid(e.to_string()))?;
        s.constraint = Some(c);
        Ok(())
    })
}

/// Prefills `prompt` (`n_prompt` tokens, appended to the context; 0 continues from the last
/// logits) and generates until `max_tokens`, an end-of-generation token, a full context, or
/// `callback` returning false, calling `callback(user_data, token, text, len)` for every token
/// (`callback` may be NULL). `params` NULL means `edgerun_generate_params_default`. What
/// happened is written to `*out_result` (may be NULL). A full context while generating is a
/// stop reason, not an error; a prompt that does not fit is `EDGERUN_ERR_CONTEXT_FULL`.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call;
/// `prompt` is NULL or points to `n_prompt` ids; `params` is NULL or a readable struct whose
/// bools are 0 or 1; `callback` is NULL or a function that behaves as
/// `edgerun_token_callback` says; `out_result` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_generate(
    session: *mut edgerun_session,
    prompt: *const u32,
    n_prompt: usize,
    params: *const edgerun_generate_params,
    callback: edgerun_token_callback,
    user_data: *mut c_void,
    out_result: *mut edgerun_generate_result,
) -> edgerun_status {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        generate_impl(
            "edgerun_generate",
            session,
            prompt,
            n_prompt,
            params,
            callback,
            user_data,
            out_result,
            false,
        )
    }
}

/// Like `edgerun_generate`, but `prompt` (`n_prompt` > 0 tokens) is the whole context wanted,
/// e.g. a conversation rendered from its start, not tokens to append: the longest prefix it
/// shares with the tokens the session holds (`edgerun_session_tokens`) is kept and only the
/// rest is processed (its last token always runs again, for its logits), so each turn of a
/// chat costs only its new tokens. The output is that of a fresh session given `prompt`.
///
/// # Safety
/// As for `edgerun_generate`.
#[no_mangle]
pub unsafe extern "C" fn edgerun_generate_cached(
    session: *mut edgerun_session,
    prompt: *const u32,
    n_prompt: usize,
    params: *const edgerun_generate_params,
    callback: edgerun_token_callback,
    user_data: *mut c_void,
    out_result: *mut edgerun_generate_result,
) -> edgerun_status {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        generate_impl(
            "edgerun_generate_cached",
            session,
            prompt,
            n_prompt,
            params,
            callback,
            user_data,
            out_result,
            true,
        )
    }
}

/// The body of `edgerun_generate` (`cached` false) and `edgerun_generate_cached`.
///
/// # Safety
/// As for `edgerun_generate`.
#[allow(clippy::too_many_arguments)]
unsafe fn generate_impl(
    name: &'static str,
    session: *mut edgerun_session,
    prompt: *const u32,
    n_prompt: usize,
    params: *const edgerun_generate_params,
    callback: edgerun_token_callback,
    user_data: *mut c_void,
    out_result: *mut edgerun_generate_result,
    cached: bool,
) -> edgerun_status {
    guard(name, || {
        // SAFETY: the caller's promises about `session`, `prompt` and `params` (a readable,
        // initialised struct whose bools are valid).
        let (s, prompt, p) = unsafe {
            (
                session_lock(session)?,
                token_slice(prompt, n_prompt)?,
                params.as_ref(),
            )
        };
        let mut options = options_from(
            &p.copied()
                .unwrap_or_else(|| edgerun_generate_params_default()),
        );
        let mut s = s;
        let SessionState {
            session,
            text,
            constraint,
        } = &mut *s;
        options.constraint = constraint.clone();
        let on_event = |event: edge_engine::generate::GenerateEvent<'_>| {
            let Some(cb) = callback else {
                return ControlFlow::Continue(());
            };
            // The text buffer was reserved when the session opened; it grows only for a
            // piece longer than that.
            text.clear();
            text.extend_from_slice(event.text.as_bytes());
            text.push(0);
            let token = event.token.unwrap_or(EDGERUN_TOKEN_NONE);
            // SAFETY: `cb` is a valid function (the caller's promise); `text` is a live,
            // NUL-terminated buffer of `len` + 1 bytes for the duration of the call.
            let go_on = unsafe { cb(user_data, token, text.as_ptr().cast(), event.text.len()) };
            if go_on {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        };
        let done = if cached {
            session.generate_cached(prompt, &options, on_event)
        } else {
            session.generate(prompt, &options, on_event)
        }?;
        let result = edgerun_generate_result {
            stop_reason: match done.stop_reason {
                StopReason::MaxTokens => edgerun_stop_reason::EDGERUN_STOP_MAX_TOKENS,
                StopReason::EndOfGeneration(_) => {
                    edgerun_stop_reason::EDGERUN_STOP_END_OF_GENERATION
                }
                StopReason::Stopped => edgerun_stop_reason::EDGERUN_STOP_STOPPED,
                StopReason::ContextFull => edgerun_stop_reason::EDGERUN_STOP_CONTEXT_FULL,
            },
            n_tokens: done.n_tokens as u32,
            pending_token: done.pending_token.unwrap_or(EDGERUN_TOKEN_NONE),
        };
        // SAFETY: NULL or writable (the caller's promise).
        unsafe { write_opt(out_result, result) };
        Ok(())
    })
}
