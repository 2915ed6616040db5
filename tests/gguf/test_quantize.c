/* test_quantize.c — model/quantize.h: ggml's reference Q8_0/Q4_0 quantizers on
 * hand-made blocks (exact bytes: roundf ties, all-zero blocks, negative max,
 * first-of-equal max, the MIN(15) clamp, inexact scales), the per-block error
 * bounds on random data, and quantize_file on synth models (F32/F16/BF16
 * sources, kept shapes, identity copy, requantizing refused or allowed,
 * metadata, order, alignment, non-finite values, split files, bad paths, no
 * partial output). Finally stories260K is quantized to q8_0 and q4_0 by the
 * strata-gguf binary (argv[1]) and the files are checked against the F32
 * original: types, shapes, sizes, exact bytes and the error bounds.
 *
 * The expected bytes of the hand-made blocks were derived by hand and checked
 * with a float32 emulation of ggml's code in Python (struct 'f'/'e' rounding).
 */
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dtype.h"
#include "model/gguf.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "tests/testutil.h"

static char tmpdir[256];
static const char *gguf_bin;

static const char *tmp_path(const char *name) {
    static char b[32][512];
    static int k;
    char *p = b[k++ % 32];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static void check_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    size_t bad = n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            bad = i;
            break;
        }
    CHECK_MSG(bad == n, "%s: byte %zu is 0x%02x, expected 0x%02x", what, bad,
              bad < n ? got[bad] : 0, bad < n ? want[bad] : 0);
}

/* ---- row quantizers on hand-made blocks ---- */

static void test_q8_0_blocks(void) {
    uint8_t out[4 * 34];
    /* d = 127/127 = 1, id = 1: q = roundf(x), ties away from zero. */
    float a[32] = {127, 2.5f, -2.5f, 0.5f, -0.5f, 1.4999999f, 126.5f, -127, 3.5f, -0.49f, 64,
                   -100.25f};
    const uint8_t want_a[34] = {0x00, 0x3c, /* fp16 1.0 */
                                0x7f, 0x03, 0xfd, 0x01, 0xff, 0x01, 0x7f, 0x81, 0x04, 0x00,
                                0x40, 0x9c};
    /* d = 254/127 = 2, id = 0.5: 5 * 0.5 = 2.5 -> 3, 3 * 0.5 = 1.5 -> 2, 1 * 0.5 -> 1. */
    float c[32] = {-254, 5, -5, 1, 3, -1, 0.9f};
    const uint8_t want_c[34] = {0x00, 0x40, 0x81, 0x03, 0xfd, 0x01, 0x02, 0xff};
    /* all zero: d = 0, id = 0, every q 0. */
    float z[32] = {0};
    const uint8_t want_z[34] = {0};
    /* x[j] = (j - 16) / 10: amax 1.6, d = 0.012598 (fp16 0x2273), inexact. */
    float e[32];
    for (int j = 0; j < 32; j++) e[j] = (float)(j - 16) / 10.0f;
    const uint8_t want_e[34] = {0x73, 0x22, 0x81, 0x89, 0x91, 0x99, 0xa1, 0xa9, 0xb1, 0xb9, 0xc0,
                                0xc8, 0xd0, 0xd8, 0xe0, 0xe8, 0xf0, 0xf8, 0x00, 0x08, 0x10, 0x18,
                                0x20, 0x28, 0x30, 0x38, 0x40, 0x47, 0x4f, 0x57, 0x5f, 0x67, 0x6f,
                                0x77};
    float row[128];
    memcpy(row, a, sizeof a), memcpy(row + 32, c, sizeof c), memcpy(row + 64, z, sizeof z),
        memcpy(row + 96, e, sizeof e);
    memset(out, 0xaa, sizeof out);
    st_quantize_row_q8_0(row, out, 128); /* four blocks in one row */
    check_bytes("q8_0 d=1 (ties)", out, want_a, 34);
    check_bytes("q8_0 d=2 (scaled ties)", out + 34, want_c, 34);
    check_bytes("q8_0 all zero", out + 68, want_z, 34);
    check_bytes("q8_0 inexact", out + 102, want_e, 34);
    uint8_t one[34];
    CHECK(st_quantize_row(GGML_TYPE_Q8_0, e, one, 32) == 0);
    check_bytes("st_quantize_row q8_0", one, want_e, 34);
    /* dequantized: d * q */
    float deq[32];
    REQUIRE(st_dequant_row(GGML_TYPE_Q8_0, out, deq, 32) == 0);
    CHECK(deq[0] == 127 && deq[1] == 3 && deq[2] == -3 && deq[3] == 1 && deq[9] == 0);
}

