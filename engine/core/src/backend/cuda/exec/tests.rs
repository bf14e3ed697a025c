//! Every kernel against the CPU backend (or an f64 reference) on random inputs, odd sizes
//! included. The tests that need a CUDA device are `#[ignore]`d (so that a run without one
//! counts them as ignored, not passed) and run with `--include-ignored` on a GPU machine
//! (`scripts/gpu-run.sh`), where a missing device fails them. The host checks (the kernels'
//! block math compiled for the CPU by nvcc) run everywhere nvcc is.
//!
//! Exactness: the kernels that can reproduce the CPU's arithmetic (embed, rms_norm, quantize,
//! store_kv, add, take_last, argmax) are compared bit for bit. Dot products (matmul, attention)
//! add in another order than the CPU, so they are compared with a tolerance scaled by the sum
//! of the absolute terms (f32 rounding of reordered sums); rope and swiglu by a few ulps
//! (the GPU's sinf/cosf/expf are within 2 ulp of the CPU's libm).

use super::*;
use crate::backend::cuda::sample::sample_top_k_args;
use crate::graph::RopeOrdering;
use edge_kernels::cpu;
use half::f16;

/// Outside CI, says what is missing and the test returns; under `CI=true` (where nvcc is
/// installed) fails, naming it.
fn missing(what: &str, how: &str) {
    if matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1")) {
        panic!("{what} is missing: {how} (CI=true: a test that cannot run fails)");
    }
    eprintln!("skipped: {what} is missing: {how}");
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: CudaKernels,
}

/// Why a test that needs a GPU is ignored in a plain `cargo test`.
const NEEDS_GPU: &str = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)";

/// Device 0 with the kernels loaded; fails the test without one (these tests are ignored
/// unless asked for).
fn gpu(test: &str) -> Option<Gpu> {
    let ctx = match context(0) {
        Ok(c) => c,
        Err(e) => panic!("{test}: no CUDA device ({e}); this test {NEEDS_GPU}"),
    };
    // SAFETY: these tests use no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("stream");
    let (m, what) = module::load(&ctx).expect("kernels load");
    eprintln!(
        "{test}: running on {} with {what}",
        ctx.name().unwrap_or_default()
    );
    Some(Gpu {
        k: CudaKernels::load(&m).expect("kernels"),
        ctx,
        stream,
    })
}

impl Gpu {
    fn buf<T: Copy>(&self, data: &[T]) -> DeviceAlloc {
        let a = DeviceAlloc::new(&self.ctx, std::mem::size_of_val(data), false).unwrap();
        if !data.is_empty() {
            // SAFETY: the allocation holds size_of_val(data) bytes; synchronous copy.
            unsafe { result::memcpy_htod_sync(a.ptr, data) }.unwrap();
        }
        a
    }

    fn zeros(&self, bytes: usize) -> DeviceAlloc {
        DeviceAlloc::new(&self.ctx, bytes, false).unwrap()
    }

    fn get<T: Copy + Default>(&self, a: &DeviceAlloc, n: usize) -> Vec<T> {
        assert!(n * std::mem::size_of::<T>() <= a.bytes.max(1));
        self.stream.synchronize().unwrap();
        self.ctx.bind_to_thread().unwrap();
        let mut v = vec![T::default(); n];
        // SAFETY: n elements fit the allocation (asserted); the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut v[..], a.ptr) }.unwrap();
        v
    }

    fn run(&self, f: &CudaFunction, grid: (u32, u32), block: u32, args: &[Arg]) {
        launch(&self.stream, f, grid, block, args).unwrap();
        self.stream.synchronize().unwrap();
    }

    /// The parameter block: pos0, n_tokens, argmax, pad, tokens.
    fn params(&self, pos0: usize, tokens: &[u32]) -> DeviceAlloc {
        let mut v = vec![pos0 as i32, tokens.len() as i32, 0, 0];
        v.extend(tokens.iter().map(|&t| t as i32));
        self.buf(&v)
    }
}

fn p(a: &DeviceAlloc) -> Arg {
    Arg::U64(a.ptr)
}

/// xorshift64*: deterministic test data.
struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| ((self.f32() + 1.0) * 127.99) as u8)
            .collect()
    }
}

/// The weight types the CPU has no quantizer for (llama-quantize makes them): their test
/// blocks are random bytes with the f16 scale fields set to random values of a sane size.
/// Returns the byte offsets of those f16 fields in one block and their magnitude (chosen so
/// that dequantized values stay within about 0.3; ggml layouts, engine/src/cpu/q*.rs).
fn random_block_fields(ty: GgmlType) -> Option<(&'static [usize], f32)> {
    Some(match ty {
        GgmlType::Q5_0 => (&[0], 0.3 / 16.0),
        GgmlType::Q5_1 => (&[0, 2], 0.3 / 32.0),
        GgmlType::IQ4_NL => (&[0], 0.3 / 127.0),
        GgmlType::Q2_K => (&[80, 82], 0.3 / 45.0),
        GgmlType::Q3_K => (&[108], 0.3 / 128.0),
        GgmlType::Q4_K => (&[0, 2], 0.3 / (63.0 * 15.0)),
        GgmlType::Q5_K => (&[0, 2], 0.3 / (63.0 * 31.0)),
        GgmlType::Q6_K => (&[208], 0.3 / (128.0 * 32.0)),
        GgmlType::IQ4_XS => (&[0], 0.3 / (32.0 * 127.0)),
        _ => return None,
    })
}

