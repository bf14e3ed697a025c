//! The planner's input, [`Buffer`], and its result, [`ArenaPlan`].

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

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

/// The result of [`plan`] (or [`plan_with_inplace`]).
///
/// [`plan`]: crate::plan
/// [`plan_with_inplace`]: crate::plan_with_inplace
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// `offsets[i]` is the byte offset of buffer `i` in the arena.
    pub offsets: Vec<usize>,
    /// Arena size in bytes: the maximum of `offset + size` over all buffers (0 if none).
    pub size: usize,
    /// [`lower_bound`] of the same buffers: no valid plan is smaller than this.
    ///
    /// [`lower_bound`]: crate::lower_bound
    pub lower_bound: usize,
}

#[cfg(feature = "alloc")]
impl ArenaPlan {
    /// How far the plan is from the bound: `size / lower_bound` (1.0 when the
    /// bound is 0). Always >= 1.0; 1.0 means no plan can be smaller.
    pub fn ratio(&self) -> f64 {
        if self.lower_bound == 0 {
            1.0
        } else {
            self.size as f64 / self.lower_bound as f64
        }
    }
}
