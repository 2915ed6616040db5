/* test_sampler.c — sampler: validation, greedy, seeded draws, support and
 * frequencies of top-k/top-p/min-p, penalties, logprobs, and the
 * vocabulary-parallel merge against the full-row path (1..8 ranks, uneven). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "tests/testutil.h"

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }
/* Roughly normal logits (sum of uniforms), scaled. */
static void fill_logits(float *l, int n, double scale) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += rng_unit() - 0.5;
        l[i] = (float)(s * scale);
    }
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void log_softmax(const float *l, int n, double *out) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (l[i] > m) m = l[i];
    for (int i = 0; i < n; i++) s += exp((double)l[i] - m);
    for (int i = 0; i < n; i++) out[i] = (double)l[i] - m - log(s);
}

static int sample_id(const sampler_params *p, const float *l, int n, const sampler_history *h, uint64_t step) {
    sampler_token_info info;
    st_err err = {{0}};
    int rc = sampler_sample(p, l, n, h, step, &info, &err);
    REQUIRE_MSG(rc == 0, "%s", err.msg);
    return info.id;
}

static void expect_invalid(sampler_params p, const char *field) {
    st_err err = {{0}};
    CHECK_EQ_INT(sampler_params_validate(&p, &err), -1);
    CHECK_MSG(strstr(err.msg, field) != NULL, "error '%s' should name %s", err.msg, field);
    float l[4] = {0, 1, 2, 3};
    sampler_token_info info;
    CHECK_EQ_INT(sampler_sample(&p, l, 4, NULL, 0, &info, &err), -1);
}

static void test_validation(void) {
    sampler_params d = sampler_default_params(), g = sampler_greedy_params();
    st_err err = {{0}};
    CHECK_EQ_INT(sampler_params_validate(&d, &err), 0);
    CHECK_EQ_INT(sampler_params_validate(&g, &err), 0);
    CHECK(d.temperature > 0.79f && d.temperature < 0.81f && d.top_k == 40 && d.repeat_last_n == 64);
    sampler_params p;
    p = d; p.temperature = -0.5f; expect_invalid(p, "temperature");
    p = d; p.temperature = NAN; expect_invalid(p, "temperature");
    p = d; p.temperature = INFINITY; expect_invalid(p, "temperature");
    p = d; p.top_k = -1; expect_invalid(p, "top_k");
    p = d; p.top_p = 0.0f; expect_invalid(p, "top_p");
    p = d; p.top_p = 1.5f; expect_invalid(p, "top_p");
    p = d; p.top_p = NAN; expect_invalid(p, "top_p");
    p = d; p.min_p = -0.1f; expect_invalid(p, "min_p");
    p = d; p.min_p = 1.01f; expect_invalid(p, "min_p");
    p = d; p.repeat_penalty = 0.0f; expect_invalid(p, "repeat_penalty");
    p = d; p.repeat_penalty = -1.0f; expect_invalid(p, "repeat_penalty");
    p = d; p.repeat_last_n = -2; expect_invalid(p, "repeat_last_n");
    p = d; p.presence_penalty = 2.5f; expect_invalid(p, "presence_penalty");
    p = d; p.frequency_penalty = -3.0f; expect_invalid(p, "frequency_penalty");
    p = d; p.n_top_logprobs = 21; expect_invalid(p, "top_logprobs");
    p = d; p.n_top_logprobs = -1; expect_invalid(p, "top_logprobs");
    /* edge values that are valid */
    p = d; p.top_p = 1.0f; p.min_p = 1.0f; p.top_k = 0; p.n_top_logprobs = 20;
    p.presence_penalty = -2.0f; p.frequency_penalty = 2.0f; p.repeat_last_n = -1;
    CHECK_EQ_INT(sampler_params_validate(&p, &err), 0);

    /* bad logits / sizes */
    sampler_token_info info;
    float bad[3] = {0.0f, NAN, 1.0f};
    CHECK_EQ_INT(sampler_sample(&g, bad, 3, NULL, 0, &info, &err), -1);
    CHECK(strstr(err.msg, "NaN") != NULL);
    bad[1] = INFINITY;
    CHECK_EQ_INT(sampler_sample(&g, bad, 3, NULL, 0, &info, &err), -1);
    float ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK_EQ_INT(sampler_sample(&d, ninf, 3, NULL, 0, &info, &err), -1);
    CHECK_EQ_INT(sampler_sample(&g, ninf, 3, NULL, 0, &info, &err), -1);
    CHECK_EQ_INT(sampler_sample(&g, bad, 0, NULL, 0, &info, &err), -1);
    CHECK_EQ_INT(sampler_sample(&g, NULL, 3, NULL, 0, &info, &err), -1);
    /* masked tokens are fine */
    float masked[4] = {-INFINITY, 1.0f, -INFINITY, 0.5f};
    CHECK_EQ_INT(sampler_sample(&g, masked, 4, NULL, 0, &info, &err), 0);
    CHECK_EQ_INT(info.id, 1);
    for (uint64_t s = 0; s < 50; s++) {
        int id = sample_id(&d, masked, 4, NULL, s);
        CHECK(id == 1 || id == 3);
    }
}

