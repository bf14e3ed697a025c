//! The memory budget policy: does a given demand fit, and what is the largest ctx that does.

use std::fmt;

use crate::profiles::Target;
use crate::size::format_size;

/// A cap on the memory the engine owns (`--mem-budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The cap in bytes.
    pub limit_bytes: u64,
    /// Whether the mapped weights count against the cap (`--count-weights`, or a
    /// [`Target::unified_memory`] target where weights share RAM with everything else).
    pub count_weights: bool,
}

impl Budget {
    /// The budget the engine uses on `target`: `mem_budget` (from `--mem-budget`) if given,
    /// else the target's [`usable_bytes`](Target::usable_bytes).
    ///
    /// An explicit budget is taken as-is, even above `usable_bytes()`: the reserves assume
    /// a stock desktop image, and a headless board really has more. (The engine may warn
    /// when an explicit budget exceeds `usable_bytes()`.) Weights count if
    /// `count_weights_flag` is set or the target has unified memory.
    pub fn for_target(target: &Target, mem_budget: Option<u64>, count_weights_flag: bool) -> Self {
        Budget {
            limit_bytes: mem_budget.unwrap_or_else(|| target.usable_bytes()),
            count_weights: count_weights_flag || target.unified_memory,
        }
    }

    /// Bytes `d` charges against this budget (weights included only if counted).
    pub fn charged(&self, d: &Demand) -> u64 {
        d.total(self.count_weights)
    }

    /// Whether `d` fits. A demand whose sum overflows `u64` never fits.
    pub fn fits(&self, d: &Demand) -> bool {
        d.checked_total(self.count_weights)
            .is_some_and(|t| t <= self.limit_bytes)
    }

    /// `Ok(())` if `d` fits, else a [`BudgetError`] showing each component and the total
    /// against the limit. Call before allocating anything.
    pub fn check(&self, d: &Demand) -> Result<(), BudgetError> {
        if self.fits(d) {
            Ok(())
        } else {
            Err(BudgetError {
                budget: *self,
                demand: *d,
                largest_fitting_ctx: None,
            })
        }
    }
}

/// What a configuration (model + ctx + ubatch) would allocate, per component, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Demand {
    /// Mapped model weights.
    pub weights: u64,
    /// KV cache.
    pub kv: u64,
    /// Activation arena.
    pub arena: u64,
    /// Scratch buffers (dequantisation, sampling, ...).
    pub scratch: u64,
}

impl Demand {
    /// Sum of the components, with or without the weights; `None` if it overflows `u64`.
    pub fn checked_total(&self, count_weights: bool) -> Option<u64> {
        let w = if count_weights { self.weights } else { 0 };
        w.checked_add(self.kv)?
            .checked_add(self.arena)?
            .checked_add(self.scratch)
    }

    /// Sum of the components, with or without the weights; saturates instead of overflowing.
    pub fn total(&self, count_weights: bool) -> u64 {
        let w = if count_weights { self.weights } else { 0 };
        w.saturating_add(self.kv)
            .saturating_add(self.arena)
            .saturating_add(self.scratch)
    }
}

/// A demand does not fit its budget.
///
/// Display prints needed vs budget per component and in total, e.g.
///
/// ```text
/// memory budget exceeded: need 2.30 GiB, budget 2.00 GiB (over by 307.20 MiB)
///   weights   1.00 GiB
///   kv cache  1.00 GiB
///   arena     256.00 MiB
///   scratch   51.20 MiB
///   total     2.30 GiB of 2.00 GiB budget
///   largest ctx that fits: 3072
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetError {
    /// The budget that was exceeded.
    pub budget: Budget,
    /// What was asked for.
    pub demand: Demand,
    /// The largest ctx that would fit, if the caller computed it (see
    /// [`largest_fitting`]); printed when present.
    pub largest_fitting_ctx: Option<u64>,
}

