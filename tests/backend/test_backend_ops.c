/* test_backend_ops.c — conformance of every compute/backend.h op on each
 * available backend against simple host references (double sums).
 *
 * Backends: the CPU backend (no argument; ctest's test_backend_ops.LEVEL),
 * with the clean error of a missing CUDA device; the CUDA backend with the
 * argument "cuda" (test_backend_ops.cuda: once with the f32 prefill GEMM,
 * then the matmuls again with the half GemmEx path), which exits 77
 * (skipped) without a device or without STRATA_CUDA.
 *
 * Shapes are small but realistic: uneven row counts (N = 7, 33, 45), T = 1
 * (decode) and T > 8 (the GEMM path), every weight type (F32, F16, BF16,
 * Q8_0, Q4_0), GQA attention over a paged cache with scattered block tables
 * and several sequences, F32 and F16 caches, partial rotary dims with and
 * without rope_freqs factors, vocabulary-sliced embeddings. Argument errors
 * must return -1 with a message.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/backend.h"
#include "compute/comm.h"
#include "model/quantize.h"
#include "tests/testutil.h"
#include "tests/simd_level.h"
#ifdef STRATA_HAVE_CUDA
#include "compute/cuda/backend_cuda.h"
#include "compute/cuda/comm_nccl.h"
#endif

/* ---------------------------------------------------------------- helpers */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    REQUIRE(p);
    return p;
}

typedef struct tctx {
    backend *be;
    comm *c;
    const char *label;
} tctx;

static void *dev_from(tctx *t, const void *host, size_t bytes) {
    st_err err = {{0}};
    void *d = t->be->ops->alloc(t->be, bytes, &err);
    REQUIRE_MSG(d, "%s: alloc %zu: %s", t->label, bytes, err.msg);
    if (host) REQUIRE_MSG(t->be->ops->upload(t->be, d, host, bytes, &err) == 0, "%s: upload: %s", t->label, err.msg);
    return d;
}
static void to_host(tctx *t, void *host, const void *d, size_t bytes) {
    st_err err = {{0}};
    REQUIRE_MSG(t->be->ops->download(t->be, host, d, bytes, &err) == 0, "%s: download: %s", t->label, err.msg);
}
static void rel(tctx *t, void *d) { t->be->ops->release(t->be, d); }


/* Max |a - b| over n, and where. */
static double max_diff(const float *a, const double *b, size_t n, size_t *at) {
    double m = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) { /* also catches NaN */
            m = isnan(d) ? INFINITY : d;
            *at = i;
        }
    }
    return m;
}

/* Encodes rows x cols floats as `type` (malloc'd) and returns the exact
 * dequantized values in *deq (malloc'd). */
static uint8_t *encode(uint32_t type, const float *x, int64_t rows, int64_t cols, float **deq) {
    const size_t rb = ggml_row_bytes(type, cols);
    REQUIRE(rb);
    uint8_t *w = xmalloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        uint8_t *d = w + (size_t)r * rb;
        switch (type) {
        case GGML_TYPE_F32: memcpy(d, xr, (size_t)cols * 4); break;
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h = type == GGML_TYPE_F16 ? st_f32_to_fp16(xr[i]) : st_f32_to_bf16(xr[i]);
                memcpy(d + 2 * i, &h, 2);
            }
            break;
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0: st_quantize_row(type, xr, d, cols); break;
        default: REQUIRE(0);
        }
    }
    *deq = xmalloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) REQUIRE(st_dequant_row(type, w + (size_t)r * rb, *deq + r * cols, cols) == 0);
    return w;
}

