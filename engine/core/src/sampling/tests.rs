//! The sampler against its definition: greedy, each filter, the seeded draw, penalties and
//! the device-sampling split.

use super::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts allocations made by the current thread, so the no-allocation test is not
/// disturbed by other tests running in parallel.
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocs() -> usize {
    ALLOCS.with(|a| a.get())
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed: 1234,
    }
}

fn greedy() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..cfg()
    }
}

/// Logits whose softmax is exactly `probs`.
fn log_probs(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// Ids surviving top-k / top-p / min-p, sorted ascending.
fn kept_ids(s: &mut Sampler, logits: &[f32]) -> Vec<u32> {
    s.prepare(logits);
    let kept = s.truncate();
    let mut ids: Vec<u32> = s.cand[..kept].iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn default_is_llama_cpp_cli_and_valid() {
    let c = SamplerConfig::default();
    assert_eq!(c.temperature, 0.8);
    assert_eq!(c.top_k, 40);
    assert_eq!(c.top_p, 0.95);
    assert_eq!(c.min_p, 0.05);
    assert_eq!(c.repeat_penalty, 1.0);
    assert_eq!(c.repeat_last_n, 64);
    assert_eq!(c.seed, DEFAULT_SEED);
    c.validate().unwrap();
}

/// Each bad setting is named (as a setting, and in the message) with its valid range.
#[test]
fn validate_names_setting_and_range() {
    let bad = |c: SamplerConfig| c.validate().unwrap_err();
    let check = |e: EngineError, setting: Setting, range: &str| {
        assert_eq!(e.setting(), Some(setting), "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(setting.name()) && msg.contains(range),
            "{msg}"
        );
    };
    let e = bad(SamplerConfig {
        temperature: -1.0,
        ..cfg()
    });
    check(e, Setting::Temperature, ">= 0");
    let e = bad(SamplerConfig {
        top_p: 0.0,
        ..cfg()
    });
    check(e, Setting::TopP, "(0, 1]");
    let e = bad(SamplerConfig {
        min_p: f32::NAN,
        ..cfg()
    });
    check(e, Setting::MinP, "[0, 1]");
    let e = bad(SamplerConfig {
        repeat_penalty: 0.0,
        ..cfg()
    });
    check(e, Setting::RepeatPenalty, "> 0");
    let e = bad(SamplerConfig {
        repeat_last_n: usize::MAX,
        ..cfg()
    });
    check(e, Setting::RepeatLastN, "(0 = off)");
}

#[test]
fn free_argmax_lowest_id_on_ties_and_nan_never_wins() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN, -4.0]), 3);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn greedy_picks_argmax_lowest_id_on_ties() {
    let mut s = Sampler::new(greedy(), 6);
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 3.5, 0.0, 1.0]), 3);
    assert_eq!(s.sample(&[0.1, 3.5, -1.0, 3.5, 0.0, 3.5]), 1);
    assert_eq!(s.sample(&[-5.0, -4.0, -3.0, -2.0, -1.0, -0.5]), 5);
}

#[test]
fn top_k_1_equals_greedy() {
    let mut rng = Xoshiro256::new(7);
    let mut g = Sampler::new(greedy(), 50);
    let mut k1 = Sampler::new(
        SamplerConfig {
            top_k: 1,
            temperature: 1.5,
            ..cfg()
        },
        50,
    );
    for _ in 0..200 {
        let logits: Vec<f32> = (0..50)
            .map(|_| rng.next_f64() as f32 * 10.0 - 5.0)
            .collect();
        assert_eq!(g.sample(&logits), k1.sample(&logits));
    }
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg() }, 100);
        (0..64).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    // reset reseeds
    let mut s = Sampler::new(SamplerConfig { seed: 1, ..cfg() }, 100);
    let a: Vec<u32> = (0..64).map(|_| s.sample(&logits)).collect();
    s.reset();
    let b: Vec<u32> = (0..64).map(|_| s.sample(&logits)).collect();
    assert_eq!(a, b);
}

