//! Sessions that decode together: one executor (threads, arena, scratch) and one KV cache per
//! member, so that the members' next tokens go through one forward pass per step and the
//! weights are read once for all of them.
//!
//! Each member is a [`Backend`] of its own [`crate::session::Session`], driven by its own
//! thread as any session is. A prompt chunk (or any run of several tokens) takes the executor
//! for itself. A decode step joins a *gathering*: the first member to ask becomes the leader,
//! takes the executor, waits until every member that is decoding has asked too (or a short
//! window has passed: a member that went quiet does not hold the others up), and runs all of
//! their tokens as the rows of one every-row graph, each row over its own member's cache and
//! position ([`super::exec::SeqRow`]). Each member gets its logits row back in a buffer of its
//! own, swapped with a buffer of the same size: a step allocates nothing.
//!
//! Rows of a batch go through the multi-token kernels, which add in another order than a single
//! token's: a member's logits differ from a lone session's in the last bits, as llama.cpp's do
//! when its server decodes several slots in one batch.
//!
//! Locks: the executor (`Core`) is always taken before the gathering state, never after.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use edge_kernels::Kernels;

use super::exec::{Executor, RunArgs, SeqRow};
use crate::backend::interface::{Allocation, Backend, DecodeBatches};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::model::Model;
use crate::plan::PlannedGraph;

/// Most members of one group.
pub const MAX_MEMBERS: usize = 256;

/// Most decode steps in one pass (the rows of a group's every-row graph): more members than
/// this decode in turns.
pub const MAX_BATCH: usize = 16;

/// The shortest time a leader waits for the decoding members that have not asked yet.
const MIN_GATHER_WINDOW: Duration = Duration::from_millis(2);

/// Passes in a row a decoding member may miss before leaders stop waiting for it.
const MISSES_TO_STOP_WAITING: u32 = 3;

/// What the executor lock guards.
struct Core {
    exec: Executor,
    kvs: Vec<KvCache>,
    /// The every-row graph, planned for `kvs.len()` rows.
    batch: PlannedGraph,
    /// The batch being run: (member, token, position), reserved for [`MAX_BATCH`].
    rows: Vec<(usize, u32, usize)>,
    /// The logits buffers of the batch's members while the leader fills them.
    out: Vec<Vec<f32>>,
    /// Two KV rows of f32 for a context shift.
    shift_rows: Vec<f32>,
}

/// What the gathering lock guards.
struct Gathering {
    /// Each member's pending decode step: (token, position).
    asked: Vec<Option<(u32, usize)>>,
    /// Members that decode step by step: a leader waits for them.
    decoding: Vec<bool>,
    /// Passes in a row each decoding member was not ready for.
    misses: Vec<u32>,
    /// A member's step has run; `ok` says whether it ran without a fault.
    done: Vec<bool>,
    ok: Vec<bool>,
    /// Each member's logits buffer between steps (swapped with the member's own).
    results: Vec<Vec<f32>>,
    /// A leader is gathering (others wait for their step to be done).
    leader: bool,
    /// The member the next pass starts its gathering at.
    first: usize,
    /// How long the last batch took to run.
    last_pass: Duration,
    /// Decode passes run so far, and the steps they held.
    stats: DecodeBatches,
}

/// The shared part of a group of sessions.
pub struct CpuGroup {
    core: Mutex<Core>,
    gathering: Mutex<Gathering>,
    changed: Condvar,
    kernels: Kernels,
    n_threads: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A member that panicked left the state consistent (every update is a whole assignment,
    // and a run that panicked reports it): go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CpuGroup {
    /// Allocates `n` KV caches and one executor as `alloc` says (`alloc.arena_bytes` covers
    /// `batch` too), and returns the members' backends.
    pub fn open(
        model: &Model,
        alloc: &Allocation,
        kernels: Kernels,
        batch: PlannedGraph,
        n: usize,
    ) -> Result<Vec<GroupMember>> {
        if n == 0 || n > MAX_MEMBERS || batch.graph.ubatch < n.min(MAX_BATCH) {
            return Err(EngineError::InvalidArgument(format!(
                "a group of sessions has 1 to {MAX_MEMBERS} members (asked for {n})"
            )));
        }
        // The huge-page settling and the first cache are a lone session's.
        let first = super::CpuBackend::open(model, alloc, kernels)?;
        let p = &model.params;
        let mut kvs = Vec::with_capacity(n);
        kvs.push(first.kv);
        for _ in 1..n {
            kvs.push(super::open_kv(model, alloc)?);
        }
        let n_vocab = p.n_vocab;
        let n_threads = first.exec.n_threads();
        let group = Arc::new(CpuGroup {
            core: Mutex::new(Core {
                exec: first.exec,
                kvs,
                batch,
                rows: Vec::with_capacity(MAX_BATCH),
                out: (0..MAX_BATCH).map(|_| Vec::new()).collect(),
                shift_rows: first.shift_rows,
            }),
            gathering: Mutex::new(Gathering {
                asked: vec![None; n],
                decoding: vec![false; n],
                misses: vec![0; n],
                done: vec![false; n],
                ok: vec![true; n],
                results: (0..n).map(|_| vec![0.0; n_vocab]).collect(),
                leader: false,
                first: 0,
                last_pass: Duration::ZERO,
                stats: DecodeBatches::default(),
            }),
            changed: Condvar::new(),
            kernels,
            n_threads,
        });
        Ok((0..n)
            .map(|slot| GroupMember {
                group: Arc::clone(&group),
                slot,
                logits: vec![0.0; n_vocab],
            })
            .collect())
    }

    /// Bytes of the logits buffers of `n` members (two rows of `n_vocab` f32 each: the
    /// member's own and the one it swaps with).
    pub fn logits_bytes(n_vocab: usize, n: usize) -> usize {
        2 * n * n_vocab * 4
    }
}

/// One session's share of a [`CpuGroup`]: its KV cache, and its logits.
pub struct GroupMember {
    group: Arc<CpuGroup>,
    slot: usize,
    /// The logits of this member's last run.
    logits: Vec<f32>,
}

impl GroupMember {
    /// Whether `other` belongs to the same group.
    pub fn same_group(&self, other: &GroupMember) -> bool {
        Arc::ptr_eq(&self.group, &other.group)
    }