/// `rows` rows of `cols` weights of `ty`: the CPU's quantization of random values where it can
/// quantize `ty`, else random blocks (every bit pattern of the quants and packed scales is a
/// valid block; see [`random_block_fields`]).
fn weights(ty: GgmlType, rows: usize, cols: usize, scale: f32, r: &mut Rng) -> Vec<u8> {
    match random_block_fields(ty) {
        None => quantized(ty, &r.vec(rows * cols, scale), rows),
        Some((fields, mag)) => {
            let bb = ty.block_bytes();
            let n_blocks = rows * cols / ty.block_size();
            let mut out = r.bytes(n_blocks * bb);
            for blk in out.chunks_exact_mut(bb) {
                for &off in fields {
                    let v = r.f32() * mag * scale / 0.3;
                    blk[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
                }
            }
            out
        }
    }
}

/// Runs engine/cuda/host_check.cu (built by build.rs) with `args` plus the given input files
/// and returns the f32s it wrote, or `None` when it was not built or cannot run here.
fn host_check(args: &[String], inputs: &[&[u8]]) -> Option<Vec<f32>> {
    let exe = env!("EDGE_RUN_CUDA_HOST_CHECK");
    if exe.is_empty() || !std::path::Path::new(exe).is_file() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "edge-run-host-check-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args);
    for (i, data) in inputs.iter().enumerate() {
        let f = dir.join(format!("in{i}"));
        std::fs::write(&f, data).unwrap();
        cmd.arg(f);
    }
    let out = dir.join("out");
    cmd.arg(&out);
    let status = cmd.output().expect("running host_check");
    assert!(
        status.status.success(),
        "host_check {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// The kernels' block decoders (`dequant`, used by `embed`) and block / chunk dot products
/// (`BlockDot`, `load_chunk` + `chunk_dot`, used by the matmul kernels) compiled for the host by
/// build.rs, against the CPU's dequantize_row (bit for bit) and vec_dot (reordering tolerance):
/// every block layout checked without a GPU. Skips when host_check could not be built.
#[test]
fn block_math_matches_cpu_on_the_host() {
    let mut r = Rng(11);
    for ty in TINY_MODEL_TYPES {
        let (n_rows, n_cols) = (3, if ty.block_size() == 256 { 512 } else { 160 });
        let w = weights(ty, n_rows, n_cols, 1.0, &mut r);
        let rb = w.len() / n_rows;
        let args = [
            "dequant".to_string(),
            ty.id().to_string(),
            n_rows.to_string(),
            n_cols.to_string(),
            rb.to_string(),
        ];
        let Some(got) = host_check(&args, &[&w]) else {
            return missing(
                "block_math_on_the_host: the host_check executable",
                "build.rs compiles it with nvcc (see the build warnings; scripts/install-nvcc.sh)",
            );
        };
        let mut want = vec![0.0f32; n_rows * n_cols];
        for row in 0..n_rows {
            cpu::dequantize_row(
                ty,
                &w[row * rb..(row + 1) * rb],
                &mut want[row * n_cols..(row + 1) * n_cols],
            )
            .unwrap();
        }
        for (i, (g, c)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                c.to_bits(),
                "{ty} dequant element {i}: {g} vs {c}"
            );
        }
    }
    for &(ty, _) in &QUANT_MATMUL {
        let n_cols = if ty.block_size() == 256 {
            256 * 3
        } else {
            32 * 9
        };
        let (n_rows, n_tok) = (5, 3);
        let w = weights(ty, n_rows, n_cols, 1.0, &mut r);
        let xty = ty.vec_dot_type();
        let x = quantized(xty, &r.vec(n_tok * n_cols, 2.0), n_tok);
        let (wrb, xrb) = (w.len() / n_rows, x.len() / n_tok);
        let args = [
            "dot".to_string(),
            ty.id().to_string(),
            n_rows.to_string(),
            n_cols.to_string(),
            n_tok.to_string(),
            wrb.to_string(),
            xrb.to_string(),
        ];
        let got = host_check(&args, &[&w, &x]).expect("host_check ran for dequant");
        for t in 0..n_tok {
            let xr = &x[t * xrb..(t + 1) * xrb];
            let mut xd = vec![0.0f32; n_cols];
            cpu::dequantize_row(xty, xr, &mut xd).unwrap();
            for row in 0..n_rows {
                let wr = &w[row * wrb..(row + 1) * wrb];
                let want = cpu::vec_dot(ty, n_cols, wr, xr);
                let mut wd = vec![0.0f32; n_cols];
                cpu::dequantize_row(ty, wr, &mut wd).unwrap();
                let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                let gv = got[t * n_rows + row];
                assert!(
                    close(gv, want, mag),
                    "{ty} token {t} row {row}: host-compiled kernel math {gv}, cpu {want}"
                );
            }
        }
    }
}

/// The pure launch arithmetic and kernel tables (no GPU needed).
#[test]
fn launch_dims_and_kernel_tables() {
    // One warp per weight row, 4 rows per 128-thread block; decode: one token, one tile.
    assert_eq!(matmul_grid(37, 1, false), (10, 1));
    assert_eq!(matmul_grid(36, 1, false), (9, 1));
    assert_eq!(matmul_grid(1, 1, false), (1, 1));
    // Prefill: token tiles of 8 (the kernels' NT), the last one partial.
    assert_eq!(matmul_grid(576, 8, false), (144, 1));
    assert_eq!(matmul_grid(576, 9, false), (144, 2));
    assert_eq!(matmul_grid(49152, 512, false), (12288, 64));
    // mm_float: one token per block row.
    assert_eq!(matmul_grid(37, 11, true), (10, 11));
    // Quantizers: 8 warps per 256-thread block, one warp per activation block.
    assert_eq!(quantize_grid(1, 576, 32), 3); // 18 blocks of 32
    assert_eq!(quantize_grid(5, 224, 32), 5); // 35 blocks
    assert_eq!(quantize_grid(1, 1536, 256), 1); // 6 blocks of 256
    assert_eq!(quantize_grid(3, 2304, 256), 4); // 27 blocks
                                                // The q8_0 cache store: 2 rows (k, v) of kv_dim/32 blocks per token, 8 warps per block.
    assert_eq!(store_kv_q8_0_grid(1, 192), 2); // 12 blocks of 32
    assert_eq!(store_kv_q8_0_grid(7, 192), 11); // 84
    assert_eq!(store_kv_q8_0_grid(1, 64), 1); // 4
                                              // Every weight type a CUDA session accepts has a matmul kernel (or is a float type), and the
                                              // tables name distinct types and kernels.
    for (i, &(ty, suffix)) in QUANT_MATMUL.iter().enumerate() {
        assert_eq!(quant_matmul_index(ty), Some(i));
        assert_eq!(suffix, ty.name(), "kernel names follow ggml's type names");
    }
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_K] {
        assert_eq!(quant_matmul_index(ty), None, "{ty}");
    }
    // The activation blocks the kernels read: 32-value blocks pair with q8_0 / q8_1 (34 / 36
    // bytes), 256-value ones with Q8_K (292 bytes), as the CPU's vec_dot_type says.
    for &(ty, _) in &QUANT_MATMUL {
        let act = ty.vec_dot_type();
        let want = if ty.block_size() == 256 {
            GgmlType::Q8_K
        } else if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            GgmlType::Q8_1
        } else {
            GgmlType::Q8_0
        };
        assert_eq!(act, want, "{ty}");
    }
    assert_eq!(GgmlType::Q8_K.block_bytes(), 292);
    // The random-block fixture covers exactly the types the CPU cannot quantize.
    for &(ty, _) in &QUANT_MATMUL {
        let cpu_quantizes = cpu::quantize_row(ty, &[0.0; 256], &mut [0u8; 512]).is_ok();
        assert_eq!(random_block_fields(ty).is_none(), cpu_quantizes, "{ty}");
    }
}

