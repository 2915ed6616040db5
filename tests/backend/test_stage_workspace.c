/* test_stage_workspace.c — a device stage allocates its activation workspace
 * at load (engine/stage.h max_batch_tokens), so no forward allocates: run on
 * the CPU through the "cuda" module that computes on the CPU
 * (fake_gpu_module.c, STRATA_BACKEND_PATH). stories260K, every layer, TP 1:
 *  - after stage_open, buf_bytes = the KV cache + the workspace for
 *    max_batch_tokens = 32 tokens and 32 sampled rows, to the byte (the CPU
 *    backend's stage, which allocates lazily, holds only the KV cache);
 *  - forwards of 32 tokens and of 1 token, greedy, and a seeded sampled one
 *    without top_k (the most candidates per rank) change nothing, and their
 *    tokens are the CPU stage's;
 *  - a batch of 33 tokens grows the workspace (an allocation inside a
 *    forward, logged once) and still gives the CPU stage's tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/stage.h"
#include "model/sampler.h"
#include "tests/testutil.h"

#define KV_BLOCKS 8
#define BLOCK 16
#define MAXT 32

static stage *open_stage(const char *backend, st_err *err) {
    stage_params p = {.model_path = test_shared_path("models/stories260K.gguf"), .first_layer = 0,
                      .last_layer = -1, .tp = 1, .n_threads = 1, .kv_blocks = KV_BLOCKS, .block_size = BLOCK,
                      .backend = backend, .max_batch_tokens = MAXT};
    return stage_open(&p, err);
}

static size_t buf_bytes(const stage *s) {
    stage_rank_stats st;
    REQUIRE(stage_rank_stats_get(s, 0, &st) == 0);
    return st.buf_bytes;
}

/* One sequence of n tokens from position 0 (a fresh prefill): its sampled id
 * (greedy, or seeded sampling with temperature when sample). */
static int32_t forward_with(stage *s, int n, bool sample, st_err *err) {
    static const int32_t blocks[KV_BLOCKS] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t toks[64];
    for (int i = 0; i < n; i++) toks[i] = 1 + (i * 37) % 500;
    stage_seq sq = {.seq_id = 1, .pos = 0, .n_tokens = n, .block_table = blocks, .n_blocks = KV_BLOCKS,
                    .want_logits = true, .sampling = sample ? sampler_default_params() : sampler_greedy_params()};
    if (sample) {
        sq.sampling.temperature = 0.8f;
        sq.sampling.top_k = 0; /* the most candidates a rank sends without top_k */
        sq.sampling.seed = 42;
    }
    stage_batch b = {.n_seqs = 1, .seqs = &sq, .n_tokens = n, .tokens = toks};
    stage_sample_out out;
    if (stage_forward(s, &b, NULL, NULL, &out, err)) return -1;
    return out.id;
}

static int32_t forward(stage *s, int n, st_err *err) { return forward_with(s, n, false, err); }

int main(void) {
    st_err err;
    if (!getenv("STRATA_BACKEND_PATH")) {
        printf("SKIP: STRATA_BACKEND_PATH (the fake GPU module) is not set\n");
        return 77;
    }
    stage *cpu = open_stage("cpu", &err);
    REQUIRE_MSG(cpu, "%s", err.msg);
    stage *dev = open_stage("cuda", &err);
    REQUIRE_MSG(dev, "%s", err.msg);

    const llama_config *c = stage_config(dev);
    const size_t E = (size_t)c->n_embd, Q = (size_t)c->n_head * (size_t)c->head_dim,
                 KV = (size_t)c->n_head_kv * (size_t)c->head_dim, F = (size_t)c->n_ff, V = (size_t)c->n_vocab;
    const size_t kv_cache = (size_t)c->n_layer * 2 * (size_t)KV_BLOCKS * BLOCK * KV * sizeof(float);
    /* rank_prepare: x, xn, o [T, E]; q, att [T, Q]; k, v [T, KV]; g, u [T, F];
     * xs [S, E] and logits [S, V]; the sampling blobs' device copy (send + recv,
     * TP 1), with room for SAMPLER_TP_CANDS candidates. */
    const size_t acts = (size_t)MAXT * (3 * E + 2 * Q + 2 * KV + 2 * F) * sizeof(float);
    const size_t logits = (size_t)MAXT * (E + V) * sizeof(float);
    const size_t blobs = 2 * sampler_tp_blob_bytes(SAMPLER_TP_CANDS) * MAXT;
    CHECK_EQ_INT(buf_bytes(cpu), kv_cache);
    CHECK_MSG(buf_bytes(dev) == kv_cache + acts + logits + blobs,
              "device stage after open holds %zu bytes, want %zu (KV) + %zu + %zu + %zu", buf_bytes(dev), kv_cache,
              acts, logits, blobs);
    const size_t at_open = buf_bytes(dev);

    /* Forwards within the workspace allocate nothing; same tokens as the CPU. */
    int32_t a = forward(dev, MAXT, &err);
    REQUIRE_MSG(a >= 0, "%s", err.msg);
    CHECK_EQ_INT(a, forward(cpu, MAXT, &err));
    CHECK_EQ_INT(forward(dev, 1, &err), forward(cpu, 1, &err));
    int32_t sd = forward_with(dev, 4, true, &err);
    REQUIRE_MSG(sd >= 0, "%s", err.msg);
    CHECK_EQ_INT(sd, forward_with(cpu, 4, true, &err)); /* seeded: the same draw */
    CHECK_EQ_INT(buf_bytes(dev), at_open);

    /* One token more: the workspace grows (logged), the result is still right. */
    int32_t big = forward(dev, MAXT + 1, &err);
    REQUIRE_MSG(big >= 0, "%s", err.msg);
    CHECK_EQ_INT(big, forward(cpu, MAXT + 1, &err));
    CHECK_MSG(buf_bytes(dev) > at_open, "a %d-token batch did not grow the workspace", MAXT + 1);

    stage_close(dev);
    stage_close(cpu);
    return test_summary();
}
