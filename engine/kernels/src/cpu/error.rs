//! [`KernelError`], what the kernel entry points reject, and the row-size checks that produce it
//! (a leaf: only the dispatch in `mod.rs` uses it).

use std::ops::Range;

use edge_gguf::GgmlType;

/// What a kernel entry point rejects. The library never panics on these; callers get the reason.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The type has no kernel for this operation (e.g. quantizing into a type that only weights use).
    #[error("{op}: type {ty} is not supported")]
    Unsupported {
        /// The operation asked for.
        op: &'static str,
        /// The type it was asked for.
        ty: GgmlType,
    },
    /// The element count is not a whole number of blocks of the type.
    #[error("{op}: {n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        /// The operation asked for.
        op: &'static str,
        /// The type.
        ty: GgmlType,
        /// The element count.
        n: usize,
        /// The type's block size.
        block: usize,
    },
    /// A byte buffer is shorter than `n` elements of the type need.
    #[error("{op}: {n} elements of {ty} need {need} bytes, the buffer has {have}")]
    BufferTooSmall {
        /// The operation asked for.
        op: &'static str,
        /// The type.
        ty: GgmlType,
        /// The element count.
        n: usize,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Bytes of `n` elements of `ty`, or the error naming why there is no such row.
fn row_bytes_checked(op: &'static str, ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    if !ty.is_supported() {
        return Err(KernelError::Unsupported { op, ty });
    }
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(KernelError::NotBlockMultiple { op, ty, n, block });
    }
    Ok(n / block * ty.block_bytes())
}

/// For a matrix `w` of `w_ty` rows of `n` elements: the bytes of one weight row and of one
/// activation row (`w_ty.vec_dot_type()`), and the rows `rows` of `w`. Panics naming the problem if
/// there is no such row or `w` is too short (the executor sizes both from the validated model,
/// so these are bugs).
pub(super) fn matrix_rows<'w>(
    w_ty: GgmlType,
    n: usize,
    w: &'w [u8],
    rows: &Range<usize>,
) -> (usize, usize, &'w [u8]) {
    let rb = row_bytes_checked("matvec", w_ty, n).unwrap_or_else(|e| panic!("{e}"));
    let xb = row_bytes_checked("matvec", w_ty.vec_dot_type(), n).unwrap_or_else(|e| panic!("{e}"));
    assert!(w.len() >= rows.end * rb, "matvec: weight matrix too short");
    (rb, xb, &w[rows.start * rb..rows.end * rb])
}

/// Bytes of `n` elements of `ty`, if a buffer of `have` bytes holds them; else the error.
pub(super) fn check_len(
    op: &'static str,
    ty: GgmlType,
    n: usize,
    have: usize,
) -> Result<usize, KernelError> {
    let need = row_bytes_checked(op, ty, n)?;
    if have < need {
        return Err(KernelError::BufferTooSmall {
            op,
            ty,
            n,
            need,
            have,
        });
    }
    Ok(need)
}
