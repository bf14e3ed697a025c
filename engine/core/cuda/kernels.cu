// edge-run's CUDA kernels: one (or two) per op of the planned graph (engine/src/graph.rs).
//
// Data layouts are the CPU backend's, byte for byte, because the CUDA executor runs the *same*
// planned graph over the same arena offsets: quantized activations are ggml's q8_0 (34-byte) and
// q8_1 (36-byte) and Q8_K (292-byte) blocks, weights are the file's blocks, the KV cache is
// `[layer][k|v][pos][row]` rows of f16 or q8_0 blocks. Blocks of 18/34 bytes are only 2-byte aligned, so packed
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
#ifndef __CUDACC_RTC__
#include <string.h> // memcpy, for the host side of host_check.cu (NVRTC has no such header)
#endif

// NVRTC (the last-resort image, engine/src/cuda/module.rs) has no <math.h>.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#define QK 32

// ggml type ids (GgmlType::id in engine/src/tensor.rs).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q8_1 9
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_Q8_K 15
#define T_IQ4_NL 20
#define T_IQ4_XS 23
#define T_BF16 30

#define QK_K 256
// Bytes of one block (engine/src/cpu/q*.rs; ggml's block structs).
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define IQ4_NL_BYTES 18
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q8_K_BYTES 292
#define IQ4_XS_BYTES 136

// IQ4_NL's (and IQ4_XS's) non-linear 4-bit table (KVALUES_IQ4NL in engine/src/cpu/iq4_nl.rs),
// in constant memory on the device and a plain array for host_check.cu.
#ifdef __CUDA_ARCH__
#define kvalues_iq4nl kvalues_iq4nl_dev
#else
#define kvalues_iq4nl kvalues_iq4nl_host
#endif
__device__ __constant__ int8_t kvalues_iq4nl_dev[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                         1,    13,   25,  38,  53,  69,  89,  113};
#ifndef __CUDA_ARCH__
static const int8_t kvalues_iq4nl_host[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                              1,    13,   25,  38,  53,  69,  89,  113};
#endif

// The device parameter block. Mirrors `cuda::PARAMS_*` in engine/src/cuda/mod.rs.
struct Params {
    int pos0;      // position of the first token of the run
    int n_tokens;  // tokens of the run (informational; kernels take it as an argument)
    int argmax;    // written by `argmax_f32`
    int pad;
    int tokens[1]; // ubatch token ids follow
};

// Functions marked HD also compile for the host: engine/cuda/host_check.cu runs the block
// decoders and block dot products on the CPU against the Rust CPU kernels (a test of every
// block layout that needs no GPU; see build.rs). Device intrinsics they use have host spellings
// here; on the device each is the intrinsic itself.
#define HD __host__ __device__ __forceinline__

HD float fmul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b; // host: an IEEE f32 product (host_check is built without FP contraction)
#endif
}
HD float fadd_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
HD float fsub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
HD float fdiv_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
HD double dadd_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
HD double ddiv_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}
HD double dmul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
HD float int_as_float(int x) {
#ifdef __CUDA_ARCH__
    return __int_as_float(x);
#else
    float f;
    memcpy(&f, &x, 4);
    return f;
#endif
}
// c + the dot product of the four signed bytes of a and of b.
HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

