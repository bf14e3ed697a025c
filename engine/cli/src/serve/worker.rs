//! The slots: one engine thread per slot, each owning a [`Session`] planned at start-up (on
//! the CPU the sessions are one group that runs their decode steps together:
//! [`edge_engine::session::group`]), and the scheduler that hands requests to them. A request goes at once to the idle slot whose
//! cached tokens share the longest prefix with its prompt (the prompt cache: that prefix's KV
//! rows are reused, only the rest is processed), or waits in a bounded queue; beyond it the
//! caller answers 503. Generation runs here, never on the
//! async runtime: tokens go back over a channel, and a client that goes away (its receiver
//! dropped, or its cancel flag raised) stops its generation after the current token, freeing
//! the slot.
//!
//! Per token, a worker allocates the `String` of the text it sends (one small heap block); the
//! session's decode step itself allocates nothing.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use edge_engine::error::EngineError;
use edge_engine::generate::{GenerateOptions, StopReason};
use edge_engine::session::Session;
use tokio::sync::mpsc as async_mpsc;

use super::error::ApiError;
use super::metrics::Metrics;

/// What a worker sends back about a job.
#[derive(Debug)]
pub enum Event {
    /// Text generated (never empty).
    Text(String),
    /// The end: why, and the token counts.
    Done(Finish),
    /// The generation failed before or while running.
    Error(ApiError),
}

/// Why a generation ended, OpenAI's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop string, or the client or server stopped it.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
}

