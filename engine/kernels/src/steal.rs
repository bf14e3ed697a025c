//! Work stealing for the rows of one decode matmul, without allocation or locks.
//!
//! Each thread owns the contiguous share of rows that `split_range` gives it, cut into chunks.
//! The owner claims its chunks from the front, in order, so that its reads stay one sequential
//! stream for the prefetchers; a thread that has finished its own share claims chunks from the
//! back of the others' shares, far from where their owners are reading. Every chunk is claimed
//! exactly once, by one compare-and-swap on its owner's claim word, so the rows each thread
//! computes change from run to run but every row's result does not (a row's dot product does not
//! depend on who computes it).
//!
//! Why: a decode step's matmuls are memory-bound, and two threads' equal shares rarely finish
//! together (each core's share of the memory system varies from op to op). Without stealing the
//! first thread to finish spins at the barrier; a decode profile of the 1.1B Q4_K_M model showed
//! both threads waiting there 6% of their time.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::threads::split_range;

/// Bits of a claim word for the front and for the back chunk index; the op's tag takes the
/// remaining 32.
const IDX_BITS: u32 = 16;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
const TAG_MASK: u64 = u32::MAX as u64;

/// At most this many chunks per share (so that indices fit their bits).
pub const MAX_CHUNKS: usize = 1 << 15;

/// One thread's claim word, alone on its cache line so that owners claiming their own chunks
/// never contend with each other.
#[repr(align(128))]
struct ClaimWord(AtomicU64);

/// Claim words of every thread of an executor.
pub struct RowClaims {
    words: Vec<ClaimWord>,
}

/// Packs (tag, front, back). `front..back` are the chunks not yet claimed.
fn pack(tag: u64, front: u64, back: u64) -> u64 {
    (tag << (2 * IDX_BITS)) | (front << IDX_BITS) | back
}

fn unpack(w: u64) -> (u64, u64, u64) {
    (
        w >> (2 * IDX_BITS),
        (w >> IDX_BITS) & IDX_MASK,
        w & IDX_MASK,
    )
}

/// How one op's rows are cut: each thread's share (as `split_range` with `granule`) in chunks
/// of `chunk` rows, or, with `shrink` > 0, in chunks that shrink as the share is used up.
#[derive(Clone, Copy, Debug)]
pub struct ChunkPlan {
    /// Rows (or other units of work) of the op.
    pub n_rows: usize,
    /// Threads sharing them.
    pub n_threads: usize,
    /// Rows per share unit (shares start on multiples of it).
    pub granule: usize,
    /// Rows per chunk (chunks start at the share's start; the last one may be shorter); with
    /// `shrink`, the smallest chunk.
    pub chunk: usize,
    /// 0 for chunks of `chunk` rows; else each chunk is `1 / shrink` of what remains of the
    /// share (at least `chunk` rows, a whole number of `granule`s): the owner starts with long
    /// runs, and the last chunks, the ones taken from the back by the others, are short, so
    /// the threads finish close together.
    pub shrink: usize,
}

impl ChunkPlan {
    /// Chunks of `1 / shrink` of the rest of the share, at least `min_rows` rows each (rounded
    /// up to whole `granule`s).
    pub fn guided(
        n_rows: usize,
        n_threads: usize,
        granule: usize,
        shrink: usize,
        min_rows: usize,
    ) -> ChunkPlan {
        let granule = granule.max(1);
        let share = n_rows.div_ceil(n_threads.max(1));
        ChunkPlan {
            n_rows,
            n_threads: n_threads.max(1),
            granule,
            // Never more than MAX_CHUNKS chunks (about shrink * ln(share) of them otherwise).
            chunk: share
                .div_ceil(MAX_CHUNKS / 2)
                .max(min_rows)
                .next_multiple_of(granule),
            shrink: shrink.max(1),
        }
    }

    fn share(&self, owner: usize) -> Range<usize> {
        split_range(self.n_rows, owner, self.n_threads, self.granule)
    }