static void test_greedy(void) {
    enum { V = 1000 };
    float l[V];
    sampler_params g = sampler_greedy_params();
    for (int t = 0; t < 20; t++) {
        fill_logits(l, V, 6.0);
        int am = argmax(l, V);
        CHECK_EQ_INT(sample_id(&g, l, V, NULL, (uint64_t)t), am);
        /* temperature 0 overrides every filter and the seed */
        sampler_params p = sampler_default_params();
        p.temperature = 0.0f;
        p.seed = (uint64_t)t * 77;
        CHECK_EQ_INT(sample_id(&p, l, V, NULL, (uint64_t)t + 5), am);
        /* top_k = 1 at any temperature is greedy */
        p = sampler_default_params();
        p.top_k = 1;
        p.temperature = 1.5f;
        p.seed = (uint64_t)t;
        CHECK_EQ_INT(sample_id(&p, l, V, NULL, (uint64_t)t), am);
    }
    /* ties: lowest id */
    fill_logits(l, V, 1.0);
    l[700] = 50.0f;
    l[300] = 50.0f;
    CHECK_EQ_INT(sample_id(&g, l, V, NULL, 0), 300);
    sampler_params k1 = sampler_default_params();
    k1.top_k = 1;
    CHECK_EQ_INT(sample_id(&k1, l, V, NULL, 3), 300);
}

static void test_seeds(void) {
    enum { V = 200, N = 300 };
    float l[V];
    fill_logits(l, V, 2.0); /* fairly flat: many plausible tokens */
    sampler_params p = sampler_default_params();
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.temperature = 1.0f;
    int a[N], b[N], c[N];
    for (int i = 0; i < N; i++) {
        p.seed = 42;
        a[i] = sample_id(&p, l, V, NULL, (uint64_t)i);
        b[i] = sample_id(&p, l, V, NULL, (uint64_t)i);
        p.seed = 43;
        c[i] = sample_id(&p, l, V, NULL, (uint64_t)i);
    }
    int same_ab = 0, same_ac = 0, distinct_steps = 0;
    for (int i = 0; i < N; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
        distinct_steps += i > 0 && a[i] != a[i - 1];
    }
    CHECK_EQ_INT(same_ab, N);
    CHECK_MSG(same_ac < N / 5, "seeds 42 and 43 agree on %d of %d steps", same_ac, N);
    CHECK_MSG(distinct_steps > N / 2, "steps repeat the same draw: %d changes", distinct_steps);
    /* the uniform is in (0,1) and depends on every input */
    double u0 = sampler_uniform(1, 2, 3);
    CHECK(u0 > 0.0 && u0 < 1.0);
    CHECK(u0 != sampler_uniform(2, 2, 3));
    CHECK(u0 != sampler_uniform(1, 3, 3));
    CHECK(u0 != sampler_uniform(1, 2, 4));
    CHECK(u0 == sampler_uniform(1, 2, 3));
}

/* Samples N steps; checks the support and the frequencies against expect[]
 * (renormalised probabilities, 0 outside the kept set). */
