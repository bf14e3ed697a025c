//! Failures: the status and the message of a failed call (kept per thread for
//! `edgerun_last_error_message`), and the guard every entry point runs its body under, which
//! turns errors and panics into a status.

use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use edge_engine::error::{EngineError, Setting};
use edge_engine::gguf::GgufError;

use crate::types::edgerun_status::{self, *};

thread_local! {
    /// The message of the last failed call on this thread.
    pub(crate) static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: the status and the message for `edgerun_last_error_message`.
pub(crate) struct Failure {
    pub(crate) status: edgerun_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: EDGERUN_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Failure {
        let status = match &e {
            // A file changed under its mapping is an I/O failure of the model file: the message
            // says to replace model files by renaming a new one over them.
            EngineError::Gguf(GgufError::Io { .. } | GgufError::Changed { .. })
            | EngineError::Io { .. } => EDGERUN_ERR_IO,
            EngineError::Gguf(_)
            | EngineError::UnsupportedArchitecture { .. }
            | EngineError::Metadata { .. }
            | EngineError::MissingTensor { .. }
            | EngineError::TensorShape { .. }
            | EngineError::UnsupportedTensorType { .. }
            | EngineError::NonFinite { .. } => EDGERUN_ERR_MODEL,
            EngineError::Tokenizer(_) => EDGERUN_ERR_TOKENIZER,
            EngineError::ContextFull { .. } | EngineError::ContextShift { .. } => {
                EDGERUN_ERR_CONTEXT_FULL
            }
            EngineError::Budget(_) | EngineError::OutOfMemory(_) => EDGERUN_ERR_OUT_OF_MEMORY,
            EngineError::InvalidArgument(_)
            | EngineError::InvalidSetting { .. }
            | EngineError::Unsupported(_) => EDGERUN_ERR_INVALID_ARGUMENT,
            // No C call sets an interrupt flag, so this cannot happen here.
            EngineError::Plan(_) | EngineError::Kernel(_) | EngineError::Interrupted { .. } => {
                EDGERUN_ERR_INTERNAL
            }
            EngineError::Device(_) => EDGERUN_ERR_DEVICE,
            EngineError::State { .. } => EDGERUN_ERR_STATE,
        };
        Failure {
            status,
            message: e.render(&c_field),
        }
    }
}

/// The field of this API's structs that holds each engine setting, for messages: a C caller
/// reads "use a larger n_ctx", not the library's `ctx` or the command line's `--ctx`.
fn c_field(setting: Setting) -> &'static str {
    match setting {
        Setting::Ctx => "n_ctx",
        Setting::Ubatch => "n_ubatch",
        Setting::Threads => "n_threads",
        Setting::MaxTokens => "max_tokens",
        other => other.name(),
    }
}

fn set_last_error(message: &str) {
    // A message with a NUL inside would be cut there by C; drop those bytes instead.
    let bytes: Vec<u8> = message.bytes().filter(|&b| b != 0).collect();
    let message = CString::new(bytes).unwrap_or_default();
    // `try_with`: during thread teardown the slot may be gone; the status still tells.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = message);
}

/// Runs one entry point's body: catches panics and turns failures into a status and a message.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), Failure>) -> edgerun_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => EDGERUN_OK,
        Ok(Err(f)) => {
            set_last_error(&format!("{name}: {}", f.message));
            f.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!(
                "{name}: internal error: {what} (a bug in edge-run; please report it)"
            ));
            EDGERUN_ERR_INTERNAL
        }
    }
}

/// Like `guard` for functions that return a value instead of a status: a panic gives
/// `fallback` (and sets the message).
pub(crate) fn guard_value<T>(name: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    let mut out = None;
    guard(name, || {
        out = Some(body());
        Ok(())
    });
    out.unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;
    use crate::edgerun_last_error_message;

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let status = guard("edgerun_test", || panic!("boom"));
        assert_eq!(status, EDGERUN_ERR_INTERNAL);
        // SAFETY: the library returns a valid NUL-terminated string.
        let message = unsafe { CStr::from_ptr(edgerun_last_error_message()) };
        let message = message.to_str().unwrap();
        assert!(
            message.starts_with("edgerun_test: internal error: boom"),
            "{message}"
        );
        assert_eq!(
            guard_value("edgerun_test", 7, || -> i32 { panic!("again") }),
            7
        );
    }

    #[test]
    fn messages_are_per_thread_and_never_cut_by_a_nul() {
        set_last_error("a\0b");
        std::thread::spawn(|| {
            // SAFETY: as above.
            let other = unsafe { CStr::from_ptr(edgerun_last_error_message()) };
            assert_eq!(other.to_bytes(), b"");
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        let message = unsafe { CStr::from_ptr(edgerun_last_error_message()) };
        assert_eq!(message.to_bytes(), b"ab");
    }
}
