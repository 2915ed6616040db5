/* test_backend_engine.c — the engine (engine/stage.c) on a backend chosen by
 * name.
 *
 * Always: backend "cpu" by name gives stories260K's golden greedy tokens
 * (../shared/reference/stories260K-greedy.json) for 2 prompts; an unknown
 * name is refused; "cuda" without a device (or without the libstrata-cuda.so
 * module) fails in stage_open with "stage: backend cuda: no CUDA device".
 * With the argument "cuda" (ctest's test_backend_engine.cuda; exits 77,
 * skipped, without a CUDA device): backend "cuda" gives exactly the golden tokens for all
 * 10 prompts in one batch (f32 and f16 KV caches) at every TP degree in
 * {1, 2, 4, 8} that the visible devices allow (one GPU per rank, NCCL), and
 * each rank's resident weight bytes equal the CPU backend's.
 */
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "common/dtype.h"
#include "engine/generate.h"
#include "tests/engine/ref.h"
#include "tests/testutil.h"
#include "compute/registry.h"

static gen_engine *open_be(const char *be, int tp, uint32_t kv_type, st_err *err) {
    gen_params p = {.model_path = test_shared_path("models/stories260K.gguf"),
                    .tp = tp,
                    .n_threads = 2,
                    .n_ctx = 512,
                    .max_seqs = 10,
                    .backend = be,
                    .kv_type = kv_type};
    return gen_open(&p, err);
}

/* Greedy completions of cases idx[0..n) must equal the reference exactly. */
static void run_exact(const char *label, gen_engine *g, ref_case *cs, const int *idx, int n) {
    gen_request reqs[10];
    gen_result res[10];
    REQUIRE(n <= 10);
    memset(reqs, 0, sizeof reqs);
    memset(res, 0, sizeof res);
    for (int i = 0; i < n; i++) {
        reqs[i].prompt = cs[idx[i]].prompt;
        reqs[i].n_prompt = cs[idx[i]].n_prompt;
        reqs[i].max_tokens = cs[idx[i]].n_completion;
        reqs[i].sampling = sampler_greedy_params();
    }
    st_err err;
    int rc = gen_run(g, reqs, n, res, NULL, NULL, NULL, &err);
    CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
    for (int i = 0; rc == 0 && i < n; i++) {
        const ref_case *c = &cs[idx[i]];
        CHECK_EQ_INT(res[i].n_tokens, c->n_completion);
        int first_bad = -1;
        for (int k = 0; k < c->n_completion && k < res[i].n_tokens; k++)
            if (res[i].tokens[k] != c->completion[k]) {
                first_bad = k;
                break;
            }
        CHECK_MSG(first_bad < 0, "%s case %d: token %d is %d, expected %d", label, idx[i], first_bad,
                  first_bad >= 0 ? res[i].tokens[first_bad] : 0, first_bad >= 0 ? c->completion[first_bad] : 0);
    }
    for (int i = 0; i < n; i++) gen_result_free(&res[i]);
}

int main(int argc, char **argv) {
    /* "cuda": the cuda engine path alone, skipped (77) without a device. */
    const bool cuda_only = argc > 1 && strcmp(argv[1], "cuda") == 0;
    int n = 0;
    ref_case *cs = ref_load(test_shared_path("reference/stories260K-greedy.json"), &n);
    REQUIRE(n == 10);
    int all[10];
    for (int i = 0; i < 10; i++) all[i] = i;
    st_err err;
    gen_engine *g;
    int n_dev = 0;
    /* The cuda module through the registry, as the engine finds it. */
    st_err reg_err;
    const backend_module *cuda = backend_registry_get("cuda", &reg_err);
    if (cuda) n_dev = cuda->device_count();
    else printf("cuda module: %s\n", reg_err.msg);

    if (!cuda_only) {
        /* "cpu" by name. */
        g = open_be("cpu", 2, GGML_TYPE_F32, &err);
        REQUIRE_MSG(g, "%s", err.msg);
        run_exact("cpu tp 2", g, cs, all, 2);
        gen_close(g);

        /* Unknown names are refused. */
        err.msg[0] = 0;
        CHECK(open_be("tpu", 1, GGML_TYPE_F32, &err) == NULL);
        CHECK_MSG(strstr(err.msg, "backend 'tpu' is not available") != NULL, "got: %s", err.msg);

        /* Without a device, "cuda" is a clean error. */
        if (n_dev == 0) {
            err.msg[0] = 0;
            CHECK(open_be("cuda", 1, GGML_TYPE_F32, &err) == NULL);
            CHECK_MSG(strstr(err.msg, "stage: backend cuda: no CUDA device") != NULL, "got: %s", err.msg);
        }
    } else if (n_dev == 0) {
        printf("SKIP: test_backend_engine cuda: no CUDA device (or built without CUDA)\n");
        ref_free(cs, n);
        return 77;
    } else {
        const int tps[] = {1, 2, 4, 8};
        char label[64];
        for (size_t t = 0; t < sizeof tps / sizeof tps[0]; t++) {
            const int tp = tps[t];
            if (tp > n_dev) break;
            for (int f16 = 0; f16 < 2; f16++) {
                const uint32_t kv = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
                g = open_be("cuda", tp, kv, &err);
                CHECK_MSG(g != NULL, "cuda tp %d: %s", tp, err.msg);
                if (!g) continue;
                snprintf(label, sizeof label, "cuda tp %d %s KV, 10 prompts", tp, f16 ? "f16" : "f32");
                run_exact(label, g, cs, all, 10);
                if (!f16) {
                    /* Same shards, same accounting as the CPU backend. */
                    gen_engine *gc = open_be("cpu", tp, kv, &err);
                    REQUIRE_MSG(gc, "%s", err.msg);
                    for (int r = 0; r < tp; r++) {
                        stage_rank_stats a, b;
                        REQUIRE(stage_rank_stats_get(gen_stage(g), r, &a) == 0);
                        REQUIRE(stage_rank_stats_get(gen_stage(gc), r, &b) == 0);
                        CHECK_EQ_INT(a.weight_bytes, b.weight_bytes);
                    }
                    gen_close(gc);
                }
                gen_close(g);
            }
        }
        printf("test_backend_engine: cuda engine exercised on %d device(s)\n", n_dev);
    }
    ref_free(cs, n);
    return test_summary();
}
