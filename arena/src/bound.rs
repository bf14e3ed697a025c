//! The lower bound on the arena size: the peak of the live bytes over ops.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

use crate::types::Buffer;

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
pub(crate) fn lower_bound_quadratic(buffers: &[Buffer]) -> usize {
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
pub(crate) fn lower_bound_sweep(buffers: &[Buffer]) -> usize {
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

/// [`lower_bound`] from `by_start` (the non-empty buffers sorted by
/// `first_op`), using `ends` (at least as long) as scratch.
pub(crate) fn lower_bound_sorted(
    buffers: &[Buffer],
    by_start: &[usize],
    ends: &mut [usize],
) -> usize {
    let ends = &mut ends[..by_start.len()];
    ends.copy_from_slice(by_start);
    ends.sort_unstable_by_key(|&i| buffers[i].last_op);
    let (mut live, mut peak, mut e) = (0u128, 0u128, 0usize);
    for &i in by_start {
        let t = buffers[i].first_op;
        while e < ends.len() && buffers[ends[e]].last_op < t {
            live -= buffers[ends[e]].size as u128;
            e += 1;
        }
        live += buffers[i].size as u128;
        peak = peak.max(live);
    }
    usize::try_from(peak).unwrap_or(usize::MAX)
}
