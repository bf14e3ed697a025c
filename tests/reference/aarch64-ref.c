/*
 * aarch64-ref: llama.cpp's own outputs on an ARM CPU, for tests/tests/neon_reference.rs.
 *
 * Built by tests/reference/make-aarch64-refs.sh against llama.cpp (the peer's source, compiled
 * for aarch64 with GCC 12, armv8.2-a+dotprod: Jetson Orin's CPU) and run under qemu-aarch64.
 * Reads one prompt a line from stdin (space-separated token ids) and writes one JSON object a
 * line to stdout:
 *
 *   aarch64-ref MODEL logits      {"prompt_ids": [...], "top": [[[id, logit], ... 10], ...]}
 *                                 teacher-forced, ONE TOKEN PER EVAL (the single-token path),
 *                                 the 10 highest logits at every position
 *   aarch64-ref MODEL greedy N    {"prompt_ids": [...], "ids": [...]}
 *                                 the prompt as one batch, then N tokens of argmax, one per eval,
 *                                 stopping after an end-of-generation token
 *
 * One thread, a 2048-token context, logits as llama.cpp returns them (4 decimals).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_IDS 4096

static int read_ids(llama_token *ids) {
    char line[65536];
    if (!fgets(line, sizeof line, stdin)) return -1;
    int n = 0;
    for (char *p = strtok(line, " \n"); p && n < MAX_IDS; p = strtok(NULL, " \n")) ids[n++] = atoi(p);
    return n;
}

static void print_ids(const llama_token *ids, int n) {
    printf("[");
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]");
}

static int argmax(const float *logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int eval(struct llama_context *ctx, llama_token *toks, int n) {
    if (llama_decode(ctx, llama_batch_get_one(toks, n)) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        exit(1);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL logits|greedy [N] < ids\n", argv[0]);
        return 2;
    }
    int greedy = strcmp(argv[2], "greedy") == 0;
    int n_gen = argc > 3 ? atoi(argv[3]) : 32;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token ids[MAX_IDS];
    int n;
    while ((n = read_ids(ids)) > 0) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 2048;
        cp.n_batch = 512;
        cp.n_threads = 1;
        cp.n_threads_batch = 1;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        printf("{\"prompt_ids\": ");
        print_ids(ids, n);
        if (greedy) {
            llama_token out[MAX_IDS];
            int n_out = 0;
            eval(ctx, ids, n);
            llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            while (n_out < n_gen) {
                out[n_out++] = next;
                if (llama_vocab_is_eog(vocab, next) || n_out == n_gen) break;
                eval(ctx, &next, 1);
                next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            }
            printf(", \"ids\": ");
            print_ids(out, n_out);
        } else {
            printf(", \"top\": [");
            for (int pos = 0; pos < n; pos++) {
                eval(ctx, &ids[pos], 1);
                const float *logits = llama_get_logits_ith(ctx, -1);
                /* the 10 highest, highest first (ties: lower id first), in one pass */
                int top[10], k_n = 0;
                for (int i = 0; i < n_vocab; i++) {
                    int at = k_n;
                    while (at > 0 && logits[i] > logits[top[at - 1]]) at--;
                    if (at >= 10) continue;
                    if (k_n < 10) k_n++;
                    memmove(&top[at + 1], &top[at], (size_t)(k_n - 1 - at) * sizeof top[0]);
                    top[at] = i;
                }
                printf(pos ? ", [" : "[");
                for (int k = 0; k < 10; k++) printf(k ? ", [%d, %.4f]" : "[%d, %.4f]", top[k], logits[top[k]]);
                printf("]");
            }
            printf("]");
        }
        printf("}\n");
        fflush(stdout);
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