#[test]
fn rng_is_xoshiro256starstar_with_splitmix64() {
    // Reference values: splitmix64 from seed 0 gives 0xE220A8397B1DCDAF first.
    let mut x = Xoshiro256::new(0);
    assert_eq!(x.s[0], 0xE220_A839_7B1D_CDAF);
    // First outputs, from an independent implementation: a change here changes every
    // seeded run on every platform.
    let first: Vec<u64> = (0..3).map(|_| x.next_u64()).collect();
    assert_eq!(
        first,
        vec![
            0x99EC_5F36_CB75_F2B4,
            0xBF6E_1F78_4956_452A,
            0x1A5F_849D_4933_E6E0
        ]
    );
    let v = x.next_f64();
    assert!((0.0..1.0).contains(&v));
}

#[test]
fn empirical_distribution_matches_softmax() {
    let probs = [0.5f32, 0.25, 0.15, 0.1];
    // Shifted logits: softmax is shift-invariant.
    let logits: Vec<f32> = log_probs(&probs).iter().map(|l| l + 3.0).collect();
    let mut s = Sampler::new(cfg(), probs.len());
    let n = 20_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    for (c, p) in counts.iter().zip(probs) {
        let f = *c as f32 / n as f32;
        assert!((f - p).abs() < 0.015, "freq {f} vs p {p} ({counts:?})");
    }
}

#[test]
fn temperature_sharpens() {
    // At temperature 0.5, p ∝ p_orig^2: [0.25, 0.0625, 0.0225, 0.01] / 0.345.
    let probs = [0.5f32, 0.25, 0.15, 0.1];
    let logits = log_probs(&probs);
    let mut s = Sampler::new(
        SamplerConfig {
            temperature: 0.5,
            ..cfg()
        },
        4,
    );
    let n = 20_000;
    let mut c0 = 0;
    for _ in 0..n {
        if s.sample(&logits) == 0 {
            c0 += 1;
        }
    }
    let f = c0 as f32 / n as f32;
    assert!((f - 0.25 / 0.345).abs() < 0.015, "{f}");
}

#[test]
fn top_k_cuts_exactly() {
    let logits = [1.0, 5.0, 3.0, 4.0, 2.0, 4.0];
    let mut s = Sampler::new(SamplerConfig { top_k: 3, ..cfg() }, 6);
    // 5.0 (id 1), 4.0 (ids 3 and 5)
    assert_eq!(kept_ids(&mut s, &logits), vec![1, 3, 5]);
    let mut s = Sampler::new(SamplerConfig { top_k: 2, ..cfg() }, 6);
    // tie at 4.0 broken by lower id
    assert_eq!(kept_ids(&mut s, &logits), vec![1, 3]);
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 100,
            ..cfg()
        },
        6,
    );
    assert_eq!(kept_ids(&mut s, &logits).len(), 6);
}

#[test]
fn top_p_cuts_exactly() {
    // probabilities 0.4, 0.3, 0.2, 0.1 (ids shuffled)
    let logits = log_probs(&[0.2, 0.4, 0.1, 0.3]);
    let at = |p: f32| {
        let mut s = Sampler::new(SamplerConfig { top_p: p, ..cfg() }, 4);
        kept_ids(&mut s, &logits)
    };
    // cumulative: 0.4 (id 1), 0.7 (id 3), 0.9 (id 0), 1.0 (id 2)
    assert_eq!(at(0.3), vec![1]);
    assert_eq!(at(0.5), vec![1, 3]);
    assert_eq!(at(0.8), vec![0, 1, 3]);
    assert_eq!(at(0.95), vec![0, 1, 2, 3]);
    assert_eq!(at(1.0), vec![0, 1, 2, 3]);
}

#[test]
fn min_p_cuts_exactly() {
    // p_max 0.4: min_p 0.5 keeps p >= 0.2 → ids 1 (0.4), 3 (0.3), 0 (0.2, boundary kept
    // up to rounding, so use 0.6 → >= 0.24 for an unambiguous cut).
    let logits = log_probs(&[0.2, 0.4, 0.1, 0.3]);
    let at = |m: f32| {
        let mut s = Sampler::new(SamplerConfig { min_p: m, ..cfg() }, 4);
        kept_ids(&mut s, &logits)
    };
    assert_eq!(at(0.6), vec![1, 3]); // >= 0.24
    assert_eq!(at(0.4), vec![0, 1, 3]); // >= 0.16
    assert_eq!(at(0.2), vec![0, 1, 2, 3]); // >= 0.08
    assert_eq!(at(1.0), vec![1]);
}

