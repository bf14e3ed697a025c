//! `/v1/embeddings` for an encoder model: one engine thread per slot, each owning an
//! [`Embedder`] planned at start-up, taking requests from one bounded queue.

use std::sync::{mpsc, Arc, Mutex};

use edge_engine::embed::Embedder;
use edge_engine::error::EngineError;
use tokio::sync::oneshot;

use super::error::ApiError;

/// Embeddings of the texts, and the tokens they took.
pub type EmbedResult = Result<(Vec<Vec<f32>>, usize), ApiError>;

/// A request for the embedding slots.
pub struct EmbedJob {
    /// The texts.
    pub texts: Vec<String>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<EmbedResult>,
}

/// The embedding slots' queue.
pub struct EmbedPool {
    queue: mpsc::SyncSender<EmbedJob>,
}

impl EmbedPool {
    /// Starts one thread per embedder; at most `slots + queue` requests are taken at once.
    pub fn start(
        embedders: Vec<Embedder>,
        queue: usize,
    ) -> std::io::Result<(EmbedPool, Vec<std::thread::JoinHandle<()>>)> {
        let (tx, rx) = mpsc::sync_channel::<EmbedJob>(queue + embedders.len());
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for (i, mut embedder) in embedders.into_iter().enumerate() {
            let rx = Arc::clone(&rx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("embed-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            embed_all(&mut embedder, &job.texts)
                        }))
                        .unwrap_or_else(|_| {
                            Err(ApiError::internal(
                                "internal error while embedding (a bug in edge-run; see the server log)",
                            ))
                        });
                        let _ = job.reply.send(out);
                    })?,
            );
        }
        Ok((EmbedPool { queue: tx }, threads))
    }

    /// Queues a job; gives it back when the queue is full.
    pub fn submit(&self, job: EmbedJob) -> Result<(), EmbedJob> {
        self.queue.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(j) | mpsc::TrySendError::Disconnected(j) => j,
        })
    }
}

fn embed_all(embedder: &mut Embedder, texts: &[String]) -> EmbedResult {
    let model = Arc::clone(embedder.model());
    let mut out = Vec::with_capacity(texts.len());
    let mut tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        let param = format!("input[{i}]");
        tokens += model
            .tokenize(text, true, false)
            .map_err(|e| ApiError::field(&param, crate::errors::hint(&e)))?
            .len();
        let v = embedder.embed(&[text.as_str()]).map_err(|e| match e {
            EngineError::InvalidArgument(_) | EngineError::InvalidSetting { .. } => {
                ApiError::field(&param, crate::errors::hint(&e).replacen("text 1 ", "", 1))
            }
            e => ApiError::internal(format!("embedding failed: {}", crate::errors::hint(&e))),
        })?;
        out.push(v.into_iter().next().unwrap_or_default());
    }
    Ok((out, tokens))
}
