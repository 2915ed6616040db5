/* test_engine_counts.c — collective counts per forward, and a 2-stage
 * pipeline (stages with different TP degrees) that reproduces the reference.
 *
 * Formula (engine/stage.h), per forward of a stage holding layers [first, last):
 *   all_reduce_calls = 2 * (last - first)       (after O and after down, each layer)
 *                    + (first == 0 ? 1 : 0)     (the vocabulary-parallel embedding)
 *   all_gather_calls = (last == n_layer and some sequence wants logits) ? 1 : 0
 *                      (the LM head's per-rank sampling candidates)
 * stories260K has 5 layers: the whole model is 11 all-reduces + 1 all-gather. */
#include <stdlib.h>
#include <string.h>

#include "engine/stage.h"
#include "model/kv.h"
#include "tests/engine/ref.h"
#include "tests/testutil.h"
#include "tests/simd_level.h"

static stage *open_stage(int first, int last, int tp) {
    stage_params p = {.model_path = test_shared_path("models/stories260K.gguf"),
                      .first_layer = first, .last_layer = last, .tp = tp, .n_threads = 2,
                      .kv_blocks = 64, .block_size = 16};
    st_err err;
    stage *s = stage_open(&p, &err);
    REQUIRE_MSG(s, "%s", err.msg);
    return s;
}

static void counts(stage *s, uint64_t *ar, uint64_t *ag) {
    for (int r = 0; r < stage_tp(s); r++) {
        stage_rank_stats st;
        REQUIRE(stage_rank_stats_get(s, r, &st) == 0);
        ar[r] = st.all_reduce_calls;
        ag[r] = st.all_gather_calls;
    }
}

/* Checks that the last forward added exactly (d_ar, d_ag) on every rank. */
static void check_delta(stage *s, uint64_t *ar, uint64_t *ag, int d_ar, int d_ag, const char *what) {
    uint64_t nar[8], nag[8];
    counts(s, nar, nag);
    for (int r = 0; r < stage_tp(s); r++) {
        CHECK_MSG(nar[r] - ar[r] == (uint64_t)d_ar, "%s rank %d: %llu all-reduces, expected %d",
                  what, r, (unsigned long long)(nar[r] - ar[r]), d_ar);
        CHECK_MSG(nag[r] - ag[r] == (uint64_t)d_ag, "%s rank %d: %llu all-gathers, expected %d",
                  what, r, (unsigned long long)(nag[r] - ag[r]), d_ag);
        ar[r] = nar[r];
        ag[r] = nag[r];
    }
}

