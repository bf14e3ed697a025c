//! `edge-run serve`: the model over HTTP with an OpenAI-compatible API.
//!
//! Start-up plans every slot's session (KV cache, arena, scratch) and checks the slots together
//! against the budget, opens them, and only then opens the port; a configuration that cannot
//! fit is refused with the numbers. Requests are parsed and checked on a small tokio runtime
//! ([`routes`]); generation runs on one engine thread per slot ([`worker`]). Ctrl-C or SIGTERM
//! stops the running generations after their current token, answers them, and exits.

mod embedder;
mod error;
mod metrics;
mod prompt;
mod request;
mod routes;
mod slots;
mod tools;
mod worker;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;

use edge_engine::model::Model;
use edge_engine::session::plan::default_threads;
use edge_engine::session::{Session, SessionConfig};

use crate::args::ServeArgs;
use crate::errors::{hint, load_model, CliError, CliResult};
use crate::signals::EXIT_INTERRUPTED;

use metrics::{Metrics, PlannedMemory};
use routes::AppState;

/// What the slots are: sessions for a decoder, embedders for an encoder.
enum Slots {
    Generate(Vec<Session>),
    Embed(Vec<edge_engine::embed::Embedder>),
}

/// `edge-run serve`: returns the exit status (0 after SIGTERM, 130 after Ctrl-C).
pub fn serve(a: ServeArgs) -> CliResult<u8> {
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(CliError::usage(
            "--api-key is empty: give a key, or leave the flag out",
        ));
    }
    let addr = resolve(&a.host, a.port)?;
    let template_file = match &a.chat_template_file {
        None => None,
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| {
            CliError::usage(format!(
                "--chat-template-file: cannot read {}: {e}",
                f.display()
            ))
        })?),
    };
    let model = Arc::new(load_model(&a.model)?);
    let n = a.slots;
    // Slots that decode together (a decoder on the CPU) share one executor on every core;
    // otherwise the cores are shared among the slots, unless -t says otherwise.
    let together = slots::decode_together(&model, a.session.config(&model)?.device);
    let threads = a.session.compute.threads.unwrap_or_else(|| {
        if together {
            default_threads()
        } else {
            (default_threads() / n).max(1)
        }
    });
    let (slots, plan) = if model.layout.is_encoder() {
        plan_embedders(&a, &model, threads)?
    } else {
        plan_sessions(&a, &model, threads)?
    };
    eprintln!(
        "edge-run serve: {}: {}",
        a.model.display(),
        slots::plan_line(&plan, threads)
    );
    // The port opens last: a client that can connect finds every slot ready.
    let listener = TcpListener::bind(addr).map_err(|e| bind_error(addr, &e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;

    let metrics = Arc::new(Metrics::new(plan));
    let (sched, embed, threads) = match slots {
        Slots::Generate(sessions) => {
            let (s, t) = worker::Scheduler::start(
                sessions,
                a.queue,
                Arc::clone(&metrics),
                a.state_dir.clone(),
            )
            .map_err(|e| format!("cannot start the slot threads: {e}"))?;
            (Some(s), None, t)
        }
        Slots::Embed(embedders) => {
            let (p, t) = embedder::EmbedPool::start(embedders, a.queue)
                .map_err(|e| format!("cannot start the slot threads: {e}"))?;
            (None, Some(p), t)
        }
    };
    let state = Arc::new(AppState {
        model_id: model_id(&a.model),
        prompter: sched
            .is_some()
            .then(|| prompt::Prompter::new(Arc::clone(&model), template_file)),
        sched: sched.clone(),
        embed,
        ctx: plan.ctx,
        slots: n,
        queue: a.queue,
        api_key: a.api_key.clone(),
        metrics_enabled: a.metrics,
        metrics,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    let code = runtime.block_on(run(listener, local, state, sched.clone()))?;
    drop(runtime);
    if let Some(s) = &sched {
        s.shut_down();
    }
    // The workers end when the last handle on the scheduler goes.
    drop(sched);
    for t in threads {
        let _ = t.join();
    }
    eprintln!("edge-run serve: stopped");
    Ok(code)
}

async fn run(
    listener: TcpListener,
    local: SocketAddr,
    state: Arc<AppState>,
    sched: Option<Arc<worker::Scheduler>>,
) -> CliResult<u8> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| format!("cannot listen on {local}: {e}"))?;
    let (code_tx, code_rx) = tokio::sync::oneshot::channel::<u8>();
    let shutdown = async move {
        let code = wait_for_signal().await;
        eprintln!("edge-run serve: shutting down (stopping the running generations)");
        if let Some(s) = &sched {
            s.shut_down();
        }
        let _ = code_tx.send(code);
        // A second signal, or connections that do not finish, end the process.
        tokio::spawn(async move {
            tokio::select! {
                _ = wait_for_signal() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {
                    eprintln!("edge-run serve: connections still open after 10 s; exiting");
                }
            }
            std::process::exit(i32::from(code));
        });
    };
    eprintln!("edge-run serve: listening on http://{local}");
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| format!("the HTTP server failed: {e}"))?;
    Ok(code_rx.await.unwrap_or(0))
}