HD float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f2h(float x) { return __half_as_ushort(__float2half_rn(x)); }
HD uint16_t ld_u16(const uint8_t* p) { return *(const uint16_t*)p; }
// A 32-bit word from a 2-byte aligned address.
HD int ld_i32_b2(const uint8_t* p) {
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

// ---- block layouts shared by dequantization and the dot products ---------------------------------

// ggml's get_scale_min_k4 (scale_min_k4 in engine/src/cpu/q4_k.rs): 6-bit scale and min of
// sub-block j (0..8) of a Q4_K / Q5_K super-block from its 12 packed bytes `q`.
HD void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Signed scale of sub-block k (0..16) of a Q3_K super-block from its 12 packed bytes `s`
// (BlockQ3_K::scales in engine/src/cpu/q3_k.rs).
HD int q3k_scale(const uint8_t* s, int k) {
    int lo = k < 8 ? (s[k] & 0x0F) : (s[k - 8] >> 4);
    int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Signed scale of sub-block k (0..8) of an IQ4_XS super-block `blk` (BlockIq4Xs::scale).
HD int iq4xs_scale(const uint8_t* blk, int k) {
    int h = ld_u16(blk + 2);
    int lo = (blk[4 + k / 2] >> (4 * (k % 2))) & 0x0F;
    int hi = (h >> (2 * k)) & 3;
    return (lo | (hi << 4)) - 32;
}

// The 5th bit of element j (0..32) of a Q5_0 / Q5_1 block, from its little-endian u32 `qh`.
HD int q5_high_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// Element j (0..256) of a k-quant super-block `blk` of `type`, with the CPU's dequantize_row
// arithmetic (engine/src/cpu/q*_k.rs, iq4_xs.rs), each product and difference rounded as there.
HD float dequant_k(int type, const uint8_t* blk, int j) {
    switch (type) {
    case T_Q4_K:
    case T_Q5_K: {
        int k = j / 32, l = j % 32;
        int sc, m;
        scale_min_k4(k, blk + 4, &sc, &m);
        const uint8_t* qs = blk + (type == T_Q4_K ? 16 : 48);
        uint8_t byte = qs[32 * (k / 2) + l];
        int q = (k % 2) ? (byte >> 4) : (byte & 0x0F);
        if (type == T_Q5_K) q |= ((blk[16 + l] >> k) & 1) << 4;
        float d1 = fmul_rn(h2f(ld_u16(blk)), (float)sc);
        float m1 = fmul_rn(h2f(ld_u16(blk + 2)), (float)m);
        return fsub_rn(fmul_rn(d1, (float)q), m1);
    }
    case T_Q6_K: {
        int h = j / 128, s = (j % 128) / 32, l = j % 32;
        uint8_t lb = blk[64 * h + l + 32 * (s & 1)];
        int nib = s >= 2 ? (lb >> 4) : (lb & 0x0F);
        int hb = (blk[128 + 32 * h + l] >> (2 * s)) & 3;
        int q = (nib | (hb << 4)) - 32;
        float dl = fmul_rn(h2f(ld_u16(blk + 208)), (float)(int8_t)blk[192 + j / 16]);
        return fmul_rn(dl, (float)q);
    }
    case T_Q2_K: {
        int h = j / 128, s = (j % 128) / 32, l = j % 32;
        int q = (blk[16 + 32 * h + l] >> (2 * s)) & 3;
        uint8_t sc = blk[j / 16];
        float dl = fmul_rn(h2f(ld_u16(blk + 80)), (float)(sc & 0x0F));
        float ml = fmul_rn(h2f(ld_u16(blk + 82)), (float)(sc >> 4));
        return fsub_rn(fmul_rn(dl, (float)q), ml);
    }
    case T_Q3_K: {
        int h = j / 128, s = (j % 128) / 32, l = j % 32;
        int low = (blk[32 + 32 * h + l] >> (2 * s)) & 3;
        int q = low - (((blk[l] >> (4 * h + s)) & 1) ? 0 : 4);
        float dl = fmul_rn(h2f(ld_u16(blk + 108)), (float)q3k_scale(blk + 96, j / 16));
        return fmul_rn(dl, (float)q);
    }
    case T_IQ4_XS: {
        int k = j / 32, jj = j % 32;
        uint8_t byte = blk[8 + 16 * k + jj % 16];
        int idx = jj < 16 ? (byte & 0x0F) : (byte >> 4);
        float dl = fmul_rn(h2f(ld_u16(blk)), (float)iq4xs_scale(blk, k));
        return fmul_rn(dl, (float)kvalues_iq4nl[idx]);
    }
    }
    return 0.0f;
}

// Bytes of one super-block of a k-quant `type` (0 for other types).
HD int k_block_bytes(int type) {
    switch (type) {
    case T_Q2_K: return Q2_K_BYTES;
    case T_Q3_K: return Q3_K_BYTES;
    case T_Q4_K: return Q4_K_BYTES;
    case T_Q5_K: return Q5_K_BYTES;
    case T_Q6_K: return Q6_K_BYTES;
    case T_IQ4_XS: return IQ4_XS_BYTES;
    }
    return 0;
}

// Element i of a row of `type` (row starts at `row`).
HD float dequant(int type, const uint8_t* row, int i) {
    int b = i / QK, j = i % QK;
    switch (type) {
    case T_Q5_0: {
        const uint8_t* blk = row + b * Q5_0_BYTES;
        uint8_t byte = blk[6 + (j % 16)];
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (q5_high_bit(blk + 2, j) << 4);
        return fmul_rn((float)(q - 16), h2f(ld_u16(blk)));
    }
    case T_Q5_1: {
        const uint8_t* blk = row + b * Q5_1_BYTES;
        uint8_t byte = blk[8 + (j % 16)];
        int q = (j < 16 ? (byte & 15) : (byte >> 4)) | (q5_high_bit(blk + 4, j) << 4);
        return fadd_rn(fmul_rn((float)q, h2f(ld_u16(blk))), h2f(ld_u16(blk + 2)));
    }
    case T_IQ4_NL: {
        const uint8_t* blk = row + b * IQ4_NL_BYTES;
        uint8_t byte = blk[2 + (j % 16)];
        int idx = j < 16 ? (byte & 15) : (byte >> 4);
        return fmul_rn(h2f(ld_u16(blk)), (float)kvalues_iq4nl[idx]);
    }
    case T_Q2_K:
    case T_Q3_K:
    case T_Q4_K:
    case T_Q5_K:
    case T_Q6_K:
    case T_IQ4_XS:
        return dequant_k(type, row + (size_t)(i / QK_K) * k_block_bytes(type), i % QK_K);
    case T_F32: return ((const float*)row)[i];
    case T_F16: return h2f(((const uint16_t*)row)[i]);
    case T_BF16: return int_as_float((int)(((uint32_t)((const uint16_t*)row)[i]) << 16));
    case T_Q4_0: {
        const uint8_t* blk = row + b * 18;
        uint8_t q = blk[2 + (j % 16)];
        int nib = j < 16 ? (q & 15) : (q >> 4);
        return fmul_rn((float)(nib - 8), h2f(ld_u16(blk)));
    }
    case T_Q4_1: {
        const uint8_t* blk = row + b * 20;
        uint8_t q = blk[4 + (j % 16)];
        int nib = j < 16 ? (q & 15) : (q >> 4);
        return fadd_rn(fmul_rn((float)nib, h2f(ld_u16(blk))), h2f(ld_u16(blk + 2)));
    }
    case T_Q8_0: {
        const uint8_t* blk = row + b * 34;
        return fmul_rn((float)(int8_t)blk[2 + j], h2f(ld_u16(blk)));
    }
    case T_Q8_1: {
        const uint8_t* blk = row + b * 36;
        return fmul_rn((float)(int8_t)blk[4 + j], h2f(ld_u16(blk)));
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
//
// One block of 32 values (value `v` of this lane) -> the q8_0 (q8_1 when `with_sum`) block at
// `blk`, as described above; called by all 32 lanes of a warp together.
__device__ __forceinline__ void warp_quantize_q8(float v, uint8_t* blk, int with_sum, int flavour) {
    int lane = threadIdx.x % 32;
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
    int hdr = with_sum ? 4 : 2;
    blk[hdr + lane] = (uint8_t)(int8_t)q;
    int sum = warp_sum_i(q);
    if (lane == 0) {
        *(uint16_t*)blk = f2h(d);
        if (with_sum) *(uint16_t*)(blk + 2) = f2h(__fmul_rn((float)sum, d));
    }
}

// grid: ceil(rows * cols/32 / 8); block: 256.
extern "C" __global__ void quantize_q8(const float* x, uint8_t* out, int rows, int cols,
                                       unsigned long long row_bytes, int with_sum, int flavour) {
    int nb = cols / QK;
    long long job = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (job >= (long long)rows * nb) return;
    int lane = threadIdx.x % 32;
    int r = (int)(job / nb), b = (int)(job % nb);
    float v = x[(size_t)r * cols + (size_t)b * QK + lane];
    int bsz = with_sum ? 36 : 34;
    warp_quantize_q8(v, out + (size_t)r * row_bytes + (size_t)b * bsz, with_sum, flavour);
}

// Rows of f32 -> Q8_K blocks (292 bytes: f32 d, i8 qs[256], i16 bsums[16]), one warp per
// block of 256, exactly as the CPU's quantize_row_q8_K_ref (engine/src/cpu/q8_k.rs): `max` is the
// element of largest magnitude, the FIRST one on ties; iscale = -127/max; q = min(127,
// round-half-even(iscale * x)); d = 1/iscale; an all-zero block is all zeros. Lane l owns
// elements 8l..8l+8, so bsums[k] is the sum of lanes 2k and 2k+1. Output fields are written as
// bytes and 16-bit halves (blocks are only 2-byte aligned in general).
// grid: ceil(rows * cols/256 / 8); block: 256.
extern "C" __global__ void quantize_q8_k(const float* x, uint8_t* out, int rows, int cols,
                                         unsigned long long row_bytes) {
    int nb = cols / QK_K;
    long long job = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (job >= (long long)rows * nb) return;
    int lane = threadIdx.x % 32;
    int r = (int)(job / nb), b = (int)(job % nb);
    const float* xs = x + (size_t)r * cols + (size_t)b * QK_K + 8 * lane;
    float v[8];
    float amax = 0.0f, mx = 0.0f;
    int idx = 0x7fffffff; // no element yet: loses every tie
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xs[i];
        if (fabsf(v[i]) > amax) { // strict: the first of equal magnitudes stays
            amax = fabsf(v[i]);
            mx = v[i];
            idx = 8 * lane + i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        float om = __shfl_xor_sync(0xffffffffu, mx, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (oa > amax || (oa == amax && oi < idx)) {
            amax = oa;
            mx = om;
            idx = oi;
        }
    }
    uint8_t* blk = out + (size_t)r * row_bytes + (size_t)b * Q8_K_BYTES;
    int q[8];
    float d;
    if (amax == 0.0f) {
        d = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
    } else {
        float iscale = __fdiv_rn(-127.0f, mx);
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = min(127, (int)rintf(__fmul_rn(iscale, v[i])));
        d = __fdiv_rn(1.0f, iscale);
    }
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        blk[4 + 8 * lane + i] = (uint8_t)(int8_t)q[i];
        sum += q[i];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1); // lanes 2k, 2k+1: both hold bsums[k]
    if (lane % 2 == 0) *(uint16_t*)(blk + 4 + QK_K + 2 * (lane / 2)) = (uint16_t)(short)sum;
    if (lane == 0) {
        uint32_t db = __float_as_uint(d);
        ((uint16_t*)blk)[0] = (uint16_t)(db & 0xFFFF);
        ((uint16_t*)blk)[1] = (uint16_t)(db >> 16);
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
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
#pragma unroll
        for (int k = 0; k < 4; k++) q[k] = ld_i32_b2(w + 2 + 4 * k);
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int x0 = ld_i32_b2(x + 2 + 4 * k), x1 = ld_i32_b2(x + 2 + 16 + 4 * k);
            sumi = dp4a(q[k] & 0x0F0F0F0F, x0, sumi);
            sumi = dp4a((q[k] >> 4) & 0x0F0F0F0F, x1, sumi);
            sumx = dp4a(0x01010101, x0, sumx);
            sumx = dp4a(0x01010101, x1, sumx);
        }
        return (float)(sumi - 8 * sumx) * (d * h2f(ld_u16(x)));
    }
};

template <> struct BlockDot<T_Q4_1> {
    static constexpr int WB = 20, XB = 36;
    int q[4];
    float d, m;
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
        m = h2f(ld_u16(w + 2));
#pragma unroll
        for (int k = 0; k < 4; k++) q[k] = ld_i32_b2(w + 4 + 4 * k);
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sumi = dp4a(q[k] & 0x0F0F0F0F, ld_i32_b2(x + 4 + 4 * k), sumi);
            sumi = dp4a((q[k] >> 4) & 0x0F0F0F0F, ld_i32_b2(x + 4 + 16 + 4 * k), sumi);
        }
        return (d * h2f(ld_u16(x))) * (float)sumi + m * h2f(ld_u16(x + 2));
    }
};

template <> struct BlockDot<T_Q8_0> {
    static constexpr int WB = 34, XB = 34;
    int q[8];
    float d;
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = ld_i32_b2(w + 2 + 4 * k);
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) sumi = dp4a(q[k], ld_i32_b2(x + 2 + 4 * k), sumi);
        return (float)sumi * (d * h2f(ld_u16(x)));
    }
};

