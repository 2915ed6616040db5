/* test_gguf.c — the GGUF reader and writer: stories260K contents, both shared
 * vocabulary files, byte-exact writer round trip, dequantization against
 * hand-computed values, refusal of unloadable types, and each malformed-file
 * fault built explicitly with its expected message and byte offset.
 */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "model/gguf.h"
#include "tests/gguf/gbuild.h"
#include "tests/testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char b[512];
    snprintf(b, sizeof b, "%s/%s", tmpdir, name);
    return b;
}

static int has_tok(const gguf_kv *kv, uint64_t i, const char *s) {
    return kv && i < kv->arr_n && kv->arr_str[i].len == strlen(s) &&
           memcmp(kv->arr_str[i].data, s, strlen(s)) == 0;
}

static void test_stories(void) {
    st_err err;
    const char *path = test_shared_path("models/stories260K.gguf");
    gguf_file *f = gguf_open(path, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_file_size(f), 1185376);
    CHECK_EQ_INT(gguf_alignment(f), 32);
    CHECK_EQ_INT(gguf_data_offset(f), 14176);
    CHECK_EQ_INT(gguf_n_kv(f), 19);
    CHECK_EQ_INT(gguf_n_tensors(f), 48);
    uint32_t u = 0;
    CHECK(gguf_get_u32(f, "llama.block_count", &u, &err) == 0 && u == 5);
    CHECK(gguf_get_u32(f, "llama.embedding_length", &u, &err) == 0 && u == 64);
    CHECK(gguf_get_u32(f, "llama.feed_forward_length", &u, &err) == 0 && u == 172);
    CHECK(gguf_get_u32(f, "llama.attention.head_count", &u, &err) == 0 && u == 8);
    CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u, &err) == 0 && u == 4);
    CHECK(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u, &err) == 0 && u == 1);
    int64_t i64 = 0;
    CHECK(gguf_get_i64(f, "llama.context_length", &i64, &err) == 0 && i64 == 2048);
    CHECK(gguf_get_i64(f, "tokenizer.ggml.padding_token_id", &i64, &err) == 0 &&
          i64 == 4294967295LL);
    float eps = 0;
    CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0);
    CHECK_NEAR(eps, 1e-5, 1e-12);
    char *s = NULL;
    CHECK(gguf_get_str(f, "general.architecture", &s, &err) == 0);
    CHECK_EQ_STR(s, "llama");
    free(s);
    /* errors name the key */
    CHECK(gguf_get_u32(f, "general.name", &u, &err) == -1);
    CHECK(strstr(err.msg, "general.name") && strstr(err.msg, "string"));
    CHECK(gguf_get_u32(f, "no.such.key", &u, &err) == -1);
    CHECK(strstr(err.msg, "no.such.key") && strstr(err.msg, "not found"));
    CHECK(gguf_get(f, "no.such.key") == NULL);
    CHECK_EQ_INT(gguf_find_key(f, "llama.block_count"), 16);

    const gguf_kv *toks = NULL, *scores = NULL, *types = NULL;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0);
    REQUIRE(toks);
    CHECK_EQ_INT(toks->arr_n, 512);
    CHECK(has_tok(toks, 0, "<unk>"));
    CHECK(has_tok(toks, 1, "<s>"));
    CHECK(has_tok(toks, 2, "</s>"));
    CHECK(has_tok(toks, 3, "<0x00>"));
    CHECK(has_tok(toks, 259, "\xe2\x96\x81t")); /* "▁t" */
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, &err) == 0);
    CHECK(scores && gguf_arr_f64(scores, 260) == -1.0 && gguf_arr_f64(scores, 261) == -2.0);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &err) == 0);
    CHECK(types && gguf_arr_i64(types, 0) == 2 && gguf_arr_i64(types, 1) == 3 &&
          gguf_arr_i64(types, 3) == 6);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_INT32, &types, &err) == -1);
    CHECK(strstr(err.msg, "array of string") != NULL);

    const gguf_tensor *t = gguf_find_tensor(f, "blk.0.attn_k.weight");
    REQUIRE(t);
    CHECK_EQ_INT(t->n_dims, 2);
    CHECK_EQ_INT(t->ne[0], 64);
    CHECK_EQ_INT(t->ne[1], 32);
    CHECK_EQ_INT(t->type, GGML_TYPE_F32);
    CHECK_EQ_INT(t->nbytes, 64 * 32 * 4);
    CHECK_EQ_INT(t->offset, 278784);
    CHECK_EQ_INT(gguf_tensor_nrows(t), 32);
    float row[64];
    CHECK(gguf_tensor_rows_f32(t, 0, 1, row, &err) == 0);
    CHECK_NEAR(row[0], 0.2161301076412201, 1e-7);
    CHECK_NEAR(row[1], 0.18407107889652252, 1e-7);
    CHECK(gguf_tensor_rows_f32(t, 31, 2, row, &err) == -1);
    CHECK(strstr(err.msg, "out of range") != NULL);
    CHECK(gguf_tensor_rows_f32(t, -1, 1, row, &err) == -1);
    const gguf_tensor *e = gguf_find_tensor(f, "token_embd.weight");
    REQUIRE(e);
    CHECK_EQ_INT(e->ne[0], 64);
    CHECK_EQ_INT(e->ne[1], 512);
    CHECK(gguf_tensor_rows_f32(e, 0, 1, row, &err) == 0);
    CHECK_NEAR(row[0], -0.29474878311157227, 1e-7);
    CHECK_NEAR(row[3], 0.34057360887527466, 1e-7);
    CHECK(gguf_find_tensor(f, "blk.5.attn_k.weight") == NULL);
    int blocks = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *ti = gguf_tensor_at(f, i);
        if (ti->name.len > 14 && memcmp(ti->name.data, "blk.", 4) == 0 &&
            strncmp(ti->name.data + ti->name.len - 14, ".ffn_up.weight", 14) == 0)
            blocks++;
    }
    CHECK_EQ_INT(blocks, 5);
    CHECK(gguf_tensor_at(f, 48) == NULL && gguf_kv_at(f, -1) == NULL);
    gguf_close(f);
}