/// Waits for Ctrl-C (exit status 130) or SIGTERM (0).
async fn wait_for_signal() -> u8 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => EXIT_INTERRUPTED,
                _ = term.recv() => 0,
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                EXIT_INTERRUPTED
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        EXIT_INTERRUPTED
    }
}

fn resolve(host: &str, port: u16) -> CliResult<SocketAddr> {
    let bad = |why: String| {
        CliError::usage(format!(
            "--host {host}: {why}: give an address such as 127.0.0.1, 0.0.0.0 or ::1"
        ))
    };
    (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("no address".into()))
}

fn bind_error(addr: SocketAddr, e: &std::io::Error) -> CliError {
    use std::io::ErrorKind;
    let why = match e.kind() {
        ErrorKind::AddrInUse => format!(
            "the port {} is in use (another process is listening on it): stop it, or pick another with --port",
            addr.port()
        ),
        ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need privileges): pick another with --port"
                .to_string()
        }
        ErrorKind::AddrNotAvailable => "the address is not one of this machine's: check --host".to_string(),
        _ => e.to_string(),
    };
    CliError::from(format!("cannot listen on {addr}: {why}"))
}

/// The model's name in answers: the file name without `.gguf`.
fn model_id(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf")
        .map(str::to_string)
        .unwrap_or(name)
}

/// Plans and opens `--slots` sessions.
fn plan_sessions(
    a: &ServeArgs,
    model: &Arc<Model>,
    threads: usize,
) -> CliResult<(Slots, PlannedMemory)> {
    a.session.check_ctx(model)?;
    let cfg = SessionConfig {
        threads: Some(threads),
        ..a.session.config(model)?
    };
    let budget = a.session.memory.budget()?;
    let sharing = slots::Sharing::new(model, cfg.device, a.slots)?;
    let plan = slots::plan_slots(model, &cfg, budget.as_ref(), &sharing)?;
    let planned = slots::planned_memory(&plan, &sharing, budget.as_ref());
    let mut sessions = if let Some(sizing) = sharing.group {
        open_together(model, plan, sizing)?
    } else {
        // Every slot gets the same plan (planning is deterministic; a plan is consumed by
        // opening).
        let cfg = SessionConfig {
            ctx: Some(plan.ctx),
            ubatch: Some(plan.ubatch),
            ..cfg
        };
        let mut sessions = Vec::with_capacity(a.slots);
        sessions.push(open(model, plan, cfg.device)?);
        for _ in 1..a.slots {
            let plan = crate::session::plan_session(model, &cfg, None, "set up")?;
            sessions.push(open(model, plan, cfg.device)?);
        }
        sessions
    };
    if let Some(dir) = &a.state_dir {
        restore(dir, &mut sessions)?;
    }
    Ok((Slots::Generate(sessions), planned))
}