static void check_distribution(const sampler_params *p, const float *l, int V, const double *expect,
                               const char *what) {
    enum { N = 20000 };
    int counts[64] = {0};
    REQUIRE(V <= 64);
    for (int i = 0; i < N; i++) {
        int id = sample_id(p, l, V, NULL, (uint64_t)i);
        REQUIRE(id >= 0 && id < V);
        counts[id]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)counts[i] / N;
        if (expect[i] == 0.0)
            CHECK_MSG(counts[i] == 0, "%s: id %d outside the kept set drawn %d times", what, i, counts[i]);
        else
            CHECK_MSG(fabs(f - expect[i]) < 0.015, "%s: id %d freq %.4f expected %.4f", what, i, f, expect[i]);
    }
}

static void test_filters(void) {
    /* probabilities at T=1: 0.40 0.25 0.15 0.10 0.06 0.04 */
    enum { V = 6 };
    const double prob[V] = {0.40, 0.25, 0.15, 0.10, 0.06, 0.04};
    float l[V];
    /* shuffle the ids so order != id order */
    const int perm[V] = {3, 0, 5, 1, 4, 2};
    for (int i = 0; i < V; i++) l[perm[i]] = (float)log(prob[i]);
    double e[V];
    sampler_params p = sampler_default_params();
    p.seed = 7;

    /* pure temperature 1: the softmax itself */
    p.temperature = 1.0f; p.top_k = 0; p.top_p = 1.0f; p.min_p = 0.0f;
    for (int i = 0; i < V; i++) e[perm[i]] = prob[i];
    check_distribution(&p, l, V, e, "T=1");

    /* temperature 0.5: p^2 renormalised */
    p.temperature = 0.5f;
    double z = 0;
    for (int i = 0; i < V; i++) z += prob[i] * prob[i];
    for (int i = 0; i < V; i++) e[perm[i]] = prob[i] * prob[i] / z;
    check_distribution(&p, l, V, e, "T=0.5");

    /* top-k 3 */
    p.temperature = 1.0f; p.top_k = 3;
    memset(e, 0, sizeof e);
    for (int i = 0; i < 3; i++) e[perm[i]] = prob[i] / 0.80;
    check_distribution(&p, l, V, e, "top_k=3");

    /* top-p 0.75: cum .40 .65 .80 -> keep 3 */
    p.top_k = 0; p.top_p = 0.75f;
    check_distribution(&p, l, V, e, "top_p=0.75");

    /* min-p 0.2: keep p >= 0.08 -> 4 tokens */
    p.top_p = 1.0f; p.min_p = 0.2f;
    memset(e, 0, sizeof e);
    for (int i = 0; i < 4; i++) e[perm[i]] = prob[i] / 0.90;
    check_distribution(&p, l, V, e, "min_p=0.2");

    /* top-k 5 then top-p 0.7 over the renormalised top-5 (.96): cum .417 .677 .833 -> 3 */
    p.min_p = 0.0f; p.top_k = 5; p.top_p = 0.7f;
    memset(e, 0, sizeof e);
    for (int i = 0; i < 3; i++) e[perm[i]] = prob[i] / 0.80;
    check_distribution(&p, l, V, e, "top_k=5,top_p=0.7");

    /* temperature 2 then top-p 0.5: q ~ sqrt(p) */
    p.top_k = 0; p.temperature = 2.0f; p.top_p = 0.5f;
    double q[V], zq = 0;
    for (int i = 0; i < V; i++) zq += q[i] = sqrt(prob[i]);
    double cum = 0;
    int keep = 0;
    while (cum < 0.5) cum += q[keep++] / zq;
    memset(e, 0, sizeof e);
    double zk = 0;
    for (int i = 0; i < keep; i++) zk += q[i];
    for (int i = 0; i < keep; i++) e[perm[i]] = q[i] / zk;
    CHECK_EQ_INT(keep, 3);
    check_distribution(&p, l, V, e, "T=2,top_p=0.5");
}