static void test_vocab_files(void) {
    st_err err;
    gguf_file *f = gguf_open(test_shared_path("tokenizer/ggml-vocab-llama-spm.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK_EQ_INT(gguf_n_tensors(f), 0);
    CHECK_EQ_INT(gguf_n_kv(f), 22);
    const gguf_kv *toks = NULL, *scores = NULL, *types = NULL;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0);
    REQUIRE(toks);
    CHECK_EQ_INT(toks->arr_n, 32000);
    CHECK(has_tok(toks, 1, "<s>"));
    CHECK(has_tok(toks, 278, "\xe2\x96\x81the"));
    CHECK(has_tok(toks, 15043, "\xe2\x96\x81Hello"));
    CHECK(has_tok(toks, 31999, "\xe7\xbb\x99")); /* 给 */
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, &err) == 0);
    CHECK(scores && gguf_arr_f64(scores, 31999) == -31740.0);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &err) == 0);
    CHECK(types && types->arr_n == 32000 && gguf_arr_i64(types, 3) == 6);
    bool b = false;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, &err) == 0 && b);
    char *s = NULL;
    CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s, &err) == 0);
    CHECK_EQ_STR(s, "llama");
    free(s);
    gguf_close(f);

    f = gguf_open(test_shared_path("tokenizer/ggml-vocab-gpt-2.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0);
    REQUIRE(toks);
    CHECK_EQ_INT(toks->arr_n, 50257);
    CHECK(has_tok(toks, 0, "!"));
    CHECK(has_tok(toks, 198, "\xc4\x8a"));          /* "Ċ" = '\n' */
    CHECK(has_tok(toks, 262, "\xc4\xa0the"));       /* "Ġthe" */
    CHECK(has_tok(toks, 50256, "<|endoftext|>"));
    const gguf_kv *merges = NULL;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, &err) == 0);
    REQUIRE(merges);
    CHECK_EQ_INT(merges->arr_n, 50000);
    CHECK(has_tok(merges, 0, "\xc4\xa0 t"));
    CHECK(has_tok(merges, 49999, "\xc4\xa0g azed"));
    uint32_t u = 0;
    CHECK(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u, &err) == 0 && u == 50256);
    CHECK(gguf_get(f, "tokenizer.ggml.scores") == NULL);
    gguf_close(f);
}

