// edge-run's CUDA kernels: one (or two) per op of the planned graph (engine/src/graph.rs).
//
// Data layouts are the CPU backend's, byte for byte, because the CUDA executor runs the *same*
// planned graph over the same arena offsets: quantized activations are ggml's q8_0 (34-byte) and
// q8_1 (36-byte) blocks, weights are the file's blocks, the KV cache is
// `[layer][k|v][pos][kv_dim]` f16 rows. Blocks of 18/34 bytes are only 2-byte aligned, so packed
// quants are read with 16-bit loads and assembled into 32-bit words for dp4a.
//
// Positions and token ids are read from a small device buffer (`Params`), never passed as kernel
// arguments: the decode step is captured once as a CUDA graph and replayed per token, and a
// captured launch keeps the argument values it was captured with.
//
// Where a kernel can reproduce the CPU's arithmetic exactly (embed, rms_norm, quantize, rope) it
// uses the explicitly rounded intrinsics (__fmul_rn, ...) so that nvcc does not contract
// multiply-adds the CPU code does not fuse; the tests compare those bit for bit. Dot products and
// attention add in a different order than the CPU and are compared with a tolerance.

#include <cuda_fp16.h>
#include <stdint.h>

#define QK 32

// ggml type ids (GgmlType::id in engine/src/tensor.rs).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q8_0 8
#define T_Q8_1 9
#define T_BF16 30

