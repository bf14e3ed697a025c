//! In-place reuse: planning and checking with `(out, input)` pairs that may
//! share bytes.

use alloc::vec::Vec;

use crate::checker::{check_allowing, validate};
use crate::error::PlanError;
use crate::planner::plan;
use crate::types::{ArenaPlan, Buffer};

/// Marks "no alias" in the tables of [`accepted_aliases`].
#[cfg(feature = "alloc")]
const NONE: usize = usize::MAX;

/// The in-place pairs of [`plan_with_inplace`] that qualify, as `alias_of[out]
/// = input` (or [`NONE`]). Taken in the given order; a pair is skipped when an
/// index is out of range or equal, `input.last_op != out.first_op`, `out` is
/// empty or bigger than `input`, `out.align > input.align`, `input` is already
/// reused or `out` already reuses, or the middle buffer of a chain `a -> b ->
/// c` would live a single op (then `a` and `c` would live together).
#[cfg(feature = "alloc")]
fn accepted_aliases(buffers: &[Buffer], inplace: &[(usize, usize)]) -> Vec<usize> {
    let n = buffers.len();
    let mut alias_of = alloc::vec![NONE; n];
    let mut reused_by = alloc::vec![NONE; n];
    for &(out, input) in inplace {
        if out >= n || input >= n || out == input {
            continue;
        }
        let (o, i) = (&buffers[out], &buffers[input]);
        let single = |b: &Buffer| b.first_op == b.last_op;
        let ok = i.last_op == o.first_op
            && o.size > 0
            && o.size <= i.size
            && o.align <= i.align
            && alias_of[out] == NONE
            && reused_by[input] == NONE
            && !(alias_of[input] != NONE && single(i))
            && !(reused_by[out] != NONE && single(o));
        if ok {
            alias_of[out] = input;
            reused_by[input] = out;
        }
    }
    alias_of
}

/// [`plan`] with in-place reuse: each `(out, input)` in `inplace` allows
/// buffer `out` to take exactly the bytes of buffer `input` (an elementwise op
/// writing its result over an input that dies at that op).
///
/// A pair is used when `input.last_op == out.first_op` (the op that reads
/// `input` for the last time writes `out`), `0 < out.size <= input.size` and
/// `out.align <= input.align` (alignments are powers of two, so `input`'s
/// offset suits `out`). Pairs that do not qualify are ignored and the two
/// buffers planned apart, as are pairs that would reuse a buffer twice (the
/// first one wins) and chains `a -> b -> c` through a `b` that lives a single
/// op. Chains through longer-lived buffers are fine: the whole chain gets one
/// offset.
///
/// Every chain of aliased buffers is planned as one buffer of its first
/// member's size and alignment, live from its first `first_op` to its last
/// `last_op`. The returned `lower_bound` is the [`lower_bound`] of those
/// merged buffers: no plan that uses the same aliases is smaller.
///
/// The result passes [`check_with_inplace`] with the same pairs (verified in
/// debug builds). Errors as [`plan`], naming indices of `buffers`.
///
/// [`lower_bound`]: crate::lower_bound
#[cfg(feature = "alloc")]
pub fn plan_with_inplace(
    buffers: &[Buffer],
    inplace: &[(usize, usize)],
) -> Result<ArenaPlan, PlanError> {
    validate(buffers)?;
    let alias_of = accepted_aliases(buffers, inplace);
    let n = buffers.len();
    let mut reused_by = alloc::vec![NONE; n];
    for (out, &input) in alias_of.iter().enumerate() {
        if input != NONE {
            reused_by[input] = out;
        }
    }
    // One merged buffer per chain root (a buffer that reuses nothing).
    let mut group = alloc::vec![0usize; n];
    let mut roots = Vec::new();
    let mut merged = Vec::new();
    for root in (0..n).filter(|&i| alias_of[i] == NONE) {
        let mut m = buffers[root];
        let mut k = root;
        loop {
            group[k] = merged.len();
            m.last_op = m.last_op.max(buffers[k].last_op);
            if reused_by[k] == NONE {
                break;
            }
            k = reused_by[k];
        }
        roots.push(root);
        merged.push(m);
    }
    let to_root = |e: PlanError| match e {
        PlanError::Overflow { index } => PlanError::Overflow {
            index: roots[index],
        },
        PlanError::Internal { index } => PlanError::Internal {
            index: roots[index],
        },
        other => other,
    };
    let p = plan(&merged).map_err(to_root)?;
    let plan = ArenaPlan {
        offsets: group.iter().map(|&g| p.offsets[g]).collect(),
        size: p.size,
        lower_bound: p.lower_bound,
    };
    if cfg!(debug_assertions) {
        check_with_inplace(buffers, &plan.offsets, plan.size, inplace).map_err(|e| {
            PlanError::Internal {
                index: e.index().unwrap_or(0),
            }
        })?;
    }
    Ok(plan)
}

/// [`check`] for plans made with in-place reuse: a pair `(out, input)` of
/// `inplace` that qualifies (see [`plan_with_inplace`]; the same pairs are
/// skipped) may overlap, but only exactly: at the same offset. Any other
/// overlap of buffers that live together is reported as by [`check`].
///
/// [`check`]: crate::check
#[cfg(feature = "alloc")]
pub fn check_with_inplace(
    buffers: &[Buffer],
    offsets: &[usize],
    arena_size: usize,
    inplace: &[(usize, usize)],
) -> Result<(), PlanError> {
    if buffers.len() != offsets.len() {
        return Err(PlanError::LengthMismatch {
            buffers: buffers.len(),
            offsets: offsets.len(),
        });
    }
    validate(buffers)?;
    let alias_of = accepted_aliases(buffers, inplace);
    check_allowing(buffers, offsets, arena_size, |a, b| {
        offsets[a] == offsets[b] && (alias_of[a] == b || alias_of[b] == a)
    })
}
