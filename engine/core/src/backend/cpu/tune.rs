//! Kernel choice by measurement: on a CPU with AVX-512, each weight type's matmuls run on
//! whichever of the AVX-512 and AVX2 kernels is faster *on this CPU*, for decode (one token)
//! and prefill (several) separately.
//!
//! Which is faster is not a property of the instruction set: on some AMD EPYC machines the
//! AVX2 kernels decode faster than the AVX-512 ones (memory-bound rows, where the wider loads
//! only add latency), on Intel the reverse; it changes with the weight type and the phase. So
//! the candidates are timed on the model's own matrices (a slice of each, a few milliseconds
//! in all), alternately, keeping each candidate's best time. The result is cached per CPU
//! model, kernel-set version and matrix shape (a line per shape in
//! `$XDG_CACHE_HOME/edge-run/kernel-choice.tsv`, or `~/.cache/...`; `EDGE_RUN_KERNEL_CACHE`
//! names another file, `off` disables it), so a model loads without timing the second time.
//! `EDGE_RUN_ISA` forces one set and skips all of this. The candidates are bit-identical, so
//! the choice never changes an output, only its speed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use edge_gguf::GgmlType;
use edge_kernels::cpu::{
    panel_parts, Panels, Phase, MATVEC_TOKENS, MATVEC_TOKENS8, PANELS_SCRATCH_BYTES,
};
use edge_kernels::Kernels;

use crate::graph::WeightId;
use crate::model::Model;

/// Bump when a kernel changes enough to invalidate cached choices (13: the AVX2 panels; 14:
/// IQ4_XS through them; 15: the AVX2 four-row Q4_1 / Q5_0 / Q5_1 / Q8_0 decode).
const KERNEL_SET_VERSION: u32 = 15;
/// The weight types whose AVX-512 and AVX2 kernels are timed against each other: every type
/// with an AVX-512 kernel in some phase (where a phase has none, both candidates run the same
/// kernel and the choice does not matter). Q5_0, Q5_1 and IQ4_NL were not timed before the
/// AVX2 set had its own 8-token Q5_0 kernel; on a Zen 4 CPU (512-bit integer instructions
/// split in two halves) the AVX2 one can be the faster.
const TYPES_WITH_AVX512: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];
/// Weight bytes one decode timing streams, over as many of the shape's matrices as it takes:
/// past the caches, as decode streams the weights from memory.
const DECODE_PASS_BYTES: usize = 48 << 20;
/// Weight bytes one prefill timing reads (compute-bound: a smaller slice is representative).
const PREFILL_SLICE_BYTES: usize = 1 << 19;
/// Groups of 8 tokens one prefill timing runs over its slice: the executor packs a chunk of
/// rows into panels once for all of a prompt's tokens, so one group alone would charge the
/// panels' packing 8 times what a 64-token prompt pays (and prefill runs at most 64 rows x
/// every token of the ubatch per packing).
const PREFILL_GROUPS: usize = 8;
/// How much faster (a fraction) the AVX2 candidate must time to replace the AVX-512 one. Decode
/// timings of a large model are bound by the memory for both candidates and differ by noise:
/// the 1.1B Q4_K_M file's Q4_K timed 13.9 against 14.1 ms per pass for AVX2, whose kernel then
/// decoded 45-51 tok/s where the AVX-512 one (the two-row kernel, which leaves more of the core
/// to the rest of the step) gave 49-57, alternating.
const NARROW_MARGIN: f64 = 0.03;
/// Models with fewer bytes of weights of the [`TYPES_WITH_AVX512`] keep the set's own kernels.
const MIN_MODEL_BYTES: usize = 16 << 20;
/// Cached shapes at most; past this the cache starts over (it is only a cache).
const MAX_CACHE_LINES: usize = 4096;
/// Alternating timings per candidate; each candidate keeps its best.
const ROUNDS: usize = 4;

/// One matrix shape of one weight type, and how many of the model's matmuls have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    ty_id: u32,
    rows: usize,
    cols: usize,
}