// Four bytes b[0..4] as one dp4a word (byte 0 lowest).
HD int pack4(int b0, int b1, int b2, int b3) {
    return (int)((uint32_t)(b0 & 0xFF) | ((uint32_t)(b1 & 0xFF) << 8) | ((uint32_t)(b2 & 0xFF) << 16) |
                 ((uint32_t)(b3 & 0xFF) << 24));
}

// Q5_0 (22 bytes: f16 d, u32 qh, 16 nibble bytes) against q8_0: (d_w * d_x) * sum((q - 16) * x).
// The 5-bit quants are assembled byte by byte (words lo[k]: elements 4k..4k+4, hi[k]: 16+4k..).
template <> struct BlockDot<T_Q5_0> {
    static constexpr int WB = Q5_0_BYTES, XB = 34;
    int lo[4], hi[4];
    float d;
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
        const uint8_t* qh = w + 2;
        const uint8_t* qs = w + 6;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int l[4], h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int j = 4 * k + i;
                l[i] = (qs[j] & 15) | (q5_high_bit(qh, j) << 4);
                h[i] = (qs[j] >> 4) | (q5_high_bit(qh, j + 16) << 4);
            }
            lo[k] = pack4(l[0], l[1], l[2], l[3]);
            hi[k] = pack4(h[0], h[1], h[2], h[3]);
        }
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int x0 = ld_i32_b2(x + 2 + 4 * k), x1 = ld_i32_b2(x + 2 + 16 + 4 * k);
            sumi = dp4a(lo[k], x0, sumi);
            sumi = dp4a(hi[k], x1, sumi);
            sumx = dp4a(0x01010101, x0, sumx);
            sumx = dp4a(0x01010101, x1, sumx);
        }
        return (float)(sumi - 16 * sumx) * (d * h2f(ld_u16(x)));
    }
};

