//! The greedy planner: the passes of [`plan_into`] and [`plan`].

use crate::bound::lower_bound_sorted;
#[cfg(feature = "alloc")]
use crate::checker::check;
use crate::checker::validate;
use crate::error::PlanError;
#[cfg(feature = "alloc")]
use crate::neighbours::Adjacency;
use crate::neighbours::{build_block_index, BlockIndex, Neighbours, BLOCK};
#[cfg(feature = "alloc")]
use crate::types::ArenaPlan;
use crate::types::Buffer;

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Marks a buffer that the current pass has not placed yet. A placed non-empty
/// buffer ends at or below `usize::MAX`, so it never starts there.
const UNPLACED: usize = usize::MAX;

/// Above this many buffers the best-fit passes are skipped: they sort every
/// buffer's neighbours and rarely gain much (about 0.1% of arena on average
/// on random instances), while large graphs should still plan in milliseconds.
const BEST_FIT_MAX: usize = 4096;

/// The order in which a pass takes the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Largest first (TFLite Micro's greedy by size).
    Size,
    /// Longest lifetime first, then largest.
    Lifetime,
    /// Earliest `first_op` first, then largest (execution order).
    FirstOp,
    /// Largest `size × lifetime` first (the area in the time × bytes plane).
    Area,
}

/// Where a pass puts a buffer among its placed neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// The lowest aligned offset where it fits.
    Lowest,
    /// The smallest free gap it fits in (lowest on ties), else on top.
    Best,
}

/// The passes [`plan`] and [`plan_into`] run, in order. The first is the
/// historical greedy by size; a later pass wins only with a strictly smaller arena.
const HEURISTICS: [(Order, Fit); 8] = [
    (Order::Size, Fit::Lowest),
    (Order::Size, Fit::Best),
    (Order::Lifetime, Fit::Lowest),
    (Order::Lifetime, Fit::Best),
    (Order::FirstOp, Fit::Lowest),
    (Order::FirstOp, Fit::Best),
    (Order::Area, Fit::Lowest),
    (Order::Area, Fit::Best),
];

/// Sorts `order` (any permutation of `0..buffers.len()`) into the pass order.
/// Every key ends with the index, so the order is a pure function of the input.
fn sort_order(buffers: &[Buffer], order: &mut [usize], how: Order) {
    use core::cmp::Reverse;
    let len = |b: &Buffer| b.last_op - b.first_op;
    match how {
        Order::Size => order.sort_unstable_by_key(|&i| {
            let b = &buffers[i];
            (Reverse(b.size), b.first_op, i)
        }),
        Order::Lifetime => order.sort_unstable_by_key(|&i| {
            let b = &buffers[i];
            (Reverse(len(b)), Reverse(b.size), b.first_op, i)
        }),
        Order::FirstOp => order.sort_unstable_by_key(|&i| {
            let b = &buffers[i];
            (b.first_op, Reverse(b.size), i)
        }),
        Order::Area => order.sort_unstable_by_key(|&i| {
            let b = &buffers[i];
            let area = b.size as u128 * (len(b) as u128 + 1);
            (Reverse(area), Reverse(b.size), b.first_op, i)
        }),
    }
}

/// One pass: places the buffers in `order` with `fit`, writing `offs`
/// (zero-size buffers at 0). Gives up with `Ok(None)` as soon as the arena
/// would reach `give_up` bytes (if given). `near` needs `buffers.len()` slots.
fn place(
    buffers: &[Buffer],
    order: &[usize],
    fit: Fit,
    nb: &impl Neighbours,
    offs: &mut [usize],
    near: &mut [usize],
    give_up: Option<usize>,
) -> Result<Option<usize>, PlanError> {
    for (o, b) in offs.iter_mut().zip(buffers) {
        *o = if b.size == 0 { 0 } else { UNPLACED };
    }
    let mut size = 0usize;
    for &index in order {
        let b = &buffers[index];
        if b.size == 0 {
            continue; // offset 0, conflicts with nothing
        }
        let overflow = PlanError::Overflow { index };
        let mut k = 0;
        // Branch-free: about half the neighbours are not placed yet, which
        // a branch would mispredict.
        nb.each(buffers, index, |j| {
            near[k] = j;
            k += usize::from(offs[j] != UNPLACED);
        });
        let near = &mut near[..k];
        let at = match fit {
            Fit::Lowest => lowest_fit(buffers, offs, near, b),
            Fit::Best => best_fit(buffers, offs, near, b),
        }
        .ok_or(overflow)?;
        let end = at.checked_add(b.size).ok_or(overflow)?;
        size = size.max(end);
        if give_up.is_some_and(|g| size >= g) {
            return Ok(None);
        }
        offs[index] = at;
    }
    Ok(Some(size))
}

