//! # edge-arena — static memory planner
//!
//! Buffer sizes and lifetimes in, offsets into one arena out. The crate knows
//! nothing about models: the engine turns every intermediate graph value into a
//! [`Buffer`], calls [`plan`] once per graph, allocates one arena of
//! [`ArenaPlan::size`] bytes and hands each op views at the planned offsets.
//!
//! ## Model
//!
//! Ops are numbered `0, 1, 2, …` in execution order. A [`Buffer`] is `size`
//! bytes whose offset must be a multiple of `align` (a power of two), and it is
//! *live* from op `first_op` to op `last_op`, **both inclusive** (an op's
//! inputs and outputs are live at the same time, so a value produced by op 3
//! and last read by op 5 is `first_op: 3, last_op: 5`). Two buffers *live
//! together* when their op ranges intersect; only buffers that live together
//! must occupy disjoint bytes. Zero-size buffers occupy nothing: they get offset
//! `0` and never conflict with anything.
//!
//! A plan is *valid* when every buffer lies inside `0..size`, every offset is
//! aligned, and no two buffers that live together overlap in memory. [`check`]
//! decides exactly that, naming the offending buffer(s) when it fails.
//!
//! ## Algorithm
//!
//! [`plan`] is the greedy-by-size heuristic of TFLite Micro's
//! `GreedyMemoryPlanner`:
//!
//! 1. Sort the buffers by size, largest first; ties go to the earlier
//!    `first_op`, then to the lower index, so the result is deterministic.
//! 2. Take them in that order. For each, collect the already placed buffers
//!    that live together with it, sort them by offset, and put it at the
//!    lowest aligned offset where it fits between them (first fit from the
//!    bottom), or after the last one.
//!
//! Cost: the neighbours in time are found through an index of the buffers
//! sorted by `first_op`, in blocks of 64 that record their latest `last_op`,
//! so each buffer costs about `O(n / 64 + k log k)` for `k` neighbours
//! (`O(n² log n)` only if everything lives together). 10 000 graph-like
//! buffers plan in about 10 ms. In debug builds `plan` also runs [`check`] on
//! its own result (`O(n log n + k)`, `k` the number of pairs of buffers that
//! live together) and returns [`PlanError::Internal`] if it fails.
//!
//! ## Quality
//!
//! [`lower_bound`] is the peak, over ops, of the sum of the sizes of the
//! buffers live at that op. No valid plan can be smaller (alignment padding
//! is not counted, so it is a bound, not always reachable). Every [`ArenaPlan`]
//! carries it, so callers can report how close the plan is
//! (`size / lower_bound`). Greedy-by-size is not optimal in general (the
//! problem is NP-hard), but on inference graphs it is usually at or near the
//! bound; the tests compare it with a brute force over all placement orders on
//! small instances.
//!
//! ## Features
//!
//! * `alloc` (default): [`plan`] and [`ArenaPlan`], which need `Vec`.
//! * Without it the crate is `no_std`, heap-free and offers [`Buffer`],
//!   [`check`], [`lower_bound`] and [`PlanError`].
//!
//! ## Example
//!
//! ```
//! use edge_arena::{check, plan, Buffer};
//!
//! // a -> b -> c: a is dead by the time c is written, so they share bytes.
//! let buffers = [
//!     Buffer::new(64, 16, 0, 1), // a: written by op 0, read by op 1
//!     Buffer::new(64, 16, 1, 2), // b: written by op 1, read by op 2
//!     Buffer::new(64, 16, 2, 3), // c: written by op 2, read by op 3
//! ];
//! let p = plan(&buffers).unwrap();
//! assert_eq!(p.offsets, [0, 64, 0]);
//! assert_eq!((p.size, p.lower_bound), (128, 128));
//! check(&buffers, &p.offsets, p.size).unwrap();
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(feature = "alloc")]
use alloc::vec::Vec;
use core::fmt;

/// One buffer to place: `size` bytes, offset must be a multiple of `align` (a
/// power of two >= 1), live from op index `first_op` to `last_op` inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Size in bytes. Zero-size buffers are placed at offset 0 and never conflict.
    pub size: usize,
    /// Required alignment of the offset, in bytes; a power of two (1 = none).
    pub align: usize,
    /// First op (inclusive) during which the buffer holds live data.
    pub first_op: usize,
    /// Last op (inclusive) during which the buffer holds live data.
    pub last_op: usize,
}