static void test_penalties(void) {
    sampler_history h;
    st_err err = {{0}};
    REQUIRE(sampler_history_init(&h, 3, &err) == 0);
    const int32_t toks[] = {9, 5, 5, 7};
    REQUIRE(sampler_history_rebuild(&h, toks, 4, &err) == 0);
    int32_t t, w;
    sampler_history_count(&h, 5, &t, &w); CHECK_EQ_INT(t, 2); CHECK_EQ_INT(w, 2);
    sampler_history_count(&h, 9, &t, &w); CHECK_EQ_INT(t, 1); CHECK_EQ_INT(w, 0);
    sampler_history_count(&h, 7, &t, &w); CHECK_EQ_INT(t, 1); CHECK_EQ_INT(w, 1);
    sampler_history_count(&h, 8, &t, &w); CHECK_EQ_INT(t, 0); CHECK_EQ_INT(w, 0);
    CHECK_EQ_INT(sampler_history_add(&h, -1, &err), -1);

    float l[12], ref[12];
    for (int i = 0; i < 12; i++) l[i] = ref[i] = (float)i * 0.5f - 2.0f;
    l[5] = 2.0f; l[7] = -1.0f; l[9] = 3.0f;
    memcpy(ref, l, sizeof l);
    sampler_params p = sampler_greedy_params();
    p.repeat_penalty = 2.0f; p.repeat_last_n = 3;
    p.presence_penalty = 0.5f; p.frequency_penalty = 0.25f;
    REQUIRE(sampler_apply_penalties(&p, &h, l, 0, 12, &err) == 0);
    CHECK(l[5] == 0.0f);   /* 2/2 - (0.5 + 0.25*2) */
    CHECK(l[7] == -2.75f); /* -1*2 - (0.5 + 0.25) */
    CHECK(l[9] == 2.25f);  /* outside the window: 3 - 0.75 */
    for (int i = 0; i < 12; i++)
        if (i != 5 && i != 7 && i != 9) CHECK(l[i] == ref[i]);
    /* each penalty alone */
    sampler_params q = sampler_greedy_params();
    q.presence_penalty = -1.0f; /* negative presence raises */
    memcpy(l, ref, sizeof l);
    sampler_apply_penalties(&q, &h, l, 0, 12, &err);
    CHECK(l[5] == 3.0f && l[9] == 4.0f && l[7] == 0.0f);
    q = sampler_greedy_params();
    q.frequency_penalty = 1.5f;
    memcpy(l, ref, sizeof l);
    sampler_apply_penalties(&q, &h, l, 0, 12, &err);
    CHECK(l[5] == -1.0f && l[9] == 1.5f && l[7] == -2.5f);
    q = sampler_greedy_params();
    q.repeat_penalty = 1.25f; q.repeat_last_n = 3;
    memcpy(l, ref, sizeof l);
    sampler_apply_penalties(&q, &h, l, 0, 12, &err);
    CHECK(l[5] == 1.6f && l[7] == -1.25f && l[9] == 3.0f);
    /* on a slice: only ids in [lo, hi) move, indexed from lo */
    memcpy(l, ref, sizeof l);
    REQUIRE(sampler_apply_penalties(&p, &h, l + 6, 6, 12, &err) == 0);
    CHECK(l[5] == 2.0f && l[7] == -2.75f && l[9] == 2.25f);
    /* window mismatch is an error while the repeat penalty is on */
    p.repeat_last_n = 64;
    CHECK_EQ_INT(sampler_apply_penalties(&p, &h, l, 0, 12, &err), -1);
    CHECK(strstr(err.msg, "repeat_last_n") != NULL);
    /* penalties change greedy: id 9 (3.0) drops below id 11 (2.5) */
    p.repeat_last_n = 3;
    memcpy(l, ref, sizeof l);
    l[10] = 0.0f;
    l[11] = 2.5f; /* 9 penalized to 2.25 < 2.5 */
    CHECK_EQ_INT(sample_id(&p, l, 12, NULL, 0), 9);
    CHECK_EQ_INT(sample_id(&p, l, 12, &h, 0), 11);
    /* the logprob stays that of the raw logits */
    sampler_token_info info;
    p.n_top_logprobs = 3;
    REQUIRE(sampler_sample(&p, l, 12, &h, 0, &info, &err) == 0);
    double ls[12];
    log_softmax(l, 12, ls);
    CHECK_NEAR(info.logprob, ls[11], 1e-6);
    CHECK_EQ_INT(info.top_ids[0], 9);
    CHECK_NEAR(info.top_logprobs[0], ls[9], 1e-6);

    /* ring wrap and table growth against a brute-force count */
    sampler_history_free(&h);
    REQUIRE(sampler_history_init(&h, 50, &err) == 0);
    enum { NT = 3000 };
    static int32_t seq[NT];
    for (int i = 0; i < NT; i++) seq[i] = (int32_t)(rng_next() % (i < 1500 ? 2000 : 40));
    for (int i = 0; i < NT; i++) REQUIRE(sampler_history_add(&h, seq[i], &err) == 0);
    int bad = 0;
    for (int32_t id = 0; id < 2000; id++) {
        int tot = 0, win = 0;
        for (int i = 0; i < NT; i++) {
            tot += seq[i] == id;
            win += i >= NT - 50 && seq[i] == id;
        }
        sampler_history_count(&h, id, &t, &w);
        bad += t != tot || w != win;
    }
    CHECK_EQ_INT(bad, 0);
    sampler_history_free(&h);
    /* window -1: the window count is the total */
    REQUIRE(sampler_history_init(&h, -1, &err) == 0);
    for (int i = 0; i < 5; i++) sampler_history_add(&h, 3, &err);
    sampler_history_count(&h, 3, &t, &w);
    CHECK_EQ_INT(t, 5); CHECK_EQ_INT(w, 5);
    sampler_history_free(&h);
    CHECK_EQ_INT(sampler_history_init(&h, -5, &err), -1);
}