/// The lowest aligned offset where `b` is clear of the placed neighbours
/// `near` (`None` on overflow). Needs no sorting: whatever offset is tried,
/// any clear offset at or above it is also at or above the end of every
/// neighbour it collides with, so jump past the highest such end and retry.
fn lowest_fit(buffers: &[Buffer], offs: &[usize], near: &[usize], b: &Buffer) -> Option<usize> {
    let mut at = 0usize;
    loop {
        let end = at.checked_add(b.size)?;
        let mut past = at;
        for &j in near {
            // Neighbours never overflow: checked when they were placed.
            let (s, e) = (offs[j], offs[j] + buffers[j].size);
            if s < end && at < e {
                past = past.max(e);
            }
        }
        if past == at {
            return Some(at);
        }
        at = align_up(past, b.align)?;
    }
}

/// The lowest aligned offset in the smallest free gap between the placed
/// neighbours `near` where `b` fits, or above them all (`None` on overflow).
/// Sorts `near` by offset.
fn best_fit(buffers: &[Buffer], offs: &[usize], near: &mut [usize], b: &Buffer) -> Option<usize> {
    near.sort_unstable_by_key(|&j| offs[j]);
    // Sweep by offset; `top` is the highest end so far, so [top, start) of
    // the next neighbour is free.
    let mut top = 0usize;
    let mut best: Option<(usize, usize)> = None; // (gap length, offset)
    for &j in near.iter() {
        let (start, end) = (offs[j], offs[j] + buffers[j].size);
        if start > top {
            if let Some(at) = align_up(top, b.align) {
                let gap = start - top;
                if at.checked_add(b.size).is_some_and(|e| e <= start)
                    && best.is_none_or(|(g, _)| gap < g)
                {
                    best = Some((gap, at));
                }
            }
        }
        top = top.max(end);
    }
    match best {
        Some((_, at)) => Some(at),
        None => align_up(top, b.align),
    }
}

/// Runs every pass of [`HEURISTICS`] and keeps the smallest arena in `offsets`
/// (ties: the earlier pass). Stops early once a pass reaches `bound`.
#[allow(clippy::too_many_arguments)]
fn plan_passes(
    buffers: &[Buffer],
    nb: &impl Neighbours,
    bound: usize,
    offsets: &mut [usize],
    order: &mut [usize],
    cand: &mut [usize],
    near: &mut [usize],
) -> Result<usize, PlanError> {
    let mut best = usize::MAX;
    let best_fit_too = buffers.len() <= BEST_FIT_MAX;
    for (k, &(how, fit)) in HEURISTICS.iter().enumerate() {
        if k > 0 && best <= bound {
            break; // cannot do better than the bound
        }
        if fit == Fit::Best && !best_fit_too {
            continue;
        }
        if k == 0 || HEURISTICS[k - 1].0 != how {
            for (i, o) in order.iter_mut().enumerate() {
                *o = i;
            }
            sort_order(buffers, order, how);
        }
        // The first pass never gives up, so its errors are the real ones; a
        // later pass that overflows was bigger than the first anyway.
        let give_up = if k == 0 { None } else { Some(best) };
        let size = match place(buffers, order, fit, nb, cand, near, give_up) {
            Ok(Some(size)) => size,
            Ok(None) => continue,
            Err(e) if k == 0 => return Err(e),
            Err(_) => continue,
        };
        if k == 0 || size < best {
            best = size;
            offsets.copy_from_slice(cand);
        }
    }
    Ok(best)
}

/// Length of the `scratch` slice [`plan_into`] needs for `n` buffers:
/// `4n + ⌈n / 64⌉` words.
pub const fn scratch_len(n: usize) -> usize {
    4 * n + n.div_ceil(BLOCK)
}

