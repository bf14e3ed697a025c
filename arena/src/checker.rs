//! The checker: input validation, and the proof that a placement is valid.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

use crate::error::PlanError;
use crate::types::Buffer;

/// Validates the input: every alignment a power of two, every lifetime non-empty.
pub(crate) fn validate(buffers: &[Buffer]) -> Result<(), PlanError> {
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
///
/// [`plan`]: crate::plan
pub fn check(buffers: &[Buffer], offsets: &[usize], arena_size: usize) -> Result<(), PlanError> {
    check_allowing(buffers, offsets, arena_size, |_, _| false)
}

/// [`check`], except that overlapping pairs `(a, b)` with `allowed(a, b)` pass.
pub(crate) fn check_allowing(
    buffers: &[Buffer],
    offsets: &[usize],
    arena_size: usize,
    allowed: impl Fn(usize, usize) -> bool,
) -> Result<(), PlanError> {
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
    match overlapping_pair(buffers, offsets, allowed) {
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
pub(crate) fn collide(x: &Buffer, xo: usize, y: &Buffer, yo: usize) -> bool {
    x.size > 0 && y.size > 0 && x.lives_with(y) && xo < yo + y.size && yo < xo + x.size
}

/// Some pair `(a, b)`, `a < b`, of buffers that live together and share bytes.
/// With `alloc`: sort by `first_op`, then compare each buffer only with the
/// later-starting ones that start before it ends (`O(n log n + pairs live
/// together)`). Without: all pairs, heap-free.
/// Pairs with `allowed(a, b)` (`a < b`) are skipped.
fn overlapping_pair(
    buffers: &[Buffer],
    offsets: &[usize],
    allowed: impl Fn(usize, usize) -> bool,
) -> Option<(usize, usize)> {
    #[cfg(feature = "alloc")]
    {
        overlapping_pair_sweep(buffers, offsets, allowed)
    }
    #[cfg(not(feature = "alloc"))]
    {
        overlapping_pair_quadratic(buffers, offsets, allowed)
    }
}

#[cfg_attr(feature = "alloc", allow(dead_code))]
pub(crate) fn overlapping_pair_quadratic(
    buffers: &[Buffer],
    offsets: &[usize],
    allowed: impl Fn(usize, usize) -> bool,
) -> Option<(usize, usize)> {
    for a in 0..buffers.len() {
        for b in a + 1..buffers.len() {
            if collide(&buffers[a], offsets[a], &buffers[b], offsets[b]) && !allowed(a, b) {
                return Some((a, b));
            }
        }
    }
    None
}

#[cfg(feature = "alloc")]
pub(crate) fn overlapping_pair_sweep(
    buffers: &[Buffer],
    offsets: &[usize],
    allowed: impl Fn(usize, usize) -> bool,
) -> Option<(usize, usize)> {
    let mut by_start: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].size > 0)
        .collect();
    by_start.sort_unstable_by_key(|&i| (buffers[i].first_op, i));
    for (k, &i) in by_start.iter().enumerate() {
        for &j in &by_start[k + 1..] {
            if buffers[j].first_op > buffers[i].last_op {
                break; // it and all later ones start after `i` is dead
            }
            let (a, b) = (i.min(j), i.max(j));
            if collide(&buffers[i], offsets[i], &buffers[j], offsets[j]) && !allowed(a, b) {
                return Some((a, b));
            }
        }
    }
    None
}