// The device parameter block. Mirrors `cuda::PARAMS_*` in engine/src/cuda/mod.rs.
struct Params {
    int pos0;      // position of the first token of the run
    int n_tokens;  // tokens of the run (informational; kernels take it as an argument)
    int argmax;    // written by `argmax_f32`
    int pad;
    int tokens[1]; // ubatch token ids follow
};

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f2h(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *(const uint16_t*)p; }
// A 32-bit word from a 2-byte aligned address.
__device__ __forceinline__ int ld_i32_b2(const uint8_t* p) {
    const uint16_t* q = (const uint16_t*)p;
    return (int)((uint32_t)q[0] | ((uint32_t)q[1] << 16));
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ int warp_sum_i(int x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Element i of a row of `type` (row starts at `row`).
__device__ __forceinline__ float dequant(int type, const uint8_t* row, int i) {
    int b = i / QK, j = i % QK;
    switch (type) {
    case T_F32: return ((const float*)row)[i];
    case T_F16: return h2f(((const uint16_t*)row)[i]);
    case T_BF16: return __uint_as_float(((uint32_t)((const uint16_t*)row)[i]) << 16);
    case T_Q4_0: {
        const uint8_t* blk = row + b * 18;
        uint8_t q = blk[2 + (j % 16)];
        int nib = j < 16 ? (q & 15) : (q >> 4);
        return __fmul_rn((float)(nib - 8), h2f(ld_u16(blk)));
    }
    case T_Q4_1: {
        const uint8_t* blk = row + b * 20;
        uint8_t q = blk[4 + (j % 16)];
        int nib = j < 16 ? (q & 15) : (q >> 4);
        return __fadd_rn(__fmul_rn((float)nib, h2f(ld_u16(blk))), h2f(ld_u16(blk + 2)));
    }
    case T_Q8_0: {
        const uint8_t* blk = row + b * 34;
        return __fmul_rn((float)(int8_t)blk[2 + j], h2f(ld_u16(blk)));
    }
    case T_Q8_1: {
        const uint8_t* blk = row + b * 36;
        return __fmul_rn((float)(int8_t)blk[4 + j], h2f(ld_u16(blk)));
    }
    }
    return 0.0f;
}

// out[t] = row tokens[t] of the table (ids >= n_rows give a zero row, as on the CPU).
// grid: n_tokens; block: any.
extern "C" __global__ void embed(const uint8_t* table, int type, unsigned long long row_bytes,
                                 int n_rows, int row_len, const Params* params, float* out) {
    int t = blockIdx.x;
    int id = params->tokens[t];
    float* dst = out + (size_t)t * row_len;
    for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
        dst[i] = (id >= 0 && id < n_rows) ? dequant(type, table + (size_t)id * row_bytes, i) : 0.0f;
    }
}

// out = x * 1/sqrt(mean(x^2) + eps) * w per row, with the CPU's f64 sum of f32 squares.
// grid: rows; block: 256.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int cols, float eps) {
    __shared__ double partial[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* o = out + (size_t)blockIdx.x * cols;
    double s = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (double)__fmul_rn(xr[i], xr[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) partial[0] = s;
    }
    __syncthreads();
    float mean = (float)(__ddiv_rn(partial[0], (double)cols));
    float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// Rows of f32 -> q8_0 (q8_1 when `with_sum`) blocks, one warp per block of 32, as the CPU's
// quantizer: d = amax/127, q = round(x * id) with id = 127/amax (flavour 1, ggml's x86 code) or
// 1/d (flavours 0 and 2), rounding half away from zero (flavour 0, ggml's reference) or half to
// even (1 x86, 2 arm); d stored as f16; q8_1 adds s = f16(sum(q) * d).
// grid: ceil(rows * cols/32 / 8); block: 256.
extern "C" __global__ void quantize_q8(const float* x, uint8_t* out, int rows, int cols,
                                       unsigned long long row_bytes, int with_sum, int flavour) {
    int nb = cols / QK;
    long long job = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (job >= (long long)rows * nb) return;
    int lane = threadIdx.x % 32;
    int r = (int)(job / nb), b = (int)(job % nb);
    float v = x[(size_t)r * cols + (size_t)b * QK + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = __fdiv_rn(amax, 127.0f);
    float id;
    if (flavour == 1) id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    else id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    float s = __fmul_rn(v, id);
    int q = (int)(flavour == 0 ? roundf(s) : rintf(s));
    q = max(-128, min(127, q));
    int bsz = with_sum ? 36 : 34;
    uint8_t* blk = out + (size_t)r * row_bytes + (size_t)b * bsz;
    int hdr = with_sum ? 4 : 2;
    blk[hdr + lane] = (uint8_t)(int8_t)q;
    int sum = warp_sum_i(q);
    if (lane == 0) {
        *(uint16_t*)blk = f2h(d);
        if (with_sum) *(uint16_t*)(blk + 2) = f2h(__fmul_rn((float)sum, d));
    }
}

// Rows of f32 -> f32 / f16 / bf16 (the activation types of float weights).
// grid: ceil(rows*cols/256); block: 256.
extern "C" __global__ void quantize_float(const float* x, uint8_t* out, long long n, int type) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    if (type == T_F32) ((float*)out)[i] = v;
    else if (type == T_F16) ((uint16_t*)out)[i] = f2h(v);
    else {
        uint32_t u = __float_as_uint(v);
        uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 64)
                                                      : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        ((uint16_t*)out)[i] = h;
    }
}

// ---- quantized matrix x activations (MMVQ-style: integer dp4a dot products per block) -----------

// One weight block (32 values) against one activation block; returns the block's f32 term.
template <int WT> struct BlockDot;

template <> struct BlockDot<T_Q4_0> {
    static constexpr int WB = 18, XB = 34;
    int q[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
#pragma unroll
        for (int k = 0; k < 4; k++) q[k] = ld_i32_b2(w + 2 + 4 * k);
    }
    __device__ __forceinline__ float dot(const uint8_t* x) const {
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int x0 = ld_i32_b2(x + 2 + 4 * k), x1 = ld_i32_b2(x + 2 + 16 + 4 * k);
            sumi = __dp4a(q[k] & 0x0F0F0F0F, x0, sumi);
            sumi = __dp4a((q[k] >> 4) & 0x0F0F0F0F, x1, sumi);
            sumx = __dp4a(0x01010101, x0, sumx);
            sumx = __dp4a(0x01010101, x1, sumx);
        }
        return (float)(sumi - 8 * sumx) * (d * h2f(ld_u16(x)));
    }
};