#[test]
fn filters_chain_in_order() {
    // top-k 3 keeps 0.4, 0.3, 0.2 → renormalised 4/9, 3/9, 2/9; top-p 0.7: 0.444, 0.777 →
    // keeps two; min-p 0.8 of 0.4 = 0.32 → drops 0.3.
    let logits = log_probs(&[0.2, 0.4, 0.1, 0.3]);
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 3,
            top_p: 0.7,
            ..cfg()
        },
        4,
    );
    assert_eq!(kept_ids(&mut s, &logits), vec![1, 3]);
    let mut s = Sampler::new(
        SamplerConfig {
            top_k: 3,
            top_p: 0.7,
            min_p: 0.8,
            ..cfg()
        },
        4,
    );
    assert_eq!(kept_ids(&mut s, &logits), vec![1]);
    assert_eq!(s.sample(&logits), 1);
}

#[test]
fn repetition_penalty_hand_computed() {
    let mut s = Sampler::new(
        SamplerConfig {
            repeat_penalty: 2.0,
            repeat_last_n: 3,
            ..greedy()
        },
        5,
    );
    let logits = [3.0, 2.0, -1.0, 1.0, 0.5];
    assert_eq!(s.sample(&logits), 0);
    s.accept(0); // 3.0 → 1.5
    s.accept(0); // repeated: still penalised once
    assert_eq!(s.sample(&logits), 1);
    s.prepare(&logits);
    let l: Vec<f32> = s.cand.iter().map(|c| c.logit).collect();
    assert_eq!(l, vec![1.5, 2.0, -1.0, 1.0, 0.5]);
    s.accept(2); // -1.0 → -2.0
    s.prepare(&logits);
    let l: Vec<f32> = s.cand.iter().map(|c| c.logit).collect();
    assert_eq!(l, vec![1.5, 2.0, -2.0, 1.0, 0.5]);
    // ring buffer of 3: history is now [0, 0, 2]; accepting 1 pushes out the first 0,
    // accepting 4 the second.
    s.accept(1);
    s.accept(4);
    s.prepare(&logits);
    let l: Vec<f32> = s.cand.iter().map(|c| c.logit).collect();
    assert_eq!(l, vec![3.0, 1.0, -2.0, 1.0, 0.25]);
    assert_eq!(s.sample(&logits), 0);
    s.reset();
    s.prepare(&logits);
    let l: Vec<f32> = s.cand.iter().map(|c| c.logit).collect();
    assert_eq!(l, logits.to_vec());
}

#[test]
fn nan_and_inf_never_panic() {
    for c in [greedy(), cfg(), SamplerConfig::default()] {
        let mut s = Sampler::new(c, 4);
        assert_eq!(s.sample(&[f32::NAN; 4]), 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4]), 0);
        assert_eq!(s.sample(&[f32::NAN, f32::NEG_INFINITY, 1.0, f32::NAN]), 2);
        assert_eq!(
            s.sample(&[1.0, f32::INFINITY, f32::NAN, f32::NEG_INFINITY]),
            1
        );
        let t = s.sample(&[f32::INFINITY, f32::INFINITY, 0.0, f32::NEG_INFINITY]);
        assert!(t < 2, "{t}");
        assert_eq!(s.sample(&[]), 0);
        // more logits than n_vocab: only the first n_vocab count
        assert!(s.sample(&[0.0, 0.0, 0.0, 0.0, 100.0, 100.0]) < 4);
    }
    // degenerate configs do not panic either
    let mut s = Sampler::new(
        SamplerConfig {
            temperature: f32::NAN,
            top_p: f32::NAN,
            min_p: f32::NAN,
            repeat_penalty: f32::NAN,
            ..cfg()
        },
        3,
    );
    s.accept(1);
    s.accept(99);
    assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
    let mut s = Sampler::new(SamplerConfig { top_k: 1, ..cfg() }, 0);
    assert_eq!(s.sample(&[1.0, 2.0]), 0);
}