/// `--state-dir`: restores each slot's saved state. A file that cannot be used (another model,
/// another --ctx, damaged) is reported and its slot starts empty: a cache is never a reason not
/// to serve.
fn restore(dir: &Path, sessions: &mut [Session]) -> CliResult {
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "--state-dir {}: cannot create the directory: {e}",
            dir.display()
        )
    })?;
    for (slot, session) in sessions.iter_mut().enumerate() {
        let path = worker::state_path(dir, slot);
        if !path.exists() {
            continue;
        }
        match session.load_state(&path) {
            Ok(()) => eprintln!(
                "edge-run serve: slot {slot}: restored {} tokens from {}",
                session.tokens().len(),
                path.display()
            ),
            Err(e) => {
                session.reset();
                eprintln!(
                    "edge-run serve: warning: slot {slot}: {}; the slot starts empty (the file is replaced at shutdown)",
                    hint(&e)
                );
            }
        }
    }
    Ok(())
}

/// The slots as one group of sessions that decode together (CPU).
fn open_together(
    model: &Arc<Model>,
    plan: edge_engine::session::SessionPlan,
    sizing: edge_engine::session::group::GroupSizing,
) -> CliResult<Vec<Session>> {
    use edge_engine::session::group::{open_group, GroupPlan};
    GroupPlan::from_sizing(plan, sizing)
        .and_then(|plan| open_group(Arc::clone(model), plan))
        .map_err(|e| CliError::from(format!("cannot set up the slots: {}", hint(&e))))
}

fn open(
    model: &Arc<Model>,
    plan: edge_engine::session::SessionPlan,
    device: edge_engine::device::Device,
) -> CliResult<Session> {
    Session::from_plan(Arc::clone(model), plan).map_err(|e| {
        CliError::from(format!(
            "cannot set up a slot's session on {}: {}",
            device.name(),
            hint(&e)
        ))
    })
}

/// Plans and opens `--slots` embedders for an encoder model.
fn plan_embedders(
    a: &ServeArgs,
    model: &Arc<Model>,
    threads: usize,
) -> CliResult<(Slots, PlannedMemory)> {
    let cfg = crate::embed::embed_config(
        model,
        "--ctx",
        a.session.ctx,
        Some(threads),
        a.session.compute.device,
        &a.session.memory,
    )?;
    let budget = a.session.memory.budget()?;
    let plan = crate::embed::embed_plan(model, &cfg, budget.as_ref())?;
    let d = plan.demand();
    let planned = PlannedMemory {
        slots: a.slots,
        ctx: plan.max_tokens,
        weights: d.weights,
        kv: d.kv,
        together: false,
        arena: d.arena,
        scratch: d.scratch,
        budget: budget.map(|b| b.limit_bytes),
    };
    if let Some(b) = &budget {
        let total = edge_targets::Demand {
            weights: d.weights,
            kv: d.kv * a.slots as u64,
            arena: d.arena * a.slots as u64,
            scratch: d.scratch * a.slots as u64,
        };
        if !b.fits(&total) {
            return Err(format!(
                "memory budget exceeded: {} embedding slots need {} owned, budget {}: use fewer --slots",
                a.slots,
                edge_targets::format_size(planned.owned_total()),
                edge_targets::format_size(b.limit_bytes)
            )
            .into());
        }
    }
    let mut embedders = Vec::with_capacity(a.slots);
    let mut next = Some(plan);
    for _ in 0..a.slots {
        let plan = match next.take() {
            Some(p) => p,
            None => crate::embed::embed_plan(model, &cfg, None)?,
        };
        embedders.push(
            edge_engine::embed::Embedder::from_plan(Arc::clone(model), plan)
                .map_err(|e| format!("cannot set up the embedder: {}", hint(&e)))?,
        );
    }
    Ok((Slots::Embed(embedders), planned))
}
