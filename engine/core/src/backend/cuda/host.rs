//! The CUDA backend's decisions on the host, which need no GPU and are compiled (and tested)
//! in every build: whether a model can run on CUDA, how the weights reach the device, and what
//! a CUDA session allocates.

use edge_gguf::GgmlType;

use crate::arch::Layout;
use crate::error::{Hint, Setting};
use crate::hint;
use crate::model::Model;

/// "; use device cpu": the way around everything the CUDA backend cannot run.
fn use_cpu() -> Hint {
    hint!["; use ", Setting::Device, " cpu"]
}

/// Why the CUDA backend cannot run `model`, if it cannot: an architecture or op its kernels
/// lack, a head size its attention kernel lacks, or a weight type the type table says CUDA
/// has no kernels for. Checked when a CUDA session opens, and by
/// [`crate::backend::device_for`] to keep the default device on the CPU.
pub fn cuda_unsupported(model: &Model) -> Option<Hint> {
    let p = &model.params;
    if model.layout.is_encoder() {
        return Some(
            hint![format!(
                "the CUDA backend runs decoder models only; {} is an encoder (embedding) model, which runs on the CPU: use ",
                p.arch
            ), Setting::Device, " cpu"],
        );
    }
    if p.arch != "llama" {
        return Some(
            hint![format!(
                "the CUDA backend runs the llama architecture only (this model is {})",
                p.arch
            )]
            .then(use_cpu()),
        );
    }
    match &model.layout {
        Layout::Decoder(w) if w.rope_freqs.is_some() => {
            return Some(
                hint!["the CUDA backend has no rope frequency factors (rope_freqs.weight)"]
                    .then(use_cpu()),
            );
        }
        _ => {}
    }
    if !p.head_dim.is_multiple_of(32) || p.head_dim > 256 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return Some(
            hint![format!(
                "the CUDA attention kernel needs a head size that is a multiple of 32 up to 256 (this model's is {})",
                p.head_dim
            )]
            .then(use_cpu()),
        );
    }
    model
        .weights
        .iter()
        .find(|w| !w.ty.backends().cuda)
        .map(|w| {
            hint![format!(
                "tensor {} has type {}, which the CUDA backend does not support",
                w.name, w.ty
            )]
            .then(use_cpu())
        })
}

/// Bytes of the CUDA backend's scratch for a session of `ubatch` tokens per run over `ctx`
/// positions and `n_vocab` logits: the attention partials, the parameter block and the
/// constrained-decoding buffers (the threads only feed the GPU).
pub fn scratch_bytes(
    ubatch: usize,
    ctx: usize,
    n_head: usize,
    head_dim: usize,
    n_vocab: usize,
) -> usize {
    attn_partial_bytes(ubatch, ctx, n_head, head_dim)
        + params_bytes(ubatch)
        + constraint_bytes(n_vocab)
}

/// Bytes of a constrained step's device buffers for `n_vocab` logits, laid out as
/// [`ConstraintLayout`]: a parameter block for the masked argmax, the uploaded mask (one bit
/// per token) and the masked logits. Allocated with the session, so that a constrained step
/// uploads its mask instead of copying the logits to the host and allocates nothing.
pub fn constraint_bytes(n_vocab: usize) -> usize {
    ConstraintLayout::new(n_vocab).bytes
}

/// Where the parts of the constraint buffer lie (byte offsets; see [`constraint_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstraintLayout {
    /// A parameter block like the run's (`argmax_f32` writes its third i32).
    pub params: usize,
    /// The mask words (u32, bit `i % 32` of word `i / 32` allows token `i`).
    pub mask: usize,
    /// Words of the mask.
    pub mask_words: usize,
    /// The masked logits (f32).
    pub masked: usize,
    /// Logits the buffer takes (the mask's bits and the masked logits both hold this many).
    pub n_vocab: usize,
    /// The whole buffer.
    pub bytes: usize,
}