template <> struct BlockDot<T_Q4_1> {
    static constexpr int WB = 20, XB = 36;
    int q[4];
    float d, m;
    __device__ __forceinline__ void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
        m = h2f(ld_u16(w + 2));
#pragma unroll
        for (int k = 0; k < 4; k++) q[k] = ld_i32_b2(w + 4 + 4 * k);
    }
    __device__ __forceinline__ float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sumi = __dp4a(q[k] & 0x0F0F0F0F, ld_i32_b2(x + 4 + 4 * k), sumi);
            sumi = __dp4a((q[k] >> 4) & 0x0F0F0F0F, ld_i32_b2(x + 4 + 16 + 4 * k), sumi);
        }
        return (d * h2f(ld_u16(x))) * (float)sumi + m * h2f(ld_u16(x + 2));
    }
};

template <> struct BlockDot<T_Q8_0> {
    static constexpr int WB = 34, XB = 34;
    int q[8];
    float d;
    __device__ __forceinline__ void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = ld_i32_b2(w + 2 + 4 * k);
    }
    __device__ __forceinline__ float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) sumi = __dp4a(q[k], ld_i32_b2(x + 2 + 4 * k), sumi);
        return (float)sumi * (d * h2f(ld_u16(x)));
    }
};

// y[t][r] = dot(W row r, x[t]) for r < n_rows, t < n_tok. One warp per weight row; its lanes
// stride over the row's blocks, each weight block is loaded once into registers and used for
// NT tokens (NT = 1 for decode; a tile of tokens for prefill, so that the weights are read
// n_tok/NT times instead of n_tok times). grid: (ceil(n_rows/4), ceil(n_tok/NT)); block: 128.
template <int WT, int NT>
__device__ __forceinline__ void mul_mat_q(const uint8_t* w, const uint8_t* x, float* y, int n_rows,
                                          int n_cols, int n_tok, unsigned long long x_row_bytes) {
    typedef BlockDot<WT> B;
    int row = blockIdx.x * 4 + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int t0 = blockIdx.y * NT;
    if (row >= n_rows) return;
    int nb = n_cols / QK;
    const uint8_t* wr = w + (size_t)row * nb * B::WB;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        B blk;
        blk.load(wr + (size_t)b * B::WB);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + t < n_tok) acc[t] += blk.dot(x + (size_t)(t0 + t) * x_row_bytes + (size_t)b * B::XB);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t0 + t < n_tok) y[(size_t)(t0 + t) * n_rows + row] = s;
    }
}

#define MMQ(NAME, WT, NT)                                                                         \
    extern "C" __global__ void NAME(const uint8_t* w, const uint8_t* x, float* y, int n_rows,    \
                                    int n_cols, int n_tok, unsigned long long x_row_bytes) {     \
        mul_mat_q<WT, NT>(w, x, y, n_rows, n_cols, n_tok, x_row_bytes);                           \
    }
MMQ(mmv_q4_0, T_Q4_0, 1)
MMQ(mmv_q4_1, T_Q4_1, 1)
MMQ(mmv_q8_0, T_Q8_0, 1)
MMQ(mmm_q4_0, T_Q4_0, 8)
MMQ(mmm_q4_1, T_Q4_1, 8)
MMQ(mmm_q8_0, T_Q8_0, 8)

// Float weights (f32, f16, bf16) with activations of the same type; f32 accumulation.
// grid: (ceil(n_rows/4), n_tok); block: 128.
extern "C" __global__ void mm_float(const uint8_t* w, int type, const uint8_t* x, float* y, int n_rows,
                                    int n_cols, int n_tok) {
    int row = blockIdx.x * 4 + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int t = blockIdx.y;
    if (row >= n_rows || t >= n_tok) return;
    int es = type == T_F32 ? 4 : 2;
    const uint8_t* wr = w + (size_t)row * n_cols * es;
    const uint8_t* xr = x + (size_t)t * n_cols * es;
    float acc = 0.0f;
    for (int i = lane; i < n_cols; i += 32) acc += dequant(type, wr, i) * dequant(type, xr, i);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)t * n_rows + row] = acc;
}

// ---- position-dependent ops ----------------------------------------------------------------------