impl Buffer {
    /// A buffer of `size` bytes aligned to `align`, live over ops `first_op..=last_op`.
    pub const fn new(size: usize, align: usize, first_op: usize, last_op: usize) -> Self {
        Self {
            size,
            align,
            first_op,
            last_op,
        }
    }

    /// Whether the two lifetimes intersect (the buffers are live at some common op).
    /// Says nothing about sizes: zero-size buffers still "live together".
    pub const fn lives_with(&self, other: &Buffer) -> bool {
        self.first_op <= other.last_op && other.first_op <= self.last_op
    }
}

/// The result of [`plan`].
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// `offsets[i]` is the byte offset of buffer `i` in the arena.
    pub offsets: Vec<usize>,
    /// Arena size in bytes: the maximum of `offset + size` over all buffers (0 if none).
    pub size: usize,
    /// [`lower_bound`] of the same buffers: no valid plan is smaller than this.
    pub lower_bound: usize,
}

/// What is wrong with a buffer list or a plan. Every variant names the buffer
/// index (or indices) concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// `align` of buffer `index` is not a power of two (0 included).
    BadAlign {
        /// The buffer.
        index: usize,
        /// Its alignment.
        align: usize,
    },
    /// Buffer `index` ends before it starts (`first_op > last_op`).
    BadLifetime {
        /// The buffer.
        index: usize,
        /// Its first op.
        first_op: usize,
        /// Its last op.
        last_op: usize,
    },
    /// Placing buffer `index` (or its given `offset + size`) overflows `usize`.
    Overflow {
        /// The buffer.
        index: usize,
    },
    /// [`check`] was given a different number of offsets than buffers.
    LengthMismatch {
        /// Number of buffers.
        buffers: usize,
        /// Number of offsets.
        offsets: usize,
    },
    /// Buffer `index` is placed at an offset that is not a multiple of its alignment.
    Misaligned {
        /// The buffer.
        index: usize,
        /// Its offset.
        offset: usize,
        /// Its alignment.
        align: usize,
    },
    /// Buffer `index` does not fit inside the arena (`offset + size > arena_size`).
    OutOfArena {
        /// The buffer.
        index: usize,
        /// Its offset.
        offset: usize,
        /// Its size.
        size: usize,
        /// The arena size it was checked against.
        arena_size: usize,
    },
    /// Buffers `a` and `b` (with `a < b`) live together and share bytes.
    Overlap {
        /// The first buffer.
        a: usize,
        /// Bytes of `a`, half-open `[start, end)`.
        a_bytes: (usize, usize),
        /// Lifetime of `a`, inclusive `(first_op, last_op)`.
        a_ops: (usize, usize),
        /// The second buffer.
        b: usize,
        /// Bytes of `b`, half-open `[start, end)`.
        b_bytes: (usize, usize),
        /// Lifetime of `b`, inclusive `(first_op, last_op)`.
        b_ops: (usize, usize),
    },
    /// The planner's own result failed [`check`] at buffer `index`. This is a
    /// bug in this crate (only detected in debug builds).
    Internal {
        /// The first buffer the failed check named.
        index: usize,
    },
}

impl PlanError {
    /// The (first) buffer index the error is about, if any.
    pub const fn index(&self) -> Option<usize> {
        match *self {
            PlanError::BadAlign { index, .. }
            | PlanError::BadLifetime { index, .. }
            | PlanError::Overflow { index }
            | PlanError::Misaligned { index, .. }
            | PlanError::OutOfArena { index, .. }
            | PlanError::Internal { index } => Some(index),
            PlanError::Overlap { a, .. } => Some(a),
            PlanError::LengthMismatch { .. } => None,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlanError::BadAlign { index, align } => write!(
                f,
                "buffer {index}: alignment {align} is not a power of two"
            ),
            PlanError::BadLifetime {
                index,
                first_op,
                last_op,
            } => write!(
                f,
                "buffer {index}: lifetime ends before it starts (first_op {first_op} > last_op {last_op})"
            ),
            PlanError::Overflow { index } => {
                write!(f, "buffer {index}: offset + size overflows usize")
            }
            PlanError::LengthMismatch { buffers, offsets } => {
                write!(f, "{buffers} buffers but {offsets} offsets")
            }
            PlanError::Misaligned {
                index,
                offset,
                align,
            } => write!(
                f,
                "buffer {index}: offset {offset} is not a multiple of its alignment {align}"
            ),
            PlanError::OutOfArena {
                index,
                offset,
                size,
                arena_size,
            } => write!(
                f,
                "buffer {index}: bytes [{offset}, {offset}+{size}) do not fit in an arena of {arena_size} bytes"
            ),
            PlanError::Overlap {
                a,
                a_bytes,
                a_ops,
                b,
                b_bytes,
                b_ops,
            } => write!(
                f,
                "buffers {a} and {b} overlap: {a} has bytes [{}, {}) live over ops {}..={}, \
                 {b} has bytes [{}, {}) live over ops {}..={}",
                a_bytes.0, a_bytes.1, a_ops.0, a_ops.1, b_bytes.0, b_bytes.1, b_ops.0, b_ops.1
            ),
            PlanError::Internal { index } => write!(
                f,
                "internal planner bug: the plan failed its own check at buffer {index}"
            ),
        }
    }
}

