//! The ggml tensor types, in ONE table: for every type id GGUF defines, its name, its block
//! layout, the type activations are converted to before a dot product with it, and which
//! backends compute with weights of it. The GGUF reader, the kernels, model loading and the
//! CUDA backend all read this table; a new type is one new row (plus its kernels).
//!
//! Every quantized type is a sequence of fixed-size blocks; a row of `n` elements of a type
//! with block size `B` and block bytes `S` takes `n / B * S` bytes (`n` must be a multiple of
//! `B`).

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
    /// A type id that GGUF defines but this engine does not compute with (yet); carries the
    /// id. Its layout is still known (from the table), so files holding it can be inspected
    /// and their tensor ranges validated.
    Unsupported(u32),
}

/// Which backends compute with weights of a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backends {
    /// The CPU kernels (every kernel set: scalar, AVX2, AVX-512, NEON).
    pub cpu: bool,
    /// The CUDA backend's kernels.
    pub cuda: bool,
}

/// What role a type plays in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A weight type: model tensors of it are computed with, against activations of
    /// [`TypeInfo::vec_dot`].
    Weight,
    /// Only the activation side of a dot product (Q8_1, Q8_K): quantized into, never a model
    /// tensor.
    Activation,
    /// Defined by ggml, not computed with here: files holding it can be read and inspected.
    Unimplemented,
}

/// One row of the type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// The GGUF type id.
    pub id: u32,
    /// ggml's name (`"q4_1"`, ...).
    pub name: &'static str,
    /// Elements per block (1 for the plain types; 0 for the ids ggml removed, which have no
    /// layout).
    pub block_size: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// What the engine does with it.
    pub role: Role,
    /// The type ggml converts activations into before a dot product with a weight row of this
    /// type (`type_traits_cpu[t].vec_dot_type`): Q4_0, Q5_0, Q8_0 and IQ4_NL pair with Q8_0,
    /// Q4_1 and Q5_1 with Q8_1, the k-quants and IQ4_XS with Q8_K, the float types with
    /// themselves.
    pub vec_dot: GgmlType,
    /// Which backends compute with weights of this type.
    pub backends: Backends,
}

const CPU_CUDA: Backends = Backends {
    cpu: true,
    cuda: true,
};
const NONE: Backends = Backends {
    cpu: false,
    cuda: false,
};

/// A row of a type the engine computes with.
const fn weight(
    id: u32,
    name: &'static str,
    block_size: usize,
    block_bytes: usize,
    vec_dot: GgmlType,
    backends: Backends,
) -> Option<TypeInfo> {
    Some(TypeInfo {
        id,
        name,
        block_size,
        block_bytes,
        role: Role::Weight,
        vec_dot,
        backends,
    })
}

/// A row of an activation-only type.
const fn activation(
    id: u32,
    name: &'static str,
    block_size: usize,
    block_bytes: usize,
) -> Option<TypeInfo> {
    Some(TypeInfo {
        id,
        name,
        block_size,
        block_bytes,
        role: Role::Activation,
        vec_dot: GgmlType::Unsupported(id),
        backends: NONE,
    })
}

/// A row of a type this engine reads past but does not compute with.
const fn unimplemented(
    id: u32,
    name: &'static str,
    block_size: usize,
    block_bytes: usize,
) -> Option<TypeInfo> {
    Some(TypeInfo {
        id,
        name,
        block_size,
        block_bytes,
        role: Role::Unimplemented,
        vec_dot: GgmlType::Unsupported(id),
        backends: NONE,
    })
}

/// Ids below this are looked up in [`TABLE`]; above it GGUF defines none.
const N_IDS: usize = 40;