impl BudgetError {
    /// Bytes the demand charges against the budget.
    pub fn needed(&self) -> u64 {
        self.budget.charged(&self.demand)
    }

    /// Attach the largest ctx that fits, so the message can suggest it.
    pub fn with_largest_fitting_ctx(mut self, ctx: Option<u64>) -> Self {
        self.largest_fitting_ctx = ctx;
        self
    }
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let need = self.needed();
        let limit = self.budget.limit_bytes;
        writeln!(
            f,
            "memory budget exceeded: need {}, budget {} (over by {})",
            format_size(need),
            format_size(limit),
            format_size(need.saturating_sub(limit))
        )?;
        let d = &self.demand;
        if self.budget.count_weights {
            writeln!(f, "  weights   {}", format_size(d.weights))?;
        } else {
            writeln!(
                f,
                "  weights   {} (not counted: this budget does not count the weights)",
                format_size(d.weights)
            )?;
        }
        writeln!(f, "  kv cache  {}", format_size(d.kv))?;
        writeln!(f, "  arena     {}", format_size(d.arena))?;
        writeln!(f, "  scratch   {}", format_size(d.scratch))?;
        write!(
            f,
            "  total     {} of {} budget",
            format_size(need),
            format_size(limit)
        )?;
        match self.largest_fitting_ctx {
            Some(ctx) => write!(f, "\n  largest ctx that fits: {ctx}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for BudgetError {}

/// The largest ctx in `[lo, hi]` whose demand fits `budget`, or `None` if even `lo` does
/// not (or `lo > hi`).
///
/// `demand_for_ctx` must be monotone non-decreasing in ctx (true of KV cache and arena
/// sizes). Binary search: `O(log(hi - lo))` calls, no overflow for any `u64` bounds.
pub fn largest_fitting<F: Fn(u64) -> Demand>(
    budget: &Budget,
    lo: u64,
    hi: u64,
    demand_for_ctx: F,
) -> Option<u64> {
    if lo > hi || !budget.fits(&demand_for_ctx(lo)) {
        return None;
    }
    // Invariant: `good` fits; everything above `hi` is known not to (or out of range).
    let (mut good, mut hi) = (lo, hi);
    while good < hi {
        let mid = good + (hi - good).div_ceil(2);
        if budget.fits(&demand_for_ctx(mid)) {
            good = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(good)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// 1000 B of KV per token, fixed arena/scratch, 10 kB of weights.
    fn linear(ctx: u64) -> Demand {
        Demand {
            weights: 10_000,
            kv: ctx * 1000,
            arena: 500,
            scratch: 100,
        }
    }

    fn budget(limit: u64, count_weights: bool) -> Budget {
        Budget {
            limit_bytes: limit,
            count_weights,
        }
    }

    #[test]
    fn check_counts_weights_only_when_asked() {
        let d = linear(10); // 10_000 + 10_600
        assert!(budget(10_600, false).check(&d).is_ok());
        assert!(budget(10_599, false).check(&d).is_err());
        assert!(budget(20_600, true).check(&d).is_ok());
        assert!(budget(20_599, true).check(&d).is_err());
    }

    #[test]
    fn error_shows_components_and_total() {
        let d = Demand {
            weights: GIB,
            kv: GIB,
            arena: 256 * MIB,
            scratch: 32 * MIB,
        };
        let e = budget(2 * GIB, true).check(&d).unwrap_err();
        assert_eq!(e.needed(), 2 * GIB + 288 * MIB);
        let msg = e.with_largest_fitting_ctx(Some(3072)).to_string();
        for want in [
            "need 2.28 GiB, budget 2.00 GiB (over by 288.00 MiB)",
            "weights   1.00 GiB",
            "kv cache  1.00 GiB",
            "arena     256.00 MiB",
            "scratch   32.00 MiB",
            "total     2.28 GiB of 2.00 GiB budget",
            "largest ctx that fits: 3072",
        ] {
            assert!(msg.contains(want), "missing `{want}` in:\n{msg}");
        }
        let e = budget(GIB, false).check(&d).unwrap_err();
        assert!(e.to_string().contains("not counted"), "{e}");
        assert!(!e.to_string().contains("largest ctx"), "{e}");
    }

    #[test]
    fn largest_fitting_linear_exact() {
        // 1000c + 600 <= 100_000  ->  c <= 99.4
        assert_eq!(
            largest_fitting(&budget(100_000, false), 1, 1_000_000, linear),
            Some(99)
        );
        // 1000c + 10_600 <= 100_000  ->  c <= 89.4
        assert_eq!(
            largest_fitting(&budget(100_000, true), 1, 1_000_000, linear),
            Some(89)
        );
        // Exact boundary: 1000*64 + 600 fits, 65 does not.
        assert_eq!(
            largest_fitting(&budget(64_600, false), 0, 4096, linear),
            Some(64)
        );
        assert_eq!(
            largest_fitting(&budget(64_599, false), 0, 4096, linear),
            Some(63)
        );
    }

    #[test]
    fn lo_fits_exactly() {
        let b = budget(512 * 1000 + 600, false);
        assert_eq!(largest_fitting(&b, 512, 8192, linear), Some(512));
    }

    #[test]
    fn nothing_fits() {
        let b = budget(512 * 1000 + 599, false);
        assert_eq!(largest_fitting(&b, 512, 8192, linear), None);
        // Weights alone exceed the budget.
        assert_eq!(largest_fitting(&budget(5_000, true), 0, 10, linear), None);
    }

    #[test]
    fn everything_fits() {
        assert_eq!(
            largest_fitting(&budget(u64::MAX, true), 1, 131_072, linear),
            Some(131_072)
        );
        assert_eq!(
            largest_fitting(&budget(10_000_000, false), 7, 7, linear),
            Some(7)
        );
    }

    #[test]
    fn empty_range() {
        assert_eq!(
            largest_fitting(&budget(u64::MAX, true), 10, 9, linear),
            None
        );
    }

    #[test]
    fn full_u64_range_no_overflow_and_logarithmic() {
        let calls = Cell::new(0u32);
        let d = |ctx: u64| {
            calls.set(calls.get() + 1);
            Demand {
                kv: ctx,
                arena: 600,
                ..Demand::default()
            }
        };
        let b = budget(1 << 40, false);
        assert_eq!(largest_fitting(&b, 0, u64::MAX, d), Some((1 << 40) - 600));
        assert!(calls.get() <= 66, "{} calls", calls.get());
        assert_eq!(
            largest_fitting(&budget(u64::MAX, false), 0, u64::MAX, d),
            Some(u64::MAX - 600)
        );
    }

    #[test]
    fn saturating_total() {
        let d = Demand {
            weights: u64::MAX,
            kv: u64::MAX,
            arena: 1,
            scratch: 1,
        };
        assert_eq!(d.total(true), u64::MAX);
        assert_eq!(d.checked_total(true), None);
        assert!(
            budget(u64::MAX, true).check(&d).is_err(),
            "overflow never fits"
        );
        assert_eq!(d.total(false), u64::MAX);
    }

    #[test]
    fn for_target_policy() {
        let nano = crate::by_name("orin-nano-8").unwrap();
        let b = Budget::for_target(&nano, None, false);
        assert_eq!(b.limit_bytes, nano.usable_bytes());
        assert!(b.count_weights, "unified memory counts weights");
        let b = Budget::for_target(&nano, Some(512 * MIB), false);
        assert_eq!(b.limit_bytes, 512 * MIB);
        let b = Budget::for_target(&nano, Some(64 * GIB), false);
        assert_eq!(b.limit_bytes, 64 * GIB, "an explicit budget wins");

        let card = crate::by_name("cuda-24gb").unwrap();
        assert!(!Budget::for_target(&card, None, false).count_weights);
        assert!(Budget::for_target(&card, None, true).count_weights);
    }
}
