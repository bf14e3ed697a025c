//! Enumerating the buffers that live together with one buffer: a heap-free
//! time index ([`BlockIndex`]) and, with `alloc`, neighbour lists ([`Adjacency`]).

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

use crate::types::Buffer;

/// Block length of the time index used by [`plan_into`] (and by [`plan`] when
/// the buffers have too many pairs living together for a neighbour list).
///
/// [`plan_into`]: crate::plan_into
/// [`plan`]: crate::plan
pub(crate) const BLOCK: usize = 64;

/// A way to enumerate the non-empty buffers that live together with one buffer.
pub(crate) trait Neighbours {
    /// Calls `f(j)` for every non-empty `j != i` whose lifetime meets `i`'s
    /// (each exactly once, in any order).
    fn each(&self, buffers: &[Buffer], i: usize, f: impl FnMut(usize));
}

/// Time index: the non-empty buffers sorted by `first_op`, cut into blocks of
/// [`BLOCK`] that remember their latest `last_op`. The buffers living with
/// `[f, l]` are in the prefix with `first_op <= l`, in blocks whose latest
/// `last_op >= f`. Heap-free.
pub(crate) struct BlockIndex<'a> {
    pub(crate) by_start: &'a [usize],
    pub(crate) block_last: &'a [usize],
}

impl Neighbours for BlockIndex<'_> {
    fn each(&self, buffers: &[Buffer], i: usize, mut f: impl FnMut(usize)) {
        let b = &buffers[i];
        let hi = self
            .by_start
            .partition_point(|&j| buffers[j].first_op <= b.last_op);
        for (k, &latest) in self.block_last.iter().enumerate().take(hi.div_ceil(BLOCK)) {
            if latest < b.first_op {
                continue;
            }
            for &j in &self.by_start[k * BLOCK..hi.min((k + 1) * BLOCK)] {
                if j != i && buffers[j].last_op >= b.first_op {
                    f(j);
                }
            }
        }
    }
}

/// Fills `by_start` (length = number of non-empty buffers) and `block_last`.
pub(crate) fn build_block_index(
    buffers: &[Buffer],
    by_start: &mut [usize],
    block_last: &mut [usize],
) {
    let mut k = 0;
    for (i, b) in buffers.iter().enumerate() {
        if b.size > 0 {
            by_start[k] = i;
            k += 1;
        }
    }
    by_start.sort_unstable_by_key(|&i| (buffers[i].first_op, i));
    for (slot, c) in block_last.iter_mut().zip(by_start.chunks(BLOCK)) {
        *slot = c.iter().map(|&i| buffers[i].last_op).max().unwrap_or(0);
    }
}

/// Neighbour lists (compressed rows): `list[start[i]..start[i + 1]]` are the
/// non-empty buffers living with `i`. Built once, shared by all passes.
#[cfg(feature = "alloc")]
pub(crate) struct Adjacency {
    start: Vec<usize>,
    list: Vec<usize>,
}

#[cfg(feature = "alloc")]
impl Neighbours for Adjacency {
    fn each(&self, _: &[Buffer], i: usize, f: impl FnMut(usize)) {
        self.list[self.start[i]..self.start[i + 1]]
            .iter()
            .copied()
            .for_each(f);
    }
}

#[cfg(feature = "alloc")]
impl Adjacency {
    /// The neighbour lists, or `None` when there are more than `cap` pairs of
    /// buffers living together (`by_start` as from [`build_block_index`]).
    pub(crate) fn build(buffers: &[Buffer], by_start: &[usize], cap: usize) -> Option<Self> {
        let pairs = || {
            by_start.iter().enumerate().flat_map(move |(k, &i)| {
                by_start[k + 1..]
                    .iter()
                    .take_while(move |&&j| buffers[j].first_op <= buffers[i].last_op)
                    .map(move |&j| (i, j))
            })
        };
        let mut start = alloc::vec![0usize; buffers.len() + 1];
        let mut count = 0usize;
        for (i, j) in pairs() {
            count += 1;
            if count > cap {
                return None;
            }
            start[i + 1] += 1;
            start[j + 1] += 1;
        }
        for k in 1..start.len() {
            start[k] += start[k - 1];
        }
        let mut fill = start.clone();
        let mut list = alloc::vec![0usize; 2 * count];
        for (i, j) in pairs() {
            list[fill[i]] = j;
            fill[i] += 1;
            list[fill[j]] = i;
            fill[j] += 1;
        }
        Some(Self { start, list })
    }
}