static void test_roundtrip(void) {
    st_err err;
    const char *src = test_shared_path("models/stories260K.gguf");
    gguf_file *f = gguf_open(src, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    gguf_writer *w = gguf_writer_new();
    REQUIRE(w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        CHECK_MSG(gguf_writer_copy_kv(w, gguf_kv_at(f, i), &err) == 0, "%s", err.msg);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        CHECK_MSG(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data,
                                         (size_t)t->nbytes, &err) == 0,
                  "%s", err.msg);
    }
    /* duplicates are refused */
    CHECK(gguf_writer_set_u32(w, "llama.block_count", 1, &err) == -1);
    CHECK(strstr(err.msg, "duplicate key") != NULL);
    const gguf_tensor *t0 = gguf_tensor_at(f, 0);
    CHECK(gguf_writer_add_tensor(w, "token_embd.weight", t0->type, t0->n_dims, t0->ne, t0->data,
                                 (size_t)t0->nbytes, &err) == -1);
    CHECK(strstr(err.msg, "duplicate tensor") != NULL);
    CHECK(gguf_writer_add_tensor(w, "x", GGML_TYPE_F32, 1, t0->ne, t0->data, 3, &err) == -1);
    const char *out = tmp_path("roundtrip.gguf");
    CHECK_MSG(gguf_writer_write(w, out, &err) == 0, "%s", err.msg);
    gguf_writer_free(w);
    size_t n1, n2;
    char *a = test_read_file(src, &n1), *b = test_read_file(out, &n2);
    CHECK_EQ_INT(n1, n2);
    size_t first = 0;
    while (first < n1 && first < n2 && a[first] == b[first]) first++;
    CHECK_MSG(n1 == n2 && first == n1, "files differ at byte %zu", first);
    free(a);
    free(b);
    gguf_close(f);
    /* The copy reads back. */
    f = gguf_open(out, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) CHECK_EQ_INT(gguf_n_tensors(f), 48);
    gguf_close(f);
    unlink(out);
}

static uint16_t h16(float x) { return st_f32_to_fp16(x); }

