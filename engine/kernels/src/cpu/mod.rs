//! CPU kernels: per-type block layouts, row (de)quantization, dot products and the matrix-vector
//! product the graph executor runs, plus the f32 helpers (RMS norm, f16 rows) and the ggml-ordered
//! kernels (`ggml_order`: f16 dots, exp, SiLU).
//!
//! Every type lives in its own file (`q4_1.rs`: block layout, scalar reference, tests); SIMD
//! variants live in `avx2.rs` (x86-64) and `neon.rs` (aarch64) and are tested against the scalar
//! references. Which variant runs is decided once, by [`Kernels::detect`], never per call.
//!
//! # Bit-exactness with ggml
//!
//! Block layouts are ggml's, byte for byte. Activation quantization ([`quantize_row`] into Q8_0 /
//! Q8_1) reproduces ggml's *reference* quantizers (`quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref`): `d = amax / 127`, `q = roundf(x * (1/d))` (half away from zero) using
//! the f32 `d`, then `d` stored as f16 (round to nearest even); for Q8_1, `s = f16(sum(q) * d)`
//! with the f32 `d`. Dot products accumulate each block in integers, as ggml does, and scale the
//! integer sum by the product of the f16 scales.
//!
//! # Memory safety
//!
//! Quantized data arrives as `&[u8]` straight from a memory map, with no alignment guarantee.
//! The block structs ([`BlockQ4_0`], ...) are `#[repr(C)]` and made only of byte arrays, so their
//! alignment is 1 and every bit pattern is valid; `blocks` (`block.rs`) reinterprets a byte slice
//! as blocks with that invariant checked at compile time. f16 fields are decoded with
//! `from_le_bytes`.
//!
//! # Layout
//!
//! This file is the face of the module: these docs, the `mod` declarations, the re-exports and
//! the dispatch ([`Kernels`], [`dequantize_row`], [`quantize_row`], [`vec_dot`]), which calls
//! into the per-type and per-instruction-set files. Those files (their tests aside) never import
//! this one: what they share lives in leaves they import directly, `block.rs` (the `Block`
//! marker, `blocks`, [`QK`], the f16 field codecs), `rounding.rs` ([`Q8Rounding`]) and `error.rs`
//! ([`KernelError`] and the row-size checks), plus `x86.rs` for the x86 files; a file that needs
//! another type's block imports it from that type's file (`super::q8_0::BlockQ8_0`).

pub mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_quants;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bf16;
mod block;
mod encoder;
mod error;
mod f16;
mod f32;
pub mod ggml_order;
mod iq4_nl;
mod iq4_xs;
#[cfg(target_arch = "x86_64")]
mod iq4_xs_rows;
#[cfg(target_arch = "x86_64")]
mod kquant_order;
#[cfg(target_arch = "x86_64")]
mod legacy_rows;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_quants;
mod ops;
mod panels;
mod q2_k;
mod q3_k;
mod q4_0;
#[cfg(target_arch = "x86_64")]
mod q4_0_rows;
mod q4_1;
mod q4_k;
#[cfg(target_arch = "x86_64")]
mod q4_k_rows;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
#[cfg(target_arch = "x86_64")]
mod q6_k_rows;
mod q8_0;
#[cfg(target_arch = "x86_64")]
mod q8_0_rows;
mod q8_1;
mod q8_k;
#[cfg(test)]
mod quant_vectors;
#[cfg(target_arch = "x86_64")]
mod repack;
pub mod rope;
mod rounding;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use edge_gguf::GgmlType;

use block::{blocks, blocks_mut};
use error::{check_len, matrix_rows};

pub use bf16::{bf16_bits_to_f32, f32_to_bf16_bits};
pub use block::{f16_bits_to_f32, QK};
pub use encoder::{attend_all, gelu, gelu_tanh, layer_norm};
pub use error::KernelError;
pub use ops::{f32_to_f16_row, rms_norm, rms_scale, scale_by_weight};
pub use panels::{
    panel_parts, panel_rows, Panels, PANELS_SCRATCH_BYTES, PANEL_MAX_BLOCKS, PANEL_ROWS,
};
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
#[cfg(target_arch = "x86_64")]
use q5_1::BlockQ5_1;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;
pub use q8_k::{BlockQ8_K, QK_K};
pub use rounding::Q8Rounding;

/// Decodes `dst.len()` elements of type `ty` from the front of `src` (raw ggml bytes, any
/// alignment) into `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let need = check_len("dequantize_row", ty, dst.len(), src.len())?;
    let src = &src[..need];
    match ty {
        GgmlType::F32 => f32::dequantize_row(src, dst),
        GgmlType::F16 => f16::dequantize_row(src, dst),
        GgmlType::BF16 => bf16::dequantize_row(src, dst),
        GgmlType::Q4_0 => q4_0::dequantize_row(blocks(src), dst),
        GgmlType::Q4_1 => q4_1::dequantize_row(blocks(src), dst),
        GgmlType::Q8_0 => q8_0::dequantize_row(blocks(src), dst),
        GgmlType::Q8_1 => q8_1::dequantize_row(blocks(src), dst),
        GgmlType::Q5_0 => q5_0::dequantize_row(blocks(src), dst),
        GgmlType::Q5_1 => q5_1::dequantize_row(blocks(src), dst),
        GgmlType::Q2_K => q2_k::dequantize_row(blocks(src), dst),
        GgmlType::Q3_K => q3_k::dequantize_row(blocks(src), dst),
        GgmlType::Q4_K => q4_k::dequantize_row(blocks(src), dst),
        GgmlType::Q5_K => q5_k::dequantize_row(blocks(src), dst),
        GgmlType::Q6_K => q6_k::dequantize_row(blocks(src), dst),
        GgmlType::Q8_K => q8_k::dequantize_row(blocks(src), dst),
        GgmlType::IQ4_NL => iq4_nl::dequantize_row(blocks(src), dst),
        GgmlType::IQ4_XS => iq4_xs::dequantize_row(blocks(src), dst),
        GgmlType::Unsupported(_) => unreachable!("rejected by check_len"),
    }
    Ok(())
}

/// Encodes `src` as type `ty` into the front of `dst`, exactly as ggml's reference code does.
///
/// The activation types (Q8_0, Q8_1, Q8_K, F16, BF16, F32) are what the executor uses; Q4_0 and
/// Q4_1 (ggml's `quantize_row_q4_*_ref`) are provided for tools and tests. The other weight types
/// (Q5_0 .. IQ4_XS) have no quantizer here: [`KernelError::Unsupported`].
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let need = check_len("quantize_row", ty, src.len(), dst.len())?;
    let dst = &mut dst[..need];
    match ty {
        GgmlType::F32 => f32::quantize_row(src, dst),
        GgmlType::F16 => f16::quantize_row(src, dst),
        GgmlType::BF16 => bf16::quantize_row(src, dst),
        GgmlType::Q4_0 => q4_0::quantize_row(src, blocks_mut(dst)),
        GgmlType::Q4_1 => q4_1::quantize_row(src, blocks_mut(dst)),
        GgmlType::Q8_0 => q8_0::quantize_row(src, blocks_mut(dst)),
        GgmlType::Q8_1 => q8_1::quantize_row(src, blocks_mut(dst)),
        GgmlType::Q8_K => q8_k::quantize_row(src, blocks_mut(dst)),
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_NL
        | GgmlType::IQ4_XS => {
            return Err(KernelError::Unsupported {
                op: "quantize_row",
                ty,
            })
        }
        GgmlType::Unsupported(_) => unreachable!("rejected by check_len"),
    }
    Ok(())
}

/// Scalar reference dot product of a weight row (`n` elements of `w_ty`) with an activation row
/// already in `w_ty.vec_dot_type()` (see [`GgmlType::vec_dot_type`]).
///
/// Lengths are the caller's guarantee (checked by `debug_assert!` only): `w_row` and `x_row` hold
/// at least `n` elements of their types, and `n` is a multiple of the block size.
///
/// # Panics
/// If `w_ty` is unsupported (model loading must reject such weights first).
pub fn vec_dot(w_ty: GgmlType, n: usize, w_row: &[u8], x_row: &[u8]) -> f32 {
    Kernels::scalar().vec_dot(w_ty, n, w_row, x_row)
}

/// The names `EDGE_RUN_ISA` and [`Kernels::by_name`] accept.
pub const ISA_NAMES: [&str; 4] = ["scalar", "avx2", "avx512", "neon"];

/// Which instruction set a [`Kernels`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Scalar,
    /// x86_64 AVX2 + FMA + F16C; the token proves they were detected.
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Token),
    /// aarch64 NEON, with or without the dot-product instructions; the token proves them.
    #[cfg(target_arch = "aarch64")]
    Neon(neon::Token),
}

/// Kernels chosen once at load: the scalar references, or SIMD variants behind run-time CPU
/// feature detection, and the activation rounding flavour. Copy it into every worker; it is a few
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    isa: Isa,
    q8: Q8Rounding,
    /// Per [`Phase`], a bit per weight type (by GGML id) whose matmuls run on the 256-bit
    /// kernels of an AVX-512 set: measured to be faster for it on this CPU
    /// ([`Kernels::with_256_bit`]). Results are the same bits either way.
    narrow: [u64; 2],
}

/// Which matmuls a kernel choice is for: one activation row (decode: [`Kernels::matvec`]) or
/// several at once (prefill: [`Kernels::matvec_tokens`], [`Kernels::matvec_tokens8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// One token at a time.
    Decode = 0,
    /// Several tokens at a time.
    Prefill = 1,
}

impl Kernels {
    /// The best kernels this CPU runs, unless the environment variable `EDGE_RUN_ISA` names a
    /// path ([`Kernels::by_name`]: `scalar`, `avx2`, `avx512`, `neon`; `auto` or empty = the
    /// best): a path this CPU (or build) lacks falls back to scalar with a warning, an unknown
    /// name to the best path with a warning. Activation rounding is the host's flavour
    /// ([`Q8Rounding::host`]) unless `EDGE_RUN_Q8_ROUNDING` is `ref`, `arm` or `x86`. Neither
    /// choice changes results beyond the last bits of dot products: every instruction set
    /// quantizes identically.
    pub fn detect() -> Kernels {
        // llama.cpp's outputs define correct, and llama.cpp rounds activations the way its SIMD
        // code for this architecture does: match that by default.
        let k = Kernels::detect_isa().with_q8_rounding(Q8Rounding::host());
        match std::env::var("EDGE_RUN_Q8_ROUNDING").ok().as_deref() {
            None | Some("") => k,
            Some(name) => match Q8Rounding::from_name(name) {
                Some(r) => k.with_q8_rounding(r),
                None => {
                    log::warn!("EDGE_RUN_Q8_ROUNDING={name} is not ref/arm/x86; using the host's");
                    k
                }
            },
        }
    }

    fn detect_isa() -> Kernels {
        let want = std::env::var("EDGE_RUN_ISA").ok();
        match want.as_deref() {
            None | Some("") | Some("auto") => Kernels::best(),
            Some(name) if ISA_NAMES.contains(&name) => Kernels::by_name(name).unwrap_or_else(|| {
                log::warn!(
                    "EDGE_RUN_ISA={name} but this CPU or build has no {name} kernels; using scalar kernels"
                );
                Kernels::scalar()
            }),
            Some(other) => {
                log::warn!(
                    "EDGE_RUN_ISA={other} is not known (use one of {}); detecting the CPU",
                    ISA_NAMES.join(", ")
                );
                Kernels::best()
            }
        }
    }

