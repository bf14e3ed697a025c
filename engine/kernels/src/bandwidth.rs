//! Memory read bandwidth, measured the way decoding reads weights: given byte regions (a
//! model's mapped weights), every thread streams its share once. Decoding a token reads each
//! matmul weight once, so `bandwidth / bytes per token` is the decode speed memory allows.

use std::time::Instant;

/// Sum of the little-endian u64 words of `bytes` (plus the tail bytes): a pure streaming read
/// the compiler vectorizes, whose result keeps it from being optimized away.
fn stream_sum(bytes: &[u8]) -> u64 {
    let (head, words, tail) = bytemuck::pod_align_to::<u8, u64>(bytes);
    let mut acc = [0u64; 4];
    for c in words.chunks_exact(4) {
        for (a, w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*w);
        }
    }
    let rest = words.chunks_exact(4).remainder();
    let bytes_sum = head.iter().chain(tail).map(|&b| u64::from(b));
    acc.iter()
        .chain(rest)
        .copied()
        .chain(bytes_sum)
        .fold(0u64, u64::wrapping_add)
}

/// Best read bandwidth (bytes per second) over `reps` passes of `n_threads` threads streaming
/// `regions` (split into equal contiguous shares across threads).
pub fn read_bandwidth(regions: &[&[u8]], n_threads: usize, reps: usize) -> f64 {
    let total: usize = regions.iter().map(|r| r.len()).sum();
    if total == 0 {
        return 0.0;
    }
    let n_threads = n_threads.max(1);
    // Thread i's pieces: the byte range [i*total/n, (i+1)*total/n) of the concatenation.
    let share = |i: usize| {
        let (start, end) = (i * total / n_threads, (i + 1) * total / n_threads);
        let mut pieces = Vec::new();
        let mut at = 0;
        for r in regions {
            let (lo, hi) = (start.max(at), end.min(at + r.len()));
            if lo < hi {
                pieces.push(&r[lo - at..hi - at]);
            }
            at += r.len();
        }
        pieces
    };
    let shares: Vec<Vec<&[u8]>> = (0..n_threads).map(share).collect();
    let mut best = f64::MAX;
    let mut check = 0u64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = shares
                .iter()
                .map(|pieces| {
                    // Checksums wrap: a plain `sum` overflows (and panics in a debug build,
                    // which ended the thread early and inflated the figure).
                    s.spawn(move || {
                        pieces
                            .iter()
                            .map(|p| stream_sum(p))
                            .fold(0u64, u64::wrapping_add)
                    })
                })
                .collect();
            // A share that ended early would inflate the figure: pass its panic on instead.
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        check = check.wrapping_add(sums.iter().copied().fold(0, u64::wrapping_add));
    }
    std::hint::black_box(check);
    total as f64 / best.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_sum_adds_every_word_and_tail_byte() {
        let bytes: Vec<u8> = (0..1003u32).map(|i| (i * 7 % 251) as u8).collect();
        for start in 0..9 {
            let s = &bytes[start..];
            let (head, words, tail) = bytemuck::pod_align_to::<u8, u64>(s);
            let want = head
                .iter()
                .chain(tail)
                .map(|&b| u64::from(b))
                .chain(words.iter().copied())
                .fold(0u64, u64::wrapping_add);
            assert_eq!(stream_sum(s), want);
        }
    }

    #[test]
    fn bandwidth_is_positive_and_handles_odd_splits() {
        let a = vec![1u8; 1 << 20];
        let b = vec![2u8; 12345];
        for threads in [1, 2, 3] {
            assert!(read_bandwidth(&[&a, &b], threads, 2) > 0.0);
        }
        assert_eq!(read_bandwidth(&[], 2, 2), 0.0);
    }
}