static void test_dequant(void) {
    st_err err;
    /* hand-made blocks */
    uint8_t q8[2][34]; /* ne = [32, 2] */
    for (int r = 0; r < 2; r++) {
        uint16_t d = r == 0 ? 0x3800 : 0xc000; /* 0.5, -2.0 */
        memcpy(q8[r], &d, 2);
        for (int i = 0; i < 32; i++) q8[r][2 + i] = (uint8_t)(int8_t)(i - 16 + (r ? 100 : 0));
    }
    uint8_t q4[18]; /* ne = [32] */
    uint16_t d4 = 0x4000; /* 2.0 */
    memcpy(q4, &d4, 2);
    for (int i = 0; i < 16; i++) q4[2 + i] = (uint8_t)((i & 15) | ((15 - i) << 4));
    uint16_t f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x8000};
    uint16_t bf16[3] = {0x3f80, 0xc040, 0x4049};
    float f32[4] = {1.5f, -2.25f, 3.0f, 1e-3f};
    uint8_t k4[144] = {0};

    CHECK_EQ_INT(h16(1.0f / 3.0f), 0x3555);
    CHECK_EQ_INT(h16(65504.0f), 0x7bff);
    CHECK_EQ_INT(h16(65520.0f), 0x7c00); /* ties to even -> inf */
    CHECK_EQ_INT(st_f32_to_bf16(3.14159f), 0x4049);
    CHECK_EQ_INT(st_f32_to_fp16(5.9604645e-8f), 0x0001);

    gguf_writer *w = gguf_writer_new();
    int64_t ne_q8[2] = {32, 2}, ne_q4[1] = {32}, ne_f16[1] = {6}, ne_bf[1] = {3}, ne_f32[2] = {2, 2},
            ne_k[1] = {256};
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "q8", GGML_TYPE_Q8_0, 2, ne_q8, q8, sizeof q8, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "q4", GGML_TYPE_Q4_0, 1, ne_q4, q4, sizeof q4, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "f16", GGML_TYPE_F16, 1, ne_f16, f16, sizeof f16, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "bf16", GGML_TYPE_BF16, 1, ne_bf, bf16, sizeof bf16, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "f32", GGML_TYPE_F32, 2, ne_f32, f32, sizeof f32, &err) == 0);
    CHECK(gguf_writer_add_tensor(w, "k4", GGML_TYPE_Q4_K, 1, ne_k, k4, sizeof k4, &err) == 0);
    int64_t bad_ne[1] = {30};
    CHECK(gguf_writer_add_tensor(w, "bad", GGML_TYPE_Q8_0, 1, bad_ne, q8, 34, &err) == -1);
    const char *out = tmp_path("dequant.gguf");
    REQUIRE_MSG(gguf_writer_write(w, out, &err) == 0, "%s", err.msg);
    gguf_writer_free(w);

    gguf_file *f = gguf_open(out, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f) % 64, 0);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) CHECK_EQ_INT(gguf_tensor_at(f, i)->offset % 64, 0);
    float v[64];
    const gguf_tensor *t = gguf_find_tensor(f, "q8");
    REQUIRE(t);
    CHECK(gguf_tensor_rows_f32(t, 0, 2, v, &err) == 0);
    CHECK(v[0] == -8.0f && v[16] == 0.0f && v[31] == 7.5f);
    CHECK(v[32] == -2.0f * 84 && v[32 + 31] == -2.0f * 115);
    CHECK(gguf_tensor_rows_f32(t, 1, 1, v, &err) == 0 && v[0] == -168.0f);
    t = gguf_find_tensor(f, "q4");
    REQUIRE(t);
    CHECK(gguf_tensor_rows_f32(t, 0, 1, v, &err) == 0);
    /* x[i] = 2 * ((i & 15) - 8), x[i + 16] = 2 * ((15 - i) - 8) */
    CHECK(v[0] == -16.0f && v[5] == -6.0f && v[15] == 14.0f && v[16] == 14.0f && v[31] == -16.0f);
    t = gguf_find_tensor(f, "f16");
    REQUIRE(t);
    CHECK(gguf_tensor_rows_f32(t, 0, 1, v, &err) == 0);
    CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 65504.0f && v[3] == ldexpf(1.0f, -24) &&
          v[4] == 0.333251953125f && v[5] == 0.0f && signbit(v[5]));
    t = gguf_find_tensor(f, "bf16");
    REQUIRE(t);
    CHECK(gguf_tensor_rows_f32(t, 0, 1, v, &err) == 0);
    CHECK(v[0] == 1.0f && v[1] == -3.0f && v[2] == 3.140625f);
    t = gguf_find_tensor(f, "f32");
    REQUIRE(t);
    CHECK(gguf_tensor_rows_f32(t, 1, 1, v, &err) == 0 && v[0] == 3.0f && v[1] == 1e-3f);
    t = gguf_find_tensor(f, "k4");
    REQUIRE(t);
    CHECK_EQ_INT(t->nbytes, 144);
    CHECK(gguf_tensor_rows_f32(t, 0, 1, v, &err) == -1);
    CHECK_MSG(strstr(err.msg, "'k4'") && strstr(err.msg, "q4_K") && strstr(err.msg, "cannot be loaded"),
              "%s", err.msg);
    gguf_close(f);
    unlink(out);
}

/* ---- malformed files ---- */

static int n_cases;

/* Opens b (copied to an exact-size heap buffer) and expects an error with
 * "case.gguf: at byte AT: " and `sub`. at < 0: any offset. */
static void expect_fail(const gbuf *b, long at, const char *sub, int line) {
    n_cases++;
    uint8_t *copy = malloc(b->n ? b->n : 1);
    memcpy(copy, b->p, b->n);
    st_err err = {{0}};
    gguf_file *f = gguf_open_memory(copy, b->n, "case.gguf", &err);
    char want[64];
    snprintf(want, sizeof want, "case.gguf: at byte %ld: ", at);
    test_checks++;
    if (f || !strstr(err.msg, sub) || (at >= 0 && strncmp(err.msg, want, strlen(want)) != 0) ||
        (at < 0 && strncmp(err.msg, "case.gguf: at byte ", 19) != 0)) {
        test_failures++;
        fprintf(stderr, "%s:%d: malformed case: expected \"%s...%s\", got %s\"%s\"\n", __FILE__,
                line, at >= 0 ? want : "case.gguf: at byte N: ", sub, f ? "SUCCESS " : "",
                err.msg);
    }
    gguf_close(f);
    free(copy);
}
#define EXPECT_FAIL(b, at, sub) expect_fail(b, at, sub, __LINE__)

static void reset(gbuf *b) { b->n = 0; }