// Q5_1 (24 bytes: f16 d, f16 m, u32 qh, 16 nibble bytes) against q8_1 (f16 d, f16 s = d * sum(q)):
// (d_w * d_x) * sum(q * x) + m * s.
template <> struct BlockDot<T_Q5_1> {
    static constexpr int WB = Q5_1_BYTES, XB = 36;
    int lo[4], hi[4];
    float d, m;
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
        m = h2f(ld_u16(w + 2));
        const uint8_t* qh = w + 4;
        const uint8_t* qs = w + 8;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int l[4], h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int j = 4 * k + i;
                l[i] = (qs[j] & 15) | (q5_high_bit(qh, j) << 4);
                h[i] = (qs[j] >> 4) | (q5_high_bit(qh, j + 16) << 4);
            }
            lo[k] = pack4(l[0], l[1], l[2], l[3]);
            hi[k] = pack4(h[0], h[1], h[2], h[3]);
        }
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sumi = dp4a(lo[k], ld_i32_b2(x + 4 + 4 * k), sumi);
            sumi = dp4a(hi[k], ld_i32_b2(x + 4 + 16 + 4 * k), sumi);
        }
        return (d * h2f(ld_u16(x))) * (float)sumi + m * h2f(ld_u16(x + 2));
    }
};

// IQ4_NL (18 bytes: f16 d, 16 bytes of table indices) against q8_0: (d_w * d_x) * sum(kv[q] * x).
template <> struct BlockDot<T_IQ4_NL> {
    static constexpr int WB = IQ4_NL_BYTES, XB = 34;
    int lo[4], hi[4];
    float d;
    HD void load(const uint8_t* w) {
        d = h2f(ld_u16(w));
        const uint8_t* qs = w + 2;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint8_t* b = qs + 4 * k;
            lo[k] = pack4(kvalues_iq4nl[b[0] & 15], kvalues_iq4nl[b[1] & 15], kvalues_iq4nl[b[2] & 15],
                          kvalues_iq4nl[b[3] & 15]);
            hi[k] = pack4(kvalues_iq4nl[b[0] >> 4], kvalues_iq4nl[b[1] >> 4], kvalues_iq4nl[b[2] >> 4],
                          kvalues_iq4nl[b[3] >> 4]);
        }
    }
    HD float dot(const uint8_t* x) const {
        int sumi = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sumi = dp4a(lo[k], ld_i32_b2(x + 2 + 4 * k), sumi);
            sumi = dp4a(hi[k], ld_i32_b2(x + 2 + 16 + 4 * k), sumi);
        }
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
MMQ(mmv_q5_0, T_Q5_0, 1)
MMQ(mmv_q5_1, T_Q5_1, 1)
MMQ(mmv_iq4_nl, T_IQ4_NL, 1)
MMQ(mmm_q4_0, T_Q4_0, 8)
MMQ(mmm_q4_1, T_Q4_1, 8)
MMQ(mmm_q8_0, T_Q8_0, 8)
MMQ(mmm_q5_0, T_Q5_0, 8)
MMQ(mmm_q5_1, T_Q5_1, 8)
MMQ(mmm_iq4_nl, T_IQ4_NL, 8)

// ---- k-quant weights x Q8_K activations ----------------------------------------------------------
//
// A super-block of 256 weights is handled as 8 chunks of 32 consecutive weights (chunk c =
// elements 32c..32c+32), the unit of work of one lane. Every k-quant chunk reduces to the same
// form: 32 signed integer quants q (packed 4 per dp4a word), a scale for each half of 16
// (sc0, sc1; equal where the format has one scale per 32) and a min for each half (m0, m1; 0 for
// the symmetric formats), and the super-block's f16 d and dmin. Against the Q8_K activation block
// (f32 d_x, i8 qs[256], i16 bsums[16] with bsums[k] = sum(qs[16k..16k+16])):
//
//   chunk term = (d * d_x) * (sc0 * S0 + sc1 * S1) - (dmin * d_x) * (m0 * bsums[2c] + m1 * bsums[2c+1])
//
// with S0 / S1 the integer dots of the first / second 16 quants with the activations. This is
// the CPU's per-super-block integer sum split by chunk (the float terms are added per chunk
// instead of per super-block: a different rounding order, compared with a tolerance).

struct KChunk {
    int q[8]; // 32 signed 8-bit quants, 4 per word, element order
    int sc0, sc1, m0, m1;
    float d, dmin;
};

// Fills `ch` with chunk c (0..8) of the super-block `blk` of `type`; the element formulas are
// the CPU's (BlockQ*_K::quants in engine/src/cpu/q*_k.rs, and dequant_k above).
template <int WT> HD void load_chunk(const uint8_t* blk, int c, KChunk& ch);

