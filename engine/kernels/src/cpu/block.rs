//! The block plumbing every per-type file shares: [`Block`], the marker of block structs that
//! may be read straight from raw bytes, [`blocks`] / [`blocks_mut`] which reinterpret a byte slice
//! as such blocks, the 32-element block size [`QK`], and the f16 field codecs ([`f16_le`],
//! [`f16_le_bytes`], [`f16_bits_to_f32`]).
//!
//! A leaf: it imports nothing from the other kernel files, which import from it.

/// Elements per block of the 32-element quantized types (ggml's `QK4_0`, `QK8_1`, ...); the
/// k-quants and IQ4_XS use [`QK_K`](super::QK_K).
pub const QK: usize = 32;

/// Reinterprets the front of a byte slice as blocks (a trailing partial block is ignored).
pub(super) fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    let n = bytes.len() / std::mem::size_of::<B>();
    // SAFETY: `Block` types have alignment 1 (so any address is aligned), no padding, and every
    // bit pattern is a valid value; `n * size_of::<B>() <= bytes.len()` and the result borrows
    // `bytes`, so it stays in bounds and alive.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), n) }
}

/// Mutable counterpart of [`blocks`].
pub(super) fn blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let n = bytes.len() / std::mem::size_of::<B>();
    // SAFETY: as in `blocks`; the result borrows `bytes` mutably, so it is the only access.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

/// Marker for block structs that may be reinterpreted from raw bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only `u8`/`i8` arrays (alignment 1, no padding, every bit
/// pattern valid). Each implementation asserts size and alignment at compile time.
pub(super) unsafe trait Block: Sized {}

/// Decodes a little-endian f16 field (exact, like every f16 -> f32 conversion).
#[inline(always)]
pub(super) fn f16_le(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

/// f16 bits -> f32, exact and inlinable (the hot loops call it per block; `half`'s conversion
/// checks CPU features on every call). Normals are rebiased in the integers (exponent + 112);
/// subnormals are their integer mantissa times 2^-24, an exact product of normal numbers; inf
/// and NaN keep their payload. No arithmetic ever sees an f32 subnormal: multiplying one (as a
/// rebias by 2^112 would for f16 subnormals) takes a microcode assist of ~100 cycles on x86, and
/// K-quant super-block scales are often f16 subnormals (a Q6_K `d` is about amax / 4064).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let normal = (em << 13) + (112 << 23);
    let special = (em << 13) | 0x7f80_0000;
    let subnormal = (em as f32 * f32::from_bits(0x3380_0000)).to_bits(); // 2^-24
    let v = if em >= 0x7c00 {
        special
    } else if em >= 0x0400 {
        normal
    } else {
        subnormal
    };
    f32::from_bits(v | sign)
}

/// Encodes an f32 as a little-endian f16 field (round to nearest even, as ggml's FP32_TO_FP16).
#[inline(always)]
pub(super) fn f16_le_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}
