//! Signals. Ctrl-C: the first one stops generation cleanly (between prompt chunks, or after the
//! current token), a second exits at once. SIGBUS from the model's mapping (its file was
//! truncated under it): one line naming the file and exit status 3, not a crash. The library
//! knows nothing of signals: generation is stopped through its API.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::errors::{CliError, CliResult, EXIT_MODEL_CHANGED};

/// Exit status after Ctrl-C stopped a generation (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Makes the first Ctrl-C (SIGINT) set the returned flag, which the generation loop checks after
/// each token (and the session between prompt chunks); a second Ctrl-C, once the flag is set,
/// exits at once with status 130.
pub fn interrupt_flag() -> CliResult<Arc<AtomicBool>> {
    use signal_hook::{consts::SIGINT, flag};
    let stop = Arc::new(AtomicBool::new(false));
    let err = |e: std::io::Error| CliError::from(format!("cannot install the Ctrl-C handler: {e}"));
    // Registered first so that it sees the flag as the first Ctrl-C left it.
    flag::register_conditional_shutdown(SIGINT, i32::from(EXIT_INTERRUPTED), Arc::clone(&stop))
        .map_err(err)?;
    flag::register(SIGINT, Arc::clone(&stop)).map_err(err)?;
    Ok(stop)
}

/// The mapped range of the model file: start address and length (0: none yet).
static MAPPED_START: AtomicUsize = AtomicUsize::new(0);
static MAPPED_LEN: AtomicUsize = AtomicUsize::new(0);
/// The line the handler writes, formatted before it is installed.
static CHANGED_LINE: OnceLock<Box<[u8]>> = OnceLock::new();
/// The SIGBUS action before ours, for faults outside the mapping.
#[cfg(unix)]
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A read of the model's mapping past the end of its (truncated) file raises SIGBUS, which
/// would kill the process with no message (exit 135). This handler turns a fault inside
/// `mapped` into the same line [`edge_engine::gguf::GgufError::Changed`] gives between runs,
/// and exit status 3; a fault anywhere else goes to the action installed before. Installed
/// once per process, for its one model.
pub fn exit_on_model_fault(path: &Path, mapped: Option<&[u8]>) {
    let Some(mapped) = mapped else { return };
    if CHANGED_LINE.get().is_some() {
        return;
    }
    let line = format!(
        "\nerror: {}\n",
        edge_engine::gguf::GgufError::Changed {
            path: path.to_path_buf()
        }
    );
    let _ = CHANGED_LINE.set(line.into_bytes().into_boxed_slice());
    MAPPED_START.store(mapped.as_ptr() as usize, Ordering::SeqCst);
    MAPPED_LEN.store(mapped.len(), Ordering::SeqCst);
    #[cfg(unix)]
    install_sigbus();
}

#[cfg(unix)]
fn install_sigbus() {
    // SAFETY: FFI. `action` is fully initialized (zeroed, then handler, flags and an empty
    // mask set) before sigaction reads it; `previous` is written by sigaction before it is
    // read. The handler only calls async-signal-safe functions (see `on_sigbus`).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0 {
            let _ = PREVIOUS.set(previous);
        } else {
            log::debug!("cannot install the SIGBUS handler");
        }
    }
}

/// Runs on the faulting thread. Only atomics, `OnceLock::get` (an atomic load of a value set
/// before installation), `write`, `sigaction` and `_exit` are used: all async-signal-safe.
#[cfg(unix)]
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    let start = MAPPED_START.load(Ordering::SeqCst);
    let len = MAPPED_LEN.load(Ordering::SeqCst);
    if addr >= start && addr - start < len {
        if let Some(line) = CHANGED_LINE.get() {
            // SAFETY: writes `line`, a live static buffer, to stderr; `_exit` ends the
            // process without running anything that is not async-signal-safe.
            unsafe {
                libc::write(2, line.as_ptr().cast(), line.len());
                libc::_exit(i32::from(EXIT_MODEL_CHANGED));
            }
        }
    }
    // Not ours: put the previous action back and return, so the fault repeats under it
    // (the default action ends the process as before).
    // SAFETY: restores a sigaction value the kernel wrote at installation (or the default).
    unsafe {
        match PREVIOUS.get() {
            Some(prev) => libc::sigaction(sig, prev, std::ptr::null_mut()),
            None => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut())
            }
        };
    }
}