/// The table, indexed by type id (`None`: an id GGUF never defined).
static TABLE: [Option<TypeInfo>; N_IDS] = {
    use GgmlType as T;
    let mut t = [None; N_IDS];
    t[0] = weight(0, "f32", 1, 4, T::F32, CPU_CUDA);
    t[1] = weight(1, "f16", 1, 2, T::F16, CPU_CUDA);
    t[2] = weight(2, "q4_0", 32, 18, T::Q8_0, CPU_CUDA);
    t[3] = weight(3, "q4_1", 32, 20, T::Q8_1, CPU_CUDA);
    // 4 and 5 (q4_2, q4_3) were removed from ggml.
    t[6] = weight(6, "q5_0", 32, 22, T::Q8_0, CPU_CUDA);
    t[7] = weight(7, "q5_1", 32, 24, T::Q8_1, CPU_CUDA);
    t[8] = weight(8, "q8_0", 32, 34, T::Q8_0, CPU_CUDA);
    t[9] = activation(9, "q8_1", 32, 36);
    t[10] = weight(10, "q2_k", 256, 84, T::Q8_K, CPU_CUDA);
    t[11] = weight(11, "q3_k", 256, 110, T::Q8_K, CPU_CUDA);
    t[12] = weight(12, "q4_k", 256, 144, T::Q8_K, CPU_CUDA);
    t[13] = weight(13, "q5_k", 256, 176, T::Q8_K, CPU_CUDA);
    t[14] = weight(14, "q6_k", 256, 210, T::Q8_K, CPU_CUDA);
    t[15] = activation(15, "q8_k", 256, 292);
    t[16] = unimplemented(16, "iq2_xxs", 256, 66);
    t[17] = unimplemented(17, "iq2_xs", 256, 74);
    t[18] = unimplemented(18, "iq3_xxs", 256, 98);
    t[19] = unimplemented(19, "iq1_s", 256, 50);
    t[20] = weight(20, "iq4_nl", 32, 18, T::Q8_0, CPU_CUDA);
    t[21] = unimplemented(21, "iq3_s", 256, 110);
    t[22] = unimplemented(22, "iq2_s", 256, 82);
    t[23] = weight(23, "iq4_xs", 256, 136, T::Q8_K, CPU_CUDA);
    t[24] = unimplemented(24, "i8", 1, 1);
    t[25] = unimplemented(25, "i16", 1, 2);
    t[26] = unimplemented(26, "i32", 1, 4);
    t[27] = unimplemented(27, "i64", 1, 8);
    t[28] = unimplemented(28, "f64", 1, 8);
    t[29] = unimplemented(29, "iq1_m", 256, 56);
    t[30] = weight(30, "bf16", 1, 2, T::BF16, CPU_CUDA);
    // 31..33 and 36 (q4_0_4_4 and the other old repacked types) were removed: no layout.
    t[31] = unimplemented(31, "removed", 0, 0);
    t[32] = unimplemented(32, "removed", 0, 0);
    t[33] = unimplemented(33, "removed", 0, 0);
    t[34] = unimplemented(34, "tq1_0", 256, 54);
    t[35] = unimplemented(35, "tq2_0", 256, 66);
    t[36] = unimplemented(36, "removed", 0, 0);
    t[39] = unimplemented(39, "mxfp4", 32, 17);
    t
};