/// Heap-free [`plan`]: places `buffers`, writes the offsets into `offsets`
/// (same length as `buffers`) and returns the arena size. `scratch` must hold
/// at least [`scratch_len`]`(buffers.len())` words; its contents on return are
/// unspecified. Available without the `alloc` feature (`no_std`, no heap).
///
/// Runs the same heuristics as [`plan`] and gives exactly the same offsets
/// and size (it finds neighbours in time through a block index instead of
/// neighbour lists, which does not change the result).
///
/// Errors: as [`plan`], plus [`PlanError::LengthMismatch`] if
/// `offsets.len() != buffers.len()`. On error `offsets` is unspecified.
///
/// # Panics
///
/// If `scratch.len() < scratch_len(buffers.len())`.
pub fn plan_into(
    buffers: &[Buffer],
    offsets: &mut [usize],
    scratch: &mut [usize],
) -> Result<usize, PlanError> {
    let n = buffers.len();
    if offsets.len() != n {
        return Err(PlanError::LengthMismatch {
            buffers: n,
            offsets: offsets.len(),
        });
    }
    validate(buffers)?;
    assert!(
        scratch.len() >= scratch_len(n),
        "edge_arena::plan_into: scratch holds {} words, {} needed",
        scratch.len(),
        scratch_len(n)
    );
    let nonempty = buffers.iter().filter(|b| b.size > 0).count();
    let (order, rest) = scratch.split_at_mut(n);
    let (cand, rest) = rest.split_at_mut(n);
    let (near, rest) = rest.split_at_mut(n);
    let (by_start, rest) = rest.split_at_mut(n);
    let block_last = &mut rest[..n.div_ceil(BLOCK)];
    let by_start = &mut by_start[..nonempty];
    build_block_index(buffers, by_start, block_last);
    let bound = lower_bound_sorted(buffers, by_start, near);
    let nb = BlockIndex {
        by_start,
        block_last,
    };
    plan_passes(buffers, &nb, bound, offsets, order, cand, near)
}

/// Places `buffers` in one arena (see the [crate docs](crate) for the
/// heuristics) and returns the offsets, the arena size and the lower bound.
///
/// Errors: [`PlanError::BadAlign`] if an alignment is not a power of two,
/// [`PlanError::BadLifetime`] if `first_op > last_op`, [`PlanError::Overflow`]
/// if an offset or the arena size would not fit in `usize`. Never panics.
/// The result always passes [`check`] (verified in debug builds).
#[cfg(feature = "alloc")]
pub fn plan(buffers: &[Buffer]) -> Result<ArenaPlan, PlanError> {
    validate(buffers)?;
    let n = buffers.len();
    let mut by_start = alloc::vec![0usize; buffers.iter().filter(|b| b.size > 0).count()];
    let mut block_last = alloc::vec![0usize; n.div_ceil(BLOCK)];
    build_block_index(buffers, &mut by_start, &mut block_last);
    let mut offsets = alloc::vec![0usize; n];
    let mut order = alloc::vec![0usize; n];
    let mut cand = alloc::vec![0usize; n];
    let mut near = alloc::vec![0usize; n];
    let bound = lower_bound_sorted(buffers, &by_start, &mut near);
    // Neighbour lists make every pass O(k log k) per buffer; fall back to the
    // block index when they would be huge (everything living together).
    let size = match Adjacency::build(buffers, &by_start, 32 * n + (1 << 20)) {
        Some(adj) => plan_passes(
            buffers,
            &adj,
            bound,
            &mut offsets,
            &mut order,
            &mut cand,
            &mut near,
        )?,
        None => {
            let nb = BlockIndex {
                by_start: &by_start,
                block_last: &block_last,
            };
            plan_passes(
                buffers,
                &nb,
                bound,
                &mut offsets,
                &mut order,
                &mut cand,
                &mut near,
            )?
        }
    };
    let plan = ArenaPlan {
        offsets,
        size,
        lower_bound: bound,
    };
    if cfg!(debug_assertions) {
        check(buffers, &plan.offsets, plan.size).map_err(|e| PlanError::Internal {
            index: e.index().unwrap_or(0),
        })?;
    }
    Ok(plan)
}