static void test_q4_0_blocks(void) {
    uint8_t out[5 * 18];
    /* max = -8 (negative): d = 1, id = 1, q = MIN(15, (int8_t)(x + 8.5)).
     * Byte j holds q[j] (low nibble) and q[j + 16] (high nibble). */
    float a[32] = {-8, 7, 0, -0.5f, 0.5f, -1.5f, 2.4f, -7.9f, 6.5f, 1.5f};
    a[16] = -3, a[17] = 3, a[18] = -2.5f, a[19] = 2.5f;
    const uint8_t want_a[18] = {0x00, 0x3c, 0x50, 0xbf, 0x68, 0xb8, 0x89, 0x87, 0x8a,
                                0x80, 0x8f, 0x8a, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    /* max = +8: d = -1 (fp16 0xbc00), id = -1. x = -8 gives 16.5 -> 16, clamped
     * to 15 (and -7.5 -> 16 -> 15, -7.9 -> 16.4 -> 15). */
    float b[32] = {8, -8, -7.5f, -7.4f, 1, -1, 0.5f, -0.5f};
    b[16] = 4, b[17] = -7.9f;
    const uint8_t want_b[18] = {0x00, 0xbc, 0x40, 0xff, 0x8f, 0x8f, 0x87, 0x89, 0x88,
                                0x89, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    /* |4| == |-4|: the first (4) is max, so d = -0.5 (0xb800), id = -2, and -4
     * is the clamped one. */
    float c[32] = {0};
    c[3] = 4, c[9] = -4, c[0] = 1, c[20] = -1.25f;
    const uint8_t want_c[18] = {0x00, 0xb8, 0x86, 0x88, 0x88, 0x80, 0xb8, 0x88, 0x88,
                                0x88, 0x88, 0x8f, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    /* all zero: d = 0 / -8 = -0.0 (fp16 0x8000), id = 0, every q 8. */
    float z[32] = {0};
    const uint8_t want_z[18] = {0x00, 0x80, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
                                0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    /* x[j] = (j - 16) / 10: max = x[0] = -1.6, d = 0.2 (fp16 0x3266), id = 5. */
    float e[32];
    for (int j = 0; j < 32; j++) e[j] = (float)(j - 16) / 10.0f;
    const uint8_t want_e[18] = {0x66, 0x32, 0x80, 0x91, 0x91, 0xa2, 0xa2, 0xb3, 0xb3,
                                0xc4, 0xc4, 0xd5, 0xd5, 0xe6, 0xe6, 0xf7, 0xf7, 0xf8};
    float row[160];
    memcpy(row, a, sizeof a), memcpy(row + 32, b, sizeof b), memcpy(row + 64, c, sizeof c),
        memcpy(row + 96, z, sizeof z), memcpy(row + 128, e, sizeof e);
    memset(out, 0xaa, sizeof out);
    st_quantize_row_q4_0(row, out, 160);
    check_bytes("q4_0 negative max", out, want_a, 18);
    check_bytes("q4_0 positive max, clamp", out + 18, want_b, 18);
    check_bytes("q4_0 first of equal |max|", out + 36, want_c, 18);
    check_bytes("q4_0 all zero", out + 54, want_z, 18);
    check_bytes("q4_0 inexact", out + 72, want_e, 18);
    uint8_t one[18];
    CHECK(st_quantize_row(GGML_TYPE_Q4_0, e, one, 32) == 0);
    check_bytes("st_quantize_row q4_0", one, want_e, 18);
    float deq[32];
    REQUIRE(st_dequant_row(GGML_TYPE_Q4_0, out + 18, deq, 32) == 0);
    CHECK(deq[0] == 8 && deq[1] == -7 && deq[16] == 4 && deq[17] == -7); /* -8 -> -7: clamp */
    /* dispatch refuses other types and partial blocks */
    CHECK(st_quantize_row(GGML_TYPE_F16, e, one, 32) == -1);
    CHECK(st_quantize_row(GGML_TYPE_Q8_0, e, one, 31) == -1);
    CHECK_EQ_INT(st_llama_ftype(GGML_TYPE_Q8_0), 7);
    CHECK_EQ_INT(st_llama_ftype(GGML_TYPE_Q4_0), 2);
    CHECK_EQ_INT(st_llama_ftype(GGML_TYPE_Q6_K), -1);
}

/* ---- error bounds ---- */

/* Bound on |x - deq| for element i of a 32-block, from the F32 block x and
 * the stored fp16 scale D. With d the unrounded scale and y = x / d:
 *  Q8_0: d = amax / 127, q = roundf(y) is y's nearest integer: |x - d q| <= |d|/2.
 *  Q4_0: d = max / -8, |y| <= 8; q - 8 = floor(y + 0.5) is y's nearest integer
 *        (|x - d (q-8)| <= |d|/2) unless y >= 7.5, where MIN(15) clamps q - 8 to
 *        7: |x - 7d| = |d| (y - 7) <= |d| (only values of the sign opposite to
 *        max, within 1/16 of |max|).
 * Storing D = fp16(d) adds |D - d| |q| (|q| <= 127, resp. |q - 8| <= 8), and
 * float rounding of 1/d and x * id a few ulps of amax. *clamped is set for the
 * Q4_0 clamp case. */
static double bound(uint32_t type, const float *x, int i, float D, int *clamped) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    double slack = 4e-7 * amax;
    *clamped = 0;
    if (type == GGML_TYPE_Q8_0) {
        double d = amax / 127.0;
        return d / 2 + fabs(D - d) * 127 + slack;
    }
    double d = max / -8.0;
    if (d == 0) return slack;
    double y = x[i] / d;
    if (y >= 7.5 - 1e-6) {
        *clamped = 1;
        return fabs(d) + fabs(D - d) * 8 + slack;
    }
    return fabs(d) / 2 + fabs(D - d) * 8 + slack;
}

static float scale_of(const uint8_t *block) {
    return st_fp16_to_f32((uint16_t)(block[0] | block[1] << 8));
}

/* Checks a quantized row against its f32 source; returns the number of
 * elements out of bound; counts clamped elements and the worst error / bound. */
static int64_t check_row(uint32_t type, const float *x, const uint8_t *q, int64_t n,
                         int64_t *n_clamped, double *worst) {
    float deq[32];
    int64_t bad = 0;
    size_t bb = ggml_row_bytes(type, 32);
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = q + b * bb;
        REQUIRE(st_dequant_row(type, blk, deq, 32) == 0);
        float D = scale_of(blk);
        for (int i = 0; i < 32; i++) {
            int cl;
            double bd = bound(type, x + b * 32, i, D, &cl);
            double e = fabs((double)x[b * 32 + i] - deq[i]);
            if (!(e <= bd)) bad++;
            if (bd > 0 && e / bd > *worst) *worst = e / bd;
            *n_clamped += cl;
        }
    }
    return bad;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_bounds_random(void) {
    enum { N = 32 * 4000 };
    float *x = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * 2);
    REQUIRE(x && q);
    for (int b = 0; b < N / 32; b++) {
        /* varied scales, down to fp16-subnormal Q8_0 scales (1e-3 / 127) */
        float s = b % 7 == 0 ? 1e-3f : b % 7 == 1 ? 100.0f : 1.0f;
        for (int i = 0; i < 32; i++) x[b * 32 + i] = frand() * s;
        if (b % 13 == 0) { /* Q4_0 clamp: max = +s, and -0.97 s gives y = 7.76 */
            x[b * 32 + 3] = s;
            x[b * 32 + 17] = -0.97f * s;
        }
    }
    const uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (int k = 0; k < 2; k++) {
        int64_t cl = 0;
        double worst = 0;
        REQUIRE(st_quantize_row(types[k], x, q, N) == 0);
        int64_t bad = check_row(types[k], x, q, N, &cl, &worst);
        CHECK_MSG(bad == 0, "%s: %lld of %d random values outside the bound",
                  ggml_type_name(types[k]), (long long)bad, N);
        if (types[k] == GGML_TYPE_Q4_0) CHECK(cl > 0);
        fprintf(stderr, "random %s: worst error / bound %.3f, %lld clamped\n",
                ggml_type_name(types[k]), worst, (long long)cl);
    }
    free(x);
    free(q);
}

/* ---- quantize_file ---- */

static int n_notices;
static char last_notice[512];
static void on_notice(void *ctx, const char *msg) {
    (void)ctx;
    n_notices++;
    snprintf(last_notice, sizeof last_notice, "%s", msg);
}

static void synth_model(const char *path, uint32_t dtype, int64_t n_ff) {
    synth_params p;
    synth_params_default(&p);
    p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.n_ff = n_ff;
    p.n_vocab = 300, p.dtype = dtype, p.seed = 7;
    st_err err;
    REQUIRE_MSG(synth_write(&p, path, &err) == 0, "%s", err.msg);
}

static int same_kv(const gguf_kv *a, const gguf_kv *b) {
    return a->key.len == b->key.len && memcmp(a->key.data, b->key.data, a->key.len) == 0 &&
           a->type == b->type && a->raw_len == b->raw_len &&
           memcmp(a->raw, b->raw, a->raw_len) == 0;
}

static uint32_t get_u32(const gguf_file *f, const char *key) {
    uint32_t v = 0xdeadbeef;
    gguf_get_u32(f, key, &v, NULL);
    return v;
}

/* Checks OUT against IN quantized to `type`: metadata (copied in order, then
 * quantization_version and file_type), tensor order, names, shapes, alignment,
 * and every tensor's bytes (quantized ones equal st_quantize_row of the f32
 * source rows, others equal the source). */
static void check_quantized(const char *in, const char *out, uint32_t type) {
    st_err err;
    gguf_file *a = gguf_open(in, &err);
    REQUIRE_MSG(a, "%s", err.msg);
    gguf_file *b = gguf_open(out, &err);
    REQUIRE_MSG(b, "%s", err.msg);
    CHECK_EQ_INT(gguf_alignment(b), gguf_alignment(a));
    int64_t j = 0;
    for (int64_t i = 0; i < gguf_n_kv(a); i++) {
        const gguf_kv *kv = gguf_kv_at(a, i);
        if (kv->key.len == 17 && memcmp(kv->key.data, "general.file_type", 17) == 0) continue;
        if (kv->key.len == 28 && memcmp(kv->key.data, "general.quantization_version", 28) == 0)
            continue;
        CHECK_MSG(j < gguf_n_kv(b) && same_kv(kv, gguf_kv_at(b, j)), "key %.*s not copied at %lld",
                  (int)kv->key.len, kv->key.data, (long long)j);
        j++;
    }
    CHECK_EQ_INT(gguf_n_kv(b), j + 2);
    const gguf_kv *qv = gguf_kv_at(b, j), *ft = gguf_kv_at(b, j + 1);
    CHECK(qv && qv->key.len == 28 && memcmp(qv->key.data, "general.quantization_version", 28) == 0);
    CHECK(ft && ft->key.len == 17 && memcmp(ft->key.data, "general.file_type", 17) == 0);
    CHECK_EQ_INT(get_u32(b, "general.quantization_version"), 2);
    CHECK_EQ_INT(get_u32(b, "general.file_type"), type == GGML_TYPE_Q8_0 ? 7 : 2);

    CHECK_EQ_INT(gguf_n_tensors(b), gguf_n_tensors(a));
    for (int64_t i = 0; i < gguf_n_tensors(a) && i < gguf_n_tensors(b); i++) {
        const gguf_tensor *s = gguf_tensor_at(a, i), *t = gguf_tensor_at(b, i);
        char nm[128];
        snprintf(nm, sizeof nm, "%.*s", (int)s->name.len, s->name.data);
        CHECK_MSG(s->name.len == t->name.len &&
                      memcmp(s->name.data, t->name.data, s->name.len) == 0,
                  "tensor %lld: %s renamed or moved", (long long)i, nm);
        CHECK_EQ_INT(t->n_dims, s->n_dims);
        for (int d = 0; d < GGUF_MAX_DIMS; d++) CHECK_EQ_INT(t->ne[d], s->ne[d]);
        CHECK_EQ_INT(t->offset % gguf_alignment(b), 0);
        int quant = quantize_eligible(s->name.data, s->name.len, s->n_dims) && s->ne[0] % 32 == 0;
        uint32_t want = quant ? type : s->type;
        CHECK_MSG(t->type == want, "%s: type %s, expected %s", nm, gguf_tensor_type_name(t->type),
                  gguf_tensor_type_name(want));
        if (!quant || s->type == type) {
            CHECK_MSG(t->nbytes == s->nbytes && memcmp(t->data, s->data, s->nbytes) == 0,
                      "%s: not copied unchanged", nm);
            continue;
        }
        int64_t n = s->ne[0], rows = gguf_tensor_nrows(s);
        size_t rb = ggml_row_bytes(type, n);
        float *x = malloc((size_t)n * sizeof(float));
        uint8_t *q = malloc(rb);
        int64_t bad_rows = 0;
        for (int64_t r = 0; r < rows; r++) {
            REQUIRE(gguf_tensor_rows_f32(s, r, 1, x, &err) == 0);
            st_quantize_row(type, x, q, n);
            if (memcmp(q, (const uint8_t *)t->data + (size_t)r * rb, rb) != 0) bad_rows++;
        }
        CHECK_MSG(bad_rows == 0, "%s: %lld rows differ from st_quantize_row", nm,
                  (long long)bad_rows);
        free(x);
        free(q);
    }
    gguf_close(a);
    gguf_close(b);
}

static void test_sources(void) {
    /* F16 and BF16 sources, n_ff 80: ffn_down (rows of 80) is kept. */
    const uint32_t src[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16};
    const uint32_t dst[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 2; d++) {
            const char *in = tmp_path("src.gguf"), *out = tmp_path("out.gguf");
            synth_model(in, src[s], 80);
            quantize_params p = {.type = dst[d], .notice = on_notice};
            quantize_stats st;
            st_err err;
            n_notices = 0;
            REQUIRE_MSG(quantize_file(in, out, &p, &st, &err) == 0, "%s", err.msg);
            check_quantized(in, out, dst[d]);
            /* 3 + 9*2 tensors: 5 norms copied, 2 ffn_down kept, 14 quantized */
            CHECK_EQ_INT(st.n_tensors, 21);
            CHECK_EQ_INT(st.n_copied, 5);
            CHECK_EQ_INT(st.n_kept, 2);
            CHECK_EQ_INT(st.n_quantized, 14);
            CHECK_EQ_INT(st.n_same, 0);
            CHECK_EQ_INT(n_notices, 2);
            CHECK_MSG(strstr(last_notice, "blk.1.ffn_down.weight: row length 80 is not a multiple "
                                          "of 32; kept as ") != NULL, "%s", last_notice);
            CHECK(!exists(tmp_path("out.gguf.tmp")));
            unlink(in), unlink(out);
        }
}

static void test_requantize(void) {
    const char *in = tmp_path("q8.gguf"), *out = tmp_path("rq.gguf"), *out2 = tmp_path("rq2.gguf");
    synth_model(in, GGML_TYPE_Q8_0, 96);
    st_err err;
    quantize_stats st;
    /* q8_0 -> q8_0: an identity copy of the weights */
    quantize_params p = {.type = GGML_TYPE_Q8_0};
    REQUIRE_MSG(quantize_file(in, out, &p, &st, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(st.n_same, 16);
    CHECK_EQ_INT(st.n_quantized, 0);
    check_quantized(in, out, GGML_TYPE_Q8_0);
    unlink(out);
    /* q8_0 -> q4_0: refused without allow_requantize, and nothing is written */
    p.type = GGML_TYPE_Q4_0;
    CHECK(quantize_file(in, out, &p, &st, &err) == -1);
    CHECK_MSG(strstr(err.msg, "tensor 'token_embd.weight' is already q8_0; requantizing it to q4_0 "
                              "is disabled") != NULL, "%s", err.msg);
    CHECK(!exists(out) && !exists(tmp_path("rq.gguf.tmp")));
    /* allowed: dequantized to f32, then quantized (check_quantized compares with
     * st_quantize_row of the dequantized rows) */
    p.allow_requantize = true;
    REQUIRE_MSG(quantize_file(in, out, &p, &st, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(st.n_quantized, 16);
    check_quantized(in, out, GGML_TYPE_Q4_0);
    /* q4_0 -> q4_0 again: unchanged bytes */
    p.allow_requantize = false;
    REQUIRE_MSG(quantize_file(out, out2, &p, &st, &err) == 0, "%s", err.msg);
    size_t na, nb;
    char *x = test_read_file(out, &na), *y = test_read_file(out2, &nb);
    CHECK(na == nb && memcmp(x, y, na) == 0); /* same keys (file_type already last), same data */
    free(x), free(y);
    unlink(in), unlink(out), unlink(out2);
}

/* A hand-made model: an 8-element norm and a 2-D weight of 64 x 2 F32 values, optional alignment
 * and split.count. */
static void small_model(const char *path, const float *w, uint32_t align, uint32_t split) {
    gguf_writer *wr = gguf_writer_new();
    st_err err;
    REQUIRE(wr);
    REQUIRE(gguf_writer_set_str(wr, "general.architecture", "llama", &err) == 0);
    if (align) REQUIRE(gguf_writer_set_u32(wr, "general.alignment", align, &err) == 0);
    if (split) REQUIRE(gguf_writer_set_u32(wr, "split.count", split, &err) == 0);
    REQUIRE(gguf_writer_set_u32(wr, "general.file_type", 0, &err) == 0);
    const int64_t ne[2] = {64, 2}, ne1[1] = {8};
    float norm[8];
    for (int i = 0; i < 8; i++) norm[i] = 1;
    REQUIRE(gguf_writer_add_tensor(wr, "blk.0.attn_norm.weight", GGML_TYPE_F32, 1, ne1, norm,
                                   sizeof norm, &err) == 0);
    REQUIRE(gguf_writer_add_tensor(wr, "blk.0.attn_q.weight", GGML_TYPE_F32, 2, ne, w,
                                   128 * sizeof(float), &err) == 0);
    REQUIRE_MSG(gguf_writer_write(wr, path, &err) == 0, "%s", err.msg);
    gguf_writer_free(wr);
}

static void test_errors(void) {
    const char *in = tmp_path("small.gguf"), *out = tmp_path("small-q.gguf");
    float w[128];
    for (int i = 0; i < 128; i++) w[i] = frand();
    st_err err;
    quantize_params p = {.type = GGML_TYPE_Q8_0};

    /* alignment 64 is kept; general.file_type moves to the end */
    small_model(in, w, 64, 0);
    REQUIRE_MSG(quantize_file(in, out, &p, NULL, &err) == 0, "%s", err.msg);
    check_quantized(in, out, GGML_TYPE_Q8_0);
    gguf_file *f = gguf_open(out, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_tensor_at(f, 1)->offset, 64); /* the 32-byte norm, padded to 64 */
    gguf_close(f);

    /* a NaN: refused, and an existing OUT is left as it was */
    FILE *o = fopen(out, "w");
    REQUIRE(o);
    fputs("old", o);
    fclose(o);
    w[70] = NAN;
    small_model(in, w, 0, 0);
    CHECK(quantize_file(in, out, &p, NULL, &err) == -1);
    CHECK_MSG(strstr(err.msg, "tensor 'blk.0.attn_q.weight': element 6 of row 1 is nan; cannot "
                              "quantize") != NULL, "%s", err.msg);
    size_t n;
    char *old = test_read_file(out, &n);
    CHECK(n == 3 && memcmp(old, "old", 3) == 0);
    free(old);
    CHECK(!exists(tmp_path("small-q.gguf.tmp")));
    w[70] = INFINITY;
    small_model(in, w, 0, 0);
    CHECK(quantize_file(in, out, &p, NULL, &err) == -1 && strstr(err.msg, "is inf"));
    /* a value whose Q8_0 scale overflows fp16 (1e10 / 127 > 65504) */
    w[70] = 1e10f;
    small_model(in, w, 0, 0);
    CHECK(quantize_file(in, out, &p, NULL, &err) == -1);
    CHECK_MSG(strstr(err.msg, "row 1, block 0: the q8_0 scale overflows f16") != NULL, "%s",
              err.msg);
    w[70] = 0.5f;

    /* one part of a split model */
    small_model(in, w, 0, 2);
    CHECK(quantize_file(in, out, &p, NULL, &err) == -1 && strstr(err.msg, "split model"));
    small_model(in, w, 0, 1); /* split.count 1 is a whole model */
    CHECK_MSG(quantize_file(in, out, &p, NULL, &err) == 0, "%s", err.msg);

    /* unreadable input, corrupt input, unwritable output, bad type */
    CHECK(quantize_file(tmp_path("missing.gguf"), out, &p, NULL, &err) == -1 &&
          strstr(err.msg, "missing.gguf"));
    size_t len;
    char *bytes = test_read_file(in, &len);
    o = fopen(tmp_path("trunc.gguf"), "wb");
    REQUIRE(o);
    fwrite(bytes, 1, len - 100, o);
    fclose(o);
    free(bytes);
    CHECK(quantize_file(tmp_path("trunc.gguf"), out, &p, NULL, &err) == -1 &&
          strstr(err.msg, "trunc.gguf"));
    CHECK(quantize_file(in, tmp_path("no/such/dir/x.gguf"), &p, NULL, &err) == -1 &&
          strstr(err.msg, "cannot create"));
    p.type = GGML_TYPE_Q4_1;
    CHECK(quantize_file(in, out, &p, NULL, &err) == -1 && strstr(err.msg, "not supported"));
    unlink(in), unlink(out), unlink(tmp_path("trunc.gguf"));
}

static void test_eligible(void) {
#define E(name, nd) quantize_eligible(name, strlen(name), nd)
    CHECK(E("token_embd.weight", 2));
    CHECK(E("output.weight", 2));
    CHECK(E("blk.3.attn_q.weight", 2) && E("blk.3.attn_k.weight", 2));
    CHECK(E("blk.3.attn_v.weight", 2));
    CHECK(E("blk.3.attn_output.weight", 2) && E("blk.3.ffn_gate.weight", 2));
    CHECK(E("blk.3.ffn_up.weight", 2) && E("blk.3.ffn_down.weight", 2));
    CHECK(E("blk.0.ffn_down_exps.weight", 3)); /* experts: 3-D */
    CHECK(!E("output.weight", 1));
    CHECK(!E("blk.0.attn_norm.weight", 1) && !E("blk.0.attn_norm.weight", 2));
    CHECK(!E("blk.0.attn_q.bias", 2));
    CHECK(!E("blk.0.ffn_gate_inp.weight", 2));
    CHECK(!E("position_embd.weight", 2) && !E("token_types.weight", 2));
    CHECK(!E("blk.0.ssm_conv1d.weight", 2));
#undef E
}

/* ---- stories260K through the CLI ---- */

static int run_cli(const char *in, const char *out, const char *type) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl(gguf_bin, gguf_bin, "quantize", in, out, type, (char *)NULL);
        _exit(127);
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_stories(void) {
    const char *model = test_shared_path("models/stories260K.gguf");
    const struct {
        const char *name;
        uint32_t type;
        long size; /* measured: header + metadata + 32 quantized, 16 f32 tensors */
    } runs[] = {{"q8_0", GGML_TYPE_Q8_0, 489248}, {"q4_0", GGML_TYPE_Q4_0, 370720}};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "stories-%s.gguf", runs[k].name);
        const char *out = tmp_path(name), *lib = tmp_path("stories-lib.gguf");
        CHECK_EQ_INT(run_cli(model, out, runs[k].name), 0);
        struct stat sb;
        REQUIRE(stat(out, &sb) == 0);
        CHECK_EQ_INT(sb.st_size, runs[k].size);
        /* the library writes the same bytes */
        quantize_params p = {.type = runs[k].type};
        st_err err;
        REQUIRE_MSG(quantize_file(model, lib, &p, NULL, &err) == 0, "%s", err.msg);
        size_t na, nb;
        char *x = test_read_file(out, &na), *y = test_read_file(lib, &nb);
        CHECK(na == nb && memcmp(x, y, na) == 0);
        free(x), free(y);
        unlink(lib);

        check_quantized(model, out, runs[k].type);
        /* types, shapes and error bounds against the F32 original */
        gguf_file *a = gguf_open(model, &err), *b = gguf_open(out, &err);
        REQUIRE(a && b);
        int n_q = 0, n_f32 = 0;
        int64_t bad = 0, clamped = 0, checked = 0;
        double worst = 0;
        for (int64_t i = 0; i < gguf_n_tensors(b); i++) {
            const gguf_tensor *s = gguf_tensor_at(a, i), *t = gguf_tensor_at(b, i);
            char nm[128];
            snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.data);
            int is_down = strstr(nm, "ffn_down") != NULL, is_norm = strstr(nm, "_norm") != NULL;
            if (is_down || is_norm) { /* ffn_down: rows of 172; norms: 1-D */
                CHECK_MSG(t->type == GGML_TYPE_F32, "%s kept f32", nm);
                n_f32++;
                continue;
            }
            CHECK_MSG(t->type == runs[k].type, "%s is %s", nm, gguf_tensor_type_name(t->type));
            n_q++;
            int64_t n = s->ne[0];
            size_t rb = ggml_row_bytes(runs[k].type, n);
            for (int64_t r = 0; r < gguf_tensor_nrows(s); r++) {
                bad += check_row(runs[k].type, (const float *)s->data + r * n,
                                 (const uint8_t *)t->data + (size_t)r * rb, n, &clamped, &worst);
                checked += n;
            }
        }
        CHECK_EQ_INT(n_q, 32);
        CHECK_EQ_INT(n_f32, 16);
        CHECK_MSG(bad == 0, "stories260K %s: %lld of %lld values outside the bound", runs[k].name,
                  (long long)bad, (long long)checked);
        CHECK_EQ_INT(checked, 237056); /* 2 * 512*64 + 5 * (2 * 64*64 + 2 * 64*32 + 2 * 64*172) */
        fprintf(stderr, "stories260K %s: %lld values, worst error / bound %.3f, %lld clamped\n",
                runs[k].name, (long long)checked, worst, (long long)clamped);
        gguf_close(a);
        gguf_close(b);
        unlink(out);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_quantize STRATA_GGUF\n");
        return 2;
    }
    gguf_bin = argv[1];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/strata-test-quantize-XXXXXX");
    REQUIRE(mkdtemp(tmpdir) != NULL);
    test_q8_0_blocks();
    test_q4_0_blocks();
    test_bounds_random();
    test_eligible();
    test_sources();
    test_requantize();
    test_errors();
    test_stories();
    rmdir(tmpdir);
    return test_summary();
}