template <> HD void load_chunk<T_Q4_K>(const uint8_t* blk, int c, KChunk& ch) {
    int sc, m;
    scale_min_k4(c, blk + 4, &sc, &m);
    ch.sc0 = ch.sc1 = sc;
    ch.m0 = ch.m1 = m;
    ch.d = h2f(ld_u16(blk));
    ch.dmin = h2f(ld_u16(blk + 2));
    const uint8_t* qs = blk + 16 + 32 * (c / 2);
    int shift = 4 * (c % 2);
#pragma unroll
    for (int k = 0; k < 8; k++)
        ch.q[k] = pack4((qs[4 * k] >> shift) & 15, (qs[4 * k + 1] >> shift) & 15, (qs[4 * k + 2] >> shift) & 15,
                        (qs[4 * k + 3] >> shift) & 15);
}

template <> HD void load_chunk<T_Q5_K>(const uint8_t* blk, int c, KChunk& ch) {
    int sc, m;
    scale_min_k4(c, blk + 4, &sc, &m);
    ch.sc0 = ch.sc1 = sc;
    ch.m0 = ch.m1 = m;
    ch.d = h2f(ld_u16(blk));
    ch.dmin = h2f(ld_u16(blk + 2));
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 48 + 32 * (c / 2);
    int shift = 4 * (c % 2);
    int v[4];
#pragma unroll
    for (int k = 0; k < 8; k++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int l = 4 * k + i;
            v[i] = ((qs[l] >> shift) & 15) | (((qh[l] >> c) & 1) << 4);
        }
        ch.q[k] = pack4(v[0], v[1], v[2], v[3]);
    }
}

template <> HD void load_chunk<T_Q6_K>(const uint8_t* blk, int c, KChunk& ch) {
    int h = c / 4, s = c % 4;
    ch.sc0 = (int8_t)blk[192 + 2 * c];
    ch.sc1 = (int8_t)blk[192 + 2 * c + 1];
    ch.m0 = ch.m1 = 0;
    ch.d = h2f(ld_u16(blk + 208));
    ch.dmin = 0.0f;
    const uint8_t* ql = blk + 64 * h + 32 * (s & 1);
    const uint8_t* qh = blk + 128 + 32 * h;
    int lshift = s >= 2 ? 4 : 0;
    int v[4];
#pragma unroll
    for (int k = 0; k < 8; k++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int l = 4 * k + i;
            v[i] = (((ql[l] >> lshift) & 15) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
        }
        ch.q[k] = pack4(v[0], v[1], v[2], v[3]);
    }
}

template <> HD void load_chunk<T_Q2_K>(const uint8_t* blk, int c, KChunk& ch) {
    int h = c / 4, s = c % 4;
    uint8_t s0 = blk[2 * c], s1 = blk[2 * c + 1];
    ch.sc0 = s0 & 15;
    ch.m0 = s0 >> 4;
    ch.sc1 = s1 & 15;
    ch.m1 = s1 >> 4;
    ch.d = h2f(ld_u16(blk + 80));
    ch.dmin = h2f(ld_u16(blk + 82));
    const uint8_t* qs = blk + 16 + 32 * h;
#pragma unroll
    for (int k = 0; k < 8; k++)
        ch.q[k] = pack4((qs[4 * k] >> (2 * s)) & 3, (qs[4 * k + 1] >> (2 * s)) & 3, (qs[4 * k + 2] >> (2 * s)) & 3,
                        (qs[4 * k + 3] >> (2 * s)) & 3);
}

template <> HD void load_chunk<T_Q3_K>(const uint8_t* blk, int c, KChunk& ch) {
    int h = c / 4, s = c % 4;
    ch.sc0 = q3k_scale(blk + 96, 2 * c);
    ch.sc1 = q3k_scale(blk + 96, 2 * c + 1);
    ch.m0 = ch.m1 = 0;
    ch.d = h2f(ld_u16(blk + 108));
    ch.dmin = 0.0f;
    const uint8_t* hmask = blk;
    const uint8_t* qs = blk + 32 + 32 * h;
    int hbit = 4 * h + s;
    int v[4];
#pragma unroll
    for (int k = 0; k < 8; k++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int l = 4 * k + i;
            v[i] = ((qs[l] >> (2 * s)) & 3) - (((hmask[l] >> hbit) & 1) ? 0 : 4);
        }
        ch.q[k] = pack4(v[0], v[1], v[2], v[3]);
    }
}

template <> HD void load_chunk<T_IQ4_XS>(const uint8_t* blk, int c, KChunk& ch) {
    ch.sc0 = ch.sc1 = iq4xs_scale(blk, c);
    ch.m0 = ch.m1 = 0;
    ch.d = h2f(ld_u16(blk));
    ch.dmin = 0.0f;
    const uint8_t* qs = blk + 8 + 16 * c;
    // Words 0..3: low nibbles of bytes 0..16 (elements 0..16); words 4..7: high nibbles (16..32).
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint8_t* b = qs + 4 * k;
        ch.q[k] = pack4(kvalues_iq4nl[b[0] & 15], kvalues_iq4nl[b[1] & 15], kvalues_iq4nl[b[2] & 15],
                        kvalues_iq4nl[b[3] & 15]);
        ch.q[4 + k] = pack4(kvalues_iq4nl[b[0] >> 4], kvalues_iq4nl[b[1] >> 4], kvalues_iq4nl[b[2] >> 4],
                            kvalues_iq4nl[b[3] >> 4]);
    }
}

// Bytes of one super-block of WT (compile time).
template <int WT> struct KBytes;
template <> struct KBytes<T_Q2_K> { static constexpr int N = Q2_K_BYTES; };
template <> struct KBytes<T_Q3_K> { static constexpr int N = Q3_K_BYTES; };
template <> struct KBytes<T_Q4_K> { static constexpr int N = Q4_K_BYTES; };
template <> struct KBytes<T_Q5_K> { static constexpr int N = Q5_K_BYTES; };
template <> struct KBytes<T_Q6_K> { static constexpr int N = Q6_K_BYTES; };
template <> struct KBytes<T_IQ4_XS> { static constexpr int N = IQ4_XS_BYTES; };