#[test]
fn no_allocation_per_call() {
    let n_vocab = 32_000;
    let logits: Vec<f32> = (0..n_vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let configs = [
        SamplerConfig::default(),
        greedy(),
        cfg(),
        SamplerConfig {
            repeat_penalty: 1.3,
            top_p: 0.5,
            min_p: 0.1,
            ..cfg()
        },
    ];
    // the counter does see this thread's allocations
    let before = allocs();
    let v = std::hint::black_box(vec![0u8; 16]);
    drop(v);
    assert!(allocs() > before);
    for c in configs {
        let mut s = Sampler::new(c, n_vocab);
        let before = allocs();
        for _ in 0..100 {
            let t = s.sample(&logits);
            s.accept(t);
        }
        s.reset();
        assert_eq!(allocs(), before, "sample/accept/reset allocated");
    }
}

#[test]
fn device_sampling_says_what_sample_would_do() {
    let c = SamplerConfig {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        ..cfg()
    };
    let s = Sampler::new(c.clone(), 100);
    let ds = s.device_sampling(100, 1024).unwrap();
    assert_eq!(
        ds,
        DeviceSampling {
            n: 100,
            greedy: false,
            temperature: 0.7,
            top_k: 40,
            top_p: Some(0.9),
            ln_min_p: Some(0.05f32.ln()),
        }
    );
    // Off stages, greedy, top-k clamped to the logits, too many candidates for the device.
    let off = Sampler::new(
        SamplerConfig {
            top_k: 500,
            top_p: 1.0,
            min_p: 0.0,
            ..c.clone()
        },
        100,
    );
    let ds = off.device_sampling(120, 1024).unwrap();
    assert_eq!(
        (ds.n, ds.top_k, ds.top_p, ds.ln_min_p),
        (100, 100, None, None)
    );
    assert!(off.device_sampling(120, 50).is_none());
    let all = Sampler::new(
        SamplerConfig {
            top_k: 0,
            ..c.clone()
        },
        100,
    );
    assert_eq!(all.device_sampling(100, 100).unwrap().top_k, 100);
    assert!(all.device_sampling(100, 99).is_none());
    let greedy = Sampler::new(
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            ..c.clone()
        },
        100,
    );
    assert!(greedy.device_sampling(100, 1).unwrap().greedy);
    // A repetition penalty needs the logits once there is history.
    let mut pen = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.3,
            ..c
        },
        100,
    );
    assert!(pen.device_sampling(100, 1024).is_some());
    pen.accept(3);
    assert!(pen.device_sampling(100, 1024).is_none());
}

#[test]
fn sample_with_draw_advances_the_generator_as_sample() {
    // The draws handed out are the generator's, in order; an unused draw is put back.
    let mut a = Sampler::new(cfg(), 10);
    let mut b = Sampler::new(cfg(), 10);
    let mut seen = Vec::new();
    for used in [true, false, true, true] {
        a.sample_with_draw(|u| {
            seen.push(u);
            Ok::<_, ()>((0, used))
        })
        .unwrap();
    }
    let want: Vec<f64> = (0..3).map(|_| b.rng.next_f64()).collect();
    assert_eq!(seen, vec![want[0], want[1], want[1], want[2]]);
    // After the same draws, sample() continues identically.
    let logits: Vec<f32> = (0..10).map(|i| (i as f32 * 0.37).sin()).collect();
    assert_eq!(a.sample(&logits), b.sample(&logits));
    let e = a.sample_with_draw(|_| Err::<(u32, bool), _>("device error"));
    assert_eq!(e, Err("device error"));
}