    /// The chunks of `owner`'s share, front to back.
    fn chunks(&self, owner: usize) -> impl Iterator<Item = Range<usize>> + '_ {
        let share = self.share(owner);
        let mut at = share.start;
        std::iter::from_fn(move || {
            if at >= share.end {
                return None;
            }
            let rest = share.end - at;
            let len = if self.shrink == 0 {
                self.chunk.max(1)
            } else {
                rest.div_ceil(self.shrink)
                    .next_multiple_of(self.granule)
                    .max(self.chunk)
            }
            .min(rest);
            at += len;
            Some(at - len..at)
        })
    }

    fn n_chunks(&self, owner: usize) -> u64 {
        self.chunks(owner).count() as u64
    }

    /// Rows of chunk `k` of `owner`'s share.
    fn rows(&self, owner: usize, k: u64) -> Range<usize> {
        self.chunks(owner).nth(k as usize).unwrap_or(0..0)
    }
}

/// The chunks one thread claims in one op, in the order it claims them (see
/// [`RowClaims::claimed`]).
pub struct Claimed<'a> {
    claims: &'a RowClaims,
    plan: ChunkPlan,
    tag: u64,
    tid: usize,
    /// Threads visited so far: 0 is this thread's own share (claimed from the front), then the
    /// others' in turn (claimed from the back).
    visited: usize,
}

impl Iterator for Claimed<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        let n = self.claims.words.len().min(self.plan.n_threads);
        while self.visited < n {
            let owner = (self.tid + self.visited) % n;
            let own = self.visited == 0;
            if let Some(k) = self.claims.claim(&self.plan, self.tag, owner, own) {
                return Some(self.plan.rows(owner, k));
            }
            self.visited += 1;
        }
        None
    }
}

impl RowClaims {
    /// Claim words for `n_threads` threads, ready for ops tagged from 0 on.
    pub fn new(n_threads: usize) -> RowClaims {
        RowClaims::before_tag(n_threads, 0)
    }

    /// Claim words marked as left by the op just before `tag`.
    fn before_tag(n_threads: usize, tag: u64) -> RowClaims {
        let earlier = pack(tag.wrapping_sub(1) & TAG_MASK, 0, 0);
        RowClaims {
            words: (0..n_threads.max(1))
                .map(|_| ClaimWord(AtomicU64::new(earlier)))
                .collect(),
        }
    }

