// Reads cases.bin (see make-cases.py) on stdin and writes, per case, the f32 result of ggml-cpu's
// ARM NEON vec_dot for that weight type (little-endian f32s, in case order) on stdout.
// Built and run by make-ggml-arm-dots.sh against llama.cpp's ggml sources for aarch64.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "quants.h"

typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

static dot_fn dot_for(uint32_t id) {
    switch (id) {
    case 2: return ggml_vec_dot_q4_0_q8_0;
    case 3: return ggml_vec_dot_q4_1_q8_1;
    case 6: return ggml_vec_dot_q5_0_q8_0;
    case 7: return ggml_vec_dot_q5_1_q8_1;
    case 8: return ggml_vec_dot_q8_0_q8_0;
    case 10: return ggml_vec_dot_q2_K_q8_K;
    case 11: return ggml_vec_dot_q3_K_q8_K;
    case 12: return ggml_vec_dot_q4_K_q8_K;
    case 13: return ggml_vec_dot_q5_K_q8_K;
    case 14: return ggml_vec_dot_q6_K_q8_K;
    case 20: return ggml_vec_dot_iq4_nl_q8_0;
    case 23: return ggml_vec_dot_iq4_xs_q8_K;
    default: fprintf(stderr, "unknown type %u\n", id); exit(1);
    }
}

static uint32_t u32(void) {
    uint32_t v;
    if (fread(&v, 4, 1, stdin) != 1) { fprintf(stderr, "short input\n"); exit(1); }
    return v;
}

static void *bytes(uint32_t n) {
    void *p = malloc(n);
    if (!p || fread(p, 1, n, stdin) != n) { fprintf(stderr, "short input\n"); exit(1); }
    return p;
}

int main(void) {
    uint32_t count = u32();
    for (uint32_t c = 0; c < count; c++) {
        uint32_t id = u32(), n = u32();
        void *w = bytes(u32());
        void *x = bytes(u32());
        float s = 0.0f;
        dot_for(id)((int)n, &s, 0, w, 0, x, 0, 1);
        fwrite(&s, 4, 1, stdout);
        free(w);
        free(x);
    }
    return 0;
}