/// `kernels` with each weight type's faster set chosen per phase, where `kernels` is an
/// AVX-512 set (anything else is returned as it is). Logs the choice at info level.
pub fn choose(model: &Model, kernels: Kernels, threads: usize) -> Kernels {
    if !kernels.has_256_bit_alternative() || forced_by_env() {
        return kernels;
    }
    // Every shape of every type that has a choice, with an example weight and a count.
    let mut shapes: BTreeMap<Shape, Vec<WeightId>> = BTreeMap::new();
    for (i, w) in model.weights.iter().enumerate() {
        if w.n_rows < 2 || !TYPES_WITH_AVX512.contains(&w.ty) {
            continue;
        }
        let shape = Shape {
            ty_id: w.ty.id(),
            rows: w.n_rows,
            cols: w.row_len,
        };
        shapes.entry(shape).or_default().push(WeightId(i));
    }
    // A small model's matmuls cost microseconds whichever set runs them: not worth a timing,
    // nor a line in the cache per shape (tests and fuzzers make many tiny models).
    let candidate_bytes: usize = shapes
        .values()
        .flatten()
        .map(|&id| model.weight_bytes(id).len())
        .sum();
    if candidate_bytes < MIN_MODEL_BYTES {
        return kernels;
    }
    let cache_path = cache_path();
    let cpu = cpu_model();
    let mut cache = cache_path.as_ref().map(read_cache).unwrap_or_default();
    let mut measured_any = false;
    let started = Instant::now();
    // Per (type, phase): nanoseconds per forward pass over the model's matmuls, per candidate
    // (a prefill pass being PREFILL_GROUPS x 8 tokens).
    let mut totals: BTreeMap<(u32, u8), [f64; 2]> = BTreeMap::new();
    for (&shape, ids) in &shapes {
        let count = ids.len();
        for phase in [Phase::Decode, Phase::Prefill] {
            let key = cache_key(&cpu, shape, phase, threads);
            let ns = match cache.get(&key) {
                Some(&ns) => ns,
                None => {
                    let ns = time_candidates(model, kernels, ids, phase, threads);
                    cache.insert(key, ns);
                    measured_any = true;
                    ns
                }
            };
            let t = totals.entry((shape.ty_id, phase as u8)).or_default();
            t[0] += ns[0] * count as f64;
            t[1] += ns[1] * count as f64;
        }
    }
    let mut chosen = kernels;
    for (&(ty_id, phase), &[wide, narrow]) in &totals {
        let Some(ty) = GgmlType::from_id(ty_id) else {
            continue;
        };
        let phase = if phase == 0 {
            Phase::Decode
        } else {
            Phase::Prefill
        };
        // Within NARROW_MARGIN the timings cannot tell the sets apart, and the set's own
        // kernels stay.
        let use_256 = narrow < wide * (1.0 - NARROW_MARGIN);
        chosen = chosen.with_256_bit(ty, phase, use_256);
        log::info!(
            "kernels: {} {:?} matmuls on {} ({:.0} us vs {:.0} us of the other set per forward pass, estimated)",
            ty.name(),
            phase,
            chosen.isa_name_for(ty, phase),
            if use_256 { narrow } else { wide } / 1e3,
            if use_256 { wide } else { narrow } / 1e3
        );
    }
    if measured_any {
        log::info!(
            "kernels: timed in {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        if let Some(path) = &cache_path {
            write_cache(path, &cache);
        }
    }
    chosen
}

/// Whether `EDGE_RUN_ISA` names a set (then it is used for everything), or
/// `EDGE_RUN_KERNEL_TUNING=0` turns the measurement off.
fn forced_by_env() -> bool {
    let isa = std::env::var("EDGE_RUN_ISA").unwrap_or_default();
    let off = std::env::var("EDGE_RUN_KERNEL_TUNING").is_ok_and(|v| v == "0");
    !(isa.is_empty() || isa == "auto") || off
}

