// Runs kernels.cu's block decoders and block dot products on the CPU, for
// `cuda::tests::block_math_matches_cpu_on_the_host` (engine/src/cuda/tests.rs): the block layouts
// of every weight type are checked against the Rust CPU kernels on any machine with nvcc, GPU or
// not. Built by build.rs (best effort; the test skips when it is missing). What it cannot check:
// the warp-level parts of the kernels (lane striding, shuffles, launch dimensions).
//
//   host_check dequant TYPE N_ROWS N_COLS ROW_BYTES W_FILE OUT_FILE
//       OUT = f32 [N_ROWS][N_COLS]: dequant(TYPE, row r, i)
//   host_check dot TYPE N_ROWS N_COLS N_TOK W_ROW_BYTES X_ROW_BYTES W_FILE X_FILE OUT_FILE
//       OUT = f32 [N_TOK][N_ROWS]: the sum of the block (or chunk) terms of row r with token t,
//       added in block order (the kernels add them in lane order, then across lanes)
//   host_check sample N K TEMP USE_TOP_P TOP_P USE_MIN_P LN_MIN_P UNIFORM LOGITS_FILE OUT_FILE
//       OUT = f32 [token, drew]: sample_top_k's result, its top-k done here by a sort in the
//       same order (the kernel's block-wide rounds cannot run on the host)
#include "kernels.cu"

#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

static std::vector<uint8_t> read_file(const char* path) {
    std::vector<uint8_t> v;
    FILE* f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "host_check: cannot open %s\n", path);
        exit(2);
    }
    uint8_t buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    fclose(f);
    // Slack so that 2-byte reads at the end of the last block stay inside the buffer.
    v.resize(v.size() + 8, 0);
    return v;
}

static void write_file(const char* path, const std::vector<float>& v) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(v.data(), 4, v.size(), f) != v.size()) {
        fprintf(stderr, "host_check: cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

template <int WT> static float row_dot_32(const uint8_t* w, const uint8_t* x, int n_cols) {
    typedef BlockDot<WT> B;
    float acc = 0.0f;
    for (int b = 0; b < n_cols / QK; b++) {
        B blk;
        blk.load(w + (size_t)b * B::WB);
        acc += blk.dot(x + (size_t)b * B::XB);
    }
    return acc;
}

template <int WT> static float row_dot_k(const uint8_t* w, const uint8_t* x, int n_cols) {
    float acc = 0.0f;
    for (int u = 0; u < n_cols / QK_K * 8; u++) {
        int b = u / 8, c = u % 8;
        KChunk ch;
        load_chunk<WT>(w + (size_t)b * KBytes<WT>::N, c, ch);
        acc += chunk_dot(ch, x + (size_t)b * Q8_K_BYTES, c);
    }
    return acc;
}

static float row_dot(int type, const uint8_t* w, const uint8_t* x, int n_cols) {
    switch (type) {
    case T_Q4_0: return row_dot_32<T_Q4_0>(w, x, n_cols);
    case T_Q4_1: return row_dot_32<T_Q4_1>(w, x, n_cols);
    case T_Q8_0: return row_dot_32<T_Q8_0>(w, x, n_cols);
    case T_Q5_0: return row_dot_32<T_Q5_0>(w, x, n_cols);
    case T_Q5_1: return row_dot_32<T_Q5_1>(w, x, n_cols);
    case T_IQ4_NL: return row_dot_32<T_IQ4_NL>(w, x, n_cols);
    case T_Q2_K: return row_dot_k<T_Q2_K>(w, x, n_cols);
    case T_Q3_K: return row_dot_k<T_Q3_K>(w, x, n_cols);
    case T_Q4_K: return row_dot_k<T_Q4_K>(w, x, n_cols);
    case T_Q5_K: return row_dot_k<T_Q5_K>(w, x, n_cols);
    case T_Q6_K: return row_dot_k<T_Q6_K>(w, x, n_cols);
    case T_IQ4_XS: return row_dot_k<T_IQ4_XS>(w, x, n_cols);
    }
    fprintf(stderr, "host_check: no dot product for type %d\n", type);
    exit(2);
}

int main(int argc, char** argv) {
    if (argc == 8 && !strcmp(argv[1], "dequant")) {
        int type = atoi(argv[2]), n_rows = atoi(argv[3]), n_cols = atoi(argv[4]);
        size_t rb = strtoull(argv[5], 0, 10);
        std::vector<uint8_t> w = read_file(argv[6]);
        std::vector<float> out((size_t)n_rows * n_cols);
        for (int r = 0; r < n_rows; r++)
            for (int i = 0; i < n_cols; i++) out[(size_t)r * n_cols + i] = dequant(type, w.data() + r * rb, i);
        write_file(argv[7], out);
        return 0;
    }
    if (argc == 11 && !strcmp(argv[1], "dot")) {
        int type = atoi(argv[2]), n_rows = atoi(argv[3]), n_cols = atoi(argv[4]), n_tok = atoi(argv[5]);
        size_t wrb = strtoull(argv[6], 0, 10), xrb = strtoull(argv[7], 0, 10);
        std::vector<uint8_t> w = read_file(argv[8]), x = read_file(argv[9]);
        std::vector<float> out((size_t)n_tok * n_rows);
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < n_rows; r++)
                out[(size_t)t * n_rows + r] = row_dot(type, w.data() + r * wrb, x.data() + t * xrb, n_cols);
        write_file(argv[10], out);
        return 0;
    }
    if (argc == 12 && !strcmp(argv[1], "sample")) {
        int n = atoi(argv[2]), k = atoi(argv[3]);
        float temp = strtof(argv[4], 0), top_p = strtof(argv[6], 0), ln_min_p = strtof(argv[8], 0);
        int use_top_p = atoi(argv[5]), use_min_p = atoi(argv[7]);
        double uniform = strtod(argv[9], 0);
        std::vector<uint8_t> raw = read_file(argv[10]);
        std::vector<std::pair<int, int>> order; // (key, id)
        for (int i = 0; i < n; i++) {
            float l;
            memcpy(&l, raw.data() + 4 * (size_t)i, 4);
            order.push_back(std::make_pair(total_order_key(sample_sanitize(l)), i));
        }
        std::sort(order.begin(), order.end(), [](const std::pair<int, int>& a, const std::pair<int, int>& b) {
            return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        std::vector<float> cl(k);
        std::vector<int> cid(k);
        for (int j = 0; j < k; j++) {
            cid[j] = order[j].second;
            float l;
            memcpy(&l, raw.data() + 4 * (size_t)cid[j], 4);
            cl[j] = sample_sanitize(l);
        }
        int token = 0;
        int drew = sample_sorted(cl.data(), cid.data(), k, temp, use_top_p, top_p, use_min_p, ln_min_p, uniform, &token);
        write_file(argv[11], std::vector<float>{(float)token, (float)drew});
        return 0;
    }
    fprintf(stderr, "usage: host_check dequant TYPE N_ROWS N_COLS ROW_BYTES W OUT | dot TYPE N_ROWS N_COLS N_TOK "
                    "W_ROW_BYTES X_ROW_BYTES W X OUT\n");
    return 2;
}
