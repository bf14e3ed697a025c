/*
 * generate.c: edge-run's C API end to end. Loads a GGUF model, tokenizes a prompt, generates
 * greedily (the text streams to stdout), and frees everything.
 *
 *   generate MODEL.gguf "PROMPT" [N_TOKENS [THREADS]]
 *
 * Build (from the repository root, after `cargo build --release -p edge-run-capi`):
 *   cc -Iengine/capi/include engine/capi/examples/generate.c target/release/libedgerun.a \
 *      -lpthread -ldl -lm -lrt -o generate
 * or against the shared library:
 *   cc -Iengine/capi/include engine/capi/examples/generate.c -Ltarget/release -ledgerun \
 *      -Wl,-rpath,$PWD/target/release -o generate
 */
#include <stdio.h>
#include <stdlib.h>

#include "edgerun.h"

/* Prints what failed and why (the message of the last failure on this thread). */
static int fail(const char *what, edgerun_status status) {
    fprintf(stderr, "generate: %s failed (status %d): %s\n", what, (int)status,
            edgerun_last_error_message());
    return 1;
}

/* Streams each token's text to stdout; returning true lets generation go on. */
static bool on_token(void *user_data, uint32_t token, const char *text, size_t len) {
    (void)token;
    size_t *n_bytes = user_data;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    *n_bytes += len;
    return true;
}

static const char *stop_reason_name(edgerun_stop_reason reason) {
    switch (reason) {
    case EDGERUN_STOP_MAX_TOKENS: return "max tokens";
    case EDGERUN_STOP_END_OF_GENERATION: return "end of generation";
    case EDGERUN_STOP_STOPPED: return "stopped by the callback";
    case EDGERUN_STOP_CONTEXT_FULL: return "context full";
    }
    return "?";
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS [THREADS]]\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1];
    const char *prompt = argv[2];
    uint32_t n_tokens = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 32;
    uint32_t n_threads = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 0;

    edgerun_model *model = NULL;
    edgerun_status st = edgerun_model_load(model_path, &model);
    if (st != EDGERUN_OK) return fail("loading the model", st);

    /* Ask for the number of tokens first (capacity 0), then tokenize into a buffer of that
     * size. add_special: BOS as the model wants; parse_special: "<|im_start|>" is a token. */
    size_t n_prompt = 0;
    st = edgerun_tokenize(model, prompt, true, true, NULL, 0, &n_prompt);
    if (st != EDGERUN_OK && st != EDGERUN_ERR_BUFFER_TOO_SMALL) {
        edgerun_model_free(model);
        return fail("tokenizing the prompt", st);
    }
    uint32_t *tokens = malloc((n_prompt ? n_prompt : 1) * sizeof *tokens);
    if (!tokens) {
        edgerun_model_free(model);
        fprintf(stderr, "generate: out of memory\n");
        return 1;
    }
    st = edgerun_tokenize(model, prompt, true, true, tokens, n_prompt, &n_prompt);
    if (st != EDGERUN_OK) {
        free(tokens);
        edgerun_model_free(model);
        return fail("tokenizing the prompt", st);
    }

    edgerun_session_params sp = edgerun_session_params_default();
    sp.n_ctx = (uint32_t)n_prompt + n_tokens + 1;
    sp.n_threads = n_threads;
    edgerun_session *session = NULL;
    st = edgerun_session_new(model, &sp, &session);
    /* The session holds its own reference to the model: the handle can go now. */
    edgerun_model_free(model);
    if (st != EDGERUN_OK) {
        free(tokens);
        return fail("opening a session", st);
    }

    edgerun_generate_params gp = edgerun_generate_params_default();
    gp.max_tokens = n_tokens;
    gp.sampling.temperature = 0.0f; /* greedy */
    size_t n_bytes = 0;
    edgerun_generate_result result;
    st = edgerun_generate(session, tokens, n_prompt, &gp, on_token, &n_bytes, &result);
    free(tokens);
    edgerun_session_free(session);
    if (st != EDGERUN_OK) return fail("generating", st);
    fprintf(stderr, "\n[generate] %zu prompt tokens, %u generated (%zu bytes); stopped: %s\n",
            n_prompt, result.n_tokens, n_bytes, stop_reason_name(result.stop_reason));
    return 0;
}