/// Best nanoseconds per matrix of this shape for the AVX-512 set and for the same with 256-bit
/// kernels for this type, from timing one pass of `phase`: decode streams whole matrices of
/// this shape (`ids`, as many as [`DECODE_PASS_BYTES`] takes) with `threads` threads, each its
/// share of the rows as the executor splits them, prefill runs [`PREFILL_GROUPS`] x 8 tokens
/// over a slice of the first on one thread.
///
/// Decode is timed on the session's threads because they share the memory bandwidth: one
/// thread alone streams its rows at the speed of its memory accesses, where the kernels
/// differ little (on a Zen 4 machine 28.4 against 28.6 ms for the 1.1B Q4_K_M model's Q4_K
/// matrices), while two threads each get half the bandwidth and the kernel that computes
/// faster wins (62 against 51-58 tok/s decode for the same model).
fn time_candidates(
    model: &Model,
    kernels: Kernels,
    ids: &[WeightId],
    phase: Phase,
    threads: usize,
) -> [f64; 2] {
    let w = model.weight(ids[0]);
    let matrix_bytes = model.weight_bytes(ids[0]).len();
    let (rows, n_matrices) = match phase {
        Phase::Decode => (
            w.n_rows,
            DECODE_PASS_BYTES
                .div_ceil(matrix_bytes.max(1))
                .clamp(1, ids.len()),
        ),
        Phase::Prefill => {
            // Whole groups of 16 rows keep every kernel on its fast path.
            let r = (PREFILL_SLICE_BYTES / (matrix_bytes / w.n_rows).max(1)) / 16 * 16;
            (r.clamp(w.n_rows.min(16), w.n_rows), 1)
        }
    };
    let x_ty = w.ty.vec_dot_type();
    let x_bytes = x_ty.row_bytes(w.row_len as u64).unwrap_or(0) as usize;
    let src: Vec<f32> = (0..w.row_len)
        .map(|i| ((i * 7919) % 211) as f32 / 105.0 - 1.0)
        .collect();
    let mut x = vec![0u8; x_bytes];
    if kernels.quantize_row(x_ty, &src, &mut x).is_err() {
        return [0.0, 0.0];
    }
    let mut y = vec![0f32; rows * MATVEC_TOKENS8];
    let candidates = [
        kernels.with_256_bit(w.ty, phase, false),
        kernels.with_256_bit(w.ty, phase, true),
    ];
    let matrices: Vec<&[u8]> = ids[..n_matrices]
        .iter()
        .map(|&id| model.weight_bytes(id))
        .collect();
    let mut best = [f64::INFINITY; 2];
    for _ in 0..ROUNDS {
        for (c, k) in candidates.iter().enumerate() {
            let ns = match phase {
                Phase::Decode => {
                    decode_pass(k, w.ty, w.row_len, &matrices, &x, &mut y[..rows], threads)
                }
                Phase::Prefill => {
                    let t = Instant::now();
                    for &bytes in &matrices {
                        prefill_pass(k, w.ty, w.row_len, bytes, &x, rows, &mut y);
                    }
                    t.elapsed().as_nanos() as f64
                }
            };
            std::hint::black_box(&y);
            best[c] = best[c].min(ns);
        }
    }
    // Per whole matrix of this shape.
    let scale = w.n_rows as f64 / rows as f64 / n_matrices as f64;
    best.map(|ns| ns * scale)
}

/// Nanoseconds of one token's matmul over each of `matrices` (`y.len()` rows each), the rows
/// split into `threads` contiguous parts computed at once, one thread each (the executor's
/// threads, too, each stream a share of a decode step's rows): the slowest thread's time from
/// a common start (the threads' start-up is not timed).
fn decode_pass(
    k: &Kernels,
    ty: GgmlType,
    n: usize,
    matrices: &[&[u8]],
    x: &[u8],
    y: &mut [f32],
    threads: usize,
) -> f64 {
    let part = y.len().div_ceil(threads.max(1)).max(1);
    let n_parts = y.len().div_ceil(part);
    let start = std::sync::Barrier::new(n_parts);
    let run = |i: usize, yp: &mut [f32]| {
        let rows = i * part..i * part + yp.len();
        start.wait();
        let t = Instant::now();
        for w in matrices {
            k.matvec(ty, n, w, x, rows.clone(), yp);
        }
        t.elapsed().as_nanos() as f64
    };
    std::thread::scope(|scope| {
        let mut parts = y.chunks_mut(part).enumerate();
        let first = parts.next();
        let others: Vec<_> = parts
            .map(|(i, yp)| scope.spawn(move || run(i, yp)))
            .collect();
        let mine = first.map_or(0.0, |(i, yp)| run(i, yp));
        others
            .into_iter()
            .map(|h| h.join().unwrap_or(f64::INFINITY))
            .fold(mine, f64::max)
    })
}

/// [`PREFILL_GROUPS`] x 8 tokens' matmul over `rows` rows, as the executor runs prefill:
/// through packed panels where the set has them, else 8 at once where it has such a kernel,
/// else 4 at a time, else one by one.
fn prefill_pass(
    k: &Kernels,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    x: &[u8],
    rows: usize,
    y: &mut [f32],
) {
    // Splits `y` into `N` output rows of `rows` each (`y` holds 8 of them).
    fn outputs<const N: usize>(y: &mut [f32], rows: usize) -> [&mut [f32]; N] {
        let mut parts = y.chunks_exact_mut(rows);
        std::array::from_fn(|_| parts.next().expect("y holds 8 rows of outputs"))
    }
    if k.panels_for(ty, n, w) {
        // The packing is timed too, once for the groups (as the executor packs a chunk once
        // for all its tokens).
        let mut buf = vec![0f32; PANELS_SCRATCH_BYTES / 4];
        let mut panels = Panels::new(&mut buf);
        for part in panel_parts(n, 0..rows) {
            k.pack_panels(ty, n, w, part.clone(), &mut panels);
            for _ in 0..PREFILL_GROUPS {
                let mut out = y.chunks_exact_mut(rows).map(|yt| &mut yt[part.clone()]);
                let y8: [&mut [f32]; MATVEC_TOKENS8] =
                    std::array::from_fn(|_| out.next().expect("y holds 8 rows of outputs"));
                let _ = k.matmul_panels8(&panels, [x; MATVEC_TOKENS8], y8);
            }
        }
        return;
    }
    for _ in 0..PREFILL_GROUPS {
        if k.matvec_tokens8(ty, n, w, [x; MATVEC_TOKENS8], 0..rows, outputs(y, rows)) {
            continue;
        }
        for four in y.chunks_exact_mut(MATVEC_TOKENS * rows) {
            if !k.matvec_tokens(ty, n, w, [x; MATVEC_TOKENS], 0..rows, outputs(four, rows)) {
                for one in four.chunks_exact_mut(rows) {
                    k.matvec(ty, n, w, x, 0..rows, one);
                }
            }
        }
    }
}