int main(void) {
    test_simd_level_or_skip();
    int n = 0;
    ref_case *cs = ref_load(test_shared_path("reference/stories260K-greedy.json"), &n);
    REQUIRE(n == 10);
    st_err err;
    kv_alloc *kv = kv_alloc_new(64, 16, &err);
    REQUIRE(kv);

    /* ---- One stage with every layer, TP 2. ---- */
    {
        stage *s = open_stage(0, -1, 2);
        CHECK(stage_is_first(s) && stage_is_last(s));
        uint64_t ar[8], ag[8];
        counts(s, ar, ag);
        CHECK_EQ_INT(ar[0], 0);
        kv_table t;
        kv_table_init(&t);
        const ref_case *c = &cs[0];
        REQUIRE(kv_table_reserve(kv, &t, c->n_prompt + 1, &err) == 0);
        /* Prefill in two chunks: the first wants no logits (no all-gather). */
        int h = c->n_prompt / 2;
        stage_seq sq = {.seq_id = 7, .pos = 0, .n_tokens = h, .block_table = t.blocks,
                        .n_blocks = t.n_blocks, .want_logits = false,
                        .sampling = sampler_greedy_params()};
        stage_batch b = {.n_seqs = 1, .seqs = &sq, .n_tokens = h, .tokens = c->prompt};
        stage_sample_out out;
        REQUIRE_MSG(stage_forward(s, &b, NULL, NULL, &out, &err) == 0, "%s", err.msg);
        check_delta(s, ar, ag, 11, 0, "prefill chunk without logits");
        CHECK_EQ_INT(out.id, -1);
        sq.pos = h;
        sq.n_tokens = c->n_prompt - h;
        sq.want_logits = true;
        b.n_tokens = sq.n_tokens;
        b.tokens = c->prompt + h;
        REQUIRE_MSG(stage_forward(s, &b, NULL, NULL, &out, &err) == 0, "%s", err.msg);
        check_delta(s, ar, ag, 11, 1, "last prefill chunk");
        CHECK_EQ_INT(out.id, c->completion[0]);
        /* One decode step. */
        int32_t tok = out.id;
        sq.pos = c->n_prompt;
        sq.n_tokens = 1;
        b.n_tokens = 1;
        b.tokens = &tok;
        REQUIRE_MSG(stage_forward(s, &b, NULL, NULL, &out, &err) == 0, "%s", err.msg);
        check_delta(s, ar, ag, 11, 1, "decode step");
        CHECK_EQ_INT(out.id, c->completion[1]);
        /* Bad input is refused before any rank runs: no collective is made. */
        int32_t bad = 512;
        b.tokens = &bad;
        CHECK(stage_forward(s, &b, NULL, NULL, &out, &err) == -1);
        CHECK_MSG(strstr(err.msg, "outside the vocabulary") != NULL, "%s", err.msg);
        sq.n_blocks = 0;
        b.tokens = &tok;
        CHECK(stage_forward(s, &b, NULL, NULL, &out, &err) == -1);
        check_delta(s, ar, ag, 0, 0, "refused batches");
        stage_rank_stats rs;
        REQUIRE(stage_rank_stats_get(s, 1, &rs) == 0);
        CHECK(rs.busy_seconds > 0);
        CHECK(rs.weight_bytes > 0);
        kv_table_release(kv, &t);
        stage_close(s);
    }

    /* ---- Two stages: [0,2) at TP 2 then [2,5) at TP 1, sharing block ids;
     * 3 prompts batched together, 8 greedy tokens each. ---- */
    {
        stage *a = open_stage(0, 2, 2), *z = open_stage(2, 5, 1);
        CHECK(stage_is_first(a) && !stage_is_last(a));
        CHECK(!stage_is_first(z) && stage_is_last(z));
        uint64_t ara[8], aga[8], arz[8], agz[8];
        counts(a, ara, aga);
        counts(z, arz, agz);
        enum { NS = 3, STEPS = 8 };
        kv_table t[NS];
        int32_t gen[NS][STEPS];
        for (int step = 0; step < STEPS; step++) {
            stage_seq sq[NS];
            int32_t toks[64];
            int nt = 0;
            for (int i = 0; i < NS; i++) {
                const ref_case *c = &cs[i];
                int pos = step == 0 ? 0 : c->n_prompt + step - 1;
                int cnt = step == 0 ? c->n_prompt : 1;
                if (step == 0) kv_table_init(&t[i]);
                REQUIRE(kv_table_reserve(kv, &t[i], pos + cnt, &err) == 0);
                if (step == 0)
                    memcpy(toks + nt, c->prompt, (size_t)cnt * sizeof(int32_t));
                else
                    toks[nt] = gen[i][step - 1];
                sq[i] = (stage_seq){.seq_id = (uint64_t)i, .pos = pos, .n_tokens = cnt,
                                    .block_table = t[i].blocks, .n_blocks = t[i].n_blocks,
                                    .want_logits = true, .sampling = sampler_greedy_params(),
                                    .step = (uint64_t)step};
                nt += cnt;
            }
            stage_batch b = {.n_seqs = NS, .seqs = sq, .n_tokens = nt, .tokens = toks};
            float *hid = malloc((size_t)nt * 64 * sizeof(float));
            stage_sample_out out[NS];
            REQUIRE_MSG(stage_forward(a, &b, NULL, hid, NULL, &err) == 0, "%s", err.msg);
            check_delta(a, ara, aga, 5, 0, "first stage [0,2)");
            b.tokens = NULL;
            REQUIRE_MSG(stage_forward(z, &b, hid, NULL, out, &err) == 0, "%s", err.msg);
            check_delta(z, arz, agz, 6, 1, "last stage [2,5)");
            for (int i = 0; i < NS; i++) gen[i][step] = out[i].id;
            free(hid);
        }
        for (int i = 0; i < NS; i++) {
            for (int k = 0; k < STEPS; k++)
                CHECK_MSG(gen[i][k] == cs[i].completion[k], "pipeline prompt %d token %d: %d vs %d",
                          i, k, gen[i][k], cs[i].completion[k]);
            kv_table_release(kv, &t[i]);
        }
        stage_stats st;
        stage_stats_get(z, &st);
        CHECK_EQ_INT(st.forwards, STEPS);
        stage_close(a);
        stage_close(z);
    }
    CHECK_EQ_INT(kv_alloc_n_free(kv), 64);
    kv_alloc_free(kv);
    ref_free(cs, n);
    return test_summary();
}
