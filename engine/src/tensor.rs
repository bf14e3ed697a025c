//! Tensor element types as ggml stores them in GGUF files.
//!
//! Every quantized type is a sequence of fixed-size blocks; a row of `n` elements of a type
//! with block size `B` and block bytes `S` takes `n / B * S` bytes (`n` must be a multiple of `B`).

use std::fmt;

/// A ggml tensor type, by its GGUF type id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 32 weights: f16 scale `d`, 16 bytes of 4-bit quants; `w = d * (q - 8)`.
    Q4_0,
    /// 32 weights: f16 scale `d`, f16 min `m`, 16 bytes of 4-bit quants; `w = d * q + m`.
    Q4_1,
    /// 32 weights: f16 scale `d`, 32 signed bytes; `w = d * q`.
    Q8_0,
    /// 32 activations: f16 scale `d`, f16 `s = d * sum(q)`, 32 signed bytes (activation side of Q4_1).
    Q8_1,
    /// bfloat16.
    BF16,
    /// 32 weights: f16 `d`, 32 fifth bits, 16 bytes of nibbles; `w = d * (q - 16)`.
    Q5_0,
    /// 32 weights: f16 `d`, f16 `m`, 32 fifth bits, 16 bytes of nibbles; `w = d * q + m`.
    Q5_1,
    /// 256 weights: 16 sub-blocks with 4-bit scales/mins, 2-bit quants, f16 `d`, `dmin`.
    #[allow(non_camel_case_types)] // ggml's name
    Q2_K,
    /// 256 weights: 16 sub-blocks with 6-bit scales, 3-bit quants, f16 `d`.
    #[allow(non_camel_case_types)] // ggml's name
    Q3_K,
    /// 256 weights: 8 sub-blocks with 6-bit scales/mins, 4-bit quants, f16 `d`, `dmin`.
    #[allow(non_camel_case_types)] // ggml's name
    Q4_K,
    /// 256 weights: as Q4_K with 5-bit quants.
    #[allow(non_camel_case_types)] // ggml's name
    Q5_K,
    /// 256 weights: 16 sub-blocks with 8-bit scales, 6-bit quants, f16 `d`.
    #[allow(non_camel_case_types)] // ggml's name
    Q6_K,
    /// 256 activations: f32 `d`, 256 signed bytes, 16 i16 sums (activation side of the k-quants).
    #[allow(non_camel_case_types)] // ggml's name
    Q8_K,
    /// 32 weights: f16 `d`, 4-bit indices into a fixed non-linear table.
    #[allow(non_camel_case_types)] // ggml's name
    IQ4_NL,
    /// 256 weights: 8 IQ4_NL sub-blocks with 6-bit scales, f16 `d`.
    #[allow(non_camel_case_types)] // ggml's name
    IQ4_XS,
    /// A type id that GGUF defines but this engine does not implement (yet); carries the id.
    Unsupported(u32),
}

impl GgmlType {
    /// Maps a GGUF type id to a type. Ids that GGUF has never defined give `None`.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            30 => GgmlType::BF16,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            // Defined by ggml but not implemented here: IQ1..IQ3, I8..F64, TQ*, MXFP4.
            16..=19 | 21 | 22 | 24..=29 | 31..=36 | 39 => GgmlType::Unsupported(id),
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::BF16 => 30,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::Unsupported(id) => id,
        }
    }

    /// ggml's name for the type (`"q4_1"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::BF16 => "bf16",
            t @ (GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS) => unsupported_name(t.id()),
            GgmlType::Unsupported(id) => unsupported_name(id),
        }
    }

    /// Elements per block (1 for float types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
            GgmlType::Unsupported(id) => unsupported_layout(id).0,
            t => unsupported_layout(t.id()).0,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Unsupported(id) => unsupported_layout(id).1,
            t => unsupported_layout(t.id()).1,
        }
    }

    /// Whether the engine has kernels for this type.
    pub fn is_supported(self) -> bool {
        !matches!(self, GgmlType::Unsupported(_))
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if bs == 0 || !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// (block size, block bytes) of the ggml types beyond the 32-element ones: those implemented in
/// `cpu/` (Q5_0 .. IQ4_XS) and those we read past but do not compute with, so that files holding
/// them can still be inspected and their tensor ranges validated.
fn unsupported_layout(id: u32) -> (usize, usize) {
    match id {
        6 => (32, 22),    // q5_0
        7 => (32, 24),    // q5_1
        10 => (256, 84),  // q2_k
        11 => (256, 110), // q3_k
        12 => (256, 144), // q4_k
        13 => (256, 176), // q5_k
        14 => (256, 210), // q6_k
        15 => (256, 292), // q8_k
        16 => (256, 66),  // iq2_xxs
        17 => (256, 74),  // iq2_xs
        18 => (256, 98),  // iq3_xxs
        19 => (256, 50),  // iq1_s
        20 => (32, 18),   // iq4_nl
        21 => (256, 110), // iq3_s
        22 => (256, 82),  // iq2_s
        23 => (256, 136), // iq4_xs
        24 => (1, 1),     // i8
        25 => (1, 2),     // i16
        26 => (1, 4),     // i32
        27 => (1, 8),     // i64
        28 => (1, 8),     // f64
        29 => (256, 56),  // iq1_m
        34 => (256, 54),  // tq1_0
        35 => (256, 66),  // tq2_0
        39 => (32, 17),   // mxfp4
        _ => (0, 0),      // removed ids (31..33, 36: old q4_0_4_4 etc.) have no layout
    }
}

fn unsupported_name(id: u32) -> &'static str {
    match id {
        6 => "q5_0",
        7 => "q5_1",
        10 => "q2_k",
        11 => "q3_k",
        12 => "q4_k",
        13 => "q5_k",
        14 => "q6_k",
        15 => "q8_k",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        26 => "i32",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        34 => "tq1_0",
        35 => "tq2_0",
        39 => "mxfp4",
        _ => "removed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(4), None); // q4_2 was removed from ggml
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q8_0.row_bytes(33), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::Q4_K.row_bytes(1536), Some(6 * 144));
        assert_eq!(GgmlType::Q6_K.row_bytes(576), None);
        for (id, bs, bb) in [(6, 32, 22), (7, 32, 24), (10, 256, 84), (11, 256, 110)] {
            let t = GgmlType::from_id(id).unwrap();
            assert!(t.is_supported());
            assert_eq!((t.block_size(), t.block_bytes()), (bs, bb));
        }
        for (id, bs, bb) in [
            (12, 256, 144),
            (13, 256, 176),
            (14, 256, 210),
            (15, 256, 292),
        ] {
            let t = GgmlType::from_id(id).unwrap();
            assert!(t.is_supported());
            assert_eq!((t.block_size(), t.block_bytes()), (bs, bb));
        }
        assert_eq!(GgmlType::from_id(20), Some(GgmlType::IQ4_NL));
        assert_eq!(GgmlType::IQ4_XS.block_bytes(), 136);
        assert_eq!(GgmlType::IQ4_NL.name(), "iq4_nl");
    }
}