impl core::error::Error for PlanError {}

/// Validates the input: every alignment a power of two, every lifetime non-empty.
fn validate(buffers: &[Buffer]) -> Result<(), PlanError> {
    for (index, b) in buffers.iter().enumerate() {
        if !b.align.is_power_of_two() {
            return Err(PlanError::BadAlign {
                index,
                align: b.align,
            });
        }
        if b.first_op > b.last_op {
            return Err(PlanError::BadLifetime {
                index,
                first_op: b.first_op,
                last_op: b.last_op,
            });
        }
    }
    Ok(())
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
#[cfg(feature = "alloc")]
fn align_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// The peak, over ops, of the sum of the sizes of the buffers live at that op:
/// no valid plan has a smaller arena. Alignment padding is not counted.
///
/// Does not validate; buffers with `first_op > last_op` are never live. Saturates
/// at `usize::MAX`. `O(n log n)` with `alloc`, `O(n²)` and heap-free without.
pub fn lower_bound(buffers: &[Buffer]) -> usize {
    #[cfg(feature = "alloc")]
    {
        lower_bound_sweep(buffers)
    }
    #[cfg(not(feature = "alloc"))]
    {
        lower_bound_quadratic(buffers)
    }
}

/// Heap-free `O(n²)` [`lower_bound`]: the live set only grows at a `first_op`,
/// so the peak is reached at some buffer's `first_op`.
#[cfg_attr(feature = "alloc", allow(dead_code))]
fn lower_bound_quadratic(buffers: &[Buffer]) -> usize {
    let mut peak: u128 = 0;
    for b in buffers.iter().filter(|b| b.first_op <= b.last_op) {
        let t = b.first_op;
        let live: u128 = buffers
            .iter()
            .filter(|o| o.first_op <= t && t <= o.last_op)
            .map(|o| o.size as u128)
            .sum();
        peak = peak.max(live);
    }
    usize::try_from(peak).unwrap_or(usize::MAX)
}

/// `O(n log n)` [`lower_bound`]: sweep the starts in order, retiring buffers
/// whose `last_op` is before the current start.
#[cfg(feature = "alloc")]
fn lower_bound_sweep(buffers: &[Buffer]) -> usize {
    let live_ones = || {
        buffers
            .iter()
            .filter(|b| b.first_op <= b.last_op && b.size > 0)
    };
    let mut starts: Vec<(usize, usize)> = live_ones().map(|b| (b.first_op, b.size)).collect();
    let mut ends: Vec<(usize, usize)> = live_ones().map(|b| (b.last_op, b.size)).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    let (mut live, mut peak, mut e) = (0u128, 0u128, 0usize);
    for &(t, size) in &starts {
        while e < ends.len() && ends[e].0 < t {
            live -= ends[e].1 as u128;
            e += 1;
        }
        live += size as u128;
        peak = peak.max(live);
    }
    usize::try_from(peak).unwrap_or(usize::MAX)
}

/// Proves that `offsets` is a valid placement of `buffers` in an arena of
/// `arena_size` bytes: the input is valid (see [`plan`]), every buffer lies inside
/// `0..arena_size`, every offset is a multiple of its buffer's alignment, and no
/// two buffers that live together (intersecting op ranges) share a byte.
/// Zero-size buffers never overlap anything.
///
/// Reports the first problem found (for overlaps, one overlapping pair); a
/// [`PlanError::Overlap`] names both buffers with their byte ranges and
/// lifetimes. With `alloc`, `O(n log n + k)` where `k` is the number of pairs
/// of buffers that live together; without, heap-free and `O(n²)`.
pub fn check(buffers: &[Buffer], offsets: &[usize], arena_size: usize) -> Result<(), PlanError> {
    if buffers.len() != offsets.len() {
        return Err(PlanError::LengthMismatch {
            buffers: buffers.len(),
            offsets: offsets.len(),
        });
    }
    validate(buffers)?;
    for (index, (b, &offset)) in buffers.iter().zip(offsets).enumerate() {
        if offset & (b.align - 1) != 0 {
            return Err(PlanError::Misaligned {
                index,
                offset,
                align: b.align,
            });
        }
        let end = offset
            .checked_add(b.size)
            .ok_or(PlanError::Overflow { index })?;
        if end > arena_size {
            return Err(PlanError::OutOfArena {
                index,
                offset,
                size: b.size,
                arena_size,
            });
        }
    }
    // Every `offset + size` fits in usize: checked above.
    match overlapping_pair(buffers, offsets) {
        None => Ok(()),
        Some((a, b)) => {
            let (x, y) = (&buffers[a], &buffers[b]);
            Err(PlanError::Overlap {
                a,
                a_bytes: (offsets[a], offsets[a] + x.size),
                a_ops: (x.first_op, x.last_op),
                b,
                b_bytes: (offsets[b], offsets[b] + y.size),
                b_ops: (y.first_op, y.last_op),
            })
        }
    }
}

/// Whether two non-empty buffers that live together share bytes.
fn collide(x: &Buffer, xo: usize, y: &Buffer, yo: usize) -> bool {
    x.size > 0 && y.size > 0 && x.lives_with(y) && xo < yo + y.size && yo < xo + x.size
}

/// Some pair `(a, b)`, `a < b`, of buffers that live together and share bytes.
/// With `alloc`: sort by `first_op`, then compare each buffer only with the
/// later-starting ones that start before it ends (`O(n log n + pairs live
/// together)`). Without: all pairs, heap-free.
fn overlapping_pair(buffers: &[Buffer], offsets: &[usize]) -> Option<(usize, usize)> {
    #[cfg(feature = "alloc")]
    {
        overlapping_pair_sweep(buffers, offsets)
    }
    #[cfg(not(feature = "alloc"))]
    {
        overlapping_pair_quadratic(buffers, offsets)
    }
}

#[cfg_attr(feature = "alloc", allow(dead_code))]
fn overlapping_pair_quadratic(buffers: &[Buffer], offsets: &[usize]) -> Option<(usize, usize)> {
    for a in 0..buffers.len() {
        for b in a + 1..buffers.len() {
            if collide(&buffers[a], offsets[a], &buffers[b], offsets[b]) {
                return Some((a, b));
            }
        }
    }
    None
}

#[cfg(feature = "alloc")]
fn overlapping_pair_sweep(buffers: &[Buffer], offsets: &[usize]) -> Option<(usize, usize)> {
    let mut by_start: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].size > 0)
        .collect();
    by_start.sort_unstable_by_key(|&i| (buffers[i].first_op, i));
    for (k, &i) in by_start.iter().enumerate() {
        for &j in &by_start[k + 1..] {
            if buffers[j].first_op > buffers[i].last_op {
                break; // it and all later ones start after `i` is dead
            }
            if collide(&buffers[i], offsets[i], &buffers[j], offsets[j]) {
                return Some((i.min(j), i.max(j)));
            }
        }
    }
    None
}

