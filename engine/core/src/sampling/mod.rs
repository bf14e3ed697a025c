//! Token sampling: repetition penalty, greedy, top-k, top-p, min-p, temperature and a seeded draw.
//!
//! The [`Sampler`] allocates every buffer it needs once, in [`Sampler::new`], sized for the
//! vocabulary; [`Sampler::sample`] and [`Sampler::accept`] only write into those buffers (and sort
//! in place with `sort_unstable_by`/`select_nth_unstable_by`, which never allocate).
//!
//! The order of the stages follows llama.cpp's default chain:
//! penalties → top-k → top-p → min-p → temperature → softmax → draw.
//! The random generator is xoshiro256** seeded through splitmix64, written here so that a given
//! seed yields the same tokens on every platform.

use crate::error::{EngineError, Result, Setting};
use crate::hint;

/// The seed used by [`SamplerConfig::default`]: a fixed value (42), so that runs are reproducible
/// unless a seed is chosen. (llama.cpp's default instead draws a random seed.)
pub const DEFAULT_SEED: u64 = 42;

/// The largest `repeat_last_n` accepted; [`Sampler::new`] clamps larger values to it.
pub const MAX_REPEAT_LAST_N: usize = 1 << 20;

/// Index of the largest logit, lowest id on ties; NaN never wins (0 if all are NaN). Greedy
/// decoding over raw logits, as the reference data was made.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] || (logits[best].is_nan() && !x.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// Sampling parameters. [`Default`] gives llama.cpp's command-line defaults.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability sums to at
    /// least `top_p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely token's; 0 disables.
    pub min_p: f32,
    /// Penalty for tokens seen in the last `repeat_last_n` accepted tokens (positive logits are
    /// divided by it, negative ones multiplied); 1 disables.
    pub repeat_penalty: f32,
    /// How many of the most recently accepted tokens the repetition penalty looks at; 0 disables.
    pub repeat_last_n: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 (off),
    /// repeat_last_n 64, seed [`DEFAULT_SEED`].
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: DEFAULT_SEED,
        }
    }
}

impl SamplerConfig {
    /// Checks every parameter; the error names the setting, its value and its valid range.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: Setting, value: String, range: &str| {
            Err(EngineError::invalid_setting(
                setting,
                &value,
                hint![setting, format!(" must be {range}, got {value}")],
            ))
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                Setting::Temperature,
                self.temperature.to_string(),
                "a finite number >= 0 (0 = greedy)",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(Setting::TopP, self.top_p.to_string(), "in (0, 1] (1 = off)");
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad(Setting::MinP, self.min_p.to_string(), "in [0, 1] (0 = off)");
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad(
                Setting::RepeatPenalty,
                self.repeat_penalty.to_string(),
                "a finite number > 0 (1 = off)",
            );
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return bad(
                Setting::RepeatLastN,
                self.repeat_last_n.to_string(),
                &format!("in [0, {MAX_REPEAT_LAST_N}] (0 = off)"),
            );
        }
        Ok(())
    }
}

/// xoshiro256** (Blackman & Vigna), seeded with splitmix64.
#[derive(Clone, Debug)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The settings of one [`Sampler::sample`] call for a sampler outside this module, with the
/// stages resolved as `sample` resolves them (see [`Sampler::device_sampling`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSampling {
    /// Logits considered: the first `n`.
    pub n: usize,
    /// Greedy (the temperature is `<= 0` or not finite): the argmax, lowest id on ties, NaN
    /// as -inf; no draw.
    pub greedy: bool,
    /// The temperature (when not greedy).
    pub temperature: f32,
    /// Candidates kept by top-k, in `1..=n` (`n` when top-k is off).
    pub top_k: usize,
    /// The top-p threshold, when top-p is on (`0 < top_p < 1`).
    pub top_p: Option<f32>,
    /// `ln(min_p)` in f32 (the CPU's value: candidates below `max + ln(min_p)` go), when min-p
    /// is on (`0 < min_p <= 1`).
    pub ln_min_p: Option<f32>,
}

/// What a constraint says of one candidate token ([`Sampler::sample_checked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not allowed here.
    Refused,
    /// Allowed, and not an end-of-generation token.
    Text,
    /// An end-of-generation token, allowed here.
    EndOfGeneration,
}

/// One candidate token: its id and its (penalised, sanitised) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cand {
    id: u32,
    logit: f32,
}