static const uint32_t wtypes[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
#define N_WTYPES (sizeof wtypes / sizeof wtypes[0])

/* ---------------------------------------------------------------- memory */

static void test_memory(tctx *t) {
    backend *be = t->be;
    st_err err = {{0}};
    const size_t b0 = be->ops->buf_bytes(be), w0 = be->ops->weight_bytes(be);
    float h[37], back[37];
    fill(h, 37, 1.0f);
    float *a = dev_from(t, h, sizeof h);
    float *b = dev_from(t, NULL, sizeof h);
    CHECK_EQ_INT(be->ops->buf_bytes(be), b0 + 2 * sizeof h);
    CHECK_EQ_INT(be->ops->copy(be, b, a, sizeof h, &err), 0);
    memset(back, 0, sizeof back);
    to_host(t, back, b, sizeof h);
    CHECK_MSG(memcmp(back, h, sizeof h) == 0, "%s: copy/download differ", t->label);
    rel(t, a);
    rel(t, b);
    CHECK_EQ_INT(be->ops->buf_bytes(be), b0);

    /* Weight accounting: rows * row_bytes per weight, undone by weight_free. */
    float src[64 * 3];
    fill(src, 64 * 3, 1.0f);
    float *deq;
    uint8_t *q = encode(GGML_TYPE_Q4_0, src, 3, 64, &deq);
    backend_weight w = {0}, w2 = {0};
    CHECK_EQ_INT(be->ops->weight_upload(be, &w, GGML_TYPE_Q4_0, 3, 64, q, &err), 0);
    CHECK_EQ_INT(w.nbytes, 3 * 36);
    CHECK_EQ_INT(w.rows, 3);
    CHECK_EQ_INT(w.cols, 64);
    CHECK_EQ_INT(be->ops->weight_upload(be, &w2, GGML_TYPE_F32, 3, 64, src, &err), 0);
    CHECK_EQ_INT(be->ops->weight_bytes(be), w0 + 3 * 36 + 3 * 64 * 4);
    be->ops->weight_free(be, &w);
    CHECK(w.data == NULL);
    be->ops->weight_free(be, &w2);
    CHECK_EQ_INT(be->ops->weight_bytes(be), w0);
    /* Unsupported type and a row that is not whole blocks are refused. */
    err.msg[0] = 0;
    CHECK_EQ_INT(be->ops->weight_upload(be, &w, GGML_TYPE_Q4_1, 3, 64, q, &err), -1);
    CHECK(err.msg[0] != 0);
    CHECK_EQ_INT(be->ops->weight_upload(be, &w, GGML_TYPE_Q8_0, 1, 48, q, &err), -1);
    CHECK_EQ_INT(be->ops->weight_bytes(be), w0);
    free(q);
    free(deq);
}

/* ---------------------------------------------------------------- matmul */

static void matmul_case(tctx *t, uint32_t type, int64_t T, int64_t K, int64_t N, double rtol) {
    backend *be = t->be;
    st_err err = {{0}};
    float *wsrc = xmalloc((size_t)(N * K) * sizeof(float)), *x = xmalloc((size_t)(T * K) * sizeof(float));
    fill(wsrc, (size_t)(N * K), 1.0f);
    fill(x, (size_t)(T * K), 2.0f);
    float *deq;
    uint8_t *wq = encode(type, wsrc, N, K, &deq);
    backend_weight w = {0};
    REQUIRE_MSG(be->ops->weight_upload(be, &w, type, N, K, wq, &err) == 0, "%s: %s", t->label, err.msg);
    float *dx = dev_from(t, x, (size_t)(T * K) * sizeof(float));
    float *dy = dev_from(t, NULL, (size_t)(T * N) * sizeof(float));
    int rc = be->ops->matmul(be, dy, dx, &w, T, &err);
    CHECK_MSG(rc == 0, "%s matmul %s: %s", t->label, ggml_type_name(type), err.msg);
    float *y = xmalloc((size_t)(T * N) * sizeof(float));
    to_host(t, y, dy, (size_t)(T * N) * sizeof(float));
    /* Q8_0 weights: a backend may quantize the activations to Q8_0 as well
     * (the CPU backend does, as llama.cpp), which moves the output by at most
     * sum_k |w_k| e_k more than the f32 error (test_q8_activation_error). */
    float *xerr = xmalloc((size_t)(T * K) * sizeof(float));
    if (type == GGML_TYPE_Q8_0)
        test_q8_activation_error(x, (long)(T * K), xerr);
    else
        memset(xerr, 0, (size_t)(T * K) * sizeof(float));
    int bad = 0;
    for (int64_t tt = 0; tt < T && !bad; tt++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, mag = 0, qerr = 0;
            for (int64_t k = 0; k < K; k++) {
                s += (double)deq[n * K + k] * x[tt * K + k];
                mag += fabs((double)deq[n * K + k] * x[tt * K + k]);
                qerr += fabs((double)deq[n * K + k]) * xerr[tt * K + k];
            }
            double got = y[tt * N + n];
            if (!(fabs(got - s) <= rtol * mag + qerr + 1e-5)) {
                fprintf(stderr, "%s matmul %s T %lld K %lld N %lld: y[%lld][%lld] = %.7g, expected %.7g\n",
                        t->label, ggml_type_name(type), (long long)T, (long long)K, (long long)N,
                        (long long)tt, (long long)n, got, s);
                bad = 1;
                break;
            }
        }
    CHECK(bad == 0);
    free(xerr);
    be->ops->weight_free(be, &w);
    rel(t, dx);
    rel(t, dy);
    free(wsrc);
    free(x);
    free(deq);
    free(wq);
    free(y);
}

static void test_matmul(tctx *t, double rtol_f32, double rtol_half, int big) {
    static const int64_t shapes[][3] = {{1, 64, 7}, {3, 96, 33}, {17, 256, 45}, {9, 32, 1}, {8, 128, 5}};
    for (size_t i = 0; i < N_WTYPES; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const uint32_t ty = wtypes[i];
            double rtol = (ty == GGML_TYPE_F16 || ty == GGML_TYPE_BF16) ? rtol_half : rtol_f32;
            matmul_case(t, ty, shapes[s][0], shapes[s][1], shapes[s][2], rtol);
        }
    /* More weight rows than one dequantized tile (CUDA: 16M elements). */
    if (big) matmul_case(t, GGML_TYPE_Q4_0, 9, 4096, 4100, rtol_f32);
}

/* ---------------------------------------------------------------- rows ops */

static void test_rmsnorm(tctx *t) {
    backend *be = t->be;
    st_err err = {{0}};
    const int64_t T = 3, n = 67;
    const float eps = 1e-5f;
    float x[3 * 67], wv[67], y[3 * 67];
    double ref[3 * 67];
    fill(x, T * n, 3.0f);
    fill(wv, n, 1.0f);
    for (int64_t r = 0; r < T; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double sc = 1.0 / sqrt(ss / n + eps);
        for (int64_t i = 0; i < n; i++) ref[r * n + i] = x[r * n + i] * sc * wv[i];
    }
    backend_weight w = {0};
    REQUIRE(be->ops->weight_upload(be, &w, GGML_TYPE_F32, 1, n, wv, &err) == 0);
    float *dx = dev_from(t, x, sizeof x), *dy = dev_from(t, NULL, sizeof y);
    CHECK_EQ_INT(be->ops->rmsnorm(be, dy, dx, &w, T, n, eps, &err), 0);
    to_host(t, y, dy, sizeof y);
    size_t at;
    double d = max_diff(y, ref, (size_t)(T * n), &at);
    CHECK_MSG(d < 2e-5, "%s rmsnorm: |diff| %g at %zu", t->label, d, at);
    /* In place. */
    CHECK_EQ_INT(be->ops->rmsnorm(be, dx, dx, &w, T, n, eps, &err), 0);
    to_host(t, y, dx, sizeof y);
    d = max_diff(y, ref, (size_t)(T * n), &at);
    CHECK_MSG(d < 2e-5, "%s rmsnorm in place: |diff| %g at %zu", t->label, d, at);
    /* A weight of the wrong size is refused. */
    err.msg[0] = 0;
    CHECK_EQ_INT(be->ops->rmsnorm(be, dy, dx, &w, T, n + 1, eps, &err), -1);
    CHECK(err.msg[0] != 0);
    be->ops->weight_free(be, &w);
    rel(t, dx);
    rel(t, dy);
}

static void rope_case(tctx *t, int n_rot, int with_ff) {
    backend *be = t->be;
    st_err err = {{0}};
    enum { T = 4, NH = 3, HD = 16 };
    const int32_t pos[T] = {0, 1, 7, 1000};
    const float base = 10000.0f;
    float ff[HD / 2];
    for (int i = 0; i < HD / 2; i++) ff[i] = 1.0f + 0.5f * (float)i;
    float x[T * NH * HD], y[T * NH * HD];
    double ref[T * NH * HD];
    fill(x, sizeof x / sizeof x[0], 1.0f);
    for (int tt = 0; tt < T; tt++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD; i++) {
                const int k = (tt * NH + h) * HD + i;
                ref[k] = x[k];
                if (i >= n_rot) continue;
                const int p = i / 2;
                double th = pos[tt] * pow(base, -2.0 * p / n_rot);
                if (with_ff) th /= ff[p];
                const double x0 = x[k - (i & 1)], x1 = x[k - (i & 1) + 1];
                ref[k] = (i & 1) ? x0 * sin(th) + x1 * cos(th) : x0 * cos(th) - x1 * sin(th);
            }
    float *dx = dev_from(t, x, sizeof x);
    CHECK_EQ_INT(be->ops->rope(be, dx, T, NH, HD, n_rot, pos, base, with_ff ? ff : NULL, &err), 0);
    to_host(t, y, dx, sizeof y);
    for (int tt = 0; tt < T; tt++) {
        size_t at;
        const double tol = 1e-5 + 2e-6 * pos[tt]; /* ggml's float angle recurrence */
        double d = max_diff(y + tt * NH * HD, ref + tt * NH * HD, NH * HD, &at);
        CHECK_MSG(d <= tol, "%s rope n_rot %d ff %d pos %d: |diff| %g at %zu", t->label, n_rot, with_ff,
                  pos[tt], d, at);
    }
    rel(t, dx);
}

#ifdef STRATA_HAVE_CUDA
/* The CUDA backend's metadata ring re-uses an identical upload of the same
 * kind (no copy) and never serves stale positions: rope with the same
 * positions twice (one copy, one re-use), then with the same host array
 * changed in place (a new copy), each checked against the formula. */
static void rope_ref(double *ref, const float *x, const int32_t *pos, int T, int HD) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HD; i += 2) {
            const double th = pos[t] * pow(10000.0, -(double)i / HD);
            const double x0 = x[t * HD + i], x1 = x[t * HD + i + 1];
            ref[t * HD + i] = x0 * cos(th) - x1 * sin(th);
            ref[t * HD + i + 1] = x0 * sin(th) + x1 * cos(th);
        }
}