static void test_logprobs(void) {
    enum { V = 3000 };
    static float l[V];
    static double ls[V];
    fill_logits(l, V, 10.0);
    log_softmax(l, V, ls);
    sampler_params p = sampler_default_params();
    p.n_top_logprobs = 20;
    for (uint64_t s = 0; s < 10; s++) {
        sampler_token_info info;
        st_err err = {{0}};
        REQUIRE(sampler_sample(&p, l, V, NULL, s, &info, &err) == 0);
        CHECK_NEAR(info.logprob, ls[info.id], 1e-6);
        CHECK_EQ_INT(info.n_top, 20);
        /* reference top-20 by selection */
        int used[V];
        memset(used, 0, sizeof used);
        for (int k = 0; k < 20; k++) {
            int b = -1;
            for (int i = 0; i < V; i++)
                if (!used[i] && (b < 0 || l[i] > l[b])) b = i;
            used[b] = 1;
            CHECK_EQ_INT(info.top_ids[k], b);
            CHECK_NEAR(info.top_logprobs[k], ls[b], 1e-6);
        }
    }
    /* n_top > vocabulary is clamped */
    float small[3] = {1.0f, 2.0f, 3.0f};
    sampler_token_info info;
    st_err err = {{0}};
    REQUIRE(sampler_sample(&p, small, 3, NULL, 0, &info, &err) == 0);
    CHECK_EQ_INT(info.n_top, 3);
    CHECK_EQ_INT(info.top_ids[0], 2);
    CHECK_EQ_INT(info.top_ids[2], 0);
}

/* Splits [0, V) into n slices: even, or at random cut points (possibly empty). */
static void make_slices(int V, int n, int uneven, int32_t *lo, int32_t *hi) {
    int32_t cuts[9];
    cuts[0] = 0;
    cuts[n] = V;
    for (int r = 1; r < n; r++) cuts[r] = uneven ? (int32_t)(rng_next() % (uint64_t)(V + 1)) : (int32_t)((int64_t)V * r / n);
    for (int i = 1; i < n; i++) /* sort the inner cuts */
        for (int j = i; j > 1 && cuts[j] < cuts[j - 1]; j--) {
            int32_t t = cuts[j]; cuts[j] = cuts[j - 1]; cuts[j - 1] = t;
        }
    for (int r = 0; r < n; r++) lo[r] = cuts[r], hi[r] = cuts[r + 1];
}