fn quantized(ty: GgmlType, x: &[f32], rows: usize) -> Vec<u8> {
    let cols = x.len() / rows;
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut out = vec![0u8; rows * rb];
    for r in 0..rows {
        cpu::quantize_row(
            ty,
            &x[r * cols..(r + 1) * cols],
            &mut out[r * rb..(r + 1) * rb],
        )
        .unwrap();
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn quantize_matches_cpu_bit_for_bit() {
    let Some(g) = gpu("quantize") else { return };
    let mut r = Rng(1);
    let (rows, cols) = (5, 32 * 7);
    let mut x = r.vec(rows * cols, 3.0);
    x[40] = 0.0; // an all-but-one-zero block is not special, an all-zero one is:
    for v in &mut x[64..96] {
        *v = 0.0;
    }
    let dx = g.buf(&x);
    for (flavour, rounding) in [
        (0, Q8Rounding::GgmlRef),
        (1, Q8Rounding::GgmlX86),
        (2, Q8Rounding::GgmlArm),
    ] {
        let k = cpu::Kernels::scalar().with_q8_rounding(rounding);
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let out = g.zeros(rows * rb);
            g.run(
                &g.k.quantize_q8,
                ((rows * cols / 32).div_ceil(8) as u32, 1),
                256,
                &[
                    p(&dx),
                    p(&out),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::U64(rb as u64),
                    Arg::I32(i32::from(ty == GgmlType::Q8_1)),
                    Arg::I32(flavour),
                ],
            );
            let got: Vec<u8> = g.get(&out, rows * rb);
            let mut want = vec![0u8; rows * rb];
            for t in 0..rows {
                k.quantize_row(
                    ty,
                    &x[t * cols..(t + 1) * cols],
                    &mut want[t * rb..(t + 1) * rb],
                )
                .unwrap();
            }
            assert_eq!(got, want, "{ty} flavour {rounding:?}");
        }
    }
    // Q8_K (the k-quants' activations): 3 rows of 3 blocks of 256, one of them all zeros,
    // others with the largest magnitude twice (opposite signs, in the same lane and in lanes
    // the reduction meets late): the first one sets the sign of the scale.
    let (rows_k, cols_k) = (3, 256 * 3);
    let mut xk = r.vec(rows_k * cols_k, 3.0);
    for v in &mut xk[256..512] {
        *v = 0.0;
    }
    xk[512 + 200] = -5.0;
    xk[512 + 13] = 5.0; // first: lane 1
    xk[768 + 10] = -6.0; // first, lane 1
    xk[768 + 11] = 6.0;
    xk[768 + 255] = 6.0;
    xk[1536 + 250] = 4.0; // lane 31 before...
    xk[1536 + 7] = -4.0; // ...lane 0: this one is first
    let rb = GgmlType::Q8_K.row_bytes(cols_k as u64).unwrap() as usize;
    let (dxk, out) = (g.buf(&xk), g.zeros(rows_k * rb));
    g.run(
        &g.k.quantize_q8_k,
        (quantize_grid(rows_k, cols_k, 256), 1),
        256,
        &[
            p(&dxk),
            p(&out),
            Arg::I32(rows_k as i32),
            Arg::I32(cols_k as i32),
            Arg::U64(rb as u64),
        ],
    );
    let got: Vec<u8> = g.get(&out, rows_k * rb);
    assert_eq!(got, quantized(GgmlType::Q8_K, &xk, rows_k), "q8_K");
    // Float activation types.
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let n = rows * cols;
        let rb = ty.row_bytes(n as u64).unwrap() as usize;
        let out = g.zeros(rb);
        g.run(
            &g.k.quantize_float,
            (n.div_ceil(256) as u32, 1),
            256,
            &[
                p(&dx),
                p(&out),
                Arg::I64(n as i64),
                Arg::I32(ty.id() as i32),
            ],
        );
        let got: Vec<u8> = g.get(&out, rb);
        assert_eq!(got, quantized(ty, &x, 1), "{ty}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn rms_norm_matches_cpu_bit_for_bit() {
    let Some(g) = gpu("rms_norm") else { return };
    let mut r = Rng(2);
    for (rows, cols) in [(3, 576), (2, 100), (1, 2048)] {
        let x = r.vec(rows * cols, 2.0);
        let w = r.vec(cols, 1.0);
        let (dx, dw, out) = (g.buf(&x), g.buf(&w), g.zeros(rows * cols * 4));
        g.run(
            &g.k.rms_norm,
            (rows as u32, 1),
            256,
            &[
                p(&dx),
                p(&dw),
                p(&out),
                Arg::I32(cols as i32),
                Arg::F32(1e-5),
            ],
        );
        let got: Vec<f32> = g.get(&out, rows * cols);
        let mut want = vec![0.0f32; rows * cols];
        for t in 0..rows {
            cpu::rms_norm(
                &x[t * cols..(t + 1) * cols],
                &w,
                1e-5,
                &mut want[t * cols..(t + 1) * cols],
            );
        }
        assert_eq!(got, want, "{rows}x{cols}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn embed_matches_cpu_dequantization() {
    let Some(g) = gpu("embed") else { return };
    let mut r = Rng(3);
    let n_rows = 11;
    let tokens = [3u32, 0, 10, 3, 99 /* out of range: zero row */];
    let params = g.params(0, &tokens);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ] {
        let row_len = if ty.block_size() == 256 { 512 } else { 32 * 5 };
        let q = weights(ty, n_rows, row_len, 1.5, &mut r);
        let rb = q.len() / n_rows;
        let (dt, out) = (g.buf(&q), g.zeros(tokens.len() * row_len * 4));
        g.run(
            &g.k.embed,
            (tokens.len() as u32, 1),
            256,
            &[
                p(&dt),
                Arg::I32(ty.id() as i32),
                Arg::U64(rb as u64),
                Arg::I32(n_rows as i32),
                Arg::I32(row_len as i32),
                p(&params),
                p(&out),
            ],
        );
        let got: Vec<f32> = g.get(&out, tokens.len() * row_len);
        for (t, &id) in tokens.iter().enumerate() {
            let mut want = vec![0.0f32; row_len];
            if (id as usize) < n_rows {
                let i = id as usize;
                cpu::dequantize_row(ty, &q[i * rb..(i + 1) * rb], &mut want).unwrap();
            }
            assert_eq!(
                &got[t * row_len..(t + 1) * row_len],
                &want[..],
                "{ty} token {t}"
            );
        }
    }
}

/// |a - b| within f32 reordering error of a sum whose absolute terms add up to `mag`.
fn close(a: f32, b: f32, mag: f32) -> bool {
    (a - b).abs() <= 1e-5 * mag + 1e-6
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn matmul_vec_and_batched_match_cpu_dots() {
    let Some(g) = gpu("matmul") else { return };
    let mut r = Rng(4);
    // Row counts: one, odd and not a multiple of the 4 rows per CUDA block, a multiple of 4.
    // Columns: fewer and more blocks (32-value types) or chunks (k-quants: 8 per 256) than the
    // 32 lanes of a warp. Tokens: the decode kernel; batched kernels with one full tile of 8 and
    // a partial one.
    let mut types: Vec<GgmlType> = QUANT_MATMUL.iter().map(|&(t, _)| t).collect();
    types.extend([GgmlType::F32, GgmlType::F16, GgmlType::BF16]);
    for wty in types {
        let col_options = if wty.block_size() == 256 {
            [256, 256 * 7]
        } else {
            [32 * 9, 32 * 45]
        };
        for (n_rows, n_cols) in [1, 37, 8]
            .into_iter()
            .flat_map(|n| col_options.map(|c| (n, c)))
        {
            let wq = weights(wty, n_rows, n_cols, 1.0, &mut r);
            for n_tok in [1usize, 11] {
                let x = r.vec(n_tok * n_cols, 2.0);
                let xty = wty.vec_dot_type();
                let xq = quantized(xty, &x, n_tok);
                let (wrb, xrb) = (wq.len() / n_rows, xq.len() / n_tok);
                let (dw, dx, out) = (g.buf(&wq), g.buf(&xq), g.zeros(n_tok * n_rows * 4));
                let common = [
                    p(&dw),
                    p(&dx),
                    p(&out),
                    Arg::I32(n_rows as i32),
                    Arg::I32(n_cols as i32),
                    Arg::I32(n_tok as i32),
                    Arg::U64(xrb as u64),
                ];
                match quant_matmul_index(wty) {
                    Some(i) => {
                        let f = if n_tok == 1 { &g.k.mmv[i] } else { &g.k.mmm[i] };
                        g.run(f, matmul_grid(n_rows, n_tok, false), 128, &common);
                    }
                    None => g.run(
                        &g.k.mm_float,
                        matmul_grid(n_rows, n_tok, true),
                        128,
                        &[
                            p(&dw),
                            Arg::I32(wty.id() as i32),
                            p(&dx),
                            p(&out),
                            Arg::I32(n_rows as i32),
                            Arg::I32(n_cols as i32),
                            Arg::I32(n_tok as i32),
                        ],
                    ),
                }
                let got: Vec<f32> = g.get(&out, n_tok * n_rows);
                for t in 0..n_tok {
                    let xr = &xq[t * xrb..(t + 1) * xrb];
                    for row in 0..n_rows {
                        let wr = &wq[row * wrb..(row + 1) * wrb];
                        let want = cpu::vec_dot(wty, n_cols, wr, xr);
                        // Magnitude: the dot of the absolute dequantized values.
                        let mut wd = vec![0.0f32; n_cols];
                        let mut xd = vec![0.0f32; n_cols];
                        cpu::dequantize_row(wty, wr, &mut wd).unwrap();
                        cpu::dequantize_row(xty, xr, &mut xd).unwrap();
                        let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                        let gv = got[t * n_rows + row];
                        assert!(
                            close(gv, want, mag),
                            "{wty} {n_rows}x{n_cols}, token {t} of {n_tok}, row {row}: gpu {gv} cpu {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn rope_matches_cpu_in_both_orderings() {
    let Some(g) = gpu("rope") else { return };
    let mut r = Rng(5);
    let (n_tok, head_dim, n_heads, pos0) = (4, 64, 3, 1000);
    let cols = head_dim * n_heads;
    let x = r.vec(n_tok * cols, 2.0);
    let params = g.params(pos0, &[0; 4]);
    let dx = g.buf(&x);
    for ordering in [RopeOrdering::Normal, RopeOrdering::NeoX] {
        for n_rot in [64, 32] {
            let rope = crate::graph::Rope {
                ordering,
                n_rot,
                freq_base: 10000.0,
                freq_scale: 0.5,
            };
            let out = g.zeros(n_tok * cols * 4);
            g.run(
                &g.k.rope,
                (n_tok as u32, 1),
                256,
                &[
                    p(&dx),
                    p(&out),
                    Arg::I32(cols as i32),
                    Arg::I32(head_dim as i32),
                    Arg::I32(n_rot as i32),
                    Arg::I32(i32::from(ordering == RopeOrdering::NeoX)),
                    Arg::F32(rope.freq_base.powf(-2.0 / n_rot as f32)),
                    Arg::F32(rope.freq_scale),
                    p(&params),
                ],
            );
            let got: Vec<f32> = g.get(&out, n_tok * cols);
            for t in 0..n_tok {
                let mut want = vec![0.0f32; cols];
                cpu::rope::rope_row(
                    &x[t * cols..(t + 1) * cols],
                    &mut want,
                    pos0 + t,
                    head_dim,
                    rope,
                );
                for (i, (a, b)) in got[t * cols..(t + 1) * cols].iter().zip(&want).enumerate() {
                    // sin/cos of angles up to ~500 rad: both within an ulp or two of exact.
                    assert!(
                        (a - b).abs() <= 1e-5,
                        "{ordering:?} n_rot {n_rot} t {t} i {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// f64 attention over an f16 cache of layout [layer][k|v][ctx][kv_dim], q rounded to f16.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    cache: &[f16],
    layer: usize,
    ctx: usize,
    kv_dim: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    pos0: usize,
    n_tok: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0f32; n_tok * n_head * head_dim];
    let group = n_head / n_head_kv;
    for t in 0..n_tok {
        for h in 0..n_head {
            let kvh = h / group;
            let qh: Vec<f64> = q[(t * n_head + h) * head_dim..][..head_dim]
                .iter()
                .map(|&v| f64::from(f16::from_f32(v).to_f32()))
                .collect();
            let n_pos = pos0 + t + 1;
            let row = |v: usize, p: usize| {
                &cache[((2 * layer + v) * ctx + p) * kv_dim + kvh * head_dim..][..head_dim]
            };
            let s: Vec<f64> = (0..n_pos)
                .map(|p| {
                    row(0, p)
                        .iter()
                        .zip(&qh)
                        .map(|(k, q)| f64::from(k.to_f32()) * q)
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..head_dim {
                let v: f64 = (0..n_pos)
                    .map(|p| e[p] * f64::from(row(1, p)[d].to_f32()))
                    .sum();
                out[(t * n_head + h) * head_dim + d] = (v / z) as f32;
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn store_kv_and_attention_decode_and_prefill_match_reference() {
    let Some(g) = gpu("attention") else { return };
    let mut r = Rng(6);
    for (n_head, n_head_kv, head_dim) in [(9, 3, 64), (4, 4, 128), (8, 2, 32)] {
        let kv_dim = n_head_kv * head_dim;
        let (ctx, n_layer, layer) = (300, 2, 1);
        // A cache with random history in every row.
        let cache: Vec<f16> = r
            .vec(2 * n_layer * ctx * kv_dim, 1.0)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        for (pos0, n_tok, splits) in [(290, 1, 2), (290, 1, 7), (0, 1, 3), (20, 7, 1), (0, 16, 1)] {
            let dcache = g.buf(&cache);
            // Store the run's own k and v first (as the graph does), and check the rows.
            let k = r.vec(n_tok * kv_dim, 1.0);
            let v = r.vec(n_tok * kv_dim, 1.0);
            let (dk, dv) = (g.buf(&k), g.buf(&v));
            let params = g.params(pos0, &vec![0; n_tok]);
            g.run(
                &g.k.store_kv_f16,
                (n_tok as u32, 1),
                256,
                &[
                    p(&dk),
                    p(&dv),
                    p(&dcache),
                    Arg::I32(layer as i32),
                    Arg::I32(ctx as i32),
                    Arg::I32(kv_dim as i32),
                    p(&params),
                ],
            );
            let mut want_cache = cache.clone();
            for t in 0..n_tok {
                for i in 0..kv_dim {
                    want_cache[((2 * layer) * ctx + pos0 + t) * kv_dim + i] =
                        f16::from_f32(k[t * kv_dim + i]);
                    want_cache[((2 * layer + 1) * ctx + pos0 + t) * kv_dim + i] =
                        f16::from_f32(v[t * kv_dim + i]);
                }
            }
            let got_cache: Vec<u16> = g.get(&dcache, cache.len());
            assert!(
                got_cache
                    .iter()
                    .zip(&want_cache)
                    .all(|(a, b)| *a == b.to_bits()),
                "store_kv rows differ"
            );
            let q = r.vec(n_tok * n_head * head_dim, 1.0);
            let dq = g.buf(&q);
            let scale = 1.0 / (head_dim as f32).sqrt();
            let partial = g.zeros(n_tok * n_head * splits * (head_dim + 2) * 4);
            let out = g.zeros(q.len() * 4);
            g.run(
                &g.k.attn_partial,
                ((n_tok * n_head) as u32, splits as u32),
                32,
                &[
                    p(&dq),
                    p(&dcache),
                    p(&partial),
                    Arg::I32(n_head as i32),
                    Arg::I32(n_head_kv as i32),
                    Arg::I32(head_dim as i32),
                    Arg::I32(ctx as i32),
                    Arg::I32(kv_dim as i32),
                    Arg::I32(layer as i32),
                    Arg::F32(scale),
                    Arg::I32(splits as i32),
                    Arg::I32(0), // quantizer flavour: unused with an f16 cache
                    p(&params),
                ],
            );
            g.run(
                &g.k.attn_combine,
                ((n_tok * n_head) as u32, 1),
                128,
                &[
                    p(&partial),
                    p(&out),
                    Arg::I32(head_dim as i32),
                    Arg::I32(splits as i32),
                ],
            );
            let got: Vec<f32> = g.get(&out, q.len());
            let want = attention_ref(
                &q,
                &want_cache,
                layer,
                ctx,
                kv_dim,
                n_head,
                n_head_kv,
                head_dim,
                pos0,
                n_tok,
                scale,
            );
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            // Outputs are convex combinations of |v| <= 1: f32 accumulation over <= 300
            // positions stays far below 1e-5.
            assert!(
                worst < 2e-5,
                "heads {n_head}/{n_head_kv} x {head_dim}, pos0 {pos0}, {n_tok} tokens, {splits} splits: max error {worst}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn add_swiglu_copy_row_match_cpu() {
    let Some(g) = gpu("elementwise") else { return };
    let mut r = Rng(7);
    let n = 3 * 1537;
    let (a, b) = (r.vec(n, 8.0), r.vec(n, 2.0));
    let (da, db, out) = (g.buf(&a), g.buf(&b), g.zeros(n * 4));
    let grid = (n.div_ceil(256) as u32, 1);
    g.run(
        &g.k.add,
        grid,
        256,
        &[p(&da), p(&db), p(&out), Arg::I64(n as i64)],
    );
    let got: Vec<f32> = g.get(&out, n);
    assert!(got
        .iter()
        .zip(a.iter().zip(&b))
        .all(|(o, (x, y))| *o == x + y));
    g.run(
        &g.k.swiglu,
        grid,
        256,
        &[p(&da), p(&db), p(&out), Arg::I64(n as i64)],
    );
    let got: Vec<f32> = g.get(&out, n);
    let mut want = vec![0.0f32; n];
    cpu::activations::swiglu_row(&a, &b, &mut want);
    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6 * (1.0 + y.abs()) * 4.0,
            "swiglu {i}: {x} vs {y}"
        );
    }
    let out_row = g.zeros(1537 * 4);
    g.run(
        &g.k.copy_row,
        (1537u32.div_ceil(256), 1),
        256,
        &[p(&da), p(&out_row), Arg::I32(1537), Arg::I32(2)],
    );
    let got: Vec<f32> = g.get(&out_row, 1537);
    assert_eq!(&got[..], &a[2 * 1537..]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn argmax_matches_cpu_including_ties() {
    let Some(g) = gpu("argmax") else { return };
    let mut r = Rng(8);
    let n = 49152 + 7;
    let mut cases = Vec::new();
    let x = r.vec(n, 10.0);
    cases.push(x.clone());
    let mut tie = x.clone();
    tie[777] = 50.0;
    tie[40000] = 50.0;
    tie[12] = 50.0;
    cases.push(tie);
    let mut nan = x.clone();
    nan[0] = f32::NAN;
    nan[5] = f32::NAN;
    cases.push(nan);
    cases.push(vec![f32::NEG_INFINITY; 100]);
    for (i, c) in cases.iter().enumerate() {
        let dx = g.buf(c);
        let params = g.params(0, &[0]);
        g.run(
            &g.k.argmax,
            (1, 1),
            1024,
            &[p(&dx), Arg::I32(c.len() as i32), p(&params)],
        );
        let got: Vec<i32> = g.get(&params, 4);
        assert_eq!(
            got[PARAM_ARGMAX] as u32,
            crate::sampling::argmax(c),
            "case {i}"
        );
    }
}

/// The q8_0 KV cache's kernels: `store_kv_q8_0` writes the CPU's q8_0 rows bit for bit (every
/// quantizer flavour), and `attn_partial_q8` + `attn_combine` match an f64 attention over the
/// dequantized cache with the query quantized to q8_0 as the CPU does (decode with splits,
/// prefill; heads of 32, 64 and 128, grouped and not).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn store_kv_and_attention_with_a_q8_0_cache_match_the_cpu_path() {
    let Some(g) = gpu("attention_q8") else { return };
    let mut r = Rng(7);
    for (n_head, n_head_kv, head_dim) in [(9, 3, 64), (4, 4, 128), (8, 2, 32)] {
        let kv_dim = n_head_kv * head_dim;
        let rb = kv_dim / 32 * 34;
        let (ctx, n_layer, layer) = (300, 2, 1);
        // A cache with random history in every row (the CPU's q8_0 rows).
        let cache = quantized(
            GgmlType::Q8_0,
            &r.vec(2 * n_layer * ctx * kv_dim, 1.0),
            2 * n_layer * ctx,
        );
        for (flavour, rounding) in [
            (0, Q8Rounding::GgmlRef),
            (1, Q8Rounding::GgmlX86),
            (2, Q8Rounding::GgmlArm),
        ] {
            let kern = cpu::Kernels::scalar().with_q8_rounding(rounding);
            for (pos0, n_tok, splits) in [(290, 1, 2), (0, 1, 3), (20, 7, 1)] {
                let dcache = g.buf(&cache);
                let k = r.vec(n_tok * kv_dim, 1.0);
                let v = r.vec(n_tok * kv_dim, 1.0);
                let (dk, dv) = (g.buf(&k), g.buf(&v));
                let params = g.params(pos0, &vec![0; n_tok]);
                g.run(
                    &g.k.store_kv_q8_0,
                    (store_kv_q8_0_grid(n_tok, kv_dim), 1),
                    256,
                    &[
                        p(&dk),
                        p(&dv),
                        p(&dcache),
                        Arg::I32(layer as i32),
                        Arg::I32(ctx as i32),
                        Arg::I32(kv_dim as i32),
                        Arg::I32(n_tok as i32),
                        Arg::I32(flavour),
                        p(&params),
                    ],
                );
                let mut want_cache = cache.clone();
                for t in 0..n_tok {
                    for (is_v, src) in [(0, &k), (1, &v)] {
                        let at = ((2 * layer + is_v) * ctx + pos0 + t) * rb;
                        kern.quantize_row(
                            GgmlType::Q8_0,
                            &src[t * kv_dim..(t + 1) * kv_dim],
                            &mut want_cache[at..at + rb],
                        )
                        .unwrap();
                    }
                }
                let got_cache: Vec<u8> = g.get(&dcache, cache.len());
                assert!(
                    got_cache == want_cache,
                    "store_kv_q8_0 rows differ (flavour {flavour}, {n_tok} tokens at {pos0})"
                );
                let q = r.vec(n_tok * n_head * head_dim, 1.0);
                let dq = g.buf(&q);
                let scale = 1.0 / (head_dim as f32).sqrt();
                let partial = g.zeros(n_tok * n_head * splits * (head_dim + 2) * 4);
                let out = g.zeros(q.len() * 4);
                g.run(
                    &g.k.attn_partial_q8,
                    ((n_tok * n_head) as u32, splits as u32),
                    32,
                    &[
                        p(&dq),
                        p(&dcache),
                        p(&partial),
                        Arg::I32(n_head as i32),
                        Arg::I32(n_head_kv as i32),
                        Arg::I32(head_dim as i32),
                        Arg::I32(ctx as i32),
                        Arg::I32(kv_dim as i32),
                        Arg::I32(layer as i32),
                        Arg::F32(scale),
                        Arg::I32(splits as i32),
                        Arg::I32(flavour),
                        p(&params),
                    ],
                );
                g.run(
                    &g.k.attn_combine,
                    ((n_tok * n_head) as u32, 1),
                    128,
                    &[
                        p(&partial),
                        p(&out),
                        Arg::I32(head_dim as i32),
                        Arg::I32(splits as i32),
                    ],
                );
                let got: Vec<f32> = g.get(&out, q.len());
                // Reference: the query head quantized by the CPU's quantizer, everything
                // dequantized (exact products of f16 scales and small integers), f64 math.
                let dequant = |bytes: &[u8], n: usize| {
                    let mut o = vec![0.0f32; n];
                    cpu::dequantize_row(GgmlType::Q8_0, bytes, &mut o).unwrap();
                    o
                };
                let mut worst = 0.0f32;
                let hb = head_dim / 32 * 34;
                for t in 0..n_tok {
                    for h in 0..n_head {
                        let kvh = h / (n_head / n_head_kv);
                        let mut q8 = vec![0u8; hb];
                        let qh = &q[(t * n_head + h) * head_dim..][..head_dim];
                        kern.quantize_row(GgmlType::Q8_0, qh, &mut q8).unwrap();
                        let qd = dequant(&q8, head_dim);
                        let row = |is_v: usize, pos: usize| {
                            let at = ((2 * layer + is_v) * ctx + pos) * rb + kvh * hb;
                            dequant(&want_cache[at..at + hb], head_dim)
                        };
                        let n_pos = pos0 + t + 1;
                        let s: Vec<f64> = (0..n_pos)
                            .map(|pos| {
                                row(0, pos)
                                    .iter()
                                    .zip(&qd)
                                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                                    .sum::<f64>()
                                    * f64::from(scale)
                            })
                            .collect();
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                        let z: f64 = e.iter().sum();
                        let vs: Vec<Vec<f32>> = (0..n_pos).map(|pos| row(1, pos)).collect();
                        for d in 0..head_dim {
                            let want: f64 = (0..n_pos)
                                .map(|pos| e[pos] * f64::from(vs[pos][d]))
                                .sum::<f64>()
                                / z;
                            let gv = got[(t * n_head + h) * head_dim + d];
                            worst = worst.max((gv - want as f32).abs());
                        }
                    }
                }
                // As for the f16 cache: convex combinations of |v| <= 1 in f32.
                assert!(
                    worst < 5e-5,
                    "q8_0 cache, heads {n_head}/{n_head_kv} x {head_dim}, flavour {flavour}, pos0 {pos0}, {n_tok} tokens, {splits} splits: max error {worst}"
                );
            }
        }
    }
}

/// Sampler settings for the sampling tests: llama.cpp's defaults, each stage alone, all
/// stages strict, a hot temperature, top-k 1, the device's largest top-k, greedy.
fn sampler_settings() -> Vec<crate::sampling::SamplerConfig> {
    use crate::sampling::SamplerConfig;
    let base = SamplerConfig {
        temperature: 1.0,
        top_k: 1024,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    vec![
        SamplerConfig::default(),
        SamplerConfig {
            top_k: 7,
            ..base.clone()
        },
        SamplerConfig {
            top_k: 300,
            top_p: 0.5,
            ..base.clone()
        },
        SamplerConfig {
            top_k: 300,
            min_p: 0.2,
            ..base.clone()
        },
        SamplerConfig {
            temperature: 0.3,
            top_k: 20,
            top_p: 0.8,
            min_p: 0.1,
            ..base.clone()
        },
        SamplerConfig {
            temperature: 3.0,
            top_k: 100,
            top_p: 0.99,
            ..base.clone()
        },
        SamplerConfig {
            top_k: 1,
            ..base.clone()
        },
        base.clone(),
        SamplerConfig {
            temperature: 0.0,
            ..base
        },
    ]
}

/// The device sampler (`sample_top_k`) against the CPU's `Sampler::sample` on random logit
/// vectors (a small and a SmolLM2-sized vocabulary; with ties, NaN, +-inf; all -inf), for
/// every setting of [`sampler_settings`] and 30 seeds: the same token, and the generators
/// advanced alike (a second sample with both samplers agrees too). The device's f32 exp is
/// `exp` in f64 rounded, the CPU's libm expf: they could differ by one ulp, which could change
/// a draw only within that rounding of a cumulative boundary (odds of about 1e-7 per draw).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn device_sampler_matches_cpu_sampler() {
    let Some(g) = gpu("sampler") else { return };
    use crate::sampling::Sampler;
    let mut r = Rng(21);
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for n in [1000usize, 49152] {
        cases.push(r.vec(n, 8.0));
    }
    let mut special = r.vec(1000, 4.0);
    for i in (0..1000).step_by(7) {
        special[i] = special[3]; // ties: the lower id first
    }
    special[10] = f32::NAN;
    special[11] = f32::INFINITY;
    special[12] = f32::NEG_INFINITY;
    cases.push(special);
    let mut few = vec![f32::NEG_INFINITY; 1000];
    few[500] = 1.0;
    few[20] = 0.5; // only two candidates survive the -inf cut
    cases.push(few);
    cases.push(vec![f32::NEG_INFINITY; 1000]); // nothing to draw: token 0, no draw
    let out = g.zeros(8);
    let (mut n_checked, mut n_device) = (0, 0);
    for (ci, logits) in cases.iter().enumerate() {
        let dl = g.buf(logits);
        for cfg in sampler_settings() {
            for seed in 0..30u64 {
                let cfg = crate::sampling::SamplerConfig {
                    seed,
                    ..cfg.clone()
                };
                let n = logits.len();
                let mut cpu_s = Sampler::new(cfg.clone(), n);
                let mut gpu_s = Sampler::new(cfg.clone(), n);
                for round in 0..2 {
                    let want = cpu_s.sample(logits);
                    let ds = gpu_s.device_sampling(n, SAMPLE_MAX_TOP_K).unwrap();
                    let got = if ds.greedy {
                        crate::sampling::argmax(logits) // the device argmax has its own test
                    } else {
                        n_device += 1;
                        gpu_s
                            .sample_with_draw(|u| {
                                g.run(
                                    &g.k.sample_top_k,
                                    (1, 1),
                                    1024,
                                    &sample_top_k_args(dl.ptr, &ds, u, out.ptr),
                                );
                                let v: Vec<i32> = g.get(&out, 2);
                                Ok::<_, ()>((v[0] as u32, v[1] != 0))
                            })
                            .unwrap()
                    };
                    assert_eq!(
                        got, want,
                        "case {ci} (n {n}), {cfg:?}, sample {round}: gpu {got} cpu {want}"
                    );
                    n_checked += 1;
                }
            }
        }
    }
    eprintln!("sampler: {n_checked} samples identical ({n_device} drawn on the device)");
}

/// `mask_logits_f32` against the host's masking (tokens whose bit is clear at -inf, ids past
/// the mask's words refused; constrain/guide_tests.rs emulates exactly this), then the masked
/// argmax and the device sampler on the result against the CPU sampler of the host-masked
/// logits: random logits of a small, a SmolLM2-sized and a 262,144-token vocabulary, masks
/// from dense to one token, a mask shorter than the logits.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn masked_logits_match_the_host_mask() {
    let Some(g) = gpu("mask") else { return };
    use crate::sampling::{Sampler, SamplerConfig};
    let mut r = Rng(5);
    let mut checked = 0;
    for n in [1000usize, 49152, 262_144] {
        let logits = r.vec(n, 8.0);
        let dl = g.buf(&logits);
        for (di, density) in [1.0f32, 0.5, 0.01, 0.0].into_iter().enumerate() {
            let short = di == 1; // a mask that covers only the first half of the logits
            let n_words = if short { n / 64 } else { n.div_ceil(32) };
            let mut words: Vec<u32> = (0..n_words)
                .map(|_| {
                    (0..32).fold(0u32, |w, b| {
                        w | (u32::from((r.f32() + 1.0) / 2.0 < density) << b)
                    })
                })
                .collect();
            words[0] |= 1 << 7; // at least two tokens allowed
            words[n_words - 1] |= 1 << 3;
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let on = words.get(i / 32).is_some_and(|w| (w >> (i % 32)) & 1 == 1);
                    if on {
                        logits[i]
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let dw = g.buf(&words);
            let out = g.zeros(n * 4);
            g.run(
                &g.k.mask_logits,
                (n.div_ceil(256) as u32, 1),
                256,
                &[
                    p(&dl),
                    Arg::I32(n as i32),
                    p(&dw),
                    Arg::I32(n_words as i32),
                    p(&out),
                ],
            );
            let got: Vec<f32> = g.get(&out, n);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "n {n}, density {density}: masked logits differ"
            );
            let params = g.params(0, &[]);
            g.run(
                &g.k.argmax,
                (1, 1),
                1024,
                &[p(&out), Arg::I32(n as i32), p(&params)],
            );
            let am: Vec<i32> = g.get(&params, 4);
            assert_eq!(
                am[2] as u32,
                crate::sampling::argmax(&want),
                "n {n}: masked argmax"
            );
            let sample_out = g.zeros(8);
            for seed in 0..10u64 {
                let cfg = SamplerConfig {
                    seed,
                    top_k: 40,
                    ..SamplerConfig::default()
                };
                let mut cpu_s = Sampler::new(cfg.clone(), n);
                let mut gpu_s = Sampler::new(cfg, n);
                let want_t = cpu_s.sample(&want);
                let ds = gpu_s.device_sampling(n, SAMPLE_MAX_TOP_K).unwrap();
                let got_t = gpu_s
                    .sample_with_draw(|u| {
                        g.run(
                            &g.k.sample_top_k,
                            (1, 1),
                            1024,
                            &sample_top_k_args(out.ptr, &ds, u, sample_out.ptr),
                        );
                        let v: Vec<i32> = g.get(&sample_out, 2);
                        Ok::<_, ()>((v[0] as u32, v[1] != 0))
                    })
                    .unwrap();
                assert_eq!(got_t, want_t, "n {n}, density {density}, seed {seed}");
                checked += 1;
            }
        }
    }
    eprintln!("mask: {checked} masked samples identical");
}

/// A tiny Llama (2 layers, 4 heads, 2 KV heads, separate output head) whose matrices are `ty`,
/// with a byte-level GPT-2 vocabulary of 258 tokens: 128 wide (heads of 32) for 32-value block
/// types, 256 wide (heads of 64) for the 256-value k-quant blocks.
fn tiny_model(ty: GgmlType) -> crate::model::Model {
    use crate::gguf::{Gguf, GgufWriter, MetaValue};
    let d = if ty.block_size() == 256 { 256u64 } else { 128 };
    let (ff, n_vocab, kv) = (256u64, 258u64, d / 2);
    let mut tokens: Vec<String> = Vec::new();
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        tokens.push(if printable {
            char::from_u32(b).unwrap().to_string()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap().to_string()
        });
    }
    tokens.push("he".into());
    tokens.push("<|endoftext|>".into());
    let mut types = vec![1i32; 257];
    types.push(3);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama");
    for (k, v) in [
        ("block_count", 2),
        ("context_length", 64),
        ("embedding_length", d as u32),
        ("feed_forward_length", ff as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
    ] {
        w.add_u32(&format!("llama.{k}"), v);
    }
    w.add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "gpt-2")
        .add_str_array("tokenizer.ggml.tokens", &refs)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add(
            "tokenizer.ggml.merges",
            MetaValue::Array(vec![MetaValue::String("h e".into())]),
        )
        .add_u32("tokenizer.ggml.eos_token_id", 257);
    let mut r = Rng(42);
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64| {
        let data = weights(ty, rows as usize, cols as usize, 0.3, &mut r);
        w.add_tensor(name, &[cols, rows], ty, data);
    };
    let ones = |n: u64| {
        (0..n)
            .flat_map(|_| 1.0f32.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    matrix(&mut w, "token_embd.weight", d, n_vocab);
    for l in 0..2 {
        w.add_tensor(
            &format!("blk.{l}.attn_norm.weight"),
            &[d],
            GgmlType::F32,
            ones(d),
        );
        matrix(&mut w, &format!("blk.{l}.attn_q.weight"), d, d);
        matrix(&mut w, &format!("blk.{l}.attn_k.weight"), d, kv);
        matrix(&mut w, &format!("blk.{l}.attn_v.weight"), d, kv);
        matrix(&mut w, &format!("blk.{l}.attn_output.weight"), d, d);
        w.add_tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[d],
            GgmlType::F32,
            ones(d),
        );
        matrix(&mut w, &format!("blk.{l}.ffn_gate.weight"), d, ff);
        matrix(&mut w, &format!("blk.{l}.ffn_up.weight"), d, ff);
        matrix(&mut w, &format!("blk.{l}.ffn_down.weight"), ff, d);
    }
    w.add_tensor("output_norm.weight", &[d], GgmlType::F32, ones(d));
    matrix(&mut w, "output.weight", d, n_vocab);
    let g = Gguf::from_bytes(w.to_bytes()).expect("tiny gguf");
    crate::model::Model::from_gguf(g).expect("tiny model")
}

/// The weight types of the tiny whole-session models: every type with CUDA kernels.
const TINY_MODEL_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// Whole sessions, CPU against CUDA, on tiny models of every supported weight type: prefill
/// (one chunk and chunks of 4), then decode steps (the replayed CUDA graph). The CPU runs its
/// tiled attention (`flash_attn`), the GPU's math: f32 query and probabilities, online softmax
/// (the CPU's default path rounds both to f16, as llama.cpp does, which alone moved a tiny f16
/// model's logits by 0.15% of their range on the H200). Float weights keep activations in f32
/// (f16 for f16 weights, rounded identically on both sides), so only summation order differs
/// (tolerance 2e-3 of the logit range); quantized weights requantize
/// activations to q8, where a value on a rounding boundary moves by one quant step (tolerance 3%
/// of the range). Every type and phase is checked before the test fails, to report them all.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn whole_sessions_match_the_cpu_on_tiny_models() {
    if gpu("tiny_sessions").is_none() {
        return;
    }
    use crate::session::{Session, SessionConfig};
    let prompt: Vec<u32> = vec![72, 101, 108, 108, 111, 32, 119, 111, 114];
    let failures = std::cell::RefCell::new(Vec::new());
    // Every type with an f16 cache; a float, a 32-block and a k-quant type with a q8_0 cache.
    let runs = TINY_MODEL_TYPES.iter().map(|&ty| (ty, KvType::F16)).chain(
        [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K]
            .into_iter()
            .map(|ty| (ty, KvType::Q8_0)),
    );
    for (ty, kv_type) in runs {
        let model = Arc::new(tiny_model(ty));
        for ubatch in [None, Some(4)] {
            let cfg = |device| SessionConfig {
                ctx: Some(32),
                ubatch,
                threads: Some(1),
                device,
                flash_attn: true,
                kv_type,
                ..Default::default()
            };
            let mut cpu_s = Session::new(model.clone(), &cfg(crate::device::Device::Cpu)).unwrap();
            let mut gpu_s =
                Session::new(model.clone(), &cfg(crate::device::Device::Cuda(0))).unwrap();
            // f32: measured up to 0.084% of the range on an H200 (the GPU's expf and sinf
            // against the CPU's polynomials, amplified by random weights); 2e-3 leaves room for
            // other GPUs' rounding.
            // A q8_0 cache requantizes k and v (and the query), so a value on a rounding
            // boundary moves by one quant step as with quantized weights.
            let rel = match (ty, kv_type) {
                (GgmlType::F32 | GgmlType::F16, KvType::F16) => 2e-3,
                _ => 3e-2,
            };
            let compare = |c: &[f32], g: &[f32], what: &str| {
                let range = c.iter().fold(0f32, |m, x| m.max(x.abs())) + 1.0;
                let worst = c
                    .iter()
                    .zip(g)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let line = format!(
                    "{ty} kv {} ubatch {ubatch:?} {what}: max |cpu - gpu| {worst} (range {range}, tolerance {})",
                    kv_type.name(),
                    rel * range
                );
                eprintln!("tiny_sessions: {line}");
                if worst > rel * range {
                    failures.borrow_mut().push(line);
                }
            };
            let c = cpu_s.prefill(&prompt).unwrap().to_vec();
            let g = gpu_s.prefill(&prompt).unwrap().to_vec();
            compare(&c, &g, "prefill");
            assert_eq!(gpu_s.argmax().unwrap(), crate::sampling::argmax(&g));
            // Decode the CPU's greedy tokens on both, so that the contexts stay identical.
            let mut next = crate::sampling::argmax(&c);
            for step in 0..6 {
                let c = cpu_s.step(next).unwrap().to_vec();
                let g = gpu_s.step(next).unwrap().to_vec();
                compare(&c, &g, &format!("step {step}"));
                next = crate::sampling::argmax(&c);
            }
        }
    }
    let failures = failures.into_inner();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fixture of `whole_sessions_match_the_cpu_on_tiny_models` is a valid model on the CPU
/// (runs without a GPU, so a GPU run never fails for the fixture's sake).
#[test]
fn tiny_models_run_on_the_cpu() {
    use crate::session::{Session, SessionConfig};
    for ty in TINY_MODEL_TYPES {
        let model = Arc::new(tiny_model(ty));
        let cfg = SessionConfig {
            ctx: Some(32),
            threads: Some(1),
            ..Default::default()
        };
        let mut s = Session::new(model, &cfg).unwrap();
        let logits = s.prefill(&[72, 101, 108]).unwrap();
        assert_eq!(logits.len(), 258);
        assert!(logits.iter().all(|x| x.is_finite()), "{ty}");
        let spread = logits.iter().fold(f32::MIN, |m, &x| m.max(x))
            - logits.iter().fold(f32::MAX, |m, &x| m.min(x));
        assert!(spread > 0.1, "{ty}: flat logits {spread}");
    }
}

/// The device sampler's arithmetic after top-k (`sample_sorted`, compiled for the host by
/// build.rs, its top-k done by a sort in the kernel's order) against the CPU's
/// `Sampler::sample`, on the logit vectors and settings of `device_sampler_matches_cpu_sampler`
/// (10 seeds): the same token, the generators advanced alike. Needs no GPU; skips when
/// host_check was not built.
#[test]
fn device_sampler_math_matches_cpu_sampler_on_the_host() {
    use crate::sampling::Sampler;
    let mut r = Rng(21);
    let mut cases: Vec<Vec<f32>> = vec![r.vec(1000, 8.0), r.vec(49152, 8.0)];
    let mut special = r.vec(1000, 4.0);
    for i in (0..1000).step_by(7) {
        special[i] = special[3];
    }
    special[10] = f32::NAN;
    special[11] = f32::INFINITY;
    special[12] = f32::NEG_INFINITY;
    cases.push(special);
    let mut few = vec![f32::NEG_INFINITY; 1000];
    few[500] = 1.0;
    few[20] = 0.5;
    cases.push(few);
    cases.push(vec![f32::NEG_INFINITY; 1000]);
    let mut n_checked = 0;
    for (ci, logits) in cases.iter().enumerate() {
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        for cfg in sampler_settings() {
            for seed in 0..10u64 {
                let cfg = crate::sampling::SamplerConfig {
                    seed,
                    ..cfg.clone()
                };
                let n = logits.len();
                let mut cpu_s = Sampler::new(cfg.clone(), n);
                let mut dev_s = Sampler::new(cfg.clone(), n);
                for round in 0..2 {
                    let want = cpu_s.sample(logits);
                    let ds = dev_s.device_sampling(n, SAMPLE_MAX_TOP_K).unwrap();
                    if ds.greedy {
                        continue;
                    }
                    let got = dev_s.sample_with_draw(|u| {
                        let args = [
                            "sample".to_string(),
                            n.to_string(),
                            ds.top_k.to_string(),
                            format!("{:?}", ds.temperature),
                            i32::from(ds.top_p.is_some()).to_string(),
                            format!("{:?}", ds.top_p.unwrap_or(1.0)),
                            i32::from(ds.ln_min_p.is_some()).to_string(),
                            format!("{:?}", ds.ln_min_p.unwrap_or(0.0)),
                            format!("{u:?}"),
                        ];
                        match host_check(&args, &[&bytes]) {
                            Some(v) => Ok((v[0] as u32, v[1] != 0.0)),
                            None => Err(()),
                        }
                    });
                    let Ok(got) = got else {
                        return missing(
                            "sampler_on_the_host: the host_check executable",
                            "build.rs compiles it with nvcc (scripts/install-nvcc.sh)",
                        );
                    };
                    assert_eq!(
                        got, want,
                        "case {ci} (n {n}), {cfg:?}, sample {round}: host-compiled {got} cpu {want}"
                    );
                    n_checked += 1;
                }
            }
        }
    }
    eprintln!("sampler_on_the_host: {n_checked} samples identical");
}

/// `Session::sample` on a CUDA session (logits left on the device) gives the token the CPU
/// sampler gives for the same session's logits copied to the host, for every setting of
/// [`sampler_settings`] plus two that sample on the host (top-k off; a repetition penalty with
/// history), over decode steps, with generators advancing alike.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on one (scripts/gpu-run.sh)"]
fn session_sample_on_the_device_matches_the_cpu_sampler() {
    if gpu("session_sample").is_none() {
        return;
    }
    use crate::sampling::{Sampler, SamplerConfig};
    use crate::session::{Session, SessionConfig};
    let model = Arc::new(tiny_model(GgmlType::Q8_0));
    let cfg = SessionConfig {
        ctx: Some(64),
        threads: Some(1),
        device: crate::device::Device::Cuda(0),
        ..Default::default()
    };
    let mut settings = sampler_settings();
    settings.push(SamplerConfig {
        top_k: 0,
        ..Default::default()
    });
    settings.push(SamplerConfig {
        repeat_penalty: 1.3,
        ..Default::default()
    });
    let n_vocab = model.params.n_vocab;
    for sc in settings {
        let mut s = Session::new(model.clone(), &cfg).unwrap();
        for seed in [1u64, 2, 3] {
            let sc = SamplerConfig { seed, ..sc.clone() };
            let mut cpu_s = Sampler::new(sc.clone(), n_vocab);
            let mut gpu_s = Sampler::new(sc.clone(), n_vocab);
            s.reset();
            s.advance(&[72, 101, 108, 108]).unwrap();
            for step in 0..8 {
                let got = s.sample(&mut gpu_s).unwrap();
                let want = cpu_s.sample(s.logits());
                assert_eq!(got, want, "{sc:?} step {step}");
                cpu_s.accept(want);
                gpu_s.accept(got);
                s.advance(&[got]).unwrap();
            }
        }
    }
}