// Rotary embedding, the CPU's rope_row per element: theta_i = pos * theta_scale^i by repeated
// multiplication (ggml's recurrence), angle theta_i * freq_scale, pairs adjacent (neox = 0) or
// n_rot/2 apart (neox = 1), dims past n_rot copied. grid: (n_tokens); block: 256.
extern "C" __global__ void rope(const float* x, float* out, int cols, int head_dim, int n_rot, int neox,
                                float theta_scale, float freq_scale, const Params* params) {
    int t = blockIdx.x;
    int pos = params->pos0 + t;
    const float* src = x + (size_t)t * cols;
    float* dst = out + (size_t)t * cols;
    int half_rot = n_rot / 2;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        int base = c - c % head_dim, d = c % head_dim;
        if (d >= n_rot) {
            dst[c] = src[c];
            continue;
        }
        int i, a, b;
        bool first;
        if (neox) {
            first = d < half_rot;
            i = first ? d : d - half_rot;
            a = base + i;
            b = base + i + half_rot;
        } else {
            first = d % 2 == 0;
            i = d / 2;
            a = base + 2 * i;
            b = a + 1;
        }
        float theta = (float)pos;
        for (int k = 0; k < i; k++) theta = __fmul_rn(theta, theta_scale);
        float sn, cs;
        sincosf(__fmul_rn(theta, freq_scale), &sn, &cs);
        float x0 = src[a], x1 = src[b];
        dst[c] = first ? fmaf(x0, cs, -__fmul_rn(x1, sn)) : fmaf(x0, sn, __fmul_rn(x1, cs));
    }
}

// Rows t of k and v -> f16 cache rows pos0 + t of `layer` (cache layout [layer][k|v][ctx][kv_dim]).
// grid: n_tokens; block: 256.
extern "C" __global__ void store_kv_f16(const float* k, const float* v, uint16_t* cache, int layer, int ctx,
                                        int kv_dim, const Params* params) {
    int t = blockIdx.x;
    size_t pos = (size_t)(params->pos0 + t);
    uint16_t* kd = cache + ((size_t)(2 * layer) * ctx + pos) * kv_dim;
    uint16_t* vd = cache + ((size_t)(2 * layer + 1) * ctx + pos) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kd[i] = f2h(k[(size_t)t * kv_dim + i]);
        vd[i] = f2h(v[(size_t)t * kv_dim + i]);
    }
}

#define ATT_MAX_PER_LANE 8 // head_dim <= 256

// Flash attention, first pass: one warp per (token, head, split). Row t attends to positions
// 0..pos0+t (causal); split s takes the s-th of n_split equal chunks of them (chunks are computed
// from the run-time position, so a captured decode graph stays valid as the context grows). The
// warp walks its chunk 32 positions at a time: each lane scores one position (K . q, q rounded to
// f16 as the CPU does), then the tile's probabilities are broadcast and every lane accumulates
// its head_dim/32 output dims of V (coalesced), with an online softmax (running max, sum,
// rescaled accumulator). Writes (max, sum, acc[head_dim]) per (row, head, split) to `partial`.
// grid: (n_tokens * n_head, n_split); block: 32.
extern "C" __global__ void attn_partial(const float* q, const uint16_t* cache, float* partial, int n_head,
                                        int n_head_kv, int head_dim, int ctx, int kv_dim, int layer,
                                        float scale, int n_split, const Params* params) {
    __shared__ float qs[ATT_MAX_PER_LANE * 32];
    int th = blockIdx.x, split = blockIdx.y, lane = threadIdx.x;
    int t = th / n_head, h = th % n_head;
    int kvh = h / (n_head / n_head_kv);
    int n_pos = params->pos0 + t + 1;
    int chunk = (n_pos + n_split - 1) / n_split;
    int start = split * chunk, end = min(n_pos, start + chunk);
    const float* qr = q + (size_t)t * n_head * head_dim + (size_t)h * head_dim;
    for (int d = lane; d < head_dim; d += 32) qs[d] = __half2float(__float2half_rn(qr[d]));
    __syncwarp();
    const uint16_t* kbase = cache + (size_t)(2 * layer) * ctx * kv_dim + (size_t)kvh * head_dim;
    const uint16_t* vbase = cache + (size_t)(2 * layer + 1) * ctx * kv_dim + (size_t)kvh * head_dim;
    int per_lane = head_dim / 32;
    float m = -INFINITY, l = 0.0f, acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATT_MAX_PER_LANE; k++) acc[k] = 0.0f;
    for (int p0 = start; p0 < end; p0 += 32) {
        int p = p0 + lane;
        float s = -INFINITY;
        if (p < end) {
            const __half2* kr = (const __half2*)(kbase + (size_t)p * kv_dim);
            float dot = 0.0f;
            for (int d = 0; d < head_dim / 2; d++) {
                float2 kf = __half22float2(kr[d]);
                dot = fmaf(kf.x, qs[2 * d], dot);
                dot = fmaf(kf.y, qs[2 * d + 1], dot);
            }
            s = dot * scale;
        }
        float new_m = fmaxf(m, warp_max(s));
        float corr = expf(m - new_m); // m = -inf at the first tile: corr = 0
        float e = p < end ? expf(s - new_m) : 0.0f;
        l = l * corr + warp_sum(e);
#pragma unroll
        for (int k = 0; k < ATT_MAX_PER_LANE; k++) acc[k] *= corr;
        int n_here = min(32, end - p0);
        for (int j = 0; j < n_here; j++) {
            float pj = __shfl_sync(0xffffffffu, e, j);
            const uint16_t* vr = vbase + (size_t)(p0 + j) * kv_dim;
#pragma unroll
            for (int k = 0; k < ATT_MAX_PER_LANE; k++) {
                if (k < per_lane) acc[k] = fmaf(pj, h2f(vr[lane + 32 * k]), acc[k]);
            }
        }
        m = new_m;
    }
    float* out = partial + ((size_t)th * n_split + split) * (head_dim + 2);
    if (lane == 0) {
        out[0] = m;
        out[1] = l;
    }