static int tp_sample(const sampler_params *p, const float *l, int n_ranks, const int32_t *lo,
                     const int32_t *hi, const sampler_history *h, uint64_t step, int use_blob,
                     sampler_token_info *out) {
    st_err err = {{0}};
    int32_t mc = sampler_tp_max_cands(p);
    if (use_blob) {
        size_t bb = sampler_tp_blob_bytes(mc);
        char *all = malloc(bb * (size_t)n_ranks);
        REQUIRE(all);
        for (int r = 0; r < n_ranks; r++) {
            /* each rank sees only its own slice: copy it */
            int32_t n = hi[r] - lo[r];
            float *slice = malloc((size_t)(n > 0 ? n : 1) * sizeof *slice);
            memcpy(slice, l + lo[r], (size_t)n * sizeof *slice);
            int rc = sampler_tp_local_blob(p, slice, lo[r], hi[r], h, step, mc, all + (size_t)r * bb, &err);
            free(slice);
            REQUIRE_MSG(rc == 0, "%s", err.msg);
        }
        /* every rank merges its own copy of the gathered bytes: same answer */
        sampler_token_info first;
        for (int r = 0; r < n_ranks; r++) {
            char *copy = malloc(bb * (size_t)n_ranks);
            memcpy(copy, all, bb * (size_t)n_ranks);
            REQUIRE_MSG(sampler_tp_merge_blobs(p, copy, n_ranks, mc, step, out, &err) == 0, "%s", err.msg);
            free(copy);
            if (r == 0) first = *out;
            else CHECK(memcmp(&first, out, sizeof first) == 0);
        }
        free(all);
        return 0;
    }
    sampler_cand *cands = calloc((size_t)n_ranks * (size_t)mc, sizeof *cands);
    sampler_local_stats *st = calloc((size_t)n_ranks, sizeof *st);
    REQUIRE(cands && st);
    for (int r = 0; r < n_ranks; r++)
        REQUIRE_MSG(sampler_local_candidates(p, l + lo[r], lo[r], hi[r], h, step, cands + (size_t)r * mc,
                                             mc, &st[r], &err) == 0, "%s", err.msg);
    int rc = sampler_merge_pick(p, cands, mc, st, n_ranks, step, out, &err);
    REQUIRE_MSG(rc == 0, "%s", err.msg);
    free(cands);
    free(st);
    return 0;
}