static void test_meta_reuse(void) {
    enum { T = 4, HD = 8 };
    st_err err;
    backend *be = backend_cuda_new(0, &err);
    REQUIRE_MSG(be, "%s", err.msg);
    tctx t = {.be = be, .label = "cuda meta ring"};
    int32_t pos[T] = {0, 1, 2, 3};
    float x[T * HD], y[T * HD];
    double ref[T * HD];
    for (int i = 0; i < T * HD; i++) x[i] = frand();
    unsigned long long c0, r0, c1, r1;
    REQUIRE(backend_cuda_meta_stats(be, &c0, &r0) == 0);
    for (int round = 0; round < 3; round++) {
        if (round == 2)
            for (int i = 0; i < T; i++) pos[i] += 7; /* same array, new content */
        float *dx = dev_from(&t, x, sizeof x);
        CHECK_EQ_INT(be->ops->rope(be, dx, T, 1, HD, HD, pos, 10000.0f, NULL, &err), 0);
        to_host(&t, y, dx, sizeof y);
        rope_ref(ref, x, pos, T, HD);
        size_t at;
        double d = max_diff(y, ref, T * HD, &at);
        CHECK_MSG(d <= 1e-4, "meta ring round %d: rope |diff| %g at %zu", round, d, at);
        rel(&t, dx);
    }
    REQUIRE(backend_cuda_meta_stats(be, &c1, &r1) == 0);
    CHECK_MSG(c1 - c0 == 2 && r1 - r0 == 1, "meta ring: %llu copies, %llu re-used (want 2, 1)", c1 - c0, r1 - r0);
    backend_free(be);
}
#endif