    /// The best kernels this CPU runs (activation rounding [`Q8Rounding::GgmlRef`], like every
    /// constructor but [`Kernels::detect`]).
    pub fn best() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = Kernels::avx512().or_else(Kernels::avx2) {
            return k;
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(k) = Kernels::neon() {
            return k;
        }
        Kernels::scalar()
    }

    /// The kernels of the instruction set named `name` (one of [`ISA_NAMES`]), if this CPU and
    /// this build have them; `neon` is the best NEON variant (with `sdot` where the CPU has the
    /// dot-product instructions). Activation rounding is [`Q8Rounding::GgmlRef`]; use
    /// [`Kernels::with_q8_rounding`] (with [`Q8Rounding::host`] to match [`Kernels::detect`]).
    /// `avx512` is the AVX2 set with AVX-512 (F, BW, VL, VNNI) kernels for Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS, which give the same bits.
    pub fn by_name(name: &str) -> Option<Kernels> {
        match name {
            "scalar" => Some(Kernels::scalar()),
            #[cfg(target_arch = "x86_64")]
            "avx2" => Kernels::avx2(),
            #[cfg(target_arch = "x86_64")]
            "avx512" => Kernels::avx512(),
            #[cfg(target_arch = "aarch64")]
            "neon" => Kernels::neon(),
            _ => None,
        }
    }

    /// Every kernel set this CPU runs, scalar first: what tests compare against each other. On
    /// aarch64 with the dot-product instructions both NEON variants are listed.
    pub fn available() -> Vec<Kernels> {
        #[allow(unused_mut)] // one entry on CPUs without SIMD kernels
        let mut v = vec![Kernels::scalar()];
        #[cfg(target_arch = "x86_64")]
        v.extend(Kernels::avx2().into_iter().chain(Kernels::avx512()));
        #[cfg(target_arch = "aarch64")]
        {
            v.extend(Kernels::neon_without_dotprod());
            v.extend(Kernels::neon().filter(|k| k.isa_name() == "neon+dotprod"));
        }
        v
    }

    /// The scalar reference kernels (portable; what every SIMD variant is tested against).
    pub fn scalar() -> Kernels {
        Kernels {
            isa: Isa::Scalar,
            q8: Q8Rounding::GgmlRef,
            narrow: [0; 2],
        }
    }

    /// The same kernels with another activation rounding flavour.
    pub fn with_q8_rounding(self, q8: Q8Rounding) -> Kernels {
        Kernels { q8, ..self }
    }

    /// The activation rounding flavour.
    pub fn q8_rounding(&self) -> Q8Rounding {
        self.q8
    }