/// The cache line's key: decode timings also by thread count (see [`time_candidates`]).
fn cache_key(cpu: &str, s: Shape, phase: Phase, threads: usize) -> String {
    let phase = match phase {
        Phase::Decode => format!("Decode@{threads}t"),
        Phase::Prefill => "Prefill".to_string(),
    };
    format!(
        "{cpu}\tv{KERNEL_SET_VERSION}\t{}\t{}x{}\t{phase}",
        s.ty_id, s.rows, s.cols
    )
}

/// The CPU's model name with its family, model and stepping numbers (`/proc/cpuinfo`), or the
/// architecture where that cannot be read. The numbers matter: virtual machines often report
/// only a generic name ("AMD EPYC" for Zen 1 and Zen 4 alike), whose kernels differ in speed.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| cpu_model_from(&s))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn cpu_model_from(cpuinfo: &str) -> Option<String> {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().replace('\t', " "))
        })
    };
    let mut id = field("model name")?;
    for (label, name) in [
        ("family", "cpu family"),
        ("model", "model"),
        ("stepping", "stepping"),
    ] {
        if let Some(v) = field(name) {
            id.push_str(&format!(" {label} {v}"));
        }
    }
    Some(id)
}

fn cache_path() -> Option<PathBuf> {
    match std::env::var_os("EDGE_RUN_KERNEL_CACHE") {
        Some(v) if v == "off" => return None,
        Some(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("edge-run").join("kernel-choice.tsv"))
}

/// The cached timings: `key \t wide_ns \t narrow_ns` per line. A line that does not parse (a
/// damaged or foreign file) is ignored, so the worst a bad cache does is cost a new timing.
fn read_cache(path: &PathBuf) -> BTreeMap<String, [f64; 2]> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    parse_cache(&text)
}

fn parse_cache(text: &str) -> BTreeMap<String, [f64; 2]> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.rsplitn(3, '\t');
        let (Some(narrow), Some(wide), Some(key)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(wide), Ok(narrow)) = (wide.parse::<f64>(), narrow.parse::<f64>()) else {
            continue;
        };
        if wide.is_finite() && narrow.is_finite() && key.split('\t').count() == 5 {
            out.insert(key.to_string(), [wide, narrow]);
        }
    }
    out
}

fn format_cache(cache: &BTreeMap<String, [f64; 2]>) -> String {
    cache
        .iter()
        .map(|(k, [w, n])| format!("{k}\t{w:.0}\t{n:.0}\n"))
        .collect()
}

/// Writes the cache through a temporary file and a rename, so that two processes tuning at
/// once never leave half a file; a failure only costs a timing next time.
fn write_cache(path: &PathBuf, cache: &BTreeMap<String, [f64; 2]>) {
    if cache.len() > MAX_CACHE_LINES {
        let _ = std::fs::remove_file(path);
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ok = path
        .parent()
        .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
        && std::fs::write(&tmp, format_cache(cache)).is_ok()
        && std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        log::debug!("kernels: cannot write the choice cache {}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_key_holds_family_model_and_stepping() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n";
        assert_eq!(
            cpu_model_from(info).as_deref(),
            Some("AMD EPYC family 25 model 17 stepping 1")
        );
        assert_eq!(cpu_model_from("flags\t: avx2\n"), None);
    }

    #[test]
    fn cache_round_trips_and_ignores_damage() {
        let mut c = BTreeMap::new();
        let s = Shape {
            ty_id: 8,
            rows: 576,
            cols: 1536,
        };
        c.insert(cache_key("AMD EPYC", s, Phase::Decode, 2), [1234.0, 987.0]);
        c.insert(cache_key("AMD EPYC", s, Phase::Decode, 1), [1200.0, 990.0]);
        c.insert(cache_key("AMD EPYC", s, Phase::Prefill, 2), [50.0, 60.0]);
        let text = format_cache(&c);
        assert_eq!(parse_cache(&text), c);
        let damaged = format!("{text}garbage\nx\ty\tz\n\t\t\t\t\tNaN\t1\n{}", &text[..10]);
        assert_eq!(parse_cache(&damaged), c);
    }
}