static void test_rope(tctx *t) {
    rope_case(t, 16, 0);
    rope_case(t, 16, 1);
    rope_case(t, 10, 0); /* partial rotary dims: 10..15 unchanged */
    rope_case(t, 10, 1);
    st_err err = {{0}};
    int32_t pos = 0;
    CHECK_EQ_INT(t->be->ops->rope(t->be, NULL, 1, 1, 16, 7, &pos, 10000.0f, NULL, &err), -1);
}

static void test_elementwise(tctx *t) {
    backend *be = t->be;
    st_err err = {{0}};
    enum { N = 1001 };
    float g[N], u[N], y[N];
    double ref[N];
    fill(g, N, 6.0f);
    fill(u, N, 2.0f);
    for (int i = 0; i < N; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    float *dg = dev_from(t, g, sizeof g), *du = dev_from(t, u, sizeof u), *dy = dev_from(t, NULL, sizeof y);
    CHECK_EQ_INT(be->ops->swiglu(be, dy, dg, du, N, &err), 0);
    to_host(t, y, dy, sizeof y);
    size_t at;
    double d = max_diff(y, ref, N, &at);
    CHECK_MSG(d < 1e-5, "%s swiglu: |diff| %g at %zu", t->label, d, at);
    CHECK_EQ_INT(be->ops->swiglu(be, dg, dg, du, N, &err), 0); /* out aliases gate */
    to_host(t, y, dg, sizeof y);
    d = max_diff(y, ref, N, &at);
    CHECK_MSG(d < 1e-5, "%s swiglu aliased: |diff| %g at %zu", t->label, d, at);
    /* add: exact (one f32 addition each). */
    CHECK_EQ_INT(be->ops->add(be, du, dy, N, &err), 0);
    float s[N];
    to_host(t, s, du, sizeof s);
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= s[i] == u[i] + y[i];
    CHECK_MSG(exact, "%s add differs", t->label);
    rel(t, dg);
    rel(t, du);
    rel(t, dy);
}

static void test_embed_get_rows(tctx *t) {
    backend *be = t->be;
    st_err err = {{0}};
    enum { R = 10, C = 64, T = 6 };
    const int64_t row0 = 5;
    const int32_t ids[T] = {5, 14, 4, 15, 9, 0}; /* local rows 0, 9, -, -, 4, - */
    float src[R * C], out[T * C];
    fill(src, R * C, 1.5f);
    for (size_t i = 0; i < N_WTYPES; i++) {
        float *deq;
        uint8_t *tab = encode(wtypes[i], src, R, C, &deq);
        backend_weight w = {0};
        REQUIRE(be->ops->weight_upload(be, &w, wtypes[i], R, C, tab, &err) == 0);
        float *dout = dev_from(t, NULL, sizeof out);
        CHECK_EQ_INT(be->ops->embed(be, dout, &w, ids, T, row0, &err), 0);
        to_host(t, out, dout, sizeof out);
        int exact = 1;
        for (int tt = 0; tt < T; tt++) {
            int64_t r = ids[tt] - row0;
            for (int j = 0; j < C; j++) exact &= out[tt * C + j] == ((r >= 0 && r < R) ? deq[r * C + j] : 0.0f);
        }
        CHECK_MSG(exact, "%s embed %s differs", t->label, ggml_type_name(wtypes[i]));
        be->ops->weight_free(be, &w);
        rel(t, dout);
        free(tab);
        free(deq);
    }
    /* get_rows: exact copies. */
    enum { SR = 6, SN = 37 };
    const int32_t rows[3] = {5, 0, 3};
    float s[SR * SN], g[3 * SN];
    fill(s, SR * SN, 1.0f);
    float *ds = dev_from(t, s, sizeof s), *dg = dev_from(t, NULL, sizeof g);
    CHECK_EQ_INT(be->ops->get_rows(be, dg, ds, rows, 3, SN, &err), 0);
    to_host(t, g, dg, sizeof g);
    int exact = 1;
    for (int i = 0; i < 3; i++) exact &= memcmp(g + i * SN, s + rows[i] * SN, SN * sizeof(float)) == 0;
    CHECK_MSG(exact, "%s get_rows differs", t->label);
    rel(t, ds);
    rel(t, dg);
}

/* ---------------------------------------------------------------- KV + attention */

typedef struct attn_cfg {
    int n_head, n_head_kv, head_dim;
    uint32_t kv_type;
} attn_cfg;

static float kv_round(uint32_t ty, float v) { return ty == GGML_TYPE_F16 ? st_fp16_to_f32(st_f32_to_fp16(v)) : v; }

static void attn_case(tctx *t, const attn_cfg *cf) {
    backend *be = t->be;
    st_err err = {{0}};
    enum { BS = 4, NBLK = 12, NSEQ = 2 };
    const int hd = cf->head_dim, kvd = cf->n_head_kv * hd, qd = cf->n_head * hd;
    const int64_t n_slots = NBLK * BS;
    const int32_t bt0[5] = {5, 2, 9, 0, 7}, bt1[3] = {1, 11, 3};
    const int32_t *bts[NSEQ] = {bt0, bt1};
    const int nbt[NSEQ] = {5, 3};
    const int hist[NSEQ] = {15, 9}; /* positions already cached */
    const int newt[NSEQ] = {3, 1};  /* tokens of this batch */
    const size_t esz = cf->kv_type == GGML_TYPE_F16 ? 2 : 4;
    void *kc = dev_from(t, NULL, (size_t)n_slots * kvd * esz), *vc = dev_from(t, NULL, (size_t)n_slots * kvd * esz);
    /* Host copy of every position's K/V (as stored). */
    float *K[NSEQ], *V[NSEQ];
    for (int sq = 0; sq < NSEQ; sq++) {
        const int np = hist[sq] + newt[sq];
        K[sq] = xmalloc((size_t)np * kvd * sizeof(float));
        V[sq] = xmalloc((size_t)np * kvd * sizeof(float));
        fill(K[sq], (size_t)np * kvd, 1.0f);
        fill(V[sq], (size_t)np * kvd, 1.0f);
    }
    /* History, one kv_store per sequence. */
    for (int sq = 0; sq < NSEQ; sq++) {
        int32_t slots[16];
        for (int p = 0; p < hist[sq]; p++) slots[p] = bts[sq][p / BS] * BS + p % BS;
        float *dk = dev_from(t, K[sq], (size_t)hist[sq] * kvd * 4), *dv = dev_from(t, V[sq], (size_t)hist[sq] * kvd * 4);
        CHECK_EQ_INT(be->ops->kv_store(be, kc, vc, cf->kv_type, dk, dv, hist[sq], kvd, slots, n_slots, &err), 0);
        rel(t, dk);
        rel(t, dv);
    }
    /* The batch: seq 0's 3 tokens then seq 1's 1 token. */
    const int T = newt[0] + newt[1];
    float *bk = xmalloc((size_t)T * kvd * 4), *bv = xmalloc((size_t)T * kvd * 4), *q = xmalloc((size_t)T * qd * 4);
    int32_t slots[4];
    backend_attn_seq aseqs[NSEQ];
    int row = 0;
    for (int sq = 0; sq < NSEQ; sq++) {
        aseqs[sq] = (backend_attn_seq){.tok0 = row, .n_tokens = newt[sq], .pos0 = hist[sq],
                                       .block_table = bts[sq], .n_blocks = nbt[sq]};
        for (int i = 0; i < newt[sq]; i++, row++) {
            const int p = hist[sq] + i;
            slots[row] = bts[sq][p / BS] * BS + p % BS;
            memcpy(bk + (size_t)row * kvd, K[sq] + (size_t)p * kvd, (size_t)kvd * 4);
            memcpy(bv + (size_t)row * kvd, V[sq] + (size_t)p * kvd, (size_t)kvd * 4);
        }
    }
    fill(q, (size_t)T * qd, 1.0f);
    float *dk = dev_from(t, bk, (size_t)T * kvd * 4), *dv = dev_from(t, bv, (size_t)T * kvd * 4);
    float *dq = dev_from(t, q, (size_t)T * qd * 4), *dout = dev_from(t, NULL, (size_t)T * qd * 4);
    CHECK_EQ_INT(be->ops->kv_store(be, kc, vc, cf->kv_type, dk, dv, T, kvd, slots, n_slots, &err), 0);

    /* kv_store wrote exactly the (rounded) rows at their slots. */
    uint8_t *hk = xmalloc((size_t)n_slots * kvd * esz);
    to_host(t, hk, kc, (size_t)n_slots * kvd * esz);
    int exact = 1;
    for (int sq = 0; sq < NSEQ; sq++)
        for (int p = 0; p < hist[sq] + newt[sq]; p++) {
            const int64_t sl = bts[sq][p / BS] * BS + p % BS;
            for (int i = 0; i < kvd; i++) {
                const float want = K[sq][(size_t)p * kvd + i];
                if (cf->kv_type == GGML_TYPE_F16) {
                    uint16_t h;
                    memcpy(&h, hk + ((size_t)sl * kvd + i) * 2, 2);
                    exact &= h == st_f32_to_fp16(want);
                } else {
                    float f;
                    memcpy(&f, hk + ((size_t)sl * kvd + i) * 4, 4);
                    exact &= f == want;
                }
            }
        }
    CHECK_MSG(exact, "%s kv_store %s: cache rows differ", t->label, ggml_type_name(cf->kv_type));
    free(hk);

    backend_attn a = {.n_head = cf->n_head, .n_head_kv = cf->n_head_kv, .head_dim = hd, .block_size = BS,
                      .n_cache_blocks = NBLK, .kv_type = cf->kv_type, .scale = 1.0f / sqrtf((float)hd),
                      .n_seqs = NSEQ, .seqs = aseqs};
    CHECK_EQ_INT(be->ops->attention(be, dout, dq, kc, vc, &a, &err), 0);
    float *out = xmalloc((size_t)T * qd * 4);
    to_host(t, out, dout, (size_t)T * qd * 4);
    double *ref = xmalloc((size_t)T * qd * sizeof(double)), *sc = xmalloc(64 * sizeof(double));
    row = 0;
    for (int sq = 0; sq < NSEQ; sq++)
        for (int i = 0; i < newt[sq]; i++, row++) {
            const int np = hist[sq] + i + 1;
            for (int h = 0; h < cf->n_head; h++) {
                const int kvh = h / (cf->n_head / cf->n_head_kv);
                double mx = -INFINITY, sum = 0;
                for (int p = 0; p < np; p++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)q[(size_t)row * qd + h * hd + e] *
                             kv_round(cf->kv_type, K[sq][(size_t)p * kvd + kvh * hd + e]);
                    sc[p] = d * a.scale;
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p < np; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int p = 0; p < np; p++) o += sc[p] / sum * kv_round(cf->kv_type, V[sq][(size_t)p * kvd + kvh * hd + e]);
                    ref[(size_t)row * qd + h * hd + e] = o;
                }
            }
        }
    size_t at;
    const double tol = cf->kv_type == GGML_TYPE_F16 ? 3e-3 : 2e-5;
    double d = max_diff(out, ref, (size_t)T * qd, &at);
    CHECK_MSG(d <= tol, "%s attention %s heads %d/%d hd %d: |diff| %g at %zu", t->label,
              ggml_type_name(cf->kv_type), cf->n_head, cf->n_head_kv, hd, d, at);

    /* Bad arguments: a slot outside the cache, a block id outside it, a short table. */
    err.msg[0] = 0;
    int32_t bad_slot[4] = {0, 1, (int32_t)n_slots, 2};
    CHECK_EQ_INT(be->ops->kv_store(be, kc, vc, cf->kv_type, dk, dv, T, kvd, bad_slot, n_slots, &err), -1);
    CHECK(err.msg[0] != 0);
    const int32_t bad_bt[5] = {5, 2, NBLK, 0, 7};
    backend_attn_seq s2[NSEQ] = {aseqs[0], aseqs[1]};
    s2[0].block_table = bad_bt;
    backend_attn a2 = a;
    a2.seqs = s2;
    CHECK_EQ_INT(be->ops->attention(be, dout, dq, kc, vc, &a2, &err), -1);
    s2[0].block_table = bt0;
    s2[0].n_blocks = 4; /* positions up to 17 need 5 blocks of 4 */
    CHECK_EQ_INT(be->ops->attention(be, dout, dq, kc, vc, &a2, &err), -1);

    for (int sq = 0; sq < NSEQ; sq++) {
        free(K[sq]);
        free(V[sq]);
    }
    free(bk);
    free(bv);
    free(q);
    free(out);
    free(ref);
    free(sc);
    rel(t, dk);
    rel(t, dv);
    rel(t, dq);
    rel(t, dout);
    rel(t, kc);
    rel(t, vc);
}