/// Places `buffers` in one arena (see the [crate docs](crate) for the
/// algorithm) and returns the offsets, the arena size and the lower bound.
///
/// Errors: [`PlanError::BadAlign`] if an alignment is not a power of two,
/// [`PlanError::BadLifetime`] if `first_op > last_op`, [`PlanError::Overflow`]
/// if an offset or the arena size would not fit in `usize`. Never panics.
/// The result always passes [`check`] (verified in debug builds).
#[cfg(feature = "alloc")]
pub fn plan(buffers: &[Buffer]) -> Result<ArenaPlan, PlanError> {
    validate(buffers)?;
    let n = buffers.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by(|&i, &j| {
        let (x, y) = (&buffers[i], &buffers[j]);
        y.size
            .cmp(&x.size)
            .then(x.first_op.cmp(&y.first_op))
            .then(i.cmp(&j))
    });

    // Time index: the non-empty buffers sorted by first_op, cut into blocks
    // that remember their latest last_op. The buffers living with [f, l] are
    // in the prefix with first_op <= l, in blocks whose latest last_op >= f.
    let mut by_start: Vec<usize> = (0..n).filter(|&i| buffers[i].size > 0).collect();
    by_start.sort_unstable_by_key(|&i| (buffers[i].first_op, i));
    let block_last: Vec<usize> = by_start
        .chunks(BLOCK)
        .map(|c| c.iter().map(|&i| buffers[i].last_op).max().unwrap_or(0))
        .collect();

    let mut offsets = alloc::vec![0usize; n];
    let mut placed = alloc::vec![false; n];
    let mut near: Vec<(usize, usize)> = Vec::new(); // (offset, end) of placed neighbours
    let mut size = 0usize;
    for &index in &order {
        let b = &buffers[index];
        if b.size == 0 {
            continue; // offset 0, conflicts with nothing
        }
        let overflow = PlanError::Overflow { index };
        near.clear();
        let hi = by_start.partition_point(|&i| buffers[i].first_op <= b.last_op);
        for (k, &latest) in block_last.iter().enumerate().take(hi.div_ceil(BLOCK)) {
            if latest < b.first_op {
                continue;
            }
            for &j in &by_start[k * BLOCK..hi.min((k + 1) * BLOCK)] {
                if placed[j] && buffers[j].last_op >= b.first_op {
                    // Cannot overflow: checked when `j` was placed.
                    near.push((offsets[j], offsets[j] + buffers[j].size));
                }
            }
        }
        near.sort_unstable();
        // Invariant: no neighbour seen so far occupies any byte of
        // [candidate, candidate + size), and no aligned offset below candidate
        // is clear of them all. Neighbours come in increasing offset order, so
        // the first one starting at or after the candidate's end proves the
        // candidate clear of all the rest too.
        let mut candidate = 0usize;
        for &(start, end) in &near {
            if end <= candidate {
                continue;
            }
            if candidate.checked_add(b.size).ok_or(overflow)? <= start {
                break;
            }
            candidate = align_up(end, b.align).ok_or(overflow)?;
        }
        let end = candidate.checked_add(b.size).ok_or(overflow)?;
        offsets[index] = candidate;
        placed[index] = true;
        size = size.max(end);
    }

    let plan = ArenaPlan {
        offsets,
        size,
        lower_bound: lower_bound(buffers),
    };
    if cfg!(debug_assertions) {
        check(buffers, &plan.offsets, plan.size).map_err(|e| PlanError::Internal {
            index: e.index().unwrap_or(0),
        })?;
    }
    Ok(plan)
}

