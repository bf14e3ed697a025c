//! Pointer helpers: each turns what a C caller passed into a Rust reference or slice, or a
//! [`Failure`], stating what the caller of the entry point guarantees.

use std::ffi::{c_char, CStr};

use crate::failure::Failure;
use crate::types::edgerun_status::EDGERUN_ERR_BUFFER_TOO_SMALL;
use std::sync::atomic::Ordering;

use crate::types::{edgerun_model, edgerun_session, SessionState};

/// The model behind `model`, or an error if it is NULL.
///
/// # Safety
/// `model` is NULL or a live handle from `edgerun_model_load`.
pub(crate) unsafe fn model_ref<'a>(
    model: *const edgerun_model,
) -> Result<&'a edgerun_model, Failure> {
    // SAFETY: non-NULL handles are live boxes from `edgerun_model_load` (the caller's promise);
    // a model is only read, so shared references from several threads are fine.
    unsafe { model.as_ref() }.ok_or_else(|| Failure::invalid("model is NULL"))
}

/// Exclusive use of a session for the length of one call: releases the session's `busy` flag
/// when dropped (also when the call panics).
pub(crate) struct SessionGuard<'a> {
    handle: &'a edgerun_session,
}

impl std::ops::Deref for SessionGuard<'_> {
    type Target = SessionState;
    fn deref(&self) -> &SessionState {
        // SAFETY: this guard set `busy`, so no other reference to the state exists.
        unsafe { &*self.handle.inner.get() }
    }
}

impl std::ops::DerefMut for SessionGuard<'_> {
    fn deref_mut(&mut self) -> &mut SessionState {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference from the guard.
        unsafe { &mut *self.handle.inner.get() }
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.handle.busy.store(false, Ordering::Release);
    }
}

/// The session behind `session` for one call, or an error if it is NULL or already in a call:
/// a generation callback that calls back into its own session (to reset it, step it, generate
/// or free it), or a second thread using it, gets an error instead of silently corrupting the
/// session's state.
///
/// # Safety
/// `session` is NULL or a live handle from `edgerun_session_new`.
pub(crate) unsafe fn session_lock<'a>(
    session: *mut edgerun_session,
) -> Result<SessionGuard<'a>, Failure> {
    // SAFETY: non-NULL handles are live boxes from `edgerun_session_new` (the caller's
    // promise). Only a shared reference is made; the state inside is reached through the
    // guard, which holds the `busy` flag.
    let handle = unsafe { session.cast_const().as_ref() }
        .ok_or_else(|| Failure::invalid("session is NULL"))?;
    if handle
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return Err(Failure::invalid(
            "the session is in use by another call: a generation callback must not call back \
             into its own session (return false to stop, then call), and a session is used \
             from one thread at a time",
        ));
    }
    Ok(SessionGuard { handle })
}

/// A NUL-terminated UTF-8 string.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn utf8<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated (the caller's promise).
    let bytes = unsafe { CStr::from_ptr(s) }.to_bytes();
    std::str::from_utf8(bytes).map_err(|e| {
        Failure::invalid(format!(
            "{what} is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

/// `n` tokens at `tokens` (which may be NULL when `n` is 0).
///
/// # Safety
/// `tokens` is NULL or points to `n` readable `u32`s that stay valid during the call.
pub(crate) unsafe fn token_slice<'a>(tokens: *const u32, n: usize) -> Result<&'a [u32], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if tokens.is_null() {
        return Err(Failure::invalid(format!(
            "tokens is NULL but n_tokens is {n}"
        )));
    }
    // SAFETY: non-NULL, `n` readable u32s (the caller's promise); u32 has no invalid values.
    Ok(unsafe { std::slice::from_raw_parts(tokens, n) })
}

/// Writes `value` to `out` if it is not NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and writable (the caller's promise); `write` drops nothing old.
        unsafe { out.write(value) };
    }
}

/// Copies `bytes` and a NUL into `buf` (`capacity` bytes) and stores the length (without the
/// NUL) in `out_len`; too small a buffer is an error that still reports the length needed.
///
/// # Safety
/// `buf` is NULL or valid for `capacity` bytes of writes; `out_len` is NULL or writable.
pub(crate) unsafe fn copy_out(
    bytes: &[u8],
    buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> Result<(), Failure> {
    // SAFETY: `out_len` is NULL or writable (the caller's promise).
    unsafe { write_opt(out_len, bytes.len()) };
    if capacity <= bytes.len() {
        return Err(Failure {
            status: EDGERUN_ERR_BUFFER_TOO_SMALL,
            message: format!(
                "the text needs {} bytes with its NUL, the buffer has {capacity}",
                bytes.len() + 1
            ),
        });
    }
    if buf.is_null() {
        return Err(Failure::invalid("buf is NULL but capacity is not 0"));
    }
    // SAFETY: `buf` has room for `capacity` > bytes.len() bytes (checked above; the caller
    // promised `capacity`), and cannot overlap `bytes`, which the library owns.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}
