//! Pointer helpers: each turns what a C caller passed into a Rust reference or slice, or a
//! [`Failure`], stating what the caller of the entry point guarantees.

use std::ffi::{c_char, CStr};

use crate::failure::Failure;
use crate::types::edgerun_status::EDGERUN_ERR_BUFFER_TOO_SMALL;
use crate::types::{edgerun_model, edgerun_session};

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

/// The session behind `session`, or an error if it is NULL.
///
/// # Safety
/// `session` is NULL or a live handle from `edgerun_session_new`, not used by another
/// thread during the call.
pub(crate) unsafe fn session_mut<'a>(
    session: *mut edgerun_session,
) -> Result<&'a mut edgerun_session, Failure> {
    // SAFETY: non-NULL handles are live boxes from `edgerun_session_new`, and the caller uses a
    // session from one thread at a time, so this is the only reference during the call.
    unsafe { session.as_mut() }.ok_or_else(|| Failure::invalid("session is NULL"))
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