impl ConstraintLayout {
    /// The layout for `n_vocab` logits.
    pub fn new(n_vocab: usize) -> ConstraintLayout {
        let mask_words = n_vocab.div_ceil(32);
        let mask = params_bytes(0);
        let masked = mask + mask_words * 4;
        ConstraintLayout {
            params: 0,
            mask,
            mask_words,
            masked,
            n_vocab,
            bytes: masked + n_vocab * 4,
        }
    }
}

/// What a CUDA session of this plan's sizes allocates on the device.
pub fn device_memory(
    model: &Model,
    arena_bytes: u64,
    kv_bytes: u64,
    scratch_bytes: u64,
) -> CudaMemory {
    CudaMemory {
        arena_bytes,
        kv_bytes,
        weights_upload_bytes: uploaded_weight_bytes(model),
        scratch_bytes,
    }
}

/// The quantized weight types with integer (dp4a) matmul kernels, and the suffix of their kernel
/// names (`mmv_<suffix>` for one token, `mmm_<suffix>` for token tiles, in kernels.cu). Other
/// weight types (f32, f16, bf16) go to `mm_float`.
pub const QUANT_MATMUL: [(GgmlType, &str); 12] = [
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::IQ4_NL, "iq4_nl"),
    (GgmlType::Q2_K, "q2_k"),
    (GgmlType::Q3_K, "q3_k"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::IQ4_XS, "iq4_xs"),
];

/// How the weights reach an NVIDIA GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightPath {
    /// One device allocation, filled from the file once (discrete GPUs: the weights must be in
    /// device memory to be read at full bandwidth).
    Upload,
    /// The file mapping itself, page-locked read-only (`cuMemHostRegister` with
    /// `READ_ONLY | DEVICEMAP`): zero copies, the weights exist once (integrated GPUs such as
    /// Jetson Orin, whose GPU reads the same DRAM).
    Register,
    /// One managed allocation filled from the file (integrated GPUs that cannot register a
    /// read-only mapping; on Orin managed memory is GPU-cached while registered memory is not).
    Managed,
}

impl WeightPath {
    /// Parses `upload`, `register` or `managed` (the values of `EDGE_RUN_CUDA_WEIGHTS`).
    pub fn from_name(s: &str) -> Option<WeightPath> {
        match s {
            "upload" => Some(WeightPath::Upload),
            "register" => Some(WeightPath::Register),
            "managed" => Some(WeightPath::Managed),
            _ => None,
        }
    }

    /// `upload`, `register` or `managed`.
    pub fn name(self) -> &'static str {
        match self {
            WeightPath::Upload => "upload",
            WeightPath::Register => "register",
            WeightPath::Managed => "managed",
        }
    }
}

/// Environment variable that overrides the weight path (`upload`, `register`, `managed`).
pub const WEIGHTS_ENV: &str = "EDGE_RUN_CUDA_WEIGHTS";

/// The device attributes the weight-path choice depends on (CUDA device attributes of the same
/// names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceAttrs {
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: the GPU shares the host's memory.
    pub integrated: bool,
    /// `CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED`.
    pub host_register: bool,
    /// `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED` (a read-only file mapping can
    /// only be registered with the read-only flag).
    pub read_only_host_register: bool,
}

/// Chooses how the weights reach the device. `file_mapped`: the weights are a file mapping that
/// could be registered (not an owned buffer). `requested`: an override (flag or
/// [`WEIGHTS_ENV`]). Returns the path and why, or why the requested path is impossible.
///
/// Rules: a discrete GPU uploads (registered or managed host memory would be read over PCIe at
/// every token). An integrated GPU registers the mapping read-only when the device supports it
/// (zero copy: the weights exist once in DRAM), else fills one managed buffer.
pub fn choose_weight_path(
    attrs: DeviceAttrs,
    file_mapped: bool,
    requested: Option<WeightPath>,
) -> Result<(WeightPath, &'static str), String> {
    let can_register = attrs.host_register && attrs.read_only_host_register && file_mapped;
    match requested {
        Some(WeightPath::Register) if !can_register => Err(format!(
            "{WEIGHTS_ENV}=register: this device cannot register a read-only file mapping \
             (host register {}, read-only host register {}, file mapped {}); use upload or managed",
            attrs.host_register, attrs.read_only_host_register, file_mapped
        )),
        Some(p) => Ok((p, "requested")),
        None if !attrs.integrated => Ok((WeightPath::Upload, "discrete GPU")),
        None if can_register => Ok((
            WeightPath::Register,
            "integrated GPU: the file mapping registered read-only (zero copy)",
        )),
        None => Ok((
            WeightPath::Managed,
            "integrated GPU without read-only host registration: one managed buffer",
        )),
    }
}