/// Descending logit, then ascending id: a total order (logits are never NaN here).
fn by_logit_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// NaN becomes -inf; +inf becomes `f32::MAX` so that differences stay finite.
fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// A token sampler that allocates nothing per token.
///
/// Every buffer is sized in [`Sampler::new`] for `n_vocab` (and `repeat_last_n`) and reused.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    n_vocab: usize,
    rng: Xoshiro256,
    /// Candidates; capacity `n_vocab`, never grown.
    cand: Vec<Cand>,
    /// Unnormalised probabilities of the kept candidates; capacity `n_vocab`, never grown.
    probs: Vec<f32>,
    /// Ring buffer of the last accepted tokens; capacity `repeat_last_n`, never grown.
    history: Vec<u32>,
    /// Next slot to overwrite once `history` is full.
    head: usize,
}

impl Sampler {
    /// Builds a sampler for a vocabulary of `n_vocab` tokens, allocating all its buffers.
    ///
    /// The configuration is not validated here (call [`SamplerConfig::validate`] for user
    /// input); out-of-range values never panic: a non-finite or non-positive temperature means
    /// greedy, an out-of-range top-p / min-p / repeat penalty disables that stage, and
    /// `repeat_last_n` is clamped to [`MAX_REPEAT_LAST_N`].
    pub fn new(cfg: SamplerConfig, n_vocab: usize) -> Sampler {
        let hist_cap = cfg.repeat_last_n.min(MAX_REPEAT_LAST_N);
        Sampler {
            rng: Xoshiro256::new(cfg.seed),
            cand: Vec::with_capacity(n_vocab),
            probs: Vec::with_capacity(n_vocab),
            history: Vec::with_capacity(hist_cap),
            head: 0,
            n_vocab,
            cfg,
        }
    }