    /// Which member of its group this is.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Stops counting this member as decoding (its generation ended): leaders no longer wait
    /// for it.
    fn quiet(&self) {
        let g = &self.group;
        lock(&g.gathering).decoding[self.slot] = false;
        g.changed.notify_all();
    }

    /// A run that takes the executor for itself (a prompt chunk).
    fn run_alone(
        &mut self,
        model: &Model,
        graph: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<()> {
        let g = Arc::clone(&self.group);
        let core = lock(&g.core);
        lock(&g.gathering).decoding[self.slot] = false;
        g.changed.notify_all();
        let kv = &core.kvs[self.slot];
        if !core
            .exec
            .run(model, kv, graph, RunArgs::one_sequence(tokens, pos0))
        {
            return Err(panicked());
        }
        self.logits
            .copy_from_slice(core.exec.read_f32(graph, graph.graph.output, 1));
        Ok(())
    }

    /// One decode step, run together with the other members' steps that are ready.
    fn step_together(
        &mut self,
        model: &Model,
        decode: &PlannedGraph,
        token: u32,
        pos: usize,
    ) -> Result<()> {
        let g = Arc::clone(&self.group);
        let me = self.slot;
        let mut st = lock(&g.gathering);
        st.asked[me] = Some((token, pos));
        st.decoding[me] = true;
        g.changed.notify_all();
        loop {
            if st.done[me] {
                st.done[me] = false;
                std::mem::swap(&mut self.logits, &mut st.results[me]);
                return if st.ok[me] { Ok(()) } else { Err(panicked()) };
            }
            // A step already taken into a batch (asked is empty again) waits for that batch;
            // leading now would gather nothing of its own.
            if !st.leader && st.asked[me].is_some() {
                st.leader = true;
                drop(st);
                self.lead(model, decode);
                st = lock(&g.gathering);
                continue;
            }
            st = g.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The leader's part: take the executor, gather the decoding members' steps, run them as
    /// one batch, hand each member its logits.
    fn lead(&self, model: &Model, decode: &PlannedGraph) {
        let g = &*self.group;
        let mut guard = lock(&g.core);
        let mut st = lock(&g.gathering);
        // Members decoding but not yet asking are sampling their next token: wait for them,
        // but not for long (a slow or finished member is left for the next batch).
        let window = MIN_GATHER_WINDOW.max(st.last_pass / 4);
        let deadline = Instant::now() + window;
        loop {
            let missing = (0..st.asked.len()).any(|s| st.decoding[s] && st.asked[s].is_none());
            let now = Instant::now();
            if !missing || now >= deadline {
                break;
            }
            st = g
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let core = &mut *guard;
        core.rows.clear();
        let (n, first) = (st.asked.len(), st.first);
        // Beyond MAX_BATCH steps the rest wait for the next pass; each pass starts after the
        // last member the one before took, so that every member gets its turn.
        for s in (first..n).chain(0..first) {
            if core.rows.len() == MAX_BATCH {
                break;
            }
            match st.asked[s].take() {
                Some((token, pos)) => {
                    st.misses[s] = 0;
                    core.rows.push((s, token, pos));
                    core.out[core.rows.len() - 1] = std::mem::take(&mut st.results[s]);
                    st.first = (s + 1) % n;
                }
                // A decoding member that keeps missing passes (stepped without saying when it
                // stopped) is no longer waited for; it is counted again when it asks.
                None if st.decoding[s] => {
                    st.misses[s] += 1;
                    if st.misses[s] >= MISSES_TO_STOP_WAITING {
                        st.decoding[s] = false;
                    }
                }
                None => {}
            }
        }
        // The next asker may lead the next batch: it waits for this one's executor.
        st.leader = false;
        drop(st);
        g.changed.notify_all();
        if core.rows.is_empty() {
            return;
        }
        let started = Instant::now();
        let ok = run_batch(core, model, decode);
        let mut st = lock(&g.gathering);
        st.last_pass = started.elapsed();
        let k = core.rows.len() as u64;
        st.stats.passes += 1;
        st.stats.steps += k;
        st.stats.shared_passes += u64::from(k > 1);
        for (i, &(s, _, _)) in core.rows.iter().enumerate() {
            st.results[s] = std::mem::take(&mut core.out[i]);
            st.done[s] = true;
            st.ok[s] = ok;
        }
        drop(st);
        drop(guard);
        g.changed.notify_all();
    }
}

/// Runs `core.rows` (one member's step through its own `decode` graph, several as the rows of
/// the every-row graph) and copies each row's logits into `core.out`. False if a thread
/// panicked.
fn run_batch(core: &mut Core, model: &Model, decode: &PlannedGraph) -> bool {
    let k = core.rows.len();
    if k == 1 {
        let (s, token, pos) = core.rows[0];
        let ok = core.exec.run(
            model,
            &core.kvs[s],
            decode,
            RunArgs::one_sequence(&[token], pos),
        );
        if ok {
            core.out[0].copy_from_slice(core.exec.read_f32(decode, decode.graph.output, 1));
        }
        return ok;
    }
    let kvs = &core.kvs;
    let tokens: [u32; MAX_BATCH] = std::array::from_fn(|i| core.rows.get(i).map_or(0, |r| r.1));
    let seqs: [SeqRow<'_>; MAX_BATCH] = std::array::from_fn(|i| {
        let (s, _, pos) = core.rows.get(i).copied().unwrap_or((0, 0, 0));
        SeqRow { kv: &kvs[s], pos }
    });
    let batch = &core.batch;
    let args = RunArgs {
        tokens: &tokens[..k],
        pos0: 0,
        seqs: Some(&seqs[..k]),
    };
    if !core.exec.run(model, &kvs[core.rows[0].0], batch, args) {
        return false;
    }
    let logits = core.exec.read_f32(batch, batch.graph.output, k);
    let n_vocab = logits.len() / k;
    for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
        core.out[i].copy_from_slice(row);
    }
    true
}

fn panicked() -> EngineError {
    EngineError::Kernel("a worker thread panicked; this is a bug".into())
}

impl Backend for GroupMember {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn name(&self) -> &'static str {
        self.group.kernels.isa_name()
    }

    fn n_threads(&self) -> usize {
        self.group.n_threads
    }

    fn description(&self) -> String {
        format!(
            "{} threads, kernels {}, decoding together with the group's other sessions",
            self.group.n_threads,
            self.group.kernels.isa_name()
        )
    }

    fn kv_bytes(&self) -> u64 {
        lock(&self.group.core).kvs[self.slot].bytes() as u64
    }

    fn run(
        &mut self,
        model: &Model,
        graph: &PlannedGraph,
        tokens: &[u32],
        pos0: usize,
        decode: bool,
    ) -> Result<()> {
        if decode && tokens.len() == 1 {
            self.step_together(model, graph, tokens[0], pos0)
        } else {
            self.run_alone(model, graph, tokens, pos0)
        }
    }

    fn output(&self, _graph: &PlannedGraph) -> Result<&[f32]> {
        Ok(&self.logits)
    }

    fn read_kv(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        super::read_kv_bytes(&mut lock(&self.group.core).kvs[self.slot], offset, out)
    }

    fn write_kv(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        super::write_kv_bytes(&mut lock(&self.group.core).kvs[self.slot], offset, data)
    }

    fn shift_context(
        &mut self,
        model: &Model,
        n_past: usize,
        keep: usize,
        n_discard: usize,
    ) -> Result<()> {
        let mut core = lock(&self.group.core);
        let core = &mut *core;
        let shift = super::KvShift {
            n_past,
            keep,
            n_discard,
        };
        super::shift_kv(
            &mut core.kvs[self.slot],
            model,
            shift,
            core.exec.kernels(),
            &mut core.shift_rows,
        )
    }

    fn end_steps(&mut self) {
        self.quiet();
    }

    fn decode_batches(&self) -> Option<DecodeBatches> {
        Some(lock(&self.group.gathering).stats)
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        self.quiet();
    }
}