#pragma unroll
    for (int k = 0; k < ATT_MAX_PER_LANE; k++) {
        if (k < per_lane) out[2 + lane + 32 * k] = acc[k];
    }
}

// Flash attention, second pass: merges the splits of each (row, head) and normalizes.
// grid: n_tokens * n_head; block: 128.
extern "C" __global__ void attn_combine(const float* partial, float* out, int head_dim, int n_split) {
    int th = blockIdx.x;
    const float* pp = partial + (size_t)th * n_split * (head_dim + 2);
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++) mx = fmaxf(mx, pp[s * (head_dim + 2)]);
    float l = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float* ps = pp + s * (head_dim + 2);
        if (ps[1] > 0.0f) l += ps[1] * expf(ps[0] - mx);
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float* ps = pp + s * (head_dim + 2);
            if (ps[1] > 0.0f) a += ps[2 + d] * expf(ps[0] - mx);
        }
        out[(size_t)th * head_dim + d] = a * inv;
    }
}

// ---- element-wise ----------------------------------------------------------------------------------

// grid: ceil(n/256); block: 256.
// May run in place (out == a or out == b: the planner lets a residual add write over an input
// that dies there): each thread reads its element before writing it, and nothing is __restrict__.
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// out = silu(gate) * up. grid: ceil(n/256); block: 256.
// May run in place (out == g), as add_f32.
extern "C" __global__ void swiglu_f32(const float* g, const float* u, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = g[i];
        out[i] = (x / (1.0f + expf(-x))) * u[i];
    }
}

// out[0..cols) = x row `row`. grid: ceil(cols/256); block: 256.
extern "C" __global__ void copy_row(const float* x, float* out, int cols, int row) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < cols) out[i] = x[(size_t)row * cols + i];
}

// params->argmax = the index of the largest of x[0..n) (the first one on ties; NaN never wins),
// as sampling::argmax on the CPU. grid: 1; block: 1024.
extern "C" __global__ void argmax_f32(const float* x, int n, Params* params) {
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > best || (idx == 0x7fffffff && !isnan(v))) {
            best = v;
            idx = i;
        }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = bv[threadIdx.x + s];
            int oi = bi[threadIdx.x + s];
            if (oi != 0x7fffffff &&
                (bi[threadIdx.x] == 0x7fffffff || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) params->argmax = bi[0] == 0x7fffffff ? 0 : bi[0];
}