    /// The chunks of rows this thread (`tid`) claims in the op tagged `tag`: its own chunks
    /// front to back, then the others' from their backs. Every thread of the op must claim
    /// with the same `plan` and `tag`, each until the iterator ends, and later ops must have
    /// larger tags (modulo 2^32, by less than 2^31), so that a claim word left by an earlier op
    /// is told from one a thread already in a later op wrote.
    pub fn claimed(&self, plan: ChunkPlan, tag: usize, tid: usize) -> Claimed<'_> {
        Claimed {
            claims: self,
            plan,
            tag: tag as u64 & TAG_MASK,
            tid,
            visited: 0,
        }
    }

    /// Claims one chunk of `owner`'s share for op `tag`: the first unclaimed one (`front`) or
    /// the last. `None` once none is left.
    fn claim(&self, plan: &ChunkPlan, tag: u64, owner: usize, front: bool) -> Option<u64> {
        let word = &self.words[owner].0;
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let (t, f, b) = unpack(cur);
            let (f, b) = if t == tag {
                (f, b)
            } else if t.wrapping_sub(tag) & TAG_MASK > TAG_MASK / 2 {
                // Left by an earlier op: this op's claims start from the whole share (every
                // thread derives the same value, so whoever stores it first is right). It is
                // stored even when empty, so that every word carries a recent tag.
                (0, plan.n_chunks(owner))
            } else {
                // The owner has moved on to a later op: all of this one's chunks were claimed.
                return None;
            };
            let (next, k) = if f >= b {
                if t == tag {
                    return None;
                }
                (pack(tag, f, b), None)
            } else if front {
                (pack(tag, f + 1, b), Some(f))
            } else {
                (pack(tag, f, b - 1), Some(b - 1))
            };
            match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return k,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn run(n_rows: usize, n_threads: usize, ops: usize, per_share: usize) {
        let claims = RowClaims::new(n_threads);
        let hits: Vec<AtomicUsize> = (0..n_rows).map(|_| AtomicUsize::new(0)).collect();
        let plan = ChunkPlan::guided(n_rows, n_threads, 16, per_share, 1);
        std::thread::scope(|s| {
            for tid in 0..n_threads {
                let (claims, hits) = (&claims, &hits);
                s.spawn(move || {
                    for op in 0..ops {
                        for rows in claims.claimed(plan, op + 5, tid) {
                            for r in rows {
                                hits[r].fetch_add(1, Ordering::Relaxed);
                            }
                            if tid == 0 {
                                // A slow thread: the others steal from it.
                                std::thread::yield_now();
                            }
                        }
                    }
                });
            }
        });
        for (r, h) in hits.iter().enumerate() {
            assert_eq!(h.load(Ordering::Relaxed), ops, "row {r}");
        }
    }

    #[test]
    fn every_row_is_computed_once_per_op() {
        // No barrier between ops: a fast thread runs ahead into later ops while a slow one is
        // still claiming, as independent ops do in the executor.
        run(5632, 2, 300, 16);
        run(2048, 3, 200, 8);
        run(100, 4, 200, 4);
        run(7, 2, 50, 16);
        run(0, 2, 10, 16);
    }

    #[test]
    fn tags_wrap_around() {
        let claims = RowClaims::before_tag(2, TAG_MASK - 1);
        let plan = ChunkPlan::guided(64, 2, 16, 2, 1);
        let mut seen = Vec::new();
        for tag in [TAG_MASK as usize - 1, TAG_MASK as usize, 0, 1] {
            let rows: usize = (0..2)
                .flat_map(|tid| claims.claimed(plan, tag, tid))
                .map(|r| r.len())
                .sum();
            seen.push(rows);
        }
        assert_eq!(seen, [64, 64, 64, 64]);
    }

    #[test]
    fn the_first_op_claims_everything() {
        // Tag 0 right after `new`: the words must read as left by an earlier op.
        let claims = RowClaims::new(2);
        let plan = ChunkPlan::guided(64, 2, 16, 2, 1);
        let rows: usize = (0..2)
            .flat_map(|tid| claims.claimed(plan, 0, tid))
            .map(|r| r.len())
            .sum();
        assert_eq!(rows, 64);
    }

    #[test]
    fn guided_chunks_shrink_and_tile_each_share() {
        for (n_rows, n_threads, granule, shrink, min_rows) in [
            (5632, 2, 16, 4, 1),
            (2048, 3, 16, 4, 40),
            (49152, 2, 16, 8, 1),
            (20, 2, 16, 4, 1),
            (9, 2, 1, 3, 1),
            (576, 2, 16, 4, 91),
        ] {
            let plan = ChunkPlan::guided(n_rows, n_threads, granule, shrink, min_rows);
            for owner in 0..n_threads {
                let share = plan.share(owner);
                let chunks: Vec<_> = plan.chunks(owner).collect();
                assert_eq!(chunks.len() as u64, plan.n_chunks(owner));
                let mut at = share.start;
                for (k, c) in chunks.iter().enumerate() {
                    assert_eq!(
                        c.start, at,
                        "{n_rows} rows: chunk {k} starts where the last ended"
                    );
                    assert!(!c.is_empty());
                    assert!(c.end == share.end || c.len() % granule == 0);
                    assert!(c.end == share.end || c.len() >= min_rows);
                    if k > 0 {
                        assert!(c.len() <= chunks[k - 1].len(), "chunks shrink");
                    }
                    assert_eq!(plan.rows(owner, k as u64), *c);
                    at = c.end;
                }
                assert_eq!(at, share.end);
            }
        }
        // 2816 rows per share, a quarter at a time: 704, then 528, ... down to 16.
        let plan = ChunkPlan::guided(5632, 2, 16, 4, 1);
        assert_eq!(plan.rows(0, 0), 0..704);
        assert_eq!(plan.rows(1, 0), 2816..3520);
        assert_eq!(plan.rows(0, 1), 704..1232);
        assert_eq!(plan.chunks(0).last().map(|c| c.len()), Some(16));
    }
}