// The chunk term (see above) of chunk c against the Q8_K block `xb` (2-byte aligned: blocks are
// 292 bytes from an even row start, so every 32-bit field is read as two 16-bit halves).
HD float chunk_dot(const KChunk& ch, const uint8_t* xb, int c) {
    float dx = int_as_float(ld_i32_b2(xb));
    const uint8_t* xq = xb + 4 + 32 * c;
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) s0 = dp4a(ch.q[k], ld_i32_b2(xq + 4 * k), s0);
#pragma unroll
    for (int k = 4; k < 8; k++) s1 = dp4a(ch.q[k], ld_i32_b2(xq + 4 * k), s1);
    int isum = ch.sc0 * s0 + ch.sc1 * s1;
    int bs0 = (short)ld_u16(xb + 4 + QK_K + 2 * (2 * c));
    int bs1 = (short)ld_u16(xb + 4 + QK_K + 2 * (2 * c + 1));
    return (ch.d * dx) * (float)isum - (ch.dmin * dx) * (float)(ch.m0 * bs0 + ch.m1 * bs1);
}

// As mul_mat_q, for k-quant weights: one warp per weight row, its lanes stride over the row's
// chunks (n_cols/256 super-blocks x 8 chunks); each chunk is decoded once into registers and
// used for NT tokens. grid: (ceil(n_rows/4), ceil(n_tok/NT)); block: 128.
template <int WT, int NT>
__device__ __forceinline__ void mul_mat_k(const uint8_t* w, const uint8_t* x, float* y, int n_rows, int n_cols,
                                          int n_tok, unsigned long long x_row_bytes) {
    int row = blockIdx.x * 4 + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int t0 = blockIdx.y * NT;
    if (row >= n_rows) return;
    int nb = n_cols / QK_K;
    const uint8_t* wr = w + (size_t)row * nb * KBytes<WT>::N;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int u = lane; u < nb * 8; u += 32) {
        int b = u / 8, c = u % 8;
        KChunk ch;
        load_chunk<WT>(wr + (size_t)b * KBytes<WT>::N, c, ch);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t0 + t < n_tok)
                acc[t] += chunk_dot(ch, x + (size_t)(t0 + t) * x_row_bytes + (size_t)b * Q8_K_BYTES, c);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t0 + t < n_tok) y[(size_t)(t0 + t) * n_rows + row] = s;
    }
}

#define MMK(NAME, WT, NT)                                                                         \
    extern "C" __global__ void NAME(const uint8_t* w, const uint8_t* x, float* y, int n_rows,    \
                                    int n_cols, int n_tok, unsigned long long x_row_bytes) {     \
        mul_mat_k<WT, NT>(w, x, y, n_rows, n_cols, n_tok, x_row_bytes);                           \
    }
MMK(mmv_q2_k, T_Q2_K, 1)
MMK(mmv_q3_k, T_Q3_K, 1)
MMK(mmv_q4_k, T_Q4_K, 1)
MMK(mmv_q5_k, T_Q5_K, 1)
MMK(mmv_q6_k, T_Q6_K, 1)
MMK(mmv_iq4_xs, T_IQ4_XS, 1)
MMK(mmm_q2_k, T_Q2_K, 8)
MMK(mmm_q3_k, T_Q3_K, 8)
MMK(mmm_q4_k, T_Q4_K, 8)
MMK(mmm_q5_k, T_Q5_K, 8)
MMK(mmm_q6_k, T_Q6_K, 8)
MMK(mmm_iq4_xs, T_IQ4_XS, 8)

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

// Rows t of k and v -> q8_0 cache rows pos0 + t of `layer` (cache layout [layer][k|v][ctx][row],
// row = kv_dim/32 blocks of 34 bytes), quantized as the CPU's store_kv does (its quantizer
// `flavour`, see quantize_q8). One warp per block of 32 values.
// grid: ceil(n_tokens * 2 * kv_dim/32 / 8); block: 256.
extern "C" __global__ void store_kv_q8_0(const float* k, const float* v, uint8_t* cache, int layer, int ctx,
                                         int kv_dim, int n_tokens, int flavour, const Params* params) {
    int nb = kv_dim / QK;
    long long job = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (job >= (long long)n_tokens * 2 * nb) return;
    int lane = threadIdx.x % 32;
    int t = (int)(job / (2 * nb)), rem = (int)(job % (2 * nb));
    int is_v = rem / nb, b = rem % nb;
    size_t row_bytes = (size_t)nb * 34;
    size_t pos = (size_t)(params->pos0 + t);
    const float* src = (is_v ? v : k) + (size_t)t * kv_dim + (size_t)b * QK;
    uint8_t* dst = cache + ((size_t)(2 * layer + is_v) * ctx + pos) * row_bytes + (size_t)b * 34;
    warp_quantize_q8(src[lane], dst, 0, flavour);
}

#define ATT_MAX_PER_LANE 8 // head_dim <= 256

