//! How a session splits the rest of a cached prompt into runs so that its logits are a fresh
//! session's bit for bit: a one-token run takes the decode graph, whose sums are added in
//! another order than the prompt graph's (as llama.cpp's one-token and batch paths do), while
//! runs of several tokens give the same bits however they are split.

/// Whether a fresh session's last chunk of a prompt of `len` tokens is a single token (run by
/// the decode graph).
pub(super) fn final_chunk_is_single(len: usize, ubatch: usize) -> bool {
    ubatch == 1 || len % ubatch == 1
}

/// Whether re-running the last `rest` tokens of a prompt of `len` can give a fresh session's
/// bits: every chunk but a fresh session's single last token must have two or more tokens.
pub(super) fn rerun_matches_fresh(rest: usize, len: usize, ubatch: usize) -> bool {
    if ubatch == 1 {
        return true;
    }
    let body = rest - usize::from(final_chunk_is_single(len, ubatch));
    match body {
        0 => true,
        1 => false,
        _ => ubatch > 2 || body.is_multiple_of(2),
    }
}

/// The next chunk of `rest` tokens: whole ubatches, never a single token (a remainder of one
/// is balanced as ubatch - 1 and 2), except the last token alone when `final_single`.
pub(super) fn exact_chunk(rest: usize, final_single: bool, ubatch: usize) -> usize {
    if ubatch <= 2 {
        return rest.min(ubatch);
    }
    let body = rest - usize::from(final_single && rest > 0);
    if body == 0 {
        1
    } else if body <= ubatch {
        body
    } else if body - ubatch == 1 {
        ubatch - 1
    } else {
        ubatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks of `rest` tokens, as the session runs them.
    fn chunks(rest: usize, len: usize, ubatch: usize) -> Vec<usize> {
        let fs = final_chunk_is_single(len, ubatch);
        let mut out = Vec::new();
        let mut left = rest;
        while left > 0 {
            let n = exact_chunk(left, fs, ubatch);
            out.push(n);
            left -= n;
        }
        out
    }

    #[test]
    fn reruns_have_no_single_token_chunk_but_a_fresh_sessions() {
        for ubatch in 1..=9 {
            for len in 1..=40 {
                let fs = final_chunk_is_single(len, ubatch);
                for rest in 1..=len {
                    if !rerun_matches_fresh(rest, len, ubatch) {
                        continue;
                    }
                    let c = chunks(rest, len, ubatch);
                    assert_eq!(c.iter().sum::<usize>(), rest);
                    assert!(c.iter().all(|&n| n >= 1 && n <= ubatch), "{c:?}");
                    if ubatch > 1 {
                        let (last, body) = c.split_last().unwrap();
                        assert!(body.iter().all(|&n| n >= 2), "{ubatch} {len} {rest}: {c:?}");
                        assert_eq!(*last == 1, fs, "{ubatch} {len} {rest}: {c:?}");
                    }
                }
                // Re-running the whole prompt always works, and so does a rest of at most 3.
                assert!(rerun_matches_fresh(len, len, ubatch) || ubatch == 2);
                assert!((1..=3.min(len)).any(|r| rerun_matches_fresh(r, len, ubatch)));
            }
        }
    }
}