/// What a constrained step did before [`Sampler::sample_checked`] (`Guide::choose`, then
/// `sample`): the only allowed text token, or an end-of-generation token where nothing else
/// is allowed, without sampling; otherwise `sample` of the logits with every refused token at
/// -inf (end-of-generation tokens kept where the grammar accepts).
fn sample_masked(
    s: &mut Sampler,
    logits: &[f32],
    text: &[bool],
    eog: &[u32],
    accepts: bool,
) -> u32 {
    let n_text = (0..logits.len())
        .filter(|&i| text[i] && !eog.contains(&(i as u32)))
        .count();
    if n_text == 0 && accepts {
        return eog[0];
    }
    if n_text == 1 && !accepts {
        return (0..logits.len())
            .find(|&i| text[i] && !eog.contains(&(i as u32)))
            .unwrap() as u32;
    }
    let masked: Vec<f32> = (0..logits.len())
        .map(|i| {
            let allowed = if eog.contains(&(i as u32)) {
                accepts
            } else {
                text[i]
            };
            if allowed {
                logits[i]
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    s.sample(&masked)
}

#[test]
fn sample_checked_equals_sampling_the_masked_logits() {
    // Random vocabularies, logits (ties, -inf, NaN), allowed sets from dense to one token,
    // end-of-generation tokens accepted or not, and every sampler setting: wherever
    // `sample_checked` decides, it picks what the masked path picks, and the generator is left
    // where that path leaves it (the next draw agrees).
    let mut rng = Xoshiro256::new(99);
    let mut r = move || rng.next_f64();
    let (mut decided, mut trials) = (0, 0);
    for trial in 0..4000 {
        let n = 2 + (r() * 300.0) as usize;
        let logits: Vec<f32> = (0..n)
            .map(|_| match (r() * 40.0) as u32 {
                0 => f32::NEG_INFINITY,
                1 => f32::NAN,
                2 => 1.5,
                _ => (r() * 12.0 - 6.0) as f32,
            })
            .collect();
        let density = [1.0, 0.6, 0.2, 0.03, 0.0][trial % 5];
        let mut text: Vec<bool> = (0..n).map(|_| r() < density).collect();
        if trial % 7 == 0 {
            let only = (r() * n as f64) as usize;
            text.iter_mut()
                .enumerate()
                .for_each(|(i, t)| *t = i == only);
        }
        let eog = vec![(n - 1) as u32, (n / 2) as u32];
        let accepts = r() < 0.5;
        if !text.iter().any(|&t| t) && !accepts {
            continue; // the grammar allows nothing: an error either way
        }
        let cfg = SamplerConfig {
            temperature: [0.0, 0.7, 1.0, 1.5][trial % 4],
            top_k: [0, 1, 3, 10, 40][(trial / 4) % 5],
            top_p: if r() < 0.5 {
                1.0
            } else {
                0.5 + r() as f32 * 0.5
            },
            min_p: if r() < 0.5 { 0.0 } else { r() as f32 * 0.3 },
            repeat_penalty: if r() < 0.3 { 1.3 } else { 1.0 },
            repeat_last_n: 8,
            seed: trial as u64,
        };
        let mut a = Sampler::new(cfg.clone(), n);
        let mut b = Sampler::new(cfg, n);
        for _ in 0..(r() * 6.0) as usize {
            let t = (r() * n as f64) as u32;
            a.accept(t);
            b.accept(t);
        }
        trials += 1;
        let got = a
            .sample_checked(&logits, 16, |t| {
                Ok::<_, ()>(if eog.contains(&t) {
                    if accepts {
                        Verdict::EndOfGeneration
                    } else {
                        Verdict::Refused
                    }
                } else if text[t as usize] {
                    Verdict::Text
                } else {
                    Verdict::Refused
                })
            })
            .unwrap();
        let Some(got) = got else { continue };
        decided += 1;
        let want = sample_masked(&mut b, &logits, &text, &eog, accepts);
        assert_eq!(got, want, "trial {trial}: n {n}, {:?}", a.config());
        let next: Vec<f32> = (0..n).map(|i| (i as f32 * 0.77).sin()).collect();
        assert_eq!(
            a.sample(&next),
            b.sample(&next),
            "trial {trial}: the next draw"
        );
    }
    // Many trials are ones it declines by design (top-k off, sparse allowed sets, a lone
    // allowed token); enough must be decided for the comparison to mean something.
    assert!(decided * 5 > trials, "{decided} of {trials} decided");
    // Where the grammar allows most tokens, as in free text, it decides nearly every step.
    for (temperature, top_k) in [(0.0, 40), (0.8, 40)] {
        let cfg = SamplerConfig {
            temperature,
            top_k,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(cfg, 1000);
        let decided = (0..100)
            .filter(|&i| {
                let logits: Vec<f32> = (0..1000)
                    .map(|j| ((i * 31 + j * 7) % 97) as f32 / 9.0)
                    .collect();
                s.sample_checked(&logits, 16, |t| {
                    Ok::<_, ()>(if t % 10 == 3 {
                        Verdict::Refused
                    } else {
                        Verdict::Text
                    })
                })
                .unwrap()
                .is_some()
            })
            .count();
        assert_eq!(decided, 100, "temperature {temperature}");
    }
}