    /// The configuration this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    fn history_cap(&self) -> usize {
        self.cfg.repeat_last_n.min(MAX_REPEAT_LAST_N)
    }

    /// Picks the next token from `logits` (one per vocabulary entry).
    ///
    /// Applies the repetition penalty over the accepted history, then returns the argmax (lowest
    /// id on ties) if the temperature is `<= 0`, else filters with top-k → top-p → min-p, scales
    /// by the temperature, and draws from the softmax with the seeded generator.
    ///
    /// NaN logits count as -inf and +inf as the largest finite value; if every logit is -inf
    /// (or `logits` is empty) the result is 0. Only the first `n_vocab` logits are considered.
    /// The token is not recorded: call [`Sampler::accept`] for that.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let n = self.prepare(logits);
        if n == 0 {
            return 0;
        }
        let t = self.cfg.temperature;
        if !(t > 0.0 && t.is_finite()) {
            return self.argmax();
        }
        let kept = self.truncate();
        if kept == 0 {
            // every candidate was -inf
            return 0;
        }
        self.draw(kept, t)
    }

    /// Fills `cand` with the sanitised, penalised logits indexed by id; returns their count.
    fn prepare(&mut self, logits: &[f32]) -> usize {
        let n = logits.len().min(self.n_vocab);
        self.cand.clear();
        self.cand
            .extend(logits[..n].iter().enumerate().map(|(i, &l)| Cand {
                id: i as u32,
                logit: sanitize(l),
            }));
        let penalty = self.cfg.repeat_penalty;
        if penalty.is_finite() && penalty > 0.0 && penalty != 1.0 {
            for &tok in &self.history {
                let i = tok as usize;
                if i < n {
                    // Computed from the original logit, so a token repeated in the history is
                    // penalised once, as in llama.cpp.
                    let l = sanitize(logits[i]);
                    self.cand[i].logit = if l > 0.0 { l / penalty } else { l * penalty };
                }
            }
        }
        n
    }

    /// Index of the largest logit, lowest id on ties; 0 when all are -inf.
    fn argmax(&self) -> u32 {
        let mut best = 0usize;
        for (i, c) in self.cand.iter().enumerate().skip(1) {
            if c.logit > self.cand[best].logit {
                best = i;
            }
        }
        best as u32
    }

    /// Applies top-k, top-p and min-p. Afterwards `cand[..kept]` holds the surviving
    /// candidates sorted by descending logit (ties: ascending id); returns `kept`.
    fn truncate(&mut self) -> usize {
        let n = self.cand.len();
        let k = match self.cfg.top_k {
            0 => n,
            k => k.min(n),
        };
        self.sort_best(k);
        self.truncate_sorted(k)
    }

    /// Puts the `k` best candidates first, sorted by descending logit (ties: ascending id).
    fn sort_best(&mut self, k: usize) {
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        self.cand[..k].sort_unstable_by(by_logit_desc);
    }

    /// Top-p and min-p over `cand[..k]`, the top-k candidates in order; returns how many stay.
    fn truncate_sorted(&mut self, k: usize) -> usize {
        // -inf candidates can never be drawn.
        let mut kept = self.cand[..k]
            .iter()
            .position(|c| c.logit == f32::NEG_INFINITY)
            .unwrap_or(k);
        if kept == 0 {
            return 0;
        }
        let max = self.cand[0].logit;

        let top_p = self.cfg.top_p;
        if top_p > 0.0 && top_p < 1.0 {
            self.probs.clear();
            let mut sum = 0.0f64;
            for c in &self.cand[..kept] {
                let p = (c.logit - max).exp();
                sum += p as f64;
                self.probs.push(p);
            }
            let mut cum = 0.0f64;
            for (i, &p) in self.probs.iter().enumerate() {
                cum += p as f64 / sum;
                if cum >= top_p as f64 {
                    kept = i + 1;
                    break;
                }
            }
        }

        let min_p = self.cfg.min_p;
        if min_p > 0.0 && min_p <= 1.0 {
            // llama.cpp: keep logits >= max + ln(min_p), i.e. p >= min_p * p_max.
            let min_logit = max + min_p.ln();
            kept = self.cand[..kept]
                .iter()
                .position(|c| c.logit < min_logit)
                .unwrap_or(kept)
                .max(1);
        }
        kept
    }

    /// Softmax at temperature `t` over `cand[..kept]` and a draw with the generator.
    fn draw(&mut self, kept: usize, t: f32) -> u32 {
        let max = self.cand[0].logit;
        self.probs.clear();
        let mut sum = 0.0f64;
        for c in &self.cand[..kept] {
            // (l - max) / t rather than l / t - max / t: stays finite for huge logits.
            let p = ((c.logit - max) / t).exp();
            sum += p as f64;
            self.probs.push(p);
        }
        let r = self.rng.next_f64() * sum;
        let mut cum = 0.0f64;
        for (i, &p) in self.probs.iter().enumerate() {
            cum += p as f64;
            if r < cum {
                return self.cand[i].id;
            }
        }
        // Rounding: fall back on the last candidate with non-zero weight.
        let last = self.probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        self.cand[last].id
    }

    /// [`Sampler::sample`] of `logits` with every token that `check` refuses at -inf, decided
    /// from the best candidates alone where they suffice: `Ok(None)` where they do not (then
    /// the caller masks the logits and calls `sample`; nothing has changed here). Where it
    /// returns a token, it is the one `sample` of the masked logits gives, and the generator
    /// has advanced as that call's would.
    ///
    /// Greedy asks about the argmax, then the next best in order (up to `extra_checks` more):
    /// the first allowed one is the masked argmax, if it is text. Otherwise, with top-k on,
    /// the candidates are asked best first, at most `top_k + extra_checks` of them, until
    /// `top_k` are allowed: those decide everything after top-k. The masked path takes the
    /// only allowed token without sampling (no draw), so a result also needs two allowed
    /// candidates, one of them text. `check` tells an end-of-generation token apart
    /// ([`Verdict::EndOfGeneration`]).
    pub fn sample_checked<E>(
        &mut self,
        logits: &[f32],
        extra_checks: usize,
        mut check: impl FnMut(u32) -> std::result::Result<Verdict, E>,
    ) -> std::result::Result<Option<u32>, E> {
        let n = self.prepare(logits);
        if n == 0 {
            return Ok(None);
        }
        let t = self.cfg.temperature;
        if !(t > 0.0 && t.is_finite()) {
            let best = self.argmax();
            // All -inf: the masked argmax is token 0, allowed or not; leave that to the mask.
            if self.cand[best as usize].logit == f32::NEG_INFINITY {
                return Ok(None);
            }
            // An allowed end of generation is left to the mask too: where nothing else is
            // allowed, the masked path takes the first EOG token, not the best.
            match check(best)? {
                Verdict::Text => return Ok(Some(best)),
                Verdict::EndOfGeneration => return Ok(None),
                Verdict::Refused => {}
            }
            // The next best, in order: the first allowed one is the masked argmax.
            let m = extra_checks.saturating_add(1).min(n);
            self.sort_best(m);
            for i in 1..m {
                let c = self.cand[i];
                if c.logit == f32::NEG_INFINITY {
                    break;
                }
                match check(c.id)? {
                    Verdict::Text => return Ok(Some(c.id)),
                    Verdict::EndOfGeneration => return Ok(None),
                    Verdict::Refused => {}
                }
            }
            return Ok(None);
        }
        let k = match self.cfg.top_k {
            0 => return Ok(None),
            k => k.min(n),
        };
        let m = k.saturating_add(extra_checks).min(n);
        self.sort_best(m);
        let (mut found, mut text) = (0, 0);
        // Decided once `k` allowed are found, or every finite candidate was asked (the rest of
        // the masked logits are -inf, so they are never drawn).
        let mut decided = m == n;
        for i in 0..m {
            if found == k {
                decided = true;
                break;
            }
            let c = self.cand[i];
            if c.logit == f32::NEG_INFINITY {
                decided = true;
                break;
            }
            match check(c.id)? {
                Verdict::Refused => {}
                v => {
                    text += usize::from(v == Verdict::Text);
                    self.cand[found] = c;
                    found += 1;
                }
            }
        }
        decided |= found == k;
        if !decided || found < 2 || text == 0 {
            return Ok(None);
        }
        let kept = self.truncate_sorted(found);
        Ok(Some(self.draw(kept, t)))
    }

    /// What [`Sampler::sample`] needs besides the logits, for a sampler that holds the logits
    /// elsewhere (the CUDA backend's device sampler): `None` when this sampler must see the
    /// logits itself: a repetition penalty with tokens in the history, or a top-k (0 = all
    /// `n_logits`) above `max_top_k`. `n_logits` is the logits' length; the device must
    /// consider `min(n_logits, n_vocab)` of them, as `sample` does.
    pub fn device_sampling(&self, n_logits: usize, max_top_k: usize) -> Option<DeviceSampling> {
        let p = self.cfg.repeat_penalty;
        if p.is_finite() && p > 0.0 && p != 1.0 && !self.history.is_empty() {
            return None;
        }
        let n = n_logits.min(self.n_vocab);
        let t = self.cfg.temperature;
        let greedy = !(t > 0.0 && t.is_finite());
        let top_k = match self.cfg.top_k {
            0 => n,
            k => k.min(n),
        };
        if !greedy && top_k > max_top_k {
            return None;
        }
        let (top_p, min_p) = (self.cfg.top_p, self.cfg.min_p);
        Some(DeviceSampling {
            n,
            greedy,
            temperature: t,
            top_k,
            top_p: (top_p > 0.0 && top_p < 1.0).then_some(top_p),
            ln_min_p: (min_p > 0.0 && min_p <= 1.0).then(|| min_p.ln()),
        })
    }

    /// [`Sampler::sample`] done by `f` elsewhere (see [`Sampler::device_sampling`]): `f` gets
    /// the uniform draw in [0, 1) that `sample` would take from the generator and returns the
    /// token and whether it used the draw (`sample` draws only when some candidate survives);
    /// if it did not, the generator is put back, so it advances exactly as `sample`'s would.
    pub fn sample_with_draw<E>(
        &mut self,
        f: impl FnOnce(f64) -> std::result::Result<(u32, bool), E>,
    ) -> std::result::Result<u32, E> {
        let saved = self.rng.clone();
        let u = self.rng.next_f64();
        let (token, drew) = f(u)?;
        if !drew {
            self.rng = saved;
        }
        Ok(token)
    }

    /// Records an emitted token for the repetition penalty (a ring buffer of the last
    /// `repeat_last_n` tokens).
    pub fn accept(&mut self, token: u32) {
        let cap = self.history_cap();
        if cap == 0 {
            return;
        }
        if self.history.len() < cap {
            self.history.push(token);
        } else {
            self.history[self.head] = token;
            self.head = (self.head + 1) % cap;
        }
    }

    /// Forgets the accepted tokens and reseeds the generator with the configured seed.
    pub fn reset(&mut self) {
        self.history.clear();
        self.head = 0;
        self.rng = Xoshiro256::new(self.cfg.seed);
    }
}

#[cfg(test)]
mod tests;