impl FinishReason {
    /// OpenAI's name.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a job.
#[derive(Debug, Clone, Copy)]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Of those, the tokens whose KV rows came from the slot's cache.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// A request for a slot.
pub struct Job {
    /// The prompt's tokens (they fit the slot's context).
    pub tokens: Vec<u32>,
    /// How to generate.
    pub options: GenerateOptions,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Where the events go.
    pub events: async_mpsc::Sender<Event>,
    /// Raised when the client has gone away (or the server shuts down).
    pub cancel: Arc<AtomicBool>,
    /// When the request arrived (for the time to first token).
    pub arrived: Instant,
}

/// The request was not taken: every slot is busy and the queue is full.
#[derive(Debug)]
pub struct Busy;

struct State {
    idle: Vec<bool>,
    /// The tokens each slot's KV cache holds (reusable ones), for choosing a slot.
    cached: Vec<Vec<u32>>,
    pending: VecDeque<Job>,
    /// The cancel flag of each slot's running job (raised all at once on shutdown).
    running: Vec<Option<Arc<AtomicBool>>>,
    shutting_down: bool,
}

/// Hands jobs to the slots' workers.
pub struct Scheduler {
    state: Mutex<State>,
    inboxes: Vec<mpsc::Sender<Job>>,
    queue_cap: usize,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// Starts one worker thread per session; returns the scheduler and the threads.
    /// With `state_dir`, each worker saves its session's state there when the server stops
    /// ([`state_path`]).
    pub fn start(
        sessions: Vec<Session>,
        queue_cap: usize,
        metrics: Arc<Metrics>,
        state_dir: Option<PathBuf>,
    ) -> std::io::Result<(Arc<Scheduler>, Vec<std::thread::JoinHandle<()>>)> {
        let n = sessions.len();
        // Restored sessions already hold tokens: the first requests may reuse them.
        let cached = sessions
            .iter()
            .map(|s| s.tokens()[..s.n_reusable()].to_vec())
            .collect();
        let mut inboxes = Vec::with_capacity(n);
        let mut receivers = Vec::with_capacity(n);
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<Job>();
            inboxes.push(tx);
            receivers.push(rx);
        }
        let sched = Arc::new(Scheduler {
            state: Mutex::new(State {
                idle: vec![true; n],
                cached,
                pending: VecDeque::with_capacity(queue_cap),
                running: vec![None; n],
                shutting_down: false,
            }),
            inboxes,
            queue_cap,
            metrics,
        });
        let mut threads = Vec::with_capacity(n);
        for (slot, (session, rx)) in sessions.into_iter().zip(receivers).enumerate() {
            let sched = Arc::clone(&sched);
            let save_to = state_dir.as_deref().map(|d| state_path(d, slot));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("slot-{slot}"))
                    .spawn(move || sched.work(slot, session, rx, save_to))?,
            );
        }
        Ok((sched, threads))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A worker that panicked while holding the lock left the state consistent (each
        // update is a single assignment); go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `job` to an idle slot, or queues it; [`Busy`] when the queue is full too (or
    /// the server is shutting down).
    pub fn submit(&self, job: Job) -> Result<(), Busy> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(Busy);
        }
        // The idle slot sharing the longest prefix with the prompt; on a tie the one holding
        // the fewest tokens, so that another prompt's cache survives where it can.
        let best = (0..st.idle.len()).filter(|&s| st.idle[s]).max_by_key(|&s| {
            (
                common_prefix(&st.cached[s], &job.tokens),
                std::cmp::Reverse(st.cached[s].len()),
                std::cmp::Reverse(s),
            )
        });
        if let Some(slot) = best {
            st.idle[slot] = false;
            st.running[slot] = Some(Arc::clone(&job.cancel));
            self.metrics.slots_busy.fetch_add(1, Ordering::Relaxed);
            drop(st);
            // The worker lives as long as the scheduler: its inbox is open.
            let _ = self.inboxes[slot].send(job);
            return Ok(());
        }
        if st.pending.len() >= self.queue_cap {
            return Err(Busy);
        }
        st.pending.push_back(job);
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The next job for `slot` after it finished one: the oldest waiting, or none (the slot is
    /// then idle).
    fn next_for(&self, slot: usize, cached: &[u32]) -> Option<Job> {
        let mut st = self.lock();
        st.cached[slot].clear();
        st.cached[slot].extend_from_slice(cached);
        match st.pending.pop_front() {
            Some(job) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                st.running[slot] = Some(Arc::clone(&job.cancel));
                Some(job)
            }
            None => {
                st.idle[slot] = true;
                st.running[slot] = None;
                self.metrics.slots_busy.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Refuses new jobs, stops the running ones after their current token and drops the
    /// waiting ones (their clients get an error event).
    pub fn shut_down(&self) {
        let mut st = self.lock();
        st.shutting_down = true;
        for flag in st.running.iter().flatten() {
            flag.store(true, Ordering::Relaxed);
        }
        for job in st.pending.drain(..) {
            let _ = job.events.try_send(Event::Error(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down",
            )));
        }
        self.metrics.queued.store(0, Ordering::Relaxed);
    }

    /// A worker: runs the jobs sent to `slot`, then those waiting, until the scheduler is gone.
    fn work(
        self: Arc<Self>,
        slot: usize,
        mut session: Session,
        inbox: mpsc::Receiver<Job>,
        save_to: Option<PathBuf>,
    ) {
        // Only a weak hold on the inbox side: the scheduler owns the senders, and the thread
        // ends when the server drops the scheduler (recv fails).
        let weak = Arc::downgrade(&self);
        drop(self);
        while let Ok(job) = inbox.recv() {
            let Some(sched) = weak.upgrade() else { break };
            let mut next = Some(job);
            while let Some(job) = next {
                let events = job.events.clone();
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_job(&mut session, job, &sched.metrics)
                }));
                let last = run.unwrap_or_else(|_| {
                    // The panic hook printed the bug; the client gets an answer and the slot
                    // starts over from an empty context.
                    session.reset();
                    Some(Event::Error(ApiError::internal(
                        "internal error while generating (a bug in edge-run; see the server log)",
                    )))
                });
                let n = session.n_reusable();
                next = sched.next_for(slot, &session.tokens()[..n]);
                // The last event goes out once the slot is free again, so that a client's next
                // request, sent as soon as this one is answered, finds it free.
                if let Some(ev) = last {
                    let _ = events.blocking_send(ev);
                }
            }
        }
        if let Some(path) = save_to {
            save_slot(&mut session, slot, &path);
        }
    }
}

/// Where `--state-dir` keeps slot `slot`'s state.
pub fn state_path(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("slot-{slot}.state"))
}