    /// The AVX2 kernels, if this CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    pub fn avx2() -> Option<Kernels> {
        x86::Token::detect().map(|t| Kernels {
            isa: Isa::Avx2(t),
            q8: Q8Rounding::GgmlRef,
            narrow: [0; 2],
        })
    }

    /// The AVX-512 kernels (AVX2 plus AVX-512 F, BW, VL and VNNI kernels where they are
    /// faster; bit-identical results), if this CPU has all of those.
    #[cfg(target_arch = "x86_64")]
    pub fn avx512() -> Option<Kernels> {
        x86::Token::detect_avx512().map(|t| Kernels {
            isa: Isa::Avx2(t),
            q8: Q8Rounding::GgmlRef,
            narrow: [0; 2],
        })
    }

    /// The NEON kernels, if this CPU has NEON (every aarch64 CPU Linux runs on): with `sdot` if
    /// it has the dot-product instructions (ARMv8.2 `dotprod`, e.g. Orin's Cortex-A78AE), else
    /// with widening multiplies.
    #[cfg(target_arch = "aarch64")]
    pub fn neon() -> Option<Kernels> {
        neon::Token::detect().map(|t| Kernels {
            isa: Isa::Neon(t),
            q8: Q8Rounding::GgmlRef,
            narrow: [0; 2],
        })
    }

    /// The NEON kernels with widening multiplies even where the CPU has `sdot` (results are
    /// bit-identical to [`Kernels::neon`]'s; for tests and benchmarks).
    #[cfg(target_arch = "aarch64")]
    pub fn neon_without_dotprod() -> Option<Kernels> {
        neon::Token::detect().map(|t| Kernels {
            isa: Isa::Neon(t.without_dotprod()),
            q8: Q8Rounding::GgmlRef,
            narrow: [0; 2],
        })
    }

    /// The instruction set in use: `"scalar"`, `"avx2"`, `"avx512"`, `"neon"` or
    /// `"neon+dotprod"`.
    pub fn isa_name(&self) -> &'static str {
        match self.isa {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(t) => {
                if t.avx512() {
                    "avx512"
                } else {
                    "avx2"
                }
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon(t) => {
                if t.dotprod() {
                    "neon+dotprod"
                } else {
                    "neon"
                }
            }
        }
    }

    /// Whether this set has a 256-bit alternative for some weight types' matmuls (an AVX-512
    /// set, whose AVX2 kernels give the same bits): what [`Kernels::with_256_bit`] can choose.
    pub fn has_256_bit_alternative(&self) -> bool {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(t) => t.avx512(),
            _ => false,
        }
    }

    /// The same kernels, with `w_ty`'s matmuls in `phase` on the 256-bit (AVX2) kernels
    /// (`on`) or on the set's own. A no-op where [`Kernels::has_256_bit_alternative`] is false.
    /// Outputs are unchanged: the AVX2 and AVX-512 kernels are bit-identical (tested).
    pub fn with_256_bit(mut self, w_ty: GgmlType, phase: Phase, on: bool) -> Kernels {
        if self.has_256_bit_alternative() && w_ty.id() < 64 {
            let bit = 1u64 << w_ty.id();
            let m = &mut self.narrow[phase as usize];
            *m = if on { *m | bit } else { *m & !bit };
        }
        self
    }

    /// The instruction set `w_ty`'s matmuls in `phase` run on: [`Kernels::isa_name`], or
    /// `"avx2"` where [`Kernels::with_256_bit`] chose it.
    pub fn isa_name_for(&self, w_ty: GgmlType, phase: Phase) -> &'static str {
        Kernels {
            isa: self.isa_for(w_ty, phase),
            ..*self
        }
        .isa_name()
    }

    /// Whether this set's 8-token Q8_0 and Q5_0 kernels keep rows in the lanes (`q8_0_rows.rs`:
    /// AVX2 without AVX-512), adding each block's exact dot once instead of ggml's lane sums.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn q8_0_tokens_blockwise(&self) -> bool {
        matches!(self.isa_for(GgmlType::Q8_0, Phase::Prefill), Isa::Avx2(t) if !t.avx512())
    }

    /// Whether this is an x86 set (AVX2, with or without AVX-512), whose 8-token Q5_0 and Q6_K
    /// kernels add in another order than one token (`q8_0_rows.rs`, `q6_k_rows.rs`).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(super) fn x86_set(&self) -> bool {
        matches!(self.isa, Isa::Avx2(_))
    }

    /// The instruction set for `w_ty`'s matmuls in `phase`.
    fn isa_for(&self, w_ty: GgmlType, phase: Phase) -> Isa {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa {
            if w_ty.id() < 64 && self.narrow[phase as usize] & (1u64 << w_ty.id()) != 0 {
                return Isa::Avx2(t.without_avx512());
            }
        }
        let _ = (w_ty, phase);
        self.isa
    }

    /// [`quantize_row`] with this instruction set and this rounding flavour. Results are
    /// bit-identical whatever the instruction set (for finite inputs).
    pub fn quantize_row(
        &self,
        ty: GgmlType,
        src: &[f32],
        dst: &mut [u8],
    ) -> Result<(), KernelError> {
        if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
            return quantize_row(ty, src, dst);
        }
        let need = check_len("quantize_row", ty, src.len(), dst.len())?;
        let dst = &mut dst[..need];
        let r = self.q8;
        match (self.isa, ty) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q8_0) => avx2::quantize_row_q8_0(t, src, blocks_mut(dst), r),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), _) => avx2::quantize_row_q8_1(t, src, blocks_mut(dst), r),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q8_0) => neon::quantize_row_q8_0(t, src, blocks_mut(dst), r),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), _) => neon::quantize_row_q8_1(t, src, blocks_mut(dst), r),
            (_, GgmlType::Q8_0) => q8_0::quantize_row_with(src, blocks_mut(dst), r),
            _ => q8_1::quantize_row_with(src, blocks_mut(dst), r),
        }
        Ok(())
    }

    /// [`vec_dot`] with this instruction set (SIMD variants may differ from the scalar reference
    /// in the last bits, by summation order).
    ///
    /// # Panics
    /// If `w_ty` is unsupported.
    pub fn vec_dot(&self, w_ty: GgmlType, n: usize, w_row: &[u8], x_row: &[u8]) -> f32 {
        let x_ty = w_ty.vec_dot_type();
        debug_assert!(
            n.is_multiple_of(w_ty.block_size().max(1)),
            "{n} not whole {w_ty} blocks"
        );
        let wb = n / w_ty.block_size().max(1) * w_ty.block_bytes();
        let xb = n / x_ty.block_size().max(1) * x_ty.block_bytes();
        debug_assert!(w_row.len() >= wb, "weight row too short");
        debug_assert!(x_row.len() >= xb, "activation row too short");
        let (w, x) = (&w_row[..wb], &x_row[..xb]);
        match (self.isa, w_ty) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_1) => avx2::dot_q4_1_q8_1(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_0) => avx2::dot_q4_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q8_0) => avx2::dot_q8_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_1) => neon::dot_q4_1_q8_1(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_0) => neon::dot_q4_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q8_0) => neon::dot_q8_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_K) => neon_quants::dot_q4_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_K) => neon_quants::dot_q5_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q6_K) => neon_quants::dot_q6_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_0) => neon_quants::dot_q5_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_1) => neon_quants::dot_q5_1_q8_1(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::IQ4_NL) => {
                neon_quants::dot_iq4_nl_q8_0(t, blocks(w), blocks(x))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q2_K) => neon_quants::dot_q2_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q3_K) => neon_quants::dot_q3_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::IQ4_XS) => {
                neon_quants::dot_iq4_xs_q8_k(t, blocks(w), blocks(x))
            }
            // The scalar set on x86-64 adds in ggml's x86 order, as the avx2 set does.
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_1) => ggml_order::dot_q4_1_q8_1_x86(blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_0) => ggml_order::dot_q4_0_q8_0_x86(blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q8_0) => ggml_order::dot_q8_0_q8_0_x86(blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_0) => avx2_quants::dot_q5_0_q8_0(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_1) => avx2_quants::dot_q5_1_q8_1(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_NL) => {
                avx2_quants::dot_iq4_nl_q8_0(t, blocks(w), blocks(x))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_K) => avx2_quants::dot_q4_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_K) => avx2_quants::dot_q5_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q6_K) => avx2_quants::dot_q6_k_q8_k(t, blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q2_K) => {
                kquant_order::avx2::dot_q2_k_q8_k(t, blocks(w), blocks(x))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q3_K) => {
                kquant_order::avx2::dot_q3_k_q8_k(t, blocks(w), blocks(x))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_XS) => {
                kquant_order::avx2::dot_iq4_xs_q8_k(t, blocks(w), blocks(x))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q2_K) => kquant_order::dot_q2_k_q8_k(blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q3_K) => kquant_order::dot_q3_k_q8_k(blocks(w), blocks(x)),
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::IQ4_XS) => kquant_order::dot_iq4_xs_q8_k(blocks(w), blocks(x)),
            (_, GgmlType::F32) => f32::vec_dot(w, x),
            (_, GgmlType::F16) => f16::vec_dot(w, x),
            (_, GgmlType::BF16) => bf16::vec_dot(w, x),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q4_0) => q4_0::vec_dot(blocks(w), blocks(x)),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q4_1) => q4_1::vec_dot(blocks(w), blocks(x)),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q8_0) => q8_0::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q8_1) => q8_1::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q5_0) => q5_0::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q5_1) => q5_1::vec_dot(blocks(w), blocks(x)),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q2_K) => q2_k::vec_dot(blocks(w), blocks(x)),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q3_K) => q3_k::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q4_K) => q4_k::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q5_K) => q5_k::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q6_K) => q6_k::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Q8_K) => q8_k::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::IQ4_NL) => iq4_nl::vec_dot(blocks(w), blocks(x)),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::IQ4_XS) => iq4_xs::vec_dot(blocks(w), blocks(x)),
            (_, GgmlType::Unsupported(id)) => panic!("vec_dot: unsupported weight type id {id}"),
        }
    }

    /// `y[i] = dot(W row rows.start + i, x)` for every row in `rows`: `W` is the raw bytes of a
    /// matrix of type `w_ty` whose rows have `n` elements (row `r` starts at byte
    /// `r * row_bytes(n)`), `x_q` is the activation already quantized to
    /// `w_ty.vec_dot_type()` (see [`GgmlType::vec_dot_type`]).
    ///
    /// `y` is indexed relative to `rows.start` (`y.len() == rows.len()`), so that threads can
    /// split one output with `chunks_mut` / `split_at_mut`.
    ///
    /// `w` must be the whole matrix: on x86-64 its row count (`w.len() / row_bytes(n)`) decides
    /// the summation order of Q4_0, IQ4_NL, Q4_K and Q2_K, as llama.cpp repacks those matrices
    /// when it is a multiple of 8 (see `repack.rs`).
    ///
    /// # Panics
    /// If `w_ty` is unsupported, `n` is not whole blocks, `y.len() != rows.len()`, or `w` / `x_q`
    /// are too short (the executor sizes them from the validated model, so these are bugs).
    pub fn matvec(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        x_q: &[u8],
        rows: Range<usize>,
        y: &mut [f32],
    ) {
        let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
        let isa = self.isa_for(w_ty, Phase::Decode);
        assert_eq!(y.len(), rows.len(), "matvec: y must have one slot per row");
        assert!(x_q.len() >= xb, "matvec: activation too short");
        // llama.cpp repacks some types into 8-row groups, by the whole matrix's row count.
        #[cfg(target_arch = "x86_64")]
        let repacked = rb != 0 && repack::repacked_shape(w.len() / rb);
        #[cfg(target_arch = "x86_64")]
        let w_matrix = w;
        let w = w_rows;
        let x = &x_q[..xb];
        if rb == 0 {
            y.fill(0.0);
            return;
        }
        // The AVX2 Q4_0/Q4_1/Q8_0 kernels of avx2.rs prefetch inside their loops.
        #[cfg(target_arch = "x86_64")]
        let streams_itself = match isa {
            Isa::Avx2(_) => {
                matches!(w_ty, GgmlType::Q4_1 | GgmlType::Q8_0)
                    || (w_ty == GgmlType::Q4_0 && !repacked)
                    || w_ty == GgmlType::Q6_K
                    || (w_ty == GgmlType::Q4_K && repacked)
            }
            _ => false,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let streams_itself = false;
        // One dispatch per call; the per-row closure is monomorphic in the type.
        macro_rules! rows_with {
            ($dot:expr) => {
                for (i, (yi, wr)) in y.iter_mut().zip(w.chunks_exact(rb)).enumerate() {
                    if !streams_itself {
                        prefetch_ahead(w, (i + 1) * rb + PREFETCH_BYTES, rb);
                    }
                    *yi = $dot(wr);
                }
            };
        }
        // Eight rows per call (row r in SIMD lane r, as llama.cpp's repacked gemv holds them),
        // the rest one by one.
        #[cfg(target_arch = "x86_64")]
        macro_rules! rows8_with {
            ($dot8:expr, $dot:expr) => {{
                let (y8, y1) = y.split_at_mut(y.len() / 8 * 8);
                let (w8, w1) = w.split_at(y8.len() * rb);
                let groups_ahead = (x86::ROWS8_AHEAD_BYTES / (8 * rb)).max(1);
                for (g, (ys, ws)) in y8
                    .chunks_exact_mut(8)
                    .zip(w8.chunks_exact(8 * rb))
                    .enumerate()
                {
                    // The kernel prefetches a group of 8 rows `groups_ahead` groups on (past
                    // this call's, where the matrix has them: this thread's next call reads
                    // them).
                    let next = (rows.start + 8 * (g + groups_ahead)) * rb;
                    let ahead =
                        &w_matrix[next.min(w_matrix.len())..(next + 8 * rb).min(w_matrix.len())];
                    let rows8 = std::array::from_fn(|k| blocks(&ws[k * rb..(k + 1) * rb]));
                    ys.copy_from_slice(&$dot8(rows8, ahead));
                }
                for (yi, wr) in y1.iter_mut().zip(w1.chunks_exact(rb)) {
                    *yi = $dot(blocks(wr));
                }
            }};
        }
        // Two rows per call with the AVX-512 two-row kernels (they stream their own weights).
        #[cfg(target_arch = "x86_64")]
        macro_rules! rows2_with {
            ($t:expr, $dot2:path, $dot:path) => {{
                let xb = blocks(x);
                let (y2, y1) = y.split_at_mut(y.len() / 2 * 2);
                let (w2, w1) = w.split_at(y2.len() * rb);
                for (ys, ws) in y2.chunks_exact_mut(2).zip(w2.chunks_exact(2 * rb)) {
                    let pair = [blocks(&ws[..rb]), blocks(&ws[rb..])];
                    ys.copy_from_slice(&$dot2($t, pair, xb));
                }
                for (yi, wr) in y1.iter_mut().zip(w1.chunks_exact(rb)) {
                    *yi = $dot($t, blocks(wr), xb);
                }
            }};
        }
        // Four rows per call with the activation's per-call pieces (`legacy_rows.rs`,
        // `iq4_xs_rows.rs`): `$prepare(xb, a)` fills them, `$dot4(w4, xb, a)` runs four rows,
        // `$dot(wr, xb)` one left over (the same bits). Rows of at most 512 blocks (the
        // callers' guards; the pieces live on the stack).
        #[cfg(target_arch = "x86_64")]
        macro_rules! prepared_rows4 {
            ($act:ty, $xblock:ty, $prepare:expr, $dot4:expr, $dot:expr) => {{
                let xb: &[$xblock] = blocks(x);
                avx2::with_block_scales(xb.len(), |a: &mut [$act]| {
                    $prepare(xb, &mut *a);
                    let a = &*a;
                    in_rows4(w, rb, y, |w4| $dot4(w4, xb, a), |wr| $dot(wr, xb))
                })
                .unwrap_or_else(|| unreachable!("at most 512 blocks here (checked by the arm)"))
            }};
        }
        match (isa, w_ty) {
            // llama.cpp's repacked single-token kernels (see `repack.rs`), in every x86 set.
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_0) if repacked => {
                let xb = blocks(x);
                // The activation's per-block sums, once for all groups of 8 rows.
                let mut stack = [q4_0_rows::ActBlock::default(); q4_0_rows::STACK_BLOCKS];
                let mut heap = Vec::new();
                let a = if y.len() >= 8 {
                    q4_0_rows::prepared::<BlockQ4_0>(t, xb, &mut stack, &mut heap)
                } else {
                    &[]
                };
                rows8_with!(
                    |rows8, ahead| q4_0_rows::dot_q4_0_q8_0_rows8(t, rows8, xb, a, ahead),
                    |wr| repack::avx2::dot_q4_0_q8_0(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_NL) if repacked => {
                let xb = blocks(x);
                let mut stack = [q4_0_rows::ActBlock::default(); q4_0_rows::STACK_BLOCKS];
                let mut heap = Vec::new();
                let a = if y.len() >= 8 {
                    q4_0_rows::prepared::<iq4_nl::BlockIq4Nl>(t, xb, &mut stack, &mut heap)
                } else {
                    &[]
                };
                rows8_with!(
                    |rows8, ahead| q4_0_rows::dot_iq4_nl_q8_0_rows8(t, rows8, xb, a, ahead),
                    |wr| repack::avx2::dot_iq4_nl_q8_0(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_K) if repacked && t.avx512() => {
                // Two rows at a time, front to back, prefetching ahead in the loop: one call of
                // a decode step streams its rows from memory, and sequential streams keep more
                // of it in flight than the 16-row groups of `matvec_tokens` (1.2x the decode
                // speed of the 1.1B Q4_K_M model); two rows share their activation loads and
                // their reduction (0.9x the time per row of one-row kernels). Same bits as
                // those groups.
                rows2_with!(
                    t,
                    q4_k_rows::dot_q4_k_q8_k_rows2,
                    q4_k_rows::dot_q4_k_q8_k_row
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_K) if repacked => {
                rows_with!(|wr| repack::avx2::dot_q4_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q2_K) if repacked => {
                rows_with!(|wr| repack::avx2::dot_q2_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q2_K) if repacked => {
                rows_with!(|wr| repack::dot_q2_k_q8_k(blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_0) if repacked => {
                let xb = blocks(x);
                rows_with!(|wr| repack::dot_q4_0_q8_0(blocks(wr), xb))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::IQ4_NL) if repacked => {
                rows_with!(|wr| repack::dot_iq4_nl_q8_0(blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_K) if repacked => {
                rows_with!(|wr| repack::dot_q4_k_q8_k(blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q2_K) => {
                rows_with!(|wr| kquant_order::avx2::dot_q2_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q3_K) => {
                rows_with!(|wr| kquant_order::avx2::dot_q3_k_q8_k(t, blocks(wr), blocks(x)))
            }
            // Four rows at a time with AVX-512 (`iq4_xs_rows.rs`), for rows of up to 8,192
            // values (the activation's per-call pieces, 288 bytes a super-block, stay on the
            // stack).
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_XS)
                if t.avx512() && x.len() / std::mem::size_of::<BlockQ8_K>() <= 32 =>
            {
                prepared_rows4!(
                    iq4_xs_rows::ActBlock,
                    BlockQ8_K,
                    |xb, a| iq4_xs_rows::prepare(t, xb, a),
                    |w4, xb, a| iq4_xs_rows::dot_iq4_xs_q8_k_rows(t, w4, xb, a, true),
                    |wr, xb| kquant_order::avx2::dot_iq4_xs_q8_k(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_XS) => {
                rows_with!(|wr| kquant_order::avx2::dot_iq4_xs_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q2_K) => {
                rows_with!(|wr| kquant_order::dot_q2_k_q8_k(blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q3_K) => {
                rows_with!(|wr| kquant_order::dot_q3_k_q8_k(blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::IQ4_XS) => {
                rows_with!(|wr| kquant_order::dot_iq4_xs_q8_k(blocks(wr), blocks(x)))
            }
            // One Q4_1 / Q5_0 / Q5_1 token four rows at a time (`legacy_rows.rs`: the
            // activation's pieces formed once per call, the rows streamed as one run).
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_1)
                if t.avx512() && x.len() / std::mem::size_of::<BlockQ8_1>() <= 512 =>
            {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_1,
                    legacy_rows::prepare_q8_1,
                    |w4, xb, a| legacy_rows::dot_rows4(t, w4, xb, a, true),
                    |wr, xb| avx2::dot_q4_1_q8_1(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_1) if t.avx512() => {
                rows2_with!(t, avx2::dot_q4_1_q8_1_rows2, avx2::dot_q4_1_q8_1)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_0)
                if t.avx512() && x.len() / std::mem::size_of::<BlockQ8_0>() <= 512 =>
            {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_0,
                    |xb, a| legacy_rows::prepare_q8_0(t, xb, a),
                    |w4, xb, a| legacy_rows::dot_rows4(t, w4, xb, a, true),
                    |wr, xb| avx2_quants::dot_q5_0_q8_0(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_1)
                if t.avx512() && x.len() / std::mem::size_of::<BlockQ8_1>() <= 512 =>
            {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_1,
                    legacy_rows::prepare_q8_1,
                    |w4, xb, a| legacy_rows::dot_rows4(t, w4, xb, a, true),
                    |wr, xb| avx2_quants::dot_q5_1_q8_1(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q8_0) if t.avx512() => {
                rows2_with!(t, avx2::dot_q8_0_q8_0_rows2, avx2::dot_q8_0_q8_0)
            }
            // One Q4_1 / Q5_1 (and Q5_0 below) token four rows at a time with AVX2 alone
            // (`legacy_rows::dot_rows4_avx2`; rows of at most 512 blocks, as above).
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_1) if x.len() / std::mem::size_of::<BlockQ8_1>() <= 512 => {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_1,
                    legacy_rows::prepare_q8_1,
                    |w4, xb, a| legacy_rows::dot_rows4_avx2(t, w4, xb, a),
                    |wr, xb| avx2::dot_q4_1_q8_1(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_1) if x.len() / std::mem::size_of::<BlockQ8_1>() <= 512 => {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_1,
                    legacy_rows::prepare_q8_1,
                    |w4, xb, a| legacy_rows::dot_rows4_avx2(t, w4, xb, a),
                    |wr, xb| avx2_quants::dot_q5_1_q8_1(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_1) => {
                let xb = blocks(x);
                rows_with!(|wr| avx2::dot_q4_1_q8_1(t, blocks(wr), xb))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_0) => {
                let xb = blocks(x);
                rows_with!(|wr| avx2::dot_q4_0_q8_0(t, blocks(wr), xb))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q8_0) => {
                let xb = blocks(x);
                let sign_ok = avx2::sign_trick_exact(t, xb);
                if sign_ok {
                    // Four rows per call, the same bits (`dot_q8_0_q8_0_sign_rows4`: the rows'
                    // scale products in one 128-bit multiply per block). Zen 3, one thread,
                    // alternating with the two-row kernel it replaces: SmolLM2's 1536 x 576
                    // `ffn_gate` in cache 1.2 against 2.7 ns per row and block, all its
                    // `ffn_gate` / `ffn_up` from memory 15.5-15.9 against 11.8-13.3 GB/s.
                    in_rows4(
                        w,
                        rb,
                        y,
                        |w4| avx2::dot_q8_0_q8_0_sign_rows4(t, w4, xb),
                        |wr| avx2::dot_q8_0_q8_0_with(t, wr, xb, true),
                    );
                } else {
                    rows_with!(|wr| avx2::dot_q8_0_q8_0_with(t, blocks(wr), xb, sign_ok))
                }
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_0) if x.len() / std::mem::size_of::<BlockQ8_0>() <= 512 => {
                prepared_rows4!(
                    legacy_rows::ActBlock,
                    BlockQ8_0,
                    |xb, a| legacy_rows::prepare_q8_0(t, xb, a),
                    |w4, xb, a| legacy_rows::dot_rows4_avx2(t, w4, xb, a),
                    |wr, xb| avx2_quants::dot_q5_0_q8_0(t, wr, xb)
                )
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_0) => {
                // Two rows per call, the same bits (see `dot_q5_0_q8_0_rows2`). Zen 3, one
                // thread, SmolLM2's 1536 x 576 `ffn_up` in cache: 2.89 -> 2.39 ns per row and
                // block; 2 threads, alternating: SmolLM2 Q4_K_M tg 160-169 -> 170-175 tok/s,
                // the Gemma-3-class file 93-95 -> 96-103 (with the Q8_0 pairs).
                let xb = blocks(x);
                let (y2, y1) = y.split_at_mut(y.len() / 2 * 2);
                let (w2, w1) = w.split_at(y2.len() * rb);
                for (p, (ys, ws)) in y2
                    .chunks_exact_mut(2)
                    .zip(w2.chunks_exact(2 * rb))
                    .enumerate()
                {
                    prefetch_ahead(w, (2 * p + 2) * rb + PREFETCH_BYTES, 2 * rb);
                    let pair = [blocks(&ws[..rb]), blocks(&ws[rb..])];
                    ys.copy_from_slice(&avx2_quants::dot_q5_0_q8_0_rows2(t, pair, xb));
                }
                for (yi, wr) in y1.iter_mut().zip(w1.chunks_exact(rb)) {
                    *yi = avx2_quants::dot_q5_0_q8_0(t, blocks(wr), xb);
                }
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_1) => {
                rows_with!(|wr| avx2_quants::dot_q5_1_q8_1(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::IQ4_NL) => {
                rows_with!(|wr| avx2_quants::dot_iq4_nl_q8_0(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q4_K) => {
                rows_with!(|wr| avx2_quants::dot_q4_k_q8_k(t, blocks(wr), blocks(x)))
            }
            // Two rows per call with AVX-512 (masked fifth bits, `vpdpwssd`; the same bits as
            // the AVX2 kernel, which takes a row left over).
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_K) if t.avx512() => rows2_with!(
                t,
                avx2_quants::dot_q5_k_q8_k_rows::<2>,
                avx2_quants::dot_q5_k_q8_k
            ),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q5_K) => {
                rows_with!(|wr| avx2_quants::dot_q5_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2(t), GgmlType::Q6_K) => {
                rows_with!(|wr| avx2_quants::dot_q6_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_1) => {
                let xb = blocks(x);
                rows_with!(|wr| neon::dot_q4_1_q8_1(t, blocks(wr), xb))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_0) => {
                let xb = blocks(x);
                rows_with!(|wr| neon::dot_q4_0_q8_0(t, blocks(wr), xb))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q8_0) => {
                let xb = blocks(x);
                rows_with!(|wr| neon::dot_q8_0_q8_0(t, blocks(wr), xb))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q4_K) => {
                rows_with!(|wr| neon_quants::dot_q4_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_K) => {
                rows_with!(|wr| neon_quants::dot_q5_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q6_K) => {
                rows_with!(|wr| neon_quants::dot_q6_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_0) => {
                rows_with!(|wr| neon_quants::dot_q5_0_q8_0(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q5_1) => {
                rows_with!(|wr| neon_quants::dot_q5_1_q8_1(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::IQ4_NL) => {
                rows_with!(|wr| neon_quants::dot_iq4_nl_q8_0(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q2_K) => {
                rows_with!(|wr| neon_quants::dot_q2_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::Q3_K) => {
                rows_with!(|wr| neon_quants::dot_q3_k_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon(t), GgmlType::IQ4_XS) => {
                rows_with!(|wr| neon_quants::dot_iq4_xs_q8_k(t, blocks(wr), blocks(x)))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_1) => {
                let xb = blocks(x);
                rows_with!(|wr| ggml_order::dot_q4_1_q8_1_x86(blocks(wr), xb))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q4_0) => {
                let xb = blocks(x);
                rows_with!(|wr| ggml_order::dot_q4_0_q8_0_x86(blocks(wr), xb))
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Scalar, GgmlType::Q8_0) => {
                let xb = blocks(x);
                rows_with!(|wr| ggml_order::dot_q8_0_q8_0_x86(blocks(wr), xb))
            }
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q4_1) => {
                let xb = blocks(x);
                rows_with!(|wr| q4_1::vec_dot(blocks(wr), xb))
            }
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q4_0) => {
                let xb = blocks(x);
                rows_with!(|wr| q4_0::vec_dot(blocks(wr), xb))
            }
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q8_0) => {
                let xb = blocks(x);
                rows_with!(|wr| q8_0::vec_dot(blocks(wr), xb))
            }
            (_, GgmlType::Q8_1) => {
                let xb = blocks(x);
                rows_with!(|wr| q8_1::vec_dot(blocks(wr), xb))
            }
            (_, GgmlType::Q5_0) => rows_with!(|wr| q5_0::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::Q5_1) => rows_with!(|wr| q5_1::vec_dot(blocks(wr), blocks(x))),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q2_K) => rows_with!(|wr| q2_k::vec_dot(blocks(wr), blocks(x))),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::Q3_K) => rows_with!(|wr| q3_k::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::Q4_K) => rows_with!(|wr| q4_k::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::Q5_K) => rows_with!(|wr| q5_k::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::Q6_K) => rows_with!(|wr| q6_k::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::Q8_K) => rows_with!(|wr| q8_k::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::IQ4_NL) => rows_with!(|wr| iq4_nl::vec_dot(blocks(wr), blocks(x))),
            #[cfg(not(target_arch = "x86_64"))]
            (_, GgmlType::IQ4_XS) => rows_with!(|wr| iq4_xs::vec_dot(blocks(wr), blocks(x))),
            (_, GgmlType::F32) => rows_with!(|wr| f32::vec_dot(wr, x)),
            (_, GgmlType::F16) => rows_with!(|wr| f16::vec_dot(wr, x)),
            (_, GgmlType::BF16) => rows_with!(|wr| bf16::vec_dot(wr, x)),
            (_, GgmlType::Unsupported(_)) => unreachable!("rejected by row_bytes_checked"),
        }
    }
}

/// How far ahead of the row being computed [`Kernels::matvec`] asks for weight bytes. Decoding
/// streams each matrix once from memory, and the hardware prefetchers restart at every 4 KiB page:
/// explicit prefetches keep enough cache-line requests in flight to approach the memory bandwidth.
const PREFETCH_BYTES: usize = 1024;

/// Hints the CPU to load `w[start..start + len]` into cache; ranges past the end are clipped.
#[inline(always)]
fn prefetch_ahead(w: &[u8], start: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch_range(w, start, len);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, start, len);
}

/// Activation rows [`Kernels::matvec_tokens`] takes at once.
pub const MATVEC_TOKENS: usize = 4;

/// Activation rows [`Kernels::matvec_tokens8`] takes at once.
pub const MATVEC_TOKENS8: usize = 8;

impl Kernels {
    /// [`Kernels::matvec`] for `N` activation rows at once (`N` from 2 to [`MATVEC_TOKENS`]):
    /// `y[t][i] = dot(W row rows.start + i, x_q[t])`. Results are bit-identical to `N` calls of
    /// `matvec`; each weight row is loaded and unpacked once for all of them (prefill, and the
    /// decode steps of sessions that run together). Returns false, having done nothing, where
    /// this instruction set has no such kernel for `w_ty` and `N` (the kernels of repacked
    /// matrices take exactly 4): the caller then runs `matvec` per token.
    ///
    /// # Panics
    /// As [`Kernels::matvec`].
    pub fn matvec_tokens<const N: usize>(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        x_q: [&[u8]; N],
        rows: Range<usize>,
        y: [&mut [f32]; N],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
            // Q4_0 / Q4_K matrices llama.cpp repacks add in another order (see `matvec`).
            let repacked = rb != 0 && repack::repacked_shape(w.len() / rb);
            // The 16- and 8-row kernels of repacked Q4_0 / IQ4_NL and the AVX-512 Q4_K rows
            // take 4 tokens.
            let fixed_four = matches!(w_ty, GgmlType::Q4_0 | GgmlType::IQ4_NL) && repacked
                || w_ty == GgmlType::Q4_K && repacked && t.avx512();
            if !(2..=MATVEC_TOKENS).contains(&N) || (fixed_four && N != MATVEC_TOKENS) {
                return false;
            }
            if !(matches!(
                w_ty,
                GgmlType::Q4_1
                    | GgmlType::Q4_0
                    | GgmlType::Q8_0
                    | GgmlType::Q4_K
                    | GgmlType::Q5_K
                    | GgmlType::Q6_K
                    | GgmlType::Q5_0
                    | GgmlType::Q5_1
                    | GgmlType::IQ4_XS
            ) || (w_ty == GgmlType::IQ4_NL && repacked))
            {
                return false;
            }
            check_tokens(&x_q, xb, &y, rows.len());
            let w = w_rows;
            let x = x_q.map(|x| &x[..xb]);
            let mut y = y;
            if rb == 0 {
                y.iter_mut().for_each(|y| y.fill(0.0));
                return true;
            }
            macro_rules! rows_with {
                ($dot:expr) => {{
                    let xbl = x.map(|x| blocks(x));
                    for (i, wr) in w.chunks_exact(rb).enumerate() {
                        let r = $dot(t, blocks(wr), xbl);
                        for (yt, rt) in y.iter_mut().zip(r) {
                            yt[i] = rt;
                        }
                    }
                }};
            }
            match w_ty {
                GgmlType::Q4_1 if t.avx512() => {
                    avx512_q8_1_tokens::<BlockQ4_1, N>(t, w, rb, x.map(blocks), y)
                }
                GgmlType::Q5_1 if t.avx512() => {
                    avx512_q8_1_tokens::<BlockQ5_1, N>(t, w, rb, x.map(blocks), y)
                }
                // The tokens' scales converted once for all rows (stack buffers sized to the
                // row, as for Q8_0 below).
                GgmlType::Q4_1 => {
                    let nb = xb / std::mem::size_of::<BlockQ8_1>();
                    macro_rules! scaled {
                        ($cap:literal) => {{
                            let mut xds = [[0f32; 8]; $cap];
                            avx2::q8_1_token_scales(t, x.map(blocks), &mut xds[..nb]);
                            let xds = &xds[..nb];
                            let xbl = x.map(|x| blocks(x));
                            let mut pairs = w.chunks_exact(2 * rb);
                            let mut i = 0;
                            for wp in pairs.by_ref() {
                                let (w0, w1) = wp.split_at(rb);
                                let r = avx2::dot_q4_1_q8_1_xn_scaled_rows2(
                                    t,
                                    [blocks(w0), blocks(w1)],
                                    xbl,
                                    xds,
                                );
                                for (yt, k) in y.iter_mut().zip(0..N) {
                                    yt[i] = r[0][k];
                                    yt[i + 1] = r[1][k];
                                }
                                i += 2;
                            }
                            if !pairs.remainder().is_empty() {
                                let r = avx2::dot_q4_1_q8_1_xn_scaled(
                                    t,
                                    blocks(pairs.remainder()),
                                    xbl,
                                    xds,
                                );
                                for (yt, rt) in y.iter_mut().zip(r) {
                                    yt[i] = rt;
                                }
                            }
                        }};
                    }
                    match nb {
                        0..=32 => scaled!(32),
                        33..=128 => scaled!(128),
                        129..=512 => scaled!(512),
                        _ => rows_with!(avx2::dot_q4_1_q8_1_xn),
                    }
                }
                // 16 or 8 rows in the SIMD lanes (as in `matvec`), the rest one by one.
                GgmlType::Q4_0 | GgmlType::IQ4_NL if repacked => {
                    let x4: [&[u8]; MATVEC_TOKENS] = std::array::from_fn(|k| x[k]);
                    let mut y4: [&mut [f32]; MATVEC_TOKENS] = to_four(y);
                    if w_ty == GgmlType::Q4_0 {
                        q4_0_rows::matvec_x4_q4_0(t, w, rb, x4.map(blocks), &mut y4)
                    } else {
                        q4_0_rows::matvec_x4_iq4_nl(t, w, rb, x4.map(blocks), &mut y4)
                    }
                }
                GgmlType::Q4_0 => rows_with!(avx2::dot_q4_0_q8_0_xn),
                GgmlType::Q4_K if repacked && t.avx512() => {
                    let x4: [&[u8]; MATVEC_TOKENS] = std::array::from_fn(|k| x[k]);
                    q4_k_rows::matvec_q4_k(t, w, rb, x4.map(blocks), to_four(y))
                }
                // 8 rows in the lanes with AVX2 alone (Zen 3, 256 rows of the Qwen3-class
                // file's `ffn_up` in cache, best of 7: 4.8 -> 3.1 ns per row, super-block and
                // token with 8 tokens), the rest one by one; the same bits.
                GgmlType::Q4_K if repacked => {
                    let xbl = x.map(blocks);
                    q4_k_rows::matvec_q4_k_avx2(t, w, rb, xbl, &mut y, |wr| {
                        repack::avx2::dot_q4_k_q8_k_xn(t, wr, xbl)
                    })
                }
                GgmlType::Q4_K => rows_with!(avx2_quants::dot_q4_k_q8_k_xn),
                // llama.cpp never repacks Q6_K on x86: any row count.
                GgmlType::Q6_K => rows_with!(avx2_quants::dot_q6_k_q8_k_xn),
                GgmlType::Q5_K => rows_with!(avx2_quants::dot_q5_k_q8_k_xn),
                // llama.cpp never repacks Q5_1: any row count.
                GgmlType::Q5_1 => rows_with!(avx2_quants::dot_q5_1_q8_1_xn),
                // llama.cpp never repacks IQ4_XS on x86.
                GgmlType::IQ4_XS => rows_with!(kquant_order::avx2::dot_iq4_xs_q8_k_xn),
                // Q8_0, and Q5_0 (never repacked by llama.cpp: any row count).
                _ => {
                    let sign_ok = x
                        .iter()
                        .all(|x| avx2::sign_trick_exact(t, blocks::<BlockQ8_0>(x)));
                    // The tokens' block scales converted once for all rows, on the stack
                    // (sized to the row: zeroing a large buffer per 16-row chunk would cost
                    // more than it saves on narrow matrices).
                    let nb = xb / std::mem::size_of::<BlockQ8_0>();
                    let q5 = w_ty == GgmlType::Q5_0;
                    macro_rules! scaled {
                        ($cap:literal) => {{
                            let mut dx = [[0f32; 4]; $cap];
                            avx2::q8_0_token_scales(t, x.map(blocks), &mut dx[..nb]);
                            let dx = &dx[..nb];
                            if q5 {
                                rows_with!(|t, w, x| avx2_quants::dot_q5_0_q8_0_xn_scaled(
                                    t, w, x, dx
                                ))
                            } else {
                                rows_with!(|t, w, x| avx2::dot_q8_0_q8_0_xn_scaled(t, w, x, dx))
                            }
                        }};
                    }
                    // N is at most MATVEC_TOKENS here (checked on entry), as the scaled
                    // kernels require.
                    // The AVX-512 tiles: Q5_0's exact for every activation, Q8_0's where the
                    // AVX2 kernels' sign trick is (`avx512::biased_tile`).
                    if (q5 || sign_ok) && t.avx512() && nb <= 512 {
                        avx512_biased_tokens(t, w_ty, w, rb, x.map(blocks), y);
                        return true;
                    }
                    match (sign_ok, nb) {
                        (true, 0..=32) => scaled!(32),
                        (true, 33..=128) => scaled!(128),
                        (true, 129..=512) => scaled!(512),
                        _ if q5 => rows_with!(|t, w, x| avx2_quants::dot_q5_0_q8_0_xn_with(
                            t, w, x, sign_ok
                        )),
                        _ => rows_with!(|t, w, x| avx2::dot_q8_0_q8_0_xn(t, w, x, sign_ok)),
                    }
                }
            }
            return true;
        }
        let _ = (w_ty, n, w, x_q, rows, y);
        false
    }
}

/// The rows of `w` (whole rows of `rb` bytes, one output each in `y`) four at a time through
/// `dot4`, the rest one by one through `dot`.
#[cfg(target_arch = "x86_64")]
fn in_rows4<B: block::Block>(
    w: &[u8],
    rb: usize,
    y: &mut [f32],
    dot4: impl Fn([&[B]; 4]) -> [f32; 4],
    dot: impl Fn(&[B]) -> f32,
) {
    let (y4, y1) = y.split_at_mut(y.len() / 4 * 4);
    let (w4, w1) = w.split_at(y4.len() * rb);
    for (ys, ws) in y4.chunks_exact_mut(4).zip(w4.chunks_exact(4 * rb)) {
        ys.copy_from_slice(&dot4(std::array::from_fn(|k| {
            blocks(&ws[k * rb..(k + 1) * rb])
        })));
    }
    for (yi, wr) in y1.iter_mut().zip(w1.chunks_exact(rb)) {
        *yi = dot(blocks(wr));
    }
}

/// Runs the weight rows `0..n_rows` in tiles of 4, then 2, then 1 (the `tileR(i)` calls compute
/// rows `i..i + R` for the `N` tokens) and writes row `i + k`'s result for token `t` to
/// `y[t][i + k]`.
#[cfg(target_arch = "x86_64")]
fn in_row_tiles<const N: usize>(
    n_rows: usize,
    mut y: [&mut [f32]; N],
    tile4: impl Fn(usize) -> [[f32; N]; 4],
    tile2: impl Fn(usize) -> [[f32; N]; 2],
    tile1: impl Fn(usize) -> [[f32; N]; 1],
) {
    fn put<const N: usize, const R: usize>(y: &mut [&mut [f32]; N], i: usize, out: [[f32; N]; R]) {
        for (k, row) in out.iter().enumerate() {
            for (yt, v) in y.iter_mut().zip(row) {
                yt[i + k] = *v;
            }
        }
    }
    let mut i = 0;
    while n_rows - i >= 4 {
        put(&mut y, i, tile4(i));
        i += 4;
    }
    if n_rows - i >= 2 {
        put(&mut y, i, tile2(i));
        i += 2;
    }
    if n_rows - i >= 1 {
        put(&mut y, i, tile1(i));
    }
}

/// [`Kernels::matvec_tokens`] of Q4_1 or Q5_1 weights (`B`) with `N` (at most 4) tokens and
/// AVX-512: the tokens' block scales converted once, then tiles of 4 weight rows (2, 1 for the
/// rest) through `avx512::dot_q8_1_tile`. `w` holds whole rows of `rb` bytes.
#[cfg(target_arch = "x86_64")]
fn avx512_q8_1_tokens<B, const N: usize>(
    t: x86::Token,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_1]; N],
    y: [&mut [f32]; N],
) where
    B: legacy_rows::WeightBlock<Act = BlockQ8_1> + block::Block,
{
    let nb = rb / std::mem::size_of::<B>();
    if nb > 512 {
        // Longer rows than the scales' stack buffer: one row at a time.
        let mut y = y;
        for (i, wr) in w.chunks_exact(rb).enumerate() {
            let r = if B::FIFTH_BITS {
                avx2_quants::dot_q5_1_q8_1_xn(t, blocks(wr), x)
            } else {
                avx2::dot_q4_1_q8_1_xn(t, blocks(wr), x)
            };
            for (yt, rt) in y.iter_mut().zip(r) {
                yt[i] = rt;
            }
        }
        return;
    }
    let row = |r: usize| blocks(&w[r * rb..(r + 1) * rb]);
    avx2::with_block_scales(nb, |sc: &mut [[f32; 8]]| {
        avx512::q8_1_token_scales(t, x, sc);
        let sc = &*sc;
        macro_rules! tile {
            ($r:literal) => {
                // SAFETY: the token's AVX-512 features were detected; every row has `nb`
                // blocks, and every activation row and `sc` at least that many (checked by
                // the caller, `sc` sized here).
                |i| unsafe {
                    let rows = std::array::from_fn(|k| row(i + k));
                    if t.gfni() {
                        avx512::dot_q8_1_tile_gfni::<B, $r, N>(rows, x, sc)
                    } else {
                        avx512::dot_q8_1_tile::<B, $r, N>(rows, x, sc)
                    }
                }
            };
        }
        in_row_tiles(w.len() / rb, y, tile!(4), tile!(2), tile!(1));
    })
    .unwrap_or_else(|| unreachable!("at most 512 blocks here (checked above)"));
}

/// [`Kernels::matvec_tokens`] of weights with a biased AVX-512 tile (Q5_0; Q8_0 where no
/// activation quant is -128), where a row has at most 512 blocks (the caller checks): the
/// tokens' scales converted once, then tiles of 4 weight rows (2, 1 for the rest) through
/// `avx512::dot_q5_0_q8_0_tile` / `dot_q8_0_q8_0_tile`. `w` holds whole rows of `rb` bytes.
#[cfg(target_arch = "x86_64")]
fn avx512_biased_tokens<const N: usize>(
    t: x86::Token,
    w_ty: GgmlType,
    w: &[u8],
    rb: usize,
    x: [&[BlockQ8_0]; N],
    y: [&mut [f32]; N],
) {
    avx2::with_block_scales(x[0].len(), |dx: &mut [[f32; 4]]| {
        avx2::q8_0_token_scales(t, x, dx);
        let dx = &*dx;
        macro_rules! tiles {
            ($tile:ident) => {{
                let row = |r: usize| blocks(&w[r * rb..(r + 1) * rb]);
                macro_rules! tile {
                    ($r:literal) => {
                        // SAFETY: this runs only where the AVX-512 features were detected (the
                        // caller's token); every activation row has at least a weight row's
                        // blocks (checked by the caller), `dx` exactly as many.
                        |i| unsafe {
                            avx512::$tile::<$r, N>(std::array::from_fn(|k| row(i + k)), x, dx)
                        }
                    };
                }
                in_row_tiles(w.len() / rb, y, tile!(4), tile!(2), tile!(1))
            }};
        }
        if w_ty == GgmlType::Q5_0 {
            tiles!(dot_q5_0_q8_0_tile)
        } else {
            tiles!(dot_q8_0_q8_0_tile)
        }
    })
    .unwrap_or_else(|| unreachable!("matvec: the caller takes rows of at most 512 blocks here"));
}

impl Kernels {
    /// The `N` tokens (1 to 7) that a batch's 8-token groups left, for the weight types whose
    /// order in a batch of 8 or more tokens differs from one token's in llama.cpp, so that a
    /// prompt's every token follows llama.cpp's batched path: Q6_K on x86 (its "tiled" order,
    /// `q6_k_rows.rs`, which [`Kernels::matvec_tokens8`] gives the groups). `false` (nothing
    /// written) elsewhere: the caller then takes [`Kernels::matvec_tokens`] and
    /// [`Kernels::matvec`], whose order is llama.cpp's for any batch.
    ///
    /// # Panics
    /// As [`Kernels::matvec_tokens`].
    pub fn matvec_tokens_batched<const N: usize>(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        x_q: [&[u8]; N],
        rows: Range<usize>,
        y: [&mut [f32]; N],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            if w_ty == GgmlType::Q6_K && (1..MATVEC_TOKENS8).contains(&N) {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                check_tokens(&x_q, xb, &y, rows.len());
                let x = x_q.map(|x| blocks::<BlockQ8_K>(&x[..xb]));
                let mut y = y;
                q6_k_rows::matvec::<N>(t, w_rows, rb, x, &mut y);
                return true;
            }
        }
        let _ = (w_ty, n, w, x_q, rows, y);
        false
    }
}

impl Kernels {
    /// [`Kernels::matvec_tokens`] for the decode steps of `N` sessions decoding together (`N`
    /// from 2 to [`MATVEC_TOKENS`]), whose results need not be bit-identical to one token at a
    /// time: a group's logits are a lone session's up to the multi-token kernels' rounding, as
    /// long as their choices stay llama.cpp's (`tests/decode_together.rs`; the executor calls
    /// it for the output head only, whose result no later layer requantizes). On AVX2 without
    /// AVX-512, Q8_0 matrices take the kernel with 8 rows in the lanes (`q8_0_rows.rs`), which
    /// adds each block's exact dot once; everything else is `matvec_tokens` (`false`: no
    /// kernel, nothing written).
    ///
    /// # Panics
    /// As [`Kernels::matvec_tokens`].
    pub fn matvec_steps<const N: usize>(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        x_q: [&[u8]; N],
        rows: Range<usize>,
        y: [&mut [f32]; N],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            if !t.avx512() && (2..=MATVEC_TOKENS).contains(&N) && w_ty == GgmlType::Q8_0 {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                check_tokens(&x_q, xb, &y, rows.len());
                let mut y = y;
                // Declines activations with a -128 quant (its sign trick).
                let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                if q8_0_rows::matvec::<BlockQ8_0, N>(t, w_rows, rb, x, &mut y) {
                    return true;
                }
                return self.matvec_tokens::<N>(w_ty, n, w, x_q, rows, y);
            }
        }
        self.matvec_tokens::<N>(w_ty, n, w, x_q, rows, y)
    }
}

/// The shape checks of the multi-token entries: every activation row holds at least the `xb`
/// bytes a weight row's blocks need, and every output row has one slot per weight row.
///
/// # Panics
/// If either does not hold.
// `inline(always)`: with `#[inline]` alone, the AVX2 Q8_0 decode rows (untouched) measured 6%
// slower in cache (1.56 -> 1.65 ns per row and block, Zen 3), a code-layout effect.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn check_tokens<const N: usize>(x_q: &[&[u8]; N], xb: usize, y: &[&mut [f32]; N], rows: usize) {
    assert!(
        x_q.iter().all(|x| x.len() >= xb),
        "matvec: activation too short"
    );
    assert!(
        y.iter().all(|y| y.len() == rows),
        "matvec: y must have one slot per row"
    );
}

/// `N` output rows as the 4 the fixed 4-token kernels take (`N` is 4 where they are called).
#[cfg(target_arch = "x86_64")]
fn to_four<const N: usize>(y: [&mut [f32]; N]) -> [&mut [f32]; MATVEC_TOKENS] {
    // No allocation: this runs for every 16-row chunk of a prefill matmul.
    let mut rows = y.into_iter();
    std::array::from_fn(|_| {
        rows.next()
            .unwrap_or_else(|| unreachable!("called with N == MATVEC_TOKENS only"))
    })
}

impl Kernels {
    /// [`Kernels::matvec_tokens`] for [`MATVEC_TOKENS8`] activation rows, where a kernel gains
    /// from sharing each weight block's unpacking among 8 tokens (Q4_1, Q5_0, Q5_1, Q8_0 and
    /// repacked Q4_0 with AVX-512 VNNI; Q4_1, Q5_0, Q8_0, IQ4_XS and repacked Q4_0, IQ4_NL and
    /// Q4_K with AVX2); `false` (nothing written) elsewhere: then take the tokens 4 at a time.
    /// Results are bit-identical to one token at a time, but for Q8_0 and Q5_0 on AVX2 without
    /// AVX-512, which add each block's exact dot once (`q8_0_rows.rs`: the packed panels'
    /// order).
    ///
    /// # Panics
    /// As [`Kernels::matvec_tokens`].
    pub fn matvec_tokens8(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        x_q: [&[u8]; MATVEC_TOKENS8],
        rows: Range<usize>,
        y: [&mut [f32]; MATVEC_TOKENS8],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            if !t.avx512() && matches!(w_ty, GgmlType::Q5_0 | GgmlType::Q8_0) {
                return avx2_q8_0_tokens8(t, w_ty, n, w, x_q, rows, y);
            }
            // Q5_0 with AVX-512 (where the packed panels do not take it first: their order is
            // this one) as without: so that the kernel choice between the two sets never changes
            // a result.
            let mut y = y;
            if w_ty == GgmlType::Q5_0 {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                check_tokens(&x_q, xb, &y, rows.len());
                let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                if q8_0_rows::matvec::<q5_0::BlockQ5_0, MATVEC_TOKENS8>(t, w_rows, rb, x, &mut y) {
                    return true;
                }
            }
            // Q4_1 (never repacked by llama.cpp) on AVX2: one row at a time with 8 tokens, the
            // tokens' scales converted once per call; ggml's order. Zen 3, 256 rows of SmolLM2's
            // `ffn_up` in cache (best of 7): 1.05 ns per row, block and token with 4 tokens (two
            // rows at a time), 0.95 with 8; SmolLM2 Q4_1 pp512 378-443 -> 420-464 tok/s.
            if !t.avx512() && w_ty == GgmlType::Q4_1 {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                let nb = xb / std::mem::size_of::<BlockQ8_1>();
                if rb == 0 || nb > 512 {
                    return false;
                }
                check_tokens(&x_q, xb, &y, rows.len());
                let x = x_q.map(|x| blocks::<BlockQ8_1>(&x[..xb]));
                let mut y = y;
                macro_rules! scaled {
                    ($cap:literal) => {{
                        let mut xds = [[0f32; 16]; $cap];
                        avx2::q8_1_token_scales8(t, x, &mut xds[..nb]);
                        for (i, wr) in w_rows.chunks_exact(rb).enumerate() {
                            let r = avx2::dot_q4_1_q8_1_x8_scaled(t, blocks(wr), x, &xds[..nb]);
                            for (yt, rt) in y.iter_mut().zip(r) {
                                yt[i] = rt;
                            }
                        }
                    }};
                }
                match nb {
                    0..=32 => scaled!(32),
                    33..=128 => scaled!(128),
                    _ => scaled!(512),
                }
                return true;
            }
            // Q6_K: llama.cpp's batched order with 8 rows in the lanes (`q6_k_rows.rs`), on
            // both x86 sets (so that the kernel choice between them never changes a result).
            // Zen 3, 256 rows of SmolLM2's `ffn_down` in cache, best of 7: 5.9 ns per row,
            // super-block and token in ggml's one-token order, 4.2 here.
            if w_ty == GgmlType::Q6_K {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                check_tokens(&x_q, xb, &y, rows.len());
                let x = x_q.map(|x| blocks::<BlockQ8_K>(&x[..xb]));
                let mut y = y;
                q6_k_rows::matvec::<MATVEC_TOKENS8>(t, w_rows, rb, x, &mut y);
                return true;
            }
            // IQ4_XS (never repacked by llama.cpp on x86) on AVX2: one row at a time with 8
            // tokens, each sub-block's values unpacked once for all of them; ggml's order.
            // Zen 3, 256 rows of SmolLM2's `ffn_down` in cache (best of 7): 7.5 ns per row,
            // super-block and token with 4 tokens, 6.1 with 8.
            if !t.avx512() && w_ty == GgmlType::IQ4_XS {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                check_tokens(&x_q, xb, &y, rows.len());
                if rb == 0 {
                    return false;
                }
                let x = x_q.map(|x| blocks::<BlockQ8_K>(&x[..xb]));
                let mut y = y;
                for (i, wr) in w_rows.chunks_exact(rb).enumerate() {
                    let r = kquant_order::avx2::dot_iq4_xs_q8_k_xn(t, blocks(wr), x);
                    for (yt, rt) in y.iter_mut().zip(r) {
                        yt[i] = rt;
                    }
                }
                return true;
            }
            // Repacked Q4_0, IQ4_NL and Q4_K (8 rows in the lanes, the rows left one at a time)
            // on AVX2, 8 tokens per call, in llama.cpp's repacked order.
            if !t.avx512() && matches!(w_ty, GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::Q4_K) {
                let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
                if rb == 0 || !repack::repacked_shape(w.len() / rb) {
                    return false;
                }
                check_tokens(&x_q, xb, &y, rows.len());
                let mut y = y;
                match w_ty {
                    GgmlType::Q4_K => {
                        let x = x_q.map(|x| blocks::<BlockQ8_K>(&x[..xb]));
                        q4_k_rows::matvec_q4_k_avx2(t, w_rows, rb, x, &mut y, |wr| {
                            repack::avx2::dot_q4_k_q8_k_x8(t, wr, x)
                        });
                    }
                    GgmlType::Q4_0 => {
                        let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                        q4_0_rows::matvec_x8_q4_0(t, w_rows, rb, x, &mut y);
                    }
                    _ => {
                        let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                        // The table's signed values through the Q8_0 rows (the sign trick: no
                        // -128 activation quant, else it declines), the same order and bits as
                        // the split-nibble kernel. Zen 3, 256 rows of SmolLM2 IQ4_XS's `ffn_up`
                        // in cache, best of 7: 0.88 -> 0.75 ns per row, block and token (with 4
                        // tokens it is the slower: 1.07 against 0.97 for `matvec_x4_iq4_nl`).
                        if !q8_0_rows::matvec::<iq4_nl::BlockIq4Nl, MATVEC_TOKENS8>(
                            t, w_rows, rb, x, &mut y,
                        ) {
                            q4_0_rows::matvec_x8_iq4_nl(t, w_rows, rb, x, &mut y);
                        }
                    }
                }
                return true;
            }
            if !t.avx512()
                || !matches!(
                    w_ty,
                    GgmlType::Q4_0
                        | GgmlType::Q4_1
                        | GgmlType::Q5_0
                        | GgmlType::Q5_1
                        | GgmlType::Q8_0
                )
            {
                return false;
            }
            let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
            let repacked = rb != 0 && repack::repacked_shape(w.len() / rb);
            if rb == 0 || (w_ty == GgmlType::Q4_0 && !repacked) {
                return false;
            }
            check_tokens(&x_q, xb, &y, rows.len());
            let biased_tile = match w_ty {
                GgmlType::Q5_0 => true,
                // The Q8_0 tile's lanes are the AVX2 kernel's where its sign trick is exact.
                GgmlType::Q8_0 => x_q
                    .iter()
                    .all(|x| avx2::sign_trick_exact(t, blocks::<BlockQ8_0>(&x[..xb]))),
                _ => false,
            };
            if biased_tile && xb / std::mem::size_of::<BlockQ8_0>() <= 512 {
                // Two tiles of 4 tokens: their scale products come from memory as broadcasts
                // instead of a shuffle per pair of tokens and row (SmolLM2 Q4_K_M pp512 +6-10%
                // on Zen 4 against `dot_q5_0_q8_0_x8`; same bits).
                let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                let [y0, y1, y2, y3, y4, y5, y6, y7] = y;
                avx512_biased_tokens(
                    t,
                    w_ty,
                    w_rows,
                    rb,
                    [x[0], x[1], x[2], x[3]],
                    [y0, y1, y2, y3],
                );
                avx512_biased_tokens(
                    t,
                    w_ty,
                    w_rows,
                    rb,
                    [x[4], x[5], x[6], x[7]],
                    [y4, y5, y6, y7],
                );
                return true;
            }
            if matches!(w_ty, GgmlType::Q4_1 | GgmlType::Q5_1)
                && xb / std::mem::size_of::<BlockQ8_1>() <= 512
            {
                // Two tiles of 4 tokens, as Q5_0 above: Q4_1 0.47-0.52 against 0.71-0.77 ns
                // per row, block and token for `dot_q4_1_q8_1_x8` on SmolLM2's matrices (Zen
                // 4, `bench_matvec_tokens4`); same bits.
                let x = x_q.map(|x| blocks::<BlockQ8_1>(&x[..xb]));
                let [y0, y1, y2, y3, y4, y5, y6, y7] = y;
                let (x0, x1) = ([x[0], x[1], x[2], x[3]], [x[4], x[5], x[6], x[7]]);
                if w_ty == GgmlType::Q4_1 {
                    avx512_q8_1_tokens::<BlockQ4_1, 4>(t, w_rows, rb, x0, [y0, y1, y2, y3]);
                    avx512_q8_1_tokens::<BlockQ4_1, 4>(t, w_rows, rb, x1, [y4, y5, y6, y7]);
                } else {
                    avx512_q8_1_tokens::<BlockQ5_1, 4>(t, w_rows, rb, x0, [y0, y1, y2, y3]);
                    avx512_q8_1_tokens::<BlockQ5_1, 4>(t, w_rows, rb, x1, [y4, y5, y6, y7]);
                }
                return true;
            }
            if w_ty == GgmlType::Q4_0 {
                let x = x_q.map(|x| blocks(&x[..xb]));
                q4_0_rows::matvec_x8_q4_0(t, w_rows, rb, x, &mut y);
                return true;
            }
            if matches!(w_ty, GgmlType::Q5_0 | GgmlType::Q8_0) {
                // Rows four at a time (they share the activations' loads), then two, then one.
                let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
                let n_rows = w_rows.len() / rb;
                let row = |r: usize| &w_rows[r * rb..(r + 1) * rb];
                let mut i = 0;
                macro_rules! rows {
                    ($r:literal) => {
                        while n_rows - i >= $r {
                            let r = if w_ty == GgmlType::Q5_0 {
                                avx2_quants::dot_q5_0_q8_0_x8::<$r>(
                                    t,
                                    std::array::from_fn(|k| blocks(row(i + k))),
                                    x,
                                )
                            } else {
                                avx2::dot_q8_0_q8_0_x8::<$r>(
                                    t,
                                    std::array::from_fn(|k| blocks(row(i + k))),
                                    x,
                                )
                            };
                            for (k, rk) in r.iter().enumerate() {
                                for (yt, v) in y.iter_mut().zip(rk) {
                                    yt[i + k] = *v;
                                }
                            }
                            i += $r;
                        }
                    };
                }
                rows!(4);
                rows!(2);
                rows!(1);
                return true;
            }
            let x = x_q.map(|x| blocks::<BlockQ8_1>(&x[..xb]));
            for (i, wr) in w_rows.chunks_exact(rb).enumerate() {
                let r = avx2::dot_q4_1_q8_1_x8(t, blocks(wr), x);
                for (yt, rt) in y.iter_mut().zip(r) {
                    yt[i] = rt;
                }
            }
            return true;
        }
        let _ = (w_ty, n, w, x_q, rows, y);
        false
    }
}

/// [`Kernels::matvec_tokens8`] of Q5_0 / Q8_0 weights with the AVX2 set: the 8-token kernels
/// with the tokens' block scales converted once per call, where no activation quant is -128
/// and a row has at most 512 blocks; otherwise `false` (the caller runs 4 tokens at a time).
#[cfg(target_arch = "x86_64")]
fn avx2_q8_0_tokens8(
    t: x86::Token,
    w_ty: GgmlType,
    n: usize,
    w: &[u8],
    x_q: [&[u8]; MATVEC_TOKENS8],
    rows: Range<usize>,
    y: [&mut [f32]; MATVEC_TOKENS8],
) -> bool {
    let (rb, xb, w_rows) = matrix_rows(w_ty, n, w, &rows);
    let nb = xb / std::mem::size_of::<BlockQ8_0>();
    if rb == 0 {
        return false;
    }
    check_tokens(&x_q, xb, &y, rows.len());
    let x = x_q.map(|x| blocks::<BlockQ8_0>(&x[..xb]));
    // Q8_0 and Q5_0: rows in the lanes (`q8_0_rows.rs`, blockwise order), which checks the
    // activations itself. Q5_0 (Zen 3, 256 rows of SmolLM2 Q4_K_M's `ffn_up` in cache, best of
    // 7): 1.12 ns per row, block and token in ggml's order below, 0.71 with rows in the lanes.
    let mut y = y;
    if w_ty == GgmlType::Q8_0 {
        return q8_0_rows::matvec::<BlockQ8_0, MATVEC_TOKENS8>(t, w_rows, rb, x, &mut y);
    }
    if q8_0_rows::matvec::<q5_0::BlockQ5_0, MATVEC_TOKENS8>(t, w_rows, rb, x, &mut y) {
        return true;
    }
    if nb > 512 || !x.iter().all(|x| avx2::sign_trick_exact(t, x)) {
        return false;
    }
    macro_rules! scaled {
        ($cap:literal) => {{
            // (Sized to the row: zeroing a large buffer per call would cost more than it saves
            // on narrow matrices.)
            let mut dx = [[0f32; MATVEC_TOKENS8]; $cap];
            avx2::q8_0_token_scales(t, x, &mut dx[..nb]);
            let dx = &dx[..nb];
            for (i, wr) in w_rows.chunks_exact(rb).enumerate() {
                let r = if w_ty == GgmlType::Q5_0 {
                    avx2_quants::dot_q5_0_q8_0_x8_scaled(t, blocks(wr), x, dx)
                } else {
                    avx2::dot_q8_0_q8_0_x8_scaled(t, blocks(wr), x, dx)
                };
                for (yt, rt) in y.iter_mut().zip(r) {
                    yt[i] = rt;
                }
            }
        }};
    }
    match nb {
        0..=32 => scaled!(32),
        33..=128 => scaled!(128),
        _ => scaled!(512),
    }
    true
}

impl Kernels {
    /// Whether prefill of the `w_ty` matrix `w` (whole, rows of `n` values) runs through packed
    /// panels here ([`Kernels::pack_panels`], [`Kernels::matmul_panels8`]): on the x86 sets
    /// (as chosen for the type's prefill), rows of at most [`PANEL_MAX_BLOCKS`] blocks of 32 of
    /// Q8_0, Q5_0 and IQ4_XS (whole super-blocks), and Q4_0 and IQ4_NL matrices whose
    /// rows llama.cpp repacks (a multiple of 8 rows). Results are bit-identical to one token at
    /// a time for Q4_0 and IQ4_NL, not for Q8_0, Q5_0 and IQ4_XS (see `panels.rs`); both sets
    /// give the same bits. `EDGE_RUN_PANELS=0` turns them off.
    pub fn panels_for(&self, w_ty: GgmlType, n: usize, w: &[u8]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(_) = self.isa_for(w_ty, Phase::Prefill) {
            let row_bytes = w_ty.row_bytes(n as u64).unwrap_or(0) as usize;
            let n_rows = w.len().checked_div(row_bytes).unwrap_or(0);
            let typed = match w_ty {
                GgmlType::Q8_0 | GgmlType::Q5_0 => true,
                GgmlType::IQ4_XS => n.is_multiple_of(QK_K),
                GgmlType::Q4_0 | GgmlType::IQ4_NL => repack::repacked_shape(n_rows),
                _ => false,
            };
            return typed && n.is_multiple_of(QK) && n / QK <= PANEL_MAX_BLOCKS && panels_enabled();
        }
        let _ = (w_ty, n, w);
        false
    }

    /// The fewest tokens of a prefill matmul for which the panels ([`Kernels::panels_for`])
    /// beat the kernels that read the weights where they are: packing costs a pass over the
    /// rows, which enough tokens must repay. Q4_0 and IQ4_NL (repacked shapes) have an 8-token
    /// kernel with rows in the lanes too (the same bits): Zen 4, 2 threads, the 1.1B Q4_0 file,
    /// with panels against without, pp16 135 / 152 tok/s, pp24 160 / 166, pp32 179 / 168, pp64
    /// 212 / 183. The other types' 8-token kernels keep ggml's lane sums per block (3.5
    /// instructions per row, block and token), and the panels win from 8 tokens: SmolLM2 Q8_0
    /// pp8 632 / 560, IQ4_XS 775 / 724, the Qwen3-class Q4_K_M file (its Q8_0 / Q5_0 tensors)
    /// 214 / 207. On AVX2 (Zen 3, 2 threads, against the 8-token kernels of stop 39) the same
    /// holds: SmolLM2 IQ4_NL pp8 476-516 / 594-596, pp32 745-758 / 650-658, the 1.1B Q4_0 pp8
    /// 52-73 / 62-91; SmolLM2 Q8_0 pp8 290-292 / 291-304 (even), pp512 616-636 / 468-513.
    ///
    /// IQ4_XS on AVX2 (Zen 3, SmolLM2 IQ4_XS, 4 alternating runs of 10 repetitions, panels
    /// against its 8-token kernel): pp8 343-403 / 403-512, pp16 373-449 / 422-467, pp24
    /// 369-531 / 385-415, pp32 434 / 401 (medians of 8), pp512 560 / 493: from 32 tokens.
    pub fn panel_min_tokens(&self, w_ty: GgmlType) -> usize {
        match w_ty {
            GgmlType::Q4_0 | GgmlType::IQ4_NL => 32,
            GgmlType::IQ4_XS if !self.panels_avx512(w_ty) => 32,
            _ => MATVEC_TOKENS8,
        }
    }

    /// Whether the `w_ty` prefill set here is the AVX-512 one (its panels, `panels.rs`).
    fn panels_avx512(&self, w_ty: GgmlType) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            return t.avx512();
        }
        let _ = w_ty;
        false
    }

    /// Packs rows `rows` (at most [`panel_rows`]`(n / 32)`) of the `w_ty` matrix `w` (rows of
    /// `n` values) into `p`, where [`Kernels::panels_for`] says so.
    ///
    /// # Panics
    /// If the type has no panels, there are too many rows, or `w` is too short.
    pub fn pack_panels(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        rows: Range<usize>,
        p: &mut Panels<'_>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa_for(w_ty, Phase::Prefill) {
            let (rb, _, w_rows) = matrix_rows(w_ty, n, w, &rows);
            let (nb, n_rows) = (n / QK, rows.len());
            if t.avx512() {
                use panels::pack_avx512;
                use panels::PanelKind::{Blocks32, SuperBlocks256};
                // SAFETY (all): the token proves the AVX-512 features.
                unsafe {
                    match w_ty {
                        GgmlType::Q8_0 => {
                            pack_avx512::<BlockQ8_0>(p, Blocks32, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::Q5_0 => {
                            pack_avx512::<q5_0::BlockQ5_0>(p, Blocks32, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::Q4_0 => {
                            pack_avx512::<BlockQ4_0>(p, Blocks32, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::IQ4_NL => {
                            pack_avx512::<iq4_nl::BlockIq4Nl>(p, Blocks32, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::IQ4_XS => pack_avx512::<iq4_xs::BlockIq4Xs>(
                            p,
                            SuperBlocks256,
                            w_rows,
                            rb,
                            n_rows,
                            nb,
                        ),
                        _ => panic!("pack_panels: no panels for {w_ty}"),
                    }
                }
            } else {
                // SAFETY (all): the token proves AVX2, FMA and F16C.
                unsafe {
                    match w_ty {
                        GgmlType::Q8_0 => panels::pack_avx2::<BlockQ8_0>(p, w_rows, rb, n_rows, nb),
                        GgmlType::Q5_0 => {
                            panels::pack_avx2::<q5_0::BlockQ5_0>(p, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::Q4_0 => panels::pack_avx2::<BlockQ4_0>(p, w_rows, rb, n_rows, nb),
                        GgmlType::IQ4_NL => {
                            panels::pack_avx2::<iq4_nl::BlockIq4Nl>(p, w_rows, rb, n_rows, nb)
                        }
                        GgmlType::IQ4_XS => {
                            panels::pack_avx2::<iq4_xs::BlockIq4Xs>(p, w_rows, rb, n_rows, nb)
                        }
                        _ => panic!("pack_panels: no AVX2 panels for {w_ty}"),
                    }
                }
            }
            return;
        }
        self.pack_panels_portable(w_ty, n, w, rows, p)
    }

    /// [`Kernels::pack_panels`] in plain Rust, one value at a time: what machines without the
    /// AVX-512 packing would run, and the reference the SIMD packing is tested against.
    fn pack_panels_portable(
        &self,
        w_ty: GgmlType,
        n: usize,
        w: &[u8],
        rows: Range<usize>,
        p: &mut Panels<'_>,
    ) {
        use panels::PanelKind::{Blocks32, SuperBlocks256};
        let (rb, _, w_rows) = matrix_rows(w_ty, n, w, &rows);
        let nb = n / QK;
        // Row r's block i (the rows are whole blocks of `w_ty`, `rb` bytes each).
        fn block<B: block::Block>(w_rows: &[u8], rb: usize, r: usize, i: usize) -> &B {
            &blocks::<B>(&w_rows[r * rb..(r + 1) * rb])[i]
        }
        // 4-bit indices (low nibble = element j, high = element j + 16) through `table`.
        fn nibbles(qs: &[u8; QK / 2], table: &[i8; 16]) -> [i8; QK] {
            let mut v = [0i8; QK];
            for (j, &q) in qs.iter().enumerate() {
                v[j] = table[usize::from(q & 0x0F)];
                v[j + QK / 2] = table[usize::from(q >> 4)];
            }
            v
        }
        const Q4_0_LEVELS: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];
        match w_ty {
            GgmlType::Q8_0 => p.pack(Blocks32, rows.len(), nb, |r, i| {
                let b = block::<BlockQ8_0>(w_rows, rb, r, i);
                (b.d(), 0, b.qs)
            }),
            GgmlType::Q5_0 => p.pack(Blocks32, rows.len(), nb, |r, i| {
                let b = block::<q5_0::BlockQ5_0>(w_rows, rb, r, i);
                (b.d(), 0, b.quants().map(|q| q as i8 - 16))
            }),
            GgmlType::Q4_0 => p.pack(Blocks32, rows.len(), nb, |r, i| {
                let b = block::<BlockQ4_0>(w_rows, rb, r, i);
                (b.d(), 0, nibbles(&b.qs, &Q4_0_LEVELS))
            }),
            GgmlType::IQ4_NL => p.pack(Blocks32, rows.len(), nb, |r, i| {
                let b = block::<iq4_nl::BlockIq4Nl>(w_rows, rb, r, i);
                (b.d(), 0, nibbles(&b.qs, &iq4_nl::KVALUES_IQ4NL))
            }),
            GgmlType::IQ4_XS => p.pack(SuperBlocks256, rows.len(), nb, |r, i| {
                // Sub-block i % 8 of super-block i / 8: its 16 bytes of indices hold elements
                // 32k..32k + 16 (low nibbles) and 32k + 16..32k + 32 (high).
                let b = block::<iq4_xs::BlockIq4Xs>(w_rows, rb, r, i / 8);
                let k = i % 8;
                let qs: &[u8; QK / 2] = b.qs[16 * k..16 * k + 16].try_into().expect("16 bytes");
                (
                    block::f16_le(b.d),
                    b.scale(k),
                    nibbles(qs, &iq4_nl::KVALUES_IQ4NL),
                )
            }),
            _ => panic!("pack_panels: no panels for {w_ty}"),
        }
    }

    /// `y[t] = rows · x_q[t]` for the rows packed in `p` and 8 activation rows (Q8_0), each
    /// `y[t]` as long as the rows packed. Returns `false`, writing nothing, where the AVX2
    /// kernel declines: an activation quant is -128, which the quantizer never writes (the
    /// caller's other kernels then take these tokens).
    ///
    /// # Panics
    /// Where panels do not run here, or an activation row is shorter than a weight row.
    pub fn matmul_panels8(
        &self,
        p: &Panels<'_>,
        x_q: [&[u8]; MATVEC_TOKENS8],
        y: [&mut [f32]; MATVEC_TOKENS8],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Isa::Avx2(t) = self.isa {
            if !t.avx512() {
                return match p.kind() {
                    panels::PanelKind::Blocks32 => {
                        panels::matmul8_avx2(t, p, x_q.map(blocks::<BlockQ8_0>), y)
                    }
                    panels::PanelKind::SuperBlocks256 => {
                        panels::matmul8_k_avx2(t, p, x_q.map(blocks::<BlockQ8_K>), y)
                    }
                };
            }
            if t.avx512() {
                // SAFETY (both): the token proves the AVX-512 features; the kernels assert the
                // activation and output lengths.
                match p.kind() {
                    panels::PanelKind::Blocks32 => unsafe {
                        panels::matmul8(p, x_q.map(blocks::<BlockQ8_0>), y)
                    },
                    panels::PanelKind::SuperBlocks256 => unsafe {
                        panels::matmul8_k(p, x_q.map(blocks::<BlockQ8_K>), y)
                    },
                }
                return true;
            }
        }
        let _ = (p, x_q, y);
        panic!("matmul_panels8: no panel kernel on this set");
    }
}

/// Whether this CPU may run the packed panels (x86-64 with the AVX2 or AVX-512 kernels): a
/// thread's scratch must then hold [`PANELS_SCRATCH_BYTES`].
pub fn panels_possible() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::Token::detect().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the panels may run (`EDGE_RUN_PANELS=0` turns them off, for comparisons), read once.
#[cfg(target_arch = "x86_64")]
fn panels_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !matches!(std::env::var("EDGE_RUN_PANELS").as_deref(), Ok("0")))
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels::detect()
    }
}

#[cfg(test)]
mod tests;
