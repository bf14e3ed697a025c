//! `--prompt-cache FILE` (as llama.cpp names it): a one-shot run starts from the session state
//! the file holds when it was saved with this model and these session settings (the prompt's
//! prefix it covers is not processed again) and saves its state there afterwards.

use std::path::Path;

use edge_engine::error::EngineError;
use edge_engine::session::Session;

use crate::errors::{hint, CliResult};

/// Loads the state in `path` into `session` if there is one that fits; a missing file is
/// the first run, a file that does not fit (another model, other settings, damaged) is
/// reported and ignored (it is overwritten after the run unless read-only). An unreadable
/// file is an error.
pub fn load(session: &mut Session, path: &Path, read_only: bool) -> CliResult {
    if !path.exists() {
        log::info!(
            "prompt cache {}: no file yet{}",
            path.display(),
            if read_only {
                ""
            } else {
                "; it is written after this run"
            }
        );
        return Ok(());
    }
    let t = std::time::Instant::now();
    match session.load_state(path) {
        Ok(()) => {
            log::info!(
                "prompt cache {}: {} tokens loaded in {:.0} ms",
                path.display(),
                session.n_past(),
                t.elapsed().as_secs_f64() * 1e3
            );
            Ok(())
        }
        Err(e @ EngineError::State { .. }) => {
            let then = if read_only {
                "not used (--prompt-cache-ro)"
            } else {
                "not used, and replaced after this run"
            };
            log::warn!("prompt cache: {}; {then}", hint(&e));
            Ok(())
        }
        Err(e) => Err(format!("--prompt-cache: {}", hint(&e)).into()),
    }
}

/// Saves the session's state to `path`.
pub fn save(session: &mut Session, path: &Path) -> CliResult {
    let t = std::time::Instant::now();
    session
        .save_state(path)
        .map_err(|e| format!("--prompt-cache: cannot save the state: {}", hint(&e)))?;
    log::info!(
        "prompt cache {}: {} tokens saved in {:.0} ms",
        path.display(),
        session.n_past(),
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
