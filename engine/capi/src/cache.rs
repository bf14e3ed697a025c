//! The prompt cache and saved state of a session: the tokens it holds, truncation, and saving
//! and loading its state to a file (`edgerun_generate_cached` is with the other generation
//! calls).

use std::ffi::c_char;

use crate::failure::{guard, Failure};
use crate::ptr::{session_lock, utf8};
use crate::types::edgerun_session;
use crate::types::edgerun_status::{self, *};

/// Copies the tokens the session's KV cache holds (position by position) into `tokens` (room
/// for `capacity` ids) and their count into `*out_n_tokens`. If `capacity` is too small,
/// returns `EDGERUN_ERR_BUFFER_TOO_SMALL` with the count needed (call with `capacity` 0 to
/// ask).
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call;
/// `tokens` is NULL or has room for `capacity` ids; `out_n_tokens` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_tokens(
    session: *mut edgerun_session,
    tokens: *mut u32,
    capacity: usize,
    out_n_tokens: *mut usize,
) -> edgerun_status {
    guard("edgerun_session_tokens", || {
        if out_n_tokens.is_null() {
            return Err(Failure::invalid("out_n_tokens is NULL"));
        }
        // SAFETY: the caller's promise.
        let s = unsafe { session_lock(session) }?;
        let held = s.session.tokens();
        // SAFETY: checked non-NULL and writable (the caller's promise).
        unsafe { out_n_tokens.write(held.len()) };
        if held.len() > capacity {
            return Err(Failure {
                status: EDGERUN_ERR_BUFFER_TOO_SMALL,
                message: format!(
                    "the session holds {} tokens, the buffer has room for {capacity}",
                    held.len()
                ),
            });
        }
        if !held.is_empty() {
            if tokens.is_null() {
                return Err(Failure::invalid("tokens is NULL"));
            }
            // SAFETY: `tokens` has room for `capacity` >= held.len() ids (the caller's
            // promise) and does not overlap the session's own buffer.
            unsafe { std::ptr::copy_nonoverlapping(held.as_ptr(), tokens, held.len()) };
        }
        Ok(())
    })
}

/// Keeps only the first `n` positions of the session's context (`n` at most
/// `edgerun_session_n_past`); the logits are no longer readable until the next prefill or step.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_truncate(
    session: *mut edgerun_session,
    n: u32,
) -> edgerun_status {
    guard("edgerun_session_truncate", || {
        // SAFETY: the caller's promise.
        unsafe { session_lock(session) }?
            .session
            .truncate(n as usize)?;
        Ok(())
    })
}

/// Saves the session's state (its tokens and their KV cache rows, with the model's identity
/// and the session's shape) to the file `path`, written to a temporary file and renamed over
/// it.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call; `path`
/// is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_save_state(
    session: *mut edgerun_session,
    path: *const c_char,
) -> edgerun_status {
    guard("edgerun_session_save_state", || {
        // SAFETY: the caller's promises.
        let (mut s, path) = unsafe { (session_lock(session)?, utf8(path, "path")?) };
        s.session.save_state(path)?;
        Ok(())
    })
}

/// Loads a state saved by `edgerun_session_save_state`: the session then holds the saved
/// tokens as if it had processed them, and its logits are those of the last one. A file from
/// another model or a session of another shape, or a truncated or damaged file, fails with
/// `EDGERUN_ERR_STATE` and leaves the session unchanged.
///
/// # Safety
/// `session` is NULL or a live session handle used by no other thread during the call; `path`
/// is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn edgerun_session_load_state(
    session: *mut edgerun_session,
    path: *const c_char,
) -> edgerun_status {
    guard("edgerun_session_load_state", || {
        // SAFETY: the caller's promises.
        let (mut s, path) = unsafe { (session_lock(session)?, utf8(path, "path")?) };
        s.session.load_state(path)?;
        Ok(())
    })
}