/// Reads [`WEIGHTS_ENV`]: `Ok(None)` when unset or empty.
pub fn weight_path_from_env() -> Result<Option<WeightPath>, String> {
    match std::env::var(WEIGHTS_ENV) {
        Ok(v) if !v.is_empty() => WeightPath::from_name(&v)
            .map(Some)
            .ok_or_else(|| format!("{WEIGHTS_ENV}={v}: use upload, register or managed")),
        _ => Ok(None),
    }
}

/// Alignment of each weight inside the uploaded weight buffer (and of the CUDA arena's base:
/// cudaMalloc gives 256).
pub const WEIGHT_ALIGN: u64 = 256;

/// Bytes of the one device buffer the upload path fills: every tensor the graph reads, once
/// (a tied output head is the embedding table), each aligned to [`WEIGHT_ALIGN`].
pub fn uploaded_weight_bytes(model: &Model) -> u64 {
    let mut seen = std::collections::HashSet::new();
    model
        .weights
        .iter()
        .filter(|w| seen.insert(w.tensor_index))
        .map(|w| {
            let t = &model.gguf().tensors()[w.tensor_index];
            t.n_bytes.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN
        })
        .sum()
}

/// Most splits of the KV length in a decode step's attention (each split is one warp per head).
pub const MAX_ATTN_SPLITS: usize = 32;

/// Splits of the KV length for decode attention at context `ctx`: about 256 positions each, so
/// that long contexts spread over many SMs while short ones do not pay for empty splits.
pub fn decode_attn_splits(ctx: usize) -> usize {
    ctx.div_ceil(256).clamp(1, MAX_ATTN_SPLITS)
}

/// Bytes of the attention partials buffer (per row, head and split: max, sum and head_dim
/// accumulators, f32): the larger of a prefill (ubatch rows, one split) and a decode step.
pub fn attn_partial_bytes(ubatch: usize, ctx: usize, n_head: usize, head_dim: usize) -> usize {
    let per = (head_dim + 2) * 4;
    ubatch.max(decode_attn_splits(ctx)) * n_head * per
}

/// Bytes of the device parameter block: position, count, argmax result, padding, then ubatch
/// token ids (i32).
pub fn params_bytes(ubatch: usize) -> usize {
    (4 + ubatch) * 4
}

/// What a CUDA session allocates on the device, from its plan (no GPU needed: arithmetic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory {
    /// The arena: one device allocation at the plan's size; values at the plan's offsets.
    pub arena_bytes: u64,
    /// The KV cache: one device allocation.
    pub kv_bytes: u64,
    /// Weights copied to the device by the upload path (discrete GPUs); 0 extra bytes for
    /// `register` (the file mapping itself), the same bytes in managed memory for `managed`.
    pub weights_upload_bytes: u64,
    /// Attention partials and the parameter block.
    pub scratch_bytes: u64,
}

impl CudaMemory {
    /// Device bytes a discrete GPU holds for the session: arena + KV + scratch + weights.
    pub fn device_total_bytes(&self) -> u64 {
        self.arena_bytes + self.kv_bytes + self.scratch_bytes + self.weights_upload_bytes
    }
}

#[cfg(test)]
mod sizing_tests {
    use super::*;