/* A valid file: 1 kv, 1 F32 tensor [4, 2] at offset 0. Returns offsets. */
static void valid_file(gbuf *b, size_t *tensor_info_at, size_t *data_at) {
    reset(b);
    gb_header(b, 3, 1, 1);
    gb_kv_u32(b, "a", 7);
    *tensor_info_at = b->n;
    uint64_t ne[2] = {4, 2};
    gb_tensor_info(b, "t", 2, ne, GGML_TYPE_F32, 0);
    gb_pad(b, 32);
    *data_at = b->n;
    for (int i = 0; i < 8; i++) gb_f32(b, (float)i);
}

static void test_malformed(void) {
    gbuf b = {0};
    size_t ti, da;
    st_err err;

    /* the baseline opens */
    valid_file(&b, &ti, &da);
    gguf_file *f = gguf_open_memory(b.p, b.n, "case.gguf", &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        float v[8];
        CHECK(gguf_tensor_rows_f32(gguf_tensor_at(f, 0), 0, 2, v, &err) == 0 && v[7] == 7.0f);
    }
    gguf_close(f);
    /* version 2 is read too */
    b.p[4] = 2;
    f = gguf_open_memory(b.p, b.n, "case.gguf", &err);
    CHECK_MSG(f != NULL && gguf_version(f) == 2, "%s", err.msg);
    gguf_close(f);

    /* header */
    reset(&b);
    EXPECT_FAIL(&b, 0, "truncated header");
    valid_file(&b, &ti, &da);
    b.p[3] = 'X';
    EXPECT_FAIL(&b, 0, "bad magic");
    valid_file(&b, &ti, &da);
    b.p[4] = 1;
    EXPECT_FAIL(&b, 4, "unsupported version 1");
    b.p[4] = 4;
    EXPECT_FAIL(&b, 4, "unsupported version 4");
    b.p[4] = 0, b.p[7] = 3;
    EXPECT_FAIL(&b, 4, "big-endian");
    valid_file(&b, &ti, &da);
    b.n = 12;
    EXPECT_FAIL(&b, 8, "truncated header");
    b.n = 20;
    EXPECT_FAIL(&b, 16, "truncated header");
    /* counts larger than the file */
    reset(&b);
    gb_header(&b, 3, 0, 1ull << 50);
    EXPECT_FAIL(&b, 16, "metadata count 1125899906842624 is larger than the file");
    reset(&b);
    gb_header(&b, 3, 1ull << 40, 0);
    EXPECT_FAIL(&b, 8, "tensor count 1099511627776 is larger than the file");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, 1ull << 40);
    gb_put(&b, "abc", 3);
    EXPECT_FAIL(&b, 24, "key 0 of 1 length 1099511627776 is larger than the file");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "s");
    gb_u32(&b, GGUF_TYPE_STRING);
    gb_u64(&b, UINT64_MAX);
    EXPECT_FAIL(&b, 37, "string value length 18446744073709551615 is larger than the file");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "arr");
    gb_u32(&b, GGUF_TYPE_ARRAY);
    gb_u32(&b, GGUF_TYPE_UINT32);
    gb_u64(&b, 1ull << 40);
    gb_zeros(&b, 16);
    EXPECT_FAIL(&b, 43, "key 'arr': array count 1099511627776 (of u32) is larger than the file");
    /* truncated metadata: a string of 10 bytes with 4 present, a value cut short */
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "s");
    gb_u32(&b, GGUF_TYPE_STRING);
    gb_u64(&b, 10);
    gb_put(&b, "abcd", 4);
    EXPECT_FAIL(&b, 37, "truncated metadata: string value is 10 bytes long, only 4 left");
    reset(&b);
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "a", 1);
    gb_str(&b, "b");
    gb_u32(&b, GGUF_TYPE_UINT64);
    gb_u32(&b, 0);
    EXPECT_FAIL(&b, 54, "truncated metadata: value needs 8 bytes, only 4 left");
    reset(&b);
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "a", 1);
    EXPECT_FAIL(&b, 41, "truncated metadata: key 1 of 2 needs 8 bytes, only 0 left");
    /* array of strings cut inside */
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "toks");
    gb_u32(&b, GGUF_TYPE_ARRAY);
    gb_u32(&b, GGUF_TYPE_STRING);
    gb_u64(&b, 3);
    gb_str(&b, "x");
    gb_str(&b, "yy");
    gb_u64(&b, 5);
    gb_put(&b, "zz", 2);
    EXPECT_FAIL(&b, 71, "truncated metadata: string 2 of 3 is 5 bytes long, only 2 left");
    /* unknown types */
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k");
    gb_u32(&b, 13);
    gb_u32(&b, 0);
    EXPECT_FAIL(&b, 33, "key 'k': unknown metadata value type 13");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k");
    gb_u32(&b, GGUF_TYPE_ARRAY);
    gb_u32(&b, 99);
    gb_u64(&b, 1);
    gb_u32(&b, 0);
    EXPECT_FAIL(&b, 37, "key 'k': unknown array element type 99");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "flag");
    gb_u32(&b, GGUF_TYPE_BOOL);
    gb_u8(&b, 2);
    EXPECT_FAIL(&b, 40, "bool value 2 is not 0 or 1");
    /* nested arrays: valid at depth 2, refused beyond 8 */
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "n");
    gb_u32(&b, GGUF_TYPE_ARRAY);
    gb_u32(&b, GGUF_TYPE_ARRAY);
    gb_u64(&b, 1);
    gb_u32(&b, GGUF_TYPE_UINT8);
    gb_u64(&b, 2);
    gb_u8(&b, 5), gb_u8(&b, 6);
    f = gguf_open_memory(b.p, b.n, "case.gguf", &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        const gguf_kv *kv = gguf_get(f, "n");
        CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_n == 1 && kv->raw_len == 26);
        /* the writer copies it verbatim */
        gguf_writer *w = gguf_writer_new();
        CHECK(gguf_writer_copy_kv(w, kv, &err) == 0);
        const char *out = tmp_path("nested.gguf");
        CHECK(gguf_writer_write(w, out, &err) == 0);
        gguf_writer_free(w);
        size_t n;
        char *data = test_read_file(out, &n);
        CHECK(n == b.n && memcmp(data, b.p, n) == 0);
        free(data);
        unlink(out);
    }
    gguf_close(f);
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "n");
    gb_u32(&b, GGUF_TYPE_ARRAY);
    for (int i = 0; i < 10; i++) gb_u32(&b, GGUF_TYPE_ARRAY), gb_u64(&b, 1);
    EXPECT_FAIL(&b, -1, "arrays nested deeper than 8");
    /* duplicate key */
    reset(&b);
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "dup", 1);
    gb_kv_u32(&b, "dup", 2);
    EXPECT_FAIL(&b, 43, "duplicate key 'dup'");
    /* alignment */
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "general.alignment", 48);
    EXPECT_FAIL(&b, 53, "general.alignment 48 is not a power of two");
    reset(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "general.alignment");
    gb_u32(&b, GGUF_TYPE_STRING);
    gb_str(&b, "32");
    EXPECT_FAIL(&b, 53, "general.alignment has type string, expected u32");

    /* tensor table */
    uint64_t ne2[2] = {4, 2};
    valid_file(&b, &ti, &da);
    b.n = ti + 5;
    EXPECT_FAIL(&b, (long)ti, "truncated tensor table: name of tensor 0 of 1 needs 8 bytes, only 5 left");
    b.n = ti + 10;
    EXPECT_FAIL(&b, (long)ti + 9, "truncated tensor table: n_dims of tensor 't' needs 4 bytes, only 1 left");
    b.n = ti + 14;
    EXPECT_FAIL(&b, (long)ti + 13, "truncated tensor table: ne[0] of tensor 't' needs 8 bytes, only 1 left");
    b.n = ti + 25;
    EXPECT_FAIL(&b, (long)ti + 21, "truncated tensor table: ne[1] of tensor 't' needs 8 bytes, only 4 left");
    b.n = ti + 30;
    EXPECT_FAIL(&b, (long)ti + 29, "truncated tensor table: type of tensor 't'");
    b.n = ti + 40;
    EXPECT_FAIL(&b, (long)ti + 33, "truncated tensor table: offset of tensor 't'");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_u64(&b, 20);
    gb_put(&b, "abc", 3);
    EXPECT_FAIL(&b, 24, "truncated tensor table: name of tensor 0 of 1 is 20 bytes long, only 3 left");
    b.p[24] = 100;
    EXPECT_FAIL(&b, 24, "name of tensor 0 of 1 length 100 is larger than the file (35 bytes)");
    valid_file(&b, &ti, &da);
    /* table complete, data missing */
    b.n = ti + 41;
    EXPECT_FAIL(&b, (long)ti + 41, "truncated data: the data section starts at byte 96");
    b.n = da + 16;
    EXPECT_FAIL(&b, (long)da, "truncated data: tensor 't' needs 32 bytes at data offset 0, only 16 left");
    reset(&b);
    gb_header(&b, 3, 2, 0);
    gb_tensor_info(&b, "w", 2, ne2, GGML_TYPE_F32, 0);
    size_t second = b.n;
    gb_tensor_info(&b, "w", 2, ne2, GGML_TYPE_F32, 32);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    EXPECT_FAIL(&b, (long)second, "duplicate tensor name 'w'");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_str(&b, "t5");
    gb_u32(&b, 5);
    EXPECT_FAIL(&b, 34, "tensor 't5': n_dims 5 is more than 4");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    uint64_t big[3] = {1ull << 32, 1ull << 31, 4};
    gb_tensor_info(&b, "big", 3, big, GGML_TYPE_F32, 0);
    gb_pad(&b, 32);
    EXPECT_FAIL(&b, 47, "tensor 'big': dimension product overflows (ne[1] = 2147483648)");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    uint64_t neg[1] = {1ull << 63};
    gb_tensor_info(&b, "neg", 1, neg, GGML_TYPE_F32, 0);
    EXPECT_FAIL(&b, 39, "tensor 'neg': ne[0] = 9223372036854775808 is out of range");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    uint64_t huge[1] = {1ull << 40};
    gb_tensor_info(&b, "huge", 1, huge, GGML_TYPE_F32, 0);
    gb_pad(&b, 32);
    gb_zeros(&b, 32);
    EXPECT_FAIL(&b, 64, "truncated data: tensor 'huge' needs 4398046511104 bytes at data offset 0, only 32 left");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    uint64_t huge2[2] = {1ull << 61, 2};
    gb_tensor_info(&b, "huge2", 2, huge2, GGML_TYPE_F32, 0);
    EXPECT_FAIL(&b, 57, "tensor 'huge2': data size (4611686018427387904 elements of f32) overflows");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_tensor_info(&b, "ty", 2, ne2, 4, 0);
    EXPECT_FAIL(&b, 54, "tensor 'ty': unknown tensor type 4");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    uint64_t ne30[1] = {30};
    gb_tensor_info(&b, "q", 1, ne30, GGML_TYPE_Q8_0, 0);
    EXPECT_FAIL(&b, 45, "tensor 'q': ne[0] = 30 is not a multiple of the q8_0 block size 32");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_tensor_info(&b, "mis", 2, ne2, GGML_TYPE_F32, 4);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    EXPECT_FAIL(&b, 59, "tensor 'mis': offset 4 is not a multiple of the alignment 32");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_tensor_info(&b, "past", 2, ne2, GGML_TYPE_F32, 1024);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    EXPECT_FAIL(&b, 24, "tensor 'past': offset 1024 is past the end of the data section (64 bytes from byte 96)");
    reset(&b);
    gb_header(&b, 3, 1, 0);
    gb_tensor_info(&b, "end", 2, ne2, GGML_TYPE_F32, 64);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    EXPECT_FAIL(&b, 160, "truncated data: tensor 'end' needs 32 bytes at data offset 64, only 0 left");
    /* with general.alignment 64 the same offset 32 is misaligned */
    reset(&b);
    gb_header(&b, 3, 1, 1);
    gb_kv_u32(&b, "general.alignment", 64);
    gb_tensor_info(&b, "al", 2, ne2, GGML_TYPE_F32, 32);
    gb_pad(&b, 64);
    gb_zeros(&b, 128);
    EXPECT_FAIL(&b, 91, "offset 32 is not a multiple of the alignment 64");
    CHECK(n_cases >= 35);
    free(b.p);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/strata-test-gguf-XXXXXX");
    REQUIRE(mkdtemp(tmpdir) != NULL);
    test_stories();
    test_vocab_files();
    test_roundtrip();
    test_dequant();
    test_malformed();
    rmdir(tmpdir);
    return test_summary();
}
