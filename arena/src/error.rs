//! [`PlanError`]: what is wrong with a buffer list or a plan.

use core::fmt;

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
    /// [`check`] or [`plan_into`] was given a different number of offsets than
    /// buffers.
    ///
    /// [`check`]: crate::check
    /// [`plan_into`]: crate::plan_into
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
    ///
    /// [`check`]: crate::check
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