fn save_slot(session: &mut Session, slot: usize, path: &Path) {
    if session.tokens().is_empty() {
        // Nothing cached: an older file would restore a prompt this slot no longer holds.
        let _ = std::fs::remove_file(path);
        return;
    }
    match session.save_state(path) {
        Ok(()) => eprintln!(
            "edge-run serve: slot {slot}: saved {} tokens to {}",
            session.tokens().len(),
            path.display()
        ),
        Err(e) => eprintln!(
            "edge-run serve: warning: slot {slot}: cannot save its state: {}",
            crate::errors::hint(&e)
        ),
    }
}

/// Holds back output that may be the start of a stop string, and finds the first stop string.
struct StopMatcher<'a> {
    stops: &'a [String],
    held: String,
}

impl<'a> StopMatcher<'a> {
    fn new(stops: &'a [String]) -> Self {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    /// Adds `text`; returns what may be sent now and whether a stop string was reached (the
    /// text before it is returned, the rest dropped).
    fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, true);
        }
        // The longest end of the held text that begins some stop string stays held.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && self.held.ends_with(&s[..k]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// What is still held back, at the end.
    fn rest(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// How many first tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Runs one job on `session`, reusing the prefix of the prompt its KV cache already holds;
/// returns the last event to send (the end, or an error), if the client is still there.
fn run_job(session: &mut Session, job: Job, metrics: &Metrics) -> Option<Event> {
    if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
        return None;
    }
    session.set_interrupt(Arc::clone(&job.cancel));
    let send = |e: Event| job.events.blocking_send(e).is_ok();
    let prompt_tokens = job.tokens.len();
    // The tokens the cache gives (what reuse_prefix keeps).
    let reusable = session.reusable_prefix(&job.tokens);
    let mut gen = match session.generator_cached(&job.tokens, &job.options) {
        Ok(gen) => gen,
        Err(EngineError::Interrupted { .. }) => {
            metrics.disconnects.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Err(e) => {
            session.reset();
            return Some(Event::Error(ApiError::internal(format!(
                "generation failed: {}",
                crate::errors::hint(&e)
            ))));
        }
    };
    metrics
        .prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    metrics
        .cached_tokens
        .fetch_add(reusable as u64, Ordering::Relaxed);
    let mut matcher = StopMatcher::new(&job.stop);
    let mut last = None::<Instant>;
    let mut hit_stop = false;
    let mut gone = false;
    while let Some(token) = gen.next() {
        if let Err(e) = token {
            drop(gen);
            session.reset();
            return Some(Event::Error(ApiError::internal(format!(
                "generation failed: {}",
                crate::errors::hint(&e)
            ))));
        }
        let now = Instant::now();
        match last {
            None => metrics.ttft.observe(now - job.arrived),
            Some(t) => metrics.token_latency.observe(now - t),
        }
        last = Some(now);
        metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let (text, stop) = matcher.push(gen.text());
        if !text.is_empty() && !send(Event::Text(text)) {
            gone = true;
        }
        if stop {
            hit_stop = true;
            gen.stop();
            break;
        }
        if gone || job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
            gone = gone || job.events.is_closed();
            gen.stop();
            break;
        }
    }
    if gone {
        metrics.disconnects.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    if !hit_stop {
        // Held-back text and the bytes of a character the last token left incomplete.
        let (mut tail, stop) = matcher.push(gen.text());
        if !stop {
            tail.push_str(&matcher.rest());
        }
        hit_stop = stop;
        if !tail.is_empty() {
            send(Event::Text(tail));
        }
    }
    let done = gen.result();
    let reason = match done.stop_reason {
        _ if hit_stop => FinishReason::Stop,
        StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
        StopReason::EndOfGeneration(_) | StopReason::Stopped => FinishReason::Stop,
    };
    Some(Event::Done(Finish {
        reason,
        prompt_tokens,
        cached_tokens: reusable,
        completion_tokens: done.n_tokens,
    }))
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.rest());
        (out, false)
    }

    #[test]
    fn stop_strings_split_across_tokens_are_found_and_cut() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D and more"]),
            ("hello ".into(), true)
        );
        assert_eq!(
            run(&["\n\n"], &["a\n", "b\n", "\nc"]),
            ("a\nb".into(), true)
        );
        // A false start is released once it cannot be a stop string.
        assert_eq!(run(&["END"], &["EN", "x"]), ("ENx".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        // Multi-byte characters are never split.
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }
}
