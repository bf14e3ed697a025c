//! How the executor's threads share the matmuls that are not claimed in chunks: by their
//! measured speeds (`edge_kernels::balance`), one set of weights for decode runs and one for
//! prefill runs.

use edge_kernels::balance::ShareBalance;

/// Which of `[decode, prefill]` a run of `tokens` tokens is: decode takes as many tokens as
/// the one-token kernels take together (a session's step, or the steps of sessions decoding
/// together).
pub(super) fn run_phase(tokens: usize) -> usize {
    usize::from(tokens > edge_kernels::cpu::MATVEC_TOKENS)
}

/// The matmuls' share weights: adapted to the threads' speeds, or fixed by
/// `EDGE_RUN_SHARE_WEIGHTS` (comma-separated, relative to an equal share, repeated over the
/// threads; e.g. `0.25,1.75`), for tests that the cut never changes a result and for
/// comparisons.
pub(super) fn share_balance(n_threads: usize) -> ShareBalance {
    let Ok(given) = std::env::var("EDGE_RUN_SHARE_WEIGHTS") else {
        return ShareBalance::new(n_threads);
    };
    let weights: Option<Vec<f32>> = given
        .split(',')
        .map(|w| {
            w.trim()
                .parse()
                .ok()
                .filter(|x: &f32| x.is_finite() && *x > 0.0)
        })
        .collect();
    match weights {
        Some(w) => ShareBalance::pinned(n_threads, &w),
        None => {
            log::warn!(
                "EDGE_RUN_SHARE_WEIGHTS={given:?} is not a list of positive numbers (e.g. \
                 0.25,1.75): adapting the shares to the threads' speeds instead"
            );
            ShareBalance::new(n_threads)
        }
    }
}
