//! From session flags to a planned session: the device, the configuration and the budget they
//! describe, and the one-line errors of a session that cannot be planned or opened.

use std::sync::Arc;

use edge_engine::backend::{self, cuda};
use edge_engine::device::Device;
use edge_engine::error::EngineError;
use edge_engine::model::Model;
use edge_engine::session::{Session, SessionConfig, SessionPlan};

use crate::args::{MemoryFlags, SessionFlags};
use crate::errors::{hint, CliError, CliResult};

/// The device a command runs on: the one asked for, or the default (CUDA when built in and
/// present, else the CPU). Asking for CUDA on a build without it is an error that names the fix.
pub fn resolve_device(asked: Option<Device>, model: &Model) -> CliResult<Device> {
    match asked {
        Some(Device::Cuda(_)) if !cuda::COMPILED => Err(CliError::from(cuda::NO_CUDA_SUPPORT)),
        Some(d) => Ok(d),
        None => Ok(backend::device_for(model)),
    }
}

impl SessionFlags {
    /// The session these flags describe for `model`.
    pub fn config(&self, model: &Model) -> CliResult<SessionConfig> {
        Ok(SessionConfig {
            ctx: self.ctx,
            ubatch: self.ubatch,
            threads: self.compute.threads,
            kv_type: self.memory.kv_type,
            flash_attn: self.memory.flash_attn,
            device: resolve_device(self.compute.device, model)?,
            cuda_weights: None,
        })
    }

    /// `--ctx N` above the trained context is a bad command line.
    pub fn check_ctx(&self, model: &Model) -> CliResult {
        let n_ctx_train = model.params.n_ctx_train;
        match self.ctx {
            Some(ctx) if ctx > n_ctx_train => Err(CliError::usage(format!(
                "--ctx {ctx} is more than the {n_ctx_train} tokens the model was trained for: use --ctx {n_ctx_train} or less"
            ))),
            _ => Ok(()),
        }
    }
}

impl MemoryFlags {
    /// The budget these flags describe, if any.
    pub fn budget(&self) -> Result<Option<edge_targets::Budget>, CliError> {
        let target = match self.target.as_deref() {
            None => None,
            Some("host") => Some(edge_targets::host().map_err(|e| match e {
                e @ edge_targets::TargetError::Unsupported(_) => format!(
                    "--target host: {e}; pass --target <profile> or --mem-budget SIZE instead"
                ),
                e => format!("--target host: {e}"),
            })?),
            Some(name) => Some(
                edge_targets::by_name(name)
                    .map_err(|e| CliError::usage(format!("--target: {e}")))?,
            ),
        };
        Ok(match (&target, self.mem_budget) {
            (Some(t), limit) => Some(edge_targets::Budget::for_target(
                t,
                limit,
                self.count_weights,
            )),
            (None, Some(limit)) => Some(edge_targets::Budget {
                limit_bytes: limit,
                count_weights: self.count_weights,
            }),
            (None, None) if self.count_weights => {
                return Err(CliError::usage(
                    "--count-weights needs a budget: add --mem-budget SIZE or --target NAME",
                ))
            }
            (None, None) => None,
        })
    }
}

/// Plans a session for `cfg`, within `budget` if there is one; `what` ("plan", "set up")
/// begins the error line of a session that cannot be planned.
pub fn plan_session(
    model: &Model,
    cfg: &SessionConfig,
    budget: Option<&edge_targets::Budget>,
    what: &str,
) -> CliResult<SessionPlan> {
    match budget {
        None => SessionPlan::new(model, cfg),
        Some(b) => SessionPlan::within_budget(model, cfg, b),
    }
    .map_err(|e| session_error(e, cfg.device, what))
}

/// Plans and opens a session (see [`plan_session`]).
pub fn open_session(
    model: &Arc<Model>,
    cfg: &SessionConfig,
    budget: Option<&edge_targets::Budget>,
) -> CliResult<Session> {
    let plan = plan_session(model, cfg, budget, "set up")?;
    Session::from_plan(Arc::clone(model), plan).map_err(|e| session_error(e, cfg.device, "set up"))
}

/// The one line for a session that cannot be planned or opened: a budget error as it is, a
/// device error with the way back to the CPU, anything else with the sizes to try.
fn session_error(e: EngineError, device: Device, what: &str) -> CliError {
    match e {
        EngineError::Budget(_) => CliError::from(hint(&e)),
        EngineError::Device(_) => CliError::from(format!(
            "cannot {what} the session on {}: {} (use --device cpu)",
            device.name(),
            hint(&e)
        )),
        e => CliError::from(format!(
            "cannot {what} the session: {} (try a smaller --ctx or --ubatch)",
            hint(&e)
        )),
    }
}
