//! Ctrl-C: the first one stops generation cleanly after the current token, a second exits at
//! once. The library knows nothing of signals: generation is stopped through its API.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::errors::{CliError, CliResult};

/// Exit status after Ctrl-C stopped a generation (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Makes the first Ctrl-C (SIGINT) set the returned flag, which the generation loop checks after
/// each token; a second Ctrl-C, once the flag is set, exits at once with status 130.
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