/// Block length of the time index in [`plan`].
#[cfg(feature = "alloc")]
const BLOCK: usize = 64;

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_and_reports_overflow() {
        assert_eq!(align_up(0, 8), Some(0));
        assert_eq!(align_up(1, 8), Some(8));
        assert_eq!(align_up(8, 8), Some(8));
        assert_eq!(align_up(9, 1), Some(9));
        assert_eq!(align_up(usize::MAX - 2, 4), None);
    }

    #[test]
    fn overlap_sweep_agrees_with_quadratic() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n) as usize
        };
        let mut found = 0;
        for _ in 0..2000 {
            let n = next(12);
            let bufs: Vec<Buffer> = (0..n)
                .map(|_| {
                    let a = next(10);
                    Buffer::new(next(20), 1, a, a + next(4))
                })
                .collect();
            let offs: Vec<usize> = (0..n).map(|_| next(60)).collect();
            let q = overlapping_pair_quadratic(&bufs, &offs);
            let w = overlapping_pair_sweep(&bufs, &offs);
            assert_eq!(q.is_some(), w.is_some(), "{bufs:?} {offs:?}");
            for (a, b) in q.into_iter().chain(w) {
                assert!(a < b && collide(&bufs[a], offs[a], &bufs[b], offs[b]));
                found += 1;
            }
        }
        assert!(
            found > 100,
            "too few overlapping instances to mean much: {found}"
        );
    }

    #[test]
    fn lower_bound_sweep_matches_quadratic() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..500 {
            let n = (next() % 40) as usize;
            let bufs: Vec<Buffer> = (0..n)
                .map(|_| {
                    let a = (next() % 20) as usize;
                    let b = (next() % 20) as usize;
                    // Some reversed lifetimes on purpose: both must ignore them.
                    Buffer::new((next() % 100) as usize, 1, a, b)
                })
                .collect();
            assert_eq!(lower_bound_sweep(&bufs), lower_bound_quadratic(&bufs));
        }
        let huge = [Buffer::new(usize::MAX, 1, 0, 1), Buffer::new(5, 1, 1, 2)];
        assert_eq!(lower_bound_sweep(&huge), usize::MAX);
        assert_eq!(lower_bound_quadratic(&huge), usize::MAX);
    }
}