static void test_attention(tctx *t) {
    const attn_cfg cfgs[] = {
        {4, 2, 16, GGML_TYPE_F32}, {4, 2, 16, GGML_TYPE_F16},  /* GQA 2 */
        {2, 1, 40, GGML_TYPE_F32}, {3, 3, 40, GGML_TYPE_F16},  /* head_dim not a multiple of 32 */
        {8, 2, 128, GGML_TYPE_F16},                            /* a real head size */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) attn_case(t, &cfgs[i]);
}

/* ---------------------------------------------------------------- all_reduce */

static void test_all_reduce(tctx *t) {
    backend *be = t->be;
    st_err err = {{0}};
    float h[300], back[300];
    fill(h, 300, 1.0f);
    float *d = dev_from(t, h, sizeof h);
    const uint64_t calls = t->c->stats.all_reduce_calls;
    CHECK_MSG(be->ops->all_reduce(be, t->c, d, 300, &err) == 0, "%s all_reduce: %s", t->label, err.msg);
    CHECK_EQ_INT(t->c->stats.all_reduce_calls, calls + 1);
    to_host(t, back, d, sizeof back);
    CHECK_MSG(memcmp(back, h, sizeof h) == 0, "%s all_reduce over one rank changed the buffer", t->label);
    rel(t, d);
}