impl GgmlType {
    /// Maps a GGUF type id to a type. Ids that GGUF has never defined give `None`.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        let info = TABLE.get(id as usize).copied().flatten()?;
        Some(match info.id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            id => GgmlType::Unsupported(id),
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::Unsupported(id) => id,
        }
    }

    /// The type's row of the table. An `Unsupported` id that GGUF never defined (one not made
    /// by [`GgmlType::from_id`]) gets an empty row: no name, no layout, no backend.
    #[inline]
    pub fn info(self) -> &'static TypeInfo {
        static UNKNOWN: TypeInfo = TypeInfo {
            id: u32::MAX,
            name: "unknown",
            block_size: 0,
            block_bytes: 0,
            role: Role::Unimplemented,
            vec_dot: GgmlType::Unsupported(u32::MAX),
            backends: NONE,
        };
        match TABLE.get(self.id() as usize) {
            Some(Some(info)) => info,
            _ => &UNKNOWN,
        }
    }

    /// ggml's name for the type (`"q4_1"`, ...).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per block (1 for float types).
    #[inline]
    pub fn block_size(self) -> usize {
        self.info().block_size
    }

    /// Bytes per block.
    #[inline]
    pub fn block_bytes(self) -> usize {
        self.info().block_bytes
    }

    /// Whether the engine computes with this type, as a weight or as an activation (every
    /// variant but [`GgmlType::Unsupported`]).
    pub fn is_supported(self) -> bool {
        !matches!(self, GgmlType::Unsupported(_))
    }

    /// Whether model tensors of this type are computed with ([`Role::Weight`]).
    pub fn is_weight(self) -> bool {
        self.is_supported() && self.info().role == Role::Weight
    }

    /// The activation type of a dot product with a weight of this type (see
    /// [`TypeInfo::vec_dot`]); an activation-only or unsupported type maps to itself.
    #[inline]
    pub fn vec_dot_type(self) -> GgmlType {
        if self.is_weight() {
            self.info().vec_dot
        } else {
            self
        }
    }

    /// Which backends compute with weights of this type (none for a type that is no weight).
    pub fn backends(self) -> Backends {
        if self.is_weight() {
            self.info().backends
        } else {
            NONE
        }
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if bs == 0 || !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// Every weight type (those [`GgmlType::is_weight`]), in id order.
    pub fn weight_types() -> impl Iterator<Item = GgmlType> {
        (0..N_IDS as u32)
            .filter_map(GgmlType::from_id)
            .filter(|t| t.is_weight())
    }

    /// The names of the weight types the backend `pick` selects computes with, comma-separated
    /// (`"f32, f16, q4_0, ..."`), for messages.
    pub fn names_where(pick: impl Fn(Backends) -> bool) -> String {
        GgmlType::weight_types()
            .filter(|t| pick(t.backends()))
            .map(GgmlType::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
                assert_eq!(t.info().id, id);
            }
        }
        assert_eq!(GgmlType::from_id(4), None); // q4_2 was removed from ggml
        assert_eq!(GgmlType::from_id(37), None);
        assert_eq!(GgmlType::from_id(1000), None);
        assert_eq!(GgmlType::Unsupported(1000).name(), "unknown");
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q8_0.row_bytes(33), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::Q4_K.row_bytes(1536), Some(6 * 144));
        assert_eq!(GgmlType::Q6_K.row_bytes(576), None);
        // ggml's block layouts (ggml-common.h).
        for (id, bs, bb) in [
            (6, 32, 22),
            (7, 32, 24),
            (10, 256, 84),
            (11, 256, 110),
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
        assert_eq!(GgmlType::from_id(32).unwrap().row_bytes(32), None);
    }

    #[test]
    fn activation_types_follow_ggml() {
        use GgmlType as T;
        for (w, x) in [
            (T::Q4_0, T::Q8_0),
            (T::Q5_0, T::Q8_0),
            (T::Q8_0, T::Q8_0),
            (T::IQ4_NL, T::Q8_0),
            (T::Q4_1, T::Q8_1),
            (T::Q5_1, T::Q8_1),
            (T::Q2_K, T::Q8_K),
            (T::Q3_K, T::Q8_K),
            (T::Q4_K, T::Q8_K),
            (T::Q5_K, T::Q8_K),
            (T::Q6_K, T::Q8_K),
            (T::IQ4_XS, T::Q8_K),
            (T::F32, T::F32),
            (T::F16, T::F16),
            (T::BF16, T::BF16),
            (T::Q8_1, T::Q8_1),
            (T::Q8_K, T::Q8_K),
        ] {
            assert_eq!(w.vec_dot_type(), x, "{w}");
            // An activation row is whole blocks wherever the weight row is.
            assert_eq!(w.block_size() % x.block_size(), 0, "{w}");
        }
        assert!(!T::Q8_1.is_weight() && T::Q8_1.is_supported());
        assert!(!T::Unsupported(16).is_supported());
    }

    #[test]
    fn weight_types_are_listed_once_with_their_backends() {
        let names = GgmlType::names_where(|b| b.cpu);
        assert_eq!(
            names,
            "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, bf16"
        );
        assert_eq!(GgmlType::weight_types().count(), 15);
    }
}