static void test_tp_equivalence(void) {
    enum { V = 1000 };
    static float l[V];
    st_err err = {{0}};
    sampler_history h;
    REQUIRE(sampler_history_init(&h, 64, &err) == 0);
    const int32_t hist[] = {3, 17, 17, 500, 999, 0, 250, 251, 17};
    sampler_history_rebuild(&h, hist, sizeof hist / sizeof hist[0], &err);

    sampler_params cfg[9];
    int ncfg = 0;
    cfg[ncfg] = sampler_greedy_params(); ncfg++;
    cfg[ncfg] = sampler_greedy_params(); cfg[ncfg].repeat_penalty = 1.3f; cfg[ncfg].presence_penalty = 0.7f; ncfg++;
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 1; cfg[ncfg].temperature = 1.0f; ncfg++;
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 40; cfg[ncfg].top_p = 1.0f; cfg[ncfg].min_p = 0.0f; ncfg++;
    cfg[ncfg] = sampler_default_params(); ncfg++; /* top_k 40, top_p .95, min_p .05 */
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 7; cfg[ncfg].temperature = 1.7f;
    cfg[ncfg].frequency_penalty = 0.5f; cfg[ncfg].repeat_penalty = 1.1f; ncfg++;
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 0; cfg[ncfg].top_p = 1.0f; cfg[ncfg].min_p = 0.0f;
    cfg[ncfg].temperature = 1.0f; ncfg++; /* pure temperature */
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 0; cfg[ncfg].top_p = 0.9f; cfg[ncfg].min_p = 0.0f;
    ncfg++; /* top-p only: exact on peaked logits */
    cfg[ncfg] = sampler_default_params(); cfg[ncfg].top_k = 0; cfg[ncfg].top_p = 1.0f; cfg[ncfg].min_p = 0.1f;
    cfg[ncfg].temperature = 1.2f; ncfg++; /* min-p only */

    int mismatches = 0, checks = 0, truncs = 0;
    for (int trial = 0; trial < 6; trial++) {
        fill_logits(l, V, trial < 3 ? 8.0 : 20.0);
        for (int c = 0; c < ncfg; c++) {
            sampler_params p = cfg[c];
            p.seed = 1000u + (uint64_t)trial;
            p.n_top_logprobs = 5;
            for (int n = 1; n <= 8; n++)
                for (int uneven = 0; uneven < 2; uneven++) {
                    int32_t lo[8], hi[8];
                    make_slices(V, n, uneven, lo, hi);
                    for (uint64_t step = 0; step < 6; step++) {
                        sampler_token_info full, tp;
                        REQUIRE(sampler_sample(&p, l, V, &h, step, &full, &err) == 0);
                        tp_sample(&p, l, n, lo, hi, &h, step, (int)((step + (uint64_t)n) & 1), &tp);
                        checks++;
                        truncs += tp.truncated;
                        if (tp.id != full.id) {
                            mismatches++;
                            fprintf(stderr, "cfg %d trial %d ranks %d uneven %d step %d: tp %d full %d\n", c,
                                    trial, n, uneven, (int)step, tp.id, full.id);
                        }
                        CHECK_NEAR(tp.logprob, full.logprob, 1e-6);
                        CHECK_EQ_INT(tp.n_top, 5);
                        for (int k = 0; k < 5; k++) {
                            CHECK_EQ_INT(tp.top_ids[k], full.top_ids[k]);
                            CHECK_NEAR(tp.top_logprobs[k], full.top_logprobs[k], 1e-6);
                        }
                    }
                }
        }
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(truncs, 0);
    fprintf(stderr, "tp equivalence: %d (config, split, step) cases\n", checks);

    /* A flat distribution with top-p 0.9 needs ~900 tokens: 4 ranks x 64
     * candidates cannot hold them: flagged, and the pick stays in a sent set. */
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    sampler_params p = sampler_default_params();
    p.top_k = 0; p.top_p = 0.9f; p.min_p = 0.0f;
    int32_t lo[4], hi[4];
    make_slices(V, 4, 0, lo, hi);
    sampler_token_info tp, full;
    tp_sample(&p, l, 4, lo, hi, NULL, 0, 0, &tp);
    CHECK_EQ_INT(tp.truncated, 1);
    CHECK((tp.id - lo[tp.id / 250]) < 64); /* each rank sent its 64 lowest ids */
    REQUIRE(sampler_sample(&p, l, V, NULL, 0, &full, &err) == 0);
    CHECK_EQ_INT(full.truncated, 0);
    /* full path: nucleus of 900 ids = 0..899 (ties broken by id) */
    int outside = 0;
    for (uint64_t s = 0; s < 2000; s++) outside += sample_id(&p, l, V, NULL, s) >= 900;
    CHECK_EQ_INT(outside, 0);

    /* merge rejects slices that do not partition the vocabulary */
    sampler_params g = sampler_greedy_params();
    sampler_cand cands[2];
    sampler_local_stats st[2];
    fill_logits(l, V, 1.0);
    REQUIRE(sampler_local_candidates(&g, l, 0, 500, NULL, 0, &cands[0], 1, &st[0], &err) == 0);
    REQUIRE(sampler_local_candidates(&g, l + 600, 600, V, NULL, 0, &cands[1], 1, &st[1], &err) == 0);
    sampler_token_info out;
    CHECK_EQ_INT(sampler_merge_pick(&g, cands, 1, st, 2, 0, &out, &err), -1);
    CHECK_EQ_INT(sampler_local_candidates(&g, l, 10, 5, NULL, 0, cands, 1, st, &err), -1);
    CHECK_EQ_INT(sampler_local_candidates(&g, l, 0, 5, NULL, 0, cands, 0, st, &err), -1);
    sampler_history_free(&h);
}

/* vLLM's repetition_penalty over prompt + output (the prompt only for that
 * penalty) and OpenAI's logit_bias (before the penalties; -inf masks). */
static void test_prompt_history_and_bias(void) {
    st_err err = {{0}};
    sampler_history h;
    REQUIRE(sampler_history_init(&h, -1, &err) == 0);
    const int32_t toks[] = {3, 4, 3, 6}; /* prompt 3 4 3, generated 6 */
    REQUIRE(sampler_history_rebuild_prompt(&h, toks, 4, 3, &err) == 0);
    int32_t t, w;
    sampler_history_count(&h, 3, &t, &w); CHECK_EQ_INT(t, 0); CHECK_EQ_INT(w, 0);
    sampler_history_count(&h, 6, &t, &w); CHECK_EQ_INT(t, 1); CHECK_EQ_INT(w, 1);
    CHECK_EQ_INT(sampler_history_rebuild_prompt(&h, toks, 4, 5, &err), -1);

    float l[8] = {0.5f, 1.0f, -1.0f, 2.0f, -0.5f, 0.25f, 1.5f, 0.0f}, ref[8];
    memcpy(ref, l, sizeof l);
    sampler_params p = sampler_greedy_params();
    p.repeat_penalty = 2.0f; p.repeat_last_n = -1; p.presence_penalty = 1.0f;
    REQUIRE(sampler_apply_penalties(&p, &h, l, 0, 8, &err) == 0);
    CHECK(l[3] == 1.0f);   /* prompt: 2 / 2, no presence */
    CHECK(l[4] == -1.0f);  /* prompt: -0.5 * 2 */
    CHECK(l[6] == -0.25f); /* generated: 1.5 / 2 - 1 */
    CHECK(l[0] == ref[0] && l[1] == ref[1] && l[2] == ref[2] && l[5] == ref[5] && l[7] == ref[7]);
    /* greedy: 3 falls to 1.0 and ties with 1: the lower id wins */
    sampler_token_info out;
    REQUIRE(sampler_sample(&p, ref, 8, &h, 0, &out, &err) == 0);
    CHECK_EQ_INT(out.id, 1);
    sampler_params g = sampler_greedy_params();
    REQUIRE(sampler_sample(&g, ref, 8, &h, 0, &out, &err) == 0);
    CHECK_EQ_INT(out.id, 3);

    /* logit bias: +3 on 7 wins greedy; -inf on 3 and 6 masks them */
    const int32_t bid[] = {7, 3, 6};
    const float bval[] = {3.0f, -INFINITY, -INFINITY};
    g.bias_ids = bid; g.bias_values = bval; g.n_bias = 1;
    REQUIRE(sampler_sample(&g, ref, 8, NULL, 0, &out, &err) == 0);
    CHECK_EQ_INT(out.id, 7);
    double z = 0;
    for (int i = 0; i < 8; i++) z += exp((double)ref[i]);
    CHECK(fabs(out.logprob - (ref[7] - log(z))) < 1e-5); /* the model's logprob, not the biased one */
    g.bias_ids = bid + 1; g.bias_values = bval + 1; g.n_bias = 2;
    REQUIRE(sampler_sample(&g, ref, 8, NULL, 0, &out, &err) == 0);
    CHECK_EQ_INT(out.id, 1);
    /* sampling at temperature 1 never draws a masked token */
    sampler_params tp = sampler_greedy_params();
    tp.temperature = 1.0f; tp.bias_ids = bid + 1; tp.bias_values = bval + 1; tp.n_bias = 2;
    for (uint64_t step = 0; step < 200; step++) {
        REQUIRE(sampler_sample(&tp, ref, 8, NULL, step, &out, &err) == 0);
        CHECK(out.id != 3 && out.id != 6);
    }
    /* logprobs stay the model's: bias and penalties do not move them */
    sampler_token_info plain;
    REQUIRE(sampler_sample(&g, ref, 8, NULL, 0, &out, &err) == 0);
    g.n_bias = 0;
    REQUIRE(sampler_sample(&g, ref, 8, NULL, 0, &plain, &err) == 0);
    CHECK(plain.id == 3 && out.id == 1);
    /* bad bias entries are refused */
    const float nanv[] = {NAN};
    g.bias_ids = bid; g.bias_values = nanv; g.n_bias = 1;
    CHECK_EQ_INT(sampler_params_validate(&g, &err), -1);
    g.bias_ids = NULL; g.n_bias = 1;
    CHECK_EQ_INT(sampler_params_validate(&g, &err), -1);
    sampler_history_free(&h);
}

int main(void) {
    test_validation();
    test_prompt_history_and_bias();
    test_greedy();
    test_seeds();
    test_filters();
    test_penalties();
    test_logprobs();
    test_tp_equivalence();
    return test_summary();
}