static void run_all(tctx *t, int big) {
    const size_t b0 = t->be->ops->buf_bytes(t->be), w0 = t->be->ops->weight_bytes(t->be);
    test_memory(t);
    test_matmul(t, 2e-5, 2e-5, big);
    test_rmsnorm(t);
    test_rope(t);
    test_elementwise(t);
    test_embed_get_rows(t);
    test_attention(t);
    test_all_reduce(t);
    /* Every test released what it took. */
    CHECK_EQ_INT(t->be->ops->buf_bytes(t->be), b0);
    CHECK_EQ_INT(t->be->ops->weight_bytes(t->be), w0);
}

int main(int argc, char **argv) {
    /* "cuda": the CUDA backend alone, skipped (77) without a device. */
    const bool cuda_only = argc > 1 && strcmp(argv[1], "cuda") == 0;
    st_err err = {{0}};
    if (!cuda_only) {
        test_simd_level_or_skip();
        /* CPU backend: 2 threads, one-rank shared-memory group. */
        backend *be = backend_cpu_new(2, &err);
        REQUIRE_MSG(be, "%s", err.msg);
        comm_cpu_group *g = comm_cpu_group_new(1, &err);
        REQUIRE_MSG(g, "%s", err.msg);
        tctx t = {.be = be, .c = comm_cpu_rank(g, 0), .label = "cpu"};
        CHECK_EQ_STR(be->ops->name, "cpu");
        run_all(&t, 0);
        comm_cpu_group_free(g);
        backend_free(be);
#ifdef STRATA_HAVE_CUDA
        /* Without a device, asking for one is a clean error. */
        if (backend_cuda_device_count() == 0) {
            backend *none = backend_cuda_new(0, &err);
            CHECK(none == NULL);
            CHECK(strstr(err.msg, "does not exist") != NULL);
        }
#endif
        return test_summary();
    }
#ifdef STRATA_HAVE_CUDA
    const int n_dev = backend_cuda_device_count();
    if (n_dev == 0) {
        printf("SKIP: test_backend_ops cuda: no CUDA device\n");
        return 77;
    }
    test_meta_reuse();
    {
        comm_nccl_group *g = comm_nccl_group_new(1, &err);
        REQUIRE_MSG(g, "%s", err.msg);
        backend *be = backend_cuda_new(0, &err);
        REQUIRE_MSG(be, "%s", err.msg);
        CHECK_EQ_STR(be->ops->name, "cuda");
        tctx t = {.be = be, .c = comm_nccl_rank(g, 0), .label = "cuda"};
        REQUIRE(backend_cuda_set_half_gemm(be, 0, &err) == 0);
        run_all(&t, 1);
        /* F16/BF16 prefill through GemmEx: activations rounded to the weight
         * type (bf16: 8-bit mantissa), so a looser tolerance. */
        REQUIRE(backend_cuda_set_half_gemm(be, 1, &err) == 0);
        t.label = "cuda half-gemm";
        test_matmul(&t, 2e-5, 1e-2, 0);
        printf("test_backend_ops: CUDA backend exercised on %d device(s); scratch %zu bytes\n", n_dev,
               backend_cuda_scratch_bytes(be));
        backend_free(be);
        comm_nccl_group_free(g);
    }
#else
    printf("SKIP: test_backend_ops cuda: built without CUDA (STRATA_CUDA off)\n");
    return 77;
#endif
    return test_summary();
}