// Flash attention, first pass: one warp per (token, head, split). Row t attends to positions
// 0..pos0+t (causal); split s takes the s-th of n_split equal chunks of them (chunks are computed
// from the run-time position, so a captured decode graph stays valid as the context grows). The
// warp walks its chunk 32 positions at a time: each lane scores one position, then the tile's
// probabilities are broadcast and every lane accumulates its head_dim/32 output dims of V
// (coalesced), with an online softmax (running max, sum, rescaled accumulator). Writes
// (max, sum, acc[head_dim]) per (row, head, split) to `partial`.
//
// Q8 = false: f16 cache (rows of kv_dim f16), score K . q with q rounded to f16 as the CPU does.
// Q8 = true: q8_0 cache (rows of kv_dim/32 blocks of 34 bytes): the query head is quantized to
// q8_0 (the CPU's `flavour`) and scored with integer block dots, V dequantized as d * q: the
// CPU's attention over a q8_0 cache (attention_online in engine/src/exec/mod.rs).
// grid: (n_tokens * n_head, n_split); block: 32.
template <bool Q8>
__device__ __forceinline__ void attn_partial_t(const float* q, const void* cache, float* partial, int n_head,
                                               int n_head_kv, int head_dim, int ctx, int kv_dim, int layer,
                                               float scale, int n_split, int flavour, const Params* params) {
    __shared__ float qs[ATT_MAX_PER_LANE * 32];                 // f16 cache: the rounded query
    __shared__ __align__(4) uint8_t q8[ATT_MAX_PER_LANE * 34]; // q8_0 cache: its q8_0 blocks
    int th = blockIdx.x, split = blockIdx.y, lane = threadIdx.x;
    int t = th / n_head, h = th % n_head;
    int kvh = h / (n_head / n_head_kv);
    int n_pos = params->pos0 + t + 1;
    int chunk = (n_pos + n_split - 1) / n_split;
    int start = split * chunk, end = min(n_pos, start + chunk);
    const float* qr = q + (size_t)t * n_head * head_dim + (size_t)h * head_dim;
    int per_lane = head_dim / 32;
    // Row strides (bytes) and this head's offset in a row.
    size_t row_bytes = Q8 ? (size_t)(kv_dim / QK) * 34 : (size_t)kv_dim * 2;
    size_t head_off = Q8 ? (size_t)kvh * per_lane * 34 : (size_t)kvh * head_dim * 2;
    const uint8_t* kbase = (const uint8_t*)cache + (size_t)(2 * layer) * ctx * row_bytes + head_off;
    const uint8_t* vbase = (const uint8_t*)cache + (size_t)(2 * layer + 1) * ctx * row_bytes + head_off;
    if (Q8) {
        for (int b = 0; b < per_lane; b++) warp_quantize_q8(qr[32 * b + lane], q8 + 34 * b, 0, flavour);
    } else {
        for (int d = lane; d < head_dim; d += 32) qs[d] = __half2float(__float2half_rn(qr[d]));
    }
    __syncwarp();
    float m = -INFINITY, l = 0.0f, acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < ATT_MAX_PER_LANE; k++) acc[k] = 0.0f;
    for (int p0 = start; p0 < end; p0 += 32) {
        int p = p0 + lane;
        float s = -INFINITY;
        if (p < end) {
            const uint8_t* krow = kbase + (size_t)p * row_bytes;
            float dot = 0.0f;
            if (Q8) {
                for (int b = 0; b < per_lane; b++) {
                    const uint8_t* kb = krow + 34 * b;
                    const uint8_t* qb = q8 + 34 * b;
                    int sumi = 0;
#pragma unroll
                    for (int w = 0; w < 8; w++) sumi = dp4a(ld_i32_b2(kb + 2 + 4 * w), ld_i32_b2(qb + 2 + 4 * w), sumi);
                    dot += (float)sumi * (h2f(ld_u16(kb)) * h2f(ld_u16(qb)));
                }
            } else {
                const __half2* kr = (const __half2*)krow;
                for (int d = 0; d < head_dim / 2; d++) {
                    float2 kf = __half22float2(kr[d]);
                    dot = fmaf(kf.x, qs[2 * d], dot);
                    dot = fmaf(kf.y, qs[2 * d + 1], dot);
                }
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
            const uint8_t* vr = vbase + (size_t)(p0 + j) * row_bytes;
#pragma unroll
            for (int k = 0; k < ATT_MAX_PER_LANE; k++) {
                if (k < per_lane) {
                    // Dim lane + 32k: element `lane` of block k (q8_0), or f16 number lane + 32k.
                    float val = Q8 ? __fmul_rn((float)(int8_t)vr[34 * k + 2 + lane], h2f(ld_u16(vr + 34 * k)))
                                   : h2f(((const uint16_t*)vr)[lane + 32 * k]);
                    acc[k] = fmaf(pj, val, acc[k]);
                }
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

// The two caches' kernels take the same arguments (`flavour` is unused with f16).
extern "C" __global__ void attn_partial(const float* q, const uint16_t* cache, float* partial, int n_head,
                                        int n_head_kv, int head_dim, int ctx, int kv_dim, int layer,
                                        float scale, int n_split, int flavour, const Params* params) {
    attn_partial_t<false>(q, cache, partial, n_head, n_head_kv, head_dim, ctx, kv_dim, layer, scale, n_split,
                          flavour, params);
}

extern "C" __global__ void attn_partial_q8(const float* q, const uint8_t* cache, float* partial, int n_head,
                                           int n_head_kv, int head_dim, int ctx, int kv_dim, int layer,
                                           float scale, int n_split, int flavour, const Params* params) {
    attn_partial_t<true>(q, cache, partial, n_head, n_head_kv, head_dim, ctx, kv_dim, layer, scale, n_split,
                         flavour, params);
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

// out[i] = x[i] where bit i of `allowed` is set (bit i % 32 of word i / 32, llguidance's mask
// layout), -inf elsewhere and past the `n_words` words: a constrained step's masked logits,
// built from an uploaded mask instead of copying the logits to the host.
// grid: ceil(n / 256); block: 256.
extern "C" __global__ void mask_logits_f32(const float* x, int n, const unsigned* allowed, int n_words,
                                           float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int w = i >> 5;
    bool ok = w < n_words && ((allowed[w] >> (i & 31)) & 1u);
    out[i] = ok ? x[i] : -INFINITY;
}

// ---- sampling ---------------------------------------------------------------------------------------

#define SAMPLE_MAX_K 1024 // mirrors cuda::SAMPLE_MAX_TOP_K

// The CPU sampler's sanitize (engine/src/sampling.rs): NaN -> -inf, +inf -> FLT_MAX.
HD float sample_sanitize(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return 3.40282346638528859812e+38f;
    return x;
}
// An int whose signed order is f32::total_cmp's order of x (Rust's own construction).
HD int total_order_key(float x) {
#ifdef __CUDA_ARCH__
    int b = __float_as_int(x);
#else
    int b;
    memcpy(&b, &x, 4);
#endif
    return b ^ (int)(((unsigned)(b >> 31)) >> 1);
}
// f32 exp as close to correctly rounded as a double exp makes it (the CPU uses libm's expf,
// itself within 0.502 ulp): the two differ, if ever, by one ulp, which can change a draw only
// when it falls within that rounding of a cumulative-probability boundary.
HD float exp_f32(float x) { return (float)exp((double)x); }

// The CPU sampler's Sampler::truncate (after top-k) and Sampler::draw, step for step, on the
// top-k candidates sorted by (logit descending, id ascending): -inf cut, top-p (f32
// probabilities, f64 sums), min-p (logit >= max + ln_min_p), softmax at `temp`, the draw
// r = uniform * sum. Writes the token to *token and returns 1 if the draw was used, 0 if every
// candidate was -inf (token 0, as the CPU, which then draws nothing). HD: host_check.cu runs it
// against the CPU sampler.
HD int sample_sorted(const float* cand_logit, const int* cand_id, int n_cand, float temp, int use_top_p, float top_p,
                     int use_min_p, float ln_min_p, double uniform, int* token) {
    *token = 0;
    // -inf candidates can never be drawn.
    int kept = n_cand;
    for (int i = 0; i < n_cand; i++) {
        if (cand_logit[i] == -INFINITY) {
            kept = i;
            break;
        }
    }
    if (kept == 0) return 0;
    float mx = cand_logit[0];
    if (use_top_p) {
        double sum = 0.0;
        for (int i = 0; i < kept; i++) sum = dadd_rn(sum, (double)exp_f32(fsub_rn(cand_logit[i], mx)));
        double cum = 0.0;
        for (int i = 0; i < kept; i++) {
            cum = dadd_rn(cum, ddiv_rn((double)exp_f32(fsub_rn(cand_logit[i], mx)), sum));
            if (cum >= (double)top_p) {
                kept = i + 1;
                break;
            }
        }
    }
    if (use_min_p) {
        float min_logit = fadd_rn(mx, ln_min_p);
        int pos = kept;
        for (int i = 0; i < kept; i++) {
            if (cand_logit[i] < min_logit) {
                pos = i;
                break;
            }
        }
        kept = pos > 1 ? pos : 1;
    }
    double sum = 0.0;
    for (int i = 0; i < kept; i++) sum = dadd_rn(sum, (double)exp_f32(fdiv_rn(fsub_rn(cand_logit[i], mx), temp)));
    double r = dmul_rn(uniform, sum);
    double cum = 0.0;
    int last_nonzero = 0;
    for (int i = 0; i < kept; i++) {
        float p = exp_f32(fdiv_rn(fsub_rn(cand_logit[i], mx), temp));
        cum = dadd_rn(cum, (double)p);
        if (r < cum) {
            *token = cand_id[i];
            return 1;
        }
        if (p > 0.0f) last_nonzero = i;
    }
    // Rounding: the last candidate with non-zero weight, as the CPU.
    *token = cand_id[last_nonzero];
    return 1;
}

// The CPU sampler's temperature path (Sampler::truncate then Sampler::draw, same arithmetic
// and order) on device logits, for one sequence: top-k by (logit descending, id ascending,
// f32::total_cmp) as k rounds of a block-wide maximum over the candidates after the previous
// winner in that order (so no marking, and the k candidates come out sorted); then one thread
// does the rest exactly as the CPU: -inf cut, top-p (f32 probabilities, f64 sums), min-p
// (logit >= max + ln_min_p), the softmax at `temp` and the draw r = uniform * sum.
// out[0] = token, out[1] = 1 if the draw was used (0: every candidate was -inf, token 0).
// k: 1..=min(n, SAMPLE_MAX_K) (the host checks). grid: 1; block: 1024 (a power of two).
extern "C" __global__ void sample_top_k(const float* logits, int n, int k, float temp, int use_top_p, float top_p,
                                        int use_min_p, float ln_min_p, double uniform, int* out) {
    __shared__ float cand_logit[SAMPLE_MAX_K];
    __shared__ int cand_id[SAMPLE_MAX_K];
    __shared__ int red_key[1024];
    __shared__ int red_id[1024];
    int tid = threadIdx.x;
    int prev_key = 0, prev_id = -1;
    int n_cand = 0;
    for (int j = 0; j < k; j++) {
        int best_key = 0, best_id = -1; // -1: none yet
        for (int i = tid; i < n; i += blockDim.x) {
            int key = total_order_key(sample_sanitize(logits[i]));
            bool after_prev = j == 0 || key < prev_key || (key == prev_key && i > prev_id);
            // i ascends within a thread: strict > keeps the lowest id of equal keys.
            if (after_prev && (best_id < 0 || key > best_key)) {
                best_key = key;
                best_id = i;
            }
        }
        red_key[tid] = best_key;
        red_id[tid] = best_id;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                int ok = red_key[tid + s], oi = red_id[tid + s];
                if (oi >= 0 && (red_id[tid] < 0 || ok > red_key[tid] || (ok == red_key[tid] && oi < red_id[tid]))) {
                    red_key[tid] = ok;
                    red_id[tid] = oi;
                }
            }
            __syncthreads();
        }
        prev_key = red_key[0];
        prev_id = red_id[0];
        __syncthreads(); // every thread has read the winner before round j+1 overwrites red_*
        if (prev_id < 0) break; // fewer than k logits (the host never asks for that)
        if (tid == 0) {
            cand_id[j] = prev_id;
            cand_logit[j] = sample_sanitize(logits[prev_id]);
        }
        n_cand = j + 1;
    }
    __syncthreads(); // cand_* complete for thread 0
    if (tid != 0) return;
    out[1] = sample_sorted(cand_logit, cand_id, n_cand, temp, use_top_p, top_p, use_min_p, ln_min_p, uniform,
                           &out[0]);
}