    const DISCRETE: DeviceAttrs = DeviceAttrs {
        integrated: false,
        host_register: true,
        read_only_host_register: true,
    };
    const ORIN: DeviceAttrs = DeviceAttrs {
        integrated: true,
        host_register: true,
        read_only_host_register: true,
    };
    const ORIN_NO_RO: DeviceAttrs = DeviceAttrs {
        integrated: true,
        host_register: true,
        read_only_host_register: false,
    };

    #[test]
    fn discrete_gpus_upload() {
        assert_eq!(
            choose_weight_path(DISCRETE, true, None).unwrap().0,
            WeightPath::Upload
        );
        assert_eq!(
            choose_weight_path(DeviceAttrs::default(), true, None)
                .unwrap()
                .0,
            WeightPath::Upload
        );
    }

    #[test]
    fn integrated_gpus_register_the_mapping_when_they_can() {
        assert_eq!(
            choose_weight_path(ORIN, true, None).unwrap().0,
            WeightPath::Register
        );
        // Without read-only registration (or without a file mapping): managed.
        assert_eq!(
            choose_weight_path(ORIN_NO_RO, true, None).unwrap().0,
            WeightPath::Managed
        );
        assert_eq!(
            choose_weight_path(ORIN, false, None).unwrap().0,
            WeightPath::Managed
        );
        let no_reg = DeviceAttrs {
            host_register: false,
            ..ORIN
        };
        assert_eq!(
            choose_weight_path(no_reg, true, None).unwrap().0,
            WeightPath::Managed
        );
    }

    #[test]
    fn overrides_win_but_impossible_ones_are_refused() {
        for p in [
            WeightPath::Upload,
            WeightPath::Managed,
            WeightPath::Register,
        ] {
            assert_eq!(choose_weight_path(ORIN, true, Some(p)).unwrap().0, p);
        }
        assert_eq!(
            choose_weight_path(DISCRETE, true, Some(WeightPath::Managed))
                .unwrap()
                .0,
            WeightPath::Managed
        );
        let e = choose_weight_path(ORIN_NO_RO, true, Some(WeightPath::Register)).unwrap_err();
        assert!(e.contains("read-only host register false"), "{e}");
        assert!(choose_weight_path(ORIN, false, Some(WeightPath::Register)).is_err());
    }

    #[test]
    fn names_round_trip() {
        for p in [
            WeightPath::Upload,
            WeightPath::Managed,
            WeightPath::Register,
        ] {
            assert_eq!(WeightPath::from_name(p.name()), Some(p));
        }
        assert_eq!(WeightPath::from_name("copy"), None);
    }

    /// The type table's CUDA column is what the kernels cover: every quantized type with a
    /// matmul kernel pair, and the float types through `mm_float`.
    #[test]
    fn the_type_table_lists_the_cuda_kernels() {
        use edge_gguf::GgmlType;
        let mut with_kernels: Vec<GgmlType> = QUANT_MATMUL.iter().map(|&(t, _)| t).collect();
        with_kernels.extend([GgmlType::F32, GgmlType::F16, GgmlType::BF16]);
        for t in GgmlType::weight_types() {
            assert_eq!(t.backends().cuda, with_kernels.contains(&t), "{t}");
        }
        assert_eq!(
            with_kernels.len(),
            GgmlType::weight_types()
                .filter(|t| t.backends().cuda)
                .count()
        );
    }

    #[test]
    fn attention_splits_and_scratch() {
        assert_eq!(decode_attn_splits(1), 1);
        assert_eq!(decode_attn_splits(256), 1);
        assert_eq!(decode_attn_splits(257), 2);
        assert_eq!(decode_attn_splits(1 << 20), MAX_ATTN_SPLITS);
        // ubatch 512 dominates: 512 rows x 9 heads x (64 + 2) floats.
        assert_eq!(attn_partial_bytes(512, 8192, 9, 64), 512 * 9 * 66 * 4);
        assert_eq!(attn_partial_bytes(1, 8192, 9, 64), 32 * 9 * 66 * 4);
    }
}
